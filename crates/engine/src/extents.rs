//! Allocation maps for NBD's `base:allocation`: a backing store's extents
//! with dirty pages laid over them.

use blockdev::Alloc;

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
        if kind == Alloc::Data {
            push(len, kind);
            at = end;
            continue;
        }
        // Zeroes (a hole or not): cut out the dirty ranges over them.
        let mut pos = at;
        for &(d0, d1) in dirty.iter().filter(|&&(d0, d1)| d1 > at && d0 < end) {
            let (d0, d1) = (d0.max(pos), d1.min(end));
            if d0 > pos {
                push(d0 - pos, kind);
            }
            if d1 > d0 {
                push(d1 - d0, Alloc::Data);
                pos = d1;
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
    fn nothing_dirty_keeps_the_map_and_merges_neighbours() {
        assert_eq!(
            overlay_dirty(0, &[(4096, Hole), (4096, Hole), (1, Data)], &[], 4096),
            vec![(8192, Hole), (1, Data)]
        );
        assert_eq!(overlay_dirty(0, &[(4096, Hole)], &[0], 4096), vec![(4096, Data)]);
    }
}
