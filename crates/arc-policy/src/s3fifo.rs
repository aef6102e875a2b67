//! S3-FIFO (Yang et al., "FIFO queues are all you need for cache
//! eviction", SOSP'23): a small FIFO that new keys enter, a main FIFO with
//! a 2-bit frequency (CLOCK-like reinsertion), and a ghost FIFO of keys
//! evicted from the small queue; a ghost hit enters main directly.
//!
//! Written to give exactly libCacheSim 0.3.5's hit counts with its default
//! parameters (small 10 %, ghost 90 %, move-to-main threshold 2), so the
//! details follow that implementation's observable behaviour (checked
//! request by request against it on random traces), not only the paper:
//! queue sizes are `floor(c * ratio)` in f64; a key moves from small to main
//! when it was hit at least twice there, and starts in main with frequency
//! 0; main reinserts a key with frequency `min(freq, 3) - 1`; eviction takes
//! from main while main is over its share or small is empty; until the
//! first eviction, new keys that find small full go straight to main; a
//! key as large as the small queue is not cached at all (with `c < 20`
//! units nothing is). Sizes are in any unit.

use crate::filed::{Filed, Filing};
use crate::{Access, Key, ListKind, Lookup, Policy, PolicyStats};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Queue {
    Small = 0,
    Main = 1,
    Ghost = 2,
}

#[derive(Debug)]
struct Entry {
    key: Key,
    size: u64,
    freq: u8,
    at: Queue,
}

impl From<Queue> for usize {
    fn from(l: Queue) -> usize {
        l as usize
    }
}

impl Filed<Queue> for Entry {
    fn key(&self) -> Key {
        self.key
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn list(&self) -> Queue {
        self.at
    }
    fn set_list(&mut self, list: Queue) {
        self.at = list;
    }
}

pub struct S3Fifo {
    capacity: u64,
    small_cap: u64,
    ghost_cap: u64,
    /// Entries, their lists and the lists' sizes.
    q: Filing<Entry, 3>,
    /// Until the first eviction, new keys that find small full go to main.
    has_evicted: bool,
    stats: PolicyStats,
}

/// How hits a key needs in the small queue to move to main.
const MOVE_TO_MAIN: u8 = 2;

impl S3Fifo {
    pub fn new(capacity: u64) -> Self {
        let mut s = S3Fifo {
            capacity: 0,
            small_cap: 0,
            ghost_cap: 0,
            q: Filing::new(),
            has_evicted: false,
            stats: PolicyStats::default(),
        };
        s.resize(capacity);
        s
    }

    fn resize(&mut self, capacity: u64) {
        self.capacity = capacity;
        // libCacheSim truncates a double product; the same arithmetic keeps
        // the queue sizes, and so the hit counts, identical.
        self.small_cap = (capacity as f64 * 0.1) as u64;
        self.ghost_cap = (capacity as f64 * 0.9) as u64;
    }

    fn main_cap(&self) -> u64 {
        self.capacity - self.small_cap
    }

    fn resident(&self) -> u64 {
        self.q.sizes[Queue::Small as usize] + self.q.sizes[Queue::Main as usize]
    }

    /// Files an evicted small-queue key as a ghost, first making room by
    /// forgetting the oldest ghosts.
    fn make_ghost(&mut self, idx: u32) {
        let size = self.q.slab.get(idx).size;
        if size > self.ghost_cap {
            self.q.drop_entry(idx);
            return;
        }
        while self.q.sizes[Queue::Ghost as usize] + size > self.ghost_cap {
            let Some(tail) = self.q.lists[Queue::Ghost as usize].tail() else { break };
            self.q.drop_entry(tail);
            self.stats.deleted += 1;
        }
        self.q.push(idx, Queue::Ghost);
    }

    /// Evicts one resident key from small, moving the frequently hit ones
    /// it passes on the way to main.
    fn evict_small(&mut self, out: &mut Vec<Key>) {
        while let Some(idx) = self.q.lists[Queue::Small as usize].tail() {
            self.q.unlink(idx);
            let e = self.q.slab.get(idx);
            if e.freq >= MOVE_TO_MAIN {
                self.q.slab.get_mut(idx).freq = 0;
                self.q.push(idx, Queue::Main);
                continue;
            }
            out.push(e.key);
            self.stats.evicted += 1;
            self.make_ghost(idx);
            return;
        }
    }

    /// Evicts one resident key from main, giving each key with a
    /// frequency another round one step lower.
    fn evict_main(&mut self, out: &mut Vec<Key>) {
        while let Some(idx) = self.q.lists[Queue::Main as usize].tail() {
            self.q.unlink(idx);
            let e = self.q.slab.get_mut(idx);
            if e.freq >= 1 {
                e.freq = e.freq.min(3) - 1;
                self.q.push(idx, Queue::Main);
                continue;
            }
            out.push(e.key);
            self.stats.evicted += 1;
            let key = e.key;
            self.q.slab.release(idx);
            self.q.index.remove(&key);
            return;
        }
    }

    fn evict_one(&mut self, out: &mut Vec<Key>) {
        self.has_evicted = true;
        if self.q.sizes[Queue::Main as usize] > self.main_cap() || self.q.sizes[Queue::Small as usize] == 0 {
            self.evict_main(out);
        } else {
            self.evict_small(out);
        }
    }

    fn evict_to(&mut self, limit: u64, out: &mut Vec<Key>) {
        while self.resident() > limit {
            self.evict_one(out);
        }
    }
}

impl Policy for S3Fifo {
    fn name(&self) -> &'static str {
        "s3fifo"
    }

    fn lookup(&mut self, key: Key, _access: Access) -> Lookup {
        let Some(&idx) = self.q.index.get(&key) else {
            self.stats.misses += 1;
            return Lookup::Miss;
        };
        let e = self.q.slab.get_mut(idx);
        let at = e.at;
        if at == Queue::Ghost {
            self.stats.misses += 1;
            self.stats.mru_ghost_hits += 1;
            return Lookup::GhostHit(ListKind::Mru);
        }
        e.freq = (e.freq + 1).min(3);
        self.stats.hits += 1;
        if at == Queue::Small {
            self.stats.mru_hits += 1;
            Lookup::Hit(ListKind::Mru)
        } else {
            self.stats.mfu_hits += 1;
            Lookup::Hit(ListKind::Mfu)
        }
    }

    fn insert(&mut self, key: Key, size: u64, _access: Access, evicted: &mut Vec<Key>) {
        // A ghost leaves its queue before eviction runs, as in libCacheSim,
        // so the evictions below do not count it against the ghost size.
        let ghost = match self.q.index.get(&key) {
            // Stored again (a client's rewrite, in a server-style replay):
            // it stays where it is with what it earned; a store is no re-use.
            Some(&idx) if self.q.slab.get(idx).at != Queue::Ghost && self.q.slab.get(idx).size == size => {
                return
            }
            Some(&idx) => {
                let was_ghost = self.q.slab.get(idx).at == Queue::Ghost;
                self.q.drop_entry(idx);
                was_ghost
            }
            None => false,
        };
        if size > self.capacity {
            return;
        }
        self.evict_to(self.capacity - size, evicted);
        let to = if ghost {
            Queue::Main
        } else if size >= self.small_cap {
            return;
        } else if !self.has_evicted && self.q.sizes[Queue::Small as usize] >= self.small_cap {
            // Warming up: filling main at once lets the first keys that
            // were hit stay, where a full small queue would push them out.
            Queue::Main
        } else {
            Queue::Small
        };
        let idx = self.q.slab.alloc(Entry { key, size, freq: 0, at: to });
        self.q.push(idx, to);
        self.q.index.insert(key, idx);
    }

    fn remove(&mut self, key: Key) -> bool {
        let Some(&idx) = self.q.index.get(&key) else {
            return false;
        };
        let resident = self.q.slab.get(idx).at != Queue::Ghost;
        self.q.drop_entry(idx);
        resident
    }

    fn contains(&self, key: Key) -> bool {
        self.q.index.get(&key).is_some_and(|&i| self.q.slab.get(i).at != Queue::Ghost)
    }

    fn set_limits(&mut self, _c_min: u64, c_max: u64, evicted: &mut Vec<Key>) {
        self.resize(c_max);
        self.evict_to(c_max, evicted);
        while self.q.sizes[Queue::Ghost as usize] > self.ghost_cap {
            let Some(tail) = self.q.lists[Queue::Ghost as usize].tail() else { break };
            self.q.drop_entry(tail);
            self.stats.deleted += 1;
        }
    }

    fn stats(&self) -> PolicyStats {
        let mut s = self.stats;
        s.size = self.resident();
        s.c = self.capacity;
        s.c_min = self.capacity;
        s.c_max = self.capacity;
        s.mru_size = self.q.sizes[Queue::Small as usize];
        s.mfu_size = self.q.sizes[Queue::Main as usize];
        s.mru_ghost_size = self.q.sizes[Queue::Ghost as usize];
        s.entries = (self.q.lists[0].len() + self.q.lists[1].len()) as u64;
        s.pd =
            ((u128::from(self.small_cap) << 32).checked_div(u128::from(self.capacity))).unwrap_or(0) as u64;
        s
    }

    fn scan_tail(&self, list: ListKind, max_size: u64, f: &mut dyn FnMut(Key, u64, bool) -> bool) {
        let q = match list {
            ListKind::Mru => Queue::Small,
            ListKind::Mfu => Queue::Main,
        };
        self.q.slab.walk_tail(&self.q.lists[q as usize], max_size, |e| (e.key, e.size, false), f);
    }

    fn validate(&self) -> Result<(), String> {
        if self.resident() > self.capacity {
            return Err(format!("resident {} > capacity {}", self.resident(), self.capacity));
        }
        if self.q.sizes[Queue::Ghost as usize] > self.ghost_cap {
            return Err(format!("ghost {} > {}", self.q.sizes[Queue::Ghost as usize], self.ghost_cap));
        }
        let mut listed = 0;
        for q in [Queue::Small, Queue::Main, Queue::Ghost] {
            let mut sum = 0;
            for (idx, e) in self.q.slab.iter(&self.q.lists[q as usize]) {
                if e.at != q || self.q.index.get(&e.key) != Some(&idx) || e.freq > 3 {
                    return Err(format!("entry {} misfiled on {q:?}", e.key));
                }
                sum += e.size;
            }
            if sum != self.q.sizes[q as usize] {
                return Err(format!("{q:?} size {} but entries sum to {sum}", self.q.sizes[q as usize]));
            }
            listed += self.q.lists[q as usize].len();
        }
        if listed != self.q.index.len() {
            return Err("index and lists disagree".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(p: &mut S3Fifo, keys: &[u64]) -> String {
        let mut ev = Vec::new();
        keys.iter()
            .map(|&k| {
                if p.lookup(k, Access::demand(0)).is_hit() {
                    '1'
                } else {
                    p.insert(k, 1, Access::demand(0), &mut ev);
                    '0'
                }
            })
            .collect()
    }

    /// c = 20: small holds 2, main 18, ghosts 18.
    #[test]
    fn one_hit_wonders_pass_through_small_and_ghost_hits_enter_main() {
        let mut p = S3Fifo::new(20);
        let fill: Vec<u64> = (1..=20).collect();
        assert_eq!(run(&mut p, &fill), "0".repeat(20));
        // Warming up, keys that find small full fill main.
        assert_eq!((p.stats().mru_size, p.stats().mfu_size), (2, 18));
        // Full: 21 evicts 1, never hit, from small to the ghost queue.
        assert_eq!(run(&mut p, &[21]), "0");
        assert!(!p.contains(1));
        assert_eq!(p.stats().mru_ghost_size, 1);
        // 1 comes back from the ghost queue straight into main (2 leaves
        // small to make room).
        assert_eq!(p.lookup(1, Access::demand(0)), Lookup::GhostHit(ListKind::Mru));
        p.insert(1, 1, Access::demand(0), &mut Vec::new());
        assert_eq!((p.stats().mru_size, p.stats().mfu_size), (1, 19));
        assert_eq!(run(&mut p, &[1]), "1");
        // Main is over its share: 22 evicts main's oldest, 3, never hit.
        assert_eq!(run(&mut p, &[21, 21, 22]), "110");
        assert!(!p.contains(3));
        // 21 was hit twice in small: when its turn comes it moves to main
        // and 22 goes instead.
        assert_eq!(run(&mut p, &[23]), "0");
        assert!(p.contains(21) && !p.contains(22));
        assert_eq!((p.stats().mru_size, p.stats().mfu_size), (1, 19));
        p.validate().unwrap();
    }

    #[test]
    fn too_small_a_cache_caches_nothing() {
        let mut p = S3Fifo::new(10);
        assert_eq!(run(&mut p, &[1, 1, 1]), "000");
    }
}
