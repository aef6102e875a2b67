//! A model of the ring's kernel side for shuttle tests, which run every
//! thread on one OS thread: a thread asleep in `io_uring_enter` would stop
//! them all. Reads are done with `pread` when the ring thread waits, each
//! after a point where other threads may run (a real read overlaps with
//! them); the eventfd is a counter under a lock, and the wait a condition
//! variable's.

use std::io;
use std::sync::Arc;

use arcache_sync::{Condvar, Mutex};

use super::{ReadAt, WAKE};

#[derive(Default)]
struct Wake {
    kicks: Mutex<u64>,
    cv: Condvar,
}

pub(super) struct Waker(Arc<Wake>);

impl Waker {
    pub(super) fn kick(&self) {
        *self.0.kicks.lock() += 1;
        self.0.cv.notify_all();
    }
}

pub(super) struct Kernel {
    wake: Arc<Wake>,
    queued: Vec<ReadAt>,
    wake_armed: bool,
    done: Vec<(u64, i32)>,
}

// SAFETY: it moves to the ring thread with nothing queued; the buffers it
// later points at are that thread's slots, which it alone touches.
unsafe impl Send for Kernel {}

pub(super) fn start(_depth: u32) -> io::Result<(Kernel, Waker)> {
    let wake = Arc::new(Wake::default());
    let kernel = Kernel { wake: Arc::clone(&wake), queued: Vec::new(), wake_armed: false, done: Vec::new() };
    Ok((kernel, Waker(wake)))
}

impl Kernel {
    /// # Safety
    /// As the real ring's: `r.buf` stays valid for `r.len` bytes until
    /// the read's completion is reaped.
    pub(super) unsafe fn read(&mut self, r: ReadAt) -> io::Result<()> {
        self.queued.push(r);
        Ok(())
    }

    pub(super) fn arm_wake(&mut self) -> io::Result<()> {
        self.wake_armed = true;
        Ok(())
    }

    pub(super) fn wait(&mut self) -> io::Result<()> {
        loop {
            for r in std::mem::take(&mut self.queued) {
                arcache_sync::thread::yield_now();
                // SAFETY: the caller of `read` keeps `buf` valid for `len`
                // bytes until this completion is reaped.
                let n = unsafe { libc::pread(r.fd, r.buf.cast(), r.len as usize, r.at as libc::off_t) };
                let res = if n < 0 {
                    -io::Error::last_os_error().raw_os_error().unwrap_or(libc::EIO)
                } else {
                    n as i32
                };
                self.done.push((r.data, res));
            }
            let mut kicks = self.wake.kicks.lock();
            if self.wake_armed && *kicks > 0 {
                *kicks = 0;
                self.wake_armed = false;
                self.done.push((WAKE, 8));
            }
            if !self.done.is_empty() {
                return Ok(());
            }
            self.wake.cv.wait(&mut kicks);
        }
    }

    pub(super) fn reap(&mut self) -> Vec<(u64, i32)> {
        std::mem::take(&mut self.done)
    }
}
