//! 2Q (Johnson & Shasha, VLDB'94), the full version: new keys enter A1in, a
//! FIFO; keys leaving A1in are remembered in A1out, a ghost FIFO; a key
//! requested again while in A1out enters Am, an LRU. Hits in A1in change
//! nothing (the paper's "correlated references").
//!
//! Written to give exactly libCacheSim 0.3.5's hit counts with its default
//! parameters: A1in is `floor(c * 0.25)` and A1out `floor(c * 0.5)` (f64
//! products truncated), Am takes what A1in leaves; eviction takes from A1in
//! while A1in is over its share or Am is empty, else from Am. The paper's
//! own tuning (A1in 25 %, A1out 50 % of the cache in pages) is the same.
//! Sizes are in any unit.

use crate::filed::{Filed, Filing};
use crate::{Access, Key, ListKind, Lookup, Policy, PolicyStats};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Queue {
    In = 0,
    Main = 1,
    Out = 2,
}

#[derive(Debug)]
struct Entry {
    key: Key,
    size: u64,
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

pub struct TwoQ {
    capacity: u64,
    in_cap: u64,
    out_cap: u64,
    /// Entries, their lists and the lists' sizes.
    q: Filing<Entry, 3>,
    stats: PolicyStats,
}

impl TwoQ {
    pub fn new(capacity: u64) -> Self {
        let mut q =
            TwoQ { capacity: 0, in_cap: 0, out_cap: 0, q: Filing::new(), stats: PolicyStats::default() };
        q.resize(capacity);
        q
    }

    fn resize(&mut self, capacity: u64) {
        self.capacity = capacity;
        self.in_cap = (capacity as f64 * 0.25) as u64;
        self.out_cap = (capacity as f64 * 0.5) as u64;
    }

    fn resident(&self) -> u64 {
        self.q.sizes[Queue::In as usize] + self.q.sizes[Queue::Main as usize]
    }

    fn trim_out(&mut self, room: u64) {
        while self.q.sizes[Queue::Out as usize] + room > self.out_cap {
            let Some(tail) = self.q.lists[Queue::Out as usize].tail() else { break };
            self.q.drop_entry(tail);
            self.stats.deleted += 1;
        }
    }

    fn evict_one(&mut self, out: &mut Vec<Key>) {
        let from_in =
            self.q.sizes[Queue::In as usize] > self.in_cap || self.q.sizes[Queue::Main as usize] == 0;
        let q = if from_in { Queue::In } else { Queue::Main };
        let Some(idx) = self.q.lists[q as usize].tail() else { return };
        let e = self.q.slab.get(idx);
        out.push(e.key);
        self.stats.evicted += 1;
        if q == Queue::Main || e.size > self.out_cap {
            self.q.drop_entry(idx);
            return;
        }
        let size = e.size;
        self.q.unlink(idx);
        self.trim_out(size);
        self.q.push(idx, Queue::Out);
    }

    fn evict_to(&mut self, limit: u64, out: &mut Vec<Key>) {
        while self.resident() > limit {
            self.evict_one(out);
        }
    }
}

impl Policy for TwoQ {
    fn name(&self) -> &'static str {
        "2q"
    }

    fn lookup(&mut self, key: Key, _access: Access) -> Lookup {
        let Some(&idx) = self.q.index.get(&key) else {
            self.stats.misses += 1;
            return Lookup::Miss;
        };
        match self.q.slab.get(idx).at {
            Queue::In => {
                self.stats.hits += 1;
                self.stats.mru_hits += 1;
                Lookup::Hit(ListKind::Mru)
            }
            Queue::Main => {
                self.stats.hits += 1;
                self.stats.mfu_hits += 1;
                self.q.unlink(idx);
                self.q.push(idx, Queue::Main);
                Lookup::Hit(ListKind::Mfu)
            }
            Queue::Out => {
                self.stats.misses += 1;
                self.stats.mru_ghost_hits += 1;
                Lookup::GhostHit(ListKind::Mru)
            }
        }
    }

    fn insert(&mut self, key: Key, size: u64, _access: Access, evicted: &mut Vec<Key>) {
        // A ghost leaves A1out before eviction refills it.
        let ghost = match self.q.index.get(&key) {
            // Stored again (a client's rewrite, in a server-style replay):
            // it stays where it is.
            Some(&idx) if self.q.slab.get(idx).at != Queue::Out && self.q.slab.get(idx).size == size => {
                return
            }
            Some(&idx) => {
                let was_ghost = self.q.slab.get(idx).at == Queue::Out;
                self.q.drop_entry(idx);
                was_ghost
            }
            None => false,
        };
        if size > self.capacity {
            return;
        }
        self.evict_to(self.capacity - size, evicted);
        let to = if ghost { Queue::Main } else { Queue::In };
        let idx = self.q.slab.alloc(Entry { key, size, at: to });
        self.q.push(idx, to);
        self.q.index.insert(key, idx);
    }

    fn remove(&mut self, key: Key) -> bool {
        let Some(&idx) = self.q.index.get(&key) else {
            return false;
        };
        let resident = self.q.slab.get(idx).at != Queue::Out;
        self.q.drop_entry(idx);
        resident
    }

    fn contains(&self, key: Key) -> bool {
        self.q.index.get(&key).is_some_and(|&i| self.q.slab.get(i).at != Queue::Out)
    }

    fn set_limits(&mut self, _c_min: u64, c_max: u64, evicted: &mut Vec<Key>) {
        self.resize(c_max);
        self.evict_to(c_max, evicted);
        self.trim_out(0);
    }

    fn stats(&self) -> PolicyStats {
        let mut s = self.stats;
        s.size = self.resident();
        s.c = self.capacity;
        s.c_min = self.capacity;
        s.c_max = self.capacity;
        s.mru_size = self.q.sizes[Queue::In as usize];
        s.mfu_size = self.q.sizes[Queue::Main as usize];
        s.mru_ghost_size = self.q.sizes[Queue::Out as usize];
        s.entries = (self.q.lists[0].len() + self.q.lists[1].len()) as u64;
        s.pd = ((u128::from(self.in_cap) << 32).checked_div(u128::from(self.capacity))).unwrap_or(0) as u64;
        s
    }

    fn scan_tail(&self, list: ListKind, max_size: u64, f: &mut dyn FnMut(Key, u64, bool) -> bool) {
        let q = match list {
            ListKind::Mru => Queue::In,
            ListKind::Mfu => Queue::Main,
        };
        self.q.slab.walk_tail(&self.q.lists[q as usize], max_size, |e| (e.key, e.size, false), f);
    }

    fn validate(&self) -> Result<(), String> {
        if self.resident() > self.capacity {
            return Err(format!("resident {} > capacity {}", self.resident(), self.capacity));
        }
        if self.q.sizes[Queue::Out as usize] > self.out_cap {
            return Err(format!("A1out {} > {}", self.q.sizes[Queue::Out as usize], self.out_cap));
        }
        let mut listed = 0;
        for q in [Queue::In, Queue::Main, Queue::Out] {
            let mut sum = 0;
            for (idx, e) in self.q.slab.iter(&self.q.lists[q as usize]) {
                if e.at != q || self.q.index.get(&e.key) != Some(&idx) {
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
