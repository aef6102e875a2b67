//! Rebuilding the index from a device's log at start, while clients are
//! served: walk the log blocks from the newest back, two chains read in
//! parallel, and restore every record whose newest entry is a valid copy.

use std::collections::HashSet;

use rustc_hash::FxHashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc;
use std::time::Instant;

use serde::Serialize;
use tracing::{info, warn};

use crate::format::{self, Entry, EntryKind, Header, LogBlock, LogPtr};
use crate::{BlobFlags, L2Arc, L2Device, L2Ptr, ALIGN, SECTOR};

/// Progress of one device's rebuild, for `arcache stat`.
#[derive(Debug, Default, Serialize)]
pub struct RebuildProgress {
    pub running: AtomicBool,
    pub log_blocks: AtomicU64,
    pub records: AtomicU64,
    pub millis: AtomicU64,
}

/// The persistence counters, under OpenZFS's arcstats names where they exist.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct PersistStats {
    pub l2_rebuild_success: u64,
    pub l2_rebuild_unsupported: u64,
    pub l2_rebuild_io_errors: u64,
    pub l2_rebuild_dh_errors: u64,
    pub l2_rebuild_cksum_lb_errors: u64,
    pub l2_rebuild_lowmem: u64,
    pub l2_rebuild_size: u64,
    pub l2_rebuild_asize: u64,
    pub l2_rebuild_bufs: u64,
    pub l2_rebuild_bufs_precached: u64,
    pub l2_rebuild_log_blks: u64,
    pub l2_rebuild_invalid_entries: u64,
    pub l2_rebuild_discarded_exports: u64,
    pub l2_rebuild_abandoned: u64,
    pub l2_contents_rebinds: u64,
    /// 1 while a rebuild runs.
    pub l2_rebuild_running: u64,
    /// Milliseconds the last rebuild took (all devices: the longest).
    pub l2_rebuild_ms: u64,
    pub l2_log_blk_writes: u64,
    pub l2_log_blk_avg_asize: u64,
    pub l2_log_blk_asize: u64,
    pub l2_log_blk_count: u64,
    pub l2_log_commits: u64,
    pub l2_header_writes: u64,
    /// Batch bytes fed whose log entries are not durable yet.
    pub l2_log_uncommitted_bytes: u64,
}

impl L2Arc {
    pub fn persist_stats(&self) -> PersistStats {
        let s = &self.stats;
        let (count, asize) = self.log_blocks();
        PersistStats {
            l2_rebuild_success: s.l2_rebuild_success.load(Relaxed),
            l2_rebuild_unsupported: s.l2_rebuild_unsupported.load(Relaxed),
            l2_rebuild_io_errors: s.l2_rebuild_io_errors.load(Relaxed),
            l2_rebuild_dh_errors: s.l2_rebuild_dh_errors.load(Relaxed),
            l2_rebuild_cksum_lb_errors: s.l2_rebuild_cksum_lb_errors.load(Relaxed),
            l2_rebuild_lowmem: s.l2_rebuild_lowmem.load(Relaxed),
            l2_rebuild_size: s.l2_rebuild_size.load(Relaxed),
            l2_rebuild_asize: s.l2_rebuild_asize.load(Relaxed),
            l2_rebuild_bufs: s.l2_rebuild_bufs.load(Relaxed),
            l2_rebuild_bufs_precached: s.l2_rebuild_bufs_precached.load(Relaxed),
            l2_rebuild_log_blks: s.l2_rebuild_log_blks.load(Relaxed),
            l2_rebuild_invalid_entries: s.l2_rebuild_invalid_entries.load(Relaxed),
            l2_rebuild_discarded_exports: s.l2_rebuild_discarded_exports.load(Relaxed),
            l2_rebuild_abandoned: s.l2_rebuild_abandoned.load(Relaxed),
            l2_contents_rebinds: s.l2_contents_rebinds.load(Relaxed),
            l2_rebuild_running: u64::from(self.is_rebuilding()),
            l2_rebuild_ms: self.progress.iter().map(|p| p.millis.load(Relaxed)).max().unwrap_or(0),
            l2_log_blk_writes: s.l2_log_blk_writes.load(Relaxed),
            l2_log_blk_avg_asize: s.l2_log_blk_avg_asize.load(Relaxed),
            l2_log_blk_asize: asize,
            l2_log_blk_count: count,
            l2_log_commits: s.l2_log_commits.load(Relaxed),
            l2_header_writes: s.l2_header_writes.load(Relaxed),
            l2_log_uncommitted_bytes: self.uncommitted_bytes(),
        }
    }
}

/// The records a rebuild has met, newest first, so that an older entry of
/// a record never replaces a newer one. A record restored from a newer
/// entry is in the index (or, if removed since, in `rebuild_killed`, which
/// every removal during a rebuild adds to), so only the records met and
/// *not* restored are kept here: invalidated, overwritten, invalid or
/// refused. Keeping every restored key here as well cost a quarter of the
/// rebuild in hashing and cache misses.
#[derive(Default)]
struct Seen {
    dead: FxHashSet<u64>,
    /// Keys of the block being restored, which the index does not show yet.
    block: FxHashSet<u64>,
}

/// Why a walk of the log ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WalkEnd {
    /// No older block: the start of the log, the part the hand overwrote,
    /// or the horizon of an earlier partial rebuild.
    Done,
    IoError(String),
    BadBlock(String),
}

/// Whether a pointer leads to a block a rebuild may read: inside the live
/// window, not below the horizon, well formed (docs/format.md).
pub fn pointer_ok(p: &LogPtr, h: &Header) -> bool {
    let floor = h.evict_lpos.saturating_sub(h.capacity);
    let asize = u64::from(p.asize);
    !p.is_none()
        && asize.is_multiple_of(ALIGN)
        && (ALIGN..=u64::from(format::MAX_LOG_ASIZE)).contains(&asize)
        && p.lpos.is_multiple_of(ALIGN)
        && p.lpos >= floor
        && p.lpos + asize <= h.evict_lpos
        && h.capacity > 0
        && p.lpos % h.capacity + asize <= h.capacity
        && p.seq >= h.horizon_seq.max(1)
        && p.seq < h.next_seq
}

/// Reads and checks the block `p` leads to.
pub fn read_block(dev: &L2Device, h: &Header, seed: u64, p: &LogPtr) -> Result<LogBlock, WalkEnd> {
    let bytes = dev
        .read_meta(h.start + p.lpos % h.capacity, p.asize as usize)
        .map_err(|e| WalkEnd::IoError(e.to_string()))?;
    let blk = LogBlock::decode(&bytes, p, seed)
        .map_err(|e| WalkEnd::BadBlock(format!("log block {}: {e}", p.seq)))?;
    if blk.seq != p.seq || blk.lpos != p.lpos {
        return Err(WalkEnd::BadBlock(format!(
            "log block {} names itself {} at {}",
            p.seq, blk.seq, blk.lpos
        )));
    }
    Ok(blk)
}

/// Walks the log newest first, reading the two chains on two threads, and
/// hands each block to `visit` in time order until it returns false or
/// the log ends; returns why it ended.
pub fn walk(
    dev: &L2Device,
    h: &Header,
    seed: u64,
    mut visit: impl FnMut(&LogPtr, LogBlock) -> bool,
) -> WalkEnd {
    if !pointer_ok(&h.newest[0], h) {
        return WalkEnd::Done;
    }
    std::thread::scope(|s| {
        let chain = |head: LogPtr| {
            let (tx, rx) = mpsc::sync_channel::<Result<(LogPtr, LogBlock), WalkEnd>>(2);
            s.spawn(move || {
                let mut p = head;
                while pointer_ok(&p, h) {
                    let r = read_block(dev, h, seed, &p);
                    let next = r.as_ref().ok().map(|b| b.prev);
                    if tx.send(r.map(|b| (p, b))).is_err() {
                        return;
                    }
                    match next {
                        Some(n) => p = n,
                        None => return,
                    }
                }
                let _ = tx.send(Err(WalkEnd::Done));
            });
            rx
        };
        let chains = [chain(h.newest[0]), chain(h.newest[1])];
        let mut expect = h.newest[0].seq;
        let mut turn = 0;
        loop {
            let got = chains[turn].recv().unwrap_or(Err(WalkEnd::Done));
            let (p, blk) = match got {
                Ok(x) => x,
                Err(e) => return e,
            };
            if p.seq != expect {
                // A chain skipped or repeated a block: the log is not what
                // was written, so stop rather than guess.
                return WalkEnd::BadBlock(format!("expected log block {expect}, found {}", p.seq));
            }
            if !visit(&p, blk) {
                return WalkEnd::Done;
            }
            if expect <= h.horizon_seq.max(1) {
                return WalkEnd::Done;
            }
            expect -= 1;
            turn ^= 1;
        }
    })
}

/// Whether a CACHED entry above the evict floor describes a copy that can
/// be there: inside the export, the device and before its own block.
/// The engine id the rebuild gives the file view's export (no volume has
/// one this large).
const VIEW: u64 = u64::MAX;

fn entry_ok(e: &Entry, blk: &LogBlock, h: &Header, records: u64) -> bool {
    let len = u64::from(e.blob_sectors) * SECTOR;
    e.kind == EntryKind::Cached
        && e.record < records
        && e.blob_sectors >= 1
        && u64::from(e.blob_sectors) * SECTOR <= crate::index::MAX_BLOB
        && e.lshift <= 8
        && e.lpos_or_count.is_multiple_of(SECTOR)
        && e.lpos_or_count + len <= blk.lpos
        && e.lpos_or_count % h.capacity + len <= h.capacity
}

fn flags_of(e: &Entry) -> BlobFlags {
    BlobFlags {
        raw: e.flags & format::EF_RAW != 0,
        compressed: e.flags & format::EF_COMPRESSED != 0,
        prefetch: e.flags & format::EF_PREFETCH != 0,
        mfu: e.flags & format::EF_MFU != 0,
        lshift: e.lshift,
    }
}

impl L2Arc {
    /// Rebuilds every device that has a log, each on its own thread; returns
    /// when all are done. `hdr_cap` bounds `l2_hdr_size` (`l2arc_meta_percent`);
    /// `in_arc` counts how many of the given keys are in the ARC already.
    pub fn rebuild(&self, hdr_cap: u64, in_arc: &(dyn Fn(&[u64]) -> u64 + Sync), stop: &AtomicBool) {
        std::thread::scope(|s| {
            for d in 0..self.devices.len() {
                if self.rebuilding[d].load(Relaxed) {
                    s.spawn(move || self.rebuild_device(d, hdr_cap, in_arc, stop));
                }
            }
        });
        self.meta.lock().rebuild_killed = HashSet::new();
    }

    fn rebuild_device(
        &self,
        d: usize,
        hdr_cap: u64,
        in_arc: &(dyn Fn(&[u64]) -> u64 + Sync),
        stop: &AtomicBool,
    ) {
        let dev = &self.devices[d];
        let Some((h, seed)) = self.persist[d].lock().as_ref().map(|p| (p.hdr.clone(), p.seed)) else {
            self.rebuilding[d].store(false, Relaxed);
            return;
        };
        let started = Instant::now();
        let progress = &self.progress[d];
        progress.running.store(true, Relaxed);
        info!("L2 device {}: rebuilding from log block {} back", dev.path, h.newest[0].seq);
        // Export tag -> (engine export id, record count) on this device.
        let view = self.view.as_ref().map(|m| (m.tags[d], VIEW, m.records));
        let exports: Vec<(u16, u64, u64)> = self
            .exports
            .iter()
            .enumerate()
            .filter_map(|(id, m)| m.as_ref().map(|m| (m.tags[d], id as u64, m.records)))
            .chain(view)
            .filter(|(tag, _, _)| *tag != 0)
            .collect();
        let mut seen = Seen::default();
        let mut restored_blocks: Vec<LogPtr> = Vec::new();
        let (mut bufs, mut lowmem) = (0u64, false);
        let mut last_report = Instant::now();
        let end = walk(dev, &h, seed, |p, blk| {
            if stop.load(Relaxed) {
                return false;
            }
            if last_report.elapsed().as_secs() >= 1 {
                last_report = Instant::now();
                info!(
                    "L2 device {}: rebuilding: {bufs} records from {} log blocks so far",
                    dev.path,
                    restored_blocks.len()
                );
            }
            if self.hdr_size() > hdr_cap {
                lowmem = true;
                return false;
            }
            if restored_blocks.is_empty() {
                self.reserve_for_rebuild(dev, &h, blk.entries.len(), &mut seen);
            }
            let n = self.restore_block(d, &h, &blk, &exports, &mut seen, in_arc);
            bufs += n;
            restored_blocks.push(*p);
            self.stats.l2_rebuild_log_blks.fetch_add(1, Relaxed);
            progress.log_blocks.fetch_add(1, Relaxed);
            progress.records.fetch_add(n, Relaxed);
            true
        });
        match &end {
            WalkEnd::Done => {}
            WalkEnd::IoError(e) => {
                self.stats.l2_rebuild_io_errors.fetch_add(1, Relaxed);
                warn!("L2 device {}: rebuild stopped by a read error: {e}", dev.path);
            }
            WalkEnd::BadBlock(e) => {
                self.stats.l2_rebuild_cksum_lb_errors.fetch_add(1, Relaxed);
                warn!("L2 device {}: rebuild stopped at a damaged log block: {e}", dev.path);
            }
        }
        if lowmem {
            self.stats.l2_rebuild_lowmem.fetch_add(1, Relaxed);
            warn!(
                "L2 device {}: rebuild stopped: l2_hdr_size reached l2arc_meta_percent of the ARC",
                dev.path
            );
        }
        self.finish_rebuild(d, restored_blocks);
        self.meta.lock().index.shrink_to_budget();
        let secs = started.elapsed().as_secs_f64();
        progress.millis.store((secs * 1000.0) as u64, Relaxed);
        progress.running.store(false, Relaxed);
        if bufs > 0 {
            self.stats.l2_rebuild_success.fetch_add(1, Relaxed);
        }
        info!(
            "L2 device {}: rebuild done: {bufs} records from {} log blocks in {secs:.2} s ({:.0} records/s)",
            dev.path,
            progress.log_blocks.load(Relaxed),
            bufs as f64 / secs.max(1e-9)
        );
    }

    /// Sizes the index and the set of seen records once for what the log
    /// holds (live blocks times the first block's entries, at most one
    /// record per sector of the device), instead of growing them step by
    /// step through the rebuild: the rehashing and page faults of growth
    /// were a fifth of its time.
    fn reserve_for_rebuild(&self, dev: &L2Device, h: &Header, per_block: usize, seen: &mut Seen) {
        let estimate = h.lb_count.saturating_mul(per_block as u64).min(dev.capacity() / SECTOR);
        let estimate = usize::try_from(estimate).unwrap_or(usize::MAX).min(1 << 32);
        seen.block.reserve(per_block);
        self.meta.lock().index.reserve(estimate);
    }

    /// Restores one block's entries, newest first; returns how many.
    fn restore_block(
        &self,
        d: usize,
        h: &Header,
        blk: &LogBlock,
        exports: &[(u16, u64, u64)],
        seen: &mut Seen,
        in_arc: &(dyn Fn(&[u64]) -> u64 + Sync),
    ) -> u64 {
        let mut wanted: Vec<(u64, &Entry)> = Vec::with_capacity(blk.entries.len());
        let mut invalid = 0;
        let floor = h.evict_lpos.saturating_sub(h.capacity);
        let dead = &mut seen.dead;
        seen.block.clear();
        for e in blk.entries.iter().rev() {
            let Some(&(_, id, records)) = exports.iter().find(|x| x.0 == e.tag) else {
                invalid += 1;
                continue;
            };
            let key = if id == VIEW {
                // A view's entries carry whole view keys.
                let kind = (e.record >> 60) & 7;
                if !arc_policy::key::view::is_view(e.record)
                    || kind > arc_policy::key::view::Kind::Data as u64
                {
                    invalid += 1;
                    continue;
                }
                e.record
            } else {
                (id << arc_policy::key::RECORD_BITS) | e.record.min(arc_policy::key::MAX_RECORD)
            };
            if e.kind == EntryKind::Invalidate {
                let count = e.lpos_or_count.min(records.saturating_sub(e.record)).min(1 << 16);
                for r in 0..count {
                    dead.insert(key + r);
                }
                continue;
            }
            if dead.contains(&key) || !seen.block.insert(key) {
                continue;
            }
            if e.lpos_or_count < floor {
                // Overwritten since: the normal fate of old entries.
                dead.insert(key);
            } else if entry_ok(e, blk, h, records) {
                wanted.push((key, e));
            } else {
                invalid += 1;
                dead.insert(key);
            }
        }
        self.stats.l2_rebuild_invalid_entries.fetch_add(invalid, Relaxed);
        // Back-to-back copies become one ring batch, as the feed made them.
        wanted.sort_unstable_by_key(|(_, e)| e.lpos_or_count);
        let dev = &self.devices[d];
        let mut restored = Vec::with_capacity(wanted.len());
        let mut m = self.meta.lock();
        wanted.retain(|(k, _)| {
            let take =
                m.index.get(*k).is_none() && !m.rebuild_killed.contains(k) && !m.writing.contains_key(k);
            if !take {
                dead.insert(*k);
            }
            take
        });
        let (mut lsize, mut asize) = (0u64, 0u64);
        let mut i = 0;
        while i < wanted.len() {
            let start = wanted[i].1.lpos_or_count;
            let mut end = start;
            let mut j = i;
            while j < wanted.len() && wanted[j].1.lpos_or_count == end {
                end += u64::from(wanted[j].1.blob_sectors) * SECTOR;
                j += 1;
            }
            let keys: Vec<u64> = wanted[i..j].iter().map(|(k, _)| *k).collect();
            if dev.register_restored(start, end - start, keys) {
                for &(key, e) in &wanted[i..j] {
                    let len = u64::from(e.blob_sectors) * SECTOR;
                    let ptr = L2Ptr::new(d, dev.addr(e.lpos_or_count), len, flags_of(e), e.cksum);
                    m.index.insert(key, ptr);
                    lsize += ptr.lsize();
                    asize += len;
                    restored.push(key);
                }
            } else {
                self.stats.l2_rebuild_invalid_entries.fetch_add((j - i) as u64, Relaxed);
                dead.extend(wanted[i..j].iter().map(|(k, _)| *k));
            }
            i = j;
        }
        m.size += lsize;
        m.asize += asize;
        drop(m);
        self.stats.l2_rebuild_size.fetch_add(lsize, Relaxed);
        self.stats.l2_rebuild_asize.fetch_add(asize, Relaxed);
        let n = restored.len() as u64;
        self.stats.l2_rebuild_bufs.fetch_add(n, Relaxed);
        self.stats.l2_rebuild_bufs_precached.fetch_add(in_arc(&restored), Relaxed);
        n
    }

    /// Records how far the rebuild got: log blocks older than the oldest
    /// restored one are never read again, since later writes of records
    /// they hold were not logged against them. Durable before the device
    /// counts as rebuilt.
    fn finish_rebuild(&self, d: usize, restored: Vec<LogPtr>) {
        let mut g = self.persist[d].lock();
        if let Some(p) = g.as_mut() {
            p.hdr.horizon_seq = restored.last().map_or(p.hdr.next_seq, |b| b.seq);
            // Blocks written during the rebuild (invalidations) are newer.
            let newer = std::mem::take(&mut p.live);
            p.live = restored.into_iter().rev().chain(newer).collect();
            if let Err(e) = self.write_header(d, p) {
                drop(g);
                warn!(
                    "L2 device {} taken out of service: its header cannot be written ({e})",
                    self.devices[d].path
                );
                self.rebuilding[d].store(false, Relaxed);
                self.retire(d);
                return;
            }
        }
        self.rebuilding[d].store(false, Relaxed);
    }
}
