//! How close the server's live estimates come to the truth at one cache
//! size: the sampled policy curve (`policy_curve` in `arcache stat
//! --json`: one record in `rate` sampled by hash, replayed through the
//! policy at `1 / rate` of the size) and `hit_ratio_if_arc_doubled` (hits
//! plus ghost hits, from arcstats) against full replays.

use arc_policy::by_name;

use crate::{replay, sampled_mrc, BlockAccess};

/// Hit ratios in %.
#[derive(Debug, Clone, Copy)]
pub struct Fidelity {
    /// A full replay at the size.
    pub full: f64,
    /// The sampled miniature's estimate of `full`.
    pub sampled: f64,
    /// A full replay at twice the size.
    pub doubled: f64,
    /// The ghost lists' estimate of `doubled`.
    pub ghost_estimate: f64,
}

impl Fidelity {
    pub fn sampled_error(&self) -> f64 {
        self.sampled - self.full
    }

    pub fn ghost_error(&self) -> f64 {
        self.ghost_estimate - self.doubled
    }
}

/// The full hit ratio and the ghost estimate of twice `size`, in %.
fn replayed(policy: &str, size: u64, acc: &[BlockAccess]) -> Option<(f64, f64)> {
    let mut p = by_name(policy, size)?;
    let r = replay(p.as_mut(), size, acc);
    let st = p.stats();
    let with_ghosts = (r.hits + st.mru_ghost_hits + st.mfu_ghost_hits).min(r.requests);
    Some((r.hit_ratio * 100.0, with_ghosts as f64 / r.requests.max(1) as f64 * 100.0))
}

/// The estimates of `policy` (a name `by_name` knows) at `size` blocks,
/// one block in `rate` sampled; None for an unknown policy.
pub fn fidelity(policy: &str, size: u64, rate: u64, acc: &[BlockAccess]) -> Option<Fidelity> {
    let (full, ghost_estimate) = replayed(policy, size, acc)?;
    let (doubled, _) = replayed(policy, 2 * size, acc)?;
    // `sampled_mrc` samples `min_blocks / size` of the keys: one in `rate`.
    let sampled = sampled_mrc(policy, acc, &[size], (size / rate.max(1)).max(1))?[0].hit_ratio * 100.0;
    Some(Fidelity { full, sampled, doubled, ghost_estimate })
}
