//! The dirty set: pages written and acknowledged but not yet on the
//! backing stores, in the open txg and the one syncing, with what the log
//! has not taken yet. The other parts of the write path reach this state
//! only through the methods here.

use std::ops::Range;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_policy::Key;
use arcache_l2::L2Arc;
use arcache_sync::atomic::{AtomicU64, Ordering::Relaxed};
use arcache_sync::{Condvar, Mutex};
use rustc_hash::FxHashSet;
use zil::Entry;

use super::stats::{WriteStats, WriteTunables, WriteView};
use crate::dirty::{self, key_page, key_vol, page_key, Page, PageKey, Txg, PAGE};

/// Write-behind takes a txg early only when its pages form runs at least
/// this long on average (16 KiB): a stream, not scattered small writes.
const WRITE_BEHIND_PAGES_PER_RUN: f64 = 4.0;

struct Inner {
    open: Txg,
    syncing: Option<Arc<Txg>>,
    /// Last txg written and flushed.
    synced: u64,
    /// Last txg the syncing thread finished, successfully or not.
    done: u64,
    /// Sync every txg up to this one now.
    want: u64,
    /// Pages written since their last commit, as (txg, key); may repeat.
    unlogged: Vec<(u64, PageKey)>,
    /// Trims and zeroings applied since the last commit, for the log, with
    /// the txg open when they ran: once it has synced they are durable on
    /// the backing store and must not be logged (a replay would apply them
    /// over newer data).
    discards: Vec<(u64, Entry)>,
    /// After a failed sync, no retry before this.
    retry_at: Option<Instant>,
    stop: bool,
}

impl Inner {
    fn dirty(&self) -> u64 {
        self.open.bytes() + self.syncing.as_ref().map_or(0, |t| t.bytes())
    }

    /// Marks `records` as written in the open txg; their L2 copies are
    /// dropped now and durably before this txg reaches the backing store.
    fn note_records(&mut self, l2: Option<&Arc<L2Arc>>, records: &[Key]) {
        let fresh: Vec<Key> = records.iter().copied().filter(|&k| self.open.records.insert(k)).collect();
        if let (Some(l2), false) = (l2, fresh.is_empty()) {
            let t = l2.begin_write_deferred(&fresh);
            self.open.tickets.extend(t);
        }
    }
}

/// A change applied straight to a backing store, bypassing dirty RAM.
#[derive(Clone, Copy)]
pub(crate) enum Change<'a> {
    Trim,
    Zero,
    /// Write-through of these bytes (`sync=always` without a log).
    Overwrite(&'a [u8]),
}

impl Change<'_> {
    /// What the intent log records of it: a write-through needs nothing,
    /// being durable before it is acknowledged.
    fn log_entry(&self, export: u16, r: &Range<u64>) -> Option<Entry> {
        let (offset, len) = (r.start, r.end - r.start);
        match self {
            Change::Trim => Some(Entry::Trim { export, offset, len }),
            Change::Zero => Some(Entry::Zero { export, offset, len }),
            Change::Overwrite(_) => None,
        }
    }
}

/// What a commit takes from the dirty set: the discards and unlogged pages
/// (newest versions) to log, the open txg, and what was taken from the
/// queues (to give back if the commit fails).
pub(super) struct Unlogged {
    pub entries: Vec<Entry>,
    pub pages: Vec<(PageKey, Arc<Page>)>,
    pub txg: u64,
    pub taken: Vec<(u64, PageKey)>,
}

pub(super) struct DirtySet {
    inner: Mutex<Inner>,
    /// Wakes the syncing thread, and whoever waits for a sync.
    cv: Condvar,
    /// Page count, readable without the lock: reads skip overlays when 0.
    dirty_pages: AtomicU64,
    l2: Option<Arc<L2Arc>>,
    tunables: Arc<WriteTunables>,
    stats: Arc<WriteStats>,
}

impl DirtySet {
    pub(super) fn new(l2: Option<Arc<L2Arc>>, tunables: Arc<WriteTunables>, stats: Arc<WriteStats>) -> Self {
        DirtySet {
            inner: Mutex::new(Inner {
                open: Txg::new(1),
                syncing: None,
                synced: 0,
                done: 0,
                want: 0,
                unlogged: Vec::new(),
                discards: Vec::new(),
                retry_at: None,
                stop: false,
            }),
            cv: Condvar::new(),
            dirty_pages: AtomicU64::new(0),
            l2,
            tunables,
            stats,
        }
    }

    pub(super) fn has_dirty(&self) -> bool {
        self.dirty_pages.load(Relaxed) > 0
    }

    /// Dirty bytes in the open and syncing txgs.
    pub(super) fn bytes(&self) -> u64 {
        self.inner.lock().dirty()
    }

    fn recount(&self, g: &Inner) {
        let n = g.open.pages().len() + g.syncing.as_ref().map_or(0, |t| t.pages().len());
        self.dirty_pages.store(n as u64, Relaxed);
    }

    /// Open-txg size at which an idle backing store takes a txg
    /// (write-behind), so a long stream of writes overlaps with its syncing.
    fn write_behind_bytes(&self) -> u64 {
        (self.tunables.dirty_data_max.load(Relaxed) / 64).max(16 << 20)
    }

    /// Whether an idle backing store should take the open txg before the
    /// timeout or the sync threshold. A stream is written behind at once:
    /// the backing store's bandwidth is what bounds it, and waiting only
    /// lengthens the final flush. Scattered small writes are not: each
    /// costs the backing store a request however early it is sent, and
    /// left in RAM they are overwritten and grow into longer runs, so a
    /// later, larger txg sends fewer requests (docs/intent-log.md).
    fn write_behind_due(&self, g: &Inner) -> bool {
        g.syncing.is_none()
            && g.open.bytes() >= self.write_behind_bytes()
            && g.open.pages_per_run() >= WRITE_BEHIND_PAGES_PER_RUN
    }

    /// Adds written pages of export `vol` to the open txg. `records` are
    /// the record keys the write touches; their L2 copies are dropped now
    /// and durably before this txg reaches the backing store.
    pub(super) fn put(&self, vol: u16, records: &[Key], pages: Vec<(u64, Page)>) {
        let mut g = self.inner.lock();
        let g = &mut *g;
        g.note_records(self.l2.as_ref(), records);
        let number = g.open.number;
        for (page, new) in pages {
            let key = page_key(vol, page);
            self.stats.written_bytes.fetch_add(u64::from(new.mask.count_ones()) * dirty::SECTOR, Relaxed);
            match g.open.page_mut(key) {
                Some(old) if new.mask & old.mask == old.mask => *old = Arc::new(new),
                Some(old) => Arc::make_mut(old).merge_from(&new),
                None => g.open.insert_page(key, Arc::new(new)),
            }
            g.unlogged.push((number, key));
        }
        if g.open.born.is_none() {
            g.open.born = Some(Instant::now());
        }
        let t = &self.tunables;
        let threshold =
            t.dirty_data_max.load(Relaxed) * t.dirty_data_sync_percent.load(Relaxed).clamp(1, 100) / 100;
        if g.open.bytes() >= threshold {
            g.want = g.want.max(g.open.number);
        }
        if g.open.bytes() >= threshold || self.write_behind_due(g) {
            self.cv.notify_all();
        }
        self.recount(g);
    }

    /// The newest dirty bytes of one 512-byte sector, if any is dirty.
    pub(super) fn sector(&self, vol: u16, offset: u64) -> Option<[u8; 512]> {
        let key = page_key(vol, offset / PAGE);
        let s = ((offset % PAGE) / dirty::SECTOR) as usize;
        let g = self.inner.lock();
        let from_open = g.open.pages().get(&key).filter(|p| p.mask & (1 << s) != 0);
        let page =
            from_open.or_else(|| g.syncing.as_ref()?.pages().get(&key).filter(|p| p.mask & (1 << s) != 0))?;
        let mut out = [0u8; 512];
        out.copy_from_slice(&page.data[dirty::sector_range(s)]);
        Some(out)
    }

    /// The dirty pages over bytes `range` of export `vol`, oldest first.
    pub(super) fn snapshot(&self, vol: u16, range: Range<u64>) -> Vec<(u64, Arc<Page>)> {
        if !self.has_dirty() || range.is_empty() {
            return Vec::new();
        }
        let first = range.start / PAGE;
        let last = (range.end - 1) / PAGE;
        let g = self.inner.lock();
        let mut out = Vec::new();
        for map in g.syncing.iter().map(|t| t.pages()).chain(std::iter::once(g.open.pages())) {
            if map.is_empty() {
                continue;
            }
            if (last - first + 1) as usize > map.len() {
                out.extend(map.iter().filter_map(|(&k, p)| {
                    let page = key_page(k);
                    (key_vol(k) == vol && (first..=last).contains(&page)).then(|| (page, Arc::clone(p)))
                }));
            } else {
                out.extend((first..=last).filter_map(|p| Some((p, Arc::clone(map.get(&page_key(vol, p))?)))));
            }
        }
        out
    }

    /// Drops (or, for `Change::Zero` and `Change::Overwrite`, rewrites) the
    /// dirty bytes of `range` of export `vol` that a change applied straight
    /// to its backing store covers, and queues the change for the log when
    /// `logged`.
    pub(super) fn apply_change(
        &self,
        vol: u16,
        records: &[Key],
        range: Range<u64>,
        change: Change<'_>,
        logged: bool,
    ) {
        let mut g = self.inner.lock();
        let g = &mut *g;
        let number = g.open.number;
        // The change is not durable before the next txg flushes the
        // backing store: until then no L2 copy may be made of it.
        g.note_records(self.l2.as_ref(), records);
        if g.open.born.is_none() {
            g.open.born = Some(Instant::now());
        }
        for page in range.start / PAGE..range.end.div_ceil(PAGE) {
            let key = page_key(vol, page);
            let Some(p) = g.open.page_mut(key) else { continue };
            let p = Arc::make_mut(p);
            change_page(p, page * PAGE, &range, change);
            p.logged.store(false, Relaxed);
            if p.mask == 0 {
                g.open.remove_page(key);
            } else {
                g.unlogged.push((number, key));
            }
        }
        if let (Some(entry), true) = (change.log_entry(vol, &range), logged) {
            g.discards.push((number, entry));
        }
        self.recount(g);
    }

    /// True when pages were written since their last commit.
    pub(super) fn has_unlogged(&self) -> bool {
        !self.inner.lock().unlogged.is_empty()
    }

    /// Takes what a commit must make durable (see [`Unlogged`]).
    pub(super) fn take_unlogged(&self) -> Unlogged {
        let mut g = self.inner.lock();
        let taken = std::mem::take(&mut g.unlogged);
        let (open, syncing) = (g.open.number, g.syncing.as_ref().map_or(0, |t| t.number));
        let entries: Vec<Entry> = std::mem::take(&mut g.discards)
            .into_iter()
            .filter(|(t, _)| *t == open || *t == syncing)
            .map(|(_, e)| e)
            .collect();
        // A page may be dirty in the syncing txg and again in the open one:
        // both versions are logged, the older first, as neither is on the
        // backing store yet (the newer holds only the sectors written since).
        let mut pages = Vec::new();
        let mut seen: FxHashSet<(u64, PageKey)> = FxHashSet::default();
        for &(txg, key) in &taken {
            let map = if txg == g.open.number {
                g.open.pages()
            } else {
                match &g.syncing {
                    Some(t) if t.number == txg => t.pages(),
                    _ => continue,
                }
            };
            let Some(p) = map.get(&key) else { continue };
            if p.is_logged() || !seen.insert((txg, key)) {
                continue;
            }
            pages.push((txg, key, Arc::clone(p)));
        }
        pages.sort_by_key(|&(txg, _, _)| txg);
        let pages = pages.into_iter().map(|(_, key, p)| (key, p)).collect();
        Unlogged { entries, pages, txg: g.open.number, taken }
    }

    /// Puts back what a commit took when it could not log it.
    pub(super) fn give_back(&self, taken: Vec<(u64, PageKey)>, entries: &[Entry], txg: u64) {
        let mut g = self.inner.lock();
        let discards: Vec<(u64, Entry)> =
            entries.iter().filter(|e| !matches!(e, Entry::Page { .. })).map(|e| (txg, e.clone())).collect();
        let later = std::mem::replace(&mut g.discards, discards);
        g.discards.extend(later);
        let later = std::mem::replace(&mut g.unlogged, taken);
        g.unlogged.extend(later);
    }

    /// The open txg's L2 tickets, to make durable before its pages are
    /// written where they belong.
    pub(super) fn open_tickets(&self) -> Vec<arcache_l2::Ticket> {
        self.inner.lock().open.tickets.clone()
    }

    /// Pages a commit wrote where they belong are clean now and leave the
    /// open txg, unless rewritten meanwhile.
    pub(super) fn drop_clean(&self, pages: &[(PageKey, Arc<Page>)]) {
        let mut g = self.inner.lock();
        for (key, p) in pages {
            p.logged.store(true, Relaxed);
            if g.open.pages().get(key).is_some_and(|q| Arc::ptr_eq(q, p)) {
                g.open.remove_page(*key);
            }
        }
        self.recount(&g);
        self.cv.notify_all();
    }

    /// Wakes the syncing thread to look again (the log filled up).
    pub(super) fn wake_syncer(&self) {
        self.cv.notify_all();
    }

    /// Asks for every txg up to the open one to be synced now; the txg to
    /// wait for.
    pub(super) fn want_sync(&self) -> u64 {
        let mut g = self.inner.lock();
        let target = g.open.number;
        g.want = g.want.max(target);
        self.cv.notify_all();
        target
    }

    /// Waits until the syncing thread has finished txg `target`; true if
    /// it was synced.
    pub(super) fn wait_synced(&self, target: u64) -> bool {
        let mut g = self.inner.lock();
        while g.done < target {
            self.cv.wait_for(&mut g, Duration::from_millis(100));
        }
        g.synced >= target
    }

    /// While dirty data is at least `max`: asks for a sync and waits up to
    /// `timeout` for one to finish. False when it is below `max` already.
    pub(super) fn wait_for_room(&self, max: u64, timeout: Duration) -> bool {
        let mut g = self.inner.lock();
        if g.dirty() < max {
            return false;
        }
        g.want = g.want.max(g.open.number);
        self.cv.notify_all();
        self.cv.wait_for(&mut g, timeout);
        true
    }

    /// Waits until the open txg should be synced (asked for, aged, worth
    /// writing behind, or `log_pressed` says the log wants its space, or a
    /// failed sync is due for a retry); false once stopped instead.
    pub(super) fn wait_for_txg(&self, log_pressed: &dyn Fn() -> bool) -> bool {
        let mut g = self.inner.lock();
        loop {
            let timeout = Duration::from_secs(self.tunables.txg_timeout_secs.load(Relaxed).max(1));
            let aged = g.open.born.is_some_and(|b| b.elapsed() >= timeout);
            let retry_ok = g.retry_at.is_none_or(|t| Instant::now() >= t);
            let wanted = g.want >= g.open.number;
            let worth =
                !g.open.is_empty() && (self.write_behind_due(&g) || (g.syncing.is_none() && log_pressed()));
            if retry_ok && (wanted || aged || worth || (g.retry_at.is_some() && !g.open.is_empty())) {
                return true;
            }
            if g.stop {
                return false;
            }
            self.cv.wait_for(&mut g, Duration::from_millis(100));
        }
    }

    /// Lets the syncing thread end once nothing is asked of it.
    pub(super) fn stop(&self) {
        self.inner.lock().stop = true;
        self.cv.notify_all();
    }

    /// Closes the open txg and makes it the syncing one.
    pub(super) fn begin_sync(&self) -> Arc<Txg> {
        let mut g = self.inner.lock();
        let next = Txg::new(g.open.number + 1);
        let t = Arc::new(std::mem::replace(&mut g.open, next));
        g.syncing = Some(Arc::clone(&t));
        t
    }

    /// Ends the sync of `txg`: clean now if `ok`, else its pages go back
    /// under the open txg for a retry. True if it was synced.
    pub(super) fn end_sync(&self, txg: &Txg, ok: bool) -> bool {
        let mut g = self.inner.lock();
        g.syncing = None;
        g.done = txg.number;
        if ok {
            g.synced = txg.number;
            g.discards.retain(|(t, _)| *t > txg.number);
            g.retry_at = None;
        } else {
            self.merge_back(&mut g, txg);
            g.retry_at = Some(Instant::now() + Duration::from_secs(1));
        }
        self.recount(&g);
        self.cv.notify_all();
        drop(g);
        if let (Some(l2), true) = (&self.l2, ok) {
            l2.end_write(&txg.records.iter().copied().collect::<Vec<_>>());
        }
        ok
    }

    /// Puts a failed txg's pages back under the open txg, below newer writes.
    fn merge_back(&self, g: &mut Inner, failed: &Txg) {
        let number = g.open.number;
        for (&key, page) in failed.pages() {
            let merged = match g.open.pages().get(&key) {
                Some(newer) => {
                    let mut p = Page::clone(page);
                    p.merge_from(newer);
                    p
                }
                None => Page::clone(page),
            };
            g.open.insert_page(key, Arc::new(merged));
            g.unlogged.push((number, key));
        }
        let mut twice = Vec::new();
        for &k in &failed.records {
            if !g.open.records.insert(k) {
                twice.push(k);
            }
        }
        if let (Some(l2), false) = (&self.l2, twice.is_empty()) {
            l2.end_write(&twice);
        }
        g.open.tickets.extend(failed.tickets.iter().copied());
        // Their flush may not have happened: log them with the next commit.
        for (t, _) in g.discards.iter_mut().filter(|(t, _)| *t == failed.number) {
            *t = number;
        }
        if g.open.born.is_none() {
            g.open.born = Some(Instant::now());
        }
    }

    /// Fills the txg part of `v`.
    pub(super) fn view(&self, v: &mut WriteView) {
        let g = self.inner.lock();
        v.dirty_bytes = g.dirty();
        v.txg_open = g.open.number;
        v.txg_syncing = g.syncing.as_ref().map_or(0, |t| t.number);
        v.txg_synced = g.synced;
        v.txg_age_ms = g.open.born.map_or(0, |b| b.elapsed().as_millis() as u64);
    }
}

/// Applies `change` of bytes `range` to the dirty page at `base`: a sector
/// it covers whole is no longer dirty; one it covers in part keeps its
/// other bytes and takes the change's (zeroes, or the written bytes).
fn change_page(p: &mut Page, base: u64, range: &Range<u64>, change: Change<'_>) {
    for s in dirty::sectors(p.mask) {
        let r = dirty::sector_range(s);
        let (from, to) = ((base + r.start as u64).max(range.start), (base + r.end as u64).min(range.end));
        if from >= to {
            continue;
        }
        let part = &mut p.data[(from - base) as usize..(to - base) as usize];
        match change {
            _ if from == base + r.start as u64 && to == base + r.end as u64 => p.mask &= !(1 << s),
            Change::Zero => part.fill(0),
            Change::Overwrite(data) => {
                part.copy_from_slice(&data[(from - range.start) as usize..(to - range.start) as usize])
            }
            Change::Trim => {}
        }
    }
}
