//! Block traces and their replay through the policy core, without any IO.

mod l2;
mod trace;

pub use arc_policy::mrc::{log_sizes, lru_mrc, sampled_mrc, MrcPoint};
pub use arc_policy::replay::{step, BlockAccess};
pub use l2::{replay_l2, L2SimResult};
pub use trace::{parse_csv, parse_lis, parse_oracle_general, read_trace, TraceError, TraceRequest};

use arc_policy::Policy;
use serde::Serialize;

/// Splits requests into block accesses: a request touches blocks
/// `off/bs ..= (off+len-1)/bs`, each one access. Multi-volume traces key a
/// block as `(volume << 40) | block`, as the reference tools do.
pub fn expand(requests: &[TraceRequest], block_size: u64, reads_only: bool) -> Vec<BlockAccess> {
    let mut out = Vec::with_capacity(requests.len() * 2);
    for r in requests {
        if (reads_only && r.write) || r.len == 0 {
            continue;
        }
        let first = r.offset / block_size;
        let last = (r.offset + r.len - 1) / block_size;
        for b in first..=last {
            out.push(BlockAccess { key: (r.dev << 40) | b, now_ns: r.ts_us.saturating_mul(1000) });
        }
    }
    out
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
