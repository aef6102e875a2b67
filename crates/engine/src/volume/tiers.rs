//! The read pipeline: ARC, then the dirty overlay, then L2, then the
//! backing store. Each tier's bytes are turned into what the reader gets
//! by one `settle_*` function, whether they were read here, on a thread
//! that may block, or arrived as an io_uring completion (`ring_read.rs`):
//! the checksum, the dirty overlay, the copy out, the insert and the
//! counting are written once.

use std::ops::Range;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use arcache_l2::L2Ptr;
use blockdev::{BlockDev, DevResult};

use super::out::{Held, Keep, Out};
use super::{runs, Volume, MAX_RECORDS_PER_IO};
use crate::cache::{Found, Looked, RecordData};
use crate::dirty::{Page, PAGE};
use crate::record::Record;
use crate::writeback::WriteBack;

/// The dirty bytes of a range, taken before its device read: a txg that
/// syncs meanwhile has put the same bytes on the device.
pub(super) type Snapshot = Vec<(u64, Arc<Page>)>;

/// An L2 copy and its verified bytes.
type L2Copy = (L2Ptr, Box<[u8]>);

impl Volume {
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> DevResult<()> {
        self.check(offset, buf.len() as u64)?;
        let len = buf.len();
        self.demand_read(offset, len, &mut Out::Copy(buf))
    }

    /// A client's read of a checked range, its bytes put in `out`: counted,
    /// seen by the sizing and the stream detection, loaded, and followed
    /// by the prefetches it predicts.
    fn demand_read(&self, offset: u64, len: usize, out: &mut Out) -> DevResult<()> {
        self.check_unchanged()?;
        let s = self.span(offset, len as u64);
        self.cache.observe((s.first..s.end).map(|r| self.key(r)));
        self.count(&self.counts.reads, Some((&self.counts.read_bytes, len)));
        self.note_request(s);
        let missed = self.load(offset, len as u64, false, Some(out))?;
        self.predict(s, missed);
        Ok(())
    }

    /// A read of whole records answered with the records themselves
    /// rather than a copy of their bytes (see `out.rs`); `Ok(None)` for a
    /// read that does not start and end on record boundaries, which goes
    /// through [`Volume::read`]: a part of a record may be served from half
    /// of its L2 copy or out of a decompressed copy, each with its own
    /// rules there.
    pub fn read_held(&self, offset: u64, len: usize) -> DevResult<Option<Vec<Held>>> {
        self.check(offset, len as u64)?;
        if !self.whole_records(offset, len as u64) {
            return Ok(None);
        }
        let s = self.span(offset, len as u64);
        let mut keep = Keep::new(s.first..s.end);
        self.demand_read(offset, len, &mut Out::Keep(&mut keep))?;
        keep.finish(self).map(Some)
    }

    /// Record `r` read whole into a buffer of its own, the copying way.
    pub(super) fn read_record_copy(&self, r: u64) -> DevResult<Vec<u8>> {
        let rr = self.record_range(r);
        let mut buf = vec![0u8; (rr.end - rr.start) as usize];
        self.fill(r..r + 1, false, rr.start, Some(&mut Out::Copy(&mut buf)))?;
        Ok(buf)
    }

    /// Puts record `r`, found for a read at `offset`, where the read wants
    /// it.
    fn put(&self, r: u64, data: &RecordData, offset: u64, out: &mut Out) -> DevResult<()> {
        match out {
            Out::Copy(buf) => self.copy_out(r, data, offset, buf),
            Out::Keep(keep) => {
                keep.keep(r, data);
                Ok(())
            }
        }
    }

    /// Brings a range into the ARC as a prefetch (NBD_CMD_CACHE).
    pub fn prefetch(&self, offset: u64, len: u64) -> DevResult<()> {
        self.check(offset, len)?;
        self.check_unchanged()?;
        self.load(offset, len, true, None).map(|_| ())
    }

    /// Reads records into the ARC as prefetches, skipping cached ones
    /// without touching their place in the lists.
    pub(super) fn prefetch_records(&self, rs: Range<u64>) -> DevResult<()> {
        let missing: Vec<u64> = rs.filter(|&r| self.cache.peek(self.key(r)).is_none()).collect();
        for run in runs(&missing) {
            self.fill(run, true, 0, None)?;
        }
        Ok(())
    }

    /// Finds every record of the range, filling missing runs from the
    /// device, and copies into `out` when given. Returns true if any record
    /// was not in RAM.
    fn load(&self, offset: u64, len: u64, prefetch: bool, mut out: Option<&mut Out>) -> DevResult<bool> {
        let s = self.span(offset, len);
        let mut missing: Vec<u64> = Vec::new();
        let mut missed = false;
        for r in s.first..s.end {
            match self.cache.lookup(self.key(r), prefetch) {
                Looked::Hit(data) => {
                    self.cache.count(Found::Hit, prefetch, 1);
                    if let Some(o) = out.as_deref_mut() {
                        self.put(r, &data, offset, o)?;
                    }
                }
                Looked::Cold if self.serve_from_half(r, offset, out.as_deref_mut().and_then(Out::buf)) => {
                    missed = true
                }
                Looked::Cold | Looked::Ghost => missing.push(r),
            }
        }
        let unit = if prefetch || missing.is_empty() { 1 } else { self.stream_unit(s) };
        let per_io = MAX_RECORDS_PER_IO.max(unit);
        for run in runs(&missing) {
            let mut start = run.start;
            while start < run.end {
                let end = (start + per_io).min(run.end);
                // A stream's miss on a store that is costly per request
                // reads on to the end of its unit: the records after the
                // request come as prefetches in the same read, and the
                // stream's next requests find them (or wait on their locks
                // while the read is under way) instead of each sending a
                // request of its own.
                // Not from a record on L2: the stream is over L2 there, and
                // a read widened from it would hold the unit's locks while
                // it reads one copy, keeping the stream's other requests
                // waiting for nothing.
                let widened = if end == run.end && unit > 1 && !self.on_l2(end - 1) {
                    (end.div_ceil(unit) * unit).min(self.records()).min(start + per_io)
                } else {
                    end
                };
                self.fill_ahead(start..widened, end, prefetch, offset, out.as_deref_mut())?;
                start = end;
            }
        }
        Ok(missed || !missing.is_empty())
    }

    /// Records per read for a miss at `s`: the backing store's read unit
    /// when it has one and `s` is part of a stream, else 1. A stream is
    /// one the last requests chain up to (`recent.rs`: known as requests
    /// arrive, however many are in flight), or one zfetch knows to be
    /// running there. (A miss right after records all in RAM is no sign:
    /// on a mostly cached store nearly every random miss is one.)
    fn stream_unit(&self, s: super::Span) -> u64 {
        let records = self.read_unit_records();
        if records == 1 || self.cache.zfetch.disable.load(Relaxed) {
            return 1;
        }
        let chained = self.recent.as_ref().is_some_and(|r| r.continues_chain(s.first));
        if chained || self.zfetch.continues_stream(s.first, s.end - s.first, &self.cache.zfetch) {
            records
        } else {
            1
        }
    }

    fn on_l2(&self, r: u64) -> bool {
        self.cache.l2().is_some_and(|l2| l2.contains(self.key(r)))
    }

    fn records(&self) -> u64 {
        self.size.div_ceil(self.recordsize)
    }

    /// The dirty bytes of `range` (none without write-back).
    pub(super) fn dirty_snapshot(&self, range: Range<u64>) -> Snapshot {
        self.wb.as_ref().map_or_else(Vec::new, |wb| wb.snapshot(self.id, range))
    }

    /// Serves the bytes a read wants of record `r` from half of its L2
    /// copy, leaving the record out of RAM (docs/l2arc.md, "Partial
    /// reads"). Only for a cold record (no ghost: not cached recently) whose
    /// wanted bytes lie in one half of a split copy and that was not read
    /// this way within the window of [`crate::cache::Cache::leave_uncached`].
    /// False when the record is to be read whole and cached instead, or the
    /// half read failed (the entry is then gone and the whole path goes to
    /// the backing store).
    fn serve_from_half(&self, r: u64, offset: u64, out: Option<&mut [u8]>) -> bool {
        let (Some(buf), Some(l2)) = (out, self.cache.l2()) else { return false };
        let key = self.key(r);
        let Some(which) = l2.lookup(key).and_then(|p| self.half_to_serve(r, offset, buf.len() as u64, p))
        else {
            return false;
        };
        let _lock = self.lock_records(r..r + 1);
        let half = self.half_range(r, which);
        let snap = self.dirty_snapshot(half.clone());
        if let Some(data) = self.cache.joined(key) {
            let ok = self.copy_out(r, &data, offset, buf).is_ok();
            if ok {
                self.cache.count(Found::IoHit, false, 1);
            }
            return ok;
        }
        let Some(ptr) = l2.lookup(key).filter(|&p| self.is_split_copy(r, p)) else { return false };
        let Ok(bytes) = l2.read_half(key, ptr, which) else { return false };
        self.settle_half(r, which, bytes, &snap, offset, buf)
    }

    /// Which half of its L2 copy `ptr` a read of `[offset, offset+len)` in
    /// cold record `r` is served from, the record left uncached; `None`
    /// when the record is to be read whole and cached instead.
    pub(super) fn half_to_serve(&self, r: u64, offset: u64, len: u64, ptr: L2Ptr) -> Option<u64> {
        if !self.cache.partial_reads() || !self.is_split_copy(r, ptr) {
            return None;
        }
        let rr = self.record_range(r);
        let want = offset.max(rr.start)..(offset + len).min(rr.end);
        let which = self.half_holding(r, &want)?;
        self.cache.leave_uncached(self.key(r), rr.end - rr.start).then_some(which)
    }

    /// Which half of record `r` holds all of `want` (bytes within it).
    fn half_holding(&self, r: u64, want: &Range<u64>) -> Option<u64> {
        let rr = self.record_range(r);
        let mid = rr.start + (rr.end - rr.start) / 2;
        if want.end <= mid {
            Some(0)
        } else if want.start >= mid {
            Some(1)
        } else {
            None
        }
    }

    /// Whether `ptr` is a copy of record `r` whose halves can be read
    /// apart: stored split and uncompressed, the record's full length.
    pub(super) fn is_split_copy(&self, r: u64, ptr: L2Ptr) -> bool {
        let rr = self.record_range(r);
        ptr.split() && ptr.blob_len() == rr.end - rr.start
    }

    /// The bytes of half `which` of record `r`.
    pub(super) fn half_range(&self, r: u64, which: u64) -> Range<u64> {
        let rr = self.record_range(r);
        let half = (rr.end - rr.start) / 2;
        rr.start + which * half..rr.start + (which + 1) * half
    }

    /// The L2 tier, half a copy: the bytes of record `r` that `out` (at
    /// `offset`) wants, all within half `which`, with dirty bytes laid
    /// over; the record stays uncached. False if the bytes are not the
    /// half's length.
    pub(super) fn settle_half(
        &self,
        r: u64,
        which: u64,
        mut bytes: Box<[u8]>,
        snap: &[(u64, Arc<Page>)],
        offset: u64,
        out: &mut [u8],
    ) -> bool {
        let half = self.half_range(r, which);
        if bytes.len() as u64 != half.end - half.start {
            return false;
        }
        WriteBack::apply(snap, half.start, &mut bytes);
        let rr = self.record_range(r);
        let want = offset.max(rr.start)..(offset + out.len() as u64).min(rr.end);
        out[(want.start - offset) as usize..(want.end - offset) as usize]
            .copy_from_slice(&bytes[(want.start - half.start) as usize..(want.end - half.start) as usize]);
        let c = &self.cache.counters;
        c.l2_hits.fetch_add(1, Relaxed);
        c.l2_partial_reads.fetch_add(1, Relaxed);
        c.l2_partial_read_bytes.fetch_add(half.end - half.start, Relaxed);
        self.cache.count(Found::Miss, false, 1);
        true
    }

    /// Brings records `rs` into the cache under their locks: records another
    /// request filled meanwhile come from RAM, records on L2 from L2 (checked
    /// by checksum), the rest from the backing device in contiguous reads.
    pub(super) fn fill(
        &self,
        rs: Range<u64>,
        prefetch: bool,
        offset: u64,
        out: Option<&mut Out>,
    ) -> DevResult<()> {
        let ahead = rs.end;
        self.fill_ahead(rs, ahead, prefetch, offset, out)
    }

    /// [`Volume::fill`] where records from `ahead` on are read ahead of
    /// the request: brought in as prefetches when missing, left alone when
    /// cached.
    fn fill_ahead(
        &self,
        rs: Range<u64>,
        ahead: u64,
        prefetch: bool,
        offset: u64,
        mut out: Option<&mut Out>,
    ) -> DevResult<()> {
        let _locks = self.lock_records(rs.clone());
        let snap = self.dirty_snapshot(self.record_range(rs.start).start..self.record_range(rs.end - 1).end);
        let mut absent: Vec<u64> = Vec::new();
        let mut ahead_from_backing: Vec<u64> = Vec::new();
        for r in rs {
            let key = self.key(r);
            let cached = if prefetch || r >= ahead { self.cache.peek(key) } else { self.cache.joined(key) };
            if r >= ahead {
                // Only what must come from the backing store is read
                // ahead: a record on L2 is left to its own request, so a
                // stream over L2 is read by many threads at once rather
                // than one thread per unit while the others wait.
                if cached.is_none() && !self.on_l2(r) {
                    ahead_from_backing.push(r);
                }
                continue;
            }
            match cached {
                Some(data) => {
                    self.cache.count(Found::IoHit, prefetch, 1);
                    if let Some(o) = out.as_deref_mut() {
                        self.put(r, &data, offset, o)?;
                    }
                }
                None => absent.push(r),
            }
        }
        let mut from_backing: Vec<u64> = Vec::new();
        for (r, copy) in self.read_l2(&absent) {
            let settled = match copy {
                Some((ptr, bytes)) => {
                    self.settle_l2(r, ptr, bytes, &snap, prefetch, offset, out.as_deref_mut())?
                }
                None => false,
            };
            if !settled {
                from_backing.push(r);
            }
        }
        from_backing.extend(ahead_from_backing);
        for run in runs(&from_backing) {
            self.fill_from_backing(run, ahead, prefetch, offset, out.as_deref_mut(), &snap)?;
        }
        Ok(())
    }

    /// A record read from L2 with any dirty sectors laid over it.
    fn overlaid(&self, r: u64, rec: RecordData, snap: &[(u64, Arc<Page>)]) -> RecordData {
        let rr = self.record_range(r);
        if !snap.iter().any(|(p, _)| p * PAGE < rr.end && (p + 1) * PAGE > rr.start) {
            return rec;
        }
        match rec.to_vec() {
            Ok(mut v) => {
                WriteBack::apply(snap, rr.start, &mut v);
                Arc::new(Record::new(&v, self.cache.compress_enabled()))
            }
            Err(_) => rec,
        }
    }

    /// The verified bytes of the L2 copies of `rs`, in order; `None` for
    /// records with no copy or whose copy could not be read.
    fn read_l2(&self, rs: &[u64]) -> Vec<(u64, Option<L2Copy>)> {
        let Some(l2) = self.cache.l2() else {
            return rs.iter().map(|&r| (r, None)).collect();
        };
        let c = &self.cache.counters;
        let mut found = Vec::new();
        let mut result = Vec::with_capacity(rs.len());
        for &r in rs {
            match l2.lookup(self.key(r)) {
                Some(ptr) => found.push((r, ptr)),
                None => {
                    c.l2_misses.fetch_add(1, Relaxed);
                    result.push((r, None));
                }
            }
        }
        let wanted: Vec<(u64, L2Ptr)> = found.iter().map(|&(r, p)| (self.key(r), p)).collect();
        for ((r, ptr), bytes) in found.into_iter().zip(l2.read_many(&wanted)) {
            match bytes {
                Ok(b) => result.push((r, Some((ptr, b)))),
                Err(_) => {
                    l2.invalidate(self.key(r));
                    c.l2_misses.fetch_add(1, Relaxed);
                    result.push((r, None));
                }
            }
        }
        result.sort_by_key(|(r, _)| *r);
        result
    }

    /// The L2 tier, a whole copy: record `r` from the verified bytes of its
    /// copy `ptr`, dirty bytes laid over, copied into `out` and inserted.
    /// False, and the copy dropped, if the bytes do not decode to the
    /// record (the backing store is read instead).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn settle_l2(
        &self,
        r: u64,
        ptr: L2Ptr,
        bytes: Box<[u8]>,
        snap: &[(u64, Arc<Page>)],
        prefetch: bool,
        offset: u64,
        out: Option<&mut Out>,
    ) -> DevResult<bool> {
        let c = &self.cache.counters;
        let rr = self.record_range(r);
        let Ok(rec) = Record::from_stored(bytes, (rr.end - rr.start) as u32, ptr.flags().compressed) else {
            if let Some(l2) = self.cache.l2() {
                l2.invalidate(self.key(r));
            }
            c.l2_misses.fetch_add(1, Relaxed);
            return Ok(false);
        };
        let rec = self.overlaid(r, Arc::new(rec), snap);
        c.l2_hits.fetch_add(1, Relaxed);
        self.cache.count(Found::Miss, prefetch, 1);
        if let Some(o) = out {
            self.put(r, &rec, offset, o)?;
        }
        self.cache.insert_read(self.key(r), rec, prefetch);
        Ok(true)
    }

    fn fill_from_backing(
        &self,
        need: Range<u64>,
        ahead: u64,
        prefetch: bool,
        offset: u64,
        mut out: Option<&mut Out>,
        snap: &[(u64, Arc<Page>)],
    ) -> DevResult<()> {
        let bytes = self.record_range(need.start).start..self.record_range(need.end - 1).end;
        self.cache.fill_bufs.with((bytes.end - bytes.start) as usize, |block| {
            let started = std::time::Instant::now();
            let read = read_backing(self.dev.as_ref(), block, bytes.start);
            self.count_backing_read(block.len(), started, read)?;
            let split = ahead.clamp(need.start, need.end);
            self.overlay_block(need.clone(), block, offset, out.as_deref_mut().and_then(Out::buf), snap);
            if split > need.start {
                self.insert_block(need.start..split, block, prefetch, out.and_then(Out::keep));
            }
            if split < need.end {
                // Every record but a volume's last is whole, so the records
                // read ahead start `split - need.start` records into the block.
                let at = ((split - need.start) * self.recordsize) as usize;
                self.insert_block(split..need.end, &block[at..], true, None);
            }
            Ok(())
        })
    }

    /// Counts a backing read of `len` bytes started at `started` that
    /// ended with `res`, and passes `res` on.
    pub(super) fn count_backing_read(
        &self,
        len: usize,
        started: std::time::Instant,
        res: DevResult<()>,
    ) -> DevResult<()> {
        let c = &self.cache.counters;
        c.backing_reads.fetch_add(1, Relaxed);
        c.backing_read_bytes.fetch_add(len as u64, Relaxed);
        if res.is_err() {
            c.backing_errors.fetch_add(1, Relaxed);
            return res;
        }
        c.backing_read_ns.fetch_add(started.elapsed().as_nanos() as u64, Relaxed);
        Ok(())
    }

    /// The backing tier, first half: the dirty bytes laid over `block`
    /// (the backing store's bytes from record `need.start` on) and the
    /// reader's bytes copied into `out`, so a caller can answer before the
    /// records are inserted.
    pub(super) fn overlay_block(
        &self,
        need: Range<u64>,
        block: &mut [u8],
        offset: u64,
        out: Option<&mut [u8]>,
        snap: &[(u64, Arc<Page>)],
    ) {
        let start = self.record_range(need.start).start;
        WriteBack::apply(snap, start, block);
        let Some(buf) = out else { return };
        for r in need {
            let rr = self.record_range(r);
            let from = offset.max(rr.start);
            let to = (offset + buf.len() as u64).min(rr.end);
            if from < to {
                buf[(from - offset) as usize..(to - offset) as usize]
                    .copy_from_slice(&block[(from - start) as usize..(to - start) as usize]);
            }
        }
    }

    /// The second half: `block`'s records (dirty bytes laid over), from
    /// record `need.start` on, into the ARC, counted as misses, and into
    /// `keep` when given.
    pub(super) fn insert_block(
        &self,
        need: Range<u64>,
        block: &[u8],
        prefetch: bool,
        mut keep: Option<&mut Keep>,
    ) {
        let start = self.record_range(need.start).start;
        let compress = self.cache.compress_enabled();
        for r in need.clone() {
            let rr = self.record_range(r);
            let slice = &block[(rr.start - start) as usize..(rr.end - start) as usize];
            let rec = Arc::new(Record::new(slice, compress));
            if let Some(k) = keep.as_deref_mut() {
                if rec.is_compressed() {
                    // The plain bytes are in hand: copied, not decompressed.
                    k.keep_bytes(r, slice);
                } else {
                    k.keep(r, &rec);
                }
            }
            self.cache.insert_read(self.key(r), rec, prefetch);
        }
        self.cache.count(Found::Miss, prefetch, need.end - need.start);
    }
}

/// The fail point `backing.read` of fault-test builds: an injected error
/// for a backing read at `offset`, whichever way it is done.
#[cfg_attr(not(feature = "failpoints"), allow(unused_variables))]
pub(super) fn injected_backing_error(offset: u64) -> DevResult<()> {
    fail::fail_point!("backing.read", |_| blockdev::injected("backing.read", offset));
    Ok(())
}

/// Reads the backing store, or fails as the fail point says.
fn read_backing(dev: &dyn BlockDev, buf: &mut [u8], offset: u64) -> DevResult<()> {
    injected_backing_error(offset)?;
    dev.read_at(buf, offset)
}
