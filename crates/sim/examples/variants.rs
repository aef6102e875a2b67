//! Developer tool: where the serving policy loses at one point of a trace.
//! Replays the trace through `arc-adaptive` and through each variant its
//! copies try, held from the start, and prints each one's hit ratio; then,
//! per window of requests, the hit ratio of `arc-adaptive` (with its MRU
//! target) beside the best held variant's. A cache that chose a variant
//! and hits far less than that variant held from the start is in a state
//! the choice alone does not explain (docs/architecture.md).
//!
//! Usage: variants TRACE CACHE_BLOCKS [WINDOW]   (WINDOW: 10000 requests)

use arc_policy::{AdaptiveArc, Policy, ZfsArcConfig};
use arcache_sim::{expand, has_timestamps, read_trace, respace, step, BlockAccess, DEFAULT_SPACING_US};

/// Hits per window of `window` requests, and the MRU target (`pd` as a
/// fraction) at each window's end.
fn windows(p: &mut dyn Policy, acc: &[BlockAccess], window: usize) -> Vec<(u64, f64)> {
    let mut evicted = Vec::new();
    acc.chunks(window)
        .map(|w| {
            let hits = w.iter().map(|a| u64::from(step(p, a, &mut evicted))).sum();
            (hits, p.stats().pd as f64 / (1u64 << 32) as f64)
        })
        .collect()
}

fn pct(hits: u64, n: usize) -> f64 {
    100.0 * hits as f64 / n.max(1) as f64
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: variants TRACE CACHE_BLOCKS [WINDOW]");
        std::process::exit(2);
    }
    let mut reqs = read_trace(std::path::Path::new(&args[1])).expect("trace");
    if !has_timestamps(&reqs) {
        respace(&mut reqs, DEFAULT_SPACING_US);
    }
    let acc = expand(&reqs, 4096, false);
    let size: u64 = args[2].parse().expect("CACHE_BLOCKS");
    let window: usize = args.get(3).map_or(10_000, |w| w.parse().expect("WINDOW"));

    let adaptive = windows(&mut AdaptiveArc::new(ZfsArcConfig::fixed(size)), &acc, window);
    let total = |w: &[(u64, f64)]| w.iter().map(|x| x.0).sum::<u64>();
    println!("| policy | MRU target | fill_mfu | hit % |");
    println!("|---|---:|---|---:|");
    println!("| arc-adaptive | (chosen) | (chosen) | {:.2} |", pct(total(&adaptive), acc.len()));
    let mut best: Option<(usize, Vec<(u64, f64)>)> = None;
    for (i, (fraction, fill)) in AdaptiveArc::variants().into_iter().enumerate() {
        let mut held = AdaptiveArc::holding(ZfsArcConfig::fixed(size), i).expect("variant");
        let w = windows(&mut held, &acc, window);
        println!(
            "| variant {i} held | {:.0} % | {fill} | {:.2} |",
            fraction * 100.0,
            pct(total(&w), acc.len())
        );
        if best.as_ref().is_none_or(|(_, b)| total(&w) > total(b)) {
            best = Some((i, w));
        }
    }
    let Some((bi, bw)) = best else { return };
    println!();
    println!("| requests | arc-adaptive hit % | its MRU target | variant {bi} held, hit % |");
    println!("|---:|---:|---:|---:|");
    for (k, ((a, pd), (b, _))) in adaptive.iter().zip(&bw).enumerate() {
        let n = window.min(acc.len() - k * window);
        println!("| {} | {:.1} | {:.0} % | {:.1} |", k * window + n, pct(*a, n), pd * 100.0, pct(*b, n));
    }
}
