//! A byte-sized policy seen in blocks: the simulator counts blocks of one
//! size, a serving policy counts bytes (its growth step, margins and
//! prefetch rules are in bytes), so replaying "what the server runs"
//! means scaling every size on the way in and out.

use crate::{Access, Key, ListKind, Lookup, Policy, PolicyStats};

pub struct InBlocks {
    inner: Box<dyn Policy>,
    block_bytes: u64,
}

impl InBlocks {
    /// `inner` counts bytes; callers will count blocks of `block_bytes`.
    pub fn new(inner: Box<dyn Policy>, block_bytes: u64) -> Self {
        InBlocks { inner, block_bytes: block_bytes.max(1) }
    }

    fn bytes(&self, units: u64) -> u64 {
        units.saturating_mul(self.block_bytes)
    }
}

impl Policy for InBlocks {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn lookup(&mut self, key: Key, access: Access) -> Lookup {
        self.inner.lookup(key, access)
    }

    fn insert(&mut self, key: Key, size: u64, access: Access, evicted: &mut Vec<Key>) {
        let bytes = self.bytes(size);
        self.inner.insert(key, bytes, access, evicted)
    }

    fn remove(&mut self, key: Key) -> bool {
        self.inner.remove(key)
    }

    fn contains(&self, key: Key) -> bool {
        self.inner.contains(key)
    }

    fn set_limits(&mut self, c_min: u64, c_max: u64, evicted: &mut Vec<Key>) {
        let (lo, hi) = (self.bytes(c_min), self.bytes(c_max));
        self.inner.set_limits(lo, hi, evicted)
    }

    fn stats(&self) -> PolicyStats {
        let mut s = self.inner.stats();
        let b = self.block_bytes;
        for v in [
            &mut s.size,
            &mut s.c,
            &mut s.c_min,
            &mut s.c_max,
            &mut s.mru_size,
            &mut s.mfu_size,
            &mut s.mru_ghost_size,
            &mut s.mfu_ghost_size,
        ] {
            *v /= b;
        }
        s
    }

    fn scan_tail(&self, list: ListKind, max_size: u64, f: &mut dyn FnMut(Key, u64, bool) -> bool) {
        let b = self.block_bytes;
        self.inner.scan_tail(list, self.bytes(max_size), &mut |k, size, pf| f(k, size / b, pf))
    }

    fn scan_tail_reused(&self, list: ListKind, max_size: u64, f: &mut dyn FnMut(Key, u64, bool) -> bool) {
        let b = self.block_bytes;
        self.inner.scan_tail_reused(list, self.bytes(max_size), &mut |k, size, pf| f(k, size / b, pf))
    }

    fn set_min_prefetch_ns(&mut self, ns: u64) {
        self.inner.set_min_prefetch_ns(ns)
    }

    fn validate(&self) -> Result<(), String> {
        self.inner.validate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serving;

    #[test]
    fn sizes_are_scaled_both_ways() {
        let inner = serving("arc", 8 * 4096, 8 * 4096, 0).unwrap();
        let mut p = InBlocks::new(inner, 4096);
        let mut ev = Vec::new();
        for k in 0..10 {
            p.insert(k, 1, Access::demand(k), &mut ev);
        }
        let s = p.stats();
        assert_eq!((s.size, s.c_max), (8, 8));
        assert_eq!(ev, vec![0, 1]);
        let mut seen = 0;
        p.scan_tail(ListKind::Mru, 3, &mut |_, size, _| {
            seen += size;
            true
        });
        assert_eq!(seen, 3);
        p.validate().unwrap();
    }
}
