//! How close the server's live estimates come to the truth at one cache
//! size, on a block trace: the policy curve (`policy_curve` in `arcache
//! stat --json`, computed by [`arc_policy::live`], the server's own code,
//! from the reads and writes of sampled records) and `hit_ratio_if_arc_doubled`
//! (demand hits plus ghost hits over demand reads, from arcstats) against
//! full replays of the trace as the server's cache would see it.
//!
//! As the server does ([`crate::replay_as_server`]): a read is looked up
//! and inserted on a miss, and counts; a write stores each block it covers
//! whole without a lookup (`insert` on a record resident or not: no hit or
//! ghost hit counted), leaves a block it covers in part where it is if
//! cached (nothing sampled) and drops it if not, and does not count. The
//! live curve samples what the full replay at the size did (the server's
//! sampler notes its cache's stores and drops). What this does not model: the server's cache grows
//! from `zfs_arc_min` while this one is full size from the start; records
//! of `--recordsize` (16K by default) rather than the trace's 4 KiB
//! blocks; prefetches (zfetch, NBD_CMD_CACHE), whose ghost hits the server
//! counts too; sizes in bytes with a header per record; a compressed
//! record written in part, which the server stores again (its policy moves
//! it and its sampler notes a write) where this leaves it untouched.

use arc_policy::by_name;
use arc_policy::live::{self, Sample};

use crate::{replay_observed, ServerAccess};

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
/// twice `size` (in %), the reads, and what the live sizing samples of it.
fn replayed(policy: &str, size: u64, acc: &[ServerAccess]) -> Option<(f64, f64, u64, Vec<Sample>)> {
    let mut p = by_name(policy, size)?;
    let mut sample = Vec::new();
    let (reads, hits) = replay_observed(p.as_mut(), acc, |s| {
        if live::sampled(s.access.key) {
            sample.push(s);
        }
    });
    let st = p.stats();
    let with_ghosts = (hits + st.mru_ghost_hits + st.mfu_ghost_hits).min(reads);
    let pct = |n: u64| n as f64 / reads.max(1) as f64 * 100.0;
    Some((pct(hits), pct(with_ghosts), reads, sample))
}

/// The estimates of `policy` (a name `by_name` knows) at `size` blocks;
/// None for an unknown policy.
pub fn fidelity(policy: &str, size: u64, acc: &[ServerAccess]) -> Option<Fidelity> {
    let (full, ghost_estimate, reads, sample) = replayed(policy, size, acc)?;
    let (doubled, _, _, _) = replayed(policy, 2 * size, acc)?;
    let sampled = live::policy_curve(policy, &sample, &[size])?[0].1 * 100.0;
    Some(Fidelity { full, sampled, doubled, ghost_estimate, reads })
}
