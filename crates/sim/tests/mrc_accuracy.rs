//! The one-pass miss-ratio curves against full replays at the same sizes,
//! on real traces: LRU exactly, OpenZFS's and the paper's ARC within one
//! percentage point (the bound), arc-adaptive within 2.5, at every
//! size that is sampled (with the default sample minimum, or a smaller one
//! for traces smaller than it).

mod common;

use std::collections::HashSet;
use std::path::Path;

use arc_policy::by_name;
use arcache_sim::{expand, log_sizes, lru_mrc, read_trace, replay, sampled_mrc};
use common::{extended, shipped};

/// `arcache sim --sample-min`'s default.
const SAMPLE_MIN: u64 = 131_072;

/// For traces of fewer unique blocks than [`SAMPLE_MIN`] (`--sample-min
/// 32768`), so that some of their sizes are sampled.
const SMALL_SAMPLE_MIN: u64 = 32_768;

/// arc-adaptive's miniatures are further off: its copies choose from the
/// requests they see, and a sampled trace has fewer, so they choose at
/// other times (P3 at 71,139 blocks sampled at 46 %: 1.99 pp; the ARCs'
/// points are within 0.3 pp).
const ADAPTIVE_BOUND: f64 = 2.5;

/// LRU's curve at every fourth size, and every point `sampled_mrc` samples
/// (above `sample_min`; there must be one) of the ARCs.
fn check(path: &Path, sample_min: u64) {
    let name = path.display();
    let acc = expand(&read_trace(path).unwrap(), 4096, false);
    let unique = acc.iter().map(|a| a.key).collect::<HashSet<_>>().len() as u64;
    let sizes = log_sizes((unique / 1000).max(8), unique, 20);
    for (i, p) in lru_mrc(&acc, &sizes).iter().enumerate() {
        // Full replays are slow: every other size is enough to show exactness.
        if i % 4 == 0 {
            let full = replay(by_name("lru", p.cache_blocks).unwrap().as_mut(), p.cache_blocks, &acc);
            assert_eq!(p.hit_ratio, full.hit_ratio, "{name}: LRU at {} blocks", p.cache_blocks);
        }
    }
    for (policy, bound) in [("arc", 1.0), ("arc-paper", 1.0), ("arc-adaptive", ADAPTIVE_BOUND)] {
        let curve = sampled_mrc(policy, &acc, &sizes, sample_min).unwrap();
        // Sizes up to `sample_min` are replayed in full: equal by construction.
        let sampled: Vec<_> = curve.iter().filter(|p| p.cache_blocks > sample_min).collect();
        assert!(!sampled.is_empty(), "{name}: no size above {sample_min} blocks is sampled");
        for p in sampled {
            let full = replay(by_name(policy, p.cache_blocks).unwrap().as_mut(), p.cache_blocks, &acc);
            let err = (p.hit_ratio - full.hit_ratio).abs() * 100.0;
            assert!(err <= bound, "{name}: {policy} at {} blocks is off by {err:.2} points", p.cache_blocks);
        }
    }
}

#[test]
fn mrc_agrees_with_full_replays_on_cloudphysics_io() {
    check(&shipped("cloudphysics_io/cloudphysics_io.csv.gz"), SAMPLE_MIN);
}

#[test]
fn mrc_agrees_with_full_replays_on_p3() {
    // 102,348 blocks: below the default minimum, so a smaller one.
    check(&shipped("arc_paper/P3.csv.gz"), SMALL_SAMPLE_MIN);
}

/// Extended check (traces/README.md): the ARC paper's traces too big to ship.
#[test]
#[ignore = "needs the full trace set in ARCACHE_TRACES"]
fn extended_mrc_agrees_with_full_replays_on_the_other_arc_paper_traces() {
    for t in ["OLTP", "P2", "P6", "P12"] {
        check(&extended(&format!("arc_paper/{t}.csv.gz")), SMALL_SAMPLE_MIN);
    }
}
