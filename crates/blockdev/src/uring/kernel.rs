//! The kernel side of the read ring: io_uring, and an eventfd whose read
//! completes when another thread wants the ring thread awake.

use std::io;
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
    ring: IoUring,
    /// The eventfd of the [`Waker`], which the ring thread keeps alive
    /// (through `Shared`) for as long as this.
    efd: RawFd,
    /// Where the eventfd read lands. After `ring` so it is freed after the
    /// ring (and the read still armed in it) is gone.
    counter: Box<[u8; 8]>,
}

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
    Ok((Kernel { ring, efd: fd, counter: Box::new([0; 8]) }, waker))
}

impl Kernel {
    /// Queues a read.
    ///
    /// # Safety
    /// `r.buf` must stay valid for `r.len` bytes until the read's
    /// completion has been reaped.
    pub(super) unsafe fn read(&mut self, r: ReadAt) -> io::Result<()> {
        let e = opcode::Read::new(types::Fd(r.fd), r.buf, r.len).offset(r.at).build().user_data(r.data);
        self.push_entry(&e)
    }

    /// Arms the read that completes (as [`WAKE`]) once the waker kicks.
    pub(super) fn arm_wake(&mut self) -> io::Result<()> {
        let e = opcode::Read::new(types::Fd(self.efd), self.counter.as_mut_ptr(), 8).build().user_data(WAKE);
        self.push_entry(&e)
    }

    fn push_entry(&mut self, e: &io_uring::squeue::Entry) -> io::Result<()> {
        loop {
            // SAFETY: every buffer an entry points at outlives its
            // completion (the caller's promise, or the wake counter).
            if unsafe { self.ring.submission().push(e) }.is_ok() {
                return Ok(());
            }
            self.wait_room()?;
        }
    }

    /// The submission queue is full: hand it to the kernel.
    fn wait_room(&mut self) -> io::Result<()> {
        loop {
            match self.ring.submit() {
                Ok(_) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Submits what is queued and sleeps until something completes.
    pub(super) fn wait(&mut self) -> io::Result<()> {
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
                    if !self.ring.completion().is_empty() {
                        return Ok(());
                    }
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The completions so far, as (data, result: bytes or -errno).
    pub(super) fn reap(&mut self) -> Vec<(u64, i32)> {
        self.ring.completion().map(|c| (c.user_data(), c.result())).collect()
    }
}
