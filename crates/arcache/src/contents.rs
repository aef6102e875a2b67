//! Keeps each written export's persistent L2 records bound to what its
//! store holds as this server changes it, so a writer of a chunked S3 disk
//! or a live RBD image keeps its L2 across restarts (docs/persistence.md,
//! "A writer's own changes"); any other server's change still discards it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use arcache_l2::L2Arc;
use blockdev::BlockDev;

/// How often the binding catches up: a crash loses the L2 of changes made
/// since the last one, never more.
const EVERY: Duration = Duration::from_secs(1);

/// The fingerprint of what `dev` holds now, as the L2 binds it.
pub(crate) fn contents_of(dev: &dyn BlockDev) -> u64 {
    xxhash_rust::xxh3::xxh3_64(dev.contents_identity().as_bytes())
}

/// The exports whose binding may move: written by this server, on stores
/// whose contents identity is more than their identity.
pub(crate) struct Follower {
    l2: Arc<L2Arc>,
    exports: Vec<(u16, Arc<dyn BlockDev>)>,
}

impl Follower {
    /// None when there is nothing to follow.
    pub(crate) fn new(l2: &Arc<L2Arc>, exports: Vec<(u16, Arc<dyn BlockDev>)>) -> Option<Follower> {
        let exports: Vec<_> = exports
            .into_iter()
            .filter(|(_, dev)| !dev.is_read_only() && dev.contents_identity() != dev.identity())
            .collect();
        if exports.is_empty() || !(0..l2.devices().len()).any(|d| l2.is_persistent(d)) {
            return None;
        }
        Some(Follower { l2: Arc::clone(l2), exports })
    }

    /// Binds every followed export to what its store holds now.
    pub(crate) fn bind(&self) {
        for (id, dev) in &self.exports {
            self.l2.rebind_contents(*id, contents_of(dev.as_ref()));
        }
    }

    /// Binds every [`EVERY`] until `stop`; returns self for the last
    /// binding at a clean stop.
    pub(crate) fn spawn(self, stop: Arc<AtomicBool>) -> std::io::Result<JoinHandle<Follower>> {
        std::thread::Builder::new().name("l2-contents".into()).spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(EVERY);
                self.bind();
            }
            self
        })
    }
}
