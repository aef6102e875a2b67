//! Replaying a trace's writes as `arcache serve` meets them, not as
//! libCacheSim counts them.
//!
//! The reference tools look every access up, writes included, and count
//! it: a write to a resident block is a hit, to any other a miss that
//! inserts it. The server never looks a write up. It stores a block the
//! write covers whole (resident or not: no hit, miss or ghost hit is
//! counted), patches a block it covers in part if that block is in RAM,
//! and drops any other partly written block from the cache, ghosts
//! included (`Volume::patch_cache`, `Cache::insert_written`,
//! `Cache::patch_in_place`, `Cache::invalidate`). Only reads count. The
//! live sizing's model ([`crate::fidelity`]) replays traces this way too.
//!
//! A patched block is left where it is, as the server leaves a plain
//! record (incompressible data, compression off, or kept decompressed)
//! that it patches in place without telling the policy. A compressed
//! record the server stores again instead, which moves it in the policy;
//! this replay does not model that, nor what compression fits in RAM.

use arc_policy::live::{self, Op, Sample};
use arc_policy::Policy;

use crate::{for_each_block, reference_key, BlockAccess, SimResult, TraceRequest};

/// What one request does to one block of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Touch {
    Read,
    /// A write covering the whole block.
    WriteWhole,
    /// A write covering part of the block.
    WritePart,
}

/// A block access and what it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerAccess {
    pub access: BlockAccess,
    pub touch: Touch,
}

/// Splits requests into block accesses as [`crate::expand`] does, telling
/// reads, whole-block writes and partial writes apart, and keying each
/// block as the server keys the record (`arc_policy::key::make`) when the
/// trace's exports and records fit those keys.
pub fn expand_as_server(requests: &[TraceRequest], block_size: u64) -> Vec<ServerAccess> {
    let mut out = Vec::with_capacity(requests.len() * 2);
    let key = if fits_server_keys(requests, block_size) { server_key } else { reference_key };
    for_each_block(requests, block_size, key, |access, r, whole| {
        let touch = match (r.write, whole) {
            (false, _) => Touch::Read,
            (true, true) => Touch::WriteWhole,
            (true, false) => Touch::WritePart,
        };
        out.push(ServerAccess { access, touch });
    });
    out
}

/// The server's key of record `block` of export `dev` (a recorded trace's
/// `dev` is the export's id): arc-adaptive's copies and the live sizing
/// sample keys by a hash of them, so a replay keyed otherwise samples
/// other records of a trace with several exports than the server did.
fn server_key(dev: u64, block: u64) -> u64 {
    arc_policy::key::make(dev as u16, block)
}

/// Whether every block of `requests` has a server key of its own: export
/// ids are a volume's (below 4096: higher ones would read as the file
/// view's metadata) and records fit 48 bits. Other traces (no server
/// recorded them) keep the reference tools' keys.
fn fits_server_keys(requests: &[TraceRequest], block_size: u64) -> bool {
    requests.iter().all(|r| {
        r.dev < u64::from(arc_policy::key::VOLUME_IDS)
            && r.offset.saturating_add(r.len.max(1) - 1) / block_size <= arc_policy::key::MAX_RECORD
    })
}

/// Replays `accesses` through `policy` as the server would: reads are
/// looked up, inserted on a miss and counted; writes are stored or dropped
/// as the module says and not counted. `requests` and `hits` are reads'.
pub fn replay_as_server(policy: &mut dyn Policy, cache_blocks: u64, accesses: &[ServerAccess]) -> SimResult {
    let (reads, hits) = replay_observed(policy, accesses, |_| {});
    SimResult {
        policy: policy.name().to_string(),
        cache_blocks,
        requests: reads,
        hits,
        hit_ratio: if reads == 0 { 0.0 } else { hits as f64 / reads as f64 },
    }
}

/// [`replay_as_server`], telling `observe` what each access did to the
/// cache as the server's live sizing notes it (`arc_policy::live`): a read,
/// a store (`Op::Write`), or a drop (`Op::Remove`). Returns (reads, hits).
pub fn replay_observed(
    policy: &mut dyn Policy,
    accesses: &[ServerAccess],
    mut observe: impl FnMut(Sample),
) -> (u64, u64) {
    let (mut reads, mut hits) = (0u64, 0u64);
    let mut evicted = Vec::new();
    for a in accesses {
        let op = match a.touch {
            Touch::Read => Op::Read,
            // Patched in place: neither the policy nor the sampler hears.
            Touch::WritePart if policy.contains(a.access.key) => continue,
            Touch::WritePart => Op::Remove,
            Touch::WriteWhole => Op::Write,
        };
        let sample = Sample { access: a.access, op };
        let hit = live::apply(policy, &sample, &mut evicted);
        reads += u64::from(sample.is_read());
        hits += u64::from(hit);
        observe(sample);
    }
    (reads, hits)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(write: bool, offset: u64, len: u64) -> TraceRequest {
        TraceRequest { ts_us: 0, write, offset, len, dev: 0 }
    }

    #[test]
    fn a_write_is_whole_only_where_it_covers_the_block() {
        let got: Vec<(u64, Touch)> = expand_as_server(&[req(true, 2048, 8192), req(false, 0, 10)], 4096)
            .iter()
            .map(|a| (a.access.key, a.touch))
            .collect();
        let want = [(0, Touch::WritePart), (1, Touch::WriteWhole), (2, Touch::WritePart), (0, Touch::Read)];
        assert_eq!(got, want);
    }

    #[test]
    fn blocks_of_a_recorded_trace_take_the_servers_keys() {
        let on = |dev: u64, block: u64| TraceRequest {
            ts_us: 0,
            write: false,
            offset: block * 4096,
            len: 4096,
            dev,
        };
        let keys =
            |t: &[TraceRequest]| expand_as_server(t, 4096).iter().map(|a| a.access.key).collect::<Vec<_>>();
        assert_eq!(keys(&[on(0, 7), on(3, 9)]), [7, arc_policy::key::make(3, 9)]);
        let last = arc_policy::key::VOLUME_IDS - 1;
        assert_eq!(keys(&[on(u64::from(last), 9)]), [arc_policy::key::make(last, 9)]);
        let top = arc_policy::key::MAX_RECORD;
        assert_eq!(keys(&[on(1, top)]), [arc_policy::key::make(1, top)]);
        // A volume number no export id carries: the reference tools' keys,
        // never the server's cut to 16 bits (which would make 65,536 volume
        // 0) nor one the server keeps for the file view (0x8000 and up:
        // metadata to the policy).
        for big in [u64::from(arc_policy::key::VOLUME_IDS), 0x8000, u64::from(u16::MAX) + 1] {
            assert_eq!(keys(&[on(0, 7), on(big, 9)]), [7, (big << 40) | 9]);
        }
    }

    fn replayed(trace: &[TraceRequest], blocks: u64) -> SimResult {
        let mut lru = arc_policy::by_name("lru", blocks).unwrap();
        replay_as_server(lru.as_mut(), blocks, &expand_as_server(trace, 4096))
    }

    #[test]
    fn only_reads_count_and_a_written_block_is_there_to_read() {
        // Whole writes of blocks 0..10, then reads of them: ten read hits.
        let mut t: Vec<TraceRequest> = (0..10).map(|b| req(true, b * 4096, 4096)).collect();
        t.extend((0..10).map(|b| req(false, b * 4096, 4096)));
        let r = replayed(&t, 100);
        assert_eq!((r.requests, r.hits), (10, 10));
    }

    #[test]
    fn a_partial_write_keeps_a_resident_block_and_drops_a_missing_one() {
        // Block 0 is read in, then written in part: still there (a hit).
        // Block 1 is written in part while not cached: not cached after
        // (a miss), where a whole write would have stored it.
        let t = [
            req(false, 0, 4096),
            req(true, 512, 512),
            req(true, 4096 + 512, 512),
            req(false, 0, 4096),
            req(false, 4096, 4096),
        ];
        let r = replayed(&t, 100);
        assert_eq!((r.requests, r.hits), (3, 1));
        let whole = [req(true, 4096, 4096), req(false, 4096, 4096)];
        assert_eq!(replayed(&whole, 100).hits, 1);
    }

    #[test]
    fn a_patched_block_stays_where_it_is() {
        // LRU of two: 0 and 1 read, 0 patched (not moved), 2 read pushes
        // out the least recent, still 0; then 1 hits and 0 misses.
        let t = [
            req(false, 0, 4096),
            req(false, 4096, 4096),
            req(true, 100, 100),
            req(false, 8192, 4096),
            req(false, 4096, 4096),
            req(false, 0, 4096),
        ];
        let r = replayed(&t, 2);
        assert_eq!((r.requests, r.hits), (5, 1));
    }
}
