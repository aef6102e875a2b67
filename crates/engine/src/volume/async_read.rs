//! Reads of one record's bytes from its L2 copy without a blocking thread
//! (docs/l2arc.md, "Reads without a worker"). The device read is queued to
//! L2's io_uring ring; the record is checked and inserted (or, for a half
//! read, copied out) on the ring thread when it completes.
//!
//! The blocking path holds the record's lock across its L2 read; this one
//! cannot (the lock would be held by a thread that moves on). It takes the
//! lock when the read completes and keeps the result only if the copy it
//! read is still the record's current L2 copy: every write drops that copy
//! under the same lock before it is acknowledged, so an unchanged pointer
//! means no write came between. Anything else ends on the blocking path.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use arcache_batch::Batch;
use arcache_l2::{L2Miss, L2Ptr};
use arcache_sync::MutexGuard;
use blockdev::DevResult;

use super::{Span, Volume};
use crate::cache::{Found, Looked};
use crate::writeback::WriteBack;

/// How a read started with [`Volume::read_async`] ends.
pub enum ReadEnd {
    /// The bytes asked for.
    Data(Vec<u8>),
    /// Finish by running this on a thread that may block.
    Blocking(Box<dyn FnOnce() -> DevResult<Vec<u8>> + Send>),
}

/// Called once with the end of an asynchronous read, on any thread, with
/// the batch of the reads that ended together (the caller's for a read
/// that ends before [`Volume::read_async`] returns).
pub type ReadDone = Box<dyn FnOnce(ReadEnd, &mut Batch) + Send>;

/// Which bytes of the record the device read fetches.
#[derive(Clone, Copy)]
enum Fetch {
    Whole,
    /// One half of a split copy, for bytes that lie in it; not cached.
    Half(u64),
}

/// One read in flight: the record and the request's bytes.
#[derive(Clone, Copy)]
struct Want {
    r: u64,
    offset: u64,
    len: usize,
    ptr: L2Ptr,
}

impl Volume {
    /// Starts a read whose bytes lie in one record that is not in RAM but
    /// has an L2 copy the ring can read; gives `done` back otherwise (the
    /// caller then uses [`Volume::read`]). Bookkeeping (statistics, zfetch,
    /// the ARC's ghost lists) is as for [`Volume::read`].
    pub fn read_async(
        &self,
        offset: u64,
        len: usize,
        done: ReadDone,
        out: &mut Batch,
    ) -> Result<(), ReadDone> {
        let Some(want) = self.async_candidate(offset, len) else { return Err(done) };
        let s = Span { first: want.r, end: want.r + 1 };
        let key = self.key(want.r);
        self.cache.observe(std::iter::once(key));
        self.count(&self.counts.reads, Some((&self.counts.read_bytes, len)));
        let fetch = match self.cache.lookup(key, false) {
            Looked::Hit(data) => {
                self.cache.count(Found::Hit, false, 1);
                let mut buf = vec![0u8; len];
                let res = self.copy_out(want.r, &data, offset, &mut buf);
                self.predict(s, false);
                let end = match res {
                    Ok(()) => ReadEnd::Data(buf),
                    Err(e) => ReadEnd::Blocking(Box::new(move || Err(e))),
                };
                done(end, out);
                return Ok(());
            }
            Looked::Cold => self.half_to_fetch(want).map_or(Fetch::Whole, Fetch::Half),
            Looked::Ghost => Fetch::Whole,
        };
        self.predict(s, true);
        self.start_l2_read(want, fetch, done, out);
        Ok(())
    }

    /// The record a read would fetch asynchronously, if it can: a read
    /// within one record, not dirty, with an L2 copy on a ring device.
    fn async_candidate(&self, offset: u64, len: usize) -> Option<Want> {
        let l2 = self.cache.l2()?;
        if len == 0 || self.check(offset, len as u64).is_err() {
            return None;
        }
        let s = self.span(offset, len as u64);
        if s.end - s.first != 1 {
            return None;
        }
        let rr = self.record_range(s.first);
        if self.wb.as_ref().is_some_and(|wb| !wb.snapshot(self.id, rr).is_empty()) {
            return None;
        }
        let ptr = l2.lookup(self.key(s.first)).filter(|&p| l2.can_read_async(p))?;
        Some(Want { r: s.first, offset, len, ptr })
    }

    /// Which half of its copy a read of a cold record needs, when it is to
    /// be served from that half and not cached (as `serve_from_half`).
    fn half_to_fetch(&self, w: Want) -> Option<u64> {
        if !self.cache.partial_reads() {
            return None;
        }
        let which = self.half_holding(w.r, &(w.offset..w.offset + w.len as u64))?;
        let rr = self.record_range(w.r);
        (self.is_split_copy(w.r, w.ptr) && self.cache.leave_uncached(self.key(w.r), rr.end - rr.start))
            .then_some(which)
    }

    fn start_l2_read(&self, w: Want, fetch: Fetch, done: ReadDone, out: &mut Batch) {
        let (Some(l2), Some(vol)) = (self.cache.l2(), self.this.upgrade()) else {
            return self.finish_blocking(w, done, out);
        };
        let half = match fetch {
            Fetch::Whole => None,
            Fetch::Half(which) => Some(which),
        };
        let key = self.key(w.r);
        let res = l2.read_async(
            key,
            w.ptr,
            half,
            Box::new(move |res, out| match fetch {
                Fetch::Whole => vol.finish_whole(w, res, done, out),
                Fetch::Half(which) => vol.finish_half(w, which, res, done, out),
            }),
        );
        if let Err(back) = res {
            // The device left the ring's reach since the check; a rare race.
            back(Err(L2Miss::Unavailable), out);
        }
    }

    /// Hands the read to a thread that may block: `fill` takes the lock,
    /// looks in RAM, on L2 and on the backing store, as a blocking read
    /// does after its ARC lookup.
    fn finish_blocking(&self, w: Want, done: ReadDone, out: &mut Batch) {
        let Some(vol) = self.this.upgrade() else {
            let closing = Box::new(|| Err(blockdev::DevError::Unsupported("the export is closing".into())));
            return done(ReadEnd::Blocking(closing), out);
        };
        let work = Box::new(move || {
            let mut buf = vec![0u8; w.len];
            vol.fill(w.r..w.r + 1, false, w.offset, Some(&mut buf))?;
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
        let Some(lock) = self.stripes[self.stripe(w.r)].try_lock() else {
            self.finish_blocking(w, done, out);
            return None;
        };
        let Some(data) = self.cache.peek(self.key(w.r)) else { return Some((lock, done)) };
        self.cache.count(Found::IoHit, false, 1);
        let mut buf = vec![0u8; w.len];
        match self.copy_out(w.r, &data, w.offset, &mut buf) {
            Ok(()) => done(ReadEnd::Data(buf), out),
            Err(_) => {
                drop(lock);
                self.finish_blocking(w, done, out);
            }
        }
        None
    }

    /// Whether the copy a ring read fetched is still the record's L2 copy;
    /// asked under the record's lock, where a yes means no write came
    /// between (a write drops the copy under that lock).
    fn copy_still_current(&self, w: Want) -> bool {
        self.cache.l2().is_some_and(|l2| l2.lookup(self.key(w.r)) == Some(w.ptr))
    }

    /// A whole copy was read: checked by L2 against its checksum; kept if
    /// it is still the record's copy, then inserted and copied out.
    fn finish_whole(&self, w: Want, res: Result<Box<[u8]>, L2Miss>, done: ReadDone, out: &mut Batch) {
        let Some((_lock, done)) = self.lock_or_answer(w, done, out) else { return };
        let (Ok(bytes), true) = (res, self.copy_still_current(w)) else {
            return self.finish_blocking(w, done, out);
        };
        let Some(rec) = self.record_from_l2(w.r, w.ptr, bytes) else {
            return self.finish_blocking(w, done, out);
        };
        let snap = self.wb.as_ref().map_or_else(Vec::new, |wb| wb.snapshot(self.id, self.record_range(w.r)));
        let rec = self.overlaid(w.r, Arc::new(rec), &snap);
        let mut buf = vec![0u8; w.len];
        if self.copy_out(w.r, &rec, w.offset, &mut buf).is_err() {
            return self.finish_blocking(w, done, out);
        }
        let c = &self.cache.counters;
        c.l2_hits.fetch_add(1, Relaxed);
        c.l2_ring_reads.fetch_add(1, Relaxed);
        self.cache.count(Found::Miss, false, 1);
        self.cache.insert_read(self.key(w.r), rec, false);
        done(ReadEnd::Data(buf), out);
    }

    /// Half a copy was read for bytes within it; copied out, not cached.
    fn finish_half(
        &self,
        w: Want,
        which: u64,
        res: Result<Box<[u8]>, L2Miss>,
        done: ReadDone,
        out: &mut Batch,
    ) {
        let Some((_lock, done)) = self.lock_or_answer(w, done, out) else { return };
        let half = self.half_range(w.r, which);
        let (Ok(mut bytes), true) = (res, self.copy_still_current(w)) else {
            return self.finish_blocking(w, done, out);
        };
        if bytes.len() as u64 != half.end - half.start {
            return self.finish_blocking(w, done, out);
        }
        let snap = self.wb.as_ref().map_or_else(Vec::new, |wb| wb.snapshot(self.id, half.clone()));
        WriteBack::apply(&snap, half.start, &mut bytes);
        let from = (w.offset - half.start) as usize;
        let buf = bytes[from..from + w.len].to_vec();
        self.count_half_read(half.end - half.start);
        self.cache.counters.l2_ring_reads.fetch_add(1, Relaxed);
        done(ReadEnd::Data(buf), out);
    }
}
