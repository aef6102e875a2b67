//! The L2ARC: records evicted from RAM kept on fast devices (SSD files or
//! block devices) written as rotary logs, found through a compact index, and
//! verified by checksum on every read.
//!
//! This crate is mechanism only: what to feed and when is decided by the
//! engine's feed thread; here are the devices, the index and the rules that
//! keep an L2 copy from ever being served after its record changed.

pub mod device;
pub mod format;
pub mod index;
mod marks;
mod persist;
mod rebuild;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering, Ordering::Relaxed};
use std::sync::Arc;

use arcache_batch::Batch;
use arcache_sync::atomic as sync_atomic;
use arcache_sync::Mutex;
use blockdev::AlignedBuf;
use tracing::warn;

pub use device::{BufSource, L2Device, ALIGN, HEADER_RESERVED};
pub use index::{BlobFlags, L2Index, L2Ptr, MAX_DEVICES, SECTOR};
pub use persist::{
    forget, forget_exports, read_header, ExportDesc, HeaderRead, PersistOptions, VIEW_EXPORT_ID,
};
pub use rebuild::RebuildProgress;
pub use rebuild::{pointer_ok, read_block, walk, PersistStats, WalkEnd};

use format::{Entry, EntryKind};
use persist::DevPersist;

/// Longest single device read when copies lie back to back.
const MAX_COALESCED_READ: u64 = 1 << 20;

/// The size the kept batch buffer starts at: a feed batch and some slack.
const KEPT_BUFFER_BYTES: usize = 9 << 20;

/// Bytes shared with the ARC, without copying them for the feed.
pub type SharedBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// One record handed to the feed: its key, stored bytes and flags.
pub struct FeedItem {
    pub key: u64,
    pub data: SharedBytes,
    pub flags: BlobFlags,
}

/// Why an L2 read did not produce data; the caller reads the backing store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L2Miss {
    /// The device failed the read.
    IoError,
    /// The bytes did not match their checksum.
    ChecksumBad,
    /// The copy was overwritten by the write hand while being read.
    EvictedWhileReading,
    /// The device is out of service.
    Unavailable,
}

/// Counters with OpenZFS arcstats names.
#[derive(Debug, Default)]
pub struct L2Stats {
    pub l2_read_bytes: AtomicU64,
    pub l2_write_bytes: AtomicU64,
    pub l2_writes_sent: AtomicU64,
    pub l2_writes_done: AtomicU64,
    pub l2_writes_error: AtomicU64,
    pub l2_cksum_bad: AtomicU64,
    pub l2_io_error: AtomicU64,
    pub l2_evict_reading: AtomicU64,
    /// Records whose L2 copy the write hand overwrote.
    pub l2_evict_hand: AtomicU64,
    /// L2 copies dropped because the record was written, trimmed or zeroed.
    pub l2_invalidated: AtomicU64,
    pub l2_feeds: AtomicU64,
    pub l2_log_blk_writes: AtomicU64,
    pub l2_log_blk_avg_asize: AtomicU64,
    pub l2_log_commits: AtomicU64,
    pub l2_header_writes: AtomicU64,
    pub l2_rebuild_success: AtomicU64,
    pub l2_rebuild_unsupported: AtomicU64,
    pub l2_rebuild_io_errors: AtomicU64,
    pub l2_rebuild_dh_errors: AtomicU64,
    pub l2_rebuild_cksum_lb_errors: AtomicU64,
    pub l2_rebuild_lowmem: AtomicU64,
    pub l2_rebuild_size: AtomicU64,
    pub l2_rebuild_asize: AtomicU64,
    pub l2_rebuild_bufs: AtomicU64,
    pub l2_rebuild_bufs_precached: AtomicU64,
    pub l2_rebuild_log_blks: AtomicU64,
    /// Restorable-looking entries skipped because they failed validation.
    pub l2_rebuild_invalid_entries: AtomicU64,
    /// Records of exports whose backing store changed, discarded at start.
    pub l2_rebuild_discarded_exports: AtomicU64,
    /// Devices not rebuilt because another device's header recorded their
    /// log as abandoned (docs/format.md).
    pub l2_rebuild_abandoned: AtomicU64,
    /// Header writes that bound an export's records to what its writer
    /// changed the store to (docs/persistence.md).
    pub l2_contents_rebinds: AtomicU64,
    /// Bytes of `l2_write_bytes` written from the records themselves, not
    /// copied into a batch buffer first (see `BatchLayout`).
    pub l2_write_bytes_in_place: AtomicU64,
}

impl L2Stats {
    /// Adds the counters gathered while opening devices.
    fn add_open(&self, o: &L2Stats) {
        for (a, b) in [
            (&self.l2_rebuild_dh_errors, &o.l2_rebuild_dh_errors),
            (&self.l2_rebuild_unsupported, &o.l2_rebuild_unsupported),
            (&self.l2_rebuild_discarded_exports, &o.l2_rebuild_discarded_exports),
            (&self.l2_rebuild_abandoned, &o.l2_rebuild_abandoned),
        ] {
            a.fetch_add(b.load(Relaxed), Relaxed);
        }
    }
}

/// The entries of a device's log not yet written in a log block.
#[derive(Default)]
struct OpenLog {
    entries: Vec<Entry>,
    /// Entries ever appended: a position to wait for.
    appended: u64,
    /// Keys with an INVALIDATE entry not yet durable, and the position of
    /// the latest: a write to one of them must wait for it.
    invalidated: HashMap<u64, u64>,
}

/// How an export's records are named on each device.
#[derive(Debug, Clone)]
pub(crate) struct ExportMap {
    identity: u64,
    records: u64,
    /// Tag of this export in each device's header; 0 when not persisted there.
    tags: [u16; MAX_DEVICES],
}

/// A position in a device's log that must be durable before a write may
/// reach the backing store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    dev: usize,
    upto: u64,
}

/// The index and the set of records the feed is writing right now. One lock
/// for both: invalidation must see an in-flight record atomically with its
/// index entry.
struct Meta {
    index: L2Index,
    /// Keys captured by the feed and not yet committed; `true` once a write
    /// made the captured bytes stale, so the commit must not index them.
    in_flight: HashMap<u64, bool>,
    size: u64,
    asize: u64,
    logs: Vec<OpenLog>,
    /// Keys being written now (count of writers): the feed must not
    /// capture them, a rebuild must not restore them.
    writing: HashMap<u64, u32>,
    /// Keys written while a rebuild runs: the rebuild must not restore them.
    rebuild_killed: HashSet<u64>,
}

pub struct L2Arc {
    devices: Vec<Arc<L2Device>>,
    meta: Mutex<Meta>,
    pub stats: L2Stats,
    exports: Vec<Option<ExportMap>>,
    /// The file view's export, whose keys are not split (docs/format.md).
    view: Option<ExportMap>,
    persist: Vec<Mutex<Option<DevPersist>>>,
    // What writers, the feed, a rebuild and a commit hand each other
    // outside the persist lock (how far each log is durable, whether it
    // keeps one, whether it is being rebuilt): arcache-sync's atomics, so
    // shuttle switches threads at each and sees the races on them.
    // Statistics and tunables stay std's.
    committed: Vec<sync_atomic::AtomicU64>,
    logs_on: Vec<sync_atomic::AtomicBool>,
    rebuilding: Vec<sync_atomic::AtomicBool>,
    pub(crate) progress: Vec<RebuildProgress>,
    /// A batch buffer kept between batches: a fresh one of megabytes would
    /// be faulted in and zeroed page by page on every batch. A leaf lock
    /// that orders nothing (held only to take or put the buffer back), so
    /// it stays parking_lot's even in model-checking builds: as a shuttle
    /// lock it only added scheduling points that made the races those
    /// tests look for rarer.
    spare_buf: parking_lot::Mutex<Option<AlignedBuf>>,
    /// Per device: batch bytes written since its log was last committed,
    /// and how many may be (0: commit after every batch).
    /// Counted down by every commit (persist.rs), whoever asked for it.
    pub(crate) uncommitted: Vec<sync_atomic::AtomicU64>,
    commit_every: AtomicU64,
    /// Reads queued through io_uring, once started ([`L2Arc::start_async_reads`]).
    uring: std::sync::OnceLock<Arc<blockdev::uring::Uring>>,
    /// Where runs of whole records read into a buffer each get their
    /// buffers ([`L2Arc::set_buf_source`]); new ones until set.
    bufs: std::sync::OnceLock<Arc<dyn BufSource>>,
    /// `l2arc_ring_reads`: whether reads may use the ring once started.
    ring_on: sync_atomic::AtomicBool,
    /// See [`L2Arc::drop_generation`].
    drops: AtomicU64,
    /// Logs of devices never to be restored (docs/format.md,
    /// "Abandoned-logs block"): those found at start and those retired
    /// since. Every header this server writes carries it. A leaf lock.
    pub(crate) abandoned: parking_lot::Mutex<Vec<format::Abandoned>>,
    /// Where the abandoned logs are also marked, when a state directory
    /// was given (docs/format.md, "Abandoned-log marks").
    pub(crate) marks: Option<marks::MarkDir>,
}

/// What [`L2Arc::begin_feed_checked`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FeedStart {
    /// Marked in flight: the caller writes it.
    Started,
    /// On L2 already, or being fed.
    Held,
    /// A write of it to the backing store is under way: not now.
    Busy,
}

/// A run's copies as read: each one's unframed bytes, or `None` where its
/// checksum failed.
type Verified = Vec<Option<Box<[u8]>>>;

/// Where each record of a batch is written from. A record stored raw
/// whose bytes in RAM are aligned for O_DIRECT, and which starts on an
/// aligned address of the batch, is written from where it lies; the
/// others are framed (or copied) into a staging buffer, back to back, in
/// segments that end where an in-place record begins. The copy into one
/// buffer cost the feed a memmove of every byte it wrote, an eighth of the
/// server's CPU on a cold stream (perf of a 2 GiB nbdcopy pass).
struct BatchLayout {
    /// Per item: its length on the device, and its offset in the staging
    /// buffer (`None`: written in place).
    items: Vec<(u64, Option<u64>)>,
    /// The write, in device order.
    pieces: Vec<BatchPiece>,
    /// Staging bytes, zero padding to the batch's aligned end included.
    staged: u64,
    /// Staging bytes holding records (the rest is padding).
    staged_used: u64,
    /// The batch's length on the device.
    len: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BatchPiece {
    /// Staging bytes `from..to`.
    Staged(u64, u64),
    /// Item `i`'s own bytes.
    InPlace(usize),
}

impl BatchLayout {
    fn of(items: &[FeedItem]) -> BatchLayout {
        let mut l = BatchLayout {
            items: Vec::with_capacity(items.len()),
            pieces: Vec::new(),
            staged: 0,
            staged_used: 0,
            len: 0,
        };
        for (i, it) in items.iter().enumerate() {
            let data = (*it.data).as_ref();
            let flen = device_len(data, it.flags.compressed);
            let in_place = it.flags.raw
                && l.len.is_multiple_of(ALIGN)
                && flen.is_multiple_of(ALIGN)
                && (data.as_ptr() as usize).is_multiple_of(ALIGN as usize);
            if in_place {
                l.items.push((flen, None));
                l.pieces.push(BatchPiece::InPlace(i));
            } else {
                l.items.push((flen, Some(l.staged)));
                match l.pieces.last_mut() {
                    Some(BatchPiece::Staged(_, to)) => *to += flen,
                    _ => l.pieces.push(BatchPiece::Staged(l.staged, l.staged + flen)),
                }
                l.staged += flen;
            }
            l.len += flen;
        }
        l.staged_used = l.staged;
        let pad = l.len.div_ceil(ALIGN) * ALIGN - l.len;
        if pad > 0 || l.pieces.is_empty() {
            // Only a staged segment can end unaligned; it takes the padding.
            match l.pieces.last_mut() {
                Some(BatchPiece::Staged(_, to)) => *to += pad,
                _ => l.pieces.push(BatchPiece::Staged(l.staged, l.staged + pad)),
            }
            l.staged += pad;
            l.len += pad;
        }
        l
    }
}

/// Whether a record is stored as it is: uncompressed and a whole number of
/// sectors, so its length is the blob's and a 16K record stays 16K (and
/// 4K-aligned among its peers) on the device.
fn stored_raw(data: &[u8], compressed: bool) -> bool {
    !compressed && !data.is_empty() && (data.len() as u64).is_multiple_of(SECTOR)
}

/// Bytes a record stored as `data` takes in a batch on the device: a
/// small compressed record takes a whole sector.
pub fn device_len(data: &[u8], compressed: bool) -> u64 {
    if stored_raw(data, compressed) {
        data.len() as u64
    } else {
        framed_len(data.len())
    }
}

/// Bytes a record of `len` bytes takes on the device once framed.
pub fn framed_len(len: usize) -> u64 {
    (4 + len as u64).div_ceil(SECTOR) * SECTOR
}

/// Frames a record for the device into `out` (of `framed_len` bytes):
/// little-endian length, bytes, zero padding to a sector. The length makes a
/// compressed record decodable exactly.
pub fn frame_into(data: &[u8], out: &mut [u8]) {
    out[..4].copy_from_slice(&(data.len() as u32).to_le_bytes());
    out[4..4 + data.len()].copy_from_slice(data);
    out[4 + data.len()..].fill(0);
}

fn unframe(blob: &[u8], raw: bool) -> Option<&[u8]> {
    if raw {
        return Some(blob);
    }
    let len = u32::from_le_bytes(blob.get(0..4)?.try_into().ok()?) as usize;
    blob.get(4..4 + len)
}

/// Gets the end of an [`L2Arc::read_async`], with the batch of the reads
/// the ring finished together (a read refused after it was queued gets a
/// batch of its own).
pub type AsyncDone = Box<dyn FnOnce(Result<Box<[u8]>, L2Miss>, &mut Batch) + Send>;

/// Where `part` of each copy of `run` (back to back) lies on the device.
fn run_extent(run: &[(u64, L2Ptr)], part: Part) -> (u64, u64) {
    let (first, last) = (run[0].1, run[run.len() - 1].1);
    match part {
        Part::Whole => (first.daddr(), last.daddr() + last.blob_len() - first.daddr()),
        Part::Half(which) => (first.daddr() + which * first.blob_len() / 2, first.blob_len() / 2),
    }
}

/// Which bytes of a stored copy a read wants.
#[derive(Debug, Clone, Copy)]
enum Part {
    Whole,
    /// Half 0 or 1 of a split copy.
    Half(u64),
}

impl Part {
    /// The whole copy, or half `which` of it; `None` for a half of a copy
    /// that is not split, or a half that does not exist.
    fn of(ptr: L2Ptr, half: Option<u64>) -> Option<Part> {
        match half {
            None => Some(Part::Whole),
            Some(which) => (ptr.split() && which <= 1).then_some(Part::Half(which)),
        }
    }
}

fn split_key(key: u64) -> (usize, u64) {
    (usize::from(arc_policy::key::export(key)), arc_policy::key::record(key))
}

/// What a log entry names a key by: a volume's record index, or a view's
/// whole key.
fn entry_record(key: u64) -> u64 {
    if arc_policy::key::view::is_view(key) {
        key
    } else {
        split_key(key).1
    }
}

impl L2Arc {
    /// L2 devices without persistence: nothing is restored at start and
    /// nothing is logged (tests, and devices below the persistence size).
    pub fn new(devices: Vec<L2Device>) -> Result<L2Arc, String> {
        Self::assemble(devices, Vec::new(), None, Vec::new())
    }

    fn assemble(
        devices: Vec<L2Device>,
        exports: Vec<Option<ExportMap>>,
        view: Option<ExportMap>,
        persist: Vec<Option<DevPersist>>,
    ) -> Result<L2Arc, String> {
        if devices.len() > MAX_DEVICES {
            return Err(format!("at most {MAX_DEVICES} L2 devices"));
        }
        let n = devices.len();
        let mut persist = persist;
        persist.resize_with(n, || None);
        let logs_on = persist.iter().map(|p| sync_atomic::AtomicBool::new(p.is_some())).collect();
        Ok(L2Arc {
            logs_on,
            devices: devices.into_iter().map(Arc::new).collect(),
            meta: Mutex::new(Meta {
                index: L2Index::new(),
                in_flight: Default::default(),
                size: 0,
                asize: 0,
                logs: (0..n).map(|_| OpenLog::default()).collect(),
                writing: HashMap::new(),
                rebuild_killed: HashSet::new(),
            }),
            stats: L2Stats::default(),
            exports,
            view,
            persist: persist.into_iter().map(Mutex::new).collect(),
            committed: (0..n).map(|_| sync_atomic::AtomicU64::new(0)).collect(),
            rebuilding: (0..n).map(|_| sync_atomic::AtomicBool::new(false)).collect(),
            progress: (0..n).map(|_| RebuildProgress::default()).collect(),
            spare_buf: parking_lot::Mutex::new(None),
            uncommitted: (0..n).map(|_| sync_atomic::AtomicU64::new(0)).collect(),
            commit_every: AtomicU64::new(0),
            uring: std::sync::OnceLock::new(),
            bufs: std::sync::OnceLock::new(),
            ring_on: sync_atomic::AtomicBool::new(true),
            drops: AtomicU64::new(0),
            abandoned: parking_lot::Mutex::new(Vec::new()),
            marks: None,
        })
    }

    /// Hands the buffers of records read whole from L2 out of `bufs` (the
    /// cache's buffers of evicted records) instead of new allocations,
    /// which fault their pages in. Only the first call counts.
    pub fn set_buf_source(&self, bufs: Arc<dyn BufSource>) {
        let _ = self.bufs.set(bufs);
    }

    /// The checksum of a stored blob, bound to the record's export identity
    /// and index so a misdirected read (another record's bytes) never
    /// validates, and valid across restarts.
    pub fn checksum(&self, key: u64, blob: &[u8], raw: bool) -> u64 {
        format::blob_checksum(blob, raw, self.payload_seed(key))
    }

    fn payload_seed(&self, key: u64) -> u64 {
        let (export, _) = split_key(key);
        let identity = self.export_map(key).map_or(export as u64, |e| e.identity);
        format::payload_seed(identity, entry_record(key))
    }

    /// The export `key` belongs to, if it is configured.
    fn export_map(&self, key: u64) -> Option<&ExportMap> {
        if arc_policy::key::view::is_view(key) {
            return self.view.as_ref();
        }
        self.exports.get(split_key(key).0).and_then(|e| e.as_ref())
    }

    /// Whether `verified` bytes read for `part` of `ptr` are the record's.
    fn verify(&self, key: u64, ptr: L2Ptr, part: Part, bytes: &[u8]) -> bool {
        match part {
            Part::Whole => self.checksum(key, bytes, ptr.flags().raw) == ptr.cksum,
            Part::Half(which) => {
                format::half_checksum(bytes, self.payload_seed(key), which)
                    == (ptr.cksum >> (32 * which)) as u32
            }
        }
    }

    fn tag(&self, dev: usize, key: u64) -> u16 {
        self.export_map(key).map_or(0, |e| e.tags[dev])
    }

    /// Whether the device keeps a log. An atomic, not the persist lock:
    /// this is asked under the meta lock, which a commit takes while
    /// holding the persist lock.
    pub fn is_persistent(&self, dev: usize) -> bool {
        self.logs_on[dev].load(Relaxed)
    }

    pub fn devices(&self) -> &[Arc<L2Device>] {
        &self.devices
    }

    pub fn healthy_devices(&self) -> usize {
        self.devices.iter().filter(|d| !d.is_degraded()).count()
    }

    pub fn lookup(&self, key: u64) -> Option<L2Ptr> {
        self.meta.lock().index.get(key)
    }

    pub fn contains(&self, key: u64) -> bool {
        self.lookup(key).is_some()
    }

    /// Marks `key` as being fed; false if it is on L2 already or being fed.
    /// Call while the record's bytes cannot change (under the ARC lock).
    pub fn begin_feed(&self, key: u64) -> bool {
        self.begin_feed_checked(key) == FeedStart::Started
    }

    /// [`L2Arc::begin_feed`], saying why not.
    pub fn begin_feed_checked(&self, key: u64) -> FeedStart {
        let mut m = self.meta.lock();
        if m.index.get(key).is_some() || m.in_flight.contains_key(&key) {
            return FeedStart::Held;
        }
        if m.writing.contains_key(&key) {
            return FeedStart::Busy;
        }
        m.in_flight.insert(key, false);
        FeedStart::Started
    }

    /// Changes when copies are lost to a fault: a batch that failed, a
    /// device retired, a copy found bad. Not when the write hand
    /// overwrites copies to make room for newer records, nor when a write
    /// invalidates one (the record it belonged to is replaced in RAM, or
    /// changed in place and unmarked). So the feed sends a record once per
    /// stay in RAM and, until a fault, passes over every record it marked
    /// without asking L2 again. Feeding records whose copies the hand had
    /// overwritten had an L2 smaller than what RAM holds rewritten in
    /// circles at the device's full speed, idle server and all, and any
    /// client write re-armed that while writes changed the generation
    /// (engine test
    /// `an_l2_smaller_than_ram_is_filled_once_not_rewritten_in_circles`).
    /// And asking L2 about each record at each scan, a lock and lookups,
    /// was a sixth of the server's time on a cold stream.
    pub fn drop_generation(&self) -> u64 {
        self.drops.load(Ordering::Acquire)
    }

    fn note_drops(&self) {
        self.drops.fetch_add(1, Ordering::Release);
    }

    /// Forgets any L2 copy of `key`, including one the feed is writing now.
    /// Call after the new contents are in RAM and before the change is
    /// acknowledged. (A write to the backing store goes through
    /// [`L2Arc::begin_write`] first, which also makes the forgetting durable.)
    pub fn invalidate(&self, key: u64) {
        let mut m = self.meta.lock();
        self.invalidate_locked(&mut m, key, false);
    }

    /// Drops `key`'s copy; with `log`, appends INVALIDATE entries where a
    /// log could still restore an older copy and returns the positions to
    /// wait for.
    fn invalidate_locked(&self, m: &mut Meta, key: u64, log: bool) -> Vec<Ticket> {
        if let Some(dirty) = m.in_flight.get_mut(&key) {
            *dirty = true;
        }
        let mut devs: u32 = 0;
        if let Some(p) = m.index.remove(key) {
            m.size -= p.lsize();
            m.asize -= p.blob_len();
            self.stats.l2_invalidated.fetch_add(1, Relaxed);
            devs |= 1 << p.dev();
        }
        // Also without `log`: the rebuild takes "in the index" for "met in a
        // newer entry" (rebuild.rs, `Seen`), so a removal must say so.
        if self.is_rebuilding() {
            m.rebuild_killed.insert(key);
        }
        if !log {
            return Vec::new();
        }
        let mut tickets = Vec::new();
        for d in 0..self.devices.len() {
            // A device being rebuilt may hold the key in a part of its log
            // not read yet.
            let t = if devs & (1 << d) != 0 || self.rebuilding[d].load(Relaxed) {
                self.append_invalidate(m, d, key)
            } else {
                m.logs[d].invalidated.get(&key).map(|&upto| Ticket { dev: d, upto })
            };
            tickets.extend(t);
        }
        tickets
    }

    fn append_invalidate(&self, m: &mut Meta, dev: usize, key: u64) -> Option<Ticket> {
        let tag = self.tag(dev, key);
        if tag == 0 || !self.is_persistent(dev) {
            return None;
        }
        let log = &mut m.logs[dev];
        log.entries.push(Entry {
            kind: EntryKind::Invalidate,
            flags: 0,
            lshift: 0,
            tag,
            blob_sectors: 0,
            record: entry_record(key),
            lpos_or_count: 1,
            cksum: 0,
        });
        log.appended += 1;
        log.invalidated.insert(key, log.appended);
        Some(Ticket { dev, upto: log.appended })
    }

    /// Starts a write of `keys` to the backing store: drops their L2 copies,
    /// keeps the feed from capturing them and a rebuild from restoring
    /// them until [`L2Arc::end_write`], and returns once no log on any
    /// device can bring an older copy back after a crash. Call before the
    /// backing store sees the write.
    pub fn begin_write(&self, keys: &[u64]) {
        let tickets = self.begin_write_deferred(keys);
        self.make_durable(&tickets);
    }

    /// [`L2Arc::begin_write`] without waiting: the copies are gone from the
    /// index at once, and the returned tickets must be passed to
    /// [`L2Arc::make_durable`] before the write reaches the backing store.
    /// For write-back, where that happens in a later transaction group.
    /// Keeps the feed off `keys` until a matching [`L2Arc::end_write`],
    /// leaving their copies alone: for a writer that drops them itself and
    /// must not see the feed take the old contents in between.
    pub fn hold_off_feed(&self, keys: &[u64]) {
        let mut m = self.meta.lock();
        for &k in keys {
            *m.writing.entry(k).or_insert(0) += 1;
        }
    }

    pub fn begin_write_deferred(&self, keys: &[u64]) -> Vec<Ticket> {
        let mut m = self.meta.lock();
        let mut t = Vec::new();
        for &k in keys {
            *m.writing.entry(k).or_insert(0) += 1;
            t.extend(self.invalidate_locked(&mut m, k, true));
        }
        t
    }

    /// Ends a write started with [`L2Arc::begin_write`], after the new
    /// contents are in the ARC (or the record was dropped from it).
    pub fn end_write(&self, keys: &[u64]) {
        let mut m = self.meta.lock();
        for k in keys {
            if let Some(n) = m.writing.get_mut(k) {
                *n -= 1;
                if *n == 0 {
                    m.writing.remove(k);
                }
            }
        }
    }

    /// Removes the entry only if it still is `ptr`. The log may still hold
    /// the entry, so a later write of the key must wait for an INVALIDATE.
    fn drop_if_same(&self, key: u64, ptr: L2Ptr) -> bool {
        let mut m = self.meta.lock();
        if m.index.get(key) == Some(ptr) {
            m.index.remove(key);
            self.note_drops();
            m.size -= ptr.lsize();
            m.asize -= ptr.blob_len();
            if self.rebuilding.iter().any(|r| r.load(Relaxed)) {
                m.rebuild_killed.insert(key);
            }
            self.append_invalidate(&mut m, ptr.dev(), key);
            true
        } else {
            false
        }
    }

    /// Reads and verifies the L2 copy `ptr` of `key`; returns the record's
    /// stored bytes. A failure drops the entry and is counted.
    pub fn read(&self, key: u64, ptr: L2Ptr) -> Result<Box<[u8]>, L2Miss> {
        self.read_many(&[(key, ptr)]).pop().unwrap_or(Err(L2Miss::Unavailable))
    }

    /// Reads and verifies half `which` (0 or 1) of a copy stored split
    /// ([`L2Ptr::split`]): a small read of a big record costs half the
    /// device bandwidth. Fails like [`L2Arc::read`], and with
    /// `Unavailable` for a copy that is not split.
    pub fn read_half(&self, key: u64, ptr: L2Ptr, which: u64) -> Result<Box<[u8]>, L2Miss> {
        let Some(part) = Part::of(ptr, Some(which)) else { return Err(L2Miss::Unavailable) };
        let mut out = Vec::with_capacity(1);
        self.read_run(&[(key, ptr)], part, &mut out);
        out.pop().unwrap_or(Err(L2Miss::Unavailable))
    }

    /// Reads several copies, with one device read for each run of copies
    /// that lie back to back on the same device (records fed together), and
    /// verifies each copy on its own. Results are in the order given.
    pub fn read_many(&self, wanted: &[(u64, L2Ptr)]) -> Vec<Result<Box<[u8]>, L2Miss>> {
        let mut out = Vec::with_capacity(wanted.len());
        let mut i = 0;
        while i < wanted.len() {
            let mut j = i + 1;
            let mut end = wanted[i].1.daddr() + wanted[i].1.blob_len();
            while j < wanted.len()
                && wanted[j].1.dev() == wanted[i].1.dev()
                && wanted[j].1.daddr() == end
                && end - wanted[i].1.daddr() < MAX_COALESCED_READ
            {
                end += wanted[j].1.blob_len();
                j += 1;
            }
            self.read_run(&wanted[i..j], Part::Whole, &mut out);
            i = j;
        }
        out
    }

    /// Reads `part` of each copy of `run` (back to back on one device; a
    /// half only of a run of one) with one device read.
    fn read_run(&self, run: &[(u64, L2Ptr)], part: Part, out: &mut Vec<Result<Box<[u8]>, L2Miss>>) {
        let Some(dev) = self.device_in_service(run, out) else { return };
        let (start, len) = run_extent(run, part);
        let verified = match self.read_run_in_place(&dev, run, part, start) {
            Some(v) => v,
            None => dev.read_with(start, len, |bytes| self.verify_run(run, part, bytes)),
        };
        self.settle_run(&dev, run, len, verified, out);
    }

    /// A run of whole raw copies read into a buffer per record, verified
    /// where they landed; `None` where the device cannot (see
    /// [`L2Device::read_records`]).
    fn read_run_in_place(
        &self,
        dev: &L2Device,
        run: &[(u64, L2Ptr)],
        part: Part,
        start: u64,
    ) -> Option<blockdev::DevResult<Verified>> {
        if !matches!(part, Part::Whole) || !run.iter().all(|(_, p)| p.flags().raw) {
            return None;
        }
        let lens: Vec<u64> = run.iter().map(|(_, p)| p.blob_len()).collect();
        let bufs = match dev.read_records(start, &lens, self.bufs.get().map(|b| &**b)) {
            Ok(Some(bufs)) => bufs,
            Ok(None) => return None,
            Err(e) => return Some(Err(e)),
        };
        let checked =
            run.iter().zip(bufs).map(|(&(key, ptr), b)| self.verify(key, ptr, part, &b).then_some(b));
        Some(Ok(checked.collect()))
    }

    /// The device holding `run`, or `None` (and every copy dropped and
    /// answered `Unavailable`) if it is out of service.
    fn device_in_service(
        &self,
        run: &[(u64, L2Ptr)],
        out: &mut Vec<Result<Box<[u8]>, L2Miss>>,
    ) -> Option<Arc<L2Device>> {
        let dev = self.devices.get(run[0].1.dev()).filter(|d| !d.is_degraded());
        if dev.is_none() {
            for &(key, ptr) in run {
                self.drop_if_same(key, ptr);
                out.push(Err(L2Miss::Unavailable));
            }
        }
        dev.cloned()
    }

    /// Checks each copy of `run` in `bytes` (the run's extent as read) and
    /// unframes the good ones.
    fn verify_run(&self, run: &[(u64, L2Ptr)], part: Part, bytes: &[u8]) -> Verified {
        let first = run[0].1;
        run.iter()
            .map(|&(key, ptr)| {
                let blob = match part {
                    Part::Whole => {
                        let at = (ptr.daddr() - first.daddr()) as usize;
                        &bytes[at..at + ptr.blob_len() as usize]
                    }
                    Part::Half(_) => bytes,
                };
                let ok = self.verify(key, ptr, part, blob);
                let raw = ptr.flags().raw || matches!(part, Part::Half(_));
                let whole_raw = ptr.flags().raw && matches!(part, Part::Whole);
                ok.then(|| unframe(blob, raw).map(|b| if whole_raw { self.record_copy(b) } else { b.into() }))
                    .flatten()
            })
            .collect()
    }

    /// A boxed copy of a raw record read whole, in a buffer from the
    /// installed source (the engine's buffers of evicted records) when it
    /// has one: every such read inserts a record into the ARC and evicts
    /// one of the same size, whose buffer comes back for the next read
    /// (a new one per read faulted in pages the allocator had just given
    /// back). Halves and compressed copies take new buffers: their lengths
    /// match no evicted record's, and a source counts what it was asked
    /// for and could not give as what to keep.
    fn record_copy(&self, bytes: &[u8]) -> Box<[u8]> {
        self.bufs.get().map_or_else(|| bytes.into(), |source| source.copy_of(bytes))
    }

    /// Turns a run's read into its answers: counts, drops what failed, and
    /// takes a device that keeps failing out of service.
    fn settle_run(
        &self,
        dev: &L2Device,
        run: &[(u64, L2Ptr)],
        len: u64,
        verified: blockdev::DevResult<Verified>,
        out: &mut Vec<Result<Box<[u8]>, L2Miss>>,
    ) {
        let first = run[0].1;
        let verified = match verified {
            Ok(v) => v,
            Err(e) => {
                self.stats.l2_io_error.fetch_add(1, Relaxed);
                for &(key, ptr) in run {
                    self.drop_if_same(key, ptr);
                    out.push(Err(L2Miss::IoError));
                }
                if dev.note_error() {
                    warn!("L2 device {} taken out of service after repeated errors (last: {e})", dev.path);
                    self.retire(first.dev());
                }
                return;
            }
        };
        self.stats.l2_read_bytes.fetch_add(len, Relaxed);
        let mut bad = 0;
        for (&(key, ptr), data) in run.iter().zip(verified) {
            if data.is_some() {
                dev.note_success();
            } else if self.index_has(key, ptr) {
                bad += 1;
            }
            out.push(match data {
                Some(d) => Ok(d),
                None if self.drop_if_same(key, ptr) => {
                    self.stats.l2_cksum_bad.fetch_add(1, Relaxed);
                    dev.stats.cksum_bad.fetch_add(1, Relaxed);
                    Err(L2Miss::ChecksumBad)
                }
                None => {
                    self.stats.l2_evict_reading.fetch_add(1, Relaxed);
                    Err(L2Miss::EvictedWhileReading)
                }
            });
        }
        if bad > 0 && (0..bad).any(|_| dev.note_bad_data()) {
            warn!(
                "L2 device {} taken out of service: it keeps returning data that fails verification",
                dev.path
            );
            self.retire(first.dev());
        }
    }

    /// Starts queuing L2 reads through io_uring ([`L2Arc::read_async`]).
    /// Fails where io_uring is unavailable; reads then stay blocking.
    pub fn start_async_reads(&self) -> std::io::Result<()> {
        if self.uring.get().is_none() {
            self.use_ring(Arc::new(blockdev::uring::Uring::start("l2-ring")?));
        }
        Ok(())
    }

    /// Queues L2 reads through `ring`, which other readers (the backing
    /// stores) may share; ignored once reads have a ring.
    pub fn use_ring(&self, ring: Arc<blockdev::uring::Uring>) {
        let _ = self.uring.set(ring);
    }

    /// Makes the read ring fail (see [`blockdev::uring::Uring::inject_failure`]).
    #[doc(hidden)]
    pub fn inject_ring_failure(&self) {
        if let Some(ring) = self.uring.get() {
            ring.inject_failure();
        }
    }

    /// `l2arc_ring_reads`: lets reads use the ring (when started) or not.
    pub fn set_ring_reads(&self, on: bool) {
        self.ring_on.store(on, Relaxed);
    }

    /// Whether [`L2Arc::read_async`] can take a read of `ptr`: async reads
    /// are started and its device reads O_DIRECT through a descriptor.
    pub fn can_read_async(&self, ptr: L2Ptr) -> bool {
        self.ring_on.load(Relaxed) && self.ring_route(ptr).is_some_and(|(ring, _, _)| ring.is_alive())
    }

    /// The ring, device and descriptor a ring read of `ptr` goes through.
    fn ring_route(
        &self,
        ptr: L2Ptr,
    ) -> Option<(&blockdev::uring::Uring, &Arc<L2Device>, std::os::fd::RawFd)> {
        let ring = self.uring.get()?;
        let dev = self.devices.get(ptr.dev()).filter(|d| !d.is_degraded())?;
        Some((ring, dev, dev.direct_read_fd()?))
    }

    /// Reads and verifies a copy (`half`: only that half of a split copy,
    /// as [`L2Arc::read_half`]) without blocking; `done` gets what
    /// [`L2Arc::read`] would return, on the ring thread. Gives `done` back
    /// when the read cannot be queued ([`L2Arc::can_read_async`]).
    pub fn read_async(
        self: &Arc<Self>,
        key: u64,
        ptr: L2Ptr,
        half: Option<u64>,
        done: AsyncDone,
    ) -> Result<(), AsyncDone> {
        let (Some(part), Some((ring, dev, fd))) = (Part::of(ptr, half), self.ring_route(ptr)) else {
            return Err(done);
        };
        let run = [(key, ptr)];
        let (start, len) = run_extent(&run, part);
        let (at, need, skip) = dev.aligned_extent(start, len);
        // A raw record read whole, on pages of its own, is read straight
        // into a buffer from the installed source (an evicted record's),
        // which the cache then keeps: no copy out of the ring's buffer.
        let whole_pages = matches!(part, Part::Whole) && ptr.flags().raw && skip == 0 && need as u64 == len;
        let into = self.bufs.get().filter(|_| whole_pages).map(|source| source.uninit(need));
        let me = Arc::clone(self);
        let dev = Arc::clone(dev);
        let finish: blockdev::uring::Finish = Box::new(move |bytes, batch| {
            let verified = match bytes {
                // Only a raw copy is its record's bytes as they lie; anything
                // else (were it ever given a buffer) is unframed as usual.
                Ok(blockdev::uring::Landed::Own(b)) if ptr.flags().raw => {
                    Ok(vec![me.verify(key, ptr, part, &b).then_some(b)])
                }
                Ok(landed) => Ok(me.verify_run(&run, part, landed.bytes())),
                Err(blockdev::uring::ReadError::Device(e)) => Err(e),
                // Not the device's fault: the copy stays, the read is redone.
                Err(blockdev::uring::ReadError::RingFailed) => return done(Err(L2Miss::Unavailable), batch),
            };
            let mut out = Vec::with_capacity(1);
            me.settle_run(&dev, &run, len, verified, &mut out);
            done(out.pop().unwrap_or(Err(L2Miss::Unavailable)), batch);
        });
        match ring.submit(blockdev::uring::Op { fd, at, need, skip, len: len as usize, finish, into }) {
            Ok(()) => Ok(()),
            Err(op) => {
                // The ring failed since `can_read_async` said yes: `done`
                // hears so at once and the read is redone on a worker.
                (op.finish)(Err(blockdev::uring::ReadError::RingFailed), &mut Batch::new());
                Ok(())
            }
        }
    }

    fn index_has(&self, key: u64, ptr: L2Ptr) -> bool {
        self.meta.lock().index.get(key) == Some(ptr)
    }

    /// Drops every entry of a device that left service, and tries to make
    /// its log unrestorable (it will not hear of later writes).
    fn retire(&self, dev_idx: usize) {
        // Before its entries go: a feed cycle must not write it again, nor a
        // read use it (a failed log or header write retires a device whose
        // error count never reached the limit).
        self.devices[dev_idx].take_out_of_service();
        self.abandon_log(dev_idx);
        // The entries' lock before the device's batches, the order a batch
        // is indexed in (`write_batch`): a batch indexed before this is
        // among those cleared here; one indexed after finds the device out
        // of service and is not indexed at all.
        let mut m = self.meta.lock();
        let batches = self.devices[dev_idx].clear();
        for (start, b) in batches {
            for &k in b.keys.iter() {
                if let Some(p) =
                    m.index.get(k).filter(|p| p.dev() == dev_idx && p.daddr() >= start && p.daddr() < b.end)
                {
                    m.index.remove(k);
                    self.note_drops();
                    m.size -= p.lsize();
                    m.asize -= p.blob_len();
                    // The rebuild takes "in the index" for "met in a newer
                    // entry" (rebuild.rs, `Seen`): a removal must say so.
                    if self.is_rebuilding() {
                        m.rebuild_killed.insert(k);
                    }
                }
            }
        }
    }

    /// Writes `items` as one batch at device `dev_idx`'s hand, keeping `ahead`
    /// bytes beyond it clear. Entries the hand overwrites are dropped before
    /// the write; the new ones are indexed after it, except records that
    /// changed meanwhile. Returns the bytes written.
    pub fn write_batch(
        &self,
        dev_idx: usize,
        items: Vec<FeedItem>,
        ahead: u64,
        trim_ahead: bool,
    ) -> Result<u64, String> {
        let dev = &self.devices[dev_idx];
        // In key order, a stream's records lie back to back on the device and
        // come back with one read, whatever order the ARC evicted them in.
        let mut items = items;
        items.sort_unstable_by_key(|it| it.key);
        for it in items.iter_mut() {
            it.flags.raw = stored_raw((*it.data).as_ref(), it.flags.compressed);
        }
        let layout = BatchLayout::of(&items);
        let len = layout.len;
        let mut buf = self.batch_buffer(layout.staged as usize);
        let mut placed = Vec::with_capacity(items.len());
        {
            let out = buf.as_mut_slice();
            let mut at = 0u64;
            for (it, &(flen, staged_at)) in items.iter().zip(&layout.items) {
                let data = (*it.data).as_ref();
                let blob = match staged_at {
                    None => data,
                    Some(st) => {
                        let blob = &mut out[st as usize..(st + flen) as usize];
                        if it.flags.raw {
                            blob.copy_from_slice(data);
                        } else {
                            frame_into(data, blob);
                        }
                        blob
                    }
                };
                placed.push((it.key, at, flen, self.checksum(it.key, blob, it.flags.raw), it.flags));
                at += flen;
            }
            out[layout.staged_used as usize..].fill(0);
        }
        let abort = |why: String| {
            let mut m = self.meta.lock();
            for it in &items {
                m.in_flight.remove(&it.key);
            }
            self.note_drops();
            why
        };
        if dev.is_degraded() {
            return Err(abort(format!("{} is out of service", dev.path)));
        }
        if self.rebuilding[dev_idx].load(Relaxed) {
            return Err(abort(format!("{} is being rebuilt", dev.path)));
        }
        let Some(res) = dev.reserve(len, ahead) else {
            return Err(abort(format!("batch of {len} bytes does not fit {}", dev.path)));
        };
        self.forget_evicted(dev_idx, &res.evicted, res.offset..res.offset + len + ahead);
        if let Err(e) = self.ensure_evict(dev_idx, res.lpos + len + ahead) {
            return Err(abort(format!("writing the header of {}: {e}", dev.path)));
        }
        if trim_ahead && ahead > 0 {
            let _ = dev.trim(res.offset + len, ahead);
        }
        self.stats.l2_writes_sent.fetch_add(1, Relaxed);
        let staged = buf.as_slice();
        let parts: Vec<&[u8]> = (layout.pieces.iter())
            .map(|p| match *p {
                BatchPiece::Staged(from, to) => &staged[from as usize..to as usize],
                BatchPiece::InPlace(i) => (*items[i].data).as_ref(),
            })
            .collect();
        if let Err(e) = dev.write_vectored(res.offset, &parts) {
            self.stats.l2_writes_error.fetch_add(1, Relaxed);
            if dev.note_error() {
                warn!("L2 device {} taken out of service after repeated errors (last: {e})", dev.path);
                self.retire(dev_idx);
            }
            return Err(abort(format!("writing {}: {e}", dev.path)));
        }
        dev.note_success();
        self.stats.l2_writes_done.fetch_add(1, Relaxed);
        self.stats.l2_write_bytes.fetch_add(len, Relaxed);
        self.stats.l2_write_bytes_in_place.fetch_add(len - layout.staged, Relaxed);
        let mut keys = Vec::with_capacity(placed.len());
        let logging = self.is_persistent(dev_idx);
        let upto = {
            let mut m = self.meta.lock();
            if dev.is_degraded() {
                // Retired while this batch was written (see `retire`).
                drop(m);
                return Err(abort(format!("{} was taken out of service during the write", dev.path)));
            }
            for (key, rel, blob_len, cksum, flags) in placed {
                let dirty = m.in_flight.remove(&key).unwrap_or(true);
                if dirty {
                    continue;
                }
                let ptr = L2Ptr::new(dev_idx, res.offset + rel, blob_len, flags, cksum);
                if let Some(old) = m.index.insert(key, ptr) {
                    m.size -= old.lsize();
                    m.asize -= old.blob_len();
                }
                m.size += ptr.lsize();
                m.asize += ptr.blob_len();
                keys.push(key);
                let tag = self.tag(dev_idx, key);
                if logging && tag != 0 {
                    let log = &mut m.logs[dev_idx];
                    log.entries.push(cached_entry(
                        tag,
                        entry_record(key),
                        res.lpos + rel,
                        blob_len,
                        flags,
                        cksum,
                    ));
                    log.appended += 1;
                }
            }
            // Under the same lock as the entries, which `retire` takes
            // before it clears the batches.
            dev.commit(res.offset, len, keys);
            m.logs[dev_idx].appended
        };
        *self.spare_buf.lock() = Some(buf);
        let pending = self.uncommitted[dev_idx].fetch_add(len, Relaxed) + len;
        if pending >= self.commit_every.load(Relaxed).min(dev.capacity() / 4) {
            self.make_durable(&[Ticket { dev: dev_idx, upto }]);
        }
        Ok(len)
    }

    /// Lets up to `bytes` of batches go to a device before its log is
    /// committed (0, the default: after each batch). A commit flushes the
    /// device, which costs more than writing a batch on some devices; a
    /// writer that sets this calls [`L2Arc::commit_pending`] when it pauses.
    /// Batches not yet committed are simply not restored after a crash.
    pub fn set_commit_every(&self, bytes: u64) {
        self.commit_every.store(bytes, Relaxed);
    }

    /// Commits the log of every device that has batches not yet committed.
    pub fn commit_pending(&self) {
        for d in 0..self.devices.len() {
            if self.uncommitted[d].load(Relaxed) > 0 {
                let upto = self.meta.lock().logs[d].appended;
                self.make_durable(&[Ticket { dev: d, upto }]);
            }
        }
    }

    /// Batch bytes written whose log entries are not durable yet (their
    /// copies would not be restored after a crash); 0 once a commit,
    /// including its flush, has finished.
    pub fn uncommitted_bytes(&self) -> u64 {
        self.uncommitted.iter().map(|u| u.load(Relaxed)).sum()
    }

    fn batch_buffer(&self, len: usize) -> AlignedBuf {
        if let Some(mut b) = self.spare_buf.lock().take() {
            if b.reuse_as(len) {
                return b;
            }
        }
        let mut b = AlignedBuf::new(len.max(KEPT_BUFFER_BYTES));
        b.reuse_as(len);
        b
    }

    /// Drops the entries of batches the hand is about to overwrite
    /// (`cleared` is the address range it clears). Eviction is by batch, so
    /// some copies leave the index while their bytes stay intact; the log
    /// could restore those, so they get an INVALIDATE entry, as any copy
    /// that leaves the index other than by being overwritten does.
    fn forget_evicted(
        &self,
        dev_idx: usize,
        evicted: &[(u64, device::Batch)],
        cleared: std::ops::Range<u64>,
    ) {
        let mut m = self.meta.lock();
        let mut n = 0;
        for (start, b) in evicted {
            for &k in b.keys.iter() {
                let here =
                    m.index.get(k).filter(|p| p.dev() == dev_idx && p.daddr() >= *start && p.daddr() < b.end);
                if let Some(p) = here {
                    // Not a drop for the feed (see `drop_generation`).
                    m.index.remove(k);
                    m.size -= p.lsize();
                    m.asize -= p.blob_len();
                    if self.is_rebuilding() {
                        m.rebuild_killed.insert(k);
                    }
                    n += 1;
                    let overwritten = p.daddr() < cleared.end && p.daddr() + p.blob_len() > cleared.start;
                    if !overwritten {
                        self.append_invalidate(&mut m, dev_idx, k);
                    }
                }
            }
        }
        self.stats.l2_evict_hand.fetch_add(n, Relaxed);
        self.devices[dev_idx].stats.evicted.fetch_add(n, Relaxed);
    }

    pub fn device_rebuilding(&self, d: usize) -> bool {
        self.rebuilding[d].load(Relaxed)
    }

    pub fn is_rebuilding(&self) -> bool {
        self.rebuilding.iter().any(|r| r.load(Relaxed))
    }

    /// (records, logical bytes, allocated bytes) on L2.
    pub fn sizes(&self) -> (u64, u64, u64) {
        let m = self.meta.lock();
        (m.index.len() as u64, m.size, m.asize)
    }

    /// RAM spent to remember what is on L2: the index and the batch key lists.
    pub fn hdr_size(&self) -> u64 {
        let ix = self.meta.lock().index.allocated_bytes();
        ix + self.devices.iter().map(|d| d.batch_key_bytes()).sum::<u64>()
    }
}

fn cached_entry(tag: u16, record: u64, lpos: u64, blob_len: u64, flags: BlobFlags, cksum: u64) -> Entry {
    let mut f = 0;
    if flags.raw {
        f |= format::EF_RAW;
    }
    if flags.compressed {
        f |= format::EF_COMPRESSED;
    }
    if flags.prefetch {
        f |= format::EF_PREFETCH;
    }
    if flags.mfu {
        f |= format::EF_MFU;
    }
    Entry {
        kind: EntryKind::Cached,
        flags: f,
        lshift: flags.lshift,
        tag,
        blob_sectors: (blob_len / SECTOR) as u16,
        record,
        lpos_or_count: lpos,
        cksum,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The feed sizes its batches by this: a small compressed record takes
    /// a whole sector, several times its stored size.
    #[test]
    fn a_small_compressed_record_takes_a_sector_and_a_raw_one_its_length() {
        assert_eq!(device_len(&[7u8; 75], true), SECTOR);
        assert_eq!(device_len(&[7u8; 16384], false), 16384);
        assert_eq!(device_len(&[7u8; 16384], true), framed_len(16384));
    }
}
