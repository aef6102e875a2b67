//! The txg syncer: a background thread that writes each transaction group
//! to the backing stores in sorted, coalesced, parallel writes, flushes
//! them, and then releases the intent-log space the txg covered.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use arcache_l2::L2Arc;
use arcache_sync::Mutex;
use blockdev::DevResult;
use tracing::warn;

use super::backings::Backings;
use super::dirty_set::DirtySet;
use super::log_commit::{sync_error, LogCommitter};
use super::stats::WriteStats;

/// The parts of the write path a sync works on.
#[derive(Clone, Copy)]
pub(super) struct SyncParts<'a> {
    pub dirty: &'a DirtySet,
    pub backings: &'a Backings,
    pub log: &'a LogCommitter,
}

pub(super) struct TxgSyncer {
    l2: Option<Arc<L2Arc>>,
    stats: Arc<WriteStats>,
    thread: Mutex<Option<arcache_sync::thread::JoinHandle<()>>>,
}

impl TxgSyncer {
    pub(super) fn new(l2: Option<Arc<L2Arc>>, stats: Arc<WriteStats>) -> Self {
        TxgSyncer { l2, stats, thread: Mutex::new(None) }
    }

    /// Starts the thread, which runs `run` (the write-back's sync loop).
    pub(super) fn spawn(&self, run: impl FnOnce() + Send + 'static) {
        match arcache_sync::thread::Builder::new().name("txg-sync".into()).spawn(run) {
            Ok(h) => *self.thread.lock() = Some(h),
            Err(e) => warn!("cannot start the txg sync thread ({e}); every FLUSH will sync"),
        }
    }

    /// The thread's loop: a txg each time one is due, until stopped.
    pub(super) fn run(&self, p: SyncParts<'_>) {
        while p.dirty.wait_for_txg(&|| p.log.pressed()) {
            self.sync_one(p);
        }
    }

    /// Syncs every txg up to the open one and waits for it (on this thread
    /// when there is no sync thread).
    pub(super) fn sync_now(&self, p: SyncParts<'_>) -> DevResult<()> {
        let target = p.dirty.want_sync();
        if self.thread.lock().is_none() {
            self.sync_one(p);
        }
        if p.dirty.wait_synced(target) {
            Ok(())
        } else {
            Err(sync_error(format!("transaction group {target} could not be written to the backing store")))
        }
    }

    /// Lets the thread end and waits for it.
    pub(super) fn stop(&self, dirty: &DirtySet) {
        dirty.stop();
        if let Some(h) = self.thread.lock().take() {
            let _ = h.join();
        }
    }

    /// Writes the open txg to the backing stores, flushes them and releases
    /// the log space it covered.
    fn sync_one(&self, p: SyncParts<'_>) {
        let _sync = p.backings.writing_pages();
        let started = Instant::now();
        let txg = p.dirty.begin_sync();
        if let Some(l2) = &self.l2 {
            l2.make_durable(&txg.tickets);
        }
        let res = p.backings.write_pages(txg.pages());
        match &res {
            Ok(_) => p.log.release(p.dirty, txg.number),
            Err(e) => warn!(
                "transaction group {} could not be synced: {e}; its data stays dirty and is retried",
                txg.number
            ),
        }
        let s = &self.stats;
        match res {
            Ok(bytes) => {
                s.txg_syncs.fetch_add(1, Relaxed);
                s.txg_sync_bytes.fetch_add(bytes, Relaxed);
                s.txg_last_sync_ms.store(started.elapsed().as_millis() as u64, Relaxed);
            }
            Err(_) => {
                s.txg_sync_errors.fetch_add(1, Relaxed);
            }
        }
        if p.dirty.end_sync(&txg, res.is_ok()) {
            p.log.empty_if_failed();
        }
    }
}
