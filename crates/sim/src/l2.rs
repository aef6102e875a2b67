//! A two-level model: the ARC policy in front of an L2 of fixed size
//! written as a rotary log, fed with blocks as they leave the ARC, at most
//! `feed_blocks_per_sec` of them per second of trace time (the feed rate
//! limit, `l2arc_write_max`). A block evicted from the ARC when the
//! second's budget is spent is lost to L2, as an unfed record is in ZFS.
//! A miss in the ARC looks in L2: a hit there is read back into the ARC
//! and keeps its L2 copy; otherwise the backing store serves it.

use std::collections::VecDeque;

use arc_policy::{Access, Policy};
use rustc_hash::FxHashMap;
use serde::Serialize;

use crate::BlockAccess;

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct L2SimResult {
    pub policy: String,
    pub cache_blocks: u64,
    pub l2_blocks: u64,
    pub requests: u64,
    pub arc_hits: u64,
    pub l2_hits: u64,
    pub misses: u64,
    /// Blocks written to L2.
    pub l2_writes: u64,
    /// Blocks that left the ARC when the feed budget was spent.
    pub feed_skipped: u64,
    pub arc_hit_ratio: f64,
    pub l2_hit_ratio: f64,
    pub miss_ratio: f64,
}

/// The L2 ring: keys in write order, each present at most once.
struct Ring {
    cap: usize,
    order: VecDeque<(u64, u64)>,
    /// Key -> sequence number of its live copy.
    live: FxHashMap<u64, u64>,
    seq: u64,
}

impl Ring {
    fn contains(&self, key: u64) -> bool {
        self.live.contains_key(&key)
    }

    fn write(&mut self, key: u64) {
        if self.cap == 0 || self.contains(key) {
            return;
        }
        while self.live.len() >= self.cap {
            let Some((old, s)) = self.order.pop_front() else { break };
            if self.live.get(&old) == Some(&s) {
                self.live.remove(&old);
            }
        }
        self.seq += 1;
        self.order.push_back((key, self.seq));
        self.live.insert(key, self.seq);
    }
}

/// Replays `accesses` through `policy` (`cache_blocks`) and an L2 of
/// `l2_blocks` fed at most `feed_blocks_per_sec` blocks per trace second
/// (0: unlimited).
pub fn replay_l2(
    policy: &mut dyn Policy,
    cache_blocks: u64,
    l2_blocks: u64,
    feed_blocks_per_sec: u64,
    accesses: &[BlockAccess],
) -> L2SimResult {
    let mut ring =
        Ring { cap: l2_blocks as usize, order: VecDeque::new(), live: FxHashMap::default(), seq: 0 };
    let (mut arc_hits, mut l2_hits, mut misses, mut writes, mut skipped) = (0u64, 0u64, 0u64, 0u64, 0u64);
    let mut evicted = Vec::new();
    let (mut second, mut budget) = (u64::MAX, 0u64);
    for a in accesses {
        let now_s = a.now_ns / 1_000_000_000;
        if now_s != second {
            second = now_s;
            budget = if feed_blocks_per_sec == 0 { u64::MAX } else { feed_blocks_per_sec };
        }
        let access = Access::demand(a.now_ns);
        if policy.lookup(a.key, access).is_hit() {
            arc_hits += 1;
            continue;
        }
        if ring.contains(a.key) {
            l2_hits += 1;
        } else {
            misses += 1;
        }
        policy.insert(a.key, 1, access, &mut evicted);
        for k in evicted.drain(..) {
            if ring.contains(k) {
                continue;
            }
            if budget > 0 {
                budget -= 1;
                ring.write(k);
                writes += 1;
            } else {
                skipped += 1;
            }
        }
    }
    let n = accesses.len() as u64;
    let r = |x: u64| if n == 0 { 0.0 } else { x as f64 / n as f64 };
    L2SimResult {
        policy: policy.name().to_string(),
        cache_blocks,
        l2_blocks,
        requests: n,
        arc_hits,
        l2_hits,
        misses,
        l2_writes: writes,
        feed_skipped: skipped,
        arc_hit_ratio: r(arc_hits),
        l2_hit_ratio: r(l2_hits),
        miss_ratio: r(misses),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arc_policy::by_name;

    fn looped(blocks: u64, rounds: u64) -> Vec<BlockAccess> {
        (0..rounds * blocks).map(|i| BlockAccess { key: i % blocks, now_ns: i * 1_000_000 }).collect()
    }

    #[test]
    fn an_l2_that_holds_the_loop_serves_it_and_a_rate_limit_costs_hits() {
        // 1000 blocks read in a loop: a 100-block LRU never hits, an L2 of
        // 2000 blocks catches everything after the first round.
        let t = looped(1000, 5);
        let r = replay_l2(by_name("lru", 100).unwrap().as_mut(), 100, 2000, 0, &t);
        assert_eq!(r.arc_hits, 0);
        assert_eq!(r.l2_hits, 4000);
        assert_eq!(r.misses, 1000);
        assert_eq!(r.arc_hits + r.l2_hits + r.misses, r.requests);
        // 1000 accesses per second, 100 fed per second: most evictions are lost.
        let slow = replay_l2(by_name("lru", 100).unwrap().as_mut(), 100, 2000, 100, &t);
        assert!(slow.l2_hits < r.l2_hits && slow.feed_skipped > 0, "{slow:?}");
        // A too small L2 (a loop larger than it) never hits.
        let small = replay_l2(by_name("lru", 100).unwrap().as_mut(), 100, 500, 0, &t);
        assert_eq!(small.l2_hits, 0);
    }
}
