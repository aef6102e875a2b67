//! The live sizing's sample and its curves: which records the server
//! samples, and how the sample becomes estimated hit ratios, LRU's and
//! those of the policy it runs. Pure, so the server (arcache-engine's
//! `Sampler`) and the simulator's check of it (`arcache_sim::fidelity`)
//! run the same code.
//!
//! Writes and removals are sampled too: a record a client wrote is
//! cached, and a read of it soon after hits; one trimmed is not. A sample
//! of reads alone misses every such hit (cloudphysics_io at 67,302 blocks:
//! a curve 11 pp low; with writes, within 0.1; bench/results/sizing.md).

use crate::mrc::{lru_mrc_counting, per_size, Counted};
use crate::replay::{step, BlockAccess};
use crate::{by_name, Access, Policy};

/// One record in this many is sampled.
pub const SAMPLE_EVERY: u64 = 64;
/// The latest samples the policy's curve replays: a miniature replay per
/// size costs far more than LRU's one pass, and `stat` may be asked every
/// second.
pub const POLICY_WINDOW: usize = 1 << 16;

/// A sampled access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    pub access: BlockAccess,
    pub op: Op,
}

/// What a sampled access did to its record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    /// A demand read: counted, a hit or a miss that stores the record.
    Read,
    /// A client's write: stores the record, not counted.
    Write,
    /// The record dropped (a trim or zeroing, a partial write of a record
    /// not in RAM, a failed backing write): resident copy and ghost alike.
    Remove,
}

impl Sample {
    pub fn is_read(&self) -> bool {
        self.op == Op::Read
    }
}

fn spread(key: u64) -> u64 {
    let mut x = key ^ 0x6A09_E667_F3BC_C909;
    x = (x ^ (x >> 33)).wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    x = (x ^ (x >> 33)).wrapping_mul(0xC4CE_B9FE_1A85_EC53);
    x ^ (x >> 33)
}

/// Whether record `key` is in the sample (spatial: by hash, so every
/// access of a sampled record is).
pub fn sampled(key: u64) -> bool {
    spread(key).is_multiple_of(SAMPLE_EVERY)
}

/// A cache of `size` records in the sample's scale.
pub fn scaled(size: u64) -> u64 {
    (size / SAMPLE_EVERY).max(1)
}

fn op_of(samples: &[Sample], i: usize) -> Counted {
    match samples[i].op {
        Op::Read => Counted::Yes,
        Op::Write => Counted::No,
        Op::Remove => Counted::Gone,
    }
}

/// LRU's hit ratio of the reads of `samples` at each of `sizes` records
/// (exact on the sample).
pub fn lru_curve(samples: &[Sample], sizes: &[u64]) -> Vec<(u64, f64)> {
    let accesses: Vec<BlockAccess> = samples.iter().map(|s| s.access).collect();
    let small: Vec<u64> = sizes.iter().map(|&s| scaled(s)).collect();
    let points = lru_mrc_counting(&accesses, |i| op_of(samples, i), &small);
    sizes.iter().zip(points).map(|(&s, p)| (s, p.hit_ratio)).collect()
}

/// The estimated hit ratio of `policy` (a name [`by_name`] knows; None for
/// another) at each of `sizes` records, from `samples` (oldest first): the
/// last [`POLICY_WINDOW`] of them replayed through the policy at the
/// [`scaled`] sizes, a read looked up (and stored on a miss) and counted,
/// a write stored as the server's cache stores a written record (no
/// lookup, so no hit and no ghost hit counted; the policy's `insert`
/// decides the list, a ghost's record going to MFU) and not counted.
pub fn policy_curve(policy: &str, samples: &[Sample], sizes: &[u64]) -> Option<Vec<(u64, f64)>> {
    by_name(policy, 1)?;
    let recent = &samples[samples.len().saturating_sub(POLICY_WINDOW)..];
    let one = |size: u64| -> Option<(u64, f64)> {
        let mut p = by_name(policy, scaled(size))?;
        let (reads, hits) = replay(p.as_mut(), recent);
        Some((size, if reads == 0 { 0.0 } else { hits as f64 / reads as f64 }))
    };
    per_size(sizes, one)?.into_iter().collect()
}

/// Replays `samples` through `policy` as the server's cache sees them: a
/// read looked up, stored on a miss and counted; a write stored by
/// `insert` alone (no lookup) and not counted; a removal forgotten.
/// Returns (reads, read hits).
pub fn replay(policy: &mut dyn Policy, samples: &[Sample]) -> (u64, u64) {
    let (mut reads, mut hits) = (0u64, 0u64);
    let mut evicted = Vec::new();
    for s in samples {
        reads += u64::from(s.is_read());
        hits += u64::from(apply(policy, s, &mut evicted));
    }
    (reads, hits)
}

/// One sample of [`replay`] applied to `policy`; true for a read that hit.
pub fn apply(policy: &mut dyn Policy, s: &Sample, evicted: &mut Vec<u64>) -> bool {
    match s.op {
        Op::Read => step(policy, &s.access, evicted),
        Op::Write => {
            policy.insert(s.access.key, 1, Access::demand(s.access.now_ns), evicted);
            evicted.clear();
            false
        }
        Op::Remove => {
            policy.remove(s.access.key);
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads, writes (and with `removals`, removals) of a skewed mix of keys.
    fn mixed(n: u64, removals: bool) -> Vec<Sample> {
        let mut x = 7u64;
        (0..n)
            .map(|i| {
                x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                let key = if x >> 62 == 0 { (x >> 20) % 5000 } else { (x >> 20) % 300 };
                let op = match i % 8 {
                    0 | 4 => Op::Write,
                    7 if removals => Op::Remove,
                    _ => Op::Read,
                };
                Sample { access: BlockAccess { key, now_ns: i * 1000 }, op }
            })
            .collect()
    }

    /// LRU's curve of `samples` against LRU caches replaying them: the
    /// largest difference in hit ratio.
    fn lru_curve_off_by(samples: &[Sample]) -> f64 {
        let accesses: Vec<BlockAccess> = samples.iter().map(|s| s.access).collect();
        let sizes = [1, 10, 100, 300, 1000, 6000];
        let curve = lru_mrc_counting(&accesses, |i| op_of(samples, i), &sizes);
        let mut off = 0f64;
        for p in curve {
            let mut lru = by_name("lru", p.cache_blocks).unwrap();
            let (reads, hits) = replay(lru.as_mut(), samples);
            off = off.max((p.hit_ratio - hits as f64 / reads as f64).abs());
        }
        off
    }

    /// The LRU curve with writes (stack distances, writes moving their
    /// block to the top uncounted) is exactly what an LRU cache replaying
    /// the same reads and writes hits. A removal leaves the cache a slot
    /// free until the next insert, which no stack of recency describes:
    /// taking the block out of the stack is near (an eighth of the accesses
    /// removals here: 0.02 pp at most), not exact.
    #[test]
    fn the_lru_curve_with_writes_is_exact_and_with_removals_near() {
        assert_eq!(lru_curve_off_by(&mixed(40_000, false)), 0.0);
        let off = lru_curve_off_by(&mixed(40_000, true));
        assert!(off < 0.001, "off by {off}");
    }
}
