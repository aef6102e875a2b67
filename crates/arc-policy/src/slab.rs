//! Index-based doubly linked lists over one slab.
//!
//! All lists of a policy (MRU, MFU and their ghosts) thread through the same
//! slab, so moving an entry between lists is a few index writes and never an
//! allocation. Indices instead of pointers keep this free of `unsafe`.

pub(crate) const NIL: u32 = u32::MAX;

#[derive(Debug)]
struct Node<T> {
    prev: u32,
    next: u32,
    val: T,
}

/// Storage for the nodes of every list; freed slots are reused.
#[derive(Debug, Default)]
pub(crate) struct Slab<T> {
    nodes: Vec<Node<T>>,
    free: Vec<u32>,
}

/// One list threaded through a [`Slab`]. `head` is the most recent end,
/// `tail` the end eviction takes from.
#[derive(Debug, Clone, Copy)]
pub(crate) struct List {
    head: u32,
    tail: u32,
    len: usize,
}

impl Default for List {
    fn default() -> Self {
        List { head: NIL, tail: NIL, len: 0 }
    }
}

impl List {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn tail(&self) -> Option<u32> {
        (self.tail != NIL).then_some(self.tail)
    }
}

impl<T> Slab<T> {
    pub(crate) fn new() -> Self {
        Slab { nodes: Vec::new(), free: Vec::new() }
    }

    /// Stores `val` detached from any list and returns its index.
    pub(crate) fn alloc(&mut self, val: T) -> u32 {
        let node = Node { prev: NIL, next: NIL, val };
        if let Some(idx) = self.free.pop() {
            self.nodes[idx as usize] = node;
            idx
        } else {
            let idx = u32::try_from(self.nodes.len()).expect("slab holds fewer than 2^32 entries");
            self.nodes.push(node);
            idx
        }
    }

    /// Returns the slot to the free list. The node must already be unlinked.
    pub(crate) fn release(&mut self, idx: u32) {
        debug_assert_eq!(self.nodes[idx as usize].prev, NIL);
        debug_assert_eq!(self.nodes[idx as usize].next, NIL);
        self.free.push(idx);
    }

    pub(crate) fn get(&self, idx: u32) -> &T {
        &self.nodes[idx as usize].val
    }

    pub(crate) fn get_mut(&mut self, idx: u32) -> &mut T {
        &mut self.nodes[idx as usize].val
    }

    pub(crate) fn push_head(&mut self, list: &mut List, idx: u32) {
        let old_head = list.head;
        {
            let n = &mut self.nodes[idx as usize];
            debug_assert!(n.prev == NIL && n.next == NIL, "node is already linked");
            n.prev = NIL;
            n.next = old_head;
        }
        if old_head != NIL {
            self.nodes[old_head as usize].prev = idx;
        } else {
            list.tail = idx;
        }
        list.head = idx;
        list.len += 1;
    }

    pub(crate) fn unlink(&mut self, list: &mut List, idx: u32) {
        let (prev, next) = {
            let n = &self.nodes[idx as usize];
            (n.prev, n.next)
        };
        if prev != NIL {
            self.nodes[prev as usize].next = next;
        } else {
            debug_assert_eq!(list.head, idx);
            list.head = next;
        }
        if next != NIL {
            self.nodes[next as usize].prev = prev;
        } else {
            debug_assert_eq!(list.tail, idx);
            list.tail = prev;
        }
        let n = &mut self.nodes[idx as usize];
        n.prev = NIL;
        n.next = NIL;
        list.len -= 1;
    }

    /// Makes `list` hold exactly `order`, its first entry at the tail: a
    /// list put in a new order in one pass of writes, with no walk. No node
    /// of `order` may be on another list, and every node `list` held must
    /// be in `order`.
    pub(crate) fn relink(&mut self, list: &mut List, order: &[u32]) {
        for (i, &idx) in order.iter().enumerate() {
            let n = &mut self.nodes[idx as usize];
            n.next = if i == 0 { NIL } else { order[i - 1] };
            n.prev = order.get(i + 1).copied().unwrap_or(NIL);
        }
        *list = List {
            head: order.last().copied().unwrap_or(NIL),
            tail: order.first().copied().unwrap_or(NIL),
            len: order.len(),
        };
    }

    /// The neighbour towards the head, for walking from the tail.
    pub(crate) fn prev_of(&self, idx: u32) -> Option<u32> {
        let p = self.nodes[idx as usize].prev;
        (p != NIL).then_some(p)
    }

    /// Walks `list` from its tail (the next to leave) towards the head, at
    /// most `max_size` units deep, as [`crate::Policy::scan_tail`] wants;
    /// `view` tells an entry's key, size and prefetch mark.
    pub(crate) fn walk_tail(
        &self,
        list: &List,
        max_size: u64,
        view: impl Fn(&T) -> (u64, u64, bool),
        f: &mut dyn FnMut(u64, u64, bool) -> bool,
    ) {
        self.walk_tail_where(
            list,
            max_size,
            |e| {
                let (key, size, prefetch) = view(e);
                (key, size, prefetch, true)
            },
            f,
        )
    }

    /// As [`Slab::walk_tail`], where `view` also says whether `f` is to see
    /// the entry; one it does not see still counts toward `max_size`.
    pub(crate) fn walk_tail_where(
        &self,
        list: &List,
        max_size: u64,
        view: impl Fn(&T) -> (u64, u64, bool, bool),
        f: &mut dyn FnMut(u64, u64, bool) -> bool,
    ) {
        let mut seen = 0;
        let mut cur = list.tail();
        while let Some(idx) = cur {
            let (key, size, prefetch, shown) = view(self.get(idx));
            if seen >= max_size || (shown && !f(key, size, prefetch)) {
                return;
            }
            seen += size;
            cur = self.prev_of(idx);
        }
    }

    /// Walks a list from head to tail; used by invariant checks only.
    pub(crate) fn iter<'a>(&'a self, list: &List) -> impl Iterator<Item = (u32, &'a T)> + 'a {
        let mut cur = list.head;
        std::iter::from_fn(move || {
            if cur == NIL {
                return None;
            }
            let idx = cur;
            let n = &self.nodes[idx as usize];
            cur = n.next;
            Some((idx, &n.val))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn push_unlink_keeps_order_and_length() {
        let mut slab = Slab::new();
        let mut l = List::default();
        let a = slab.alloc('a');
        let b = slab.alloc('b');
        let c = slab.alloc('c');
        slab.push_head(&mut l, a);
        slab.push_head(&mut l, b);
        slab.push_head(&mut l, c);
        let order: Vec<char> = slab.iter(&l).map(|(_, v)| *v).collect();
        assert_eq!(order, vec!['c', 'b', 'a']);
        assert_eq!(l.tail(), Some(a));
        slab.unlink(&mut l, b);
        let order: Vec<char> = slab.iter(&l).map(|(_, v)| *v).collect();
        assert_eq!(order, vec!['c', 'a']);
        assert_eq!(l.len(), 2);
        slab.release(b);
        let d = slab.alloc('d');
        assert_eq!(d, b, "freed slot is reused");
    }

    /// Both directions of a relinked list, from each end.
    fn both_ways(slab: &Slab<char>, l: &List) -> (Vec<char>, Vec<char>) {
        let forward = slab.iter(l).map(|(_, v)| *v).collect();
        let mut backward = Vec::new();
        let mut cur = l.tail();
        while let Some(i) = cur {
            backward.push(*slab.get(i));
            cur = slab.prev_of(i);
        }
        (forward, backward)
    }

    #[test]
    fn relink_files_a_new_order_both_ways() {
        let mut slab = Slab::new();
        let mut l = List::default();
        let [a, b, c] = ['a', 'b', 'c'].map(|v| slab.alloc(v));
        for i in [a, b, c] {
            slab.push_head(&mut l, i);
        }
        // a at the tail, then c, then b at the head.
        slab.relink(&mut l, &[a, c, b]);
        assert_eq!(both_ways(&slab, &l), (vec!['b', 'c', 'a'], vec!['a', 'c', 'b']));
        assert_eq!((l.len(), l.tail()), (3, Some(a)));
        // Still an ordinary list: an unlink and a push keep both ways right.
        slab.unlink(&mut l, c);
        slab.push_head(&mut l, c);
        assert_eq!(both_ways(&slab, &l), (vec!['c', 'b', 'a'], vec!['a', 'b', 'c']));
        slab.relink(&mut l, &[]);
        assert_eq!((l.len(), l.tail()), (0, None));
    }
}
