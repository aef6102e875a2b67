//! Dirty data: 4 KiB pages with a bit per 512-byte sector, grouped in
//! transaction groups. Pages are shared (`Arc`) with readers, the log
//! committer and the syncing thread, and copied on write.

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use arc_policy::Key;
use arcache_l2::Ticket;
use arcache_sync::atomic::{AtomicBool, Ordering::Relaxed};
use rustc_hash::{FxHashMap, FxHashSet};

pub const PAGE: u64 = 4096;
pub const SECTOR: u64 = 512;

/// Export id in the top 16 bits, page number below, as record keys do.
pub type PageKey = u64;

pub fn page_key(vol: u16, page: u64) -> PageKey {
    arc_policy::key::make(vol, page)
}

pub fn key_vol(key: PageKey) -> u16 {
    arc_policy::key::export(key)
}

pub fn key_page(key: PageKey) -> u64 {
    arc_policy::key::record(key)
}

#[derive(Debug)]
pub struct Page {
    pub data: Box<[u8]>,
    pub mask: u8,
    /// Set once this exact version is in the intent log. Set by the log
    /// committer and read by the next commit and by the txg syncer, none
    /// holding a lock the others take: arcache-sync's, so shuttle sees it.
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
    pages: FxHashMap<PageKey, Arc<Page>>,
    /// Maximal runs of consecutive pages in `pages`: what the sync will
    /// write as separate extents (before clipping and the size cap).
    runs: u64,
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
            runs: 0,
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

    pub fn pages(&self) -> &FxHashMap<PageKey, Arc<Page>> {
        &self.pages
    }

    pub fn page_mut(&mut self, key: PageKey) -> Option<&mut Arc<Page>> {
        self.pages.get_mut(&key)
    }

    /// Adds or replaces the page at `key`.
    pub fn insert_page(&mut self, key: PageKey, page: Arc<Page>) {
        if self.pages.insert(key, page).is_none() {
            // A new page starts a run, extends one, or joins two.
            let (before, after) = self.neighbours(key);
            match (before, after) {
                (false, false) => self.runs += 1,
                (true, true) => self.runs -= 1,
                _ => {}
            }
        }
    }

    pub fn remove_page(&mut self, key: PageKey) -> Option<Arc<Page>> {
        let removed = self.pages.remove(&key)?;
        match self.neighbours(key) {
            (false, false) => self.runs -= 1,
            (true, true) => self.runs += 1,
            _ => {}
        }
        Some(removed)
    }

    fn neighbours(&self, key: PageKey) -> (bool, bool) {
        let has = |k: Option<PageKey>| k.is_some_and(|k| self.pages.contains_key(&k));
        (has(key.checked_sub(1)), has(key.checked_add(1)))
    }

    /// Pages per run on average: about 1 for scattered small writes, the
    /// write size in pages (or more) for a stream.
    pub fn pages_per_run(&self) -> f64 {
        if self.runs == 0 {
            return 0.0;
        }
        self.pages.len() as f64 / self.runs as f64
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

    proptest::proptest! {
        /// The run count kept through inserts and removals equals a count
        /// of the page set from scratch (a run starts where the previous
        /// page is absent).
        #[test]
        fn runs_follow_inserts_and_removals(ops in proptest::collection::vec((proptest::bool::ANY, 0u64..40), 1..200)) {
            let mut txg = Txg::new(1);
            for (insert, n) in ops {
                let key = page_key((n / 20) as u16, n % 20);
                if insert {
                    txg.insert_page(key, page(0xff, 1));
                } else {
                    txg.remove_page(key);
                }
                let keys = txg.pages();
                let fresh = keys.keys().filter(|&&k| k == 0 || !keys.contains_key(&(k - 1))).count() as u64;
                proptest::prop_assert_eq!(txg.runs, fresh);
            }
        }
    }

    #[test]
    fn a_stream_has_long_runs_and_scattered_pages_short_ones() {
        let mut stream = Txg::new(1);
        for p in 0..256 {
            stream.insert_page(page_key(0, p), page(0xff, 1));
        }
        assert_eq!(stream.pages_per_run(), 256.0);
        let mut scattered = Txg::new(1);
        for p in (0..256).map(|p| p * 3) {
            scattered.insert_page(page_key(0, p), page(0xff, 1));
        }
        assert_eq!(scattered.pages_per_run(), 1.0);
        assert_eq!(Txg::new(1).pages_per_run(), 0.0);
    }
}
