//! Developer tool: how far the server's live estimates are from the truth
//! (`arcache_sim::fidelity`, which says what it models) at every reference
//! point, for arc-adaptive (the default policy) and OpenZFS's ARC (`arc`,
//! the policy the live sizing was first checked with): the policy curve of
//! `arcache summary` (one record in 64 sampled by hash, its demand reads
//! replayed through a miniature of the policy at 1/64 of each size: the
//! server's code) and `hit_ratio_if_arc_doubled` (hits plus ghost hits)
//! against a full replay at twice the size.
//!
//! Usage: sizing REFERENCE_DIR
//!
//! Prints a markdown table, one row per point (hit ratios in %, errors in
//! percentage points), then per policy and estimate the mean and worst
//! absolute errors.

use std::path::Path;

use arcache_sim::{
    fidelity, on_threads, read_as_server_accesses, reference_traces, Fidelity, ReferenceTrace,
};

const POLICIES: [&str; 2] = ["arc-adaptive", "arc"];
/// Below this many reads the server gives no sizing advice ("too few
/// reads observed"): msr_hm0_sample and systor17_sample are that small.
const ADVICE_READS: u64 = 10_000;

struct Point {
    label: String,
    size: u64,
    /// Per policy of `POLICIES`.
    got: Vec<Fidelity>,
}

fn jobs(dir: &Path) -> Vec<ReferenceTrace> {
    let traces = reference_traces(dir).expect("reference traces");
    traces.into_iter().filter(|t| t.path.exists()).collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = Path::new(args.get(1).expect("usage: sizing REFERENCE_DIR"));
    let work = jobs(dir);
    let mut points = on_threads(&work, 2, |t| {
        let acc = read_as_server_accesses(&t.path, 4096).expect("trace");
        let at = |size: u64| -> Vec<Fidelity> {
            POLICIES.iter().map(|p| fidelity(p, size, &acc).expect("policy")).collect()
        };
        t.sizes.iter().map(|&size| Point { label: t.name.clone(), size, got: at(size) }).collect()
    });
    points.sort_by(|a, b| (&a.label, a.size).cmp(&(&b.label, b.size)));
    table(&points);
    let advised: Vec<&Point> = points.iter().filter(|p| p.got[0].reads >= ADVICE_READS).collect();
    let all: Vec<&Point> = points.iter().collect();
    for (label, set) in [("every point", &all), ("traces of 10,000 reads or more", &advised)] {
        println!("Over {label} ({} points):", set.len());
        println!();
        for (i, name) in POLICIES.iter().enumerate() {
            let sampled: Vec<f64> = set.iter().map(|p| p.got[i].sampled_error()).collect();
            let ghosts: Vec<f64> = set.iter().map(|p| p.got[i].ghost_error()).collect();
            println!("- {name}, policy curve: {}", errors(set, &sampled));
            println!("- {name}, ghost estimate of twice the size: {}", errors(set, &ghosts));
        }
        println!();
    }
}

fn table(points: &[Point]) {
    let heads: Vec<String> = POLICIES
        .iter()
        .map(|p| format!("{p} full | sampled | error | at 2x | ghost estimate | error"))
        .collect();
    println!("| trace | cache blocks | {} |", heads.join(" | "));
    println!("|---|---:|{}", "---:|".repeat(6 * POLICIES.len()));
    for p in points {
        let cols: Vec<String> = p
            .got
            .iter()
            .map(|g| {
                format!(
                    "{:.2} | {:.2} | {:+.2} | {:.2} | {:.2} | {:+.2}",
                    g.full,
                    g.sampled,
                    g.sampled_error(),
                    g.doubled,
                    g.ghost_estimate,
                    g.ghost_error()
                )
            })
            .collect();
        println!("| {} | {} | {} | {} |", p.label, p.size, p.got[0].reads, cols.join(" | "));
    }
    println!();
}

/// Mean and worst absolute error, and how many points are over 3 pp.
fn errors(points: &[&Point], errs: &[f64]) -> String {
    let mean = errs.iter().map(|e| e.abs()).sum::<f64>() / errs.len().max(1) as f64;
    let worst = points.iter().zip(errs).max_by(|a, b| a.1.abs().total_cmp(&b.1.abs()));
    let worst = worst.map_or(String::new(), |(p, e)| format!("{e:+.2} pp ({} {})", p.label, p.size));
    let over = errs.iter().filter(|e| e.abs() > 3.0).count();
    format!("mean |error| {mean:.2} pp, worst {worst}, {over} of {} points over 3 pp", errs.len())
}
