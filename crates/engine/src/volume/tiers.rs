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
use super::{runs, Volume, MAX_RECORDS_PER_IO, UNIT_GATES};
use crate::cache::{Found, Looked, RecordData};
use crate::dirty::{Page, PAGE};
use crate::record::Record;
use crate::writeback::WriteBack;
use arcache_sync::MutexGuard;

/// Which way a stream's miss may claim more of its unit: `back` to the
/// unit's start (it is a run's first piece), `on` to its end (its last).
#[derive(Clone, Copy)]
struct Reach {
    back: bool,
    on: bool,
}

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
        self.load(offset, len as u64, false, Some(out))
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
        self.load(offset, len, true, None)
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
    /// device, and copies into `out` when given; a demand read tells zfetch
    /// of itself before its fills.
    fn load(&self, offset: u64, len: u64, prefetch: bool, mut out: Option<&mut Out>) -> DevResult<()> {
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
        if !prefetch {
            // Before this read's own fills, which may wait for a GET: a
            // stream whose requests each waited that long before zfetch
            // heard of them had its prefetches issued behind the requests
            // already in flight, which then each sent a small read of their
            // own (the ring path predicts before its read too).
            self.predict(s, missed || !missing.is_empty());
        }
        let per_io = MAX_RECORDS_PER_IO.max(unit);
        for run in runs(&missing) {
            let mut start = run.start;
            while start < run.end {
                let end = (start + per_io).min(run.end);
                // A stream's miss on a store that is costly per request
                // reads the rest of its unit that nobody is reading: the
                // stream's other requests find those records (or wait on
                // their locks while the read is under way) instead of each
                // sending a request of its own.
                // Not from a record on L2: the stream is over L2 there, and
                // a read widened from it would hold the unit's locks while
                // it reads one copy, keeping the stream's other requests
                // waiting for nothing.
                if unit > 1 && !self.on_l2(end - 1) {
                    let reach = Reach { back: start == run.start, on: end == run.end };
                    let (locks, rs) = self.claim_unit(start..end, unit, per_io, reach);
                    self.fill_locked(rs, start..end, prefetch, offset, out.as_deref_mut(), locks)?;
                } else {
                    self.fill(start..end, prefetch, offset, out.as_deref_mut())?;
                }
                start = end;
            }
        }
        Ok(())
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
        let locks = self.lock_records(rs.clone());
        self.fill_locked(rs.clone(), rs, prefetch, offset, out, locks)
    }

    /// Takes, for a stream's miss of `own` on a store with read units of
    /// `unit` records, the locks of `own` and of the records around it in
    /// its unit that are neither in RAM nor locked, backwards
    /// when `reach.back`, onwards when `reach.on`; at most `per_io`
    /// records in all. Only `own` when a record of it is in RAM once its
    /// locks are held: whoever held them read around it.
    /// Own locks are tried under the gate first, so of a unit's requests
    /// arriving together the first takes the rest of the unit before the
    /// others have locked their own.
    ///
    /// Why: a client streams with many requests in flight (nbdcopy: 64 of
    /// 256 KiB), so a unit's requests reach the workers together. Each
    /// locked its own records first and then waited for the next ones',
    /// so they read in a chain, each its own 256 KiB after the one after
    /// it had finished. The records around are only tried, never waited
    /// for, and claims of one unit are made one at a time (`unit_gates`),
    /// so the first takes what is left of the unit and the others wait for
    /// its read. `own` is waited for, holding nothing: its lock may be
    /// another stream's (`STRIPES` locks are shared by records
    /// `STRIPES` apart), and a miss that gave up then read its own 256 KiB.
    fn claim_unit(
        &self,
        own: Range<u64>,
        unit: u64,
        per_io: u64,
        reach: Reach,
    ) -> (Vec<MutexGuard<'_, ()>>, Range<u64>) {
        let gate = &self.unit_gates[((own.start / unit) % UNIT_GATES as u64) as usize];
        let mut held = gate.lock();
        let mut locks = match self.try_lock_records(own.clone()) {
            Some(locks) => locks,
            None => {
                drop(held);
                #[cfg(test)]
                tests::CLAIM_WAITS.with(|hook| hook.borrow().as_ref().map(|f| f()));
                let locks = self.lock_records(own.clone());
                held = gate.lock();
                locks
            }
        };
        if own.clone().any(|r| self.cache.peek(self.key(r)).is_some()) {
            return (locks, own);
        }
        let _gate = held;
        let mut lo = own.start;
        if reach.back {
            let floor = (own.start / unit * unit).max(own.end.saturating_sub(per_io));
            while lo > floor && self.take_if_free(lo - 1, &mut locks) {
                lo -= 1;
            }
        }
        let mut hi = own.end;
        if reach.on {
            // Within the unit whose gate this holds.
            let unit_end = (own.start / unit + 1) * unit;
            let ceiling = unit_end.max(own.end).min(self.records()).min(lo + per_io);
            while hi < ceiling && self.take_if_free(hi, &mut locks) {
                hi += 1;
            }
        }
        (locks, lo..hi)
    }

    /// Adds the lock of record `r` to `locks` if nobody holds it and the
    /// record is not in RAM; never waits. A record on L2 is taken but not
    /// read ([`Volume::fill_locked`] leaves it to its own request), so the
    /// claim goes on past it to what must come from the backing store.
    fn take_if_free<'a>(&'a self, r: u64, locks: &mut Vec<MutexGuard<'a, ()>>) -> bool {
        if self.cache.peek(self.key(r)).is_some() {
            return false;
        }
        self.stripe(r).lock.try_lock().map(|g| locks.push(g)).is_some()
    }

    /// [`Volume::fill`] of `rs`, whose locks the caller holds, where the
    /// records outside `wanted` are read ahead of the request: brought in
    /// as prefetches when missing, left alone when cached.
    fn fill_locked(
        &self,
        rs: Range<u64>,
        wanted: Range<u64>,
        prefetch: bool,
        offset: u64,
        mut out: Option<&mut Out>,
        _locks: Vec<MutexGuard<'_, ()>>,
    ) -> DevResult<()> {
        let snap = self.dirty_snapshot(self.record_range(rs.start).start..self.record_range(rs.end - 1).end);
        let mut absent: Vec<u64> = Vec::new();
        let mut ahead_from_backing: Vec<u64> = Vec::new();
        for r in rs {
            let key = self.key(r);
            let is_ahead = !wanted.contains(&r);
            let cached = if prefetch || is_ahead { self.cache.peek(key) } else { self.cache.joined(key) };
            if is_ahead {
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
        from_backing.sort_unstable();
        for run in runs(&from_backing) {
            self.fill_from_backing(run, wanted.clone(), prefetch, offset, out.as_deref_mut(), &snap)?;
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
        wanted: Range<u64>,
        prefetch: bool,
        offset: u64,
        mut out: Option<&mut Out>,
        snap: &[(u64, Arc<Page>)],
    ) -> DevResult<()> {
        if self.dev.scatters_reads() {
            return self.fill_scattered(need, wanted, prefetch, offset, out, snap);
        }
        let bytes = self.record_range(need.start).start..self.record_range(need.end - 1).end;
        self.cache.fill_bufs.with((bytes.end - bytes.start) as usize, |block| {
            let started = std::time::Instant::now();
            let read = read_backing(self.dev.as_ref(), block, bytes.start);
            self.count_backing_read(block.len(), started, read)?;
            self.overlay_block(need.clone(), block, offset, out.as_deref_mut().and_then(Out::buf), snap);
            // Records read ahead of the request, before and after the ones
            // it wants, go in as prefetches. Every record but a volume's
            // last is whole, so record `r` starts `r - need.start` records
            // into the block.
            let Range { start: from, end: to } = asked(&need, &wanted);
            let part = |rs: Range<u64>| &block[((rs.start - need.start) * self.recordsize) as usize..];
            if from > need.start {
                self.insert_block(need.start..from, part(need.start..from), true, None);
            }
            if to > from {
                self.insert_block(from..to, part(from..to), prefetch, out.and_then(Out::keep));
            }
            if to < need.end {
                self.insert_block(to..need.end, part(to..need.end), true, None);
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
            let rec = self
                .probes
                .compressed_of(slice, compress)
                .unwrap_or_else(|| Record::raw_boxed(self.cache.record_bufs.copy_of(slice)));
            let rec = Arc::new(rec);
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

/// The records of a backing read `need` that its request asked for
/// (`wanted` clamped to it); those before and after are read ahead.
pub(super) fn asked(need: &Range<u64>, wanted: &Range<u64>) -> Range<u64> {
    let from = wanted.start.clamp(need.start, need.end);
    from..wanted.end.clamp(from, need.end)
}

/// Reads the backing store, or fails as the fail point says.
fn read_backing(dev: &dyn BlockDev, buf: &mut [u8], offset: u64) -> DevResult<()> {
    injected_backing_error(offset)?;
    dev.read_at(buf, offset)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::volume::VolumeConfig;
    use crate::{Cache, CacheConfig};
    use blockdev::MemDev;

    const RS: u64 = 4096;
    const UNIT: u64 = 16;

    fn unit_volume() -> Arc<Volume> {
        let cache = Cache::new(CacheConfig {
            arc_min: 1 << 20,
            arc_max: 4 << 20,
            min_prefetch_ms: 0,
            compress: false,
        });
        let store = MemDev::with_read_unit(64 * RS, UNIT * RS);
        let cfg = VolumeConfig { name: "u".into(), recordsize: RS, read_only: true };
        Volume::new(0, cfg, Arc::new(store), cache)
    }

    const BOTH: Reach = Reach { back: true, on: true };

    thread_local! {
        /// Called on a claim's thread when its own records' locks are
        /// taken and it is about to wait for them (its gate let go): what
        /// shows a race test reached the wait it is about.
        pub(super) static CLAIM_WAITS: std::cell::RefCell<Option<Box<dyn Fn()>>> =
            const { std::cell::RefCell::new(None) };
    }

    /// Runs `f` on every claim of this thread that waits for its own locks.
    fn on_claim_wait(f: impl Fn() + 'static) {
        CLAIM_WAITS.with(|hook| *hook.borrow_mut() = Some(Box::new(f)));
    }

    /// A stream's miss takes, around its own records, those of its unit
    /// that nobody reads and RAM lacks, backwards and onwards, stopping at
    /// the first that is locked or cached, within the unit, `per_io` and
    /// the reach it is given.
    #[test]
    fn a_claim_takes_what_nobody_reads_of_its_unit_both_ways() {
        let vol = unit_volume();
        // Record 26 in RAM (a prefetch reads only it: no stream).
        vol.prefetch(26 * RS, RS).unwrap();
        assert!(vol.cache.peek(vol.key(26)).is_some());
        {
            // Another request reads record 18 (its lock held).
            let _reading = vol.stripe(18).lock.lock();
            let (locks, rs) = vol.claim_unit(20..21, UNIT, 64, BOTH);
            assert_eq!(rs, 19..26);
            assert_eq!(locks.len(), 7, "a lock per record taken");
        }
        assert_eq!(vol.claim_unit(20..21, UNIT, 64, BOTH).1, 16..26);
        assert_eq!(vol.claim_unit(20..21, UNIT, 64, Reach { back: false, on: true }).1, 20..26);
        assert_eq!(vol.claim_unit(20..21, UNIT, 64, Reach { back: true, on: false }).1, 16..21);
        assert_eq!(vol.claim_unit(33..35, UNIT, 64, BOTH).1, 32..48);
        assert_eq!(vol.claim_unit(33..35, UNIT, 4, BOTH).1, 32..36, "at most per_io");
        // Across a unit's end: no further than its own records in the next.
        assert_eq!(vol.claim_unit(47..49, UNIT, 64, BOTH).1, 32..49);
        // Its own record in RAM (read by whoever held its lock): only that.
        assert_eq!(vol.claim_unit(26..27, UNIT, 64, BOTH).1, 26..27);
    }

    /// A claim waits for its own records' lock, held by another thread,
    /// rather than reading them apart from the rest of the unit.
    #[test]
    fn a_claim_waits_for_its_own_records_and_then_takes_the_rest() {
        let vol = unit_volume();
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (waiting_tx, waiting_rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            let v = &vol;
            let holder = s.spawn(move || {
                // A record of another stream that shares record 18's lock
                // (as many records apart as there are locks), held until
                // the claim waits for it.
                let _other = v.stripe(18 + v.stripes.len() as u64).lock.lock();
                held_tx.send(()).unwrap();
                waiting_rx.recv_timeout(std::time::Duration::from_secs(5))
            });
            held_rx.recv().unwrap();
            on_claim_wait(move || waiting_tx.send(()).unwrap());
            let (_locks, rs) = vol.claim_unit(18..19, UNIT, 64, BOTH);
            CLAIM_WAITS.with(|hook| hook.borrow_mut().take());
            assert!(holder.join().unwrap().is_ok(), "the claim waited for record 18's lock");
            assert_eq!(rs, 16..32, "the whole unit, not record 18 alone");
        });
    }

    /// A claim waiting for its own record's lock does not hold its unit's
    /// gate meanwhile: another request's claim in the same unit goes on.
    #[test]
    fn a_claim_waiting_for_its_own_lock_lets_the_units_other_claims_go_on() {
        let vol = unit_volume();
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (other_tx, other_rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            let v = &vol;
            // Holds record 18's lock until the other claim is done, or 5 s.
            let holder = s.spawn(move || {
                let _reading = v.stripe(18).lock.lock();
                held_tx.send(()).unwrap();
                other_rx.recv_timeout(std::time::Duration::from_secs(5)).is_ok()
            });
            held_rx.recv().unwrap();
            let (waiting_tx, waiting_rx) = std::sync::mpsc::channel();
            let waiter = s.spawn(move || {
                on_claim_wait(move || waiting_tx.send(()).unwrap());
                v.claim_unit(18..19, UNIT, 64, BOTH).1
            });
            // The waiter is at its wait (the race this test is about).
            waiting_rx
                .recv_timeout(std::time::Duration::from_secs(5))
                .expect("the claim waits for record 18");
            let (_locks, rs) = vol.claim_unit(24..25, UNIT, 64, Reach { back: false, on: true });
            assert_eq!(rs, 24..32);
            // The holder is gone if it gave up.
            let _ = other_tx.send(());
            drop(_locks);
            assert!(holder.join().unwrap(), "the other claim waited for the first one's gate");
            assert_eq!(waiter.join().unwrap().start, 16);
        });
    }

    /// Records a claim read ahead of or behind the request come into RAM
    /// as the store's bytes; the request gets exactly its own.
    #[test]
    fn a_stream_miss_that_claims_its_unit_reads_it_once_and_right() {
        let vol = unit_volume();
        let data: Vec<u8> = (0..64 * RS).map(|i| (i / 7 % 251) as u8).collect();
        vol.dev.write_at(&data, 0).unwrap();
        let (locks, rs) = vol.claim_unit(20..22, UNIT, 64, BOTH);
        assert_eq!(rs, 16..32);
        let mut buf = vec![0u8; (2 * RS) as usize];
        vol.fill_locked(rs, 20..22, false, 20 * RS, Some(&mut Out::Copy(&mut buf)), locks).unwrap();
        assert!(buf[..] == data[(20 * RS) as usize..(22 * RS) as usize]);
        // The request's two records are its misses; the other fourteen,
        // before and after it, came in as prefetches (not as re-use when
        // the stream's own requests for them arrive).
        let st = vol.cache.stats();
        assert_eq!((st.demand_data_misses, st.prefetch_data_misses), (2, 14));
        for r in 16..32 {
            let rec = vol.cache.peek(vol.key(r)).unwrap_or_else(|| panic!("record {r} in RAM"));
            let mut got = vec![0u8; RS as usize];
            rec.copy_to(0, &mut got).unwrap();
            assert!(got[..] == data[(r * RS) as usize..((r + 1) * RS) as usize], "record {r}");
        }
    }
}
