//! Plain LRU over sizes, the baseline every comparison starts from.

use rustc_hash::FxHashMap;

use crate::slab::{List, Slab};
use crate::{Access, Key, ListKind, Lookup, Policy, PolicyStats};

#[derive(Debug)]
struct Entry {
    key: Key,
    size: u64,
    /// Brought in by a prefetch and not read since.
    prefetch: bool,
}

pub struct Lru {
    capacity: u64,
    size: u64,
    slab: Slab<Entry>,
    index: FxHashMap<Key, u32>,
    list: List,
    stats: PolicyStats,
}

impl Lru {
    pub fn new(capacity: u64) -> Self {
        Lru {
            capacity,
            size: 0,
            slab: Slab::new(),
            index: FxHashMap::default(),
            list: List::default(),
            stats: PolicyStats::default(),
        }
    }

    fn evict_to(&mut self, limit: u64, evicted: &mut Vec<Key>) {
        while self.size > limit {
            let Some(idx) = self.list.tail() else { break };
            let key = self.slab.get(idx).key;
            self.unlink_free(idx);
            evicted.push(key);
            self.stats.evicted += 1;
        }
    }

    fn unlink_free(&mut self, idx: u32) {
        let e = self.slab.get(idx);
        let (key, size) = (e.key, e.size);
        self.slab.unlink(&mut self.list, idx);
        self.slab.release(idx);
        self.index.remove(&key);
        self.size -= size;
    }
}

impl Policy for Lru {
    fn name(&self) -> &'static str {
        "lru"
    }

    fn lookup(&mut self, key: Key, access: Access) -> Lookup {
        match self.index.get(&key) {
            Some(&idx) => {
                self.stats.hits += 1;
                self.stats.mru_hits += 1;
                let e = self.slab.get_mut(idx);
                if e.prefetch && !access.prefetch {
                    e.prefetch = false;
                    self.stats.demand_hit_prefetch += 1;
                }
                self.slab.unlink(&mut self.list, idx);
                self.slab.push_head(&mut self.list, idx);
                Lookup::Hit(ListKind::Mru)
            }
            None => {
                self.stats.misses += 1;
                Lookup::Miss
            }
        }
    }

    fn insert(&mut self, key: Key, size: u64, access: Access, evicted: &mut Vec<Key>) {
        if let Some(&idx) = self.index.get(&key) {
            self.unlink_free(idx);
        }
        if size > self.capacity {
            return;
        }
        self.evict_to(self.capacity - size, evicted);
        let idx = self.slab.alloc(Entry { key, size, prefetch: access.prefetch });
        self.slab.push_head(&mut self.list, idx);
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

    fn scan_tail(&self, list: ListKind, max_size: u64, f: &mut dyn FnMut(Key, u64, bool) -> bool) {
        if list != ListKind::Mru {
            return;
        }
        let mut seen = 0;
        let mut cur = self.list.tail();
        while let Some(idx) = cur {
            let e = self.slab.get(idx);
            if seen >= max_size || !f(e.key, e.size, e.prefetch) {
                return;
            }
            seen += e.size;
            cur = self.slab.prev_of(idx);
        }
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

    fn validate(&self) -> Result<(), String> {
        if self.size > self.capacity {
            return Err(format!("size {} > capacity {}", self.size, self.capacity));
        }
        let sum: u64 = self.slab.iter(&self.list).map(|(_, e)| e.size).sum();
        if sum != self.size || self.list.len() != self.index.len() {
            return Err("list, index and size disagree".into());
        }
        Ok(())
    }
}
