//! Miss-ratio curves in one pass over a trace.
//!
//! - LRU: exact, from reuse (stack) distances (Mattson et al. 1970): the
//!   number of distinct blocks touched since a block's previous access,
//!   counted with a Fenwick tree over access times. A cache of C blocks
//!   hits exactly the accesses whose distance is below C, so one pass gives
//!   every size.
//! - Any other policy: spatially hashed sampling (SHARDS, Waldspurger et
//!   al., FAST'15) with one miniature simulation per size, all fed in the
//!   same pass: blocks whose hash falls below a rate R are kept, and a
//!   cache of C*R blocks simulated on them stands for a cache of C. R is
//!   chosen per size so every miniature cache holds at least `min_blocks`
//!   blocks; small sizes are simulated in full.

use rustc_hash::FxHashMap;

use crate::replay::{step, BlockAccess};
use crate::{by_name, Policy};

/// One point of a miss-ratio curve.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MrcPoint {
    pub cache_blocks: u64,
    pub hit_ratio: f64,
}

struct Fenwick {
    tree: Vec<i64>,
}

impl Fenwick {
    fn new(n: usize) -> Self {
        Fenwick { tree: vec![0; n + 1] }
    }
    fn add(&mut self, i: usize, v: i64) {
        let mut i = i + 1;
        while i < self.tree.len() {
            self.tree[i] += v;
            i += i & i.wrapping_neg();
        }
    }
    /// Sum of positions `0..i`.
    fn prefix(&self, i: usize) -> i64 {
        let mut i = i;
        let mut s = 0;
        while i > 0 {
            s += self.tree[i];
            i -= i & i.wrapping_neg();
        }
        s
    }
}

/// Exact LRU hit ratios for every size in `sizes`.
pub fn lru_mrc(accesses: &[BlockAccess], sizes: &[u64]) -> Vec<MrcPoint> {
    lru_mrc_counting(accesses, |_| Counted::Yes, sizes)
}

/// How [`lru_mrc_counting`] takes an access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counted {
    /// A hit or a miss, and its block the most recent.
    Yes,
    /// Its block the most recent, not counted (a write storing it).
    No,
    /// Its block out of the cache, not counted (a removal).
    Gone,
}

/// [`lru_mrc`] counting only the accesses `counted(i)` says (reads, where
/// writes store their blocks without counting as hits or misses, and
/// removals take them out). Exact without removals; a removal leaves a
/// real LRU cache a slot free until its next insert, which no stack of
/// recency describes, so with them it is near, not exact.
pub fn lru_mrc_counting(
    accesses: &[BlockAccess],
    counted: impl Fn(usize) -> Counted,
    sizes: &[u64],
) -> Vec<MrcPoint> {
    let mut fw = Fenwick::new(accesses.len());
    let mut last: FxHashMap<u64, usize> = FxHashMap::default();
    // hist[d] = counted accesses whose reuse distance is d (distinct blocks between).
    let mut hist: Vec<u64> = Vec::new();
    let mut n = 0usize;
    for (t, a) in accesses.iter().enumerate() {
        let how = counted(t);
        if how == Counted::Gone {
            if let Some(p) = last.remove(&a.key) {
                fw.add(p, -1);
            }
            continue;
        }
        let count = how == Counted::Yes;
        n += usize::from(count);
        if let Some(p) = last.insert(a.key, t) {
            if count {
                let d = (fw.prefix(t) - fw.prefix(p + 1)) as usize;
                if hist.len() <= d {
                    hist.resize(d + 1, 0);
                }
                hist[d] += 1;
            }
            fw.add(p, -1);
        }
        fw.add(t, 1);
    }
    let mut cumulative = Vec::with_capacity(hist.len() + 1);
    let mut run = 0u64;
    cumulative.push(0);
    for h in &hist {
        run += h;
        cumulative.push(run);
    }
    sizes
        .iter()
        .map(|&c| {
            let hits = cumulative[(c as usize).min(hist.len())];
            MrcPoint { cache_blocks: c, hit_ratio: ratio(hits, n as u64) }
        })
        .collect()
}

fn ratio(hits: u64, n: u64) -> f64 {
    if n == 0 {
        0.0
    } else {
        hits as f64 / n as f64
    }
}

/// The sampling hash: spreads block keys uniformly over u64.
pub(crate) fn spread(key: u64) -> u64 {
    let mut x = key.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// Hit ratios of policy `name` for every size in `sizes`, from miniature
/// simulations: the trace is hashed once, then each size replays only its
/// sample (sizes run on parallel threads). `None` for an unknown policy.
pub fn sampled_mrc(
    name: &str,
    accesses: &[BlockAccess],
    sizes: &[u64],
    min_blocks: u64,
) -> Option<Vec<MrcPoint>> {
    sampled_mrc_with(&|c| by_name(name, c), accesses, sizes, min_blocks)
}

/// [`sampled_mrc`] for a policy made by `build(capacity in blocks)`, for
/// policies [`by_name`] does not know (the simulator's "default").
pub fn sampled_mrc_with(
    build: &(dyn Fn(u64) -> Option<Box<dyn Policy>> + Sync),
    accesses: &[BlockAccess],
    sizes: &[u64],
    min_blocks: u64,
) -> Option<Vec<MrcPoint>> {
    build(1)?;
    let hashes: Vec<u64> = accesses.iter().map(|a| spread(a.key)).collect();
    let one = |c: u64| -> MrcPoint {
        let rate = (min_blocks as f64 / c.max(1) as f64).min(1.0);
        let scaled = ((c as f64 * rate).round() as u64).max(1);
        let threshold = if rate >= 1.0 { u64::MAX } else { (rate * u64::MAX as f64) as u64 };
        let Some(mut policy) = build(scaled) else {
            return MrcPoint { cache_blocks: c, hit_ratio: f64::NAN };
        };
        let (mut requests, mut hits) = (0u64, 0u64);
        let mut evicted = Vec::new();
        for (a, &h) in accesses.iter().zip(&hashes) {
            if threshold != u64::MAX && h >= threshold {
                continue;
            }
            requests += 1;
            hits += u64::from(step(policy.as_mut(), a, &mut evicted));
        }
        MrcPoint { cache_blocks: c, hit_ratio: ratio(hits, requests) }
    };
    per_size(sizes, one)
}

/// `one(size)` for every size of `sizes`, in order, on as many threads as
/// there are cores (at most one a size); None if one of them panicked.
pub(crate) fn per_size<T: Send>(sizes: &[u64], one: impl Fn(u64) -> T + Sync) -> Option<Vec<T>> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(sizes.len()).max(1);
    let mut out: Vec<Option<T>> = (0..sizes.len()).map(|_| None).collect();
    std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|w| {
                let one = &one;
                s.spawn(move || {
                    sizes
                        .iter()
                        .enumerate()
                        .skip(w)
                        .step_by(threads)
                        .map(|(i, &c)| (i, one(c)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        for w in workers {
            for (i, p) in w.join().unwrap_or_default() {
                out[i] = Some(p);
            }
        }
    });
    out.into_iter().collect()
}

/// `count` sizes spread evenly on a log scale from `lo` to `hi`, distinct.
pub fn log_sizes(lo: u64, hi: u64, count: usize) -> Vec<u64> {
    let (lo, hi) = (lo.max(1), hi.max(lo.max(1)));
    let mut out: Vec<u64> = (0..count)
        .map(|i| {
            let f = if count <= 1 { 1.0 } else { i as f64 / (count - 1) as f64 };
            ((lo as f64).ln() + f * ((hi as f64).ln() - (lo as f64).ln())).exp().round() as u64
        })
        .collect();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::replay::hit_ratio;

    fn trace(n: usize, universe: u64, seed: u64) -> Vec<BlockAccess> {
        let mut x = seed | 1;
        (0..n)
            .map(|i| {
                crate::xorshift(&mut x);
                // A skewed mix: a hot set and a long tail.
                let key = if x.is_multiple_of(3) { x % (universe / 20 + 1) } else { x % universe };
                BlockAccess { key, now_ns: i as u64 }
            })
            .collect()
    }

    #[test]
    fn lru_curve_equals_full_replays_exactly() {
        let t = trace(50_000, 5_000, 7);
        let sizes = [1, 10, 100, 500, 1000, 4000, 10_000];
        for p in lru_mrc(&t, &sizes) {
            let mut lru = by_name("lru", p.cache_blocks).unwrap();
            let full = hit_ratio(lru.as_mut(), &t);
            assert_eq!(p.hit_ratio, full, "size {}", p.cache_blocks);
        }
    }

    #[test]
    fn sampling_is_exact_when_the_rate_is_one_and_close_otherwise() {
        let t = trace(200_000, 50_000, 3);
        let sizes = [100, 2000, 20_000];
        let full: Vec<f64> =
            sizes.iter().map(|&c| hit_ratio(by_name("arc", c).unwrap().as_mut(), &t)).collect();
        let exact = sampled_mrc("arc", &t, &sizes, u64::MAX).unwrap();
        for (p, f) in exact.iter().zip(&full) {
            assert_eq!(p.hit_ratio, *f);
        }
        let approx = sampled_mrc("arc", &t, &sizes, 1000).unwrap();
        for (p, f) in approx.iter().zip(&full) {
            assert!((p.hit_ratio - f).abs() < 0.02, "size {}: {} vs {f}", p.cache_blocks, p.hit_ratio);
        }
        assert!(sampled_mrc("nope", &t, &sizes, 10).is_none());
    }

    #[test]
    fn log_sizes_span_the_range() {
        let s = log_sizes(10, 10_000, 4);
        assert_eq!(s, vec![10, 100, 1000, 10_000]);
    }
}
