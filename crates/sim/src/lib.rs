//! Block traces and their replay through the policy core, without any IO.

mod as_server;
mod fidelity;
mod l2;
mod reference;
mod trace;

pub use arc_policy::mrc::{log_sizes, lru_mrc, sampled_mrc, sampled_mrc_with, MrcPoint};
pub use arc_policy::replay::{step, BlockAccess};
pub use as_server::{expand_as_server, replay_as_server, replay_observed, ServerAccess, Touch};
pub use fidelity::{fidelity, Fidelity};
pub use l2::{replay_l2, L2SimResult};
pub use reference::{reference_traces, reference_traces_in, ReferenceTrace};
pub use trace::{parse_csv, parse_lis, parse_oracle_general, read_trace, TraceError, TraceRequest};

use arc_policy::Policy;
use serde::Serialize;

/// Splits requests into block accesses: a request touches blocks
/// `off/bs ..= (off+len-1)/bs`, each one access. Multi-volume traces key a
/// block as `(volume << 40) | block`, as the reference tools do.
pub fn expand(requests: &[TraceRequest], block_size: u64, reads_only: bool) -> Vec<BlockAccess> {
    let mut out = Vec::with_capacity(requests.len() * 2);
    for_each_block(requests, block_size, reference_key, |a, r, _| {
        if !(reads_only && r.write) {
            out.push(a);
        }
    });
    out
}

/// The reference tools' key of block `block` of volume `dev`.
pub(crate) fn reference_key(dev: u64, block: u64) -> u64 {
    (dev << 40) | block
}

/// Calls `f` with each block access of `requests` (keyed by `key(dev,
/// block)`), its request and whether the request covers the block whole.
pub(crate) fn for_each_block(
    requests: &[TraceRequest],
    block_size: u64,
    key: fn(u64, u64) -> u64,
    mut f: impl FnMut(BlockAccess, &TraceRequest, bool),
) {
    for r in requests.iter().filter(|r| r.len > 0) {
        let end = r.offset + r.len;
        for b in r.offset / block_size..=(end - 1) / block_size {
            let whole = r.offset <= b * block_size && end >= (b + 1) * block_size;
            f(BlockAccess { key: key(r.dev, b), now_ns: r.ts_us.saturating_mul(1000) }, r, whole);
        }
    }
}

/// The clock for traces that have none, in µs between requests: about
/// what one busy disk array serves. At the trace's own 1 µs per line, every
/// re-access of the ARC paper's traces would fall inside the 62.5 ms MRU to
/// MFU debounce (62,500 requests) and nothing would ever be promoted.
pub const DEFAULT_SPACING_US: u64 = 1000;

/// The block accesses of the trace at `path` as the simulator replays it
/// by default: a trace with no time of its own gets requests
/// [`DEFAULT_SPACING_US`] apart.
pub fn read_accesses(
    path: &std::path::Path,
    block_size: u64,
    reads_only: bool,
) -> Result<Vec<BlockAccess>, TraceError> {
    Ok(expand(&timed_requests(path)?, block_size, reads_only))
}

/// [`read_accesses`] as the server meets them (reads, whole and partial
/// writes told apart: [`expand_as_server`]).
pub fn read_as_server_accesses(
    path: &std::path::Path,
    block_size: u64,
) -> Result<Vec<ServerAccess>, TraceError> {
    Ok(expand_as_server(&timed_requests(path)?, block_size))
}

fn timed_requests(path: &std::path::Path) -> Result<Vec<TraceRequest>, TraceError> {
    let mut requests = read_trace(path)?;
    if !has_timestamps(&requests) {
        respace(&mut requests, DEFAULT_SPACING_US);
    }
    Ok(requests)
}

/// False when the trace carries no time of its own: every timestamp is
/// its request's index, as `.lis` traces are read and as the ARC paper's
/// and w106's CSV forms are written.
pub fn has_timestamps(requests: &[TraceRequest]) -> bool {
    requests.len() > 1 && requests.iter().enumerate().any(|(i, r)| r.ts_us != i as u64)
}

/// Re-times the requests `spacing_us` apart, the first at 0.
pub fn respace(requests: &mut [TraceRequest], spacing_us: u64) {
    for (i, r) in requests.iter_mut().enumerate() {
        r.ts_us = (i as u64).saturating_mul(spacing_us);
    }
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct SimResult {
    pub policy: String,
    pub cache_blocks: u64,
    pub requests: u64,
    pub hits: u64,
    pub hit_ratio: f64,
}

/// Replays `accesses` through `policy`, each block of unit size.
pub fn replay(policy: &mut dyn Policy, cache_blocks: u64, accesses: &[BlockAccess]) -> SimResult {
    let mut evicted = Vec::new();
    let mut hits = 0u64;
    for a in accesses {
        hits += u64::from(step(policy, a, &mut evicted));
    }
    let requests = accesses.len() as u64;
    SimResult {
        policy: policy.name().to_string(),
        cache_blocks,
        requests,
        hits,
        hit_ratio: if requests == 0 { 0.0 } else { hits as f64 / requests as f64 },
    }
}

/// Runs `f` on every item of `items` on `threads` threads, each taking
/// the next item when it is done (traces differ in length by a hundred
/// times), and gathers what they return, in no set order.
pub fn on_threads<T: Sync, R: Send>(items: &[T], threads: usize, f: impl Fn(&T) -> Vec<R> + Sync) -> Vec<R> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    let out = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..threads.max(1) {
            s.spawn(|| {
                while let Some(item) = items.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)) {
                    let got = f(item);
                    out.lock().unwrap_or_else(|e| e.into_inner()).extend(got);
                }
            });
        }
    });
    out.into_inner().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(ts_us: u64) -> TraceRequest {
        TraceRequest { ts_us, write: false, offset: 0, len: 4096, dev: 0 }
    }

    #[test]
    fn line_numbers_are_not_a_clock() {
        let mut r: Vec<TraceRequest> = (0..5).map(req).collect();
        assert!(!has_timestamps(&r));
        respace(&mut r, 1000);
        assert_eq!(r[4].ts_us, 4000);
        assert!(has_timestamps(&r));
        assert!(has_timestamps(&[req(0), req(7)]));
    }
}
