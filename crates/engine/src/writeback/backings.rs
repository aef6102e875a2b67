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
    /// Where its writes are counted (`backing_writes`, `backing_write_bytes`).
    pub cache: Arc<crate::cache::Cache>,
}

/// Writes the backing store: the fail point `backing.write` in fault-test
/// builds (client write-through and txg syncs alike).
pub(crate) fn write_backing(dev: &dyn BlockDev, data: &[u8], offset: u64) -> DevResult<()> {
    injected_write_error(offset)?;
    dev.write_at(data, offset)
}

#[cfg_attr(not(feature = "failpoints"), allow(unused_variables))]
fn injected_write_error(offset: u64) -> DevResult<()> {
    fail::fail_point!("backing.write", |_| blockdev::injected("backing.write", offset));
    Ok(())
}

/// What one txg writer writes in one go: an extent, or every part of one
/// write unit of a store that has one ([`BlockDev::write_unit`]).
struct Group<'e> {
    vol: u16,
    parts: Vec<(u64, &'e [u8])>,
}

/// The txg's extents as groups: one per extent, except that extents of a
/// store with a write unit are cut at unit boundaries and gathered per
/// unit, so such a store writes each unit it changes once per txg.
fn group_by_unit(extents: &[dirty::Extent], unit_of: impl Fn(u16) -> Option<u64>) -> Vec<Group<'_>> {
    let mut out: Vec<Group<'_>> = Vec::new();
    let mut open: Option<(u16, u64)> = None;
    for e in extents {
        let Some(unit) = unit_of(e.vol).filter(|&u| u > 0) else {
            out.push(Group { vol: e.vol, parts: vec![(e.offset, &e.data[..])] });
            open = None;
            continue;
        };
        let mut at = 0usize;
        while at < e.data.len() {
            let offset = e.offset + at as u64;
            let index = offset / unit;
            let n = ((index + 1) * unit - offset).min((e.data.len() - at) as u64) as usize;
            let part = (offset, &e.data[at..at + n]);
            // Extents come sorted by export and offset, so a unit's parts
            // are next to each other.
            match out.last_mut() {
                Some(g) if open == Some((e.vol, index)) => g.parts.push(part),
                _ => out.push(Group { vol: e.vol, parts: vec![part] }),
            }
            open = Some((e.vol, index));
            at += n;
        }
    }
    out
}

/// Writes one group, with the fail point `backing.write` as
/// [`write_backing`] has it.
fn write_group(dev: &dyn BlockDev, parts: &[(u64, &[u8])]) -> DevResult<()> {
    match parts {
        [(offset, data)] => write_backing(dev, data, *offset),
        _ => {
            injected_write_error(parts.first().map_or(0, |p| p.0))?;
            dev.write_parts(parts)
        }
    }
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
        let unit_of =
            |v: u16| backings.get(v as usize).and_then(|b| b.as_ref()).and_then(|b| b.dev.write_unit());
        let groups = group_by_unit(&extents, unit_of);
        // The next extent to claim: handed between the writers, so
        // arcache-sync's (shuttle switches threads at each claim).
        let next = AtomicU64::new(0);
        let first_error: Mutex<Option<DevError>> = Mutex::new(None);
        let workers = (self.tunables.sync_writers.load(Relaxed).clamp(1, 64) as usize).min(groups.len());
        arcache_sync::thread::scope(|s| {
            for _ in 0..workers {
                s.spawn(|| loop {
                    let i = next.fetch_add(1, Relaxed) as usize;
                    let Some(g) = groups.get(i) else { return };
                    let Some(b) = backings.get(g.vol as usize).and_then(|b| b.as_ref()) else { continue };
                    if let Err(err) = write_group(b.dev.as_ref(), &g.parts) {
                        b.cache.count_backing_error();
                        first_error.lock().get_or_insert(err);
                        return;
                    }
                    // One write of the store per group (a unit's parts are
                    // one PUT), as write-through counts one per write.
                    b.cache.count_backing_write(g.parts.iter().map(|p| p.1.len() as u64).sum());
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
                b.dev.flush().inspect_err(|_| b.cache.count_backing_error())?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(vol: u16, offset: u64, len: usize) -> dirty::Extent {
        dirty::Extent { vol, offset, data: vec![vol as u8; len] }
    }

    #[test]
    fn extents_are_cut_and_gathered_per_unit_only_where_the_store_has_one() {
        // Export 0 has 4 KiB units, export 1 none.
        let extents =
            [ex(0, 512, 1024), ex(0, 3584, 1024), ex(0, 6144, 512), ex(0, 20480, 512), ex(1, 0, 9000)];
        let groups = group_by_unit(&extents, |v| (v == 0).then_some(4096));
        let shape: Vec<(u16, Vec<(u64, usize)>)> =
            groups.iter().map(|g| (g.vol, g.parts.iter().map(|p| (p.0, p.1.len())).collect())).collect();
        assert_eq!(
            shape,
            vec![
                (0, vec![(512, 1024), (3584, 512)]),
                (0, vec![(4096, 512), (6144, 512)]),
                (0, vec![(20480, 512)]),
                (1, vec![(0, 9000)]),
            ]
        );
    }
}
