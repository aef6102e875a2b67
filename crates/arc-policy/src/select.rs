//! How arc-adaptive decides: miniature simulations.
//!
//! Ghost hits tell which list *lost* a block, not which split would have
//! *hit* most: on loops and skewed reads ARC's ghost rule pulls MRU up to
//! most of the cache and the frequent blocks go (measured on synthetic
//! loops and Zipf traces). So the choice is made by trying: a few copies
//! of the policy, each run with one fixed [`Variant`] (an MRU target as a
//! fraction of the cache, and whether MFU takes in what MRU lets go), replay
//! a hashed sample of the keys (SHARDS, as in [`crate::mrc`]) in caches
//! scaled by the sampling rate, and the real cache runs the variant whose
//! copy hit most lately.
//!
//! Two clocks decide. Every sixteen turnovers of a copy the decayed
//! scores are compared (a 2 % lead needed); in between, a copy that has
//! beaten the current choice on enough of the requests where the two
//! disagreed (a sign test: a lead of at least [`EARLY_LEAD`] and
//! [`EARLY_SIGMAS`] standard deviations of a fair coin) takes over at
//! once. The long windows keep the cache from chasing bursts; the test
//! lets a clear change of workload (a hot set that jumped) be followed
//! within a few turnovers rather than sixteen.
//!
//! The copies start with every key sampled and halve the rate whenever
//! one holds more than [`MAX_ENTRIES`] entries (SHARDS's fixed-size
//! variant), so they cost a bounded amount of memory whatever the cache
//! size: at most `VARIANTS.len() * 2 * MAX_ENTRIES` entries, about 1.2 MB
//! (each copy's directory, resident and ghost, is at most twice its
//! resident entries). 1024 gives the same hit ratios as 4096 on the
//! reference suite (38.91 % against 38.90 % mean, with five copies) for a
//! quarter of it.

use crate::adaptive::AdaptiveArc;
use crate::mrc::spread;
use crate::zfs::ZfsArcConfig;
use crate::{Access, Key, Policy};

/// The MRU targets tried, as fractions of the cache. 0.1 is S3-FIFO's
/// small queue; the others span from almost pure frequency to almost pure
/// recency.
const FRACTIONS: [f64; 5] = [0.01, 0.1, 0.3, 0.6, 0.95];

/// One way to run the lists, tried by a copy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Variant {
    /// MRU's target as a fraction of the cache.
    pub(crate) fraction: f64,
    /// Whether a record leaving MRU unused (and not brought by a prefetch)
    /// moves to MFU (frequency 0) while MFU has room below its share,
    /// instead of becoming a ghost, and an MFU record's frequency is spent
    /// in one pass rather than one step a pass. Without it, a loop longer
    /// than the cache hits nothing (nothing it reads comes back before its
    /// ghost is gone);
    /// with it, MFU holds a part of the loop still, as S3-FIFO's main
    /// queue does, and hot keys that drift out of use leave MFU after one
    /// pass instead of three (synthetic.py's `drift`).
    pub(crate) fill_mfu: bool,
}

/// Every fraction, with and without `fill_mfu`.
pub(crate) const VARIANTS: [Variant; 10] = {
    let mut v = [Variant { fraction: 0.0, fill_mfu: false }; 10];
    let mut i = 0;
    while i < 10 {
        v[i] = Variant { fraction: FRACTIONS[i % 5], fill_mfu: i >= 5 };
        i += 1;
    }
    v
};

/// The variant run until the copies know better: a tenth of the cache for
/// MRU, ghosts for what it lets go (S3-FIFO's small queue). Starting with
/// `fill_mfu` costs the reference suite's small caches up to 2.6 pp
/// (systor17_sample at 491 blocks): what fills MFU first is what stays.
pub(crate) const DEFAULT: usize = 1;

/// A copy's lead over the current choice, in requests where exactly one of
/// the two hit, that lets it take over before the window ends: at least
/// this many...
const EARLY_LEAD: i64 = 64;
/// ...and this many standard deviations of the lead a fair coin would give
/// (`sqrt` of the disagreements; compared squared, in integers). Measured
/// on bench/policy.sh's suites with these ten variants: 4 and 5 alike (8 and 7 of the random family's
/// 120 points more than 1 pp below the better of LRU and textbook ARC,
/// against 16 with no early switch), the reference suite's mean 0.1 pp
/// lower at 4; with the five fractions alone, 4 chased bursts on
/// cloudphysics_io (-2.5 pp at 13,460 blocks). A halving of the sampling
/// rate leaves the counts as they are: they are counts of requests, which
/// a smaller sample only makes come slower.
const EARLY_SIGMAS: i64 = 5;

/// Resident entries one copy may hold before the sampling rate halves.
pub(crate) const MAX_ENTRIES: u64 = 1024;

pub(crate) struct Selector {
    copies: Vec<AdaptiveArc>,
    /// Hits of each copy in the current window, and a decayed score.
    hits: Vec<u64>,
    score: Vec<f64>,
    /// Keys whose hash is below this are sampled.
    threshold: u64,
    rate: f64,
    /// Sampled requests in the current window.
    seen: u64,
    best: usize,
    scratch: Vec<Key>,
    /// Per copy, since the last decision (when `hits` restarted too):
    /// requests where it and the current choice differed, one hitting. Its
    /// lead over the choice is the difference of their `hits`.
    disagree: [i64; VARIANTS.len()],
}

impl Selector {
    pub(crate) fn new(c: u64, cfg: &ZfsArcConfig) -> Self {
        let copies = VARIANTS
            .iter()
            .map(|&v| {
                let mut copy_cfg = ZfsArcConfig::fixed(c);
                copy_cfg.min_promote_ns = cfg.min_promote_ns;
                copy_cfg.min_prefetch_ns = cfg.min_prefetch_ns;
                AdaptiveArc::with_variant(copy_cfg, v)
            })
            .collect();
        Selector {
            copies,
            hits: vec![0; VARIANTS.len()],
            score: vec![0.0; VARIANTS.len()],
            threshold: u64::MAX,
            rate: 1.0,
            seen: 0,
            best: DEFAULT,
            scratch: Vec::new(),
            disagree: [0; VARIANTS.len()],
        }
    }

    /// The variant the real cache should run now.
    pub(crate) fn variant(&self) -> Variant {
        VARIANTS[self.best]
    }

    pub(crate) fn set_min_prefetch_ns(&mut self, ns: u64) {
        for c in &mut self.copies {
            c.set_min_prefetch_ns(ns);
        }
    }

    pub(crate) fn set_meta_balance(&mut self, balance: u64) {
        for c in &mut self.copies {
            c.set_meta_balance(balance);
        }
    }

    /// Follows the real cache's target `c`.
    pub(crate) fn resize(&mut self, c: u64) {
        let scaled = ((c as f64 * self.rate) as u64).max(1);
        for copy in &mut self.copies {
            copy.set_limits(scaled, scaled, &mut self.scratch);
        }
        self.scratch.clear();
    }

    /// One request for `key` of `size` bytes, replayed in every copy if
    /// the key is in the sample.
    pub(crate) fn feed(&mut self, key: Key, size: u64, access: Access, c: u64) {
        if self.threshold != u64::MAX && spread(key) >= self.threshold {
            return;
        }
        let mut hit = [false; VARIANTS.len()];
        for ((copy, hits), hit) in self.copies.iter_mut().zip(&mut self.hits).zip(&mut hit) {
            *hit = copy.lookup(key, access).is_hit();
            if *hit {
                *hits += 1;
            } else {
                copy.insert(key, size, access, &mut self.scratch);
            }
        }
        self.scratch.clear();
        self.count_disagreements(&hit);
        self.seen += 1;
        let s = self.copies[DEFAULT].stats();
        if s.evicted < s.entries {
            // Until a copy has turned over once, all copies look alike or
            // the recency-heavy ones lead by warming up faster: a choice
            // made then stayed wrong for a whole window (-5.8 pp on
            // cloudphysics_io read-only at 52,500 blocks).
            self.hits.iter_mut().for_each(|h| *h = 0);
            self.seen = 0;
            self.disagree = [0; VARIANTS.len()];
        } else if let Some(winner) = self.clear_winner() {
            self.take_early(winner);
        } else if self.seen >= (16 * s.entries).max(256) {
            // Windows of sixteen turnovers of a copy's contents: long
            // enough to see re-use at every distance the cache holds and
            // not to chase bursts (eight cost up to 2 pp on cloudphysics_io),
            // short enough to follow a change of workload.
            self.decide();
        }
        if self.copies.iter().any(|c| c.stats().entries > MAX_ENTRIES) {
            self.halve_rate(c);
        }
    }

    fn count_disagreements(&mut self, hit: &[bool; VARIANTS.len()]) {
        let current = hit[self.best];
        for (disagree, &h) in self.disagree.iter_mut().zip(hit) {
            *disagree += i64::from(h != current);
        }
    }

    /// The copy whose lead over the current choice no fair coin explains.
    fn clear_winner(&self) -> Option<usize> {
        let lead = |i: usize| self.hits[i] as i64 - self.hits[self.best] as i64;
        (0..VARIANTS.len())
            .filter(|&i| {
                let l = lead(i);
                l >= EARLY_LEAD && l * l >= EARLY_SIGMAS * EARLY_SIGMAS * self.disagree[i]
            })
            .max_by_key(|&i| (lead(i), std::cmp::Reverse(i)))
    }

    /// Switches to the clear winner and starts the scores afresh: the
    /// workload changed, so what the copies scored before says little.
    fn take_early(&mut self, winner: usize) {
        self.best = winner;
        for (s, h) in self.score.iter_mut().zip(&mut self.hits) {
            *s = std::mem::take(h) as f64;
        }
        self.seen = 0;
        self.disagree = [0; VARIANTS.len()];
    }

    fn decide(&mut self) {
        self.disagree = [0; VARIANTS.len()];
        for (s, h) in self.score.iter_mut().zip(&mut self.hits) {
            *s = *s / 2.0 + std::mem::take(h) as f64;
        }
        self.seen = 0;
        // Only a clear win moves the target: a copy must beat the current
        // one by 2 %, more than sampling noise, since every move costs the
        // real cache the contents the other list had built up.
        let current = self.score[self.best];
        let (i, top) =
            self.score
                .iter()
                .enumerate()
                .fold((self.best, current), |acc, (i, &s)| if s > acc.1 { (i, s) } else { acc });
        if top > current * 1.02 {
            self.best = i;
        }
    }

    fn halve_rate(&mut self, c: u64) {
        self.threshold = if self.threshold == u64::MAX { u64::MAX / 2 } else { self.threshold / 2 };
        self.rate /= 2.0;
        let threshold = self.threshold;
        for copy in &mut self.copies {
            copy.retain_keys(|k| spread(k) < threshold);
        }
        self.resize(c);
    }
}
