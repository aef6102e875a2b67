//! Counters under the names OpenZFS's arcstats uses, so ZFS users' scripts
//! and habits carry over. Fields that have no meaning here yet (metadata,
//! L2) are present and zero rather than missing.

use std::sync::atomic::Ordering::Relaxed;

use arc_policy::PolicyStats;
use serde::Serialize;

use crate::cache::{Counters, RECORD_OVERHEAD};

#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct ArcStats {
    pub hits: u64,
    pub iohits: u64,
    pub misses: u64,
    pub demand_data_hits: u64,
    pub demand_data_iohits: u64,
    pub demand_data_misses: u64,
    pub demand_metadata_hits: u64,
    pub demand_metadata_iohits: u64,
    pub demand_metadata_misses: u64,
    pub prefetch_data_hits: u64,
    pub prefetch_data_iohits: u64,
    pub prefetch_data_misses: u64,
    pub prefetch_metadata_hits: u64,
    pub prefetch_metadata_iohits: u64,
    pub prefetch_metadata_misses: u64,
    pub mru_hits: u64,
    pub mfu_hits: u64,
    pub mru_ghost_hits: u64,
    pub mfu_ghost_hits: u64,
    pub deleted: u64,
    pub evict_skip: u64,
    /// Records evicted from RAM (arcache's own counter).
    pub evicted: u64,
    /// Records dropped because a write, trim or zeroing made them stale.
    pub invalidated: u64,
    pub hash_elements: u64,
    pub pd: u64,
    pub c: u64,
    pub c_min: u64,
    pub c_max: u64,
    pub size: u64,
    pub data_size: u64,
    pub metadata_size: u64,
    pub hdr_size: u64,
    pub anon_size: u64,
    pub mru_size: u64,
    pub mfu_size: u64,
    pub mru_ghost_size: u64,
    pub mfu_ghost_size: u64,
    pub backing_reads: u64,
    pub backing_read_bytes: u64,
    pub backing_writes: u64,
    pub backing_write_bytes: u64,
    pub backing_errors: u64,
}

impl ArcStats {
    pub(crate) fn collect(p: &PolicyStats, c: &Counters, data_bytes: u64, entries: u64) -> ArcStats {
        let dh = c.demand_hits.load(Relaxed);
        let di = c.demand_iohits.load(Relaxed);
        let dm = c.demand_misses.load(Relaxed);
        let ph = c.prefetch_hits.load(Relaxed);
        let pi = c.prefetch_iohits.load(Relaxed);
        let pm = c.prefetch_misses.load(Relaxed);
        ArcStats {
            hits: dh + ph,
            iohits: di + pi,
            misses: dm + pm,
            demand_data_hits: dh,
            demand_data_iohits: di,
            demand_data_misses: dm,
            prefetch_data_hits: ph,
            prefetch_data_iohits: pi,
            prefetch_data_misses: pm,
            mru_hits: p.mru_hits,
            mfu_hits: p.mfu_hits,
            mru_ghost_hits: p.mru_ghost_hits,
            mfu_ghost_hits: p.mfu_ghost_hits,
            deleted: p.deleted,
            evict_skip: p.evict_skip,
            evicted: p.evicted,
            invalidated: c.invalidated.load(Relaxed),
            hash_elements: entries,
            pd: p.pd,
            c: p.c,
            c_min: p.c_min,
            c_max: p.c_max,
            size: p.size,
            data_size: data_bytes,
            hdr_size: entries * RECORD_OVERHEAD,
            mru_size: p.mru_size,
            mfu_size: p.mfu_size,
            mru_ghost_size: p.mru_ghost_size,
            mfu_ghost_size: p.mfu_ghost_size,
            backing_reads: c.backing_reads.load(Relaxed),
            backing_read_bytes: c.backing_read_bytes.load(Relaxed),
            backing_writes: c.backing_writes.load(Relaxed),
            backing_write_bytes: c.backing_write_bytes.load(Relaxed),
            backing_errors: c.backing_errors.load(Relaxed),
            ..Default::default()
        }
    }
}
