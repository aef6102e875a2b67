//! Replaying block accesses through a policy: the one step the simulator,
//! the miss-ratio curves and the server's sizing estimates share.

use crate::{Access, Policy};

/// One block-sized access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockAccess {
    pub key: u64,
    pub now_ns: u64,
}

/// One demand access: a hit, or a miss that inserts the block (unit size).
pub fn step(policy: &mut dyn Policy, a: &BlockAccess, evicted: &mut Vec<u64>) -> bool {
    let access = Access::demand(a.now_ns);
    if policy.lookup(a.key, access).is_hit() {
        return true;
    }
    policy.insert(a.key, 1, access, evicted);
    evicted.clear();
    false
}

/// The hit ratio of `accesses` replayed through `policy` (0 for none).
pub fn hit_ratio(policy: &mut dyn Policy, accesses: &[BlockAccess]) -> f64 {
    let mut evicted = Vec::new();
    let hits: u64 = accesses.iter().map(|a| u64::from(step(policy, a, &mut evicted))).sum();
    if accesses.is_empty() {
        0.0
    } else {
        hits as f64 / accesses.len() as f64
    }
}
