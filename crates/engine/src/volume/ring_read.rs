//! Reads of one record that RAM does not hold without a blocking thread
//! (docs/l2arc.md, "Reads without a worker"): the device read, of the
//! record's L2 copy or of the backing store, is queued to the IO ring, and
//! the ring thread finishes the record when it completes with the same
//! `settle_*` functions the blocking path uses (`tiers.rs`).
//!
//! The blocking path holds the record's lock across its device read; this
//! one cannot (the lock would be held by a thread that moves on). It notes
//! the record stripe's write count before it takes the dirty bytes and
//! starts the read, and takes the lock when the read completes: the same
//! even count means no write took the record in between, so the dirty bytes
//! taken are still all there are and what the device returned is not older
//! than any write acknowledged since. Anything else ends on the blocking
//! path, which does it all under the lock.

use std::ops::Range;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::sync::Arc;

use arcache_batch::Batch;
use arcache_l2::{L2Miss, L2Ptr};
use arcache_sync::MutexGuard;
use blockdev::uring::{Op, ReadError, Uring};
use blockdev::DevError;

use super::out::Out;
use super::tiers::{injected_backing_error, Snapshot};
use super::{Span, Volume};
use crate::cache::{Found, Looked};

/// How a read started with [`Volume::read_async`] ends, with the engine's
/// errors.
pub type ReadEnd = arcache_batch::ReadEnd<DevError>;

/// Called once with the end of an asynchronous read, on any thread, with
/// the batch of the reads that ended together (the caller's for a read
/// that ends before [`Volume::read_async`] returns).
pub type ReadDone = arcache_batch::ReadDone<DevError>;

/// Where a ring read fetches a record's bytes from.
#[derive(Clone, Copy)]
enum Fetch {
    /// The whole L2 copy; the record is cached.
    L2(L2Ptr),
    /// One half of a split L2 copy, for bytes that lie in it; not cached.
    Half(L2Ptr, u64),
    /// The backing store; the record is cached.
    Backing,
}

/// One read in flight: the record, the request's bytes and the record
/// stripe's write count when it started.
#[derive(Clone, Copy)]
struct Want {
    r: u64,
    offset: u64,
    len: usize,
    writes: u64,
}

/// What a ring read brought: bytes, or why not.
enum Got {
    Bytes(Box<[u8]>),
    /// The device failed the read: the request's answer.
    Failed(DevError),
    /// Not the device's answer (an L2 copy gone, the ring down): the
    /// blocking path tries again.
    Retry,
}

/// Finishes a ring read with what it brought.
type Settle = Box<dyn FnOnce(Got, &mut Batch) + Send>;

impl Volume {
    /// Lets backing-store reads of this volume go through `ring` when the
    /// store reads O_DIRECT through a descriptor.
    pub fn use_ring(&self, ring: Arc<Uring>) {
        let _ = self.ring.set(ring);
    }

    /// `backing_ring_reads`: whether backing-store reads may use the ring.
    pub fn set_backing_ring_reads(&self, on: bool) {
        self.ring_on.store(on, Relaxed);
    }

    /// Starts a read whose bytes lie in one record that the ring can fetch
    /// (from its L2 copy, or from a backing store opened O_DIRECT); gives
    /// `done` back otherwise (the caller then uses [`Volume::read`]).
    /// Bookkeeping (statistics, zfetch, the ARC's ghost lists) is as for
    /// [`Volume::read`].
    ///
    /// `done` is the caller's own, with its errors (`err` makes them from
    /// the engine's), so a read given back is the caller's to run as it
    /// runs any other.
    pub fn read_async<E: 'static>(
        &self,
        offset: u64,
        len: usize,
        done: arcache_batch::ReadDone<E>,
        err: fn(DevError) -> E,
        out: &mut Batch,
    ) -> Result<(), arcache_batch::ReadDone<E>> {
        // Noted here, on the connection's own thread, in the order the
        // client sent them, whether or not the read is given back: its
        // worker notes it again (`Recent::note` keeps one entry), but with
        // dozens of a stream's requests arriving together the workers'
        // order is anyone's, and a request whose predecessors were not yet
        // noted was taken for a random one and read alone.
        self.note_arrival(offset, len as u64);
        let Some((w, ptr)) = self.ring_candidate(offset, len) else { return Err(done) };
        let done: ReadDone = Box::new(move |end: ReadEnd, out: &mut Batch| done(end.map_err(err), out));
        let key = self.key(w.r);
        let s = Span { first: w.r, end: w.r + 1 };
        self.cache.observe(std::iter::once(key));
        self.count(&self.counts.reads, Some((&self.counts.read_bytes, len)));
        let fetch = match self.cache.lookup(key, false) {
            Looked::Hit(data) => {
                self.cache.count(Found::Hit, false, 1);
                let mut buf = vec![0u8; len];
                let res = self.copy_out(w.r, &data, offset, &mut buf).map(|()| buf);
                self.predict(s, false);
                done(ReadEnd::Done(res), out);
                return Ok(());
            }
            Looked::Cold => match ptr {
                Some(p) => {
                    self.half_to_serve(w.r, offset, len as u64, p).map_or(Fetch::L2(p), |h| Fetch::Half(p, h))
                }
                None => Fetch::Backing,
            },
            Looked::Ghost => ptr.map_or(Fetch::Backing, Fetch::L2),
        };
        let snap = self.dirty_snapshot(self.fetched_range(w.r, fetch));
        self.predict(s, true);
        self.start_ring_read(w, fetch, snap, done, out);
        Ok(())
    }

    /// The read and the L2 copy to fetch when the ring can take a read:
    /// within one record, no write holding the record, and either an L2
    /// copy the ring can read or none and a backing store it can read.
    fn ring_candidate(&self, offset: u64, len: usize) -> Option<(Want, Option<L2Ptr>)> {
        if len == 0 || self.check(offset, len as u64).is_err() || self.dev.changed().is_some() {
            return None;
        }
        let s = self.span(offset, len as u64);
        if s.end - s.first != 1 {
            return None;
        }
        let writes = self.stripe(s.first).writes.load(SeqCst);
        if writes % 2 == 1 {
            return None;
        }
        let w = Want { r: s.first, offset, len, writes };
        let copy = self.cache.l2().and_then(|l2| l2.lookup(self.key(w.r)).map(|p| (l2, p)));
        match copy {
            Some((l2, p)) => l2.can_read_async(p).then_some((w, Some(p))),
            None => self.backing_ring(w.r).map(|_| (w, None)),
        }
    }

    /// The ring and descriptor a backing read of record `r` goes through:
    /// the ring is on, the store reads O_DIRECT, the record is aligned.
    fn backing_ring(&self, r: u64) -> Option<(&Uring, std::os::fd::RawFd)> {
        const ALIGN: u64 = 4096;
        let ring = self.ring.get().filter(|ring| self.ring_on.load(Relaxed) && ring.is_alive())?;
        let rr = self.record_range(r);
        if !rr.start.is_multiple_of(ALIGN) || !rr.end.is_multiple_of(ALIGN) {
            return None;
        }
        Some((ring, self.dev.direct_read_fd()?))
    }

    /// The bytes of record `r` a fetch brings.
    fn fetched_range(&self, r: u64, fetch: Fetch) -> Range<u64> {
        match fetch {
            Fetch::Half(_, which) => self.half_range(r, which),
            Fetch::L2(_) | Fetch::Backing => self.record_range(r),
        }
    }

    fn start_ring_read(&self, w: Want, fetch: Fetch, snap: Snapshot, done: ReadDone, out: &mut Batch) {
        let Some(vol) = self.this.upgrade() else { return self.finish_blocking(w, done, out) };
        let finish = move |got: Got, out: &mut Batch| vol.finish_ring_read(w, fetch, got, &snap, done, out);
        match fetch {
            Fetch::Backing => self.start_backing_read(w, Box::new(finish), out),
            Fetch::L2(ptr) | Fetch::Half(ptr, _) => {
                let half = match fetch {
                    Fetch::Half(_, which) => Some(which),
                    _ => None,
                };
                let Some(l2) = self.cache.l2() else { return finish(Got::Retry, out) };
                let res = l2.read_async(
                    self.key(w.r),
                    ptr,
                    half,
                    Box::new(move |res, out| {
                        let got = res.map_or_else(|_: L2Miss| Got::Retry, Got::Bytes);
                        finish(got, out)
                    }),
                );
                if let Err(back) = res {
                    // The device left the ring's reach since the check; a rare race.
                    back(Err(L2Miss::Unavailable), out);
                }
            }
        }
    }

    /// Queues the backing-store read of record `w.r` to the ring.
    fn start_backing_read(&self, w: Want, finish: Settle, out: &mut Batch) {
        let Some((ring, fd)) = self.backing_ring(w.r) else { return finish(Got::Retry, out) };
        let rr = self.record_range(w.r);
        let need = (rr.end - rr.start) as usize;
        let started = std::time::Instant::now();
        let Some(vol) = self.this.upgrade() else { return finish(Got::Retry, out) };
        // Straight into a buffer of an evicted record, which the record
        // keeps: no copy out of the ring's buffer.
        let into = Some(self.cache.record_bufs.uninit(need));
        let op = Op {
            fd,
            at: rr.start,
            need,
            skip: 0,
            len: need,
            into,
            finish: Box::new(move |res, out| {
                let (res, bytes) = match res {
                    Err(ReadError::RingFailed) => return finish(Got::Retry, out),
                    Err(ReadError::Device(e)) => (Err(vol.named(e)), None),
                    Ok(b) => (injected_backing_error(rr.start), Some(b.into_box())),
                };
                let got = match (vol.count_backing_read(need, started, res), bytes) {
                    (Err(e), _) => Got::Failed(e),
                    (Ok(()), Some(b)) => Got::Bytes(b),
                    (Ok(()), None) => Got::Retry,
                };
                finish(got, out)
            }),
        };
        if let Err(op) = ring.submit(op) {
            (op.finish)(Err(ReadError::RingFailed), out);
        }
    }

    /// A device error of the ring, which knows descriptors only, with the
    /// backing store's name.
    fn named(&self, e: DevError) -> DevError {
        match e {
            DevError::Io { op, offset, len, source, .. } => {
                DevError::Io { op, dev: self.dev.describe(), offset, len, source }
            }
            other => other,
        }
    }

    /// Hands the read to a thread that may block: `fill` takes the lock,
    /// looks in RAM, on L2 and on the backing store, as a blocking read
    /// does after its ARC lookup.
    fn finish_blocking(&self, w: Want, done: ReadDone, out: &mut Batch) {
        let Some(vol) = self.this.upgrade() else {
            let closing = Box::new(|| Err(DevError::Unsupported("the export is closing".into())));
            return done(ReadEnd::Blocking(closing), out);
        };
        let work = Box::new(move || {
            let mut buf = vec![0u8; w.len];
            vol.fill(w.r..w.r + 1, false, w.offset, Some(&mut Out::Copy(&mut buf)))?;
            Ok(buf)
        });
        done(ReadEnd::Blocking(work), out);
    }

    /// Takes the record's lock for a completed ring read, or answers the
    /// read itself: the blocking way if the lock is busy (the ring thread
    /// never waits for it), from RAM if another request cached the record
    /// meanwhile. `None` once answered.
    fn lock_or_answer(
        &self,
        w: Want,
        done: ReadDone,
        out: &mut Batch,
    ) -> Option<(MutexGuard<'_, ()>, ReadDone)> {
        let Some(lock) = self.stripe(w.r).lock.try_lock() else {
            self.finish_blocking(w, done, out);
            return None;
        };
        let Some(data) = self.cache.joined(self.key(w.r)) else { return Some((lock, done)) };
        self.cache.count(Found::IoHit, false, 1);
        let mut buf = vec![0u8; w.len];
        match self.copy_out(w.r, &data, w.offset, &mut buf) {
            Ok(()) => done(ReadEnd::Done(Ok(buf)), out),
            Err(_) => {
                drop(lock);
                self.finish_blocking(w, done, out);
            }
        }
        None
    }

    /// Whether what a ring read fetched may be used: asked under the
    /// record's lock, where the same write count means no write took the
    /// record since the read started, and for an L2 read the copy must
    /// still be the record's (the hand may have passed it).
    fn unchanged_since(&self, w: Want, fetch: Fetch) -> bool {
        if self.stripe(w.r).writes.load(SeqCst) != w.writes {
            return false;
        }
        match fetch {
            Fetch::L2(ptr) | Fetch::Half(ptr, _) => {
                self.cache.l2().is_some_and(|l2| l2.lookup(self.key(w.r)) == Some(ptr))
            }
            Fetch::Backing => true,
        }
    }

    /// Finishes a ring read with the tier's `settle_*`, as the blocking
    /// path finishes the same bytes.
    fn finish_ring_read(
        &self,
        w: Want,
        fetch: Fetch,
        got: Got,
        snap: &Snapshot,
        done: ReadDone,
        out: &mut Batch,
    ) {
        let bytes = match got {
            Got::Bytes(b) => b,
            Got::Failed(e) => return done(ReadEnd::Done(Err(e)), out),
            Got::Retry => return self.finish_blocking(w, done, out),
        };
        let Some((lock, done)) = self.lock_or_answer(w, done, out) else { return };
        if !self.unchanged_since(w, fetch) {
            drop(lock);
            return self.finish_blocking(w, done, out);
        }
        let mut buf = vec![0u8; w.len];
        let settled = match fetch {
            Fetch::L2(ptr) => {
                self.settle_l2(w.r, ptr, bytes, snap, false, w.offset, Some(&mut Out::Copy(&mut buf)))
            }
            Fetch::Half(_, which) => Ok(self.settle_half(w.r, which, bytes, snap, w.offset, &mut buf)),
            Fetch::Backing => return self.finish_backing_read(w, bytes, snap, buf, lock, done, out),
        };
        drop(lock);
        let c = &self.cache.counters;
        match settled {
            Ok(true) => {
                c.l2_ring_reads.fetch_add(1, Relaxed);
                done(ReadEnd::Done(Ok(buf)), out)
            }
            Ok(false) => self.finish_blocking(w, done, out),
            Err(e) => done(ReadEnd::Done(Err(e)), out),
        }
    }

    /// A backing-store read whose record is still as it was: the reader is
    /// answered (and the reply sent) before the record is compressed and
    /// inserted. Completions run one after another on the ring thread, so
    /// inserting first made every later reply of a pass wait for the
    /// earlier ones' inserts. The record's lock is held until the insert,
    /// so no write can slip between the answer and the cached copy.
    #[allow(clippy::too_many_arguments)]
    fn finish_backing_read(
        &self,
        w: Want,
        bytes: Box<[u8]>,
        snap: &Snapshot,
        mut buf: Vec<u8>,
        lock: MutexGuard<'_, ()>,
        done: ReadDone,
        out: &mut Batch,
    ) {
        // The bytes are this read's own: the dirty overlay goes on them in
        // place.
        let mut block = bytes;
        self.overlay_block(w.r..w.r + 1, &mut block, w.offset, Some(&mut buf), snap);
        let c = &self.cache.counters;
        c.backing_ring_reads.fetch_add(1, Relaxed);
        // As `read_l2` counts a record with no copy.
        if self.cache.l2().is_some() {
            c.l2_misses.fetch_add(1, Relaxed);
        }
        done(ReadEnd::Done(Ok(buf)), out);
        out.flush();
        // The ring read into a buffer of an evicted record (or copied out
        // of its own into a new one): the record keeps it as it is, or,
        // compressed, gives it back to the pool.
        self.insert_owned(w.r, block, false, None);
        self.cache.count(Found::Miss, false, 1);
        drop(lock);
    }
}
