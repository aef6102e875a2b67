//! The sockets a server listens on, and the sessions it holds open, kept so
//! that its shutdown can end the threads blocked on them: each such thread
//! holds what the server serves, so a server shut down and dropped is freed
//! only once they all return. Not tied to NBD: any accept loop can use it.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

use parking_lot::Mutex;
use tracing::warn;

#[derive(Default)]
pub struct Listeners {
    kept: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    listening: Vec<OwnedFd>,
    sessions: HashMap<u64, OwnedFd>,
    next_session: u64,
    closed: bool,
}

/// A session's place among the kept sockets; leaving it (the session
/// ended) forgets the socket.
pub struct SessionSlot {
    owner: Arc<Listeners>,
    id: u64,
}

impl Drop for SessionSlot {
    fn drop(&mut self) {
        self.owner.kept.lock().sessions.remove(&self.id);
    }
}

impl Listeners {
    /// Keeps a duplicate of a listening socket's descriptor (the same
    /// socket: `shutdown` on it reaches the accepting thread's copy). A
    /// socket given after `close_all` is shut at once.
    pub fn keep(&self, listening: OwnedFd) {
        let mut kept = self.kept.lock();
        if kept.closed {
            shut(&listening);
        } else {
            kept.listening.push(listening);
        }
    }

    /// Keeps a duplicate of a session's socket until the slot is dropped,
    /// so `close_all` can end a session blocked reading its client. A
    /// session begun after `close_all` is shut at once.
    pub fn keep_session(self: &Arc<Self>, session: OwnedFd) -> SessionSlot {
        let mut kept = self.kept.lock();
        if kept.closed {
            shut(&session);
        }
        let id = kept.next_session;
        kept.next_session += 1;
        kept.sessions.insert(id, session);
        SessionSlot { owner: Arc::clone(self), id }
    }

    /// Shuts every listening socket and session: a thread blocked in
    /// `accept` returns an error (EINVAL on Linux, unix and TCP alike), one
    /// blocked reading a session reads its end. Our duplicates of the
    /// listening sockets are closed too, so once the accepting threads have
    /// gone, clients still queued in a unix socket's backlog are reset
    /// rather than left waiting while the owner lives.
    pub fn close_all(&self) {
        let mut kept = self.kept.lock();
        kept.closed = true;
        for fd in kept.listening.drain(..) {
            shut(&fd);
        }
        for fd in kept.sessions.values() {
            shut(fd);
        }
    }

    /// Whether `close_all` was called: an accept loop that sees an error
    /// (or a connection accepted in the moment before) ends when it is.
    pub fn closed(&self) -> bool {
        self.kept.lock().closed
    }
}

fn shut(fd: &OwnedFd) {
    // SAFETY: `fd` is an open descriptor its owner keeps open for the call;
    // shutdown(2) reads nothing from memory.
    if unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_RDWR) } != 0 {
        let e = std::io::Error::last_os_error();
        // A session its client already closed is not connected any more.
        if e.raw_os_error() != Some(libc::ENOTCONN) {
            warn!("shutting a socket: {e}");
        }
    }
}
