//! `arcache sim --mrc`: miss-ratio curves written as CSV and PNG.

use std::collections::HashSet;
use std::fmt::Write as _;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use arcache_sim::{log_sizes, lru_mrc, sampled_mrc_with, BlockAccess, MrcPoint};

use crate::plot;
use crate::simcmd::SimArgs;

pub fn run(a: &SimArgs, accesses: &[BlockAccess]) -> Result<()> {
    let out = a.out.as_ref().context("--mrc needs --out DIR")?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let unique = accesses.iter().map(|x| x.key).collect::<HashSet<_>>().len() as u64;
    if unique == 0 {
        bail!("the trace has no block accesses");
    }
    let sizes = if a.cache_blocks.is_empty() {
        log_sizes((unique / 1000).max(8), unique, a.points.max(2))
    } else {
        a.cache_blocks.clone()
    };
    let mut csv = String::from("policy,cache_blocks,hit_ratio\n");
    let mut curves: Vec<(String, Vec<MrcPoint>)> = Vec::new();
    for p in &a.policy {
        let started = Instant::now();
        let points = if p == "lru" {
            lru_mrc(accesses, &sizes)
        } else {
            let build = |c: u64| crate::simcmd::build(p, c, a.block_size);
            sampled_mrc_with(&build, accesses, &sizes, a.sample_min).context("policy names were checked")?
        };
        eprintln!(
            "{p}: {} sizes from {} accesses ({unique} unique blocks) in {:.2} s",
            sizes.len(),
            accesses.len(),
            started.elapsed().as_secs_f64()
        );
        for pt in &points {
            let _ = writeln!(csv, "{p},{},{:.6}", pt.cache_blocks, pt.hit_ratio);
        }
        curves.push((p.clone(), points));
    }
    let csv_path = out.join("mrc.csv");
    std::fs::write(&csv_path, csv).with_context(|| format!("writing {}", csv_path.display()))?;
    let png_path = out.join("mrc.png");
    let title = a
        .trace
        .as_ref()
        .and_then(|t| t.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    plot::miss_ratio_png(&png_path, &title, &curves)?;
    println!("wrote {} and {}", csv_path.display(), png_path.display());
    Ok(())
}
