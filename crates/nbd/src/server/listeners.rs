//! The sockets a server listens on, kept so that its shutdown can wake
//! the threads blocked in `accept`. Without it those threads, each holding
//! the server, waited for a client that never came: an embedder that shut
//! a server down and dropped it kept its workers, exports and whatever
//! those held until the process ended. Not NBD's own: `arcache`'s control
//! socket and metrics endpoint use it too.

use std::os::fd::{AsRawFd, OwnedFd};

use parking_lot::Mutex;
use tracing::warn;

#[derive(Default)]
pub struct Listeners {
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
    pub fn keep(&self, fd: std::io::Result<OwnedFd>) {
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
    pub fn close_all(&self) {
        let mut kept = self.kept.lock();
        kept.closed = true;
        for fd in kept.fds.iter() {
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
    // SAFETY: `fd` is an open descriptor this value owns; shutdown(2)
    // reads nothing from memory.
    let rc = unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_RDWR) };
    if rc != 0 {
        warn!("shutting the listening socket: {}", std::io::Error::last_os_error());
    }
}
