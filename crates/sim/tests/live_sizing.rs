//! A model of the server's live estimates (`arcache_sim::fidelity`: the
//! policy curve by the server's own code in `arc_policy::live`, from the
//! reads and writes of one record in 64; the ghost lists' estimate for an
//! ARC twice as large; writes stored without counting, as the server's
//! cache does) against full replays, on every reference point of the shipped
//! traces: for the default policy, arc-adaptive, each estimate's mean
//! absolute error is at most half a percentage point above that of
//! OpenZFS's ARC, the policy the estimates served before, and below a
//! bound of its own. bench/results/sizing.md has every
//! point of the full suite.

mod common;

use arcache_sim::{fidelity, read_as_server_accesses, reference_traces, Fidelity};
use common::shipped_dir;

/// Every reference point of the shipped traces: (adaptive, arc).
fn points() -> Vec<(Fidelity, Fidelity)> {
    let mut out = Vec::new();
    for t in reference_traces(&shipped_dir()).unwrap().into_iter().filter(|t| t.path.exists()) {
        let acc = read_as_server_accesses(&t.path, 4096).unwrap();
        for &size in &t.sizes {
            let got = |p| fidelity(p, size, &acc).unwrap();
            out.push((got("arc-adaptive"), got("arc")));
        }
    }
    out
}

/// Bounds of arc-adaptive's own mean errors on these 20 points (1.34 and
/// 1.74 pp at 378a318, arc's 1.34 and 1.37; the curve's was 2.14 while
/// the sample left writes out); 1.50 and 1.79 at 104af4a (arc's 1.39 and
/// 1.47), where the copies take in stores and drops and the model replays
/// writes as the server meets them (2bef85b, between, had 1.54 and 1.91
/// against 1.34 and 1.37, over the 0.5 margin).
const SAMPLED_BOUND: f64 = 2.0;
const GHOST_BOUND: f64 = 2.5;
const GHOST_OVER_ARC: f64 = 0.5;

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
    let msg = format!(
        "mean |error|, arc-adaptive / arc: policy curve {:.2} / {:.2} pp, ghost estimate {:.2} / {:.2} pp",
        sampled.0, sampled.1, ghosts.0, ghosts.1
    );
    assert!(sampled.0 <= sampled.1 + 0.5 && sampled.0 <= SAMPLED_BOUND, "{msg}");
    assert!(ghosts.0 <= ghosts.1 + GHOST_OVER_ARC && ghosts.0 <= GHOST_BOUND, "{msg}");
}
