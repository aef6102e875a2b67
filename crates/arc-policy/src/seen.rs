//! Which records were read recently without being cached.
//!
//! A small read of a record that lives only on L2 can be served from half of
//! its L2 copy without bringing the record into RAM; bringing it in costs a
//! whole-record read and evicts something else, which only pays if the
//! record is read again while it is still cached. The ARC's own rule for
//! "read again soon" is its ghost lists, which remember about `c` bytes of
//! evicted records. This filter is the same rule for records that never were
//! in RAM: it remembers the last `window` bytes of such reads, and a record
//! read a second time within that window is worth caching.

use std::collections::VecDeque;

use rustc_hash::FxHashMap;

use crate::Key;

#[derive(Debug, Default)]
pub struct SeenFilter {
    /// Sightings, oldest first: key, sighting number, bytes.
    order: VecDeque<(Key, u64, u64)>,
    /// The latest sighting of each key still inside the window.
    latest: FxHashMap<Key, u64>,
    bytes: u64,
    next: u64,
}

impl SeenFilter {
    pub fn new() -> Self {
        Self::default()
    }

    /// True if `key` was sighted within the last `window` bytes of
    /// sightings (and forgets it: the caller caches it now); otherwise
    /// notes this sighting of `size` bytes and returns false.
    pub fn second_sighting(&mut self, key: Key, size: u64, window: u64) -> bool {
        if self.latest.remove(&key).is_some() {
            self.trim(window);
            return true;
        }
        self.next += 1;
        self.latest.insert(key, self.next);
        self.order.push_back((key, self.next, size));
        self.bytes += size;
        self.trim(window);
        false
    }

    /// Keys remembered now.
    pub fn len(&self) -> usize {
        self.latest.len()
    }

    pub fn is_empty(&self) -> bool {
        self.latest.is_empty()
    }

    fn trim(&mut self, window: u64) {
        while self.bytes > window {
            let Some((key, n, size)) = self.order.pop_front() else { break };
            self.bytes -= size;
            // A later sighting of the same key keeps it.
            if self.latest.get(&key) == Some(&n) {
                self.latest.remove(&key);
            }
        }
        // Sightings already taken by a second one leave stale entries; they
        // still count against the window until they age out, so the queue
        // stays bounded by it.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_sighting_within_the_window_admits() {
        let mut f = SeenFilter::new();
        assert!(!f.second_sighting(1, 16, 64));
        assert!(f.second_sighting(1, 16, 64));
        // Admitted once: the next read is a first sighting again.
        assert!(!f.second_sighting(1, 16, 64));
    }

    #[test]
    fn sightings_older_than_the_window_are_forgotten() {
        let mut f = SeenFilter::new();
        assert!(!f.second_sighting(1, 16, 64));
        for k in 2..=4 {
            assert!(!f.second_sighting(k, 16, 64));
        }
        // 1, 2, 3, 4 fill 64 bytes; 5 pushes 1 out.
        assert!(!f.second_sighting(5, 16, 64));
        assert!(!f.second_sighting(1, 16, 64));
        assert!(f.second_sighting(5, 16, 64));
    }

    #[test]
    fn a_repeated_sighting_renews_the_key() {
        let mut f = SeenFilter::new();
        assert!(!f.second_sighting(1, 16, 32));
        assert!(f.second_sighting(1, 16, 32));
        assert!(!f.second_sighting(1, 16, 32));
        // The stale first sighting ages out without taking the new one.
        assert!(!f.second_sighting(2, 16, 32));
        assert!(f.second_sighting(1, 16, 32));
    }

    #[test]
    fn memory_stays_bounded_by_the_window() {
        let mut f = SeenFilter::new();
        for i in 0..10_000u64 {
            f.second_sighting(i % 300, 16, 1600);
        }
        assert!(f.order.len() <= 100 && f.len() <= 100, "{} {}", f.order.len(), f.len());
    }
}
