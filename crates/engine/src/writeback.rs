//! Write-back: writes are acknowledged once dirty in RAM; a FLUSH makes
//! them durable in the intent log (or, without one, by writing the dirty
//! pages in place); a background thread writes each txg to the backing
//! stores in sorted, coalesced writes and then releases its log space.
//! The argument for why nothing acknowledged is lost is in
//! `docs/intent-log.md`.
//!
//! `WriteBack` puts together parts that each own one thing: the dirty set
//! (`dirty_set`), the throttle, the log committer (`log_commit`), the txg
//! syncer (`syncer`), the backing stores (`backings`), and the thread that
//! answers FLUSHes (`crate::committer`). None of them knows `Volume`; the
//! log's replay into volumes is `crate::replay`.
//!
//! Lock order: record locks (in `Volume`), then the backings' sync lock,
//! then the dirty set's lock, then the L2 index. The syncing thread takes
//! the sync lock then the dirty set's and never a record lock.

mod backings;
mod dirty_set;
mod log_commit;
mod stats;
mod syncer;
mod throttle;

use std::ops::Range;
use std::sync::Arc;

use arc_policy::Key;
use arcache_l2::L2Arc;
use blockdev::{DevError, DevResult};
use zil::IntentLog;

pub(crate) use backings::write_backing;
pub use backings::Backing;
pub(crate) use dirty_set::Change;
pub use stats::{WriteStats, WriteTunables, WriteView};

use crate::committer::{CommitDone, CommitFn, Committer};
use crate::dirty::{Page, PAGE};
use backings::Backings;
use dirty_set::DirtySet;
use log_commit::LogCommitter;
use syncer::{SyncParts, TxgSyncer};
use throttle::Throttle;

pub struct WriteBack {
    dirty: DirtySet,
    backings: Backings,
    throttle: Throttle,
    log: LogCommitter,
    syncer: TxgSyncer,
    committer: Committer,
    pub tunables: Arc<WriteTunables>,
    pub stats: Arc<WriteStats>,
}

impl WriteBack {
    pub fn new(
        log: Option<Arc<IntentLog>>,
        l2: Option<Arc<L2Arc>>,
        tunables: Arc<WriteTunables>,
    ) -> Arc<Self> {
        let stats = Arc::new(WriteStats::default());
        let t = &tunables;
        Arc::new(WriteBack {
            dirty: DirtySet::new(l2.clone(), Arc::clone(t), Arc::clone(&stats)),
            backings: Backings::new(Arc::clone(t)),
            throttle: Throttle::new(Arc::clone(t), Arc::clone(&stats)),
            log: LogCommitter::new(log, l2.clone(), Arc::clone(t), Arc::clone(&stats)),
            syncer: TxgSyncer::new(l2, Arc::clone(&stats)),
            committer: Committer::default(),
            tunables,
            stats,
        })
    }

    fn parts(&self) -> SyncParts<'_> {
        SyncParts { dirty: &self.dirty, backings: &self.backings, log: &self.log }
    }

    /// True when sync writes can go to a working intent log.
    pub(crate) fn has_log(&self) -> bool {
        self.log.usable().is_some()
    }

    /// The intent log, working or not (for its replay at start).
    pub(crate) fn intent_log(&self) -> Option<&Arc<IntentLog>> {
        self.log.log()
    }

    pub(crate) fn register(&self, vol: u16, backing: Backing) {
        self.backings.register(vol, backing);
    }

    /// Starts the thread that syncs txgs.
    pub fn spawn(self: &Arc<Self>) {
        let me = Arc::clone(self);
        self.syncer.spawn(move || me.syncer.run(me.parts()));
    }

    pub fn has_dirty(&self) -> bool {
        self.dirty.has_dirty()
    }

    /// True when a write now would be delayed or made to wait.
    pub(crate) fn would_throttle(&self) -> bool {
        self.throttle.would_throttle(&self.dirty)
    }

    /// Slows a writer down as dirty data grows, and makes it wait at the
    /// limit, as OpenZFS's write throttle does. Never fails.
    pub(crate) fn throttle(&self) {
        self.throttle.throttle(&self.dirty);
    }

    /// Adds written pages of export `vol` to the open txg. `records` are
    /// the record keys the write touches; their L2 copies are dropped now
    /// and durably before this txg reaches the backing store.
    pub(crate) fn put(&self, vol: u16, records: &[Key], pages: Vec<(u64, Page)>) {
        self.dirty.put(vol, records, pages);
    }

    /// The newest dirty bytes of one 512-byte sector, if any is dirty.
    pub(crate) fn sector(&self, vol: u16, offset: u64) -> Option<[u8; 512]> {
        self.dirty.sector(vol, offset)
    }

    /// The dirty pages over bytes `range` of export `vol`, oldest first,
    /// to lay over data read from a device. Take it before the read: a txg
    /// that finishes meanwhile has put the same bytes on the device.
    pub(crate) fn snapshot(&self, vol: u16, range: Range<u64>) -> Vec<(u64, Arc<Page>)> {
        self.dirty.snapshot(vol, range)
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
        let start = || -> CommitFn {
            let wb = Arc::downgrade(self);
            Box::new(move || match wb.upgrade() {
                Some(wb) => wb.commit_uncounted(),
                None => Err(DevError::Io {
                    op: "flush",
                    dev: "write-back".into(),
                    offset: 0,
                    len: 0,
                    source: std::io::Error::other("the write-back is gone"),
                }),
            })
        };
        self.committer.submit(start, done)?;
        self.stats.zil_commit_count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Makes every write put before this call durable: in the intent log
    /// when there is one that works, otherwise by writing the pages in place
    /// on the backing store (as a pool without SLOG writes its ZIL to its
    /// own disks). Concurrent callers share each step (group commit).
    pub fn commit(&self) -> DevResult<()> {
        self.stats.zil_commit_count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.commit_uncounted()
    }

    /// [`WriteBack::commit`] for callers counted already (a batch of
    /// asynchronous FLUSHes).
    fn commit_uncounted(&self) -> DevResult<()> {
        match self.log.commit(&self.dirty, &self.backings) {
            Some(res) => res,
            None => {
                self.stats.zil_txg_fallbacks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.sync_now()
            }
        }
    }

    /// Syncs every txg up to the open one and waits for it.
    pub fn sync_now(&self) -> DevResult<()> {
        self.syncer.sync_now(self.parts())
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
        let _sync = self.backings.changing_directly();
        self.dirty.apply_change(vol, records, range, change, self.log.usable().is_some());
        op()
    }

    /// Syncs everything dirty, with a progress line, and stops the thread.
    /// The log is emptied when all went well.
    pub fn shutdown(&self) -> DevResult<()> {
        let mut result = Ok(());
        for attempt in 0..3 {
            let dirty = self.dirty.bytes();
            if dirty == 0 && attempt > 0 {
                break;
            }
            if dirty > 0 {
                tracing::info!(
                    "syncing {:.1} MiB of dirty data to the backing stores",
                    dirty as f64 / (1 << 20) as f64
                );
            }
            result = self.sync_now();
            if result.is_ok() {
                break;
            }
        }
        self.syncer.stop(&self.dirty);
        self.committer.stop();
        if result.is_ok() {
            self.log.close();
        }
        result
    }

    pub fn view(&self) -> WriteView {
        let s = &*self.stats;
        let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        let mut v = WriteView {
            dirty_max: load(&self.tunables.dirty_data_max),
            txg_syncs: load(&s.txg_syncs),
            txg_sync_bytes: load(&s.txg_sync_bytes),
            txg_sync_errors: load(&s.txg_sync_errors),
            txg_last_sync_ms: load(&s.txg_last_sync_ms),
            zil_present: u64::from(self.log.log().is_some()),
            zil_degraded: u64::from(self.log.degraded()),
            zil_commit_count: load(&s.zil_commit_count),
            zil_commit_writer_count: load(&s.zil_commit_writer_count),
            zil_itx_count: load(&s.zil_itx_count),
            zil_log_bytes: load(&s.zil_log_bytes),
            zil_log_errors: load(&s.zil_log_errors),
            zil_commit_us: load(&s.zil_log_write_ns) / 1000 / load(&s.zil_commit_writer_count).max(1),
            zil_txg_fallbacks: load(&s.zil_txg_fallbacks),
            zil_log_used: self.log.log().map_or(0, |l| l.used()),
            zil_log_capacity: self.log.log().map_or(0, |l| l.capacity()),
            zil_replay_records: load(&s.zil_replay_records),
            zil_replay_bytes: load(&s.zil_replay_bytes),
            throttle_delays: load(&s.throttle_delays),
            throttle_delay_ms: load(&s.throttle_delay_ns) / 1_000_000,
            throttle_waits: load(&s.throttle_waits),
            write_bytes: load(&s.written_bytes),
            ..WriteView::default()
        };
        self.dirty.view(&mut v);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn queued_flushes_are_answered_and_after_stop_given_back() {
        let wb = WriteBack::new(None, None, Arc::new(WriteTunables::default()));
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..10 {
            let tx = tx.clone();
            let done: CommitDone = Box::new(move |r, _| {
                let _ = tx.send(r.is_ok());
            });
            assert!(wb.commit_async(done).is_ok());
        }
        for _ in 0..10 {
            assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok(true));
        }
        assert_eq!(wb.view().zil_commit_count, 10, "each FLUSH counted once");
        wb.shutdown().expect("shutdown");
        assert!(wb.commit_async(Box::new(|_, _| {})).is_err(), "given back after stop");
    }
}
