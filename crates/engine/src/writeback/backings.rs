//! The backing stores the write path writes to, by export id, and the lock
//! that keeps writes of dirty pages apart from changes applied straight to
//! a backing store.

use std::sync::Arc;

use arcache_sync::atomic::{AtomicU64, Ordering::Relaxed};
use arcache_sync::{Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use blockdev::{BlockDev, DevError, DevResult};
use rustc_hash::FxHashMap;

use super::stats::WriteTunables;
use crate::dirty::{self, Page, PageKey};

/// A backing store the write path writes to, by export id.
#[derive(Clone)]
pub struct Backing {
    pub dev: Arc<dyn BlockDev>,
    pub size: u64,
}

/// Writes the backing store: the fail point `backing.write` in fault-test
/// builds (client write-through and txg syncs alike).
pub(crate) fn write_backing(dev: &dyn BlockDev, data: &[u8], offset: u64) -> DevResult<()> {
    fail::fail_point!("backing.write", |_| blockdev::injected("backing.write", offset));
    dev.write_at(data, offset)
}

pub(super) struct Backings {
    list: RwLock<Vec<Option<Backing>>>,
    /// Held exclusively while pages are written where they belong (a txg,
    /// an in-place commit), shared by changes applied straight to a backing
    /// store (trims, zeroings, write-through), which must not interleave
    /// with those writes.
    sync_lock: RwLock<()>,
    tunables: Arc<WriteTunables>,
}

impl Backings {
    pub(super) fn new(tunables: Arc<WriteTunables>) -> Self {
        Backings { list: RwLock::new(Vec::new()), sync_lock: RwLock::new(()), tunables }
    }

    pub(super) fn register(&self, vol: u16, backing: Backing) {
        let mut b = self.list.write();
        if b.len() <= vol as usize {
            b.resize(vol as usize + 1, None);
        }
        b[vol as usize] = Some(backing);
    }

    /// Taken by whoever writes dirty pages where they belong.
    pub(super) fn writing_pages(&self) -> RwLockWriteGuard<'_, ()> {
        self.sync_lock.write()
    }

    /// Taken by a change applied straight to a backing store.
    pub(super) fn changing_directly(&self) -> RwLockReadGuard<'_, ()> {
        self.sync_lock.read()
    }

    /// Writes `pages` in parallel and flushes every backing store; the
    /// bytes written.
    pub(super) fn write_pages(&self, pages: &FxHashMap<PageKey, Arc<Page>>) -> DevResult<u64> {
        let backings = self.list.read().clone();
        let size_of = |v: u16| backings.get(v as usize).and_then(|b| b.as_ref()).map_or(0, |b| b.size);
        let extents = dirty::extents(pages, size_of);
        let bytes: u64 = extents.iter().map(|e| e.data.len() as u64).sum();
        // The next extent to claim: handed between the writers, so
        // arcache-sync's (shuttle switches threads at each claim).
        let next = AtomicU64::new(0);
        let first_error: Mutex<Option<DevError>> = Mutex::new(None);
        let workers = (self.tunables.sync_writers.load(Relaxed).clamp(1, 64) as usize).min(extents.len());
        arcache_sync::thread::scope(|s| {
            for _ in 0..workers {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Relaxed) as usize;
                    let Some(e) = extents.get(i) else { return };
                    let Some(b) = backings.get(e.vol as usize).and_then(|b| b.as_ref()) else { continue };
                    if let Err(err) = write_backing(b.dev.as_ref(), &e.data, e.offset) {
                        first_error.lock().get_or_insert(err);
                        return;
                    }
                });
            }
        });
        if let Some(e) = first_error.into_inner() {
            return Err(e);
        }
        self.flush()?;
        Ok(bytes)
    }

    /// Flushes every backing store that takes writes.
    pub(super) fn flush(&self) -> DevResult<()> {
        let backings = self.list.read().clone();
        for b in backings.iter().flatten() {
            if !b.dev.is_read_only() {
                b.dev.flush()?;
            }
        }
        Ok(())
    }
}
