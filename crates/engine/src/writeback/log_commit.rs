//! The log committer: makes every acknowledged change durable in the intent
//! log (group commit: writes, then one device flush, shared by every caller
//! waiting), or, without a working log, by writing the dirty pages in place.
//! The argument for why nothing acknowledged is lost is in
//! `docs/intent-log.md`.

use std::sync::Arc;
use std::time::Instant;

use arcache_l2::L2Arc;
use arcache_sync::atomic::{AtomicBool, Ordering::Relaxed};
use arcache_sync::{Condvar, Mutex};
use blockdev::{DevError, DevResult};
use tracing::{info, warn};
use zil::{Entry, IntentLog, LogError};

use super::backings::Backings;
use super::dirty_set::{DirtySet, Unlogged};
use super::stats::{WriteStats, WriteTunables};
use crate::commit::CommitStep;
use crate::dirty::{key_page, key_vol, Page, PageKey};

/// Most log commits in flight (see `WriteTunables::log_writes_in_flight`).
/// While one is being written, at most two more can be placed after it,
/// each at most a quarter of the log, so the head cannot come round to a
/// chunk still being written even when a txg has released it meanwhile.
const MAX_LOG_WRITES_IN_FLIGHT: u64 = 3;

/// One log-write run's changes, with their places in the log.
struct Placed {
    chunks: Result<zil::PlacedChunks, LogError>,
    pages: Vec<(PageKey, Arc<Page>)>,
    entries: Vec<Entry>,
    encoded: u64,
    txg: u64,
    taken: Vec<(u64, PageKey)>,
}

pub(super) fn sync_error(msg: String) -> DevError {
    DevError::Io {
        op: "sync",
        dev: "backing stores".into(),
        offset: 0,
        len: 0,
        source: std::io::Error::other(msg),
    }
}

pub(super) struct LogCommitter {
    log: Option<Arc<IntentLog>>,
    failed: AtomicBool,
    l2: Option<Arc<L2Arc>>,
    /// Log writes (several in flight), log device flushes, and in-place
    /// commits (one at a time: they hold the sync lock anyway).
    writes: CommitStep,
    syncs: CommitStep,
    in_place: CommitStep,
    /// The last log-write run whose chunks have their places: runs collect
    /// unlogged changes and place their chunks in run order, so a run's
    /// chunks follow every earlier run's (a replay stops at the first
    /// missing chunk, and a caller waits for the runs up to its own only).
    placed: Mutex<u64>,
    placed_cv: Condvar,
    tunables: Arc<WriteTunables>,
    stats: Arc<WriteStats>,
}

impl LogCommitter {
    pub(super) fn new(
        log: Option<Arc<IntentLog>>,
        l2: Option<Arc<L2Arc>>,
        tunables: Arc<WriteTunables>,
        stats: Arc<WriteStats>,
    ) -> Self {
        LogCommitter {
            log,
            failed: AtomicBool::new(false),
            l2,
            writes: CommitStep::new(),
            syncs: CommitStep::new(),
            in_place: CommitStep::new(),
            placed: Mutex::new(0),
            placed_cv: Condvar::new(),
            tunables,
            stats,
        }
    }

    /// The intent log, working or not.
    pub(super) fn log(&self) -> Option<&Arc<IntentLog>> {
        self.log.as_ref()
    }

    /// The intent log while it works.
    pub(super) fn usable(&self) -> Option<&Arc<IntentLog>> {
        self.log.as_ref().filter(|_| !self.failed.load(Relaxed))
    }

    pub(super) fn degraded(&self) -> bool {
        self.failed.load(Relaxed)
    }

    /// The intent log is half full: a txg releases its space before a
    /// commit finds it full and has to wait for a txg of its own. Checked
    /// after each log write, which is what fills it.
    pub(super) fn pressed(&self) -> bool {
        self.usable().is_some_and(|log| log.used() > log.capacity() / 2)
    }

    fn fail(&self, e: &LogError) {
        self.stats.zil_log_errors.fetch_add(1, Relaxed);
        if !self.failed.swap(true, Relaxed) {
            warn!("intent log taken out of service: {e}; FLUSH now writes dirty data in place");
        }
    }

    /// Makes every change put before this call durable. `None` when the
    /// log could not take them: the caller syncs a txg instead.
    pub(super) fn commit(&self, dirty: &DirtySet, backings: &Backings) -> Option<DevResult<()>> {
        if self.usable().is_none() {
            if self.in_place.run(1, &|_| self.commit_in_place(dirty, backings).is_ok()) {
                return Some(Ok(()));
            }
            return Some(Err(sync_error("writing dirty data to the backing store failed".into())));
        }
        if self.writes.run(self.writes_in_flight(), &|n| self.write_once(dirty, n))
            && self.syncs.run(1, &|_| self.sync_once())
        {
            return Some(Ok(()));
        }
        None
    }

    /// One on the development machine: two overlapping O_DSYNC writes gave
    /// no more FLUSHes per second there (the job is CPU-bound and batches
    /// shrink; docs/intent-log.md). Placement in run order keeps more correct.
    fn writes_in_flight(&self) -> usize {
        self.tunables.log_writes_in_flight.load(Relaxed).clamp(1, MAX_LOG_WRITES_IN_FLIGHT) as usize
    }

    /// Collects what is unlogged and places it in the log once every
    /// earlier run has placed its own. `Err` when the log is out of
    /// service, `Ok(None)` when there was nothing to log.
    fn place_in_turn(&self, dirty: &DirtySet, run: u64) -> Result<Option<Placed>, ()> {
        let mut placed_through = self.placed.lock();
        while *placed_through + 1 < run {
            self.placed_cv.wait(&mut placed_through);
        }
        let result = match self.usable() {
            None => Err(()),
            Some(log) => Ok(collect_and_place(log, dirty.take_unlogged())),
        };
        *placed_through = run;
        self.placed_cv.notify_all();
        result
    }

    /// Writes every unlogged page and discard to the log (not yet flushed);
    /// `run` is this log-write run's number.
    fn write_once(&self, dirty: &DirtySet, run: u64) -> bool {
        let (p, log) = match (self.place_in_turn(dirty, run), &self.log) {
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
                if self.pressed() {
                    dirty.wake_syncer();
                }
                true
            }
            Err(e) => {
                if !matches!(e, LogError::Full) {
                    self.fail(&e);
                }
                dirty.give_back(p.taken, &p.entries, p.txg);
                false
            }
        }
    }

    /// Flushes the log device: every chunk written before is durable.
    fn sync_once(&self) -> bool {
        let Some(log) = self.usable() else { return false };
        let started = Instant::now();
        let res = log.sync();
        self.stats.zil_log_write_ns.fetch_add(started.elapsed().as_nanos() as u64, Relaxed);
        match res {
            Ok(()) => true,
            Err(e) => {
                self.fail(&e);
                false
            }
        }
    }

    /// Without a log: the unlogged pages are written where they belong and
    /// the backing stores flushed, under the sync lock so no txg writes an
    /// older version of a page after them; pages not rewritten meanwhile
    /// then leave the open txg, being clean.
    fn commit_in_place(&self, dirty: &DirtySet, backings: &Backings) -> DevResult<()> {
        if !dirty.has_unlogged() {
            // Nothing dirty to write (write-through or all written already):
            // a flush of every backing store is the whole commit, and it
            // need not wait for writes in flight, which are not acknowledged.
            return backings.flush();
        }
        let _sync = backings.writing_pages();
        let Unlogged { pages, txg, taken, .. } = dirty.take_unlogged();
        let map: rustc_hash::FxHashMap<PageKey, Arc<Page>> = pages.iter().cloned().collect();
        // As before a txg: no L2 copy older than these pages may survive a
        // crash once they are on the backing store.
        if let Some(l2) = &self.l2 {
            l2.make_durable(&dirty.open_tickets());
        }
        match backings.write_pages(&map) {
            Ok(_) => {
                dirty.drop_clean(&pages);
                Ok(())
            }
            Err(e) => {
                dirty.give_back(taken, &[], txg);
                Err(e)
            }
        }
    }

    /// Frees the log chunks of txgs up to `synced`, whose pages are on the
    /// backing stores and flushed. Done before the txg counts as synced: a
    /// FLUSH that then finds those pages clean is answered at once, and a
    /// crash after that answer must not replay older chunks over them.
    pub(super) fn release(&self, dirty: &DirtySet, synced: u64) {
        let Some(log) = self.usable() else { return };
        if let Err(e) = log.release(synced) {
            self.fail(&e);
            // Pages logged since this txg began live only in the failed
            // log now: sync them at once.
            dirty.want_sync();
        }
    }

    /// After a txg synced: a failed log is emptied, so its old chunks
    /// cannot be replayed over newer data after a restart.
    pub(super) fn empty_if_failed(&self) {
        if self.usable().is_some() {
            return;
        }
        if let Some(log) = &self.log {
            if log.reset().is_ok() {
                info!("intent log {} emptied after its failure (it stays out of service)", log.name());
            }
        }
    }

    /// At a clean stop, with everything synced: empties the log and
    /// records the clean stop.
    pub(super) fn close(&self) {
        let Some(log) = self.usable() else { return };
        if let Err(e) = log.reset() {
            warn!("emptying the intent log at stop: {e} (it will be replayed at the next start)");
        } else if let Err(e) = log.close() {
            warn!("recording the intent log's clean stop: {e}");
        }
    }
}

/// Places `u`'s entries in the log, or (a commit bigger than a quarter of
/// the log is better synced) fails with `LogError::Full`.
fn collect_and_place(log: &Arc<IntentLog>, u: Unlogged) -> Option<Placed> {
    let Unlogged { mut entries, pages, txg, taken } = u;
    entries.extend(pages.iter().map(|(key, p)| Entry::Page {
        export: key_vol(*key),
        page: key_page(*key),
        mask: p.mask,
        data: p.packed(),
    }));
    if entries.is_empty() {
        return None;
    }
    let encoded = IntentLog::encoded_len(&entries);
    let chunks =
        if encoded > log.capacity() / 4 { Err(LogError::Full) } else { log.place_chunks(txg, &entries) };
    Some(Placed { chunks, pages, entries, encoded, txg, taken })
}
