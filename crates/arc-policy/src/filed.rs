//! Entries filed on one of N lists threaded through one slab, with each
//! list's total size and an index by key: the bookkeeping every policy with
//! several queues (S3-FIFO, 2Q, arc-adaptive) would otherwise repeat.

use rustc_hash::FxHashMap;

use crate::slab::{List, Slab};
use crate::Key;

/// An entry that knows its key, its size and the list it is on (`K`, an
/// enum whose value is the list's index).
pub(crate) trait Filed<K> {
    fn key(&self) -> Key;
    fn size(&self) -> u64;
    fn list(&self) -> K;
    fn set_list(&mut self, list: K);
    /// Counted per list in [`Filing::marked`] (arc-adaptive: metadata), so
    /// a policy knows a list holds nothing else without walking it.
    fn marked(&self) -> bool {
        false
    }
}

pub(crate) struct Filing<T, const N: usize> {
    pub(crate) slab: Slab<T>,
    pub(crate) index: FxHashMap<Key, u32>,
    pub(crate) lists: [List; N],
    pub(crate) sizes: [u64; N],
    /// Entries of each list whose [`Filed::marked`] is true.
    pub(crate) marked: [u64; N],
}

impl<T, const N: usize> Filing<T, N> {
    pub(crate) fn new() -> Self {
        Filing {
            slab: Slab::new(),
            index: FxHashMap::default(),
            lists: [List::default(); N],
            sizes: [0; N],
            marked: [0; N],
        }
    }

    /// Takes entry `idx` off its list; it stays in the slab and the index.
    pub(crate) fn unlink<K: Copy + Into<usize>>(&mut self, idx: u32)
    where
        T: Filed<K>,
    {
        let e = self.slab.get(idx);
        let (at, size, marked) = (e.list().into(), e.size(), e.marked());
        self.slab.unlink(&mut self.lists[at], idx);
        self.sizes[at] -= size;
        self.marked[at] -= u64::from(marked);
    }

    /// Files entry `idx` at the head of list `to`.
    pub(crate) fn push<K: Copy + Into<usize>>(&mut self, idx: u32, to: K)
    where
        T: Filed<K>,
    {
        let e = self.slab.get_mut(idx);
        e.set_list(to);
        let (size, marked) = (e.size(), e.marked());
        self.slab.push_head(&mut self.lists[to.into()], idx);
        self.sizes[to.into()] += size;
        self.marked[to.into()] += u64::from(marked);
    }

    /// Files exactly the entries of `order` on list `to`, the first at its
    /// tail, taking each off the list it was on; `order` must hold every
    /// entry `to` holds now.
    pub(crate) fn refile<K: Copy + Into<usize> + PartialEq>(&mut self, to: K, order: &[u32])
    where
        T: Filed<K>,
    {
        let (mut size, mut marked, mut moved) = (0, 0, 0);
        for &idx in order {
            if self.slab.get(idx).list() != to {
                self.unlink(idx);
                self.slab.get_mut(idx).set_list(to);
                moved += 1;
            }
            let e = self.slab.get(idx);
            size += e.size();
            marked += u64::from(e.marked());
        }
        // An entry of the list left out would keep links into it.
        assert_eq!(order.len(), self.lists[to.into()].len() + moved, "refile: an entry of the list left out");
        self.slab.relink(&mut self.lists[to.into()], order);
        self.sizes[to.into()] = size;
        self.marked[to.into()] = marked;
    }

    /// Forgets entry `idx` entirely.
    pub(crate) fn drop_entry<K: Copy + Into<usize>>(&mut self, idx: u32)
    where
        T: Filed<K>,
    {
        self.unlink(idx);
        let key = self.slab.get(idx).key();
        self.slab.release(idx);
        self.index.remove(&key);
    }
}
