//! Dirty data: 4 KiB pages with a bit per 512-byte sector, grouped in
//! transaction groups. Pages are shared (`Arc`) with readers, the log
//! committer and the syncing thread, and copied on write.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use arc_policy::Key;
use arcache_l2::Ticket;
use rustc_hash::{FxHashMap, FxHashSet};

pub const PAGE: u64 = 4096;
pub const SECTOR: u64 = 512;

/// Export id in the top 16 bits, page number below, as record keys do.
pub type PageKey = u64;

pub fn page_key(vol: u16, page: u64) -> PageKey {
    (u64::from(vol) << 48) | page
}

pub fn key_vol(key: PageKey) -> u16 {
    (key >> 48) as u16
}

pub fn key_page(key: PageKey) -> u64 {
    key & ((1 << 48) - 1)
}

#[derive(Debug)]
pub struct Page {
    pub data: Box<[u8]>,
    pub mask: u8,
    /// Set once this exact version is in the intent log.
    pub logged: AtomicBool,
}

impl Clone for Page {
    fn clone(&self) -> Page {
        Page { data: self.data.clone(), mask: self.mask, logged: AtomicBool::new(false) }
    }
}

impl Page {
    pub fn empty() -> Page {
        Page { data: vec![0u8; PAGE as usize].into(), mask: 0, logged: AtomicBool::new(false) }
    }

    pub fn is_logged(&self) -> bool {
        self.logged.load(Relaxed)
    }

    /// Lays `newer`'s sectors over this page's.
    pub fn merge_from(&mut self, newer: &Page) {
        for s in sectors(newer.mask) {
            let r = sector_range(s);
            self.data[r.clone()].copy_from_slice(&newer.data[r]);
        }
        self.mask |= newer.mask;
        self.logged.store(false, Relaxed);
    }

    /// The valid sectors, packed in ascending order (the log's layout).
    pub fn packed(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.mask.count_ones() as usize * SECTOR as usize);
        for s in sectors(self.mask) {
            out.extend_from_slice(&self.data[sector_range(s)]);
        }
        out
    }

    /// Copies the valid sectors that overlap page-relative bytes
    /// `window` into `out`, which holds exactly those bytes.
    pub fn overlay(&self, window: Range<usize>, out: &mut [u8]) {
        for s in sectors(self.mask) {
            let r = sector_range(s);
            let from = r.start.max(window.start);
            let to = r.end.min(window.end);
            if from < to {
                out[from - window.start..to - window.start].copy_from_slice(&self.data[from..to]);
            }
        }
    }
}

pub fn sectors(mask: u8) -> impl Iterator<Item = usize> {
    (0..8).filter(move |s| mask & (1 << s) != 0)
}

pub fn sector_range(s: usize) -> Range<usize> {
    s * SECTOR as usize..(s + 1) * SECTOR as usize
}

/// One transaction group.
pub struct Txg {
    pub number: u64,
    /// When the first write joined it: its age starts the timeout.
    pub born: Option<Instant>,
    pub pages: FxHashMap<PageKey, Arc<Page>>,
    /// Records written in this txg: their L2 copies were dropped and the
    /// feed leaves them alone until it has synced.
    pub records: FxHashSet<Key>,
    /// L2 INVALIDATE positions to make durable before the backing writes.
    pub tickets: Vec<Ticket>,
}

impl Txg {
    pub fn new(number: u64) -> Txg {
        Txg {
            number,
            born: None,
            pages: FxHashMap::default(),
            records: FxHashSet::default(),
            tickets: Vec::new(),
        }
    }

    pub fn bytes(&self) -> u64 {
        self.pages.len() as u64 * PAGE
    }

    pub fn is_empty(&self) -> bool {
        self.pages.is_empty() && self.records.is_empty()
    }
}

/// A contiguous run of dirty bytes for one backing write.
pub struct Extent {
    pub vol: u16,
    pub offset: u64,
    pub data: Vec<u8>,
}

/// Largest single backing write a txg issues.
const MAX_EXTENT: usize = 8 << 20;

/// Sorts the pages of a txg and coalesces adjacent valid sectors into
/// large writes, clipped to each export's size.
pub fn extents(pages: &FxHashMap<PageKey, Arc<Page>>, size_of: impl Fn(u16) -> u64) -> Vec<Extent> {
    let mut keys: Vec<PageKey> = pages.keys().copied().collect();
    keys.sort_unstable();
    let mut out: Vec<Extent> = Vec::new();
    for key in keys {
        let page = &pages[&key];
        let (vol, base) = (key_vol(key), key_page(key) * PAGE);
        let size = size_of(vol);
        for s in sectors(page.mask) {
            let r = sector_range(s);
            let start = base + r.start as u64;
            if start >= size {
                break;
            }
            let end = (base + r.end as u64).min(size);
            let bytes = &page.data[r.start..r.start + (end - start) as usize];
            match out.last_mut() {
                Some(e)
                    if e.vol == vol
                        && e.offset + e.data.len() as u64 == start
                        && e.data.len() < MAX_EXTENT =>
                {
                    e.data.extend_from_slice(bytes)
                }
                _ => out.push(Extent { vol, offset: start, data: bytes.to_vec() }),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(mask: u8, v: u8) -> Arc<Page> {
        Arc::new(Page { data: vec![v; 4096].into(), mask, logged: AtomicBool::new(false) })
    }

    #[test]
    fn extents_coalesce_and_clip() {
        let mut pages = FxHashMap::default();
        pages.insert(page_key(0, 1), page(0xff, 1));
        pages.insert(page_key(0, 2), page(0x01, 2));
        pages.insert(page_key(0, 0), page(0x80, 3));
        pages.insert(page_key(1, 0), page(0x03, 4));
        let ex = extents(&pages, |v| if v == 0 { 1 << 20 } else { 700 });
        let shape: Vec<(u16, u64, usize)> = ex.iter().map(|e| (e.vol, e.offset, e.data.len())).collect();
        assert_eq!(shape, vec![(0, 3584, 512 + 4096 + 512), (1, 0, 700)]);
        assert_eq!(ex[0].data[0], 3);
        assert_eq!(ex[0].data[512], 1);
        assert_eq!(ex[0].data[4608], 2);
    }

    #[test]
    fn merge_and_overlay() {
        let mut a = Page::clone(&page(0x0f, 1));
        a.merge_from(&page(0x18, 2));
        assert_eq!(a.mask, 0x1f);
        assert_eq!(a.data[3 * 512], 2);
        assert_eq!(a.data[0], 1);
        let mut out = vec![0u8; 1000];
        a.overlay(4000..5000, &mut out[..96]);
        assert!(out[..96].iter().all(|&b| b == 0), "sector 7 is not valid");
        let mut out = vec![9u8; 600];
        a.overlay(2400..3000, &mut out);
        assert_eq!((out[0], out[599]), (2, 9), "sector 4 ends at 2560; 5 is not valid");
        assert_eq!(a.packed().len(), 5 * 512);
    }
}
