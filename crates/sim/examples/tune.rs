//! Developer tool: arc-adaptive against max(LRU, textbook ARC) at every
//! reference point and on synthetic traces. Not a test: the numbers are
//! for choosing constants, the tests pin what is chosen.
//!
//! Usage: tune REFERENCE_DIR [SYNTHETIC_DIR]

use std::path::Path;

use arc_policy::by_name;
use arcache_sim::{expand, has_timestamps, read_trace, replay, respace, DEFAULT_SPACING_US};

fn hits(name: &str, size: u64, acc: &[arcache_sim::BlockAccess]) -> u64 {
    let mut p = by_name(name, size).expect("policy");
    replay(p.as_mut(), size, acc).hits
}

fn run(label: &str, acc: &[arcache_sim::BlockAccess], sizes: &[u64], out: &mut Vec<(f64, f64, String)>) {
    for &s in sizes {
        let n = acc.len() as f64;
        let a = hits("arc-adaptive", s, acc) as f64 / n * 100.0;
        let l = hits("lru", s, acc) as f64 / n * 100.0;
        let p = hits("arc-paper", s, acc) as f64 / n * 100.0;
        let f = hits("s3fifo", s, acc) as f64 / n * 100.0;
        println!(
            "{label:20} {s:7} adaptive {a:6.2} lru {l:6.2} arc {p:6.2} s3fifo {f:6.2} diff {:+.2}",
            a - l.max(p)
        );
        out.push((a, a - l.max(p), format!("{label} {s}")));
    }
}

fn load(path: &Path) -> Vec<arcache_sim::BlockAccess> {
    let mut reqs = read_trace(path).expect("trace");
    if !has_timestamps(&reqs) {
        respace(&mut reqs, DEFAULT_SPACING_US);
    }
    expand(&reqs, 4096, false)
}

fn summary(name: &str, v: &[(f64, f64, String)]) {
    if v.is_empty() {
        return;
    }
    let mean = v.iter().map(|x| x.0).sum::<f64>() / v.len() as f64;
    let worst = v.iter().min_by(|a, b| a.1.total_cmp(&b.1)).expect("points");
    println!("{name}: mean {mean:.2}, worst {:+.2} ({})", worst.1, worst.2);
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = Path::new(&args[1]);
    let refs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference_hit_ratios.json")).expect("refs"))
            .expect("json");
    let mut reference = Vec::new();
    for (name, t) in refs["traces"].as_object().expect("traces") {
        let acc = load(&dir.join(t["csv"].as_str().expect("csv")));
        let sizes: Vec<u64> = t["modes"]["4k"]["sizes_blocks"]
            .as_array()
            .expect("sizes")
            .iter()
            .filter_map(|v| v.as_u64())
            .collect();
        run(name, &acc, &sizes, &mut reference);
    }
    let mut synthetic = Vec::new();
    if let Some(syn) = args.get(2) {
        let syn = Path::new(syn);
        let list = std::fs::read_to_string(syn.join("sizes.txt")).expect("sizes.txt");
        for line in list.lines() {
            let (name, sizes) = line.split_once(' ').expect("line");
            let sizes: Vec<u64> = sizes.split(',').filter_map(|s| s.parse().ok()).collect();
            let acc = load(&syn.join(format!("{name}.csv.gz")));
            run(name, &acc, &sizes, &mut synthetic);
        }
    }
    summary("reference", &reference);
    summary("synthetic", &synthetic);
}
