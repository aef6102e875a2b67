//! The sockets a server listens on, kept so that `Server::shutdown` can
//! wake the threads blocked in `accept`. Without it those threads, each
//! holding the server, waited for a client that never came: an embedder
//! that shut a server down and dropped it kept its workers, exports and
//! whatever those held until the process ended.

use std::os::fd::{AsRawFd, OwnedFd};

use parking_lot::Mutex;
use tracing::warn;

#[derive(Default)]
pub(super) struct Listeners {
    kept: Mutex<Kept>,
}

#[derive(Default)]
struct Kept {
    fds: Vec<OwnedFd>,
    closed: bool,
}

impl Listeners {
    /// Keeps a duplicate of a listening socket's descriptor (the same
    /// socket; `shutdown` on it reaches the accepting thread's copy). A
    /// socket given after `close_all` is shut at once.
    pub(super) fn keep(&self, fd: std::io::Result<OwnedFd>) {
        let fd = match fd {
            Ok(fd) => fd,
            Err(e) => {
                warn!("cannot keep the listening socket (shutdown will not wake its accept): {e}");
                return;
            }
        };
        let mut kept = self.kept.lock();
        if kept.closed {
            shut(&fd);
        }
        kept.fds.push(fd);
    }

    /// Shuts every listening socket: a thread blocked in `accept` on one
    /// returns with an error (EINVAL on Linux, for unix and TCP sockets
    /// alike), and clients connecting from now on are refused instead of
    /// waiting in the backlog.
    pub(super) fn close_all(&self) {
        let mut kept = self.kept.lock();
        kept.closed = true;
        for fd in kept.fds.iter() {
            shut(fd);
        }
    }
}

fn shut(fd: &OwnedFd) {
    // SAFETY: `fd` is an open descriptor this value owns; shutdown(2)
    // reads nothing from memory.
    let rc = unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_RDWR) };
    if rc != 0 {
        warn!("shutting the listening socket: {}", std::io::Error::last_os_error());
    }
}
