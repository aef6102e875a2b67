//! Cache replacement policies, with no IO and no clock of their own.
//!
//! The server and the trace simulator drive the very same code: every call
//! carries the time it should consider "now", so a replay is deterministic.
//! A policy decides *which* keys are resident; the caller keeps the data.
//!
//! Protocol between caller and policy:
//! 1. [`Policy::lookup`] on every request. A hit updates the lists.
//! 2. On anything but a hit, the caller fetches the data and calls
//!    [`Policy::insert`], which may evict other keys (returned to the caller
//!    so it can drop their data).

mod adaptive;
mod blocks;
mod filed;
pub mod live;
mod lru;
pub mod mrc;
mod paper;
pub mod replay;
mod s3fifo;
mod seen;
mod select;
mod sieve;
mod slab;
mod twoq;
mod zfs;

pub use adaptive::{AdaptiveArc, META_BALANCE_DEFAULT};
pub use blocks::InBlocks;
pub use lru::Lru;
pub use paper::PaperArc;
pub use s3fifo::S3Fifo;
pub use seen::SeenFilter;
pub use sieve::Sieve;
pub use twoq::TwoQ;
pub use zfs::{ZfsArc, ZfsArcConfig};

/// Identity of a cached unit. The engine packs (export, record index) into
/// it, as [`key`] lays out.
pub type Key = u64;

/// The one layout of a [`Key`], used by the engine, its dirty pages and
/// the L2 index and rebuild: an export's id in the top 16 bits, a record
/// (or 4 KiB page) number below.
pub mod key {
    use super::Key;

    /// Bits that hold the record number.
    pub const RECORD_BITS: u32 = 48;
    /// The largest record number a key can carry.
    pub const MAX_RECORD: u64 = (1 << RECORD_BITS) - 1;
    /// Volumes' export ids are below this: read as ids, the file view's
    /// keys are 0x8000 and up, and the L2 index reserves 0xFFFF.
    pub const VOLUME_IDS: u16 = 4096;

    pub const fn make(export: u16, record: u64) -> Key {
        ((export as u64) << RECORD_BITS) | (record & MAX_RECORD)
    }

    pub const fn export(key: Key) -> u16 {
        (key >> RECORD_BITS) as u16
    }

    pub const fn record(key: Key) -> u64 {
        key & MAX_RECORD
    }

    /// The file view's keys (`arcache mount`, `docs/fileview.md`): bit 63
    /// set, a kind in bits 62..60, an object (one version of one source
    /// file) in bits 59..24 and an index below. Read as an export id their
    /// top 16 bits are at least 0x8000, so they never equal a volume's key
    /// (ids below 4096) nor carry the id 0xFFFF the L2 index reserves.
    pub mod view {
        use super::Key;

        pub const OBJECT_BITS: u32 = 36;
        pub const INDEX_BITS: u32 = 24;
        pub const MAX_OBJECT: u64 = (1 << OBJECT_BITS) - 1;
        pub const MAX_INDEX: u64 = (1 << INDEX_BITS) - 1;
        const TAG: u64 = 1 << 63;

        /// What a view record holds.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        #[repr(u8)]
        pub enum Kind {
            Attr = 0,
            DirChunk = 1,
            Symlink = 2,
            Xattrs = 3,
            Data = 4,
        }

        pub const fn make(kind: Kind, object: u64, index: u64) -> Key {
            TAG | ((kind as u64) << 60) | ((object & MAX_OBJECT) << INDEX_BITS) | (index & MAX_INDEX)
        }

        pub const fn is_view(key: Key) -> bool {
            key & TAG != 0
        }

        /// Attributes, listings, symlink targets and xattrs: the records
        /// counted as metadata.
        pub const fn is_metadata(key: Key) -> bool {
            is_view(key) && (key >> 60) & 7 < Kind::Data as u64
        }

        pub const fn object(key: Key) -> u64 {
            (key >> INDEX_BITS) & MAX_OBJECT
        }

        pub const fn index(key: Key) -> u64 {
            key & MAX_INDEX
        }
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn view_keys_never_meet_volume_keys() {
            use super::view::{self, Kind};
            for kind in [Kind::Attr, Kind::DirChunk, Kind::Symlink, Kind::Xattrs, Kind::Data] {
                for (object, index) in [(0, 0), (1, 7), (view::MAX_OBJECT, view::MAX_INDEX)] {
                    let k = view::make(kind, object, index);
                    assert!(view::is_view(k));
                    assert!(super::export(k) >= 0x8000 && super::export(k) != 0xFFFF);
                    assert_eq!((view::object(k), view::index(k)), (object, index));
                    assert_eq!(view::is_metadata(k), kind != Kind::Data);
                }
            }
            assert!(!view::is_view(super::make(4095, super::MAX_RECORD)));
            assert!(!view::is_metadata(super::make(1, 5)));
        }

        #[test]
        fn export_and_record_round_trip() {
            let k = super::make(4095, (1 << 48) - 1);
            assert_eq!((super::export(k), super::record(k)), (4095, (1 << 48) - 1));
            assert_eq!(super::make(1, 5), (1 << 48) | 5);
        }
    }
}

/// Which resident or ghost list a lookup found the key on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListKind {
    Mru,
    Mfu,
}

/// The answer to a lookup.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// Resident; the policy has recorded the access.
    Hit(ListKind),
    /// Not resident, but remembered on a ghost list. Insert after fetching.
    GhostHit(ListKind),
    /// Not known at all.
    Miss,
}

impl Lookup {
    pub fn is_hit(self) -> bool {
        matches!(self, Lookup::Hit(_))
    }
}

/// Context of one access: when it happens and whether it is speculative.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Access {
    /// Monotonic time in nanoseconds, supplied by the caller.
    pub now_ns: u64,
    /// A prefetch (read ahead, NBD CACHE) rather than a demand read.
    pub prefetch: bool,
}

impl Access {
    pub fn demand(now_ns: u64) -> Self {
        Access { now_ns, prefetch: false }
    }
}

/// Counters and sizes every policy reports; names follow OpenZFS arcstats.
/// Sizes are in the policy's unit (bytes for [`ZfsArc`] and [`Lru`],
/// entries for [`PaperArc`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PolicyStats {
    pub hits: u64,
    pub misses: u64,
    pub mru_hits: u64,
    pub mfu_hits: u64,
    pub mru_ghost_hits: u64,
    pub mfu_ghost_hits: u64,
    pub evict_skip: u64,
    /// Demand hits on records that were brought in by a prefetch.
    pub demand_hit_prefetch: u64,
    /// Ghost entries dropped from the directory.
    pub deleted: u64,
    /// Resident entries evicted (to a ghost list or dropped).
    pub evicted: u64,
    pub size: u64,
    pub c: u64,
    pub c_min: u64,
    pub c_max: u64,
    pub mru_size: u64,
    pub mfu_size: u64,
    pub mru_ghost_size: u64,
    pub mfu_ghost_size: u64,
    pub entries: u64,
    /// MRU's target share of the cache in 2^32 units (arcstats `pd`); for
    /// the textbook ARC, p/c scaled the same way.
    pub pd: u64,
    /// Metadata's target share of the cache in 2^32 units (arcstats
    /// `meta`); 0 for policies that do not tell metadata apart.
    pub meta: u64,
}

/// A replacement policy. Implementations are single-threaded and
/// deterministic; the engine wraps one in a lock.
pub trait Policy: Send {
    fn name(&self) -> &'static str;

    /// Records a request for `key`. Changes nothing unless it is a hit.
    fn lookup(&mut self, key: Key, access: Access) -> Lookup;

    /// Makes `key` resident with `size` units after a non-hit lookup.
    /// Keys evicted to make room are appended to `evicted`.
    fn insert(&mut self, key: Key, size: u64, access: Access, evicted: &mut Vec<Key>);

    /// Forgets `key` entirely (resident or ghost). Returns true if it was resident.
    fn remove(&mut self, key: Key) -> bool;

    /// True if `key` is resident. Does not count as an access.
    fn contains(&self, key: Key) -> bool;

    /// Changes the size limits; evicts at once if the new maximum is lower.
    fn set_limits(&mut self, c_min: u64, c_max: u64, evicted: &mut Vec<Key>);

    fn stats(&self) -> PolicyStats;

    /// Walks resident list `list` from its eviction end, at most `max_size`
    /// units deep, calling `f(key, size, prefetch)` until it returns false:
    /// what leaves next, for the L2 feed. A policy with one list has it all
    /// under [`ListKind::Mru`] and an empty [`ListKind::Mfu`].
    fn scan_tail(&self, list: ListKind, max_size: u64, f: &mut dyn FnMut(Key, u64, bool) -> bool);

    /// As [`Policy::scan_tail`], passing over entries a policy placed in
    /// MFU without their having been re-used (`l2arc_mfuonly` feeds
    /// re-used records, what MFU means in OpenZFS); they still count
    /// toward `max_size`. Policies whose MFU holds only re-used entries
    /// scan it whole, as `scan_tail` does; a wrapper must forward this.
    fn scan_tail_reused(&self, list: ListKind, max_size: u64, f: &mut dyn FnMut(Key, u64, bool) -> bool) {
        self.scan_tail(list, max_size, f)
    }

    /// How long a prefetched entry is kept before it may be evicted
    /// unused (`zfs_arc_min_prefetch_ms`); a policy without prefetch
    /// protection ignores it.
    fn set_min_prefetch_ns(&mut self, _ns: u64) {}

    /// `zfs_arc_meta_balance`: how strongly metadata ghost hits outweigh
    /// data ones in metadata's share (100: equally). Policies that do not
    /// tell metadata apart ignore it.
    fn set_meta_balance(&mut self, _balance: u64) {}

    /// Checks every structural invariant; returns a description of the first
    /// violation. Cheap enough for tests and fuzzing, not for every request.
    fn validate(&self) -> Result<(), String>;
}

/// One step of Marsaglia's xorshift64 (13, 7, 17), returning the new
/// state: the fixed pseudo-random sequences of tests and tools, which need
/// no crate for it. `x` must not start at zero (it would stay there).
#[doc(hidden)]
pub fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Builds a policy by its command-line name with a capacity in units.
pub fn by_name(name: &str, capacity: u64) -> Option<Box<dyn Policy>> {
    match name {
        "arc" => Some(Box::new(ZfsArc::new(ZfsArcConfig::fixed(capacity)))),
        "arc-paper" => Some(Box::new(PaperArc::new(capacity))),
        "lru" => Some(Box::new(Lru::new(capacity))),
        "s3fifo" => Some(Box::new(S3Fifo::new(capacity))),
        "2q" => Some(Box::new(TwoQ::new(capacity))),
        "sieve" => Some(Box::new(Sieve::new(capacity))),
        "arc-adaptive" => Some(Box::new(AdaptiveArc::new(ZfsArcConfig::fixed(capacity)))),
        _ => None,
    }
}

/// The names accepted by [`by_name`].
pub const POLICY_NAMES: &[&str] = &["arc", "arc-paper", "lru", "s3fifo", "2q", "sieve", "arc-adaptive"];

/// The policies a server can run: sizes in bytes, limits that move at run
/// time. The first is the default.
pub const SERVING_POLICIES: &[&str] = &["arc-adaptive", "arc", "lru"];

/// A policy for a server's ARC, by name: between `c_min` and `c_max`
/// bytes, prefetches kept `min_prefetch_ns`. `None` for a name that is not
/// in [`SERVING_POLICIES`].
pub fn serving(name: &str, c_min: u64, c_max: u64, min_prefetch_ns: u64) -> Option<Box<dyn Policy>> {
    let mut p: Box<dyn Policy> = match name {
        "arc" => Box::new(ZfsArc::new(ZfsArcConfig::growing(c_min, c_max))),
        "lru" => Box::new(Lru::new(c_max)),
        "arc-adaptive" => Box::new(AdaptiveArc::new(ZfsArcConfig::growing(c_min, c_max))),
        _ => return None,
    };
    p.set_min_prefetch_ns(min_prefetch_ns);
    Some(p)
}

#[cfg(test)]
mod serving_tests {
    use super::*;

    /// What the L2 feed asks of every serving policy: the next to leave,
    /// eviction end first, with their sizes and prefetch marks.
    #[test]
    fn every_serving_policy_walks_its_eviction_end() {
        for &name in SERVING_POLICIES {
            let mut p = serving(name, 1000, 1000, 0).unwrap();
            let mut ev = Vec::new();
            p.insert(1, 100, Access { now_ns: 1, prefetch: true }, &mut ev);
            p.insert(2, 200, Access::demand(2), &mut ev);
            p.insert(3, 300, Access::demand(3), &mut ev);
            let mut seen = Vec::new();
            for list in [ListKind::Mru, ListKind::Mfu] {
                p.scan_tail(list, u64::MAX, &mut |k, size, prefetch| {
                    seen.push((k, size, prefetch));
                    true
                });
            }
            assert_eq!(seen, vec![(1, 100, true), (2, 200, false), (3, 300, false)], "{name}");
            let mut first = Vec::new();
            p.scan_tail(ListKind::Mru, 150, &mut |k, _, _| {
                first.push(k);
                true
            });
            assert_eq!(first, vec![1, 2], "{name}: stops once 150 units are behind it");
            p.validate().unwrap();
        }
        assert!(serving("arc-paper", 1, 1, 0).is_none());
    }
}
