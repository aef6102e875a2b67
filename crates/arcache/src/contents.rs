//! Lets a writer of a chunked S3 disk or a live RBD image keep its
//! persistent L2 across a clean restart (docs/persistence.md, "A writer's
//! own changes"): while it serves, the L2 is bound to nothing any store can
//! hold, and at a clean stop, once every change has reached the store, to
//! what the store holds then. Another server's change still discards it,
//! and so does a crash. A reader of a chunked S3 disk that followed its
//! writer is bound again at a clean stop the same way (its first change
//! unbound it, `arcache_engine`'s `volume/changes.rs`).

use std::sync::Arc;

use arcache_l2::format::table_name;
use arcache_l2::{ExportDesc, L2Arc};
use blockdev::BlockDev;

/// The fingerprint of what `dev` holds now, as the L2 binds it.
pub(crate) fn contents_of(dev: &dyn BlockDev) -> u64 {
    xxhash_rust::xxh3::xxh3_64(dev.contents_identity().as_bytes())
}

/// The exports whose binding moves, on stores whose contents identity is
/// more than their identity: written by this server, or read while
/// another server may write them.
pub(crate) struct Follower {
    l2: Arc<L2Arc>,
    exports: Vec<(u16, Arc<dyn BlockDev>)>,
    /// Of `exports`, those this server writes.
    writers: Vec<u16>,
}

impl Follower {
    /// None when there is nothing to follow. `descs` are the exports as
    /// the L2 was opened with them, one per device in `devices`.
    pub(crate) fn new(
        l2: &Arc<L2Arc>,
        descs: &[ExportDesc],
        devices: &[Arc<dyn BlockDev>],
    ) -> Option<Follower> {
        // Exports sharing one table entry (names alike in the bytes it
        // keeps) would bind it in turn, each to its own store's state.
        let shared =
            |d: &ExportDesc| descs.iter().filter(|o| table_name(&o.name) == table_name(&d.name)).count() > 1;
        let exports: Vec<_> = descs
            .iter()
            .zip(devices)
            .filter(|(d, _)| d.contents != d.identity && !shared(d))
            .map(|(d, dev)| (d.id, Arc::clone(dev)))
            .collect();
        if exports.is_empty() || !(0..l2.devices().len()).any(|d| l2.is_persistent(d)) {
            return None;
        }
        let writers = exports.iter().filter(|(_, dev)| !dev.is_read_only()).map(|(id, _)| *id).collect();
        Some(Follower { l2: Arc::clone(l2), exports, writers })
    }

    /// Before the first change reaches any followed store (the intent
    /// log's replay included): from here until [`Follower::bind`], a crash
    /// leaves the records bound to a value no store holds. Binding them as
    /// the store changes instead would restore, after a crash between a
    /// change and its binding, records newer than a store another server
    /// then put back as it was (a chunk zeroed again has its old ETags).
    pub(crate) fn unbind(&self) {
        for id in &self.writers {
            self.l2.unbind_contents(*id);
        }
    }

    /// At a clean stop, after the last change reached the stores, and
    /// once readers stopped following theirs (`BlockDev::stop_watching`):
    /// a reader's store answers a value no store holds while a change it
    /// took is not yet dropped from the cache. Binding a reader that saw
    /// no change writes nothing (the value is the one it has).
    pub(crate) fn bind(&self) {
        for (id, dev) in &self.exports {
            self.l2.rebind_contents(*id, contents_of(dev.as_ref()));
        }
    }
}
