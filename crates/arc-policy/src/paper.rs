//! The ARC of Megiddo & Modha (FAST'03, figure 4), as written: unit-size
//! pages, a fixed cache of `c` pages, a directory of `2c`, and a real-valued
//! target `p` for T1. Used by the simulator and as a reference that must
//! match libCacheSim's hit counts exactly; sizes passed to `insert` are
//! ignored (every entry is one page).

use rustc_hash::FxHashMap;

use crate::slab::{List, Slab};
use crate::{Access, Key, ListKind, Lookup, Policy, PolicyStats};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Where {
    T1,
    T2,
    B1,
    B2,
}

#[derive(Debug)]
struct Entry {
    key: Key,
    at: Where,
}

pub struct PaperArc {
    c: u64,
    p: f64,
    slab: Slab<Entry>,
    index: FxHashMap<Key, u32>,
    t1: List,
    t2: List,
    b1: List,
    b2: List,
    stats: PolicyStats,
}

impl PaperArc {
    pub fn new(c: u64) -> Self {
        PaperArc {
            c,
            p: 0.0,
            slab: Slab::new(),
            index: FxHashMap::default(),
            t1: List::default(),
            t2: List::default(),
            b1: List::default(),
            b2: List::default(),
            stats: PolicyStats::default(),
        }
    }

    fn list(&mut self, at: Where) -> &mut List {
        match at {
            Where::T1 => &mut self.t1,
            Where::T2 => &mut self.t2,
            Where::B1 => &mut self.b1,
            Where::B2 => &mut self.b2,
        }
    }

    fn move_to(&mut self, idx: u32, to: Where) {
        let from = self.slab.get(idx).at;
        let mut l = *self.list(from);
        self.slab.unlink(&mut l, idx);
        *self.list(from) = l;
        self.slab.get_mut(idx).at = to;
        let mut l = *self.list(to);
        self.slab.push_head(&mut l, idx);
        *self.list(to) = l;
    }

    fn drop_entry(&mut self, idx: u32) {
        let e = self.slab.get(idx);
        let (key, at) = (e.key, e.at);
        let mut l = *self.list(at);
        self.slab.unlink(&mut l, idx);
        *self.list(at) = l;
        self.slab.release(idx);
        self.index.remove(&key);
    }

    /// Drops the LRU entry of a ghost list (directory trimming).
    fn delete_lru(&mut self, at: Where) {
        if let Some(idx) = self.list(at).tail() {
            self.drop_entry(idx);
            self.stats.deleted += 1;
        }
    }

    /// REPLACE(x, p): demotes the LRU page of T1 or T2 to its ghost list.
    fn replace(&mut self, in_b2: bool, evicted: &mut Vec<Key>) {
        let t1 = self.t1.len() as f64;
        let from_t1 = self.t1.len() >= 1 && ((in_b2 && t1 == self.p) || t1 > self.p);
        let (src, dst) =
            if from_t1 || self.t2.len() == 0 { (Where::T1, Where::B1) } else { (Where::T2, Where::B2) };
        if let Some(idx) = self.list(src).tail() {
            evicted.push(self.slab.get(idx).key);
            self.stats.evicted += 1;
            self.move_to(idx, dst);
        }
    }

    fn insert_new(&mut self, key: Key, evicted: &mut Vec<Key>) {
        let c = self.c as usize;
        let l1 = self.t1.len() + self.b1.len();
        if l1 == c {
            if self.t1.len() < c {
                self.delete_lru(Where::B1);
                self.replace(false, evicted);
            } else if let Some(idx) = self.t1.tail() {
                evicted.push(self.slab.get(idx).key);
                self.stats.evicted += 1;
                self.drop_entry(idx);
            }
        } else if l1 < c {
            let total = l1 + self.t2.len() + self.b2.len();
            if total >= c {
                if total == 2 * c {
                    self.delete_lru(Where::B2);
                }
                self.replace(false, evicted);
            }
        }
        let idx = self.slab.alloc(Entry { key, at: Where::T1 });
        self.slab.push_head(&mut self.t1, idx);
        self.index.insert(key, idx);
    }
}

impl Policy for PaperArc {
    fn name(&self) -> &'static str {
        "arc-paper"
    }

    fn lookup(&mut self, key: Key, _access: Access) -> Lookup {
        let Some(&idx) = self.index.get(&key) else {
            self.stats.misses += 1;
            return Lookup::Miss;
        };
        match self.slab.get(idx).at {
            Where::T1 => {
                self.stats.hits += 1;
                self.stats.mru_hits += 1;
                self.move_to(idx, Where::T2);
                Lookup::Hit(ListKind::Mru)
            }
            Where::T2 => {
                self.stats.hits += 1;
                self.stats.mfu_hits += 1;
                self.move_to(idx, Where::T2);
                Lookup::Hit(ListKind::Mfu)
            }
            Where::B1 => {
                self.stats.misses += 1;
                self.stats.mru_ghost_hits += 1;
                Lookup::GhostHit(ListKind::Mru)
            }
            Where::B2 => {
                self.stats.misses += 1;
                self.stats.mfu_ghost_hits += 1;
                Lookup::GhostHit(ListKind::Mfu)
            }
        }
    }

    fn insert(&mut self, key: Key, _size: u64, _access: Access, evicted: &mut Vec<Key>) {
        if self.c == 0 {
            return;
        }
        let Some(&idx) = self.index.get(&key) else {
            self.insert_new(key, evicted);
            return;
        };
        let (b1, b2) = (self.b1.len() as f64, self.b2.len() as f64);
        match self.slab.get(idx).at {
            Where::T1 | Where::T2 => self.move_to(idx, Where::T2),
            Where::B1 => {
                let delta = if b1 >= b2 { 1.0 } else { b2 / b1 };
                self.p = (self.p + delta).min(self.c as f64);
                self.replace(false, evicted);
                self.move_to(idx, Where::T2);
            }
            Where::B2 => {
                let delta = if b2 >= b1 { 1.0 } else { b1 / b2 };
                self.p = (self.p - delta).max(0.0);
                self.replace(true, evicted);
                self.move_to(idx, Where::T2);
            }
        }
    }

    fn remove(&mut self, key: Key) -> bool {
        let Some(&idx) = self.index.get(&key) else {
            return false;
        };
        let resident = matches!(self.slab.get(idx).at, Where::T1 | Where::T2);
        self.drop_entry(idx);
        resident
    }

    fn contains(&self, key: Key) -> bool {
        self.index.get(&key).is_some_and(|&i| matches!(self.slab.get(i).at, Where::T1 | Where::T2))
    }

    fn scan_tail(&self, list: ListKind, max_size: u64, f: &mut dyn FnMut(Key, u64, bool) -> bool) {
        let l = match list {
            ListKind::Mru => &self.t1,
            ListKind::Mfu => &self.t2,
        };
        let mut seen = 0;
        let mut cur = l.tail();
        while let Some(idx) = cur {
            if seen >= max_size || !f(self.slab.get(idx).key, 1, false) {
                return;
            }
            seen += 1;
            cur = self.slab.prev_of(idx);
        }
    }

    fn set_limits(&mut self, _c_min: u64, c_max: u64, evicted: &mut Vec<Key>) {
        // The paper has a fixed c; shrinking demotes until the bounds hold again.
        self.c = c_max;
        self.p = self.p.min(c_max as f64);
        while (self.t1.len() + self.t2.len()) as u64 > self.c {
            self.replace(false, evicted);
        }
        while (self.t1.len() + self.b1.len()) as u64 > self.c {
            if self.b1.len() > 0 {
                self.delete_lru(Where::B1);
            } else {
                self.replace(false, evicted);
            }
        }
        while (self.t1.len() + self.t2.len() + self.b1.len() + self.b2.len()) as u64 > 2 * self.c {
            self.delete_lru(Where::B2);
        }
    }

    fn stats(&self) -> PolicyStats {
        let mut s = self.stats;
        s.c = self.c;
        s.c_min = self.c;
        s.c_max = self.c;
        s.mru_size = self.t1.len() as u64;
        s.mfu_size = self.t2.len() as u64;
        s.mru_ghost_size = self.b1.len() as u64;
        s.mfu_ghost_size = self.b2.len() as u64;
        s.size = s.mru_size + s.mfu_size;
        s.entries = s.size;
        s.pd = if self.c == 0 { 0 } else { (self.p / self.c as f64 * 4_294_967_296.0) as u64 };
        s
    }

    fn validate(&self) -> Result<(), String> {
        let (t1, t2, b1, b2) =
            (self.t1.len() as u64, self.t2.len() as u64, self.b1.len() as u64, self.b2.len() as u64);
        let c = self.c;
        if t1 + t2 > c {
            return Err(format!("|T1|+|T2| = {} > c = {c}", t1 + t2));
        }
        if t1 + b1 > c {
            return Err(format!("|T1|+|B1| = {} > c = {c}", t1 + b1));
        }
        if t1 + t2 + b1 + b2 > 2 * c {
            return Err(format!("directory {} > 2c = {}", t1 + t2 + b1 + b2, 2 * c));
        }
        if !(0.0..=c as f64).contains(&self.p) {
            return Err(format!("p = {} outside [0, {c}]", self.p));
        }
        if self.index.len() as u64 != t1 + t2 + b1 + b2 {
            return Err("index and lists disagree".into());
        }
        for (list, at) in
            [(&self.t1, Where::T1), (&self.t2, Where::T2), (&self.b1, Where::B1), (&self.b2, Where::B2)]
        {
            for (idx, e) in self.slab.iter(list) {
                if e.at != at || self.index.get(&e.key) != Some(&idx) {
                    return Err(format!("entry {} misfiled", e.key));
                }
            }
        }
        Ok(())
    }
}
