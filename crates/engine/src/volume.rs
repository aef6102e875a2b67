//! One export: a backing device cut into records that live in the shared
//! ARC. Reads fill whole records; writes go through to the backing device
//! and then update the cached records they touch.
//!
//! Staleness is prevented by record locks (striped): a miss-fill and a write
//! of the same record never overlap, so a fill cannot put bytes read before
//! a write into the cache after that write updated it.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use std::time::Instant;

use arc_policy::Key;
use arcache_sync::{Mutex, MutexGuard};
use blockdev::{BlockDev, DevError, DevResult};

use crate::cache::{Cache, Found, RecordData};
use crate::dirty::{self, Page, PAGE, SECTOR};
use crate::record::Record;
use crate::writeback::{write_backing, Backing, Change, WriteBack};
use crate::zfetch::Zfetch;

mod changes;
mod out;
mod recent;
mod record_write;
mod ring_read;
mod scatter;
mod tiers;
pub use out::Held;

use record_write::RecordWrite;
pub use ring_read::{ReadDone, ReadEnd};

/// The ZFS `sync` property of an export.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncMode {
    /// FLUSH and FUA make earlier writes durable; plain writes are acknowledged from RAM.
    Standard = 0,
    /// Every write is durable before it is acknowledged.
    Always = 1,
    /// FLUSH and FUA do nothing (unsafe).
    Disabled = 2,
}

impl SyncMode {
    /// In the order of their numbers (the `sync` tunable's values).
    pub const ALL: [SyncMode; 3] = [SyncMode::Standard, SyncMode::Always, SyncMode::Disabled];

    pub const fn name(self) -> &'static str {
        match self {
            SyncMode::Standard => "standard",
            SyncMode::Always => "always",
            SyncMode::Disabled => "disabled",
        }
    }

    /// The mode numbered `v`; anything unknown is `Standard`.
    pub fn from_index(v: u64) -> SyncMode {
        Self::ALL.get(v as usize).copied().unwrap_or(SyncMode::Standard)
    }
}

/// Record locks per volume; record `r` takes lock `r % STRIPES`. A
/// stream's prefetches each hold the locks of a whole read unit while they
/// read it (as does a stream's miss read on to the end of its unit), and
/// any request for a record whose lock such a read holds waits for it; so
/// the units the prefetch threads may have under way at once must not
/// share a lock. Before, 1,024 locks taken by a hash of the key left only
/// 610 records in a row (Fibonacci hashing's spacing) on locks of their
/// own, two units of 256: a stream's third unit waited for its first, and
/// its requests behind both (part of what held bench/s3.sh's cold stream
/// at 417 MB/s, bench/results/s3-ddd3858.md). Nine units of 512 records:
/// the eight prefetch threads' and the one a stream's own miss reads on to
/// the end of (with eight, that ninth unit shared locks with the first and
/// waited for it). 72 KiB per volume.
const STRIPES: usize = 9 * 512;

/// Most records one backing IO fills or writes at once; bounds the locks
/// one request holds and the size of a single device request.
const MAX_RECORDS_PER_IO: u64 = 64;
/// Most records a read unit may span (`BlockDev::read_unit`), and so one
/// read of a stream over such a store: more than `MAX_RECORDS_PER_IO`, so
/// exports of small records still read an object store in megabytes
/// (S3's 8 MiB of 16K records: half the GETs of 4 MiB ones), but no more
/// than lets the prefetch threads' units be on locks of their own.
const MAX_UNIT_RECORDS: u64 = (STRIPES / (crate::prefetch::PREFETCH_THREADS + 1)) as u64;

/// Gates of the read units claimed at once (see `Volume::unit_gates`):
/// more than the units a few streams have in flight, so two seldom share.
const UNIT_GATES: usize = 64;

/// Record locks of a volume over a store with a read unit: a stream's
/// units from the eight prefetch threads and its own misses, for each of
/// several streams at once. nbdcopy reads four 128 MiB segments side by
/// side, each stream with up to `zfetch_max_distance` (64 MiB, eight units
/// of S3's 8 MiB) prefetched ahead, and with `STRIPES` locks their units
/// shared locks: a unit's requests then waited for another stream's
/// read and, all woken together, each read its own 256 KiB (many of
/// bench/s3.sh's cold GETs). 576 KiB per such volume; the others keep
/// `STRIPES`.
const UNIT_STORE_STRIPES: usize = 8 * STRIPES;

/// The lock of record `record` among `count` (see `STRIPES`): consecutive
/// records take consecutive locks, so no two of `count` records in a row
/// share one.
fn stripe_of(record: u64, count: usize) -> usize {
    (record % count as u64) as usize
}

/// Compressed records at least this large are kept decompressed in RAM once
/// read or written in part, so small IO on large records costs what it
/// costs on small ones (see `Cache::keep_decompressed`).
const HOT_PLAIN_MIN: u64 = 32 << 10;

pub struct VolumeConfig {
    pub name: String,
    pub recordsize: u64,
    pub read_only: bool,
}

pub struct Volume {
    id: u16,
    name: String,
    dev: Arc<dyn BlockDev>,
    size: u64,
    recordsize: u64,
    read_only: bool,
    cache: Arc<Cache>,
    stripes: Vec<Stripe>,
    /// The IO ring backing-store reads may go through, and whether they
    /// may now (`backing_ring_reads`).
    ring: std::sync::OnceLock<Arc<blockdev::uring::Uring>>,
    ring_on: arcache_sync::atomic::AtomicBool,
    /// Ranges known to read as zeroes, for block status (see `ZeroMap`).
    zeroed: crate::extents::KnownZeroes,
    zfetch: Zfetch,
    /// The last requests, on a store with a read unit (see `recent.rs`).
    recent: Option<recent::Recent>,
    /// Taken by a stream's miss while it claims the rest of its read unit
    /// (`tiers.rs`, `claim_unit`): unit `u` takes gate `u % UNIT_GATES`.
    unit_gates: Vec<Mutex<()>>,
    /// The store's read unit in records (1: none), and whether streams
    /// read in it now (`backing_read_units`).
    unit: u64,
    units_on: arcache_sync::atomic::AtomicBool,
    /// For prefetch jobs, which outlive the request that started them.
    this: Weak<Volume>,
    /// Write-back, when the cache has it; otherwise writes go through.
    wb: Option<Arc<WriteBack>>,
    sync: AtomicU8,
    counts: VolumeCounts,
    /// Whether this export's reads are worth a compression probe.
    probes: crate::record::ProbeSkip,
}

/// The lock of the records hashed to it, and the count of write guards
/// it has given out and taken back: odd while a write holds it. A read that
/// cannot hold the lock across its device read (a ring read) notes the
/// count before and checks it after, under the lock.
/// The count is arcache-sync's: it is what a ring read and a write hand
/// each other outside the lock, so shuttle must see it.
pub(super) struct Stripe {
    lock: Mutex<()>,
    writes: arcache_sync::atomic::AtomicU64,
}

/// What clients asked of one export, for per-export metrics.
#[derive(Debug, Default)]
pub struct VolumeCounts {
    pub reads: AtomicU64,
    pub read_bytes: AtomicU64,
    pub writes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub flushes: AtomicU64,
    pub discards: AtomicU64,
    /// Ranges the store said another server changed underneath, and
    /// their bytes (see `changes.rs`).
    pub store_changes: AtomicU64,
    pub store_changed_bytes: AtomicU64,
}

/// Records `first..last+1` and the byte range of the request within them.
#[derive(Debug, Clone, Copy)]
struct Span {
    first: u64,
    end: u64,
}

impl Volume {
    /// A volume whose writes go straight to `dev` (write-through). `id`
    /// must be unique among the volumes sharing `cache`.
    pub fn new(id: u16, cfg: VolumeConfig, dev: Arc<dyn BlockDev>, cache: Arc<Cache>) -> Arc<Volume> {
        Volume::open(id, cfg, dev, cache, None)
    }

    /// A volume whose writes are acknowledged once dirty in `wb`
    /// (write-back).
    pub fn with_writeback(
        id: u16,
        cfg: VolumeConfig,
        dev: Arc<dyn BlockDev>,
        cache: Arc<Cache>,
        wb: Arc<WriteBack>,
    ) -> Arc<Volume> {
        Volume::open(id, cfg, dev, cache, Some(wb))
    }

    fn open(
        id: u16,
        cfg: VolumeConfig,
        dev: Arc<dyn BlockDev>,
        cache: Arc<Cache>,
        wb: Option<Arc<WriteBack>>,
    ) -> Arc<Volume> {
        assert!(cfg.recordsize.is_power_of_two(), "recordsize is validated by the caller");
        let size = dev.size();
        if let Some(wb) = &wb {
            wb.register(id, Backing { dev: Arc::clone(&dev), size, cache: Arc::clone(&cache) });
        }
        let unit = read_unit_records(dev.as_ref(), cfg.recordsize);
        let vol = Arc::new_cyclic(|this| Volume {
            id,
            name: cfg.name,
            size,
            read_only: cfg.read_only || dev.is_read_only(),
            recordsize: cfg.recordsize,
            dev,
            cache,
            stripes: (0..if unit > 1 { UNIT_STORE_STRIPES } else { STRIPES })
                .map(|_| Stripe { lock: Mutex::new(()), writes: arcache_sync::atomic::AtomicU64::new(0) })
                .collect(),
            ring: std::sync::OnceLock::new(),
            ring_on: arcache_sync::atomic::AtomicBool::new(true),
            zeroed: crate::extents::KnownZeroes::default(),
            zfetch: Zfetch::with_unit(cfg.recordsize, size, unit),
            recent: (unit > 1).then(recent::Recent::new),
            unit_gates: (0..UNIT_GATES).map(|_| Mutex::new(())).collect(),
            unit,
            units_on: arcache_sync::atomic::AtomicBool::new(true),
            this: this.clone(),
            wb,
            sync: AtomicU8::new(SyncMode::Standard as u8),
            counts: VolumeCounts::default(),
            probes: crate::record::ProbeSkip::default(),
        });
        vol.watch_store();
        vol
    }

    pub fn counts(&self) -> &VolumeCounts {
        &self.counts
    }

    fn count(&self, n: &AtomicU64, bytes: Option<(&AtomicU64, usize)>) {
        n.fetch_add(1, Relaxed);
        if let Some((b, len)) = bytes {
            b.fetch_add(len as u64, Relaxed);
        }
    }

    pub fn id(&self) -> u16 {
        self.id
    }

    pub fn sync_mode(&self) -> SyncMode {
        SyncMode::from_index(u64::from(self.sync.load(Relaxed)))
    }

    pub fn set_sync_mode(&self, mode: SyncMode) {
        self.sync.store(mode as u8, Relaxed);
    }

    pub fn name(&self) -> &str {
        &self.name
    }
    pub fn size(&self) -> u64 {
        self.size
    }
    pub fn recordsize(&self) -> u64 {
        self.recordsize
    }
    pub fn read_only(&self) -> bool {
        self.read_only
    }
    /// The cache this volume's records live in.
    pub fn cache(&self) -> &Arc<Cache> {
        &self.cache
    }

    pub fn device(&self) -> &Arc<dyn BlockDev> {
        &self.dev
    }

    fn key(&self, record: u64) -> Key {
        arc_policy::key::make(self.id, record)
    }

    fn span(&self, offset: u64, len: u64) -> Span {
        let first = offset / self.recordsize;
        let end = if len == 0 { first } else { (offset + len - 1) / self.recordsize + 1 };
        Span { first, end }
    }

    /// Byte range of `record` on the device; the last record may be short.
    fn record_range(&self, record: u64) -> Range<u64> {
        let start = record * self.recordsize;
        start..(start + self.recordsize).min(self.size)
    }

    /// Calls `f` for each piece of a write of `data` at `offset` that spans
    /// at most `MAX_RECORDS_PER_IO` records: its records, its byte offset and
    /// its bytes.
    fn for_each_piece(
        &self,
        offset: u64,
        data: &[u8],
        mut f: impl FnMut(Range<u64>, u64, &[u8]) -> DevResult<()>,
    ) -> DevResult<()> {
        let s = self.span(offset, data.len() as u64);
        let mut start = s.first;
        while start < s.end {
            let end = (start + MAX_RECORDS_PER_IO).min(s.end);
            let lo = self.record_range(start).start.max(offset);
            let hi = self.record_range(end - 1).end.min(offset + data.len() as u64);
            f(start..end, lo, &data[(lo - offset) as usize..(hi - offset) as usize])?;
            start = end;
        }
        Ok(())
    }

    /// The stripes of `records`, in ascending order: the order every path
    /// takes them in, so two requests never wait on each other in a cycle.
    fn stripes_of(&self, records: Range<u64>) -> Vec<usize> {
        let mut idx: Vec<usize> = records.map(|r| stripe_of(r, self.stripes.len())).collect();
        idx.sort_unstable();
        idx.dedup();
        idx
    }

    /// The lock and write count of record `r`.
    pub(super) fn stripe(&self, r: u64) -> &Stripe {
        &self.stripes[stripe_of(r, self.stripes.len())]
    }

    fn lock_records(&self, records: Range<u64>) -> Vec<MutexGuard<'_, ()>> {
        self.stripes_of(records).into_iter().map(|i| self.stripes[i].lock.lock()).collect()
    }

    fn check(&self, offset: u64, len: u64) -> DevResult<()> {
        blockdev::check_range(self.size, offset, len)
    }

    /// EIO once the backing store changed underneath (`BlockDev::changed`):
    /// no record of the old version is served after that is known.
    fn check_unchanged(&self) -> DevResult<()> {
        match self.dev.changed() {
            Some(why) => Err(DevError::Changed(why)),
            None => Ok(()),
        }
    }

    /// Copies the part of `record` that overlaps `[offset, offset+buf.len())`.
    /// A large compressed record read in part is decompressed once and kept
    /// that way.
    fn copy_out(&self, record: u64, data: &RecordData, offset: u64, buf: &mut [u8]) -> DevResult<()> {
        let r = self.record_range(record);
        let from = offset.max(r.start);
        let to = (offset + buf.len() as u64).min(r.end);
        let corrupt = |e| DevError::Unsupported(format!("cached record of {} is corrupt: {e}", self.name));
        let out = &mut buf[(from - offset) as usize..(to - offset) as usize];
        let at = (from - r.start) as usize;
        if data.is_compressed() && data.lsize() >= HOT_PLAIN_MIN && (to - from) < data.lsize() {
            let plain = data.to_vec().map_err(corrupt)?;
            out.copy_from_slice(&plain[at..at + out.len()]);
            self.cache.keep_decompressed(self.key(record), data, Arc::new(Record::raw(plain)));
            return Ok(());
        }
        data.copy_to(at, out).map_err(corrupt)
    }

    /// Serves a read from RAM if every record is cached; false otherwise,
    /// having changed nothing.
    pub fn try_read_cached(&self, offset: u64, buf: &mut [u8]) -> bool {
        // A store that changed underneath: the blocking read says EIO.
        if self.check(offset, buf.len() as u64).is_err() || self.dev.changed().is_some() {
            return false;
        }
        let s = self.span(offset, buf.len() as u64);
        let Some(records) = self.cache.lookup_all((s.first..s.end).map(|r| self.key(r))) else {
            return false;
        };
        for (i, data) in records.iter().enumerate() {
            if self.copy_out(s.first + i as u64, data, offset, buf).is_err() {
                return false;
            }
        }
        self.served_from_ram(s, buf.len());
        true
    }

    /// Counts a client's read of `len` bytes answered from RAM, every
    /// record of `s` a hit, and lets the sizing and the stream detection
    /// see it.
    fn served_from_ram(&self, s: Span, len: usize) {
        self.count(&self.counts.reads, Some((&self.counts.read_bytes, len)));
        self.cache.count(Found::Hit, false, s.end - s.first);
        self.cache.observe((s.first..s.end).map(|r| self.key(r)));
        self.note_request(s);
        self.predict(s, false);
    }

    /// [`Volume::try_read_cached`] for a read of whole records, answered
    /// with the cached records themselves (see `volume/out.rs`); `None`
    /// otherwise, having changed nothing (a compressed record that does
    /// not decompress included: the blocking read reports it).
    pub fn try_read_cached_held(&self, offset: u64, len: usize) -> Option<Vec<Held>> {
        let len64 = len as u64;
        if self.check(offset, len64).is_err()
            || !self.whole_records(offset, len64)
            || self.dev.changed().is_some()
        {
            return None;
        }
        let s = self.span(offset, len64);
        let records = self.cache.lookup_all((s.first..s.end).map(|r| self.key(r)))?;
        let held = records.iter().map(Held::of).collect::<Option<Vec<Held>>>()?;
        self.served_from_ram(s, len);
        Some(held)
    }

    /// Whether `[offset, offset + len)` starts and ends on record
    /// boundaries (the volume's end is one): a read a reply can answer with
    /// whole records.
    fn whole_records(&self, offset: u64, len: u64) -> bool {
        if len == 0 {
            return false;
        }
        let s = self.span(offset, len);
        offset == self.record_range(s.first).start && offset + len == self.record_range(s.end - 1).end
    }

    /// Records per read of a stream over this store: its read unit while
    /// `backing_read_units` is on, else 1.
    fn read_unit_records(&self) -> u64 {
        if self.units_on.load(Relaxed) {
            self.unit
        } else {
            1
        }
    }

    /// Turns reading streams in the store's read units on or off
    /// (`backing_read_units`; stores without one are read as ever).
    pub fn set_read_units(&self, on: bool) {
        self.units_on.store(on, Relaxed);
        self.zfetch.set_unit(if on { self.unit } else { 1 });
    }

    fn note_request(&self, s: Span) {
        if let Some(recent) = &self.recent {
            recent.note(s.first, s.end);
        }
    }

    /// [`Volume::note_request`] for a request as it arrives, before it is
    /// checked; nothing on a store without a read unit.
    fn note_arrival(&self, offset: u64, len: u64) {
        if self.recent.is_some() && self.check(offset, len).is_ok() {
            self.note_request(self.span(offset, len));
        }
    }

    /// The prefetch jobs for `rs`: one, except for a read unit (`unit` > 1)
    /// of which some records are on L2. Those are split off in jobs of at
    /// most MAX_RECORDS_PER_IO, run side by side, so a stream over L2 is
    /// read by several threads; a job of a whole unit would read them one
    /// after another while holding the locks of all, and the stream's own
    /// requests wait that long. What must come from the backing store is
    /// still one job, one read.
    fn prefetch_jobs(&self, rs: Range<u64>, unit: u64) -> Vec<Range<u64>> {
        let Some(l2) = self.cache.l2().filter(|_| unit > 1) else { return vec![rs] };
        let (on_l2, elsewhere): (Vec<u64>, Vec<u64>) = rs.partition(|&r| l2.contains(self.key(r)));
        let mut jobs = runs(&elsewhere);
        jobs.extend(runs(&on_l2).into_iter().flat_map(|run| {
            (run.start..run.end)
                .step_by(MAX_RECORDS_PER_IO as usize)
                .map(move |s| s..(s + MAX_RECORDS_PER_IO).min(run.end))
        }));
        jobs
    }

    /// Tells zfetch about a demand read and starts whatever it asks for.
    fn predict(&self, s: Span, missed: bool) {
        let c = &self.cache;
        let Some(range) =
            self.zfetch.observe(s.first, s.end - s.first, missed, Instant::now(), &c.zfetch, &c.zfetch_stats)
        else {
            return;
        };
        let unit = self.read_unit_records();
        let mut start = range.start;
        while start < range.end {
            // Jobs are the store's read units where it has them, so each
            // meets the units a stream's misses widen to (tiers.rs).
            let end = if unit > 1 { (start / unit + 1) * unit } else { start + MAX_RECORDS_PER_IO };
            let end = end.min(range.end);
            // A stream over cached data needs no prefetch job at all.
            if c.all_cached((start..end).map(|r| self.key(r))) {
                start = end;
                continue;
            }
            for job in self.prefetch_jobs(start..end, unit) {
                let Some(vol) = self.this.upgrade() else { return };
                let job = move || {
                    let _ = vol.prefetch_records(job);
                };
                if c.prefetcher().submit(job, &c.zfetch_stats_active()) {
                    c.zfetch_stats.io_issued.fetch_add(1, Relaxed);
                }
            }
            start = end;
        }
    }

    /// Writes a range: into dirty RAM with write-back (made durable as the
    /// export's `sync` mode says), otherwise through to the device. The
    /// cached records follow either way.
    pub fn write(&self, offset: u64, data: &[u8], fua: bool) -> DevResult<()> {
        if self.read_only {
            return Err(DevError::ReadOnly);
        }
        self.check(offset, data.len() as u64)?;
        self.count(&self.counts.writes, Some((&self.counts.write_bytes, data.len())));
        let Some(wb) = &self.wb else { return self.write_through(offset, data, fua) };
        if self.sync_mode() == SyncMode::Always && !wb.has_log() {
            return self.write_direct(wb, offset, data);
        }
        wb.throttle();
        self.for_each_piece(offset, data, |rs, lo, part| self.write_dirty(wb, rs, lo, part))?;
        self.finish_change(fua)
    }

    /// Whether a change must be durable before it is acknowledged.
    fn wants_commit(&self, fua: bool) -> bool {
        match self.sync_mode() {
            SyncMode::Always => true,
            SyncMode::Standard => fua,
            SyncMode::Disabled => false,
        }
    }

    /// Makes a change just applied durable if its `sync` mode and FUA ask.
    fn finish_change(&self, fua: bool) -> DevResult<()> {
        match &self.wb {
            Some(wb) if self.wants_commit(fua) => wb.commit(),
            None if fua => self.flush_dev(),
            _ => Ok(()),
        }
    }

    /// Takes a write into dirty RAM at once when that cannot block: write-
    /// back on, no durability wait, no throttle delay due, whole sectors,
    /// and the record locks free. `None` leaves it to [`Volume::write`] on
    /// a worker thread.
    pub fn try_write_now(&self, offset: u64, data: &[u8], fua: bool) -> Option<DevResult<()>> {
        let wb = self.wb.as_ref()?;
        let aligned = offset.is_multiple_of(SECTOR) && (data.len() as u64).is_multiple_of(SECTOR);
        if self.read_only || self.wants_commit(fua) || !aligned {
            return None;
        }
        self.check(offset, data.len() as u64).ok()?;
        let s = self.span(offset, data.len() as u64);
        if s.end - s.first > MAX_RECORDS_PER_IO || wb.would_throttle() {
            return None;
        }
        let mut guard = self.try_write_guard(s.first..s.end)?;
        self.count(&self.counts.writes, Some((&self.counts.write_bytes, data.len())));
        Some(
            self.build_pages(wb, offset, data)
                .map(|pages| self.put_dirty(wb, &mut guard, pages, offset, data)),
        )
    }

    pub(super) fn try_lock_records(&self, records: Range<u64>) -> Option<Vec<MutexGuard<'_, ()>>> {
        self.stripes_of(records).into_iter().map(|i| self.stripes[i].lock.try_lock()).collect()
    }

    /// Flushes the backing store, counting a failure in `backing_errors`
    /// (a server binds no L2 to a store whose IO failed in its run).
    fn flush_dev(&self) -> DevResult<()> {
        self.dev.flush().inspect_err(|_| self.cache.count_backing_error())
    }

    /// Write-through for `sync=always` without a log: each write goes to
    /// the backing store and is flushed before it is acknowledged, in
    /// parallel with other writes, and replaces any dirty bytes it covers.
    fn write_direct(&self, wb: &WriteBack, offset: u64, data: &[u8]) -> DevResult<()> {
        self.for_each_piece(offset, data, |rs, lo, part| self.write_records(Some(wb), rs, lo, part))?;
        self.flush_dev()
    }

    fn write_dirty(&self, wb: &WriteBack, rs: Range<u64>, offset: u64, data: &[u8]) -> DevResult<()> {
        let mut guard = self.write_guard(rs);
        let pages = self.build_pages(wb, offset, data)?;
        self.put_dirty(wb, &mut guard, pages, offset, data);
        Ok(())
    }

    /// Queues a write's dirty pages and puts its bytes in the cached
    /// records, with the feed kept off those records throughout. `put`
    /// drops their L2 copies and holds the feed off until the txg is on the
    /// backing store, but that txg can finish before the cached records are
    /// patched; the feed would then copy the old record to L2 after the
    /// write was acknowledged, and it would be read back once the write's
    /// dirty pages are gone.
    fn put_dirty(
        &self,
        wb: &WriteBack,
        guard: &mut RecordWrite<'_>,
        pages: Vec<(u64, Page)>,
        offset: u64,
        data: &[u8],
    ) {
        guard.hold_off_feed();
        self.zeroed.changed(offset..offset + data.len() as u64);
        wb.put(self.id, guard.keys(), pages);
        self.patch_cache(guard, offset, data);
    }

    /// The dirty pages a write makes; a sector it covers in part gets its
    /// other bytes from the current contents.
    fn build_pages(&self, wb: &WriteBack, offset: u64, data: &[u8]) -> DevResult<Vec<(u64, Page)>> {
        let end = offset + data.len() as u64;
        let mut out = Vec::new();
        for page in offset / PAGE..end.div_ceil(PAGE) {
            let mut p = Page::empty();
            for s in 0..8usize {
                let a = page * PAGE + s as u64 * SECTOR;
                let b = a + SECTOR;
                let (from, to) = (a.max(offset), b.min(end));
                if from >= to {
                    continue;
                }
                let dst = &mut p.data[dirty::sector_range(s)];
                if from != a || to != b {
                    dst.copy_from_slice(&self.current_sector(wb, a)?);
                }
                dst[(from - a) as usize..(to - a) as usize]
                    .copy_from_slice(&data[(from - offset) as usize..(to - offset) as usize]);
                p.mask |= 1 << s;
            }
            out.push((page, p));
        }
        Ok(out)
    }

    /// What sector `a` holds now (bytes past the export's end read as 0).
    /// Called with the record's lock held.
    fn current_sector(&self, wb: &WriteBack, a: u64) -> DevResult<[u8; 512]> {
        if let Some(s) = wb.sector(self.id, a) {
            return Ok(s);
        }
        let mut out = [0u8; 512];
        let n = (self.size.saturating_sub(a)).min(SECTOR) as usize;
        let record = a / self.recordsize;
        if let Some(rec) = self.cache.peek(self.key(record)) {
            self.copy_out(record, &rec, a, &mut out[..n])?;
            return Ok(out);
        }
        self.dev.read_at(&mut out[..n], a)?;
        Ok(out)
    }

    /// Writes straight to the backing store (no write-back, or replaying
    /// the intent log), then updates the cached records.
    pub fn write_through(&self, offset: u64, data: &[u8], fua: bool) -> DevResult<()> {
        if self.read_only {
            return Err(DevError::ReadOnly);
        }
        self.check(offset, data.len() as u64)?;
        self.for_each_piece(offset, data, |rs, lo, part| self.write_records(None, rs, lo, part))?;
        if fua {
            self.flush_dev()?;
        }
        Ok(())
    }

    /// The one way a write reaches the backing store: under its records'
    /// guard, their L2 copies gone first; with write-back on, through
    /// `WriteBack::discard`, which takes the dirty bytes it covers out of
    /// the txg in the same step.
    fn write_records(
        &self,
        wb: Option<&WriteBack>,
        rs: Range<u64>,
        offset: u64,
        data: &[u8],
    ) -> DevResult<()> {
        let mut guard = self.write_guard(rs);
        guard.drop_l2_copies();
        self.zeroed.changed(offset..offset + data.len() as u64);
        let c = &self.cache.counters;
        c.backing_writes.fetch_add(1, Relaxed);
        c.backing_write_bytes.fetch_add(data.len() as u64, Relaxed);
        let write = || write_backing(self.dev.as_ref(), data, offset);
        let written = match wb {
            Some(wb) => {
                let range = offset..offset + data.len() as u64;
                wb.discard(self.id, guard.keys(), range, Change::Overwrite(data), write)
            }
            None => write(),
        };
        if let Err(e) = written {
            c.backing_errors.fetch_add(1, Relaxed);
            // What reached the device is unknown; the device is the truth.
            for &k in guard.keys() {
                self.cache.invalidate(k);
            }
            return Err(e);
        }
        self.patch_cache(&guard, offset, data);
        Ok(())
    }

    /// After a write: whole records become the new contents, cached partial
    /// records are patched, uncached partial records stay uncached.
    fn patch_cache(&self, guard: &RecordWrite<'_>, offset: u64, data: &[u8]) {
        // Changing a cached record with the feed free to copy it could put
        // a half-changed or old record on L2 after the write is answered.
        assert!(guard.may_change_cache(), "cached records change only with the L2 kept off them");
        let end = offset + data.len() as u64;
        let compress = self.cache.compress_enabled();
        for r in guard.records() {
            let rr = self.record_range(r);
            let key = self.key(r);
            if offset <= rr.start && end >= rr.end {
                let new = &data[(rr.start - offset) as usize..(rr.end - offset) as usize];
                self.cache.insert_written(key, Arc::new(Record::new(new, compress)));
                continue;
            }
            let (from, to) = (offset.max(rr.start), end.min(rr.end));
            let part = &data[(from - offset) as usize..(to - offset) as usize];
            let at = (from - rr.start) as usize;
            if self.cache.patch_in_place(key, at, part) {
                continue;
            }
            let patched = self.cache.peek(key).and_then(|old| old.to_vec().ok()).map(|mut v| {
                v[at..at + part.len()].copy_from_slice(part);
                v
            });
            match patched {
                // A large record written in part stays plain, so the next
                // small write patches it in place instead of copying and
                // compressing the whole record again.
                Some(v) if v.len() as u64 >= HOT_PLAIN_MIN => {
                    self.cache.insert_written(key, Arc::new(Record::raw(v)))
                }
                Some(v) => self.cache.insert_written(key, Arc::new(Record::new(&v, compress))),
                // Not in RAM: nothing to patch (begin_write dropped any L2 copy).
                None => {
                    self.cache.invalidate(key);
                }
            }
        }
    }

    /// Makes every write acknowledged before it durable (a no-op with
    /// `sync=disabled`).
    pub fn flush(&self) -> DevResult<()> {
        self.count(&self.counts.flushes, None);
        match (&self.wb, self.sync_mode()) {
            (_, SyncMode::Disabled) => Ok(()),
            (Some(wb), _) => wb.commit(),
            (None, _) => self.flush_dev(),
        }
    }

    /// As [`Volume::flush`], answered through `done` (maybe later, from
    /// another thread) when the volume has write-back; gives `done` back
    /// when the flush can only be done by waiting here. Answered at once
    /// (`sync=disabled`), `done` gets the caller's batch `out`.
    pub fn flush_async(
        &self,
        done: crate::CommitDone,
        out: &mut arcache_batch::Batch,
    ) -> Result<(), crate::CommitDone> {
        match (&self.wb, self.sync_mode()) {
            (_, SyncMode::Disabled) => {
                self.count(&self.counts.flushes, None);
                done(&Ok(()), out);
                Ok(())
            }
            (Some(wb), _) => {
                wb.commit_async(done)?;
                self.count(&self.counts.flushes, None);
                Ok(())
            }
            (None, _) => Err(done),
        }
    }

    /// Can [`Volume::flush_async`] answer without waiting in the caller?
    pub fn flushes_async(&self) -> bool {
        self.wb.is_some() || self.sync_mode() == SyncMode::Disabled
    }

    /// Flushes the backing store itself.
    pub fn flush_backing(&self) -> DevResult<()> {
        self.flush_dev()
    }

    /// A zeroing straight to the backing store, for log replay.
    pub fn write_zeroes_through(&self, offset: u64, len: u64) -> DevResult<()> {
        self.discard_with(None, offset, len, Change::Zero, |dev, o, l| dev.write_zeroes(o, l))
    }

    /// A trim straight to the backing store, for log replay.
    pub fn trim_through(&self, offset: u64, len: u64) -> DevResult<()> {
        self.discard_with(None, offset, len, Change::Trim, |dev, o, l| dev.trim(o, l))
    }

    pub fn trim(&self, offset: u64, len: u64, fua: bool) -> DevResult<()> {
        self.discard(offset, len, fua, Change::Trim, |dev, o, l| dev.trim(o, l))
    }

    pub fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> DevResult<()> {
        self.discard(offset, len, fua, Change::Zero, |dev, o, l| dev.write_zeroes(o, l))
    }

    /// Zeroing only if the backing store can do it without writing the
    /// zeroes (NBD's FAST_ZERO): `Unsupported` at once otherwise, before
    /// anything cached or dirty is touched. `keep_allocated`: the range
    /// stays provisioned (NBD's NO_HOLE).
    pub fn write_zeroes_fast(&self, offset: u64, len: u64, fua: bool, keep_allocated: bool) -> DevResult<()> {
        if self.read_only {
            return Err(DevError::ReadOnly);
        }
        if !self.dev.zeroes_fast() {
            return Err(DevError::Unsupported(format!("fast zeroing on {}", self.dev.describe())));
        }
        self.discard(offset, len, fua, Change::Zero, |dev, o, l| dev.zero_fast(o, l, keep_allocated))
    }

    /// What `[offset, offset+len)` holds, for NBD's `base:allocation`: the
    /// backing store's holes, except where dirty data not yet synced lies
    /// over them (that part is data whatever the store says). May cover
    /// less than `len`.
    pub fn allocation(&self, offset: u64, len: u64) -> DevResult<Vec<(u64, blockdev::Alloc)>> {
        self.check(offset, len)?;
        // Taken before the store is asked: a txg that lands meanwhile has
        // put the same bytes on the store, which then says data too.
        let dirty = self.wb.as_ref().map(|wb| wb.snapshot(self.id, offset..offset + len)).unwrap_or_default();
        let extents = self.zeroed.overlay(offset, &self.dev.allocation(offset, len)?);
        let pages: Vec<u64> = dirty.iter().map(|(page, _)| *page).collect();
        Ok(crate::extents::overlay_dirty(offset, &extents, &pages, crate::dirty::PAGE))
    }

    /// Trim and zeroing: the device changes a range, and every cached record
    /// touching it is dropped (a partial one included) so no old byte is
    /// ever served again.
    fn discard(
        &self,
        offset: u64,
        len: u64,
        fua: bool,
        change: Change<'_>,
        op: impl Fn(&dyn BlockDev, u64, u64) -> DevResult<()>,
    ) -> DevResult<()> {
        self.count(&self.counts.discards, None);
        self.discard_with(self.wb.as_deref(), offset, len, change, op)?;
        self.finish_change(fua)
    }

    fn discard_with(
        &self,
        wb: Option<&WriteBack>,
        offset: u64,
        len: u64,
        change: Change<'_>,
        op: impl Fn(&dyn BlockDev, u64, u64) -> DevResult<()>,
    ) -> DevResult<()> {
        if self.read_only {
            return Err(DevError::ReadOnly);
        }
        self.check(offset, len)?;
        self.drop_records_around(offset, len, |guard, range| {
            let (lo, hi) = (range.start, range.end);
            let res = match wb {
                Some(wb) => {
                    wb.discard(self.id, guard.keys(), lo..hi, change, || op(self.dev.as_ref(), lo, hi - lo))
                }
                None => op(self.dev.as_ref(), lo, hi - lo),
            };
            if res.is_err() {
                self.cache.count_backing_error();
            }
            // Known zero only once the zeroing is on the store; a trim
            // leaves the contents undefined.
            if res.is_ok() && matches!(change, Change::Zero) {
                self.zeroed.zeroed(lo..hi);
            }
            res
        })
    }

    /// Runs `change` over `[offset, offset + len)` piece by piece: each
    /// piece's records locked for a write, their L2 copies dropped durably
    /// and their known zeroes forgotten first, and every cached record of
    /// the piece dropped after, whatever `change` answered. Stops at the
    /// first error. The range must lie within the volume.
    fn drop_records_around(
        &self,
        offset: u64,
        len: u64,
        mut change: impl FnMut(&RecordWrite<'_>, Range<u64>) -> DevResult<()>,
    ) -> DevResult<()> {
        let s = self.span(offset, len);
        let mut start = s.first;
        while start < s.end {
            let end = (start + 4 * MAX_RECORDS_PER_IO).min(s.end);
            let lo = self.record_range(start).start.max(offset);
            let hi = self.record_range(end - 1).end.min(offset + len);
            let mut guard = self.write_guard(start..end);
            guard.drop_l2_copies();
            self.zeroed.changed(lo..hi);
            let res = change(&guard, lo..hi);
            for &k in guard.keys() {
                self.cache.invalidate(k);
            }
            drop(guard);
            res?;
            start = end;
        }
        Ok(())
    }
}

/// Groups sorted record numbers into contiguous runs.
/// The backing store's read unit in records (at most `MAX_UNIT_RECORDS`),
/// 1 when it has none.
fn read_unit_records(dev: &dyn BlockDev, recordsize: u64) -> u64 {
    dev.read_unit().map_or(1, |u| (u / recordsize).clamp(1, MAX_UNIT_RECORDS))
}

fn runs(sorted: &[u64]) -> Vec<Range<u64>> {
    let mut out: Vec<Range<u64>> = Vec::new();
    for &r in sorted {
        match out.last_mut() {
            Some(last) if last.end == r => last.end += 1,
            _ => out.push(r..r + 1),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As many units in a row as the prefetch threads may read at once,
    /// wherever the stream is, never share a lock (with the hashed 1,024
    /// locks this fails at the third unit).
    #[test]
    fn the_units_a_stream_reads_at_once_have_locks_of_their_own() {
        // The prefetch threads' units and the stream's own.
        let span = MAX_UNIT_RECORDS * (crate::prefetch::PREFETCH_THREADS as u64 + 1);
        const { assert!(MAX_UNIT_RECORDS >= 512, "S3's 8 MiB of 16K records is one unit") };
        let stripes = STRIPES as u64;
        for start in [0, 1, 511, stripes - 1, stripes, 1 << 20, (1 << 40) + 17] {
            let mut locks: Vec<usize> = (start..start + span).map(|r| stripe_of(r, STRIPES)).collect();
            locks.sort_unstable();
            locks.dedup();
            assert_eq!(locks.len() as u64, span, "records from {start}");
        }
    }

    /// On a store with a read unit, nbdcopy's four streams (128 MiB apart
    /// in records of 16K) with the units of eight prefetch threads and a
    /// miss each in flight never share a lock (with `STRIPES` they do).
    #[test]
    fn four_streams_units_have_locks_of_their_own_on_a_store_with_a_read_unit() {
        let unit = MAX_UNIT_RECORDS;
        let per_stream = unit * (crate::prefetch::PREFETCH_THREADS as u64 + 1);
        let apart = (128 << 20) / (16 << 10);
        let shared = |count: usize| {
            [0, 3, 1 << 20].into_iter().any(|base| {
                let mut locks: Vec<usize> = (0..4)
                    .flat_map(|i| base + i * apart..base + i * apart + per_stream)
                    .map(|r| stripe_of(r, count))
                    .collect();
                let n = locks.len();
                locks.sort_unstable();
                locks.dedup();
                locks.len() != n
            })
        };
        assert!(!shared(UNIT_STORE_STRIPES));
        assert!(shared(STRIPES), "the measure tells the counts apart");
    }

    fn big_record_volume() -> (Arc<Volume>, Arc<blockdev::MemDev>) {
        let cache = Cache::new(crate::CacheConfig {
            arc_min: 8 << 20,
            arc_max: 64 << 20,
            min_prefetch_ms: 0,
            compress: true,
        });
        let dev = Arc::new(blockdev::MemDev::new(4 << 20));
        // Compressible but not uniform: a pattern LZ4 packs well.
        let pattern: Vec<u8> = (0..4u32 << 20).map(|i| (i / 64 % 7) as u8).collect();
        dev.write_at(&pattern, 0).unwrap();
        let cfg = VolumeConfig { name: "big".into(), recordsize: 1 << 20, read_only: false };
        (Volume::new(0, cfg, Arc::clone(&dev) as Arc<dyn BlockDev>, cache), dev)
    }

    /// Small IO on a large compressed record: the first partial read keeps
    /// it decompressed, later partial writes patch that same record in
    /// place, and every byte read is the device's or the write's.
    #[test]
    fn a_large_record_read_in_part_stays_plain_and_is_patched_in_place() {
        let (vol, dev) = big_record_volume();
        let mut whole = vec![0u8; 1 << 20];
        vol.read(1 << 20, &mut whole).unwrap();
        let key = vol.key(1);
        assert!(vol.cache.peek(key).unwrap().is_compressed(), "a whole read keeps it compressed");
        let mut small = vec![0u8; 4096];
        vol.read((1 << 20) + 8192, &mut small).unwrap();
        assert_eq!(small, whole[8192..8192 + 4096]);
        let plain = vol.cache.peek(key).unwrap();
        assert!(!plain.is_compressed(), "a partial read leaves it plain");
        let before = Arc::as_ptr(&plain);
        drop(plain);
        vol.write_through((1 << 20) + 4096, &[0xee; 4096], false).unwrap();
        let after = vol.cache.peek(key).unwrap();
        assert_eq!(Arc::as_ptr(&after), before, "patched in place, not copied");
        drop(after);
        vol.read((1 << 20) + 4096, &mut small).unwrap();
        assert!(small.iter().all(|&b| b == 0xee));
        let mut on_dev = vec![0u8; 4096];
        dev.read_at(&mut on_dev, (1 << 20) + 4096).unwrap();
        assert_eq!(on_dev, small, "written through to the device");
        // A writer that finds the record held by a reader copies instead.
        let held = vol.cache.peek(key).unwrap();
        vol.write_through((1 << 20) + 4096, &[0x11; 512], false).unwrap();
        let now = vol.cache.peek(key).unwrap();
        assert!(!Arc::ptr_eq(&held, &now) && !now.is_compressed());
        assert!(
            held.to_vec().unwrap()[4096..4608].iter().all(|&b| b == 0xee),
            "the reader's copy is untouched"
        );
        assert!(now.to_vec().unwrap()[4096..4608].iter().all(|&b| b == 0x11));
    }

    /// A store that cannot tell holes (a block device, here memory): block
    /// status still says "zero" where a zeroing reached it and nothing was
    /// written since, and "data" again once something is.
    #[test]
    fn zeroed_ranges_are_known_until_written() {
        use blockdev::Alloc::{Data, Zero};
        let (vol, _) = big_record_volume();
        assert_eq!(vol.allocation(0, 4 << 20).unwrap(), vec![(4 << 20, Data)]);
        vol.write_zeroes(1 << 20, 2 << 20, false).unwrap();
        assert_eq!(
            vol.allocation(0, 4 << 20).unwrap(),
            vec![(1 << 20, Data), (2 << 20, Zero), (1 << 20, Data)]
        );
        vol.write_through((2 << 20) + 4096, &[1u8; 4096], false).unwrap();
        assert_eq!(
            vol.allocation(1 << 20, 2 << 20).unwrap(),
            vec![((1 << 20) + 4096, Zero), (4096, Data), ((1 << 20) - 8192, Zero)]
        );
        vol.trim(1 << 20, 4096, false).unwrap();
        assert_eq!(
            vol.allocation(1 << 20, 8192).unwrap(),
            vec![(4096, Data), (4096, Zero)],
            "a trim is not a zeroing"
        );
    }

    #[test]
    fn runs_group_contiguous_records() {
        assert_eq!(runs(&[1, 2, 3, 7, 9, 10]), vec![1..4, 7..8, 9..11]);
        assert!(runs(&[]).is_empty());
    }
}
