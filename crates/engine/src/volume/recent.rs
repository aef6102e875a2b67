//! The last requests a volume was asked for, noted as they arrive: what
//! tells a stream's miss from a random one on a store that is costly per
//! request, when the stream's reads are many at once. zfetch hears of a
//! read when a worker takes it up, and with dozens in flight the workers
//! run in any order, so it takes a while to see the stream at all; that a
//! request began right where an earlier one ended, which began where
//! another ended, is known as they arrive on the connection's thread
//! (`Volume::note_arrival`), in the order the client sent them.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};

/// Requests remembered: more than a client keeps in flight on one stream
/// (nbdcopy: 64), few enough to look through on each miss.
const SLOTS: usize = 128;

/// Requests in a row that make a stream.
const CHAIN: usize = 3;

pub(super) struct Recent {
    /// `first` and `end` record of a request, 32 bits each (wrapped on
    /// volumes of more records: a false match only widens one read).
    slots: [AtomicU64; SLOTS],
    next: AtomicUsize,
}

fn pack(first: u64, end: u64) -> u64 {
    ((first as u32 as u64) << 32) | end as u32 as u64
}

impl Recent {
    pub(super) fn new() -> Recent {
        Recent { slots: std::array::from_fn(|_| AtomicU64::new(u64::MAX)), next: AtomicUsize::new(0) }
    }

    /// Notes a request for records `first..end`, unless it is noted
    /// already (a request is noted when it arrives and again when a worker
    /// runs it).
    pub(super) fn note(&self, first: u64, end: u64) {
        let v = pack(first, end);
        if self.slots.iter().any(|s| s.load(Relaxed) == v) {
            return;
        }
        let i = self.next.fetch_add(1, Relaxed) % SLOTS;
        self.slots[i].store(v, Relaxed);
    }

    /// The start of a remembered request that ended at `end`.
    fn start_of_one_ending_at(&self, end: u64) -> Option<u64> {
        self.slots
            .iter()
            .map(|s| s.load(Relaxed))
            .find(|&v| v != u64::MAX && v as u32 == end as u32)
            .map(|v| v >> 32)
    }

    /// Whether a request at `first` continues a chain of [`CHAIN`]: one
    /// request ended at `first`, another where that one began, and so on.
    /// Random requests seldom land so (on a volume of R records, about
    /// (SLOTS/R)^CHAIN of them); a stream's always do.
    pub(super) fn continues_chain(&self, first: u64) -> bool {
        let mut at = first;
        for _ in 0..CHAIN {
            match self.start_of_one_ending_at(at) {
                Some(start) if start as u32 != at as u32 => at = start,
                _ => return false,
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chain_of_three_requests_is_seen_in_any_order() {
        let r = Recent::new();
        r.note(32, 48);
        r.note(0, 16);
        assert!(!r.continues_chain(48), "two requests with a gap are no chain");
        r.note(16, 32);
        assert!(r.continues_chain(48));
        assert!(!r.continues_chain(32), "two requests are not enough");
        assert!(!r.continues_chain(64), "nothing ended at 64");
    }

    #[test]
    fn old_requests_are_forgotten() {
        let r = Recent::new();
        r.note(0, 16);
        r.note(16, 32);
        r.note(32, 48);
        for i in 0..SLOTS as u64 {
            r.note(1000 + 2 * i, 1001 + 2 * i);
        }
        assert!(!r.continues_chain(48));
    }

    /// A request is noted when it arrives and again when its worker runs
    /// it; the second note must not push an older request out.
    #[test]
    fn a_request_noted_twice_takes_one_slot() {
        let r = Recent::new();
        for (first, end) in [(0, 16), (16, 32), (32, 48)] {
            r.note(first, end);
            r.note(first, end);
        }
        for i in 0..SLOTS as u64 - 3 {
            r.note(1000 + 2 * i, 1001 + 2 * i);
        }
        assert!(r.continues_chain(48));
    }
}
