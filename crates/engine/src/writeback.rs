//! Write-back: writes are acknowledged once dirty in RAM; a FLUSH makes
//! them durable in the intent log (or, without one, by writing the dirty
//! pages in place); a background thread writes each txg to the backing
//! stores in sorted, coalesced writes and then releases its log space.
//! The argument for why nothing acknowledged is lost is in
//! `docs/intent-log.md`.
//!
//! Lock order: record locks (in `Volume`), then `sync_lock`, then `inner`,
//! then the L2 index. The syncing thread takes `sync_lock` then `inner` and
//! never a record lock.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_policy::Key;
use arcache_l2::L2Arc;
use blockdev::{BlockDev, DevError, DevResult};
use parking_lot::{Condvar, Mutex, RwLock};

use crate::commit::CommitStep;
use crate::committer::{CommitDone, Committer};
use rustc_hash::FxHashSet;
use tracing::{info, warn};
pub use zil::ReplayStats;
use zil::{Entry, IntentLog, LogError, LogExport};

use crate::dirty::{self, key_page, key_vol, page_key, Page, PageKey, Txg, PAGE};
use crate::volume::Volume;

/// The write tunables, with OpenZFS's names.
#[derive(Debug)]
pub struct WriteTunables {
    pub txg_timeout_secs: AtomicU64,
    pub dirty_data_max: AtomicU64,
    pub dirty_data_sync_percent: AtomicU64,
    pub delay_min_dirty_percent: AtomicU64,
    pub delay_scale_ns: AtomicU64,
    /// Parallel backing writes while a txg syncs.
    pub sync_writers: AtomicU64,
    /// Intent-log commit writes in flight at once (1..=3: a commit takes at
    /// most a quarter of the log, so three in flight stay within it).
    pub log_writes_in_flight: AtomicU64,
}

impl Default for WriteTunables {
    fn default() -> Self {
        WriteTunables {
            txg_timeout_secs: AtomicU64::new(5),
            dirty_data_max: AtomicU64::new(1 << 30),
            dirty_data_sync_percent: AtomicU64::new(20),
            delay_min_dirty_percent: AtomicU64::new(60),
            delay_scale_ns: AtomicU64::new(500_000),
            sync_writers: AtomicU64::new(32),
            log_writes_in_flight: AtomicU64::new(1),
        }
    }
}

/// Counters for `arcache stat`; names in docs/tunables-and-stats.md.
#[derive(Debug, Default)]
pub struct WriteStats {
    pub txg_syncs: AtomicU64,
    pub txg_sync_bytes: AtomicU64,
    pub txg_sync_errors: AtomicU64,
    pub txg_last_sync_ms: AtomicU64,
    pub zil_commit_count: AtomicU64,
    pub zil_commit_writer_count: AtomicU64,
    pub zil_itx_count: AtomicU64,
    pub zil_log_bytes: AtomicU64,
    pub zil_log_errors: AtomicU64,
    pub zil_log_write_ns: AtomicU64,
    pub zil_txg_fallbacks: AtomicU64,
    pub zil_replay_records: AtomicU64,
    pub zil_replay_bytes: AtomicU64,
    pub throttle_delays: AtomicU64,
    pub throttle_delay_ns: AtomicU64,
    pub throttle_waits: AtomicU64,
    pub written_bytes: AtomicU64,
}

/// A point-in-time view of the write path for `arcache stat --json`.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct WriteView {
    pub dirty_bytes: u64,
    pub dirty_max: u64,
    pub txg_open: u64,
    pub txg_syncing: u64,
    pub txg_synced: u64,
    pub txg_age_ms: u64,
    pub txg_syncs: u64,
    pub txg_sync_bytes: u64,
    pub txg_sync_errors: u64,
    pub txg_last_sync_ms: u64,
    pub zil_present: u64,
    pub zil_degraded: u64,
    pub zil_commit_count: u64,
    pub zil_commit_writer_count: u64,
    pub zil_itx_count: u64,
    pub zil_log_bytes: u64,
    pub zil_log_errors: u64,
    /// Mean time of one log commit's write and flush, in microseconds.
    pub zil_commit_us: u64,
    pub zil_txg_fallbacks: u64,
    pub zil_log_used: u64,
    pub zil_log_capacity: u64,
    pub zil_replay_records: u64,
    pub zil_replay_bytes: u64,
    pub throttle_delays: u64,
    pub throttle_delay_ms: u64,
    pub throttle_waits: u64,
    pub write_bytes: u64,
}

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

/// A backing store the write path writes to, by export id.
#[derive(Clone)]
pub struct Backing {
    pub dev: Arc<dyn BlockDev>,
    pub size: u64,
}

/// Most log commits in flight (see `WriteTunables::log_writes_in_flight`).
/// While one is being written, at most two more can be placed after it,
/// each at most a quarter of the log, so the head cannot come round to a
/// chunk still being written even when a txg has released it meanwhile.
const MAX_LOG_WRITES_IN_FLIGHT: u64 = 3;

/// Write-behind takes a txg early only when its pages form runs at least
/// this long on average (16 KiB): a stream, not scattered small writes.
const WRITE_BEHIND_PAGES_PER_RUN: f64 = 4.0;

/// One log-write run's changes, with their places in the log.
struct Placed {
    chunks: Result<zil::PlacedChunks, LogError>,
    pages: Vec<(PageKey, Arc<Page>)>,
    entries: Vec<Entry>,
    encoded: u64,
    txg: u64,
    taken: Vec<(u64, PageKey)>,
}

pub struct WriteBack {
    inner: Mutex<Inner>,
    cv: Condvar,
    /// Held exclusively while pages are written where they belong (a txg,
    /// an in-place commit), shared by changes applied straight to a backing
    /// store (trims, zeroings, write-through), which must not interleave
    /// with those writes.
    sync_lock: RwLock<()>,
    backings: RwLock<Vec<Option<Backing>>>,
    log: Option<Arc<IntentLog>>,
    log_failed: AtomicBool,
    l2: Option<Arc<L2Arc>>,
    /// Log writes (several in flight), log device flushes, and in-place
    /// commits (one at a time: they hold the sync lock anyway).
    log_writes: CommitStep,
    log_syncs: CommitStep,
    in_place: CommitStep,
    /// The last log-write run whose chunks have their places: runs collect
    /// unlogged changes and place their chunks in run order, so a run's
    /// chunks follow every earlier run's (a replay stops at the first
    /// missing chunk, and a caller waits for the runs up to its own only).
    log_placed: Mutex<u64>,
    log_placed_cv: Condvar,
    committer: Committer,
    pub tunables: Arc<WriteTunables>,
    pub stats: WriteStats,
    /// Page count, readable without the lock: reads skip overlays when 0.
    dirty_pages: AtomicU64,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

fn sync_error(msg: String) -> DevError {
    DevError::Io {
        op: "sync",
        dev: "backing stores".into(),
        offset: 0,
        len: 0,
        source: std::io::Error::other(msg),
    }
}

impl WriteBack {
    pub fn new(
        log: Option<Arc<IntentLog>>,
        l2: Option<Arc<L2Arc>>,
        tunables: Arc<WriteTunables>,
    ) -> Arc<Self> {
        Arc::new(WriteBack {
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
            sync_lock: RwLock::new(()),
            backings: RwLock::new(Vec::new()),
            log,
            log_failed: AtomicBool::new(false),
            l2,
            log_writes: CommitStep::new(),
            log_syncs: CommitStep::new(),
            in_place: CommitStep::new(),
            log_placed: Mutex::new(0),
            log_placed_cv: Condvar::new(),
            committer: Committer::default(),
            tunables,
            stats: WriteStats::default(),
            dirty_pages: AtomicU64::new(0),
            thread: Mutex::new(None),
        })
    }

    /// True when sync writes can go to a working intent log.
    pub(crate) fn has_log(&self) -> bool {
        self.log_usable().is_some()
    }

    fn log_usable(&self) -> Option<&Arc<IntentLog>> {
        self.log.as_ref().filter(|_| !self.log_failed.load(Relaxed))
    }

    pub(crate) fn register(&self, vol: u16, backing: Backing) {
        let mut b = self.backings.write();
        if b.len() <= vol as usize {
            b.resize(vol as usize + 1, None);
        }
        b[vol as usize] = Some(backing);
    }

    /// Starts the thread that syncs txgs.
    pub fn spawn(self: &Arc<Self>) {
        let me = Arc::clone(self);
        let h = std::thread::Builder::new().name("txg-sync".into()).spawn(move || me.sync_loop());
        match h {
            Ok(h) => *self.thread.lock() = Some(h),
            Err(e) => warn!("cannot start the txg sync thread ({e}); every FLUSH will sync"),
        }
    }

    pub fn has_dirty(&self) -> bool {
        self.dirty_pages.load(Relaxed) > 0
    }

    fn recount(&self, g: &Inner) {
        let n = g.open.pages().len() + g.syncing.as_ref().map_or(0, |t| t.pages().len());
        self.dirty_pages.store(n as u64, Relaxed);
    }

    /// Dirty data above which writes are delayed, and the hard limit.
    fn throttle_levels(&self) -> (u64, u64) {
        let t = &self.tunables;
        let max = t.dirty_data_max.load(Relaxed).max(PAGE * 64);
        (max * t.delay_min_dirty_percent.load(Relaxed).min(100) / 100, max)
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

    /// The intent log is half full: a txg releases its space before a
    /// commit finds it full and has to wait for a txg of its own. Checked
    /// after each log write, which is what fills it.
    fn log_pressed(&self) -> bool {
        self.log_usable().is_some_and(|log| log.used() > log.capacity() / 2)
    }

    /// True when a write now would be delayed or made to wait.
    pub(crate) fn would_throttle(&self) -> bool {
        self.inner.lock().dirty() > self.throttle_levels().0
    }

    /// Slows a writer down as dirty data grows, and makes it wait at the
    /// limit, as OpenZFS's write throttle does. Never fails.
    pub(crate) fn throttle(&self) {
        let t = &self.tunables;
        let mut g = self.inner.lock();
        let mut waited = false;
        loop {
            let (min, max) = self.throttle_levels();
            let dirty = g.dirty();
            if dirty >= max {
                if !waited {
                    self.stats.throttle_waits.fetch_add(1, Relaxed);
                    waited = true;
                }
                g.want = g.want.max(g.open.number);
                self.cv.notify_all();
                self.cv.wait_for(&mut g, Duration::from_millis(50));
                continue;
            }
            if dirty <= min {
                return;
            }
            let scale = t.delay_scale_ns.load(Relaxed) as u128;
            let ns = (scale * u128::from(dirty - min) / u128::from(max - dirty)).min(100_000_000) as u64;
            drop(g);
            if ns > 0 {
                self.stats.throttle_delays.fetch_add(1, Relaxed);
                self.stats.throttle_delay_ns.fetch_add(ns, Relaxed);
                std::thread::sleep(Duration::from_nanos(ns));
            }
            return;
        }
    }

    /// Adds written pages of export `vol` to the open txg. `records` are
    /// the record keys the write touches; their L2 copies are dropped now
    /// and durably before this txg reaches the backing store.
    pub(crate) fn put(&self, vol: u16, records: &[Key], pages: Vec<(u64, Page)>) {
        let mut g = self.inner.lock();
        let g = &mut *g;
        let fresh: Vec<Key> = records.iter().copied().filter(|&k| g.open.records.insert(k)).collect();
        if let Some(l2) = &self.l2 {
            if !fresh.is_empty() {
                let t = l2.begin_write_deferred(&fresh);
                g.open.tickets.extend(t);
            }
        }
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
    pub(crate) fn sector(&self, vol: u16, offset: u64) -> Option<[u8; 512]> {
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

    /// The dirty pages over bytes `range` of export `vol`, oldest first,
    /// to lay over data read from a device. Take it before the read: a txg
    /// that finishes meanwhile has put the same bytes on the device.
    pub(crate) fn snapshot(&self, vol: u16, range: Range<u64>) -> Vec<(u64, Arc<Page>)> {
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

    /// Lays a snapshot over `buf`, which holds bytes `range.start..`.
    pub(crate) fn apply(snapshot: &[(u64, Arc<Page>)], start: u64, buf: &mut [u8]) {
        let end = start + buf.len() as u64;
        for (page, p) in snapshot {
            let base = page * PAGE;
            let from = base.max(start);
            let to = (base + PAGE).min(end);
            if from >= to {
                continue;
            }
            p.overlay(
                (from - base) as usize..(to - base) as usize,
                &mut buf[(from - start) as usize..(to - start) as usize],
            );
        }
    }

    /// As [`WriteBack::commit`], answered later: `done` is called from the
    /// commit thread with the result of a commit that started after this
    /// call. Gives `done` back when there is no commit thread.
    pub fn commit_async(self: &Arc<Self>, done: CommitDone) -> Result<(), CommitDone> {
        self.committer.submit(self, done)?;
        self.stats.zil_commit_count.fetch_add(1, Relaxed);
        Ok(())
    }

    /// Makes every write put before this call durable: in the intent log
    /// when there is one that works, otherwise by writing the pages in place
    /// on the backing store (as a pool without SLOG writes its ZIL to its
    /// own disks). Concurrent callers share each step (group commit).
    pub fn commit(&self) -> DevResult<()> {
        self.stats.zil_commit_count.fetch_add(1, Relaxed);
        self.commit_uncounted()
    }

    /// [`WriteBack::commit`] for callers counted already (a batch of
    /// asynchronous FLUSHes).
    pub(crate) fn commit_uncounted(&self) -> DevResult<()> {
        if self.log_usable().is_none() {
            if self.in_place.run(1, &|_| self.commit_in_place().is_ok()) {
                return Ok(());
            }
            return Err(sync_error("writing dirty data to the backing store failed".into()));
        }
        if self.log_writes.run(self.log_writes_in_flight(), &|n| self.log_write_once(n))
            && self.log_syncs.run(1, &|_| self.log_sync_once())
        {
            return Ok(());
        }
        self.stats.zil_txg_fallbacks.fetch_add(1, Relaxed);
        self.sync_now()
    }

    fn fail_log(&self, e: &LogError) {
        self.stats.zil_log_errors.fetch_add(1, Relaxed);
        if !self.log_failed.swap(true, Relaxed) {
            warn!("intent log taken out of service: {e}; FLUSH now writes dirty data in place");
        }
    }

    /// One on the development machine: two overlapping O_DSYNC writes gave
    /// no more FLUSHes per second there (the job is CPU-bound and batches
    /// shrink; docs/intent-log.md). Placement in run order keeps more correct.
    fn log_writes_in_flight(&self) -> usize {
        self.tunables.log_writes_in_flight.load(Relaxed).clamp(1, MAX_LOG_WRITES_IN_FLIGHT) as usize
    }

    /// Collects what is unlogged and places it in the log once every
    /// earlier run has placed its own. `Err` when the log is out of
    /// service, `Ok(None)` when there was nothing to log.
    fn place_in_turn(&self, run: u64) -> Result<Option<Placed>, ()> {
        let mut placed_through = self.log_placed.lock();
        while *placed_through + 1 < run {
            self.log_placed_cv.wait(&mut placed_through);
        }
        let result = match self.log_usable() {
            None => Err(()),
            Some(log) => Ok(self.collect_and_place(log)),
        };
        *placed_through = run;
        self.log_placed_cv.notify_all();
        result
    }

    fn collect_and_place(&self, log: &Arc<IntentLog>) -> Option<Placed> {
        let (discards, pages, txg, taken) = self.collect_unlogged();
        let mut entries = discards;
        entries.extend(pages.iter().map(|(key, p)| Entry::Page {
            export: key_vol(*key),
            page: key_page(*key),
            mask: p.mask,
            data: p.packed(),
        }));
        if entries.is_empty() {
            return None;
        }
        // A commit bigger than a quarter of the log is better synced.
        let encoded = IntentLog::encoded_len(&entries);
        let chunks =
            if encoded > log.capacity() / 4 { Err(LogError::Full) } else { log.place_chunks(txg, &entries) };
        Some(Placed { chunks, pages, entries, encoded, txg, taken })
    }

    /// Writes every unlogged page and discard to the log (not yet flushed);
    /// `run` is this log-write run's number.
    fn log_write_once(&self, run: u64) -> bool {
        let (p, log) = match (self.place_in_turn(run), &self.log) {
            (Ok(None), _) => return true,
            (Ok(Some(p)), Some(log)) => (p, log),
            _ => return false,
        };
        let started = Instant::now();
        let res = p.chunks.and_then(|chunks| log.write_placed(&chunks));
        self.stats.zil_log_write_ns.fetch_add(started.elapsed().as_nanos() as u64, Relaxed);
        match res {
            Ok(()) => {
                // Logged once the next sync completes; a failed sync sends
                // its callers to a txg, which writes every dirty page.
                for (_, page) in &p.pages {
                    page.logged.store(true, Relaxed);
                }
                let s = &self.stats;
                s.zil_commit_writer_count.fetch_add(1, Relaxed);
                s.zil_itx_count.fetch_add(p.entries.len() as u64, Relaxed);
                s.zil_log_bytes.fetch_add(p.encoded, Relaxed);
                if self.log_pressed() {
                    self.cv.notify_all();
                }
                true
            }
            Err(e) => {
                if !matches!(e, LogError::Full) {
                    self.fail_log(&e);
                }
                self.give_back(p.taken, &p.entries, p.txg);
                false
            }
        }
    }

    /// Flushes the log device: every chunk written before is durable.
    fn log_sync_once(&self) -> bool {
        let Some(log) = self.log_usable() else { return false };
        let started = Instant::now();
        let res = log.sync();
        self.stats.zil_log_write_ns.fetch_add(started.elapsed().as_nanos() as u64, Relaxed);
        match res {
            Ok(()) => true,
            Err(e) => {
                self.fail_log(&e);
                false
            }
        }
    }

    /// Without a log: the unlogged pages are written where they belong and
    /// the backing stores flushed, under the sync lock so no txg writes an
    /// older version of a page after them; pages not rewritten meanwhile
    /// then leave the open txg, being clean.
    fn commit_in_place(&self) -> DevResult<()> {
        if self.inner.lock().unlogged.is_empty() {
            // Nothing dirty to write (write-through or all written already):
            // a flush of every backing store is the whole commit, and it
            // need not wait for writes in flight, which are not acknowledged.
            return self.flush_backings();
        }
        let _sync = self.sync_lock.write();
        let (_, pages, txg, taken) = self.collect_unlogged();
        let map: rustc_hash::FxHashMap<PageKey, Arc<Page>> = pages.iter().cloned().collect();
        // As before a txg: no L2 copy older than these pages may survive a
        // crash once they are on the backing store.
        if let Some(l2) = &self.l2 {
            let tickets = self.inner.lock().open.tickets.clone();
            l2.make_durable(&tickets);
        }
        match self.write_pages(&map) {
            Ok(_) => {
                // Written and flushed where they belong: unless rewritten
                // meanwhile, these pages are clean now and leave the txg.
                let mut g = self.inner.lock();
                for (key, p) in &pages {
                    p.logged.store(true, Relaxed);
                    if g.open.pages().get(key).is_some_and(|q| Arc::ptr_eq(q, p)) {
                        g.open.remove_page(*key);
                    }
                }
                self.recount(&g);
                self.cv.notify_all();
                Ok(())
            }
            Err(e) => {
                self.give_back(taken, &[], txg);
                Err(e)
            }
        }
    }

    /// The discards and unlogged pages (newest versions) to commit, the
    /// open txg, and what was taken from the queues.
    #[allow(clippy::type_complexity)]
    fn collect_unlogged(&self) -> (Vec<Entry>, Vec<(PageKey, Arc<Page>)>, u64, Vec<(u64, PageKey)>) {
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
        (entries, pages, g.open.number, taken)
    }

    /// Puts back what a commit took when it could not log it.
    fn give_back(&self, taken: Vec<(u64, PageKey)>, entries: &[Entry], txg: u64) {
        let mut g = self.inner.lock();
        let discards: Vec<(u64, Entry)> =
            entries.iter().filter(|e| !matches!(e, Entry::Page { .. })).map(|e| (txg, e.clone())).collect();
        let later = std::mem::replace(&mut g.discards, discards);
        g.discards.extend(later);
        let later = std::mem::replace(&mut g.unlogged, taken);
        g.unlogged.extend(later);
    }

    /// Syncs every txg up to the open one and waits for it.
    pub fn sync_now(&self) -> DevResult<()> {
        let mut g = self.inner.lock();
        let target = g.open.number;
        g.want = g.want.max(target);
        self.cv.notify_all();
        if self.thread.lock().is_none() {
            drop(g);
            self.sync_one();
            g = self.inner.lock();
        }
        while g.done < target {
            self.cv.wait_for(&mut g, Duration::from_millis(100));
        }
        if g.synced >= target {
            Ok(())
        } else {
            Err(sync_error(format!("transaction group {target} could not be written to the backing store")))
        }
    }

    fn sync_loop(&self) {
        loop {
            {
                let mut g = self.inner.lock();
                loop {
                    let timeout = Duration::from_secs(self.tunables.txg_timeout_secs.load(Relaxed).max(1));
                    let aged = g.open.born.is_some_and(|b| b.elapsed() >= timeout);
                    let retry_ok = g.retry_at.is_none_or(|t| Instant::now() >= t);
                    let wanted = g.want >= g.open.number;
                    let worth = !g.open.is_empty()
                        && (self.write_behind_due(&g) || (g.syncing.is_none() && self.log_pressed()));
                    if retry_ok && (wanted || aged || worth || (g.retry_at.is_some() && !g.open.is_empty())) {
                        break;
                    }
                    if g.stop {
                        return;
                    }
                    self.cv.wait_for(&mut g, Duration::from_millis(100));
                }
            }
            self.sync_one();
        }
    }

    /// Writes the open txg to the backing stores, flushes them and releases
    /// the log space it covered.
    fn sync_one(&self) {
        let _sync = self.sync_lock.write();
        let started = Instant::now();
        let txg = {
            let mut g = self.inner.lock();
            let next = Txg::new(g.open.number + 1);
            let t = Arc::new(std::mem::replace(&mut g.open, next));
            g.syncing = Some(Arc::clone(&t));
            t
        };
        if let Some(l2) = &self.l2 {
            l2.make_durable(&txg.tickets);
        }
        let res = self.write_pages(txg.pages());
        if let Err(e) = &res {
            warn!(
                "transaction group {} could not be synced: {e}; its data stays dirty and is retried",
                txg.number
            );
        }
        if res.is_ok() {
            self.release_log(txg.number);
        }
        let mut g = self.inner.lock();
        g.syncing = None;
        g.done = txg.number;
        match res {
            Ok(bytes) => {
                g.synced = txg.number;
                g.discards.retain(|(t, _)| *t > txg.number);
                g.retry_at = None;
                let s = &self.stats;
                s.txg_syncs.fetch_add(1, Relaxed);
                s.txg_sync_bytes.fetch_add(bytes, Relaxed);
                s.txg_last_sync_ms.store(started.elapsed().as_millis() as u64, Relaxed);
            }
            Err(_) => {
                self.stats.txg_sync_errors.fetch_add(1, Relaxed);
                self.merge_back(&mut g, &txg);
                g.retry_at = Some(Instant::now() + Duration::from_secs(1));
            }
        }
        self.recount(&g);
        let synced = g.synced;
        self.cv.notify_all();
        drop(g);
        if let Some(l2) = &self.l2 {
            if synced == txg.number {
                l2.end_write(&txg.records.iter().copied().collect::<Vec<_>>());
            }
        }
        if self.log_usable().is_none() {
            if let Some(log) = &self.log {
                // The log failed: keep trying to empty it, so its old
                // chunks cannot be replayed over newer data after a restart.
                if synced == txg.number && log.reset().is_ok() {
                    info!("intent log {} emptied after its failure (it stays out of service)", log.name());
                }
            }
        }
    }

    /// Frees the log chunks of txgs up to `synced`, whose pages are on the
    /// backing stores and flushed. Done before the txg counts as synced: a
    /// FLUSH that then finds those pages clean is answered at once, and a
    /// crash after that answer must not replay older chunks over them.
    fn release_log(&self, synced: u64) {
        let Some(log) = self.log_usable() else { return };
        if let Err(e) = log.release(synced) {
            self.fail_log(&e);
            // Pages logged since this txg began live only in the failed
            // log now: sync them at once.
            let mut g = self.inner.lock();
            g.want = g.want.max(g.open.number);
            self.cv.notify_all();
        }
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

    /// Writes `pages` in parallel and flushes every backing store; the
    /// bytes written.
    fn write_pages(&self, pages: &rustc_hash::FxHashMap<PageKey, Arc<Page>>) -> DevResult<u64> {
        let backings = self.backings.read().clone();
        let size_of = |v: u16| backings.get(v as usize).and_then(|b| b.as_ref()).map_or(0, |b| b.size);
        let extents = dirty::extents(pages, size_of);
        let bytes: u64 = extents.iter().map(|e| e.data.len() as u64).sum();
        let next = AtomicU64::new(0);
        let first_error: Mutex<Option<DevError>> = Mutex::new(None);
        let workers = (self.tunables.sync_writers.load(Relaxed).clamp(1, 64) as usize).min(extents.len());
        std::thread::scope(|s| {
            for _ in 0..workers {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Relaxed) as usize;
                    let Some(e) = extents.get(i) else { return };
                    let Some(b) = backings.get(e.vol as usize).and_then(|b| b.as_ref()) else { continue };
                    let written = crate::volume::write_backing(b.dev.as_ref(), &e.data, e.offset);
                    if let Err(err) = written {
                        first_error.lock().get_or_insert(err);
                        return;
                    }
                });
            }
        });
        if let Some(e) = first_error.into_inner() {
            return Err(e);
        }
        self.flush_backings()?;
        Ok(bytes)
    }

    fn flush_backings(&self) -> DevResult<()> {
        let backings = self.backings.read().clone();
        for b in backings.iter().flatten() {
            if !b.dev.is_read_only() {
                b.dev.flush()?;
            }
        }
        Ok(())
    }

    /// Runs a trim or zeroing of export `vol` against its backing store
    /// with no txg writing meanwhile, after dropping the dirty bytes it
    /// covers (`zero` keeps the pages and zeroes them), and queues it for
    /// the log.
    pub(crate) fn discard(
        &self,
        vol: u16,
        records: &[Key],
        range: Range<u64>,
        change: Change<'_>,
        op: impl FnOnce() -> DevResult<()>,
    ) -> DevResult<()> {
        let _sync = self.sync_lock.read();
        {
            let mut g = self.inner.lock();
            let g = &mut *g;
            let number = g.open.number;
            // The change is not durable before the next txg flushes the
            // backing store: until then no L2 copy may be made of it.
            let fresh: Vec<Key> = records.iter().copied().filter(|&k| g.open.records.insert(k)).collect();
            if let (Some(l2), false) = (&self.l2, fresh.is_empty()) {
                let t = l2.begin_write_deferred(&fresh);
                g.open.tickets.extend(t);
            }
            if g.open.born.is_none() {
                g.open.born = Some(Instant::now());
            }
            for page in range.start / PAGE..range.end.div_ceil(PAGE) {
                let key = page_key(vol, page);
                let Some(p) = g.open.page_mut(key) else { continue };
                let base = page * PAGE;
                let p = Arc::make_mut(p);
                for s in dirty::sectors(p.mask) {
                    let r = dirty::sector_range(s);
                    let (from, to) =
                        ((base + r.start as u64).max(range.start), (base + r.end as u64).min(range.end));
                    if from >= to {
                        continue;
                    }
                    let part = &mut p.data[(from - base) as usize..(to - base) as usize];
                    match change {
                        _ if from == base + r.start as u64 && to == base + r.end as u64 => {
                            p.mask &= !(1 << s)
                        }
                        Change::Zero => part.fill(0),
                        Change::Overwrite(data) => part.copy_from_slice(
                            &data[(from - range.start) as usize..(to - range.start) as usize],
                        ),
                        Change::Trim => {}
                    }
                }
                p.logged.store(false, Relaxed);
                if p.mask == 0 {
                    g.open.remove_page(key);
                } else {
                    g.unlogged.push((number, key));
                }
            }
            if let (Some(entry), Some(_)) = (change.log_entry(vol, &range), self.log_usable()) {
                g.discards.push((number, entry));
            }
            self.recount(g);
        }
        op()
    }

    /// Syncs everything dirty, with a progress line, and stops the thread.
    /// The log is emptied when all went well.
    pub fn shutdown(&self) -> DevResult<()> {
        let mut result = Ok(());
        for attempt in 0..3 {
            let dirty = self.inner.lock().dirty();
            if dirty == 0 && attempt > 0 {
                break;
            }
            if dirty > 0 {
                info!(
                    "syncing {:.1} MiB of dirty data to the backing stores",
                    dirty as f64 / (1 << 20) as f64
                );
            }
            result = self.sync_now();
            if result.is_ok() {
                break;
            }
        }
        {
            let mut g = self.inner.lock();
            g.stop = true;
            self.cv.notify_all();
        }
        if let Some(h) = self.thread.lock().take() {
            let _ = h.join();
        }
        self.committer.stop();
        if result.is_ok() {
            if let Some(log) = self.log_usable() {
                if let Err(e) = log.reset() {
                    warn!("emptying the intent log at stop: {e} (it will be replayed at the next start)");
                } else if let Err(e) = log.close() {
                    warn!("recording the intent log's clean stop: {e}");
                }
            }
        }
        result
    }

    /// Applies the intent log found at start to the backing stores through
    /// the write-through path (which drops L2 copies durably first), flushes
    /// them and empties the log. `vols` pairs each export as the log names
    /// it now with its volume; a log naming another export is refused.
    pub fn replay(&self, vols: &[(LogExport, Arc<Volume>)]) -> Result<ReplayStats, LogError> {
        let Some(log) = &self.log else { return Ok(ReplayStats::default()) };
        if !log.needs_replay() {
            return Ok(ReplayStats::default());
        }
        let find = |x: &LogExport| {
            vols.iter()
                .find(|(e, _)| e.name == x.name && e.identity == x.identity && e.size == x.size)
                .map(|(_, v)| v)
        };
        let started = Instant::now();
        let stats = log.replay(&|x| find(x).is_some(), &mut |x, entry| {
            let vol = find(x).ok_or("export vanished")?;
            apply_entry(vol, entry).map_err(|e| format!("replaying into export {:?}: {e}", x.name))
        })?;
        for (_, v) in vols {
            if !v.read_only() {
                v.flush_backing().map_err(|e| LogError::Io(v.name().to_string(), e))?;
            }
        }
        log.reset()?;
        self.stats.zil_replay_records.fetch_add(stats.pages + stats.discards, Relaxed);
        self.stats.zil_replay_bytes.fetch_add(stats.bytes, Relaxed);
        if stats.chunks > 0 {
            info!(
                "intent log replayed: {} chunks, {} pages ({:.1} MiB), {} trims/zeroings in {:.2} s",
                stats.chunks,
                stats.pages,
                stats.bytes as f64 / (1 << 20) as f64,
                stats.discards,
                started.elapsed().as_secs_f64()
            );
        }
        Ok(stats)
    }

    pub fn view(&self) -> WriteView {
        let g = self.inner.lock();
        let s = &self.stats;
        WriteView {
            dirty_bytes: g.dirty(),
            dirty_max: self.tunables.dirty_data_max.load(Relaxed),
            txg_open: g.open.number,
            txg_syncing: g.syncing.as_ref().map_or(0, |t| t.number),
            txg_synced: g.synced,
            txg_age_ms: g.open.born.map_or(0, |b| b.elapsed().as_millis() as u64),
            txg_syncs: s.txg_syncs.load(Relaxed),
            txg_sync_bytes: s.txg_sync_bytes.load(Relaxed),
            txg_sync_errors: s.txg_sync_errors.load(Relaxed),
            txg_last_sync_ms: s.txg_last_sync_ms.load(Relaxed),
            zil_present: u64::from(self.log.is_some()),
            zil_degraded: u64::from(self.log_failed.load(Relaxed)),
            zil_commit_count: s.zil_commit_count.load(Relaxed),
            zil_commit_writer_count: s.zil_commit_writer_count.load(Relaxed),
            zil_itx_count: s.zil_itx_count.load(Relaxed),
            zil_log_bytes: s.zil_log_bytes.load(Relaxed),
            zil_log_errors: s.zil_log_errors.load(Relaxed),
            zil_commit_us: s.zil_log_write_ns.load(Relaxed)
                / 1000
                / s.zil_commit_writer_count.load(Relaxed).max(1),
            zil_txg_fallbacks: s.zil_txg_fallbacks.load(Relaxed),
            zil_log_used: self.log.as_ref().map_or(0, |l| l.used()),
            zil_log_capacity: self.log.as_ref().map_or(0, |l| l.capacity()),
            zil_replay_records: s.zil_replay_records.load(Relaxed),
            zil_replay_bytes: s.zil_replay_bytes.load(Relaxed),
            throttle_delays: s.throttle_delays.load(Relaxed),
            throttle_delay_ms: s.throttle_delay_ns.load(Relaxed) / 1_000_000,
            throttle_waits: s.throttle_waits.load(Relaxed),
            write_bytes: s.written_bytes.load(Relaxed),
        }
    }
}

/// One replayed log entry, written through to the backing store.
fn apply_entry(vol: &Volume, entry: &Entry) -> DevResult<()> {
    match entry {
        Entry::Page { page, mask, data, .. } => {
            let mut packed = data.chunks(dirty::SECTOR as usize);
            let mut run: Option<(u64, Vec<u8>)> = None;
            for s in dirty::sectors(*mask) {
                let at = page * PAGE + s as u64 * dirty::SECTOR;
                let bytes = packed.next().unwrap_or(&[]);
                match &mut run {
                    Some((start, buf)) if *start + buf.len() as u64 == at => buf.extend_from_slice(bytes),
                    _ => {
                        if let Some((start, buf)) = run.take() {
                            write_clipped(vol, start, &buf)?;
                        }
                        run = Some((at, bytes.to_vec()));
                    }
                }
            }
            match run {
                Some((start, buf)) => write_clipped(vol, start, &buf),
                None => Ok(()),
            }
        }
        Entry::Zero { offset, len, .. } => vol.write_zeroes_through(*offset, *len),
        Entry::Trim { offset, len, .. } => vol.trim_through(*offset, *len),
    }
}

/// The last page of an export may reach past its end.
fn write_clipped(vol: &Volume, start: u64, buf: &[u8]) -> DevResult<()> {
    let n = vol.size().saturating_sub(start).min(buf.len() as u64) as usize;
    if n == 0 {
        return Ok(());
    }
    vol.write_through(start, &buf[..n], false)
}
