//! arc-adaptive on the repository's traces, replayed as `arcache sim`
//! replays them (traces without time 1 ms a request): its hit counts are
//! pinned, so any change of behaviour shows, and each point must be within
//! 1 percentage point of the better of libCacheSim's LRU and ARC (issue
//! 20's bar for the `4k` points; traces/reference_hit_ratios.json). One
//! point misses it and is held to what it does: the read-only `4k-r`
//! cloudphysics_io at 52,500 blocks (-1.80 pp: no variant reaches ARC's
//! 22.5 % there; -1.32 pp with the same ten variants and no early switch,
//! measured at -1.70, so the early switch costs it 0.4 pp). The ten variants moved
//! other pinned points too, within the bar: P3 at 10,234 blocks and
//! tencent_cbs_sample at 3,482 lost the most (-1.21 and -0.93 pp).
//! Holding back switches toward recency once the copies have chosen
//! (`TOWARD_RECENCY` in arc-policy's select.rs) moved cloudphysics_io and
//! P3: cloudphysics_io at 13,460 blocks is now the closest `4k` point to
//! the bar (-0.81 pp, was -0.25), at 26,921 and 67,302 it gained 17,000 and
//! 57,000 hits. Reading a ghost evicted before a switch as a plain miss
//! (arc-policy's adaptive.rs, `evicted_before_switch`) cost the `4k-r`
//! point at 52,500 blocks 0.1 pp more (-1.70 to -1.80), cloudphysics_io
//! `4k` at 13,460 blocks 0.03 pp (-0.84) and P3 at 5,117 blocks 3,848 hits
//! (0.63 pp, still above the better of LRU and ARC), and gave
//! cloudphysics_io `4k` at 67,302 blocks 17,000 hits. The recency variant
//! (LRU's equal, in place of 95 % MRU with `fill_mfu`) gave cloudphysics_io
//! `4k` at 13,460 blocks 621 hits (now -0.79 pp) and P3 at 1,023 blocks
//! 954, and cost cloudphysics_io `4k` at 2,692 blocks 168. A first choice
//! of the recency variant on half the evidence (`FIRST_TOWARD_RECENCY`)
//! cost P3 at 1,023 blocks 206 hits and moved no other pinned point; the
//! same rule for 60 % and 95 % MRU too cost the `4k-r` point at 52,500
//! blocks 7.7 pp, and was not kept. Evidence from half a turnover for the
//! recency variant, and MFU's frequencies spent in one pass until the
//! copies choose (arc-policy's select.rs, `Warmup` and `UNDECIDED`), cost
//! P3 at 25,587 blocks 7,082 hits (1.16 pp, still 0.86 pp above the better
//! of LRU and ARC), gave cloudphysics_io `4k` at 2,692 blocks 345 and moved
//! tencent_cbs_sample by 1 and 6 hits.

mod common;

use std::path::Path;

use arc_policy::by_name;
use arcache_sim::{read_accesses, replay};
use common::{extended_dir, shipped_dir};

fn check(dir: &Path, trace: &str, mode: &str, pinned: Option<[u64; 4]>) {
    let refs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference_hit_ratios.json")).unwrap())
            .unwrap();
    let t = &refs["traces"][trace];
    let m = &t["modes"][mode];
    let accesses = read_accesses(&dir.join(t["csv"].as_str().unwrap()), 4096, mode.ends_with("-r")).unwrap();
    let mut got = Vec::new();
    for size in m["sizes_blocks"].as_array().unwrap() {
        let size = size.as_u64().unwrap();
        let mut p = by_name("arc-adaptive", size).unwrap();
        let hits = replay(p.as_mut(), size, &accesses).hits;
        p.validate().unwrap();
        let r = &m["hits"][size.to_string()];
        let best = r["LRU"].as_u64().unwrap().max(r["ARC"].as_u64().unwrap());
        let pp = 100.0 * (hits as f64 - best as f64) / accesses.len() as f64;
        let bar = match (trace, mode, size) {
            ("cloudphysics_io", "4k-r", 52500) => -1.85,
            _ => -1.0,
        };
        assert!(pp >= bar, "{trace} {mode} c={size}: {pp:.2} pp below max(LRU, ARC)");
        got.push(hits);
    }
    if let Some(want) = pinned {
        assert_eq!(got, want, "{trace} {mode}: pinned hit counts");
    }
}

#[test]
fn arc_adaptive_on_the_shipped_traces() {
    let d = shipped_dir();
    check(&d, "cloudphysics_io", "4k", Some([121464, 155990, 254417, 411090]));
    check(&d, "cloudphysics_io", "4k-r", Some([37524, 54539, 67520, 100362]));
    check(&d, "P3", "4k", Some([78911, 172577, 252718, 399062]));
    check(&d, "msr_hm0_sample", "4k", Some([258, 443, 511, 554]));
    check(&d, "systor17_sample", "4k", Some([456, 583, 610, 627]));
    check(&d, "tencent_cbs_sample", "4k", Some([7232, 23395, 26645, 28576]));
    check(&d, "tencent_cbs_sample", "4k-r", Some([8102, 18070, 19815, 21212]));
}

/// Extended check (traces/README.md): the bar on the other reference traces.
#[test]
#[ignore = "needs the full trace set in ARCACHE_TRACES"]
fn extended_arc_adaptive_within_a_point_of_lru_and_arc() {
    for t in ["OLTP", "P2", "P6", "P12", "w106"] {
        check(&extended_dir(), t, "4k", None);
    }
}
