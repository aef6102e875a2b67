//! Deferred opens: a read-only open of a file inotify vouches for is
//! answered from the cache, and SOURCE's file is opened after the reply.
//!
//! Every open used to go to SOURCE for a descriptor, and on a SOURCE whose
//! own caches are cold each waited for an inode read: a copy out of a warm
//! view spent most of its time there (bench/results/fileview-rsync-in.md).
//! When inotify vouches for the file (docs/fileview.md, "inotify": no event
//! came for it since the view checked it), the open's own check would find
//! what the view has, so the reply needs nothing from SOURCE. The file is
//! then opened in the background by a few binder threads, or by the first
//! request that needs SOURCE (a record not cached, a revalidation),
//! whichever comes first. The binder installs the descriptor only if it is
//! the very file and version the open granted; anything else is left to
//! the request, which checks as an open would (`View::bind_deferred`).

use std::fs::File;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use crate::records::{Attr, Fingerprint};
use crate::sys::At;
use crate::{Handle, ViewStats};

/// How a deferred open reaches its file: the name as the open found it.
pub(crate) struct Deferred {
    pub at: At,
    pub flags: i32,
    /// The version the open was answered for.
    pub granted: Fingerprint,
}

impl Deferred {
    /// SOURCE's file under the name and what it is now.
    pub(crate) fn open(&self) -> std::io::Result<(File, Attr)> {
        let file = File::from(self.at.open(self.flags, 0)?);
        let a = Attr::from_metadata(&file.metadata()?);
        Ok((file, a))
    }
}

/// Binder threads started at the first deferred open; they end when the
/// view goes (its sender dropped).
#[derive(Default)]
pub(crate) struct Binder {
    tx: Mutex<Option<Sender<Weak<Handle>>>>,
}

/// Threads opening deferred files side by side: a copy's opens come one
/// after another, and each binding waits for one inode read.
const THREADS: usize = 8;

impl Binder {
    /// Has `h`'s file opened in the background.
    pub(crate) fn bind_later(&self, h: &Arc<Handle>, stats: &Arc<ViewStats>) {
        let mut tx = self.tx.lock();
        if tx.is_none() {
            *tx = start(stats);
        }
        if let Some(t) = tx.as_ref() {
            // A binder gone leaves the binding to the first request.
            let _ = t.send(Arc::downgrade(h));
        }
    }
}

fn start(stats: &Arc<ViewStats>) -> Option<Sender<Weak<Handle>>> {
    let (tx, rx) = channel::<Weak<Handle>>();
    let rx = Arc::new(Mutex::new(rx));
    let mut started = 0;
    for _ in 0..THREADS {
        let (rx, stats) = (Arc::clone(&rx), Arc::clone(stats));
        let spawned =
            std::thread::Builder::new().name("fileview-binder".into()).spawn(move || serve(&rx, &stats));
        match spawned {
            Ok(_) => started += 1,
            Err(e) => tracing::debug!("binder not started: {e}"),
        }
    }
    (started > 0).then_some(tx)
}

fn serve(rx: &Mutex<Receiver<Weak<Handle>>>, stats: &ViewStats) {
    loop {
        let next = rx.lock().recv();
        let Ok(weak) = next else { return };
        // Released meanwhile: nothing to bind.
        let Some(h) = weak.upgrade() else { continue };
        if bind_if_granted(&h) {
            stats.deferred_binds.fetch_add(1, Relaxed);
        }
    }
}

/// Opens `h`'s file and installs it if it is the file and version the
/// open granted. Whether it did.
fn bind_if_granted(h: &Handle) -> bool {
    // A race test holds the binder here (a fault-test build only).
    fail::fail_point!("view.deferred.bind");
    let Some(d) = &h.deferred else { return false };
    if h.file.get().is_some() {
        return false;
    }
    let Ok((file, a)) = d.open() else { return false };
    if !h.obj.is_known(&a) || a.fingerprint() != d.granted {
        return false;
    }
    h.file.set(Ok(file)).is_ok()
}
