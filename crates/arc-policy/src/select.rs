//! How arc-adaptive decides: miniature simulations.
//!
//! Ghost hits tell which list *lost* a block, not which split would have
//! *hit* most: on loops and skewed reads ARC's ghost rule pulls MRU up to
//! most of the cache and the frequent blocks go (measured on synthetic
//! loops and Zipf traces). So the choice is made by trying: a few copies
//! of the policy, each run with one fixed [`Variant`] (an MRU target as a
//! fraction of the cache, and whether MFU takes in what MRU lets go into
//! its room; or, [`Variant::RECENCY`], LRU in ARC's lists), replay
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
//! within a few turnovers rather than sixteen. Once the copies have
//! chosen, a switch to a larger MRU fraction needs half as much evidence
//! again ([`TOWARD_RECENCY`]): it costs the real cache what MFU held, which
//! a copy that never switched keeps. The first choice, if it is the
//! recency variant, needs half the evidence instead
//! ([`FIRST_TOWARD_RECENCY`]): a hot set that moves wants it soon.
//!
//! Evidence counts from half a turnover of the copies on, when only the
//! recency variant may win on it; at the whole turnover it restarts unless
//! that happened ([`Warmup`]). Until the copies choose, the cache runs the
//! default with MFU's frequencies spent in one pass ([`UNDECIDED`]).
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

/// What happens to a record that leaves MRU unused, and how often a
/// record re-used in MFU goes round again: the part of a [`Variant`] that
/// is not MRU's share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Discipline {
    /// ARC's own: a record leaving MRU unused becomes a ghost, and an MFU
    /// record goes round once more for each pass its re-use earned (up to
    /// three).
    Ghosts,
    /// As [`Discipline::Ghosts`], but an MFU record's passes are spent in
    /// one (it goes round once more at most). The cache runs it only
    /// before the copies have chosen ([`UNDECIDED`]).
    GhostsOnePass,
    /// A record leaving MRU unused (and not brought by a prefetch) moves
    /// to MFU (frequency 0) while MFU has room below its share, instead of
    /// becoming a ghost; passes are spent in one. Without it, a loop longer
    /// than the cache hits nothing (nothing it reads comes back before its
    /// ghost is gone); with it, MFU holds a part of the loop still, as
    /// S3-FIFO's main queue does, and hot keys that drift out of use leave
    /// MFU after one pass instead of three (synthetic.py's `drift`).
    FillMfu,
    /// The two lists run as one LRU split by re-use (see
    /// [`Variant::RECENCY`]): a record re-used moves from MRU to MFU's head
    /// at once, eviction takes whichever end was used least lately, and
    /// MFU's end gives no second chance, so no re-use earns a pass. MRU's
    /// share then sets only `p` (what arcstats report as `pd`, and MFU's
    /// share when young prefetches hold MRU's end: `mfu_spares`), not which
    /// list gives.
    Lru,
}

/// One way to run the lists, tried by a copy.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Variant {
    /// MRU's target as a fraction of the cache.
    pub(crate) fraction: f64,
    pub(crate) discipline: Discipline,
}

impl Variant {
    /// MRU at `fraction` of the cache, ghosts or MFU's room (`fill_mfu`)
    /// for what leaves it unused.
    pub(crate) const fn split(fraction: f64, fill_mfu: bool) -> Self {
        let discipline = if fill_mfu { Discipline::FillMfu } else { Discipline::Ghosts };
        Variant { fraction, discipline }
    }

    /// Whether what leaves MRU unused fills MFU's room
    /// ([`Discipline::FillMfu`]).
    pub(crate) fn fill_mfu(&self) -> bool {
        self.discipline == Discipline::FillMfu
    }

    /// Whether the lists run as one LRU ([`Discipline::Lru`]).
    pub(crate) fn lru(&self) -> bool {
        self.discipline == Discipline::Lru
    }

    /// Whether an MFU record's passes are spent in one: every discipline
    /// but ARC's own (under [`Discipline::Lru`] no MFU record goes round
    /// again anyway).
    pub(crate) fn one_pass(&self) -> bool {
        self.discipline != Discipline::Ghosts
    }

    /// LRU itself, with ARC's lists and names: MRU holds what was read
    /// once, MFU what was re-used, each in order of last use, and the
    /// cache evicts whichever end was used least lately. No other variant
    /// reaches LRU where a hot set moves: each makes a new hot record miss
    /// a second time (its ghost's hit) or keeps old frequent records a
    /// pass longer. Measured with examples/variants.rs, each variant held
    /// from the start: a drifting hot set of the random family (s13000 at
    /// 10,195 blocks) gives LRU 67.44 %, the best of the other variants
    /// 65.83 %, this one 67.44 % (bench/results/policy-variants.md).
    ///
    /// It was once a small MRU (1 %) passing every record into MFU's head
    /// when it left, re-used or not. That is LRU only while MRU stays
    /// small: while a cache fills, MRU holds everything, in order of
    /// insert, and draining it into MFU's head put records read once long
    /// ago ahead of a loop's blocks read since. A hot set beside a loop
    /// that nearly fits the cache (synthetic.py's fresh2 `jump_loop` at
    /// 29,000-31,000 blocks) gave LRU 84.71 % at every size and this
    /// variant 84.35, 83.75 and 82.92 % (less with a larger cache); now
    /// 84.71 at each (a hand run of the variant held).
    pub(crate) const RECENCY: Variant = Variant { fraction: 0.01, discipline: Discipline::Lru };

    /// How far toward pure recency the variant runs: its MRU share, or
    /// all of the cache for [`Variant::RECENCY`], which is LRU.
    pub(crate) fn recency(&self) -> f64 {
        if self.lru() {
            1.0
        } else {
            self.fraction
        }
    }
}

/// Every fraction without `fill_mfu`, every one but 95 % with it, and
/// [`Variant::RECENCY`]. 95 % with `fill_mfu` was dropped for it: with
/// MFU's share at 5 % there is little room to fill, and held from the start
/// it hit within 0.25 pp of 95 % without at every point looked at (four
/// of the random family's worst), so its copy cost as much as another and
/// told nothing new.
pub(crate) const VARIANTS: [Variant; 10] = {
    let mut v = [Variant::RECENCY; 10];
    let mut i = 0;
    while i < 9 {
        v[i] = Variant::split(FRACTIONS[i % 5], i >= 5);
        i += 1;
    }
    v
};

/// The variant run until the copies know better (as [`UNDECIDED`]): a
/// tenth of the cache for MRU, ghosts for what it lets go (S3-FIFO's small
/// queue). Starting with
/// `fill_mfu` costs the reference suite's small caches up to 2.6 pp
/// (systor17_sample at 491 blocks): what fills MFU first is what stays.
pub(crate) const DEFAULT: usize = 1;

/// What the cache runs until the copies choose: the default's MRU share
/// and ghosts, with MFU's frequencies spent in one pass. Records that were
/// hot only while the cache warmed up (a hot set sliding a block at a
/// time) then leave after one more pass instead of three, while the
/// copies, which judge the default with its three passes, still find a
/// workload that wants them. Measured with examples/tune.rs against the
/// default run as is: synthetic.py's `drift` at 4,000, 10,000 and 25,000
/// blocks from 1.1-1.3 pp below the better of LRU and textbook ARC to
/// within 1 pp; the reference suite's mean 0.08 pp lower, with [`Warmup`]
/// (P3 at 25,587 blocks -1.16 pp, P12 at 40,159 -0.90, P2 at 30,077
/// -0.69; P6 at 10,190 and 25,475 and w106 at 13,758 up by 0.4-0.6:
/// bench/results/policy.md against its history). Run as the copies'
/// variant 1 from the start, one pass cost P3 at 25,587 blocks 2.75 pp.
pub(crate) const UNDECIDED: Variant = Variant { discipline: Discipline::GhostsOnePass, ..VARIANTS[DEFAULT] };

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

/// Once the copies have chosen, a switch to a larger MRU fraction needs
/// this much more of both (as numerator and denominator: 3/2). Such a
/// switch shrinks MFU, and what MFU held may not come back: a block read
/// often at distances beyond the ghosts' reach re-enters MFU only through
/// a tiny MRU. Seen on P6 at 10,190 blocks: a burst carried the choice
/// from 1 % to 95 % of the cache, and long after the switch back the cache
/// hit far less than the copy that never switched (a replay with the hit
/// ratio printed every 20,000 requests, by hand). The first choice is not
/// held back: the variant run before it was nobody's choice, and a hot
/// set that moves wants recency soon. Measured (bench/results/policy.md
/// and its history): the reference suite's mean 0.2 pp higher; on the
/// random families of seeds 5000 and 9000 onwards as many points more
/// than 1 pp below LRU and textbook ARC's better as without, though the
/// worst of them, s9004 at 25,952 blocks (a loop beside hot sets that
/// jump), fell from -3.86 to -4.55 pp (examples/tune.rs, run without).
const TOWARD_RECENCY: (i64, i64) = (3, 2);

/// The first choice, when it is [`Variant::RECENCY`], needs half the
/// evidence of [`EARLY_LEAD`] and [`EARLY_SIGMAS`] (as numerator and
/// denominator), once the variant run has [`EARLY_LEAD`] hits counted (a
/// lead on a few dozen hits right after the copies' first turnover was a
/// burst as often as a trend). A hot set that drifts or jumps wants LRU's
/// equal from its first turnover on, and the default, which holds by
/// frequency, costs it every request until the copies choose. The
/// drifting Zipf set of adaptive.rs's tests (5,000 keys in 3,000 blocks):
/// 0.93 pp below LRU before, 0.56 with it (0.24 since [`Warmup`] and
/// [`UNDECIDED`]). Not for 60 % or 95 % MRU,
/// though they too follow such sets: a first choice of them on half the
/// evidence once cost cloudphysics_io read-only at 52,500 blocks 7.7 pp
/// (a switch from 95 % MRU to 1 % with `fill_mfu` filled MFU with what
/// MRU had held, where the loop that variant keeps should have gone).
/// Measured with examples/tune.rs: bench/results/policy.md.
const FIRST_TOWARD_RECENCY: (i64, i64) = (1, 2);

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
    /// Whether the copies have chosen yet (an early switch, or a window's
    /// decision), which makes [`TOWARD_RECENCY`] apply.
    chosen: bool,
    /// Whether the default's copy has turned over once (evicted as many
    /// entries as it holds): see [`Warmup`].
    turned: bool,
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
            chosen: false,
            turned: false,
        }
    }

    /// Whether the copy of the default variant holds `key` (tests).
    #[cfg(test)]
    pub(crate) fn copy_holds(&self, key: Key) -> bool {
        self.copies[DEFAULT].contains(key)
    }

    /// The most resident entries any copy holds (tests).
    #[cfg(test)]
    pub(crate) fn largest_copy(&self) -> u64 {
        self.copies.iter().map(|c| c.stats().entries).max().unwrap_or(0)
    }

    /// The requests a copy has counted (looked up), stores not among them.
    #[cfg(test)]
    pub(crate) fn copy_lookups(&self) -> u64 {
        let s = self.copies[DEFAULT].stats();
        s.hits + s.misses
    }

    /// The variant the real cache should run now.
    pub(crate) fn variant(&self) -> Variant {
        if self.chosen {
            VARIANTS[self.best]
        } else {
            UNDECIDED
        }
    }

    /// The index in [`VARIANTS`] of the variant the real cache runs now
    /// ([`DEFAULT`] until the copies choose, run as [`UNDECIDED`]).
    pub(crate) fn chosen_index(&self) -> usize {
        self.best
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
        if !self.samples(key) {
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
        let warmup = Warmup::of(s.evicted, s.entries, self.turned);
        match warmup {
            Warmup::Cold => self.restart_evidence(),
            Warmup::Turned => {
                self.turned = true;
                if !self.chosen {
                    self.restart_evidence();
                }
            }
            Warmup::Half | Warmup::Warm => {
                if let Some(winner) = early_choice(&self.hits, &self.disagree, self.best, self.chosen, warmup)
                {
                    self.take_early(winner);
                } else if warmup == Warmup::Warm && self.seen >= (16 * s.entries).max(256) {
                    // Windows of sixteen turnovers of a copy's contents: long
                    // enough to see re-use at every distance the cache holds and
                    // not to chase bursts (eight cost up to 2 pp on cloudphysics_io),
                    // short enough to follow a change of workload.
                    self.decide();
                }
            }
        }
        self.bound_copies(c);
    }

    fn restart_evidence(&mut self) {
        self.hits.iter_mut().for_each(|h| *h = 0);
        self.seen = 0;
        self.disagree = [0; VARIANTS.len()];
    }

    /// A store of `key` with no lookup before it (a client's write, a
    /// prefetch), made in every copy if the key is in the sample: it takes
    /// room there as in the cache, and counts for no variant. Stores alone
    /// (a disk being filled) must not grow the copies past their bound.
    pub(crate) fn store(&mut self, key: Key, size: u64, access: Access, c: u64) {
        if !self.samples(key) {
            return;
        }
        for copy in &mut self.copies {
            copy.insert(key, size, access, &mut self.scratch);
        }
        self.scratch.clear();
        self.bound_copies(c);
    }

    /// `key` dropped from the cache (trimmed, zeroed, written in part while
    /// not in RAM): dropped from every copy too.
    pub(crate) fn remove(&mut self, key: Key) {
        if self.samples(key) {
            for copy in &mut self.copies {
                copy.remove(key);
            }
        }
    }

    fn samples(&self, key: Key) -> bool {
        self.threshold == u64::MAX || spread(key) < self.threshold
    }

    fn bound_copies(&mut self, c: u64) {
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

    /// Switches to the clear winner and starts the scores afresh: the
    /// workload changed, so what the copies scored before says little.
    fn take_early(&mut self, winner: usize) {
        self.best = winner;
        self.chosen = true;
        for (s, h) in self.score.iter_mut().zip(&mut self.hits) {
            *s = std::mem::take(h) as f64;
        }
        self.seen = 0;
        self.disagree = [0; VARIANTS.len()];
    }

    fn decide(&mut self) {
        self.chosen = true;
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

/// Where the copies are in their first turnover, which decides what their
/// evidence may do (the default's copy stands for all: they see the same
/// keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Warmup {
    /// Less than half a turnover: no evidence kept. Until then all copies
    /// look alike or the recency-heavy ones lead by warming up faster: a
    /// choice made then stayed wrong for a whole window (-5.8 pp on
    /// cloudphysics_io read-only at 52,500 blocks).
    Cold,
    /// From half a turnover to a whole one: evidence counts, but only the
    /// recency variant may win on it. A hot set that jumped once the cache
    /// was full wants it then, not a turnover later (synthetic.py's
    /// `shifting` at 20,000 blocks: 1.18 pp below LRU before, 0.46 now);
    /// any other variant chosen that early chased the warm-up (s29038 at
    /// 20,162 blocks, -5.65 pp, examples/tune.rs).
    Half,
    /// The request that completes the first turnover: the evidence restarts
    /// unless the recency variant was chosen (nothing else can have been:
    /// a window's decision waits for `Warm` too), so every other first choice
    /// is judged on what it was judged on before half-turnovers counted
    /// (cloudphysics_io at 13,460 blocks fell to 1.24 pp below when it was
    /// not).
    Turned,
    /// Past it.
    Warm,
}

impl Warmup {
    fn of(evicted: u64, entries: u64, turned: bool) -> Self {
        if turned {
            Warmup::Warm
        } else if evicted >= entries {
            Warmup::Turned
        } else if evicted * 2 >= entries {
            Warmup::Half
        } else {
            Warmup::Cold
        }
    }
}

/// [`early_winner`], if `warmup` lets it win: before the first turnover
/// is complete, only the recency variant may (a variant further ahead
/// keeps it waiting too: as measured).
fn early_choice(hits: &[u64], disagree: &[i64], best: usize, chosen: bool, warmup: Warmup) -> Option<usize> {
    early_winner(hits, disagree, best, chosen)
        .filter(|&w| warmup == Warmup::Warm || VARIANTS[w] == Variant::RECENCY)
}

/// The copy whose lead over the current choice `best` no fair coin
/// explains, given each copy's `hits` and its `disagree`ments with `best`
/// since the last decision; `chosen`: whether the copies have chosen yet.
fn early_winner(hits: &[u64], disagree: &[i64], best: usize, chosen: bool) -> Option<usize> {
    let lead = |i: usize| hits[i] as i64 - hits[best] as i64;
    let eager = !chosen && hits[best] >= EARLY_LEAD as u64;
    let clear = |i: usize| {
        let (num, den) = if chosen && VARIANTS[i].recency() > VARIANTS[best].recency() {
            TOWARD_RECENCY
        } else if eager && VARIANTS[i] == Variant::RECENCY {
            FIRST_TOWARD_RECENCY
        } else {
            (1, 1)
        };
        let l = lead(i) * den;
        l >= EARLY_LEAD * num && l * l >= (EARLY_SIGMAS * num).pow(2) * disagree[i]
    };
    (0..VARIANTS.len()).filter(|&i| clear(i)).max_by_key(|&i| (lead(i), std::cmp::Reverse(i)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every copy at `base` hits but copy `i`, ahead of `best` by `lead`
    /// hits in `disagree` requests where the two differed.
    fn ahead(base: u64, best: usize, i: usize, lead: u64, disagree: i64, chosen: bool) -> Option<usize> {
        let mut hits = [base; VARIANTS.len()];
        hits[i] += lead;
        let mut d = [0i64; VARIANTS.len()];
        d[i] = disagree;
        early_winner(&hits, &d, best, chosen)
    }

    fn one_ahead(best: usize, i: usize, lead: u64, disagree: i64, chosen: bool) -> Option<usize> {
        ahead(1000, best, i, lead, disagree, chosen)
    }

    #[test]
    fn a_clear_lead_wins_and_a_coin_toss_does_not() {
        // 1 % of the cache for MRU, then 10 %: toward recency, first choice.
        assert_eq!(one_ahead(0, 1, 64, 160, false), Some(1));
        assert_eq!(one_ahead(0, 1, 63, 100, false), None, "below the least lead");
        assert_eq!(one_ahead(0, 1, 64, 170, false), None, "within five sigmas of a coin");
    }

    #[test]
    fn after_a_choice_a_move_toward_recency_needs_half_as_much_again() {
        // Toward recency: 64 and 80 (five sigmas of 256) no longer do.
        assert_eq!(one_ahead(0, 3, 64, 160, true), None);
        assert_eq!(one_ahead(0, 3, 95, 160, true), None);
        assert_eq!(one_ahead(0, 3, 96, 160, true), Some(3));
        assert_eq!(one_ahead(0, 3, 120, 256, true), Some(3));
        assert_eq!(one_ahead(0, 3, 119, 256, true), None);
        // Toward frequency, or the same fraction with fill_mfu: as before.
        assert_eq!(one_ahead(3, 0, 64, 160, true), Some(0));
        assert_eq!(one_ahead(1, 6, 64, 160, true), Some(6));
        // The recency variant is the most recency of all, whatever its MRU
        // share: a move to it is held back, a move from it is not.
        assert_eq!(VARIANTS[9], Variant::RECENCY);
        assert_eq!(one_ahead(4, 9, 64, 160, true), None);
        assert_eq!(one_ahead(4, 9, 96, 160, true), Some(9));
        assert_eq!(one_ahead(9, 4, 64, 160, true), Some(4));
    }

    /// No choice made yet: the default at `base` hits.
    fn first_ahead(base: u64, i: usize, lead: u64, disagree: i64) -> Option<usize> {
        ahead(base, DEFAULT, i, lead, disagree, false)
    }

    #[test]
    fn a_first_choice_of_the_recency_variant_needs_half_the_evidence() {
        // A lead of 32 with 2.5 sigmas does, once the default has 64 hits.
        assert_eq!(first_ahead(64, 9, 32, 160), Some(9));
        assert_eq!(first_ahead(64, 9, 31, 100), None, "below half the least lead");
        assert_eq!(first_ahead(64, 9, 32, 170), None, "within 2.5 sigmas of a coin");
        assert_eq!(first_ahead(63, 9, 32, 160), None, "on too few hits");
        // Any other variant, 95 % MRU too: the whole evidence.
        for i in [0, 2, 3, 4, 5, 6, 7, 8] {
            assert_eq!(first_ahead(64, i, 63, 100), None, "variant {i}");
            assert_eq!(first_ahead(64, i, 64, 160), Some(i), "variant {i}");
        }
        // After a choice, as before (half as much again toward recency).
        assert_eq!(ahead(64, DEFAULT, 9, 64, 160, true), None);
    }

    #[test]
    fn evidence_counts_from_half_a_turnover_and_restarts_at_a_whole_one() {
        assert_eq!(Warmup::of(0, 100, false), Warmup::Cold);
        assert_eq!(Warmup::of(49, 100, false), Warmup::Cold);
        assert_eq!(Warmup::of(50, 100, false), Warmup::Half);
        assert_eq!(Warmup::of(99, 100, false), Warmup::Half);
        assert_eq!(Warmup::of(100, 100, false), Warmup::Turned);
        assert_eq!(Warmup::of(0, 100, true), Warmup::Warm, "once turned, always warm");
    }

    #[test]
    fn before_a_whole_turnover_only_the_recency_variant_wins_early() {
        let mut hits = [1000u64; VARIANTS.len()];
        let mut d = [0i64; VARIANTS.len()];
        // The recency variant clearly ahead of the default, 30 % MRU a
        // little less but clearly too.
        hits[9] += 80;
        d[9] = 160;
        hits[2] += 70;
        d[2] = 160;
        let choice = |hits: &[u64], w| early_choice(hits, &d, DEFAULT, false, w);
        assert_eq!(choice(&hits, Warmup::Half), Some(9));
        assert_eq!(choice(&hits, Warmup::Warm), Some(9));
        // 30 % MRU ahead the most: it waits for the whole turnover, and so
        // does the recency variant behind it.
        hits[2] += 20;
        assert_eq!(choice(&hits, Warmup::Half), None);
        assert_eq!(choice(&hits, Warmup::Warm), Some(2));
        hits[9] = 1000;
        assert_eq!(choice(&hits, Warmup::Half), None);
        assert_eq!(choice(&hits, Warmup::Warm), Some(2));
    }

    #[test]
    fn the_cache_spends_frequencies_in_one_pass_until_the_copies_choose() {
        assert!(UNDECIDED.one_pass() && !VARIANTS[DEFAULT].one_pass());
        assert_eq!(Variant { discipline: Discipline::Ghosts, ..UNDECIDED }, VARIANTS[DEFAULT]);
        // The copies try every discipline but the undecided cache's.
        assert!(VARIANTS.iter().all(|v| v.discipline != Discipline::GhostsOnePass));
        for d in [Discipline::Ghosts, Discipline::FillMfu, Discipline::Lru] {
            assert!(VARIANTS.iter().any(|v| v.discipline == d), "no copy tries {d:?}");
        }
        // What a selector hands the cache: UNDECIDED, then what was chosen,
        // the default too.
        let mut sel = Selector::new(1000, &ZfsArcConfig::fixed(1000));
        assert_eq!((sel.variant(), sel.chosen_index()), (UNDECIDED, DEFAULT));
        sel.decide();
        assert_eq!((sel.variant(), sel.chosen_index()), (VARIANTS[DEFAULT], DEFAULT));
        sel.take_early(9);
        assert_eq!(sel.variant(), Variant::RECENCY);
    }

    /// A loop of 900 keys in a cache of 1,000, every hundredth request a
    /// key read once: the copies turn over slowly, so half a turnover comes
    /// long before a whole one, and a window's worth of requests passes in
    /// between. No window decides there: evidence from half a turnover is
    /// for the recency variant's early choice alone.
    #[test]
    fn a_window_waits_for_the_whole_turnover() {
        let c = 1000;
        let mut sel = Selector::new(c, &ZfsArcConfig::fixed(c));
        let mut half_since = None;
        for i in 0..100_000u64 {
            let key = if i % 100 == 99 { 1_000_000 + i } else { i % 900 };
            sel.feed(key, 1, Access::demand(i * 1_000_000), c);
            let s = sel.copies[DEFAULT].stats();
            if half_since.is_none() && Warmup::of(s.evicted, s.entries, sel.turned) == Warmup::Half {
                half_since = Some(i);
            }
        }
        assert!(!sel.chosen || VARIANTS[sel.best] == Variant::RECENCY, "chosen {}", sel.best);
        // The schedule reached what it is for: still within the first
        // turnover, more than a window's requests after half of it.
        let s = sel.copies[DEFAULT].stats();
        assert_eq!(Warmup::of(s.evicted, s.entries, sel.turned), Warmup::Half, "{s:?}");
        let in_half = 100_000 - half_since.unwrap_or(100_000);
        assert!(in_half >= 16 * s.entries, "{in_half} requests in the half turnover, {s:?}");
    }
}
