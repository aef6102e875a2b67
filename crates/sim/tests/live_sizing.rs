//! The server's live estimates (`arcache summary`: the policy curve from a
//! one-in-64 sample, and the ghost lists' estimate for an ARC twice as
//! large) are as close to full replays for its default policy,
//! arc-adaptive, as for OpenZFS's ARC, the policy they served before: on
//! every reference point of the shipped traces, the mean absolute error of
//! each is at most half a percentage point above ARC's. Both are several
//! points off at small caches, where a one-in-64 sample holds a few dozen
//! records (bench/results/sizing.md has every point of the full suite).

mod common;

use arcache_sim::{fidelity, read_accesses, Fidelity};
use common::shipped_dir;

/// The server's sampling rate (`arcache_engine::sizing::SAMPLE_EVERY`).
const RATE: u64 = 64;

/// Every reference point of the shipped traces: (adaptive, arc).
fn points() -> Vec<(Fidelity, Fidelity)> {
    let dir = shipped_dir();
    let text = std::fs::read_to_string(dir.join("reference_hit_ratios.json")).unwrap();
    let refs: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut out = Vec::new();
    for t in refs["traces"].as_object().unwrap().values() {
        let path = dir.join(t["csv"].as_str().unwrap());
        if !path.exists() {
            continue;
        }
        let acc = read_accesses(&path, 4096, false).unwrap();
        for size in t["modes"]["4k"]["sizes_blocks"].as_array().unwrap().iter().filter_map(|v| v.as_u64()) {
            let got = |p| fidelity(p, size, RATE, &acc).unwrap();
            out.push((got("arc-adaptive"), got("arc")));
        }
    }
    out
}

fn mean_abs(v: impl Iterator<Item = f64>) -> f64 {
    let all: Vec<f64> = v.map(f64::abs).collect();
    all.iter().sum::<f64>() / all.len() as f64
}

#[test]
fn the_live_estimates_of_the_default_policy_are_as_close_as_arcs() {
    let pts = points();
    assert!(pts.len() >= 20, "only {} shipped reference points", pts.len());
    let sampled = (
        mean_abs(pts.iter().map(|p| p.0.sampled_error())),
        mean_abs(pts.iter().map(|p| p.1.sampled_error())),
    );
    let ghosts =
        (mean_abs(pts.iter().map(|p| p.0.ghost_error())), mean_abs(pts.iter().map(|p| p.1.ghost_error())));
    assert!(
        sampled.0 <= sampled.1 + 0.5,
        "policy curve: arc-adaptive off by {:.2} pp on average, arc by {:.2}",
        sampled.0,
        sampled.1
    );
    assert!(
        ghosts.0 <= ghosts.1 + 0.5,
        "ghost estimate of twice the size: arc-adaptive off by {:.2} pp on average, arc by {:.2}",
        ghosts.0,
        ghosts.1
    );
}
