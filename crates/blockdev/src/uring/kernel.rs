//! The kernel side of the read ring: io_uring, and an eventfd whose read
//! completes when another thread wants the ring thread awake.

use std::io;
use std::mem::ManuallyDrop;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use io_uring::{opcode, types, IoUring};

use super::{ReadAt, WAKE};

/// Wakes the ring thread from [`Kernel::wait`].
pub(super) struct Waker(OwnedFd);

impl Waker {
    pub(super) fn kick(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer to our own eventfd.
        let _ = unsafe { libc::write(self.0.as_raw_fd(), one.as_ptr().cast(), 8) };
    }
}

pub(super) struct Kernel {
    /// Closed by hand in `Drop`, before `counter` is freed.
    ring: ManuallyDrop<IoUring>,
    /// The eventfd of the [`Waker`], which the ring thread keeps alive
    /// (through `Shared`) for as long as this.
    efd: RawFd,
    /// Where the eventfd read lands; freed in `Drop`, after the ring (and
    /// the read still armed in it) is gone.
    counter: *mut [u8; 8],
}

// SAFETY: `counter` is written only by the kernel and touched by nobody
// else; the submission queue is used only under the ring's state lock (see
// `read`), the completion queue only by the ring thread (see `reap`).
unsafe impl Send for Kernel {}
unsafe impl Sync for Kernel {}

/// A ring of `depth` entries and its waker; fails where io_uring is not
/// available (old kernels, sandboxes that forbid it).
pub(super) fn start(depth: u32) -> io::Result<(Kernel, Waker)> {
    let ring = IoUring::new(depth)?;
    // SAFETY: eventfd returns a new descriptor or -1, checked below.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor owned by nobody else.
    let waker = Waker(unsafe { OwnedFd::from_raw_fd(fd) });
    let counter = Box::into_raw(Box::new([0u8; 8]));
    Ok((Kernel { ring: ManuallyDrop::new(ring), efd: fd, counter }, waker))
}

impl Kernel {
    /// Queues a read; the caller holds the ring's state lock, so this is
    /// the only thread using the submission queue.
    ///
    /// # Safety
    /// `r.buf` must stay valid for `r.len` bytes until the read's
    /// completion has been reaped.
    pub(super) unsafe fn read(&self, r: ReadAt) -> io::Result<()> {
        let e = opcode::Read::new(types::Fd(r.fd), r.buf, r.len).offset(r.at).build().user_data(r.data);
        self.push_entry(&e)
    }

    /// Arms the read that completes (as [`WAKE`]) once the waker kicks;
    /// under the state lock, as `read`.
    pub(super) fn arm_wake(&self) -> io::Result<()> {
        let e = opcode::Read::new(types::Fd(self.efd), self.counter.cast(), 8).build().user_data(WAKE);
        self.push_entry(&e)
    }

    /// Arms a one-shot poll for `fd` becoming readable (or hung up),
    /// completing as `data`; under the state lock, as `read`.
    pub(super) fn poll_in(&self, fd: RawFd, data: u64) -> io::Result<()> {
        let e = opcode::PollAdd::new(types::Fd(fd), libc::POLLIN as u32).build().user_data(data);
        self.push_entry(&e)
    }

    fn push_entry(&self, e: &io_uring::squeue::Entry) -> io::Result<()> {
        loop {
            // SAFETY: the callers hold the state lock, so no other
            // submission queue handle exists; every buffer an entry points
            // at outlives its completion (the caller's promise, or the wake
            // counter). Dropping the handle publishes the entry.
            if unsafe { self.ring.submission_shared().push(e) }.is_ok() {
                return Ok(());
            }
            self.submit()?;
        }
    }

    /// Hands the queued entries to the kernel without waiting; any thread.
    pub(super) fn submit(&self) -> io::Result<()> {
        loop {
            match self.ring.submit() {
                Ok(_) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                // The completion queue is full: the ring thread's next
                // wait submits them.
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN) | Some(libc::EBUSY)) => return Ok(()),
                Err(e) => return Err(e),
            }
        }
    }

    /// Submits what is queued and sleeps until something completes; the
    /// ring thread only.
    pub(super) fn wait(&self) -> io::Result<()> {
        loop {
            match self.ring.submit_and_wait(1) {
                Ok(_) => return Ok(()),
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
                    ) =>
                {
                    // EAGAIN/EBUSY: the completion queue is full; reap first.
                    // SAFETY: only the ring thread looks at completions.
                    if !unsafe { self.ring.completion_shared() }.is_empty() {
                        return Ok(());
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The completions so far, as (data, result: bytes or -errno); the
    /// ring thread only.
    pub(super) fn reap(&self) -> Vec<(u64, i32)> {
        // SAFETY: only the ring thread looks at completions.
        unsafe { self.ring.completion_shared() }.map(|c| (c.user_data(), c.result())).collect()
    }
}

impl Drop for Kernel {
    fn drop(&mut self) {
        // The ring goes first: the kernel is done with `counter` after.
        // SAFETY: `ring` is not used again; `counter` came from
        // `Box::into_raw` and is freed once.
        unsafe {
            ManuallyDrop::drop(&mut self.ring);
            drop(Box::from_raw(self.counter));
        }
    }
}
