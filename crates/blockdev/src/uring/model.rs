//! A model of the ring's kernel side for shuttle tests, which run every
//! thread on one OS thread: a thread asleep in `io_uring_enter` would stop
//! them all. Reads are done with `pread` when the ring thread waits, each
//! after a point where other threads may run (a real read overlaps with
//! them); the eventfd is a counter under a lock, and the wait a condition
//! variable's, which a submission also wakes (as a real read's completion
//! would).

use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;

use arcache_sync::{Condvar, Mutex};

use super::{ReadAt, WAKE};

#[derive(Default)]
struct Model {
    kicks: u64,
    wake_armed: bool,
    queued: Vec<ReadAt>,
    done: Vec<(u64, i32)>,
}

#[derive(Default)]
struct Inner {
    m: Mutex<Model>,
    cv: Condvar,
}

pub(super) struct Waker(Arc<Inner>);

impl Waker {
    pub(super) fn kick(&self) {
        self.0.m.lock().kicks += 1;
        self.0.cv.notify_all();
    }
}

pub(super) struct Kernel(Arc<Inner>);

// SAFETY: the buffer a queued read points at is its ring slot's, which
// stays put until the completion is reaped.
unsafe impl Send for ReadAt {}

pub(super) fn start(_depth: u32) -> io::Result<(Kernel, Waker)> {
    let inner = Arc::new(Inner::default());
    Ok((Kernel(Arc::clone(&inner)), Waker(inner)))
}

impl Kernel {
    /// # Safety
    /// As the real ring's: `r.buf` stays valid for `r.len` bytes until
    /// the read's completion is reaped.
    pub(super) unsafe fn read(&self, r: ReadAt) -> io::Result<()> {
        self.0.m.lock().queued.push(r);
        Ok(())
    }

    pub(super) fn arm_wake(&self) -> io::Result<()> {
        self.0.m.lock().wake_armed = true;
        Ok(())
    }

    /// No sockets under shuttle: a thread's own ring is not modelled.
    pub(super) fn poll_in(&self, _fd: RawFd, _data: u64) -> io::Result<()> {
        Err(io::Error::from(io::ErrorKind::Unsupported))
    }

    pub(super) fn submit(&self) -> io::Result<()> {
        self.0.cv.notify_all();
        Ok(())
    }

    pub(super) fn wait(&self) -> io::Result<()> {
        let mut m = self.0.m.lock();
        loop {
            let queued = std::mem::take(&mut m.queued);
            if !queued.is_empty() {
                drop(m);
                let mut done = Vec::with_capacity(queued.len());
                for r in queued {
                    arcache_sync::thread::yield_now();
                    // SAFETY: the caller of `read` keeps `buf` valid for
                    // `len` bytes until this completion is reaped.
                    let n = unsafe { libc::pread(r.fd, r.buf.cast(), r.len as usize, r.at as libc::off_t) };
                    let res = if n < 0 {
                        -io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
                    } else {
                        n as i32
                    };
                    done.push((r.data, res));
                }
                m = self.0.m.lock();
                m.done.extend(done);
            }
            if m.wake_armed && m.kicks > 0 {
                m.kicks = 0;
                m.wake_armed = false;
                m.done.push((WAKE, 8));
            }
            if !m.done.is_empty() {
                return Ok(());
            }
            if m.queued.is_empty() {
                self.0.cv.wait(&mut m);
            }
        }
    }

    pub(super) fn reap(&self) -> Vec<(u64, i32)> {
        std::mem::take(&mut self.0.m.lock().done)
    }
}
