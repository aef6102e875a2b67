//! The shared ARC: one policy and one map of records for every export,
//! behind one lock, plus the optional L2 behind it. The lock is held only
//! for lookups and bookkeeping, never across device IO.
//!
//! Lock order: the ARC lock, then the L2 index lock. Record locks (in
//! `Volume`) come before both.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use arc_policy::{Access, Key, ListKind, Lookup, Policy, SeenFilter};
use arcache_l2::{BlobFlags, FeedItem, FeedStart, L2Arc};
use arcache_sync::{Mutex, RwLock};
use rustc_hash::FxHashMap;

use crate::prefetch::Prefetcher;
use crate::record::Record;
use crate::stats::ArcStats;
use crate::zfetch::{ZfetchStats, ZfetchTunables};

/// RAM charged per record on top of its data: the policy's slab entry, the
/// map slot and the record's headers. Counted in `size` like OpenZFS counts
/// `hdr_size`, so `arc_max` bounds what the process really holds.
pub const RECORD_OVERHEAD: u64 = 112;

/// A cached record, shared with readers that copy out of it after the lock
/// is gone.
pub type RecordData = Arc<Record>;

/// How many exports one cache serves at most (keys carry a 16-bit id, and
/// the top values are the file view's or reserved by the L2 index).
pub const MAX_EXPORTS: usize = arc_policy::key::VOLUME_IDS as usize;

#[derive(Debug, Clone, Copy)]
pub struct CacheConfig {
    pub arc_min: u64,
    pub arc_max: u64,
    pub min_prefetch_ms: u64,
    pub compress: bool,
}

struct State {
    policy: Box<dyn Policy>,
    data: FxHashMap<Key, RecordData>,
    psize: u64,
    lsize: u64,
    evicted: Vec<Key>,
    /// Records read from half their L2 copy without being cached.
    seen: SeenFilter,
    /// Stored bytes and count of the metadata records (the file view's
    /// attributes, listings, symlinks and xattrs), within `psize`.
    meta_psize: u64,
    meta_records: u64,
    /// The high-water mark of `arc_meta_used`.
    meta_max: u64,
    /// `zfs_arc_min` and `zfs_arc_max` as set; the policy's ceiling is
    /// `arc_max` less `reserved`.
    limits: (u64, u64),
    /// The file view's table bytes taken off the policy's ceiling when it
    /// was last set (`dnode_size` moves it in steps).
    reserved: u64,
}

impl State {
    fn add(&mut self, key: Key, rec: &Record) {
        self.psize += rec.psize();
        self.lsize += rec.lsize();
        if arc_policy::key::view::is_metadata(key) {
            self.meta_psize += rec.psize();
            self.meta_records += 1;
            self.meta_max = self.meta_max.max(self.meta_used());
        }
    }

    fn sub(&mut self, key: Key, rec: &Record) {
        self.psize -= rec.psize();
        self.lsize -= rec.lsize();
        if arc_policy::key::view::is_metadata(key) {
            self.meta_psize -= rec.psize();
            self.meta_records -= 1;
        }
    }

    /// Metadata records' bytes and their headers.
    fn meta_records_used(&self) -> u64 {
        self.meta_psize + self.meta_records * RECORD_OVERHEAD
    }

    /// `arc_meta_used`: the records' part and the view's tables as last
    /// charged.
    fn meta_used(&self) -> u64 {
        self.meta_records_used() + self.reserved
    }
}

#[derive(Default)]
pub(crate) struct Counters {
    pub demand_hits: AtomicU64,
    pub demand_iohits: AtomicU64,
    pub demand_misses: AtomicU64,
    pub prefetch_hits: AtomicU64,
    pub prefetch_iohits: AtomicU64,
    pub prefetch_misses: AtomicU64,
    pub demand_metadata_hits: AtomicU64,
    pub demand_metadata_misses: AtomicU64,
    pub prefetch_metadata_hits: AtomicU64,
    pub prefetch_metadata_misses: AtomicU64,
    pub invalidated: AtomicU64,
    pub backing_reads: AtomicU64,
    pub backing_read_bytes: AtomicU64,
    pub backing_read_ns: AtomicU64,
    pub backing_writes: AtomicU64,
    pub backing_write_bytes: AtomicU64,
    pub backing_errors: AtomicU64,
    pub l2_hits: AtomicU64,
    pub l2_misses: AtomicU64,
    pub l2_partial_reads: AtomicU64,
    pub l2_partial_read_bytes: AtomicU64,
    pub l2_ring_reads: AtomicU64,
    pub backing_ring_reads: AtomicU64,
    pub evict_l2_cached: AtomicU64,
    pub evict_l2_eligible: AtomicU64,
    pub evict_l2_ineligible: AtomicU64,
    pub l2_abort_lowmem: AtomicU64,
    /// Demand iohits the policy recorded as hits on MRU and on MFU
    /// ([`Cache::joined`]): arcstats' `mru_hits` and `mfu_hits` count hits
    /// only, as OpenZFS's do, so these are taken off them.
    pub joined_mru: AtomicU64,
    pub joined_mfu: AtomicU64,
}

/// How a record was found, for the demand/prefetch hit counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    Hit,
    /// Filled by another request while this one waited for it.
    IoHit,
    Miss,
}

/// What a demand lookup found.
pub(crate) enum Looked {
    Hit(RecordData),
    /// Not in RAM, but in a ghost list: cached recently.
    Ghost,
    Cold,
}

/// What the feed may take from the ARC this cycle.
#[derive(Debug, Clone, Copy)]
pub struct FeedRules {
    /// How deep to look from each list's eviction end, in bytes.
    pub scan_bytes: u64,
    /// Stop after this many stored bytes.
    pub budget: u64,
    pub mfu_only: bool,
    pub include_prefetch: bool,
}

/// Where the batches of one feed cycle have looked so far, per list (MFU,
/// MRU): the next batch of the cycle walks past what an earlier one
/// examined without looking at it again. Without it every batch examined
/// the same records from each tail (a hash lookup each, under the ARC
/// lock): with the default headroom a cycle's scan reaches the whole ARC,
/// so a fast stream's cycle of many 8 MiB batches examined the ARC many
/// times over.
#[derive(Debug, Clone, Default)]
pub struct ScanMarks {
    lists: [ScanMark; 2],
    /// Records examined (looked up, checked for a copy) so far.
    pub examined: u64,
}

#[derive(Debug, Clone, Copy, Default)]
struct ScanMark {
    /// The last record examined, and its depth from the tail in bytes
    /// (its own size included).
    last: Option<(Key, u64)>,
    /// The list was walked to the end of the scan: nothing more this cycle.
    done: bool,
}

/// Which of the file view's records may go to L2.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ViewL2 {
    None = 0,
    Metadata = 1,
    All = 2,
}

pub struct Cache {
    state: Mutex<State>,
    epoch: Instant,
    l2: Option<Arc<L2Arc>>,
    /// Per export: may its records go to L2 (`secondarycache=all`)?
    secondary: RwLock<Vec<bool>>,
    /// The file view's `secondarycache`: [`ViewL2`] as a number.
    view_secondary: AtomicU8,
    compress: AtomicBool,
    partial_reads: AtomicBool,
    pub(crate) counters: Counters,
    pub zfetch: Arc<ZfetchTunables>,
    pub zfetch_stats: Arc<ZfetchStats>,
    prefetcher: std::sync::OnceLock<Prefetcher>,
    zfetch_active: Arc<AtomicU64>,
    sampler: crate::sizing::Sampler,
    /// `dnode_size`: RAM the file view's node and object tables hold,
    /// charged to the ARC as OpenZFS charges its dnodes.
    dnode_size: AtomicU64,
    /// `arc_dnode_limit`: the object table is trimmed above this.
    dnode_limit: AtomicU64,
    /// Copies of `State::reserved` and `zfs_arc_max`, read without the lock.
    reserved_hint: AtomicU64,
    arc_max_hint: AtomicU64,
    /// Buffers for reads from the backing stores, shared by every volume.
    pub(crate) fill_bufs: crate::fill_bufs::FillBufs,
    /// Buffers of evicted records, for the next backing reads.
    pub(crate) record_bufs: Arc<crate::record_bufs::RecordBufs>,
    /// Test builds: how often evicted records were counted and let go while
    /// someone held the ARC lock (in a test of one thread, its caller).
    #[cfg(test)]
    counted_under_lock: AtomicU64,
}

impl Cache {
    pub fn new(cfg: CacheConfig) -> Arc<Cache> {
        Self::with_l2(cfg, None)
    }

    /// A cache running the default policy (the first of
    /// [`arc_policy::SERVING_POLICIES`]).
    pub fn with_l2(cfg: CacheConfig, l2: Option<Arc<L2Arc>>) -> Arc<Cache> {
        Self::with_policy(cfg, l2, arc_policy::SERVING_POLICIES[0]).expect("the default policy exists")
    }

    /// A cache running the serving policy `name`; `None` for a name not in
    /// [`arc_policy::SERVING_POLICIES`].
    pub fn with_policy(cfg: CacheConfig, l2: Option<Arc<L2Arc>>, name: &str) -> Option<Arc<Cache>> {
        let policy = arc_policy::serving(name, cfg.arc_min, cfg.arc_max, cfg.min_prefetch_ms * 1_000_000)?;
        Some(Self::with_policy_instance(cfg, l2, policy))
    }

    /// A cache running `policy` as given (in bytes, its limits and
    /// prefetch lifetime already set): for tests that need a policy in a
    /// state the serving names reach only after enough evidence.
    #[doc(hidden)]
    pub fn with_policy_instance(
        cfg: CacheConfig,
        l2: Option<Arc<L2Arc>>,
        policy: Box<dyn Policy>,
    ) -> Arc<Cache> {
        let record_bufs = Arc::new(crate::record_bufs::RecordBufs::default());
        if let Some(l2) = &l2 {
            l2.set_buf_source(Arc::clone(&record_bufs) as Arc<dyn arcache_l2::BufSource>);
        }
        Arc::new(Cache {
            state: Mutex::new(State {
                policy,
                data: FxHashMap::default(),
                psize: 0,
                lsize: 0,
                evicted: Vec::new(),
                seen: SeenFilter::new(),
                meta_psize: 0,
                meta_records: 0,
                meta_max: 0,
                limits: (cfg.arc_min, cfg.arc_max),
                reserved: 0,
            }),
            epoch: Instant::now(),
            l2,
            secondary: RwLock::new(vec![true; MAX_EXPORTS]),
            view_secondary: AtomicU8::new(ViewL2::All as u8),
            compress: AtomicBool::new(cfg.compress),
            partial_reads: AtomicBool::new(true),
            counters: Counters::default(),
            zfetch: Arc::new(ZfetchTunables::default()),
            zfetch_stats: Arc::new(ZfetchStats::default()),
            prefetcher: std::sync::OnceLock::new(),
            zfetch_active: Arc::new(AtomicU64::new(0)),
            sampler: crate::sizing::Sampler::default(),
            dnode_size: AtomicU64::new(0),
            dnode_limit: AtomicU64::new(cfg.arc_max / 10),
            reserved_hint: AtomicU64::new(0),
            arc_max_hint: AtomicU64::new(cfg.arc_max),
            fill_bufs: crate::fill_bufs::FillBufs::default(),
            record_bufs,
            #[cfg(test)]
            counted_under_lock: AtomicU64::new(0),
        })
    }

    /// The name of the replacement policy this cache runs.
    pub fn policy_name(&self) -> &'static str {
        self.state.lock().policy.name()
    }

    pub(crate) fn zfetch_stats_active(&self) -> Arc<AtomicU64> {
        Arc::clone(&self.zfetch_active)
    }

    /// The shared prefetch pool, started on first use.
    pub(crate) fn prefetcher(&self) -> &Prefetcher {
        self.prefetcher.get_or_init(|| Prefetcher::new(crate::prefetch::PREFETCH_THREADS, 256))
    }

    /// Notes demand reads of `keys` for live sizing.
    pub(crate) fn observe(&self, keys: impl Iterator<Item = Key>) {
        for k in keys {
            self.sampler.observe(k);
        }
    }

    /// The live workload's estimated LRU curve and this cache's policy's
    /// curve for caches of `sizes` records, and its active data set.
    pub fn sizing(&self, sizes: &[u64]) -> crate::sizing::SizingView {
        self.sampler.view(sizes, self.policy_name())
    }

    pub fn l2(&self) -> Option<&Arc<L2Arc>> {
        self.l2.as_ref()
    }

    pub fn compress_enabled(&self) -> bool {
        self.compress.load(Relaxed)
    }

    /// `l2arc_partial_reads`.
    pub fn set_partial_reads(&self, on: bool) {
        self.partial_reads.store(on, Relaxed);
    }

    pub(crate) fn partial_reads(&self) -> bool {
        self.partial_reads.load(Relaxed)
    }

    /// `zfs_compressed_arc_enabled`: applies to records cached from now on.
    pub fn set_compress(&self, on: bool) {
        self.compress.store(on, Relaxed);
    }

    /// `secondarycache=all|none` for one export.
    pub fn set_secondarycache(&self, export_id: u16, all: bool) {
        if let Some(s) = self.secondary.write().get_mut(export_id as usize) {
            *s = all;
        }
    }

    /// `secondarycache` of the file view's records (ZFS's
    /// `all|metadata|none` for a dataset).
    pub fn set_view_secondarycache(&self, level: ViewL2) {
        self.view_secondary.store(level as u8, Relaxed);
    }

    fn l2_allowed(&self, key: Key) -> bool {
        self.l2_allowed_in(&self.secondary.read(), key)
    }

    fn l2_allowed_in(&self, secondary: &[bool], key: Key) -> bool {
        if arc_policy::key::view::is_view(key) {
            return match self.view_secondary.load(Relaxed) {
                x if x == ViewL2::All as u8 => true,
                x if x == ViewL2::Metadata as u8 => arc_policy::key::view::is_metadata(key),
                _ => false,
            };
        }
        secondary.get(usize::from(arc_policy::key::export(key))).copied().unwrap_or(false)
    }

    fn access(&self, prefetch: bool) -> Access {
        Access { now_ns: self.epoch.elapsed().as_nanos() as u64, prefetch }
    }

    /// Looks a record up as a read; a hit is recorded and returned, and a
    /// miss the ARC has a ghost of (cached recently) told from a cold one.
    pub(crate) fn lookup(&self, key: Key, prefetch: bool) -> Looked {
        let a = self.access(prefetch);
        let mut s = self.state.lock();
        match s.policy.lookup(key, a) {
            Lookup::Hit(_) => s.data.get(&key).cloned().map_or(Looked::Cold, Looked::Hit),
            Lookup::GhostHit(_) => Looked::Ghost,
            Lookup::Miss => Looked::Cold,
        }
    }

    /// Whether a cold record of `size` bytes may be read from half its L2
    /// copy and left out of RAM: yes unless it was read that way within the
    /// last ARC-target bytes of such reads (then it is read whole and
    /// cached, as a ghost hit would be).
    pub(crate) fn leave_uncached(&self, key: Key, size: u64) -> bool {
        let mut s = self.state.lock();
        let window = s.policy.stats().c;
        !s.seen.second_sighting(key, size, window)
    }

    /// Looks up every key as one read; all or nothing, so a read that would
    /// need IO leaves no trace and can be retried on the slow path.
    pub(crate) fn lookup_all(&self, keys: impl Iterator<Item = Key> + Clone) -> Option<Vec<RecordData>> {
        let a = self.access(false);
        let mut s = self.state.lock();
        if !keys.clone().all(|k| s.data.contains_key(&k)) {
            return None;
        }
        let mut out = Vec::new();
        for k in keys {
            s.policy.lookup(k, a);
            out.push(s.data.get(&k)?.clone());
        }
        Some(out)
    }

    /// True if every key is in RAM; counts nothing, moves nothing.
    pub(crate) fn all_cached(&self, mut keys: impl Iterator<Item = Key>) -> bool {
        let s = self.state.lock();
        keys.all(|k| s.data.contains_key(&k))
    }

    /// The copy another request cached while this demand read waited for
    /// the record's lock (an iohit), recorded as this read's access: a read
    /// that joins a prefetch makes the record a demand record, as a hit
    /// would, so the feed's and the policy's prefetch rules no longer treat
    /// it as speculative. (A prefetch that finds a record cached leaves it
    /// where it is, and uses `peek`.) The join comes right after the fill
    /// that inserted the record released its lock, and the policies time a
    /// re-use from the insert, so a join does not promote a record. Not a
    /// hit in `mru_hits`/`mfu_hits`: those count hits, as OpenZFS's do.
    pub(crate) fn joined(&self, key: Key) -> Option<RecordData> {
        let a = self.access(false);
        let mut s = self.state.lock();
        let data = s.data.get(&key).cloned()?;
        let joined = match s.policy.lookup(key, a) {
            Lookup::Hit(ListKind::Mfu) => &self.counters.joined_mfu,
            Lookup::Hit(_) => &self.counters.joined_mru,
            Lookup::GhostHit(_) | Lookup::Miss => return Some(data),
        };
        joined.fetch_add(1, Relaxed);
        Some(data)
    }

    /// The cached copy, without counting an access.
    pub(crate) fn peek(&self, key: Key) -> Option<RecordData> {
        self.state.lock().data.get(&key).cloned()
    }

    /// Caches a record read from a device (the backing store or L2).
    pub(crate) fn insert_read(&self, key: Key, rec: RecordData, prefetch: bool) {
        let gone = {
            let mut s = self.state.lock();
            self.insert_locked(&mut s, key, rec, prefetch)
        };
        self.count_evicted(gone);
    }

    /// How many of `keys` are in RAM.
    pub fn count_cached(&self, keys: &[Key]) -> u64 {
        let s = self.state.lock();
        keys.iter().filter(|k| s.data.contains_key(k)).count() as u64
    }

    /// Before a write of `keys` reaches the backing store: their L2 copies
    /// are dropped, durably (no restart or crash can bring them back), and
    /// the feed leaves them alone until [`Cache::end_write`].
    pub(crate) fn begin_write(&self, keys: &[Key]) {
        if let Some(l2) = &self.l2 {
            l2.begin_write(keys);
        }
    }

    /// Keeps the L2 feed off records until [`Cache::end_write`].
    pub(crate) fn hold_off_feed(&self, keys: &[Key]) {
        if let Some(l2) = &self.l2 {
            l2.hold_off_feed(keys);
        }
    }

    pub(crate) fn end_write(&self, keys: &[Key]) {
        if let Some(l2) = &self.l2 {
            l2.end_write(keys);
        }
    }

    /// Caches the new contents of a record a client just wrote. Call
    /// between [`Cache::begin_write`] and [`Cache::end_write`]: those already
    /// dropped any L2 copy and keep the feed off the record meanwhile.
    pub(crate) fn insert_written(&self, key: Key, rec: RecordData) {
        self.sampler.observe_write(key);
        let gone = {
            let mut s = self.state.lock();
            self.insert_locked(&mut s, key, rec, false)
        };
        self.count_evicted(gone);
    }

    fn insert_locked(
        &self,
        s: &mut State,
        key: Key,
        rec: RecordData,
        prefetch: bool,
    ) -> Vec<(Key, RecordData)> {
        let a = self.access(prefetch);
        let charge = rec.psize() + RECORD_OVERHEAD;
        if let Some(old) = s.data.remove(&key) {
            s.sub(key, &old);
        }
        s.add(key, &rec);
        s.data.insert(key, rec);
        let mut evicted = std::mem::take(&mut s.evicted);
        s.policy.insert(key, charge, a, &mut evicted);
        s.evicted = evicted;
        self.drop_evicted(s)
    }

    /// Takes the data of evicted records out of the cache. Counting them by
    /// L2 state takes the L2 index lock, and freeing their buffers the
    /// allocator's, so both happen after the ARC lock is released, from
    /// the list this returns (`count_evicted`).
    fn drop_evicted(&self, s: &mut State) -> Vec<(Key, RecordData)> {
        let mut gone = Vec::with_capacity(s.evicted.len());
        for key in std::mem::take(&mut s.evicted) {
            let Some(d) = s.data.remove(&key) else { continue };
            s.sub(key, &d);
            gone.push((key, d));
        }
        gone
    }

    fn count_evicted(&self, gone: Vec<(Key, RecordData)>) {
        #[cfg(test)]
        if self.state.try_lock().is_none() {
            self.counted_under_lock.fetch_add(1, Relaxed);
        }
        let c = &self.counters;
        for (key, d) in gone {
            let bytes = d.psize();
            if let Some(buf) = Arc::into_inner(d).and_then(Record::into_raw_buf) {
                self.give_record_buf(buf);
            }
            match &self.l2 {
                Some(l2) if l2.contains(key) => c.evict_l2_cached.fetch_add(bytes, Relaxed),
                Some(_) if self.l2_allowed(key) => c.evict_l2_eligible.fetch_add(bytes, Relaxed),
                _ => c.evict_l2_ineligible.fetch_add(bytes, Relaxed),
            };
        }
    }

    /// Hands `buf`, whose bytes nobody needs any more, to the next read
    /// from a backing store or L2 (kept only while reads need buffers).
    pub(crate) fn give_record_buf(&self, buf: Box<[u8]>) {
        let cap = crate::record_bufs::RecordBufs::cap(self.arc_max_hint.load(Relaxed));
        self.record_bufs.give(buf, cap);
    }

    /// Puts `plain`, the decompressed contents of `old`, in `old`'s place if
    /// `old` is still the cached record (a write may have replaced it
    /// meanwhile; then nothing changes). Hot large records are kept
    /// decompressed, as OpenZFS keeps hot buffers: decompressing a whole
    /// large record for each small read was the cost of small IO on large
    /// records. The L2 copy, of the same contents, stays.
    pub(crate) fn keep_decompressed(&self, key: Key, old: &RecordData, plain: RecordData) {
        let gone = {
            let mut s = self.state.lock();
            if !s.data.get(&key).is_some_and(|cur| Arc::ptr_eq(cur, old)) {
                return;
            }
            self.insert_locked(&mut s, key, plain, false)
        };
        self.count_evicted(gone);
    }

    /// Writes `bytes` over bytes `at..` of the cached record `key` in place,
    /// when it is uncompressed and nobody else holds it (a reader copying
    /// out of it, the feed); false otherwise, having changed nothing. Call
    /// with the record's lock held, between [`Cache::begin_write`] (or
    /// [`Cache::hold_off_feed`]) and [`Cache::end_write`]: the feed must not
    /// copy a record while it changes.
    pub(crate) fn patch_in_place(&self, key: Key, at: usize, bytes: &[u8]) -> bool {
        let mut s = self.state.lock();
        let Some(rec) = s.data.get_mut(&key).and_then(Arc::get_mut) else {
            return false;
        };
        rec.patch(at, bytes)
    }

    /// Forgets `key` in RAM and on L2; returns true if it was in RAM.
    pub(crate) fn invalidate(&self, key: Key) -> bool {
        if !arc_policy::key::view::is_view(key) {
            self.sampler.observe_remove(key);
        }
        let mut s = self.state.lock();
        s.policy.remove(key);
        if let Some(l2) = &self.l2 {
            l2.invalidate(key);
        }
        match s.data.remove(&key) {
            Some(d) => {
                s.sub(key, &d);
                self.counters.invalidated.fetch_add(1, Relaxed);
                true
            }
            None => false,
        }
    }

    // The file view (`arcache mount`, docs/fileview.md). Its keys are
    // `arc_policy::key::view`'s; these are its only ways into the ARC.

    /// A demand read of one view record: a hit is recorded by the policy
    /// and counted, a miss counted, as metadata or data by the key's kind.
    /// A record only on L2 is read from there (and cached again), counted
    /// as an ARC miss and an L2 hit, as ZFS counts it.
    pub fn view_lookup(&self, key: Key) -> Option<RecordData> {
        let (found, hit) = match self.lookup(key, false) {
            Looked::Hit(rec) => (Some(rec), true),
            Looked::Ghost | Looked::Cold => (self.view_from_l2(key), false),
        };
        let c = &self.counters;
        let counter = match (arc_policy::key::view::is_metadata(key), hit) {
            (true, true) => &c.demand_metadata_hits,
            (true, false) => &c.demand_metadata_misses,
            (false, true) => &c.demand_hits,
            (false, false) => &c.demand_misses,
        };
        counter.fetch_add(1, Relaxed);
        found
    }

    /// The L2 copy of a view record, verified by the L2's checksum and
    /// cached in RAM again. View records are kept uncompressed at the
    /// record level (their envelope compresses), so a copy says its size.
    fn view_from_l2(&self, key: Key) -> Option<RecordData> {
        let l2 = self.l2.as_ref()?;
        let c = &self.counters;
        let Some(ptr) = l2.lookup(key) else {
            c.l2_misses.fetch_add(1, Relaxed);
            return None;
        };
        let rec = match l2.read(key, ptr) {
            Ok(bytes) if !ptr.flags().compressed => {
                let len = bytes.len() as u32;
                Record::from_stored(bytes, len, false).ok()
            }
            _ => None,
        };
        let Some(rec) = rec else {
            l2.invalidate(key);
            c.l2_misses.fetch_add(1, Relaxed);
            return None;
        };
        c.l2_hits.fetch_add(1, Relaxed);
        let rec: RecordData = Arc::new(rec);
        // Cached only if the copy is still the key's: a change made while
        // it was read (a write through the view dropping the record, a new
        // record put) removed it from the L2 index under this lock, and the
        // old bytes must not come back in RAM. This read gets them, having
        // started before the change.
        let gone = {
            let mut s = self.state.lock();
            if l2.lookup(key) == Some(ptr) && !s.data.contains_key(&key) {
                self.insert_locked(&mut s, key, Arc::clone(&rec), false)
            } else {
                Vec::new()
            }
        };
        self.count_evicted(gone);
        Some(rec)
    }

    /// The cached copy of a view record, counting nothing.
    pub fn view_peek(&self, key: Key) -> Option<RecordData> {
        self.peek(key)
    }

    /// Caches a view record read from its source. Any L2 copy of the key
    /// goes: the view may put other bytes under a key it changed itself
    /// (a listing read again after a change made through the view), and an
    /// older copy must not come back once this one leaves RAM. Not made
    /// durable: after a restart the view never asks for that key again (a
    /// changed file has another ctime, hence another object number).
    pub fn view_insert(&self, key: Key, rec: RecordData) {
        debug_assert!(arc_policy::key::view::is_view(key));
        self.view_insert_replacing(key, rec, false);
    }

    /// Puts the new record in RAM and then drops any L2 copy, under the
    /// state lock: the feed, which takes that lock to pick records, never
    /// sees the old record in RAM with no L2 copy indexed (it would write
    /// the old bytes), and an L2 read settling meanwhile finds its copy
    /// gone. (`L2Arc::invalidate` after the new contents are in RAM.)
    fn view_insert_replacing(&self, key: Key, rec: RecordData, prefetch: bool) {
        let gone = {
            let mut s = self.state.lock();
            let gone = self.insert_locked(&mut s, key, rec, prefetch);
            if let Some(l2) = &self.l2 {
                l2.invalidate(key);
            }
            gone
        };
        self.count_evicted(gone);
    }

    /// A metadata prefetch found what it would read already cached
    /// (`prefetch_metadata_hits`).
    pub fn count_view_prefetch_hit(&self) {
        self.counters.prefetch_metadata_hits.fetch_add(1, Relaxed);
    }

    /// Caches a view metadata record a prefetch read from its source: a
    /// prefetch insert (the policy's prefetch rules apply), counted in
    /// `prefetch_metadata_misses` as ZFS counts a prefetch that had to read.
    pub fn view_insert_prefetch(&self, key: Key, rec: RecordData) {
        debug_assert!(arc_policy::key::view::is_view(key));
        self.counters.prefetch_metadata_misses.fetch_add(1, Relaxed);
        self.view_insert_replacing(key, rec, true);
    }

    /// Drops a view record; true if it was in RAM.
    pub fn view_invalidate(&self, key: Key) -> bool {
        self.invalidate(key)
    }

    /// A read of the view's source, counted as a backing-store read.
    pub fn count_view_source_read(&self, bytes: u64, ns: u64) {
        let c = &self.counters;
        c.backing_reads.fetch_add(1, Relaxed);
        c.backing_read_bytes.fetch_add(bytes, Relaxed);
        c.backing_read_ns.fetch_add(ns, Relaxed);
    }

    /// A write to the view's source, counted as a backing-store write.
    pub fn count_view_source_write(&self, bytes: u64) {
        self.count_backing_write(bytes);
    }

    /// One write of `bytes` that reached a backing store.
    pub(crate) fn count_backing_write(&self, bytes: u64) {
        let c = &self.counters;
        c.backing_writes.fetch_add(1, Relaxed);
        c.backing_write_bytes.fetch_add(bytes, Relaxed);
    }

    /// A failed write, flush, trim or zeroing of a backing store not counted
    /// where it failed (a txg, an in-place commit, a volume's flush).
    pub(crate) fn count_backing_error(&self) {
        self.counters.backing_errors.fetch_add(1, Relaxed);
    }

    /// Picks records near the eviction ends (MFU first, then MRU) that are
    /// not on L2 yet, marks them in flight and returns their stored bytes.
    pub fn feed_candidates(&self, rules: FeedRules, marks: &mut ScanMarks) -> Vec<FeedItem> {
        let Some(l2) = &self.l2 else { return Vec::new() };
        // Read before any record is looked at (see `L2Arc::drop_generation`).
        let tag = crate::record::fed_tag(l2.drop_generation());
        let s = self.state.lock();
        let secondary = self.secondary.read();
        let mut out = Vec::new();
        let mut taken = 0u64;
        let lists: &[ListKind] =
            if rules.mfu_only { &[ListKind::Mfu] } else { &[ListKind::Mfu, ListKind::Mru] };
        for &list in lists {
            let mark = &mut marks.lists[usize::from(list == ListKind::Mru)];
            if mark.done {
                continue;
            }
            let examined = &mut marks.examined;
            let resume = mark.last;
            let mut skipping = resume.is_some();
            let mut depth = 0u64;
            let mut stopped = false;
            let mut take = |key, size, prefetch| {
                if taken >= rules.budget {
                    stopped = true;
                    return false;
                }
                depth += size;
                if let Some((last_key, last_depth)) = resume.filter(|_| skipping) {
                    // Up to where the last batch stopped: its record, or,
                    // if that one left or moved, its depth (which evictions
                    // since may have made reach past what was examined;
                    // what it passes over waits for the next cycle).
                    if key == last_key {
                        skipping = false;
                        return true;
                    }
                    if depth <= last_depth {
                        return true;
                    }
                    skipping = false;
                }
                *examined += 1;
                mark.last = Some((key, depth));
                let allowed = self.l2_allowed_in(&secondary, key);
                if !allowed || (prefetch && !rules.include_prefetch) {
                    return true;
                }
                let Some(rec) = s.data.get(&key) else { return true };
                if rec.fed_at(tag) {
                    return true;
                }
                let start = l2.begin_feed_checked(key);
                if start != FeedStart::Busy {
                    rec.set_fed(tag);
                }
                if start == FeedStart::Started {
                    // What it takes on the device, which a batch must fit.
                    taken += arcache_l2::device_len((**rec).as_ref(), rec.is_compressed());
                    let lshift = lshift_of(rec.lsize());
                    let flags = BlobFlags {
                        raw: false,
                        compressed: rec.is_compressed(),
                        prefetch,
                        mfu: list == ListKind::Mfu,
                        lshift,
                    };
                    out.push(FeedItem { key, data: Arc::clone(rec) as arcache_l2::SharedBytes, flags });
                }
                true
            };
            if rules.mfu_only {
                s.policy.scan_tail_reused(list, rules.scan_bytes, &mut take);
            } else {
                s.policy.scan_tail(list, rules.scan_bytes, &mut take);
            }
            if !stopped {
                mark.done = true;
            }
        }
        out
    }

    pub(crate) fn count(&self, found: Found, prefetch: bool, n: u64) {
        let c = &self.counters;
        let counter = match (found, prefetch) {
            (Found::Hit, false) => &c.demand_hits,
            (Found::IoHit, false) => &c.demand_iohits,
            (Found::Miss, false) => &c.demand_misses,
            (Found::Hit, true) => &c.prefetch_hits,
            (Found::IoHit, true) => &c.prefetch_iohits,
            (Found::Miss, true) => &c.prefetch_misses,
        };
        counter.fetch_add(n, Relaxed);
    }

    /// Changes `zfs_arc_min`/`zfs_arc_max`; shrinking evicts at once.
    pub fn set_limits(&self, arc_min: u64, arc_max: u64) {
        let gone = {
            let mut s = self.state.lock();
            s.limits = (arc_min, arc_max);
            self.arc_max_hint.store(arc_max, Relaxed);
            self.apply_limits(&mut s)
        };
        self.count_evicted(gone);
    }

    /// Gives the policy its ceiling: `arc_max` less the view's tables, but
    /// never below `arc_min` nor half of `arc_max` (the tables are trimmed
    /// to `arc_dnode_limit`; nodes the kernel holds cannot be).
    fn apply_limits(&self, s: &mut State) -> Vec<(Key, RecordData)> {
        let (arc_min, arc_max) = s.limits;
        s.reserved = self.dnode_size.load(Relaxed);
        self.reserved_hint.store(s.reserved, Relaxed);
        s.meta_max = s.meta_max.max(s.meta_used());
        let ceiling = arc_max.saturating_sub(s.reserved).max(arc_min).max(arc_max / 2);
        let mut evicted = std::mem::take(&mut s.evicted);
        s.policy.set_limits(arc_min.min(ceiling), ceiling, &mut evicted);
        s.evicted = evicted;
        self.drop_evicted(s)
    }

    /// The file view's tables now hold `bytes` (`dnode_size`). The policy's
    /// ceiling follows in steps of 1/128 of `arc_max` (at least 1 MiB), so
    /// a table growing by one entry does not reset it each time.
    pub fn set_dnode_size(&self, bytes: u64) {
        self.dnode_size.store(bytes, Relaxed);
        // Checked before the lock too: most calls move nothing.
        let near = |reserved: u64, arc_max: u64| reserved.abs_diff(bytes) < (arc_max / 128).max(1 << 20);
        if near(self.reserved_hint.load(Relaxed), self.arc_max_hint.load(Relaxed)) {
            return;
        }
        let gone = {
            let mut s = self.state.lock();
            if near(s.reserved, s.limits.1) {
                return;
            }
            self.apply_limits(&mut s)
        };
        self.count_evicted(gone);
    }

    /// `arc_dnode_limit`, from `zfs_arc_dnode_limit` (bytes; 0: a share of
    /// `zfs_arc_max`, `zfs_arc_dnode_limit_percent`).
    pub fn set_dnode_limit(&self, bytes: u64) {
        self.dnode_limit.store(bytes, Relaxed);
    }

    pub fn dnode_limit(&self) -> u64 {
        self.dnode_limit.load(Relaxed)
    }

    /// `zfs_arc_meta_balance`.
    pub fn set_meta_balance(&self, balance: u64) {
        self.state.lock().policy.set_meta_balance(balance);
    }

    pub fn set_min_prefetch_ms(&self, ms: u64) {
        self.state.lock().policy.set_min_prefetch_ns(ms * 1_000_000);
    }

    /// The ARC's current target size, for the feed's header budget.
    pub fn target(&self) -> u64 {
        self.state.lock().policy.stats().c
    }

    /// Bytes evicted from RAM that could have gone to L2 and had not.
    pub fn evicted_l2_eligible(&self) -> u64 {
        self.counters.evict_l2_eligible.load(Relaxed)
    }

    /// Bytes per second one backing read achieves, over all reads so far.
    pub fn backing_read_bandwidth(&self) -> u64 {
        let c = &self.counters;
        let ns = c.backing_read_ns.load(Relaxed);
        if ns == 0 {
            return 0;
        }
        (c.backing_read_bytes.load(Relaxed) as u128 * 1_000_000_000 / ns as u128) as u64
    }

    pub(crate) fn note_l2_abort_lowmem(&self) {
        self.counters.l2_abort_lowmem.fetch_add(1, Relaxed);
    }

    /// The policy's counters with demand iohits taken off its MRU and MFU
    /// hits (read under the state lock, where [`Cache::joined`] counts them).
    fn policy_stats_without_joins(&self, s: &State) -> arc_policy::PolicyStats {
        let mut p = s.policy.stats();
        p.mru_hits = p.mru_hits.saturating_sub(self.counters.joined_mru.load(Relaxed));
        p.mfu_hits = p.mfu_hits.saturating_sub(self.counters.joined_mfu.load(Relaxed));
        p
    }

    pub fn stats(&self) -> ArcStats {
        let (p, psize, lsize, entries, meta, limits) = {
            let s = self.state.lock();
            (
                self.policy_stats_without_joins(&s),
                s.psize,
                s.lsize,
                s.data.len() as u64,
                (s.meta_psize, s.meta_records_used(), s.meta_max),
                s.limits,
            )
        };
        let mut st = ArcStats::collect(&p, &self.counters, psize, entries);
        (st.metadata_size, st.arc_meta_used, st.arc_meta_max) = meta;
        st.add_dnodes(self.dnode_size.load(Relaxed), self.dnode_limit(), limits);
        st.data_size = psize - meta.0;
        st.add_zfetch(&self.zfetch_stats);
        st.zfetch_io_active = self.zfetch_active.load(Relaxed);
        st.compressed_size = psize;
        st.uncompressed_size = lsize;
        if let Some(l2) = &self.l2 {
            st.add_l2(l2);
        }
        st.record_bufs_size = self.record_bufs.kept_bytes() as u64;
        st.record_bufs_reused = self.record_bufs.reused();
        st
    }

    /// Checks that the policy and the data map agree; for tests.
    pub fn validate(&self) -> Result<(), String> {
        let s = self.state.lock();
        s.policy.validate()?;
        let p = s.policy.stats();
        if p.entries != s.data.len() as u64 {
            return Err(format!("policy has {} entries, map {}", p.entries, s.data.len()));
        }
        if p.size != s.psize + RECORD_OVERHEAD * p.entries {
            return Err(format!("policy size {} but data {} + headers", p.size, s.psize));
        }
        Ok(())
    }
}

/// The L2 entry's `lshift` for a record of `lsize` bytes: log2 of its
/// logical size in 4 KiB units, the nearest power of two for a record whose
/// size is none (a file view record: its payload and 64-byte envelope), so
/// `l2_size` counts a 128 KiB data record as 128 KiB, not 256.
fn lshift_of(lsize: u64) -> u8 {
    let lsize = lsize.clamp(4096, 1 << 20);
    let up = lsize.next_power_of_two();
    let nearest = if lsize - up / 2 < up - lsize { up / 2 } else { up };
    (nearest.trailing_zeros() - 12) as u8
}

#[cfg(test)]
mod lshift_tests {
    use super::lshift_of;

    #[test]
    fn lshift_is_the_nearest_power_of_two_of_the_logical_size() {
        assert_eq!(lshift_of(1), 0);
        assert_eq!(lshift_of(4096), 0);
        assert_eq!(lshift_of(128 << 10), 5);
        assert_eq!(lshift_of((128 << 10) + 64), 5);
        assert_eq!(lshift_of(5 << 10), 0);
        assert_eq!(lshift_of(7 << 10), 1);
        assert_eq!(lshift_of(1 << 20), 8);
        assert_eq!(lshift_of(u64::MAX), 8);
    }
}

#[cfg(test)]
mod eviction_tests {
    use super::*;

    fn record(key: u64) -> RecordData {
        Arc::new(Record::raw(vec![key as u8; 4096]))
    }

    /// Evictions go through `count_evicted`, which takes the L2 index lock
    /// and frees or keeps buffers: it must run after the ARC lock is let
    /// go, or every reader waits for it. Driven here: reads, writes, a
    /// record kept decompressed and lower limits (the file view's inserts
    /// and `set_dnode_size` in the test below). One thread, so a held lock
    /// is the caller's.
    #[test]
    fn evicted_records_are_counted_and_let_go_after_the_arc_lock_is_released() {
        let cfg = CacheConfig { arc_min: 32 << 10, arc_max: 64 << 10, min_prefetch_ms: 0, compress: false };
        let cache = Cache::new(cfg);
        for k in 0..64 {
            cache.insert_read(k, record(k), false);
        }
        for k in 64..128 {
            cache.insert_written(k, record(k));
        }
        let old = cache.state.lock().data.get(&127).cloned().expect("the last record written is cached");
        cache.keep_decompressed(127, &old, record(127));
        cache.set_limits(16 << 10, 16 << 10);
        assert!(cache.stats().evicted >= 120, "too few evictions to tell: {}", cache.stats().evicted);
        assert_eq!(cache.counted_under_lock.load(Relaxed), 0, "evicted records counted under the ARC lock");
    }

    /// What clients write is cached, and the live sizing sees it: reads
    /// of records just written are hits in its curves, of records dropped
    /// since (trimmed) misses.
    #[test]
    fn the_live_sizing_sees_written_records() {
        let cfg = CacheConfig { arc_min: 32 << 20, arc_max: 64 << 20, min_prefetch_ms: 0, compress: false };
        let cache = Cache::new(cfg);
        for _ in 0..4 {
            for k in 0..20_000u64 {
                cache.insert_written(k, record(k));
                cache.observe(std::iter::once(k));
            }
        }
        let v = cache.sizing(&[1_000]);
        assert!(v.curve[0].1 > 0.95, "{v:?}");
        // Dropped after each write (a trim): each read then misses.
        let cache = Cache::new(cfg);
        for _ in 0..4 {
            for k in 0..20_000u64 {
                cache.insert_written(k, record(k));
                cache.invalidate(k);
                cache.observe(std::iter::once(k));
            }
        }
        let v = cache.sizing(&[1_000]);
        assert!(v.curve[0].1 < 0.05, "{v:?}");
    }

    /// The same for the file view's inserts and its tables' growth
    /// (`set_dnode_size`). (Its reads from L2, `view_from_l2`, insert
    /// through `insert_locked` and count as these do; they need an L2 and
    /// are not driven here.)
    #[test]
    fn the_file_views_evictions_are_counted_after_the_arc_lock_is_released() {
        use arc_policy::key::view::{self, Kind};
        let cfg = CacheConfig { arc_min: 4 << 20, arc_max: 8 << 20, min_prefetch_ms: 0, compress: false };
        let cache = Cache::new(cfg);
        let mut evicted = 0;
        let mut step = |name: &str, f: &dyn Fn(&Cache)| {
            f(&cache);
            let now = cache.stats().evicted;
            assert!(now >= evicted + 256, "{name}: {} evictions, too few to tell", now - evicted);
            evicted = now;
            assert_eq!(
                cache.counted_under_lock.load(Relaxed),
                0,
                "{name}: evicted records counted under the ARC lock"
            );
        };
        step("view inserts", &|c| {
            for i in 0..2560 {
                c.view_insert(view::make(Kind::Data, 1, i), record(i));
            }
        });
        step("view prefetches", &|c| {
            for i in 0..512 {
                c.view_insert_prefetch(view::make(Kind::Attr, 2, i), record(i));
            }
        });
        step("the view's tables", &|c| c.set_dnode_size(4 << 20));
    }
}
