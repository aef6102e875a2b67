//! Developer tool: where the serving policy loses at one point of a trace.
//! Replays the trace through `arc-adaptive` (in 4 KiB blocks, a cache of
//! fixed size, as `examples/tune.rs` runs it; not `default`, which counts
//! bytes and grows from `zfs_arc_min`), through LRU, and through each
//! variant its copies try, held from the start at full size, and prints
//! each one's hit ratio;
//! then, per window of block accesses (requests, for traces of 4 KiB
//! reads), the hit ratio of `arc-adaptive` and the variant it runs at the
//! window's end beside the best held variant's. A cache that runs a
//! variant and hits far less than that variant held from the start is in
//! a state the choice alone does not explain (docs/architecture.md).
//!
//! Given schedules `A@N,B`, it also replays variant A held until N
//! accesses and B from then on: what a switch from A to B costs against
//! holding B from the start.
//!
//! Usage: variants TRACE CACHE_BLOCKS [WINDOW [A@N,B ...]]   (WINDOW: 10000 accesses)
//! With READS_ONLY set in the environment, the trace's writes are left
//! out (the reference file's `4k-r` mode).

use arc_policy::{AdaptiveArc, Lru, Policy, ZfsArcConfig};
use arcache_sim::{read_accesses, step, BlockAccess};

/// Hits per window of accesses, and the variant run at each window's end
/// (None when the cache holds one throughout).
type Windows = Vec<(u64, Option<usize>)>;

fn windows(p: &mut AdaptiveArc, acc: &[BlockAccess], window: usize) -> Windows {
    let mut evicted = Vec::new();
    acc.chunks(window)
        .map(|w| {
            let hits = w.iter().map(|a| u64::from(step(p as &mut dyn Policy, a, &mut evicted))).sum();
            (hits, p.chosen_variant())
        })
        .collect()
}

/// Hits of variant `a` held for the first `n` accesses, then `b`.
fn switched(acc: &[BlockAccess], size: u64, a: usize, n: usize, b: usize) -> u64 {
    let mut p = AdaptiveArc::holding(ZfsArcConfig::fixed(size), a).expect("variant");
    let mut evicted = Vec::new();
    let mut hits = 0;
    for (k, x) in acc.iter().enumerate() {
        if k == n {
            assert!(p.hold(b), "variant {b}");
        }
        hits += u64::from(step(&mut p as &mut dyn Policy, x, &mut evicted));
    }
    hits
}

/// `A@N,B` as (A, N, B).
fn schedule(s: &str) -> Option<(usize, usize, usize)> {
    let (first, b) = s.split_once(',')?;
    let (a, n) = first.split_once('@')?;
    Some((a.parse().ok()?, n.parse().ok()?, b.parse().ok()?))
}

fn pct(hits: u64, n: usize) -> f64 {
    100.0 * hits as f64 / n.max(1) as f64
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: variants TRACE CACHE_BLOCKS [WINDOW [A@N,B ...]]");
        std::process::exit(2);
    }
    let acc = read_accesses(std::path::Path::new(&args[1]), 4096, std::env::var_os("READS_ONLY").is_some())
        .expect("trace");
    let size: u64 = args[2].parse().expect("CACHE_BLOCKS");
    let window: usize = args.get(3).map_or(10_000, |w| w.parse().expect("WINDOW"));
    if window == 0 {
        eprintln!("variants: WINDOW must be at least 1");
        std::process::exit(2);
    }
    let variants = AdaptiveArc::variants();
    // What a variant does with records leaving MRU unused: the table's
    // column, and the words its name gets.
    let leavers = |i: usize| match variants[i] {
        (_, _, true) => ("LRU", ", LRU"),
        (_, true, false) => ("true", ", fill_mfu"),
        (_, false, false) => ("false", ""),
    };
    let name = |i: usize| format!("{i} ({:.0} % MRU{})", variants[i].0 * 100.0, leavers(i).1);

    let adaptive = windows(&mut AdaptiveArc::new(ZfsArcConfig::fixed(size)), &acc, window);
    let total = |w: &Windows| w.iter().map(|x| x.0).sum::<u64>();
    println!("| policy | MRU target | fill_mfu | hit % |");
    println!("|---|---:|---|---:|");
    println!("| arc-adaptive | (chosen) | (chosen) | {:.2} |", pct(total(&adaptive), acc.len()));
    // LRU beside them: where a hot set moves, the bar the variants miss.
    let mut lru = Lru::new(size);
    let mut evicted = Vec::new();
    let lru_hits: u64 =
        acc.iter().map(|a| u64::from(step(&mut lru as &mut dyn Policy, a, &mut evicted))).sum();
    println!("| lru | | | {:.2} |", pct(lru_hits, acc.len()));
    let mut best: Option<(usize, Windows)> = None;
    // Each variant's hits held from the start, for the schedules below.
    let mut held_hits = Vec::with_capacity(variants.len());
    for (i, &(fraction, _, _)) in variants.iter().enumerate() {
        let mut held = AdaptiveArc::holding(ZfsArcConfig::fixed(size), i).expect("variant");
        let w = windows(&mut held, &acc, window);
        held_hits.push(total(&w));
        println!(
            "| variant {i} held | {:.0} % | {} | {:.2} |",
            fraction * 100.0,
            leavers(i).0,
            pct(total(&w), acc.len())
        );
        if best.as_ref().is_none_or(|(_, b)| total(&w) > total(b)) {
            best = Some((i, w));
        }
    }
    let schedules: Vec<(usize, usize, usize)> = args[4.min(args.len())..]
        .iter()
        .map(|s| schedule(s).filter(|&(a, _, b)| a.max(b) < variants.len()).expect("a schedule is A@N,B"))
        .collect();
    if !schedules.is_empty() {
        println!();
        println!("| schedule | hit % | the second variant held from the start, hit % |");
        println!("|---|---:|---:|");
        for (a, n, b) in schedules {
            let hits = switched(&acc, size, a, n, b);
            let held = held_hits[b];
            println!(
                "| {} until {n} accesses, then {} | {:.2} | {:.2} |",
                name(a),
                name(b),
                pct(hits, acc.len()),
                pct(held, acc.len())
            );
        }
    }
    let Some((bi, bw)) = best else { return };
    println!();
    println!("| accesses | arc-adaptive hit % | the variant it runs at the window's end | variant {bi} held, hit % |");
    println!("|---:|---:|---|---:|");
    for (k, ((a, chosen), (b, _))) in adaptive.iter().zip(&bw).enumerate() {
        let n = window.min(acc.len() - k * window);
        let chosen = chosen.map_or_else(|| "-".to_string(), name);
        println!("| {} | {:.1} | {chosen} | {:.1} |", k * window + n, pct(*a, n), pct(*b, n));
    }
}
