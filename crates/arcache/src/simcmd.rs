//! `arcache sim`: trace replay through the policy core.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use arc_policy::{by_name, POLICY_NAMES};
use arcache_sim::{expand, read_trace, replay};
use clap::Args;

#[derive(Debug, Args)]
pub struct SimArgs {
    /// A block trace: the CSV form `timestamp_us,op,offset_bytes,length_bytes[,dev]`, the ARC paper's
    /// `.lis` (512-byte blocks) or libCacheSim's `*.oracleGeneral*` binary; plain, .gz or .zst.
    #[arg(long, value_name = "FILE")]
    pub trace: PathBuf,
    /// Policies to compare, comma-separated: arc (OpenZFS-style), arc-paper (FAST'03), lru.
    #[arg(long, value_delimiter = ',', default_value = "arc,arc-paper,lru")]
    pub policy: Vec<String>,
    /// Cache sizes in blocks, comma-separated (with --mrc: default 20 sizes
    /// spread on a log scale up to the trace's unique blocks).
    #[arg(long, value_delimiter = ',', value_name = "N[,N...]")]
    pub cache_blocks: Vec<u64>,
    /// Miss-ratio curves in one pass per policy (exact for lru, sampled
    /// miniature simulations for the others), written to DIR/mrc.csv and
    /// DIR/mrc.png.
    #[arg(long, requires = "out")]
    pub mrc: bool,
    /// Where --mrc writes mrc.csv and mrc.png.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// With --mrc: how many sizes when --cache-blocks is not given.
    #[arg(long, default_value_t = 20)]
    pub points: usize,
    /// With --mrc: smallest miniature cache, in blocks; sizes below it are
    /// simulated in full. Larger is more exact and slower.
    #[arg(long, default_value_t = 131072)]
    pub sample_min: u64,
    /// Block size in bytes; each request touches blocks off/bs ..= (off+len-1)/bs.
    #[arg(long, default_value_t = 4096)]
    pub block_size: u64,
    /// Ignore writes.
    #[arg(long)]
    pub reads_only: bool,
    /// One JSON object per (policy, size) line.
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: &SimArgs) -> Result<()> {
    if a.block_size == 0 {
        bail!("--block-size must be positive");
    }
    for p in &a.policy {
        if !POLICY_NAMES.contains(&p.as_str()) {
            bail!("unknown policy {p:?}; choose from {}", POLICY_NAMES.join(", "));
        }
    }
    let requests = read_trace(&a.trace).with_context(|| format!("loading {}", a.trace.display()))?;
    let accesses = expand(&requests, a.block_size, a.reads_only);
    if a.mrc {
        return crate::mrccmd::run(a, &accesses);
    }
    if a.cache_blocks.is_empty() {
        bail!("give --cache-blocks N[,N...] (or --mrc for a whole curve)");
    }
    if !a.json {
        println!("{:<10} {:>12} {:>12} {:>12} {:>9}", "policy", "cache_blocks", "requests", "hits", "hit%");
    }
    for &size in &a.cache_blocks {
        for p in &a.policy {
            let mut policy = by_name(p, size).context("policy names were checked")?;
            let r = replay(policy.as_mut(), size, &accesses);
            if a.json {
                println!("{}", serde_json::to_string(&r)?);
            } else {
                println!(
                    "{:<10} {:>12} {:>12} {:>12} {:>8.2}%",
                    p,
                    size,
                    r.requests,
                    r.hits,
                    100.0 * r.hit_ratio
                );
            }
        }
    }
    Ok(())
}
