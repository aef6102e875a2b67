//! How close the server's live estimates come to the truth at one cache
//! size, on a block trace: the policy curve (`policy_curve` in `arcache
//! stat --json`, computed by [`arc_policy::live`], the server's own code,
//! from the reads and writes of sampled records) and `hit_ratio_if_arc_doubled`
//! (demand hits plus ghost hits over demand reads, from arcstats) against
//! full replays of the trace as the server's cache would see it.
//!
//! As the server does ([`live::replay`]): a read is looked up and inserted
//! on a miss, and counts; a write stores its record without a lookup
//! (`insert` on a record resident or not: no hit or ghost hit counted) and
//! does not count. What this does not model: the server's cache grows from
//! `zfs_arc_min` while this one is full size from the start; records of
//! `--recordsize` (16K by default) rather than the trace's 4 KiB blocks;
//! prefetches (zfetch, NBD_CMD_CACHE), whose ghost hits the server counts
//! too; sizes in bytes with a header per record.

use arc_policy::{by_name, live};

use crate::RwAccess;

/// Hit ratios of demand reads, in %.
#[derive(Debug, Clone, Copy)]
pub struct Fidelity {
    /// A full replay at the size.
    pub full: f64,
    /// The live policy curve's estimate of `full`.
    pub sampled: f64,
    /// A full replay at twice the size.
    pub doubled: f64,
    /// The ghost lists' estimate of `doubled`.
    pub ghost_estimate: f64,
    /// Demand reads replayed.
    pub reads: u64,
}

impl Fidelity {
    pub fn sampled_error(&self) -> f64 {
        self.sampled - self.full
    }

    pub fn ghost_error(&self) -> f64 {
        self.ghost_estimate - self.doubled
    }
}

/// A full replay at `size`: the reads' hit ratio and the ghost estimate of
/// twice `size` (in %), and the reads.
fn replayed(policy: &str, size: u64, acc: &[RwAccess]) -> Option<(f64, f64, u64)> {
    let mut p = by_name(policy, size)?;
    let (reads, hits) = live::replay(p.as_mut(), acc);
    let st = p.stats();
    let with_ghosts = (hits + st.mru_ghost_hits + st.mfu_ghost_hits).min(reads);
    let pct = |n: u64| n as f64 / reads.max(1) as f64 * 100.0;
    Some((pct(hits), pct(with_ghosts), reads))
}

/// The estimates of `policy` (a name `by_name` knows) at `size` blocks;
/// None for an unknown policy.
pub fn fidelity(policy: &str, size: u64, acc: &[RwAccess]) -> Option<Fidelity> {
    let (full, ghost_estimate, reads) = replayed(policy, size, acc)?;
    let (doubled, _, _) = replayed(policy, 2 * size, acc)?;
    let sample: Vec<RwAccess> = acc.iter().filter(|a| live::sampled(a.access.key)).copied().collect();
    let sampled = live::policy_curve(policy, &sample, &[size])?[0].1 * 100.0;
    Some(Fidelity { full, sampled, doubled, ghost_estimate, reads })
}
