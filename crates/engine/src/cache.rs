//! The shared ARC: one policy and one map of record data for every export,
//! behind one lock. The lock is held only for lookups and bookkeeping, never
//! across device IO.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use arc_policy::{Access, Key, Lookup, Policy, ZfsArc, ZfsArcConfig};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use crate::stats::ArcStats;

/// RAM charged per record on top of its data: the policy's slab entry, the
/// map slot and the shared buffer's header. Counted in `size` like OpenZFS
/// counts `hdr_size`, so `arc_max` bounds what the process really holds.
pub const RECORD_OVERHEAD: u64 = 112;

/// Bytes of one cached record, shared with readers that copy out of it
/// after the lock is gone.
pub type RecordData = Arc<[u8]>;

#[derive(Debug, Clone, Copy)]
pub struct CacheConfig {
    pub arc_min: u64,
    pub arc_max: u64,
    pub min_prefetch_ms: u64,
}

struct State {
    policy: ZfsArc,
    data: FxHashMap<Key, RecordData>,
    data_bytes: u64,
    evicted: Vec<Key>,
}

impl State {
    fn drop_evicted(&mut self) {
        for key in self.evicted.drain(..) {
            if let Some(d) = self.data.remove(&key) {
                self.data_bytes -= d.len() as u64;
            }
        }
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
    pub invalidated: AtomicU64,
    pub backing_reads: AtomicU64,
    pub backing_read_bytes: AtomicU64,
    pub backing_writes: AtomicU64,
    pub backing_write_bytes: AtomicU64,
    pub backing_errors: AtomicU64,
}

/// How a record was found, for the demand/prefetch hit counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Found {
    Hit,
    /// Filled by another request while this one waited for it.
    IoHit,
    Miss,
}

pub struct Cache {
    state: Mutex<State>,
    epoch: Instant,
    pub(crate) counters: Counters,
}

impl Cache {
    pub fn new(cfg: CacheConfig) -> Arc<Cache> {
        let mut zc = ZfsArcConfig::growing(cfg.arc_min, cfg.arc_max);
        zc.min_prefetch_ns = cfg.min_prefetch_ms * 1_000_000;
        Arc::new(Cache {
            state: Mutex::new(State {
                policy: ZfsArc::new(zc),
                data: FxHashMap::default(),
                data_bytes: 0,
                evicted: Vec::new(),
            }),
            epoch: Instant::now(),
            counters: Counters::default(),
        })
    }

    fn access(&self, prefetch: bool) -> Access {
        Access { now_ns: self.epoch.elapsed().as_nanos() as u64, prefetch }
    }

    /// Looks a record up as a read; a hit is recorded and returned.
    pub(crate) fn lookup(&self, key: Key, prefetch: bool) -> Option<RecordData> {
        let a = self.access(prefetch);
        let mut s = self.state.lock();
        match s.policy.lookup(key, a) {
            Lookup::Hit(_) => s.data.get(&key).cloned(),
            Lookup::GhostHit(_) | Lookup::Miss => None,
        }
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

    /// The cached copy, without counting an access.
    pub(crate) fn peek(&self, key: Key) -> Option<RecordData> {
        self.state.lock().data.get(&key).cloned()
    }

    /// Makes `data` the cached contents of `key`.
    pub(crate) fn insert(&self, key: Key, data: RecordData, prefetch: bool) {
        let a = self.access(prefetch);
        let mut s = self.state.lock();
        let len = data.len() as u64;
        if let Some(old) = s.data.insert(key, data) {
            s.data_bytes -= old.len() as u64;
        }
        s.data_bytes += len;
        let mut evicted = std::mem::take(&mut s.evicted);
        s.policy.insert(key, len + RECORD_OVERHEAD, a, &mut evicted);
        s.evicted = evicted;
        s.drop_evicted();
    }

    /// Forgets `key`; returns true if it was cached.
    pub(crate) fn invalidate(&self, key: Key) -> bool {
        let mut s = self.state.lock();
        s.policy.remove(key);
        match s.data.remove(&key) {
            Some(d) => {
                s.data_bytes -= d.len() as u64;
                self.counters.invalidated.fetch_add(1, Relaxed);
                true
            }
            None => false,
        }
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
        let mut s = self.state.lock();
        let mut evicted = std::mem::take(&mut s.evicted);
        s.policy.set_limits(arc_min, arc_max, &mut evicted);
        s.evicted = evicted;
        s.drop_evicted();
    }

    pub fn set_min_prefetch_ms(&self, ms: u64) {
        self.state.lock().policy.set_min_prefetch_ns(ms * 1_000_000);
    }

    pub fn stats(&self) -> ArcStats {
        let (p, data_bytes, entries) = {
            let s = self.state.lock();
            (s.policy.stats(), s.data_bytes, s.data.len() as u64)
        };
        ArcStats::collect(&p, &self.counters, data_bytes, entries)
    }

    /// Checks that the policy and the data map agree; for tests.
    pub fn validate(&self) -> Result<(), String> {
        let s = self.state.lock();
        s.policy.validate()?;
        let p = s.policy.stats();
        if p.entries != s.data.len() as u64 {
            return Err(format!("policy has {} entries, map {}", p.entries, s.data.len()));
        }
        if p.size != s.data_bytes + RECORD_OVERHEAD * p.entries {
            return Err(format!("policy size {} but data {} + headers", p.size, s.data_bytes));
        }
        Ok(())
    }
}
