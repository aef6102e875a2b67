//! How arc-adaptive picks its MRU target: miniature simulations.
//!
//! Ghost hits tell which list *lost* a block, not which split would have
//! *hit* most: on loops and skewed reads ARC's ghost rule pulls MRU up to
//! most of the cache and the frequent blocks go (measured on synthetic
//! loops and Zipf traces). So the choice is made by trying: a few copies
//! of the policy, each with its MRU target fixed at one fraction of the
//! cache, replay a hashed sample of the keys (SHARDS, as in
//! [`crate::mrc`]) in caches scaled by the sampling rate, and the real
//! cache takes the fraction whose copy hit most lately.
//!
//! The copies start with every key sampled and halve the rate whenever
//! one holds more than [`MAX_ENTRIES`] entries (SHARDS's fixed-size
//! variant), so they cost a bounded amount of memory whatever the cache
//! size: at most `FRACTIONS.len() * 2 * MAX_ENTRIES` entries, about 600 KB
//! (each copy's directory, resident and ghost, is at most twice its
//! resident entries). 1024 gives the same hit ratios as 4096 on the
//! reference suite (38.91 % against 38.90 % mean) for a quarter of it.

use crate::adaptive::AdaptiveArc;
use crate::mrc::spread;
use crate::zfs::ZfsArcConfig;
use crate::{Access, Key, Policy};

/// The MRU targets tried, as fractions of the cache. 0.1 is S3-FIFO's
/// small queue and the default until the copies know better; the others
/// span from almost pure frequency to almost pure recency.
pub(crate) const FRACTIONS: [f64; 5] = [0.01, 0.1, 0.3, 0.6, 0.95];
pub(crate) const DEFAULT: usize = 1;

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
}

impl Selector {
    pub(crate) fn new(c: u64, cfg: &ZfsArcConfig) -> Self {
        let copies = FRACTIONS
            .iter()
            .map(|&f| {
                let mut copy_cfg = ZfsArcConfig::fixed(c);
                copy_cfg.min_promote_ns = cfg.min_promote_ns;
                copy_cfg.min_prefetch_ns = cfg.min_prefetch_ns;
                AdaptiveArc::with_fixed_target(copy_cfg, f)
            })
            .collect();
        Selector {
            copies,
            hits: vec![0; FRACTIONS.len()],
            score: vec![0.0; FRACTIONS.len()],
            threshold: u64::MAX,
            rate: 1.0,
            seen: 0,
            best: DEFAULT,
            scratch: Vec::new(),
        }
    }

    /// The fraction of the cache MRU should get now.
    pub(crate) fn fraction(&self) -> f64 {
        FRACTIONS[self.best]
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
        for (copy, hits) in self.copies.iter_mut().zip(&mut self.hits) {
            if copy.lookup(key, access).is_hit() {
                *hits += 1;
            } else {
                copy.insert(key, size, access, &mut self.scratch);
            }
        }
        self.scratch.clear();
        self.seen += 1;
        let s = self.copies[DEFAULT].stats();
        if s.evicted < s.entries {
            // Until a copy has turned over once, all copies look alike or
            // the recency-heavy ones lead by warming up faster: a choice
            // made then stayed wrong for a whole window (-5.8 pp on
            // cloudphysics_io read-only at 52,500 blocks).
            self.hits.iter_mut().for_each(|h| *h = 0);
            self.seen = 0;
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

    fn decide(&mut self) {
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
