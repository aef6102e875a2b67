//! The L2 feed: a background thread that copies records about to be evicted
//! from RAM to the L2 devices, in batches at each device's write hand.
//!
//! How much it writes adapts instead of waiting for a user to find the right
//! module parameter (seed 000): each cycle's budget is the smallest of
//! - `l2arc_write_max` bytes per second per device (+ `l2arc_write_boost`
//!   until the device has wrapped), with one second of burst; 0, the
//!   default, sets no fixed rate,
//! - what the device absorbed per cycle in recent batches, halved while
//!   clients are reading from L2 (their reads keep priority),
//! - a wear allowance of `l2arc_dwpd_limit` drive-writes per day once the
//!   device has wrapped (only when L2 is at least twice `arc_max`, as in
//!   OpenZFS: a small L2 must turn over quickly to be of use).
//!
//! Cycles come every `l2arc_feed_secs`, or after `l2arc_feed_min_ms` when
//! the last one wrote anything (records are flowing through the ARC) or
//! when records eligible for L2 are being evicted before the feed saw them.
//!
//! Whether prefetched (streaming) records are fed follows, unless the user
//! set `l2arc_noprefetch` to 0 or 1, from seed 003's key ratio 2: the L2
//! devices' measured bandwidth over the backing store's.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arcache_l2::L2Arc;
use tracing::debug;

use crate::cache::{Cache, FeedRules, ScanMarks};

/// The largest batch written at once.
pub const MAX_BATCH: u64 = 8 << 20;

/// When a busy feed commits the L2 log: after this many batch bytes (at most
/// a quarter of the device) or `COMMIT_SECS`, and whenever it pauses. A
/// commit flushes the device's write cache, which costs in proportion to
/// what was written since: on the disk measured, committing every 8 MiB
/// batch halved the feed rate, every 64 MiB took a third off (fio, 8 MiB
/// O_DIRECT writes, `--fdatasync=8`: 325 MB/s, none: 648 MB/s). A crash
/// loses only the copies fed since the last commit; they are a cache.
pub const COMMIT_EVERY: u64 = 1 << 30;
pub const COMMIT_SECS: u64 = 5;

/// `l2arc_noprefetch=auto`.
pub const NOPREFETCH_AUTO: u8 = 2;

/// The feed's tunables, changeable while it runs.
#[derive(Debug)]
pub struct FeedTunables {
    pub write_max: AtomicU64,
    pub write_boost: AtomicU64,
    pub headroom: AtomicU64,
    pub feed_secs: AtomicU64,
    pub feed_min_ms: AtomicU64,
    pub feed_again: AtomicBool,
    pub noprefetch: AtomicU8,
    pub mfuonly: AtomicBool,
    pub trim_ahead: AtomicU64,
    pub dwpd_limit: AtomicU64,
    pub meta_percent: AtomicU64,
}

impl Default for FeedTunables {
    fn default() -> Self {
        FeedTunables {
            write_max: AtomicU64::new(0),
            write_boost: AtomicU64::new(0),
            headroom: AtomicU64::new(8),
            feed_secs: AtomicU64::new(1),
            feed_min_ms: AtomicU64::new(200),
            feed_again: AtomicBool::new(true),
            noprefetch: AtomicU8::new(NOPREFETCH_AUTO),
            mfuonly: AtomicBool::new(false),
            trim_ahead: AtomicU64::new(0),
            dwpd_limit: AtomicU64::new(100),
            meta_percent: AtomicU64::new(33),
        }
    }
}

/// What the feed measured and decided; reported by `arcache stat`.
#[derive(Debug, Default)]
pub struct FeedStats {
    pub cycles: AtomicU64,
    pub last_budget: AtomicU64,
    pub fed_bytes: AtomicU64,
    /// Bytes per second one batch write achieves, averaged.
    pub device_write_bw: AtomicU64,
    pub feeds_prefetch: AtomicBool,
    /// Records the feed examined in the ARC's lists (looked up, checked
    /// for a copy on L2), fed or not.
    pub examined: AtomicU64,
}

/// An exponentially weighted average, in whole units.
fn ewma(old: u64, sample: u64) -> u64 {
    if old == 0 {
        sample
    } else {
        (old * 3 + sample) / 4
    }
}

struct DeviceFeed {
    /// Bytes the wear bound still allows.
    tokens: f64,
    last_refill: Instant,
    /// Bytes `l2arc_write_max` still allows.
    rate_tokens: f64,
    last_cycle: Instant,
}

impl DeviceFeed {
    fn new(unbounded: bool) -> DeviceFeed {
        let start = if unbounded { f64::MAX } else { 0.0 };
        DeviceFeed {
            tokens: start,
            last_refill: Instant::now(),
            rate_tokens: f64::MAX,
            last_cycle: Instant::now(),
        }
    }
}

pub struct Feed {
    cache: Arc<Cache>,
    l2: Arc<L2Arc>,
    pub tunables: Arc<FeedTunables>,
    pub stats: Arc<FeedStats>,
    arc_max: Arc<AtomicU64>,
}

impl Feed {
    pub fn new(cache: Arc<Cache>, tunables: Arc<FeedTunables>, arc_max: Arc<AtomicU64>) -> Option<Feed> {
        let l2 = Arc::clone(cache.l2()?);
        Some(Feed { cache, l2, tunables, stats: Arc::new(FeedStats::default()), arc_max })
    }

    /// Runs the feed until `stop` is set; returns when it is.
    pub fn spawn(self, stop: Arc<AtomicBool>) -> arcache_sync::thread::JoinHandle<()> {
        arcache_sync::thread::Builder::new()
            .name("l2-feed".into())
            .spawn(move || self.run(&stop))
            .expect("spawn the L2 feed thread")
    }

    fn run(&self, stop: &AtomicBool) {
        let mut devs: Vec<DeviceFeed> = self.l2.devices().iter().map(|_| DeviceFeed::new(false)).collect();
        let mut last_l2_reads = 0;
        self.l2.set_commit_every(COMMIT_EVERY);
        let mut last_commit = Instant::now();
        while !stop.load(Relaxed) {
            let reads = self.l2.stats.l2_read_bytes.load(Relaxed);
            let busy = reads != last_l2_reads;
            last_l2_reads = reads;
            let cycle_start = Instant::now();
            let (wrote, budget) = self.cycle(&mut devs, busy);
            debug!(
                wrote_mb = wrote >> 20,
                budget_mb = budget >> 20,
                ms = cycle_start.elapsed().as_millis() as u64,
                "L2 feed cycle"
            );
            let t = &self.tunables;
            let min_pause = Duration::from_millis(t.feed_min_ms.load(Relaxed).max(10));
            // A cycle that used its whole budget stopped with more to feed:
            // the next one starts at once, its budget earned by the time
            // this one took.
            let more = wrote > 0 && wrote + MAX_BATCH >= budget;
            if !more || last_commit.elapsed() >= Duration::from_secs(COMMIT_SECS) {
                self.l2.commit_pending();
                last_commit = Instant::now();
            }
            if more {
                continue;
            }
            // Any write means records are flowing through the ARC; waiting
            // the long interval would let a stream turn it over unfed.
            let pause = if t.feed_again.load(Relaxed) && budget > 0 && wrote > 0 {
                min_pause
            } else {
                Duration::from_secs(t.feed_secs.load(Relaxed).max(1))
            };
            // Records evicted unfed are lost to L2: when that starts, the
            // next cycle comes after the short pause instead of the long one,
            // so a fast stream does not turn the ARC over between cycles.
            let missed_before = self.cache.evicted_l2_eligible();
            let started = Instant::now();
            while started.elapsed() < pause && !stop.load(Relaxed) {
                arcache_sync::thread::sleep(Duration::from_millis(5).min(min_pause));
                if started.elapsed() >= min_pause && self.cache.evicted_l2_eligible() != missed_before {
                    break;
                }
            }
        }
        self.l2.commit_pending();
    }

    /// One pass over every device; returns (bytes written, bytes budgeted).
    pub fn cycle_once(&self) -> (u64, u64) {
        let mut devs: Vec<DeviceFeed> = self.l2.devices().iter().map(|_| DeviceFeed::new(true)).collect();
        self.cycle(&mut devs, false)
    }

    fn include_prefetch(&self) -> bool {
        match self.tunables.noprefetch.load(Relaxed) {
            0 => true,
            1 => false,
            _ => {
                // Key ratio 2: feed streams only if L2 outruns the backing store.
                let l2_bw = self.stats.device_write_bw.load(Relaxed);
                let backing_bw = self.cache.backing_read_bandwidth();
                backing_bw == 0 || l2_bw == 0 || l2_bw > backing_bw
            }
        }
    }

    fn cycle(&self, devs: &mut [DeviceFeed], clients_reading_l2: bool) -> (u64, u64) {
        let t = &self.tunables;
        self.stats.cycles.fetch_add(1, Relaxed);
        self.l2.stats.l2_feeds.fetch_add(1, Relaxed);
        let include_prefetch = self.include_prefetch();
        self.stats.feeds_prefetch.store(include_prefetch, Relaxed);
        let total_capacity: u64 = self.l2.devices().iter().map(|d| d.capacity()).sum();
        let wear_applies = total_capacity >= 2 * self.arc_max.load(Relaxed);
        let (mut wrote, mut budgeted) = (0, 0);
        for (i, dev) in self.l2.devices().iter().enumerate() {
            if dev.is_degraded() || self.l2.device_rebuilding(i) {
                continue;
            }
            let meta_cap = self.cache.target() * t.meta_percent.load(Relaxed) / 100;
            if self.l2.hdr_size() > meta_cap {
                self.cache.note_l2_abort_lowmem();
                continue;
            }
            let d = &mut devs[i];
            let now = Instant::now();
            let rate =
                t.write_max.load(Relaxed) + if dev.wrapped() { 0 } else { t.write_boost.load(Relaxed) };
            let mut budget = u64::MAX;
            if rate > 0 {
                let dt = now.duration_since(d.last_cycle).as_secs_f64();
                d.rate_tokens = (d.rate_tokens.min(rate as f64) + rate as f64 * dt).min(rate as f64);
                budget = d.rate_tokens as u64;
            }
            let bw = self.stats.device_write_bw.load(Relaxed);
            // The device time this cycle may use: what passed since the last
            // cycle, at least one short pause, at most a second.
            let min_secs = t.feed_min_ms.load(Relaxed).max(10) as f64 / 1000.0;
            let secs = now.duration_since(d.last_cycle).as_secs_f64().clamp(min_secs, 1.0);
            if bw > 0 {
                let share = if clients_reading_l2 { 0.5 } else { 0.9 };
                budget = budget.min(((bw as f64 * secs * share) as u64).max(1 << 20));
            } else {
                // Nothing measured yet: a first batch small enough to time.
                budget = budget.min(16 << 20);
            }
            d.last_cycle = now;
            let dwpd = t.dwpd_limit.load(Relaxed);
            if dev.wrapped() && wear_applies && dwpd > 0 {
                let per_sec = dev.capacity() as f64 * dwpd as f64 / 100.0 / 86_400.0;
                let cap = per_sec.max(1.0) * 3600.0;
                d.tokens =
                    (d.tokens.min(cap) + per_sec * now.duration_since(d.last_refill).as_secs_f64()).min(cap);
                d.last_refill = now;
                budget = budget.min(d.tokens as u64);
            }
            if budget < 64 << 10 {
                continue;
            }
            budgeted += budget;
            let headroom = t.headroom.load(Relaxed);
            let trim = t.trim_ahead.load(Relaxed);
            // Only a trim distance is cleared beyond a batch: evicting more
            // would throw good copies away for nothing.
            let ahead = if trim > 0 { dev.capacity() * trim / 100 } else { 0 };
            let mut left = budget;
            let mut marks = ScanMarks::default();
            // Batches are bounded: a batch holds its write buffer and the
            // records it captured, which may already be evicted from RAM.
            while left >= 64 << 10 {
                let rules = FeedRules {
                    scan_bytes: if headroom == 0 { u64::MAX } else { budget.saturating_mul(headroom) },
                    // A batch must fit the device: on one smaller than two
                    // batches every batch failed and nothing was ever fed.
                    budget: left.min(MAX_BATCH).min(dev.capacity() / 2),
                    mfu_only: t.mfuonly.load(Relaxed),
                    include_prefetch,
                };
                let items = self.cache.feed_candidates(rules, &mut marks);
                self.stats.examined.fetch_add(std::mem::take(&mut marks.examined), Relaxed);
                if items.is_empty() {
                    break;
                }
                let started = Instant::now();
                match self.l2.write_batch(i, items, ahead, trim > 0) {
                    Ok(n) => {
                        let secs = started.elapsed().as_secs_f64().max(1e-6);
                        let prev = self.stats.device_write_bw.load(Relaxed);
                        self.stats.device_write_bw.store(ewma(prev, (n as f64 / secs) as u64), Relaxed);
                        if d.tokens != f64::MAX {
                            d.tokens = (d.tokens - n as f64).max(0.0);
                        }
                        if d.rate_tokens != f64::MAX {
                            d.rate_tokens = (d.rate_tokens - n as f64).max(0.0);
                        }
                        wrote += n;
                        left = left.saturating_sub(n);
                    }
                    Err(e) => {
                        debug!("L2 feed: {e}");
                        break;
                    }
                }
            }
        }
        self.stats.last_budget.store(budgeted, Relaxed);
        self.stats.fed_bytes.fetch_add(wrote, Relaxed);
        (wrote, budgeted)
    }
}
