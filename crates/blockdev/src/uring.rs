//! The IO engine: device reads through io_uring, for every reader that
//! has an O_DIRECT descriptor (L2 copies, backing stores opened with
//! `--direct`). A 4K miss then costs no worker thread asleep in `pread`.
//!
//! The thread that starts a read (a connection's) puts it in the ring and
//! enters the kernel itself, so the device has it at once; one ring thread
//! sleeps for completions and reaps them a batch at a time, running each
//! one's finish (checksum, reply, ARC insert) with a [`Batch`] flushed
//! after it, so no reply waits for the others' work. Reads that find every
//! entry in use wait in a
//! queue the ring thread starts as entries come free. An earlier version
//! had submitters queue reads for the ring thread to submit: each read
//! then waited for that thread to wake, and cold misses were slower than
//! with blocking workers (bench/results/ab-read-cold-miss-arms.md).

use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;

use crate::{AlignedBuf, DevError};
use arcache_batch::Batch;
use arcache_sync::atomic::{AtomicBool, Ordering::SeqCst};
use arcache_sync::Mutex;
use tracing::warn;

// The kernel side, or under shuttle a model of it: shuttle runs every
// thread on one OS thread, which a sleep in the kernel would stop.
#[cfg(not(feature = "shuttle"))]
#[path = "uring/kernel.rs"]
mod kernel;
#[cfg(feature = "shuttle")]
#[path = "uring/model.rs"]
mod kernel;

use kernel::{Kernel, Waker};

/// Why a queued read produced no bytes.
#[derive(Debug)]
pub enum ReadError {
    /// The device failed it (an error or a short read).
    Device(DevError),
    /// The ring failed, not the device: its caller must not count it
    /// against the device (a ring failing with hundreds of reads in flight
    /// would otherwise retire a healthy device).
    RingFailed,
}

/// What a finished read hands on: the bytes asked for, or why not, with
/// the batch of the reads that finished together.
pub type Finish = Box<dyn FnOnce(Result<Landed<'_>, ReadError>, &mut Batch) + Send>;

/// Where a finished read's bytes are.
pub enum Landed<'a> {
    /// In one of the ring's buffers, lent for the completion.
    Lent(&'a [u8]),
    /// In the buffer the read was given ([`Op::into`]), handed back whole:
    /// a caller that keeps the bytes (an ARC record) needs no copy.
    Own(Box<[u8]>),
}

impl Landed<'_> {
    pub fn bytes(&self) -> &[u8] {
        match self {
            Landed::Lent(b) => b,
            Landed::Own(b) => b,
        }
    }

    /// The bytes in a box of their own: the given buffer, or a copy.
    pub fn into_box(self) -> Box<[u8]> {
        match self {
            Landed::Lent(b) => b.into(),
            Landed::Own(b) => b,
        }
    }
}

/// One read: `need` bytes at `at` (both aligned for O_DIRECT) of which the
/// caller wants `len` from `skip`.
pub struct Op {
    pub fd: RawFd,
    pub at: u64,
    pub need: usize,
    pub skip: usize,
    pub len: usize,
    pub finish: Finish,
    /// A buffer to read into instead of one of the ring's, for a read
    /// wanted whole (`skip` 0, `len` equal to `need`): exactly `need`
    /// bytes, aligned for O_DIRECT. The finish gets it back as
    /// [`Landed::Own`]. One that does not fit is dropped and the read goes
    /// into a buffer of the ring's, as without.
    pub into: Option<Box<[std::mem::MaybeUninit<u8>]>>,
}

struct Shared {
    kernel: Kernel,
    /// Every read this ring owes an answer, and the submission queue's
    /// lock: whoever pushes an entry holds it.
    state: Mutex<State>,
    /// Wakes the ring thread out of its wait for completions: to stop, or
    /// to fail.
    wake: Waker,
    /// The submitting side is gone: finish what was queued, then stop.
    closed: AtomicBool,
    /// Tests: make the ring fail as if the kernel had refused it.
    inject_failure: AtomicBool,
    /// A submitter's push failed: the ring thread fails the ring.
    broken: AtomicBool,
    /// A thread's own ring ([`LocalRing`]): no ring thread; its owner
    /// submits, waits and finishes.
    local: bool,
}

struct State {
    /// The ring has failed: reads are given back to their submitters.
    failed: bool,
    slots: Vec<Option<InFlight>>,
    free: Vec<usize>,
    /// Buffers of finished reads, kept for the next ones.
    spare: Vec<AlignedBuf>,
    in_flight: usize,
    /// Reads that found every entry in use; the ring thread starts them as
    /// entries come free, oldest first.
    waiting: VecDeque<Op>,
    /// A thread's own ring: its poll of the owner's socket is armed.
    poll_armed: bool,
}

/// The submitting side; dropping it stops the thread once every read
/// queued through it has finished.
pub struct Uring {
    shared: Arc<Shared>,
}

/// A read handed to the kernel side: `len` bytes at `at` of `fd` into
/// `buf`, whose completion carries `data`.
struct ReadAt {
    fd: RawFd,
    buf: *mut u8,
    len: u32,
    at: u64,
    data: u64,
}

/// Entries of the ring: more reads than this in flight wait in the queue.
const DEPTH: u32 = 256;
/// The data of the wake-up read's completion.
const WAKE: u64 = u64::MAX;
/// The data of a thread's own ring's poll of its socket.
const POLL: u64 = u64::MAX - 1;

impl Uring {
    /// Sets up a ring and its thread; fails where io_uring is not
    /// available (old kernels, sandboxes that forbid it).
    pub fn start(name: &str) -> io::Result<Uring> {
        let shared = Shared::new(false)?;
        {
            let _sq = shared.state.lock();
            shared.kernel.arm_wake()?;
        }
        // The thread holds `shared` (and so the ring and the eventfd its
        // wake-up read is armed on) until it stops.
        let sh = Arc::clone(&shared);
        arcache_sync::thread::Builder::new().name(name.into()).spawn(move || {
            if let Err(e) = run(&sh) {
                warn!("the IO ring failed, reading the blocking way from now on: {e}");
                fail_all(&sh);
            }
        })?;
        Ok(Uring { shared })
    }

    /// Makes the ring fail at its next turn, as a kernel error would; for
    /// tests of what its failure does to reads in flight and after.
    #[doc(hidden)]
    pub fn inject_failure(&self) {
        self.shared.inject_failure.store(true, SeqCst);
        self.shared.wake.kick();
    }

    /// False once the ring has failed.
    pub fn is_alive(&self) -> bool {
        !self.shared.state.lock().failed
    }

    /// Starts a read; gives it back if the ring has failed.
    ///
    /// The caller's thread hands the read to the kernel itself, so the
    /// device sees it without waiting for the ring thread to wake: on a
    /// 2-core host that wake-up cost more than the read's own submission.
    pub fn submit(&self, op: Op) -> Result<(), Op> {
        // The borrow is held across the push only: nothing in it starts
        // another read.
        LOCAL.with(|l| submit_to(l.borrow().as_deref().unwrap_or(&*self.shared), op))
    }
}

/// Starts `op` on the ring of `sh`: the caller enters the kernel itself.
fn submit_to(sh: &Shared, op: Op) -> Result<(), Op> {
    {
        let mut st = sh.state.lock();
        if st.failed {
            return Err(op);
        }
        if st.in_flight >= DEPTH as usize - 1 || !st.waiting.is_empty() {
            st.waiting.push_back(op);
            return Ok(());
        }
        if st.push(&sh.kernel, op, sh.local).is_err() {
            // The read is in its slot: the failure path (the ring thread's,
            // or the owner's next wait) answers it.
            sh.broken.store(true, SeqCst);
            sh.wake.kick();
            return Ok(());
        }
    }
    // Outside the lock: an entry another thread pushes meanwhile goes with
    // this call or the next. A failed call leaves the entries queued for
    // the next wait, which reports the error.
    let _ = sh.kernel.submit();
    Ok(())
}

impl Shared {
    fn new(local: bool) -> io::Result<Arc<Shared>> {
        let (kernel, wake) = kernel::start(DEPTH)?;
        Ok(Arc::new(Shared {
            kernel,
            state: Mutex::new(State {
                failed: false,
                slots: Vec::new(),
                free: Vec::new(),
                spare: Vec::new(),
                in_flight: 0,
                waiting: VecDeque::new(),
                poll_armed: false,
            }),
            wake,
            closed: AtomicBool::new(false),
            inject_failure: AtomicBool::new(false),
            broken: AtomicBool::new(false),
            local,
        }))
    }
}

impl Drop for Uring {
    fn drop(&mut self) {
        self.shared.closed.store(true, SeqCst);
        self.shared.wake.kick();
    }
}

/// A read's buffer while the kernel fills it.
enum ReadBuf {
    Ring(AlignedBuf),
    Given(GivenBuf),
}

impl ReadBuf {
    fn len(&self) -> usize {
        match self {
            ReadBuf::Ring(b) => b.as_slice().len(),
            ReadBuf::Given(b) => b.0.len(),
        }
    }
}

/// A caller's buffer while the kernel may write to it, held by its
/// pointer: a `Box` claims to be the only way to its bytes, and moving it
/// (into its slot, out again) would make that claim while the kernel
/// writes through another. Dropped without [`GivenBuf::into_box`] it is
/// leaked, as a failed ring's buffers must be.
struct GivenBuf(std::ptr::NonNull<[std::mem::MaybeUninit<u8>]>);

// SAFETY: it owns its allocation, as the `Box` it came from did.
unsafe impl Send for GivenBuf {}

impl GivenBuf {
    fn new(b: Box<[std::mem::MaybeUninit<u8>]>) -> Self {
        GivenBuf(std::ptr::NonNull::from(Box::leak(b)))
    }

    fn ptr(&self) -> *mut u8 {
        self.0.as_ptr().cast::<u8>()
    }

    /// # Safety
    /// The kernel is done with it: its completion was reaped.
    unsafe fn into_box(self) -> Box<[std::mem::MaybeUninit<u8>]> {
        // SAFETY: the pointer came from `Box::leak` and nothing else
        // holds it now (the caller's promise).
        unsafe { Box::from_raw(self.0.as_ptr()) }
    }
}

struct InFlight {
    /// Exactly the bytes read (its length is the read's).
    buf: ReadBuf,
    at: u64,
    skip: usize,
    len: usize,
    finish: Finish,
}

impl State {
    /// Puts a read in a free slot and its entry in the submission queue;
    /// the caller holds the state lock, which is the queue's too.
    fn push(&mut self, kernel: &Kernel, op: Op, local: bool) -> io::Result<()> {
        let Op { fd, at, need, skip, len, finish, into } = op;
        let given = into.filter(|b| {
            b.len() == need
                && skip == 0
                && len == need
                && (b.as_ptr() as usize).is_multiple_of(crate::file::DIRECT_ALIGN)
        });
        let (buf, ptr) = match given {
            Some(b) => {
                let g = GivenBuf::new(b);
                let ptr = g.ptr();
                (ReadBuf::Given(g), ptr)
            }
            None => {
                let mut b = self.ring_buf(need, local);
                let ptr = b.as_mut_slice().as_mut_ptr();
                (ReadBuf::Ring(b), ptr)
            }
        };
        let slot = self.free.pop().unwrap_or_else(|| {
            self.slots.push(None);
            self.slots.len() - 1
        });
        // In its slot before the kernel hears of it: if the push fails,
        // `fail_all` still finds it there.
        self.slots[slot] = Some(InFlight { buf, at, skip, len, finish });
        self.in_flight += 1;
        // SAFETY: the buffer lives in its slot (moving `buf` there moved
        // no bytes: both kinds are heap allocations) until its completion
        // is reaped, or is leaked; the state lock held by the caller makes
        // this the only pusher.
        unsafe { kernel.read(ReadAt { fd, buf: ptr, len: need as u32, at, data: slot as u64 }) }
    }

    /// One of the ring's buffers for a read of `need` bytes: a spare one
    /// if its allocation holds it (`reuse_as` sizes it; its `capacity` is
    /// only the last read's length), else a new one.
    fn ring_buf(&mut self, need: usize, local: bool) -> AlignedBuf {
        match self.spare.iter_mut().position(|b| b.reuse_as(need)) {
            Some(i) => self.spare.swap_remove(i),
            None => {
                // Room for bigger reads later; sized to this one now. A
                // thread's own ring (one per connection) keeps no room.
                let room = if local { need } else { need.max(64 << 10) };
                let mut b = AlignedBuf::new(room);
                b.reuse_as(need);
                b
            }
        }
    }
}

fn run(sh: &Shared) -> io::Result<()> {
    loop {
        if sh.inject_failure.load(SeqCst) {
            return Err(io::Error::other("failure injected by a test"));
        }
        if sh.broken.load(SeqCst) {
            return Err(io::Error::other("a read could not be queued to the ring"));
        }
        // Nobody can submit more once the submitting side is gone.
        if sh.closed.load(SeqCst) {
            let st = sh.state.lock();
            if st.in_flight == 0 && st.waiting.is_empty() {
                return Ok(());
            }
        }
        sh.kernel.wait()?;
        let mut batch = Batch::new();
        complete(sh, &mut batch, true)?;
    }
}

/// Finishes every completed read: takes them from their slots, starts
/// waiting reads in the entries they free (before the completions' work,
/// so the device is not idle while this thread copies and inserts), then
/// runs the completions, with `batch`, flushed after each one when
/// `flush_each`. Returns whether the owner's socket poll completed.
fn complete(sh: &Shared, batch: &mut Batch, flush_each: bool) -> io::Result<bool> {
    let done = sh.kernel.reap();
    let mut finished: Vec<(InFlight, i32)> = Vec::with_capacity(done.len());
    let mut started = false;
    // An error is returned after the completions taken out of their slots
    // have run: nothing `fail_all` cannot see goes unanswered.
    let mut failed = None;
    let mut readable = false;
    {
        let mut st = sh.state.lock();
        let mut woken = false;
        for (data, res) in done {
            if data == WAKE {
                woken = true;
                continue;
            }
            if data == POLL {
                st.poll_armed = false;
                readable = true;
                continue;
            }
            let slot = data as usize;
            if let Some(f) = st.slots.get_mut(slot).and_then(Option::take) {
                st.free.push(slot);
                st.in_flight -= 1;
                finished.push((f, res));
            }
        }
        while failed.is_none() && st.in_flight < DEPTH as usize - 1 {
            let Some(op) = st.waiting.pop_front() else { break };
            // A failed push leaves the read in its slot for `fail_all`.
            failed = st.push(&sh.kernel, op, sh.local).err();
            started = true;
        }
        if woken && failed.is_none() {
            failed = sh.kernel.arm_wake().err();
            started = true;
        }
    }
    if started && failed.is_none() {
        failed = sh.kernel.submit().err();
    }
    let mut bufs = Vec::with_capacity(finished.len());
    for (f, res) in finished {
        let InFlight { buf, at, skip, len, finish } = f;
        let need = buf.len();
        if res >= 0 && res as usize == need {
            match buf {
                ReadBuf::Ring(b) => {
                    finish_guarded(finish, Ok(Landed::Lent(&b.as_slice()[skip..skip + len])), batch);
                    bufs.push(b);
                }
                ReadBuf::Given(g) => {
                    // SAFETY: the read's completion was reaped, and the
                    // kernel wrote all `need` bytes of it: it completed
                    // whole.
                    let b = unsafe { g.into_box().assume_init() };
                    finish_guarded(finish, Ok(Landed::Own(b)), batch);
                }
            }
        } else {
            let source = if res < 0 {
                io::Error::from_raw_os_error(-res)
            } else {
                io::Error::new(io::ErrorKind::UnexpectedEof, format!("short read: {res} of {need} bytes"))
            };
            let e =
                DevError::Io { op: "read", dev: "the IO ring".into(), offset: at, len: need as u64, source };
            finish_guarded(finish, Err(ReadError::Device(e)), batch);
            match buf {
                ReadBuf::Ring(b) => bufs.push(b),
                // SAFETY: the read's completion was reaped.
                ReadBuf::Given(g) => drop(unsafe { g.into_box() }),
            }
        }
        // On the ring thread each reply leaves as soon as it is made:
        // holding the first until the last completion of the pass is
        // finished (copies, inserts) added that whole pass to its latency.
        if flush_each {
            batch.flush();
        }
    }
    let mut st = sh.state.lock();
    let keep = if sh.local { LOCAL_SPARE } else { 64 };
    let room = keep.saturating_sub(st.spare.len());
    st.spare.extend(bufs.into_iter().take(room));
    failed.map_or(Ok(readable), Err)
}

/// Read buffers a thread's own ring keeps for its next reads.
const LOCAL_SPARE: usize = 16;

thread_local! {
    /// The ring of this thread's own reads, while a [`LocalRing`] is alive.
    static LOCAL: std::cell::RefCell<Option<Arc<Shared>>> = const { std::cell::RefCell::new(None) };
}

/// A ring of the calling thread's own: while it lives, every read this
/// thread starts through any [`Uring`] goes to it, and the thread itself
/// finishes them in [`LocalRing::wait`], which also waits for its socket.
///
/// Why: a read's completion is posted by the kernel in the context of the
/// thread that submitted it, so with one ring thread every completion
/// took two wake-ups (the submitter's, to post it; the ring thread's, to
/// finish it), and the ring thread's replies woke the client on the ring
/// thread's core, where it waited for the rest of the pass. A connection
/// thread that finishes its own reads posts and finishes them in one
/// wake-up, and sends the replies of a pass with one system call.
pub struct LocalRing {
    shared: Arc<Shared>,
}

impl LocalRing {
    /// Gives the calling thread a ring of its own; fails where io_uring is
    /// not available, or if the thread has one already.
    pub fn install() -> io::Result<LocalRing> {
        if LOCAL.with(|l| l.borrow().is_some()) {
            return Err(io::Error::other("this thread has a ring already"));
        }
        let shared = Shared::new(true)?;
        LOCAL.with(|l| *l.borrow_mut() = Some(Arc::clone(&shared)));
        Ok(LocalRing { shared })
    }

    /// Whether reads of this ring are under way.
    pub fn busy(&self) -> bool {
        let st = self.shared.state.lock();
        st.in_flight > 0 || !st.waiting.is_empty()
    }

    /// Finishes this ring's completed reads with `out` until `fd` is
    /// readable (or, with no `fd`, until at least one read finished), and
    /// returns with every reply they made sent. A ring that fails gives
    /// its reads to their fallbacks and is not used again.
    pub fn wait(&self, fd: Option<RawFd>, out: &mut Batch) {
        if let Err(e) = self.wait_inner(fd, out) {
            warn!("a connection's IO ring failed, reading the blocking way from now on: {e}");
            fail_all(&self.shared);
        }
        // A pass that failed after its completions ran left their replies.
        out.flush();
    }

    /// Makes the ring fail at its owner's next wait, as a kernel error
    /// would; for tests of what its failure does to its reads.
    #[doc(hidden)]
    pub fn inject_failure(&self) {
        self.shared.inject_failure.store(true, SeqCst);
    }

    fn wait_inner(&self, fd: Option<RawFd>, out: &mut Batch) -> io::Result<()> {
        let sh = &*self.shared;
        loop {
            if sh.inject_failure.load(SeqCst) {
                return Err(io::Error::other("failure injected by a test"));
            }
            if sh.broken.load(SeqCst) {
                return Err(io::Error::other("a read could not be queued to the ring"));
            }
            {
                let mut st = sh.state.lock();
                if st.failed {
                    return Ok(());
                }
                if let Some(fd) = fd {
                    if !st.poll_armed {
                        sh.kernel.poll_in(fd, POLL)?;
                        st.poll_armed = true;
                    }
                } else if st.in_flight == 0 && st.waiting.is_empty() {
                    return Ok(());
                }
            }
            sh.kernel.wait()?;
            let polled = complete(sh, out, false)?;
            // The pass's replies leave together, before the next wait.
            out.flush();
            match fd {
                None => return Ok(()),
                // A poll's completion can be stale: a socket's writer queues
                // its bytes before it wakes the pollers, so bytes the owner
                // had already read can still complete a poll armed after,
                // saying "readable" of an empty socket. The owner then
                // blocked in its read with its ring's reads unfinished and
                // their replies unsent, and a client waiting for those
                // replies before sending more waited for ever (seen: fio at
                // queue depth 16, every request's read on the ring). So the
                // socket is asked again; if it is empty, the poll is armed
                // anew.
                Some(fd) if polled && readable_now(fd) => return Ok(()),
                Some(_) => {}
            }
        }
    }
}

/// Whether `fd` has something to read (bytes, end of stream or an
/// error) right now.
fn readable_now(fd: RawFd) -> bool {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    loop {
        // SAFETY: polls one descriptor through a live pollfd, not waiting.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        if n >= 0 {
            return n > 0;
        }
        if io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
            // Let the owner's read meet the error.
            return true;
        }
    }
}

impl Drop for LocalRing {
    /// Finishes every read still under way first: the kernel writes into
    /// their buffers until they complete.
    fn drop(&mut self) {
        let mut out = Batch::new();
        // A failed ring is never busy: `fail_all` answered its reads.
        while self.busy() {
            self.wait(None, &mut out);
        }
        LOCAL.with(|l| l.borrow_mut().take());
    }
}

/// Ends every read the ring still owes an answer as failed by the ring,
/// and gives every later one back to its submitter. Buffers of reads in
/// flight are leaked, not freed: the kernel may still be filling them.
fn fail_all(sh: &Shared) {
    let (slots, waiting) = {
        let mut st = sh.state.lock();
        st.failed = true;
        st.in_flight = 0;
        (std::mem::take(&mut st.slots), std::mem::take(&mut st.waiting))
    };
    let mut batch = Batch::new();
    for f in slots.into_iter().flatten() {
        std::mem::forget(f.buf);
        finish_guarded(f.finish, Err(ReadError::RingFailed), &mut batch);
    }
    for op in waiting {
        finish_guarded(op.finish, Err(ReadError::RingFailed), &mut batch);
    }
    batch.flush();
}

/// Runs one read's completion. A panic in it (a bug) is logged and
/// contained: it must not take the ring thread, and with it every later
/// read of every client.
fn finish_guarded(finish: Finish, res: Result<Landed<'_>, ReadError>, batch: &mut Batch) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| finish(res, batch))).is_err() {
        warn!("a ring read's completion panicked; that one request goes unanswered");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::sync::mpsc;

    fn op(
        fd: RawFd,
        at: u64,
        need: usize,
        skip: usize,
        len: usize,
        tx: &mpsc::Sender<Result<Vec<u8>, String>>,
    ) -> Op {
        let tx = tx.clone();
        let finish: Finish = Box::new(move |r, _| {
            let _ = tx.send(r.map(|l| l.bytes().to_vec()).map_err(|e| format!("{e:?}")));
        });
        Op { fd, at, need, skip, len, finish, into: None }
    }

    #[test]
    fn reads_land_where_asked_and_failures_come_back_as_errors() {
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..1 << 20).map(|i: u32| (i * 7 + i / 4096) as u8).collect();
        f.write_all(&data).unwrap();
        let fd = f.as_raw_fd();
        let ring = Uring::start("test-ring").unwrap();
        let (tx, rx) = mpsc::channel();
        // More reads than the ring has entries: the rest wait their turn.
        for i in 0..600u64 {
            let at = (i * 4096 * 7) % (1 << 20);
            assert!(ring.submit(op(fd, at, 4096, 100, 50, &tx)).is_ok());
        }
        let mut got: Vec<Vec<u8>> =
            (0..600).map(|_| rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap().unwrap()).collect();
        let mut want: Vec<Vec<u8>> = (0..600u64)
            .map(|i| (i * 4096 * 7) % (1 << 20))
            .map(|at| data[at as usize + 100..at as usize + 150].to_vec())
            .collect();
        got.sort();
        want.sort();
        assert!(got == want, "every read returned its own bytes");
        // Past the end: a short read is an error, not a partial answer.
        assert!(ring.submit(op(fd, (1 << 20) - 4096, 8192, 0, 8192, &tx)).is_ok());
        assert!(rx.recv().unwrap().unwrap_err().contains("short read"));
        assert!(ring.submit(op(-1, 0, 4096, 0, 4096, &tx)).is_ok());
        assert!(rx.recv().unwrap().is_err(), "a bad descriptor fails the read");
    }

    #[test]
    fn a_thread_with_its_own_ring_finishes_its_reads_itself() {
        let mut f = tempfile::tempfile().unwrap();
        let data: Vec<u8> = (0..1 << 20).map(|i: u32| (i * 13 + i / 4096) as u8).collect();
        f.write_all(&data).unwrap();
        let fd = f.as_raw_fd();
        let shared = Uring::start("test-ring").unwrap();
        let own = LocalRing::install().unwrap();
        assert!(LocalRing::install().is_err(), "one ring per thread");
        let (tx, rx) = mpsc::channel();
        for i in 0..40u64 {
            assert!(shared.submit(op(fd, i * 8192, 4096, 0, 4096, &tx)).is_ok());
        }
        // Only this thread finishes them, and only while it waits: the
        // shared ring's thread never sees them.
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(rx.try_recv().is_err(), "a read was finished outside this thread's wait");
        assert!(own.busy());
        let mut out = Batch::new();
        let mut got = 0;
        while own.busy() {
            own.wait(None, &mut out);
            got += rx.try_iter().map(|r| assert!(r.is_ok())).count();
        }
        assert_eq!(got, 40, "every read finished in the waits");

        // Waiting for a socket: reads finish meanwhile, and the wait ends
        // once the socket has bytes.
        let (mut a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        for i in 0..8u64 {
            assert!(shared.submit(op(fd, i * 4096, 4096, 0, 4096, &tx)).is_ok());
        }
        let writer = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(200));
            a.write_all(b"x").unwrap();
            a
        });
        let t0 = std::time::Instant::now();
        own.wait(Some(b.as_raw_fd()), &mut out);
        assert!(
            t0.elapsed() >= std::time::Duration::from_millis(150),
            "the wait ended before the socket had bytes"
        );
        let done: Vec<_> = rx.try_iter().collect();
        assert_eq!(done.len(), 8, "the reads finished while waiting for the socket");
        assert_eq!(done[0].as_deref().unwrap().len(), 4096);
        drop(writer.join().unwrap());

        // Dropping the ring finishes what is still under way.
        for i in 0..16u64 {
            assert!(shared.submit(op(fd, i * 4096, 4096, 0, 4096, &tx)).is_ok());
        }
        drop(own);
        assert_eq!(rx.try_iter().count(), 16, "dropping the ring finished its reads");
        // From now on this thread's reads go to the shared ring again.
        assert!(shared.submit(op(fd, 0, 4096, 0, 4096, &tx)).is_ok());
        let r = rx.recv_timeout(std::time::Duration::from_secs(10)).expect("the shared ring finishes it");
        assert_eq!(r.unwrap(), data[..4096].to_vec());
    }

    #[test]
    fn a_stale_poll_completion_does_not_end_the_wait_for_the_socket() {
        use std::io::Read;
        let own = LocalRing::install().unwrap();
        let (mut a, mut b) = std::os::unix::net::UnixStream::pair().unwrap();
        // A poll armed as the owner's wait arms it, on a socket with a byte
        // in it: it completes at once, saying readable.
        a.write_all(b"x").unwrap();
        {
            let mut st = own.shared.state.lock();
            own.shared.kernel.poll_in(b.as_raw_fd(), POLL).unwrap();
            st.poll_armed = true;
        }
        own.shared.kernel.submit().unwrap();
        // The byte is read before the owner's wait reaps that completion:
        // what it says is no longer true.
        b.read_exact(&mut [0u8; 1]).unwrap();
        let writer = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(200));
            a.write_all(b"y").unwrap();
            a
        });
        let t0 = std::time::Instant::now();
        own.wait(Some(b.as_raw_fd()), &mut Batch::new());
        assert!(
            t0.elapsed() >= std::time::Duration::from_millis(150),
            "the wait ended on a stale poll, with nothing to read: its owner would block in its read"
        );
        assert!(readable_now(b.as_raw_fd()));
        drop(writer.join().unwrap());
    }

    #[test]
    fn a_thread_whose_own_ring_fails_gives_its_reads_back() {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&vec![3u8; 1 << 16]).unwrap();
        let fd = f.as_raw_fd();
        let shared = Uring::start("test-ring").unwrap();
        let own = LocalRing::install().unwrap();
        let (tx, rx) = mpsc::channel();
        for i in 0..8u64 {
            assert!(shared.submit(op(fd, i * 4096, 4096, 0, 4096, &tx)).is_ok());
        }
        own.inject_failure();
        own.wait(None, &mut Batch::new());
        let ends: Vec<_> = rx.try_iter().collect();
        assert_eq!(ends.len(), 8, "every read under way is answered");
        assert!(
            ends.iter().all(|e| e.as_ref().is_err_and(|e| e.contains("RingFailed"))),
            "as failed by the ring, not the device: {ends:?}"
        );
        assert!(!own.busy());
        assert!(shared.submit(op(fd, 0, 4096, 0, 4096, &tx)).is_err(), "a later read is given back");
        drop(own);
        assert!(shared.submit(op(fd, 0, 4096, 0, 4096, &tx)).is_ok());
        let r = rx.recv_timeout(std::time::Duration::from_secs(10)).expect("the shared ring finishes it");
        assert_eq!(r.unwrap(), vec![3u8; 4096]);
    }

    #[test]
    fn a_panicking_completion_does_not_stop_the_ring() {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&vec![9u8; 1 << 16]).unwrap();
        let ring = Uring::start("test-ring").unwrap();
        let boom: Finish = Box::new(|_, _| panic!("a bug in a completion"));
        assert!(ring
            .submit(Op { fd: f.as_raw_fd(), at: 0, need: 4096, skip: 0, len: 4096, finish: boom, into: None })
            .is_ok());
        let (tx, rx) = mpsc::channel();
        for i in 0..8u64 {
            assert!(ring.submit(op(f.as_raw_fd(), i * 4096, 4096, 0, 4096, &tx)).is_ok());
        }
        for _ in 0..8 {
            let r = rx.recv_timeout(std::time::Duration::from_secs(10)).expect("later reads are answered");
            assert_eq!(r.unwrap(), vec![9u8; 4096]);
        }
    }

    #[test]
    fn dropping_the_ring_still_finishes_the_reads_it_took() {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(&vec![5u8; 1 << 20]).unwrap();
        let (tx, rx) = mpsc::channel();
        {
            let ring = Uring::start("test-ring").unwrap();
            for i in 0..200u64 {
                assert!(ring.submit(op(f.as_raw_fd(), i * 4096, 4096, 0, 4096, &tx)).is_ok());
            }
        }
        for _ in 0..200 {
            let r = rx.recv_timeout(std::time::Duration::from_secs(10)).expect("every read is answered");
            assert_eq!(r.unwrap(), vec![5u8; 4096]);
        }
    }
}
