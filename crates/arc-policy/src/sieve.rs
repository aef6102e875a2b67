//! SIEVE (Zhang et al., "SIEVE is simpler than LRU", NSDI'24): one FIFO
//! queue, a visited bit set by hits, and a hand that moves from the old end
//! towards the new one, clearing visited bits and evicting the first
//! unvisited key it meets; it stays where it stopped for the next eviction.
//! New keys enter at the new end, behind the hand. Sizes are in any unit.

use rustc_hash::FxHashMap;

use crate::slab::{List, Slab};
use crate::{Access, Key, ListKind, Lookup, Policy, PolicyStats};

#[derive(Debug)]
struct Entry {
    key: Key,
    size: u64,
    visited: bool,
}

pub struct Sieve {
    capacity: u64,
    size: u64,
    slab: Slab<Entry>,
    index: FxHashMap<Key, u32>,
    queue: List,
    /// Where the next eviction starts looking; `None` means the old end.
    hand: Option<u32>,
    stats: PolicyStats,
}

impl Sieve {
    pub fn new(capacity: u64) -> Self {
        Sieve {
            capacity,
            size: 0,
            slab: Slab::new(),
            index: FxHashMap::default(),
            queue: List::default(),
            hand: None,
            stats: PolicyStats::default(),
        }
    }

    fn unlink_free(&mut self, idx: u32) {
        if self.hand == Some(idx) {
            self.hand = self.slab.prev_of(idx);
        }
        let e = self.slab.get(idx);
        let (key, size) = (e.key, e.size);
        self.slab.unlink(&mut self.queue, idx);
        self.slab.release(idx);
        self.index.remove(&key);
        self.size -= size;
    }

    fn evict_one(&mut self, out: &mut Vec<Key>) {
        let mut cur = self.hand.or(self.queue.tail());
        while let Some(idx) = cur {
            let e = self.slab.get_mut(idx);
            if !e.visited {
                out.push(e.key);
                self.stats.evicted += 1;
                // The hand goes on from the evicted key's newer neighbour.
                self.hand = Some(idx);
                self.unlink_free(idx);
                return;
            }
            e.visited = false;
            cur = self.slab.prev_of(idx).or(self.queue.tail());
        }
    }

    fn evict_to(&mut self, limit: u64, out: &mut Vec<Key>) {
        while self.size > limit && self.queue.len() > 0 {
            self.evict_one(out);
        }
    }
}

impl Policy for Sieve {
    fn name(&self) -> &'static str {
        "sieve"
    }

    fn lookup(&mut self, key: Key, _access: Access) -> Lookup {
        match self.index.get(&key) {
            Some(&idx) => {
                self.slab.get_mut(idx).visited = true;
                self.stats.hits += 1;
                self.stats.mru_hits += 1;
                Lookup::Hit(ListKind::Mru)
            }
            None => {
                self.stats.misses += 1;
                Lookup::Miss
            }
        }
    }

    fn insert(&mut self, key: Key, size: u64, _access: Access, evicted: &mut Vec<Key>) {
        if let Some(&idx) = self.index.get(&key) {
            // Stored again (a client's rewrite, in a server-style replay):
            // it stays where it is with its visited bit.
            if self.slab.get(idx).size == size {
                return;
            }
            self.unlink_free(idx);
        }
        if size > self.capacity {
            return;
        }
        self.evict_to(self.capacity - size, evicted);
        let idx = self.slab.alloc(Entry { key, size, visited: false });
        self.slab.push_head(&mut self.queue, idx);
        self.index.insert(key, idx);
        self.size += size;
    }

    fn remove(&mut self, key: Key) -> bool {
        match self.index.get(&key) {
            Some(&idx) => {
                self.unlink_free(idx);
                true
            }
            None => false,
        }
    }

    fn contains(&self, key: Key) -> bool {
        self.index.contains_key(&key)
    }

    fn set_limits(&mut self, _c_min: u64, c_max: u64, evicted: &mut Vec<Key>) {
        self.capacity = c_max;
        self.evict_to(c_max, evicted);
    }

    fn stats(&self) -> PolicyStats {
        let mut s = self.stats;
        s.size = self.size;
        s.mru_size = self.size;
        s.c = self.capacity;
        s.c_min = self.capacity;
        s.c_max = self.capacity;
        s.entries = self.index.len() as u64;
        s
    }

    /// The order keys would leave in if none were visited: SIEVE's real
    /// order depends on visited bits the hand has not reached yet.
    fn scan_tail(&self, list: ListKind, max_size: u64, f: &mut dyn FnMut(Key, u64, bool) -> bool) {
        if list == ListKind::Mru {
            self.slab.walk_tail(&self.queue, max_size, |e| (e.key, e.size, false), f);
        }
    }

    fn validate(&self) -> Result<(), String> {
        if self.size > self.capacity {
            return Err(format!("size {} > capacity {}", self.size, self.capacity));
        }
        let sum: u64 = self.slab.iter(&self.queue).map(|(_, e)| e.size).sum();
        if sum != self.size || self.queue.len() != self.index.len() {
            return Err("queue, index and size disagree".into());
        }
        if let Some(h) = self.hand {
            if !self.slab.iter(&self.queue).any(|(i, _)| i == h) {
                return Err("the hand points outside the queue".into());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(p: &mut Sieve, keys: &[u64]) -> String {
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

    /// Worked by hand, a cache of 3 (queue written new end first, `*` for
    /// visited, `^` for the hand):
    /// 1 2 3      -> [3 2 1]
    /// 1 (hit)    -> [3 2 1*]
    /// 4: hand from the old end: 1* cleared, 2 evicted; hand stays at 3's
    ///    side of 2, i.e. on 3 -> [4 3^ 1]
    /// 3 (hit)    -> [4 3*^ 1]
    /// 5: 3* cleared, hand moves on to 4, evicted -> [5 3 1] with the hand
    ///    wrapped to the old end
    /// 2 (miss): 1 evicted, hand on 3 -> [2 5 3^]
    /// 3 hit, 1 miss: 3* cleared, 5 evicted -> [1 2 3]
    #[test]
    fn hand_computed_example() {
        let mut p = Sieve::new(3);
        assert_eq!(run(&mut p, &[1, 2, 3, 1, 4]), "00010");
        assert!(!p.contains(2) && p.contains(1));
        assert_eq!(run(&mut p, &[3, 5]), "10");
        assert!(!p.contains(4) && p.contains(3) && p.contains(1));
        assert_eq!(run(&mut p, &[2]), "0");
        assert!(!p.contains(1));
        assert_eq!(run(&mut p, &[3, 1]), "10");
        assert!(!p.contains(5) && p.contains(2) && p.contains(3));
        p.validate().unwrap();
    }
}
