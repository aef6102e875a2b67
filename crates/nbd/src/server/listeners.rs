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

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{ErrorKind, Read};
    use std::os::unix::net::{UnixListener, UnixStream};
    use std::time::Duration;

    /// What a client's read sees within 5 s: `Ok(0)` at its end, an error
    /// for a reset, `TimedOut`/`WouldBlock` if it was left waiting.
    fn read_outcome(client: &mut UnixStream) -> std::io::Result<usize> {
        client.set_read_timeout(Some(Duration::from_secs(5)))?;
        client.read(&mut [0u8; 1])
    }

    fn left_waiting(r: &std::io::Result<usize>) -> bool {
        matches!(r, Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut))
    }

    /// A client queued in the backlog, never accepted, is let go once the
    /// accepting side's own descriptor closes after `close_all`: our kept
    /// duplicate must not hold the socket open.
    #[test]
    fn a_queued_client_is_let_go_once_the_accepting_side_closes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let listener = UnixListener::bind(&path).unwrap();
        let kept = Listeners::default();
        kept.keep(listener.try_clone().unwrap().into());
        let mut queued = UnixStream::connect(&path).unwrap();
        kept.close_all();
        drop(listener); // as the accepting thread does once woken
        let r = read_outcome(&mut queued);
        assert!(!left_waiting(&r), "the queued client was left waiting: {r:?}");
    }

    /// A socket kept after `close_all` (a listener added to a server already
    /// shut down, a session accepted in the moment before) is shut at once.
    #[test]
    fn sockets_kept_after_close_all_are_shut_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s");
        let kept = Arc::new(Listeners::default());
        kept.close_all();
        let listener = UnixListener::bind(&path).unwrap();
        kept.keep(listener.try_clone().unwrap().into());
        assert!(UnixStream::connect(&path).is_err(), "a listener kept after close_all still takes clients");
        let (mut client, server_end) = UnixStream::pair().unwrap();
        let slot = kept.keep_session(server_end.try_clone().unwrap().into());
        assert_eq!(read_outcome(&mut client).unwrap(), 0, "a session kept after close_all was not ended");
        drop(slot);
        assert!(kept.kept.lock().sessions.is_empty(), "a dropped slot forgets its session");
    }
}
