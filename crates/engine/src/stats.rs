//! Counters under the names OpenZFS's arcstats uses, so ZFS users' scripts
//! and habits carry over. Fields that have no meaning here yet are present
//! and zero rather than missing; metadata is counted from the file view's
//! records (`docs/fileview.md`).

use std::sync::atomic::Ordering::Relaxed;

use arc_policy::PolicyStats;
use serde::Serialize;

use arcache_l2::L2Arc;

use crate::cache::{Counters, RECORD_OVERHEAD};
use crate::zfetch::ZfetchStats;

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
    /// Metadata's target share of the ARC in 2^32 units (OpenZFS 2.2's
    /// `meta`).
    pub meta: u64,
    pub c: u64,
    pub c_min: u64,
    pub c_max: u64,
    pub size: u64,
    pub data_size: u64,
    pub metadata_size: u64,
    /// Metadata records' bytes and headers (the file view's attributes,
    /// listings, symlinks and xattrs).
    pub arc_meta_used: u64,
    /// The most `arc_meta_used` has been.
    pub arc_meta_max: u64,
    pub hdr_size: u64,
    /// RAM the file view's node and object tables hold, charged to the
    /// ARC: counted in `size` and `arc_meta_used`, and taken off the
    /// policy's ceiling (OpenZFS counts its dnodes the same way).
    pub dnode_size: u64,
    /// The object table is trimmed above this (`zfs_arc_dnode_limit`).
    pub arc_dnode_limit: u64,
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
    /// Buffers of evicted records kept for the next backing reads, in
    /// bytes, and how many reads' buffers were such (arcache's own).
    pub record_bufs_size: u64,
    pub record_bufs_reused: u64,
    pub compressed_size: u64,
    pub uncompressed_size: u64,
    pub evict_l2_cached: u64,
    pub evict_l2_eligible: u64,
    pub evict_l2_ineligible: u64,
    pub l2_ndev: u64,
    pub l2_ndev_healthy: u64,
    pub l2_hits: u64,
    pub l2_misses: u64,
    /// L2 hits served from half of a record's L2 copy, the record left out
    /// of RAM (arcache's own; counted in `l2_hits` too).
    pub l2_partial_reads: u64,
    pub l2_partial_read_bytes: u64,
    /// L2 hits whose device read was queued through io_uring and answered
    /// from the ring thread, no worker thread involved (arcache's own;
    /// counted in `l2_hits` too).
    pub l2_ring_reads: u64,
    /// Backing-store reads of one record done through io_uring and
    /// finished on the ring thread (arcache's own).
    pub backing_ring_reads: u64,
    pub l2_size: u64,
    pub l2_asize: u64,
    /// Records on L2 (arcache's own).
    pub l2_records: u64,
    pub l2_hdr_size: u64,
    pub l2_read_bytes: u64,
    pub l2_write_bytes: u64,
    /// Of `l2_write_bytes`, those written from the records in RAM without a copy.
    pub l2_write_bytes_in_place: u64,
    pub l2_writes_sent: u64,
    pub l2_writes_done: u64,
    pub l2_writes_error: u64,
    pub l2_cksum_bad: u64,
    pub l2_io_error: u64,
    pub l2_evict_reading: u64,
    pub l2_evict_hand: u64,
    pub l2_invalidated: u64,
    pub l2_feeds: u64,
    pub l2_abort_lowmem: u64,
    #[serde(flatten)]
    pub l2_persist: arcache_l2::PersistStats,
    pub l2_devices: Vec<L2DeviceStats>,
    pub demand_hit_predictive_prefetch: u64,
    pub zfetch_hits: u64,
    pub zfetch_future: u64,
    pub zfetch_stride: u64,
    pub zfetch_past: u64,
    pub zfetch_misses: u64,
    pub zfetch_max_streams: u64,
    pub zfetch_io_issued: u64,
    pub zfetch_io_active: u64,
}

/// One L2 device's figures.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct L2DeviceStats {
    pub path: String,
    pub state: &'static str,
    pub capacity: u64,
    pub hand: u64,
    pub wrapped: bool,
    pub reads: u64,
    pub read_bytes: u64,
    pub writes: u64,
    pub write_bytes: u64,
    pub io_errors: u64,
    pub cksum_bad: u64,
    pub evicted: u64,
    pub persistent: bool,
    pub rebuilding: bool,
}

impl ArcStats {
    pub(crate) fn collect(p: &PolicyStats, c: &Counters, data_bytes: u64, entries: u64) -> ArcStats {
        let dh = c.demand_hits.load(Relaxed);
        let di = c.demand_iohits.load(Relaxed);
        let dm = c.demand_misses.load(Relaxed);
        let ph = c.prefetch_hits.load(Relaxed);
        let pi = c.prefetch_iohits.load(Relaxed);
        let pm = c.prefetch_misses.load(Relaxed);
        let mh = c.demand_metadata_hits.load(Relaxed);
        let mm = c.demand_metadata_misses.load(Relaxed);
        let pmh = c.prefetch_metadata_hits.load(Relaxed);
        let pmm = c.prefetch_metadata_misses.load(Relaxed);
        ArcStats {
            hits: dh + ph + mh + pmh,
            iohits: di + pi,
            misses: dm + pm + mm + pmm,
            demand_metadata_hits: mh,
            demand_metadata_misses: mm,
            prefetch_metadata_hits: pmh,
            prefetch_metadata_misses: pmm,
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
            meta: p.meta,
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
            evict_l2_cached: c.evict_l2_cached.load(Relaxed),
            evict_l2_eligible: c.evict_l2_eligible.load(Relaxed),
            evict_l2_ineligible: c.evict_l2_ineligible.load(Relaxed),
            l2_hits: c.l2_hits.load(Relaxed),
            l2_misses: c.l2_misses.load(Relaxed),
            l2_partial_reads: c.l2_partial_reads.load(Relaxed),
            l2_partial_read_bytes: c.l2_partial_read_bytes.load(Relaxed),
            l2_ring_reads: c.l2_ring_reads.load(Relaxed),
            backing_ring_reads: c.backing_ring_reads.load(Relaxed),
            l2_abort_lowmem: c.l2_abort_lowmem.load(Relaxed),
            demand_hit_predictive_prefetch: p.demand_hit_prefetch,
            ..Default::default()
        }
    }

    /// The view's tables, `dnode` bytes: part of `size` and of
    /// `arc_meta_used`; `c_max` stays the `zfs_arc_max` set, though the
    /// policy's own ceiling is that less the tables.
    pub(crate) fn add_dnodes(&mut self, dnode: u64, limit: u64, (arc_min, arc_max): (u64, u64)) {
        self.dnode_size = dnode;
        self.arc_dnode_limit = limit;
        self.size += dnode;
        self.arc_meta_used += dnode;
        self.arc_meta_max = self.arc_meta_max.max(self.arc_meta_used);
        self.c_min = arc_min;
        self.c_max = arc_max;
    }

    pub(crate) fn add_zfetch(&mut self, z: &ZfetchStats) {
        self.zfetch_hits = z.hits.load(Relaxed);
        self.zfetch_future = z.future.load(Relaxed);
        self.zfetch_stride = z.stride.load(Relaxed);
        self.zfetch_past = z.past.load(Relaxed);
        self.zfetch_misses = z.misses.load(Relaxed);
        self.zfetch_max_streams = z.max_streams.load(Relaxed);
        self.zfetch_io_issued = z.io_issued.load(Relaxed);
        self.zfetch_io_active = z.io_active.load(Relaxed);
    }

    pub(crate) fn add_l2(&mut self, l2: &L2Arc) {
        let s = &l2.stats;
        let (records, size, asize) = l2.sizes();
        self.l2_ndev = l2.devices().len() as u64;
        self.l2_ndev_healthy = l2.healthy_devices() as u64;
        self.l2_records = records;
        self.l2_size = size;
        self.l2_asize = asize;
        self.l2_hdr_size = l2.hdr_size();
        self.l2_read_bytes = s.l2_read_bytes.load(Relaxed);
        self.l2_write_bytes = s.l2_write_bytes.load(Relaxed);
        self.l2_write_bytes_in_place = s.l2_write_bytes_in_place.load(Relaxed);
        self.l2_writes_sent = s.l2_writes_sent.load(Relaxed);
        self.l2_writes_done = s.l2_writes_done.load(Relaxed);
        self.l2_writes_error = s.l2_writes_error.load(Relaxed);
        self.l2_cksum_bad = s.l2_cksum_bad.load(Relaxed);
        self.l2_io_error = s.l2_io_error.load(Relaxed);
        self.l2_evict_reading = s.l2_evict_reading.load(Relaxed);
        self.l2_evict_hand = s.l2_evict_hand.load(Relaxed);
        self.l2_invalidated = s.l2_invalidated.load(Relaxed);
        self.l2_feeds = s.l2_feeds.load(Relaxed);
        self.l2_persist = l2.persist_stats();
        self.l2_devices = l2
            .devices()
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let ds = &d.stats;
                L2DeviceStats {
                    path: d.path.clone(),
                    state: if d.is_degraded() { "DEGRADED" } else { "ONLINE" },
                    capacity: d.capacity(),
                    hand: d.hand(),
                    wrapped: d.wrapped(),
                    reads: ds.reads.load(Relaxed),
                    read_bytes: ds.read_bytes.load(Relaxed),
                    writes: ds.writes.load(Relaxed),
                    write_bytes: ds.write_bytes.load(Relaxed),
                    io_errors: ds.io_errors.load(Relaxed),
                    cksum_bad: ds.cksum_bad.load(Relaxed),
                    evicted: ds.evicted.load(Relaxed),
                    persistent: l2.is_persistent(i),
                    rebuilding: l2.device_rebuilding(i),
                }
            })
            .collect();
    }
}
