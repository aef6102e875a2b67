//! A store another server changes underneath (a read-only server of a
//! chunked S3 disk following its writer, docs/s3-backing.md): the store
//! tells the volume what changed, and the volume drops every cached copy
//! of it, in RAM and on L2, as a write would, so no old byte is served
//! again or comes back after a restart.

use std::sync::{Arc, Once, Weak};

use arcache_sync::atomic::Ordering::Relaxed;
use blockdev::ChangeWatcher;

use super::Volume;

struct Watcher {
    vol: Weak<Volume>,
    /// One unbinding, however often the store calls; a second caller waits
    /// for the first's to be durable.
    unbound: Once,
}

impl ChangeWatcher for Watcher {
    /// The persistent L2 vouches for the store as it was when this server
    /// opened it; from the first change on, nothing it holds of this
    /// export is restored after a crash (a clean stop binds it again to
    /// what the store then says it holds, docs/persistence.md).
    fn before_first_change(&self) {
        self.unbound.call_once(|| {
            let Some(vol) = self.vol.upgrade() else { return };
            if let Some(l2) = vol.cache.l2() {
                l2.unbind_contents(vol.id);
            }
        });
    }

    fn changed(&self, offset: u64, len: u64) {
        if let Some(vol) = self.vol.upgrade() {
            vol.drop_changed(offset, len);
        }
    }
}

impl Volume {
    /// Hands the store this volume as the one to tell what changed.
    pub(super) fn watch_store(self: &Arc<Volume>) {
        self.dev.watch_changes(Arc::new(Watcher { vol: Arc::downgrade(self), unbound: Once::new() }));
    }

    /// Drops every cached record touching `[offset, offset + len)`, under
    /// the records' locks as a write takes them: a fill that read the old
    /// bytes before is dropped after it inserts, and one that starts after
    /// reads what the store now says. Their L2 copies get INVALIDATE
    /// entries made durable first, as for a write.
    pub fn drop_changed(&self, offset: u64, len: u64) {
        let end = offset.saturating_add(len).min(self.size);
        if offset >= end {
            return;
        }
        self.counts.store_changes.fetch_add(1, Relaxed);
        self.counts.store_changed_bytes.fetch_add(end - offset, Relaxed);
        // The store has changed already: nothing to do but drop.
        let _ = self.drop_records_around(offset, end - offset, |_, _| Ok(()));
    }
}
