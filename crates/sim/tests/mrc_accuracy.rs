//! The one-pass miss-ratio curves against full replays at the same sizes,
//! on the real traces in shared/traces: LRU exactly, the ARCs within one
//! percentage point (the bound), with the default sample minimum.

use std::collections::HashSet;
use std::path::PathBuf;

use arc_policy::by_name;
use arcache_sim::{expand, log_sizes, lru_mrc, read_trace, replay, sampled_mrc};

const SAMPLE_MIN: u64 = 131_072;

fn trace(name: &str) -> Vec<arcache_sim::BlockAccess> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces").join(name);
    expand(&read_trace(&p).unwrap(), 4096, false)
}

fn check(name: &str) {
    let acc = trace(name);
    let unique = acc.iter().map(|a| a.key).collect::<HashSet<_>>().len() as u64;
    let sizes = log_sizes((unique / 1000).max(8), unique, 20);
    for (i, p) in lru_mrc(&acc, &sizes).iter().enumerate() {
        // Full replays are slow: every other size is enough to show exactness.
        if i % 4 == 0 {
            let full = replay(by_name("lru", p.cache_blocks).unwrap().as_mut(), p.cache_blocks, &acc);
            assert_eq!(p.hit_ratio, full.hit_ratio, "{name}: LRU at {} blocks", p.cache_blocks);
        }
    }
    for policy in ["arc", "arc-paper"] {
        let curve = sampled_mrc(policy, &acc, &sizes, SAMPLE_MIN).unwrap();
        for p in curve.iter().filter(|p| p.cache_blocks > SAMPLE_MIN / 2) {
            let full = replay(by_name(policy, p.cache_blocks).unwrap().as_mut(), p.cache_blocks, &acc);
            let err = (p.hit_ratio - full.hit_ratio).abs() * 100.0;
            assert!(err <= 1.0, "{name}: {policy} at {} blocks is off by {err:.2} points", p.cache_blocks);
        }
    }
}

#[test]
fn mrc_agrees_with_full_replays_on_cloudphysics_io() {
    check("cloudphysics_io/cloudphysics_io.csv.gz");
}

#[test]
fn mrc_agrees_with_full_replays_on_the_arc_paper_traces() {
    for t in ["OLTP", "P2", "P3", "P6", "P12"] {
        check(&format!("arc_paper/{t}.csv.gz"));
    }
}
