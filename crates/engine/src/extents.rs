//! Allocation maps for NBD's `base:allocation`: a backing store's extents
//! with dirty pages laid over them.

use std::collections::BTreeMap;
use std::ops::Range;

use arcache_sync::atomic::{
    AtomicBool,
    Ordering::{Acquire, Release},
};
use blockdev::Alloc;

/// Byte ranges of an export known to read as zeroes because a zeroing
/// reached the backing store and nothing has been written there since:
/// what lets block status say "zero" for a store that cannot tell itself
/// (a block device). Kept in RAM only; after a restart nothing is known.
/// Updated under the records' write guard, before a write is answered.
#[derive(Debug, Default)]
pub struct ZeroMap {
    /// Disjoint, non-adjacent ranges: start -> end.
    ranges: BTreeMap<u64, u64>,
}

/// A volume's [`ZeroMap`] behind its lock, with a flag that lets writes
/// skip the lock while nothing is known zero (the common case: every write
/// would otherwise take one lock per volume). Set after a zeroing is
/// recorded, read after the write guard is held, so a write to a range a
/// zeroing just recorded always sees it.
#[derive(Default)]
pub struct KnownZeroes {
    any: AtomicBool,
    map: arcache_sync::Mutex<ZeroMap>,
}

impl KnownZeroes {
    pub fn zeroed(&self, r: Range<u64>) {
        let mut m = self.map.lock();
        m.zeroed(r);
        self.any.store(!m.ranges.is_empty(), Release);
    }

    pub fn changed(&self, r: Range<u64>) {
        if self.any.load(Acquire) {
            self.map.lock().changed(r);
        }
    }

    pub fn overlay(&self, start: u64, extents: &[(u64, Alloc)]) -> Vec<(u64, Alloc)> {
        if !self.any.load(Acquire) {
            return extents.to_vec();
        }
        self.map.lock().overlay(start, extents)
    }
}

/// At most this many ranges are remembered; past it the map forgets all
/// (knowing nothing is always safe).
const MAX_ZERO_RANGES: usize = 65_536;

impl ZeroMap {
    pub fn zeroed(&mut self, r: Range<u64>) {
        if r.is_empty() {
            return;
        }
        let (mut start, mut end) = (r.start, r.end);
        // Merge with every range that overlaps or touches it.
        let touching: Vec<(u64, u64)> =
            self.ranges.range(..=end).filter(|&(_, &e)| e >= start).map(|(&s, &e)| (s, e)).collect();
        for (s, e) in touching {
            self.ranges.remove(&s);
            start = start.min(s);
            end = end.max(e);
        }
        self.ranges.insert(start, end);
        if self.ranges.len() > MAX_ZERO_RANGES {
            self.ranges.clear();
        }
    }

    /// Bytes `r` were written (or trimmed: undefined): no longer known zero.
    pub fn changed(&mut self, r: Range<u64>) {
        if r.is_empty() || self.ranges.is_empty() {
            return;
        }
        let hit: Vec<(u64, u64)> =
            self.ranges.range(..r.end).filter(|&(_, &e)| e > r.start).map(|(&s, &e)| (s, e)).collect();
        for (s, e) in hit {
            self.ranges.remove(&s);
            if s < r.start {
                self.ranges.insert(s, r.start);
            }
            if e > r.end {
                self.ranges.insert(r.end, e);
            }
        }
    }

    /// `extents` (from `start`) with the known-zero parts of data extents
    /// marked [`Alloc::Zero`].
    pub fn overlay(&self, start: u64, extents: &[(u64, Alloc)]) -> Vec<(u64, Alloc)> {
        let end = start + extents.iter().map(|e| e.0).sum::<u64>();
        let known: Vec<(u64, u64)> =
            self.ranges.range(..end).filter(|&(_, &e)| e > start).map(|(&s, &e)| (s, e)).collect();
        paint(start, extents, &known, |k| k == Alloc::Data, Alloc::Zero)
    }
}

/// `extents` (lengths from `start`, as a store reported them) with every
/// page in `dirty_pages` (page numbers of `page_size` bytes, any order)
/// turned into data, neighbours of the same kind merged.
pub fn overlay_dirty(
    start: u64,
    extents: &[(u64, Alloc)],
    dirty_pages: &[u64],
    page_size: u64,
) -> Vec<(u64, Alloc)> {
    let mut dirty: Vec<(u64, u64)> =
        dirty_pages.iter().map(|p| (p * page_size, (p + 1) * page_size)).collect();
    dirty.sort_unstable();
    paint(start, extents, &dirty, |k| k != Alloc::Data, Alloc::Data)
}

/// `extents` from `start` with the parts of the extents `applies` accepts
/// that `ranges` (sorted by start) cover turned into `mark`; neighbours of
/// one kind merged, no empty extent.
fn paint(
    start: u64,
    extents: &[(u64, Alloc)],
    ranges: &[(u64, u64)],
    applies: impl Fn(Alloc) -> bool,
    mark: Alloc,
) -> Vec<(u64, Alloc)> {
    let mut out: Vec<(u64, Alloc)> = Vec::with_capacity(extents.len());
    let mut push = |len: u64, kind: Alloc| {
        if len == 0 {
            return;
        }
        match out.last_mut() {
            Some((l, k)) if *k == kind => *l += len,
            _ => out.push((len, kind)),
        }
    };
    let mut at = start;
    for &(len, kind) in extents {
        let end = at + len;
        if !applies(kind) {
            push(len, kind);
            at = end;
            continue;
        }
        let mut pos = at;
        for &(r0, r1) in ranges.iter().filter(|&&(r0, r1)| r1 > at && r0 < end) {
            let (r0, r1) = (r0.max(pos), r1.min(end));
            if r0 > pos {
                push(r0 - pos, kind);
            }
            if r1 > r0 {
                push(r1 - r0, mark);
                pos = r1;
            }
        }
        push(end - pos, kind);
        at = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use Alloc::{Data, Hole};

    #[test]
    fn dirty_pages_turn_holes_into_data() {
        // 0..8K data, 8K..64K hole; pages 3 and 4 (12K..20K) and 15 dirty.
        let got = overlay_dirty(0, &[(8192, Data), (57344, Hole)], &[4, 3, 15], 4096);
        assert_eq!(got, vec![(8192, Data), (4096, Hole), (8192, Data), (40960, Hole), (4096, Data)]);
    }

    #[test]
    fn a_range_that_starts_inside_a_page() {
        // From 6K: a 10K hole, page 1 (4K..8K) dirty covers its first 2K.
        let got = overlay_dirty(6144, &[(10240, Hole)], &[1], 4096);
        assert_eq!(got, vec![(2048, Data), (8192, Hole)]);
        let total: u64 = got.iter().map(|e| e.0).sum();
        assert_eq!(total, 10240);
    }

    #[test]
    fn allocated_zeroes_keep_their_kind_around_dirty_pages() {
        let got = overlay_dirty(0, &[(16384, Alloc::Zero)], &[1], 4096);
        assert_eq!(got, vec![(4096, Alloc::Zero), (4096, Data), (8192, Alloc::Zero)]);
    }

    #[test]
    fn known_zeroes_are_forgotten_where_written_and_marked_in_data() {
        let mut z = ZeroMap::default();
        z.zeroed(4096..16384);
        z.zeroed(16384..20480); // touching: merged
        z.changed(8192..12288); // a write in the middle splits it
        let got = z.overlay(0, &[(32768, Data)]);
        assert_eq!(
            got,
            vec![(4096, Data), (4096, Alloc::Zero), (4096, Data), (8192, Alloc::Zero), (12288, Data)]
        );
        // Holes stay holes; only data extents can be known zero.
        assert_eq!(z.overlay(0, &[(32768, Hole)]), vec![(32768, Hole)]);
        z.changed(0..1 << 20);
        assert_eq!(z.overlay(0, &[(32768, Data)]), vec![(32768, Data)]);
    }

    #[test]
    fn nothing_dirty_keeps_the_map_and_merges_neighbours() {
        assert_eq!(
            overlay_dirty(0, &[(4096, Hole), (4096, Hole), (1, Data)], &[], 4096),
            vec![(8192, Hole), (1, Data)]
        );
        assert_eq!(overlay_dirty(0, &[(4096, Hole)], &[0], 4096), vec![(4096, Data)]);
    }
}
