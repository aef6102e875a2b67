//! A write's hold on the records it changes, taken once and given back in
//! one place.
//!
//! The order that keeps a stale copy from ever being served is: take the
//! records' locks; keep the L2 feed off them and drop their L2 copies
//! (durably) before anything changes; change the backing store or the
//! dirty set, then the cached records; let the feed back in; release the
//! locks. Every write path used to spell that out itself, and the last
//! stale-copy bug was a path that had it in the wrong order. Here the
//! guard owns the locks and the L2 hold, and its drop ends the hold before
//! the locks go.

use std::ops::Range;

use arc_policy::Key;
use arcache_sync::atomic::{AtomicU64, Ordering::SeqCst};
use arcache_sync::MutexGuard;

use super::Volume;
use crate::cache::Cache;

pub(crate) struct RecordWrite<'v> {
    cache: &'v Cache,
    records: Range<u64>,
    keys: Vec<Key>,
    l2_held: bool,
    /// The write counts of the locked stripes, odd while this guard lives
    /// (see `Stripe`).
    writes: Vec<&'v AtomicU64>,
    // Dropped after `Drop::drop` has ended the L2 hold.
    _locks: Vec<MutexGuard<'v, ()>>,
}

impl<'v> RecordWrite<'v> {
    /// Drops the records' L2 copies, durably, and keeps the feed off them:
    /// for a change that reaches the backing store now.
    pub(crate) fn drop_l2_copies(&mut self) {
        assert!(!self.l2_held, "the L2 hold is taken once");
        self.cache.begin_write(&self.keys);
        self.l2_held = true;
    }

    /// Keeps the feed off the records: for a change into dirty RAM, whose
    /// `WriteBack::put` drops the L2 copies itself (deferred to the txg).
    pub(crate) fn hold_off_feed(&mut self) {
        assert!(!self.l2_held, "the L2 hold is taken once");
        self.cache.hold_off_feed(&self.keys);
        self.l2_held = true;
    }

    pub(crate) fn keys(&self) -> &[Key] {
        &self.keys
    }

    pub(crate) fn records(&self) -> Range<u64> {
        self.records.clone()
    }

    /// Whether cached records may change now: only with the L2 kept off,
    /// or the feed could copy a record while it changes, or copy the old
    /// one after the write is acknowledged.
    pub(crate) fn may_change_cache(&self) -> bool {
        self.l2_held
    }
}

impl Drop for RecordWrite<'_> {
    fn drop(&mut self) {
        if self.l2_held {
            self.cache.end_write(&self.keys);
        }
        // Before the locks go: a ring read that takes one then sees the
        // count even again, but not the one it started with.
        for w in &self.writes {
            w.fetch_add(1, SeqCst);
        }
    }
}

impl Volume {
    /// Locks records `rs` for a write (ascending stripe order, as every
    /// path takes them, so two writes never wait on each other in a cycle).
    pub(crate) fn write_guard(&self, rs: Range<u64>) -> RecordWrite<'_> {
        let locks = self.lock_records(rs.clone());
        self.guard_with(rs, locks)
    }

    /// As [`Volume::write_guard`], or `None` at once if a lock is busy.
    pub(crate) fn try_write_guard(&self, rs: Range<u64>) -> Option<RecordWrite<'_>> {
        let locks = self.try_lock_records(rs.clone())?;
        Some(self.guard_with(rs, locks))
    }

    fn guard_with<'v>(&'v self, rs: Range<u64>, locks: Vec<MutexGuard<'v, ()>>) -> RecordWrite<'v> {
        let keys = rs.clone().map(|r| self.key(r)).collect();
        let writes: Vec<&AtomicU64> =
            self.stripes_of(rs.clone()).into_iter().map(|i| &self.stripes[i].writes).collect();
        for w in &writes {
            w.fetch_add(1, SeqCst);
        }
        RecordWrite { cache: &self.cache, records: rs, keys, l2_held: false, writes, _locks: locks }
    }
}
