//! `arcache sim`: trace replay through the policy core.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use arc_policy::{by_name, POLICY_NAMES};
use arcache_sim::{expand, read_trace, replay, replay_l2};

use crate::size::parse_size;
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
    /// Model an L2 of this size (K/M/G suffixes) behind the ARC, fed from
    /// blocks leaving it at --l2-feed-rate; reports ARC hits, L2 hits and misses.
    #[arg(long, value_name = "SIZE")]
    pub l2_size: Option<String>,
    /// The L2 feed rate limit in bytes per second of trace time (like
    /// l2arc_write_max; default 32M, OpenZFS 2.2.7-2.4). 0: unlimited.
    #[arg(long, value_name = "BYTES", default_value = "32M")]
    pub l2_feed_rate: String,
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
    match &a.l2_size {
        Some(l2) => {
            let (l2_blocks, feed) =
                (parse_size(l2)? / a.block_size, parse_size(&a.l2_feed_rate)? / a.block_size);
            let header = format!(
                "{:<10} {:>12} {:>12} {:>9} {:>9} {:>9} {:>12}",
                "policy", "cache_blocks", "l2_blocks", "arc_hit%", "l2_hit%", "miss%", "feed_skip"
            );
            each_run(a, &header, |policy, size| {
                let r = replay_l2(policy, size, l2_blocks, feed, &accesses);
                let line = format!(
                    "{:<10} {:>12} {:>12} {:>8.2}% {:>8.2}% {:>8.2}% {:>12}",
                    r.policy,
                    size,
                    l2_blocks,
                    100.0 * r.arc_hit_ratio,
                    100.0 * r.l2_hit_ratio,
                    100.0 * r.miss_ratio,
                    r.feed_skipped
                );
                Ok((serde_json::to_string(&r)?, line))
            })
        }
        None => {
            let header = format!(
                "{:<10} {:>12} {:>12} {:>12} {:>9}",
                "policy", "cache_blocks", "requests", "hits", "hit%"
            );
            each_run(a, &header, |policy, size| {
                let r = replay(policy, size, &accesses);
                let line = format!(
                    "{:<10} {:>12} {:>12} {:>12} {:>8.2}%",
                    r.policy,
                    size,
                    r.requests,
                    r.hits,
                    100.0 * r.hit_ratio
                );
                Ok((serde_json::to_string(&r)?, line))
            })
        }
    }
}

/// Runs `one` for every (size, policy) and prints its JSON or its table
/// line under `header`.
fn each_run(
    a: &SimArgs,
    header: &str,
    mut one: impl FnMut(&mut dyn arc_policy::Policy, u64) -> Result<(String, String)>,
) -> Result<()> {
    if !a.json {
        println!("{header}");
    }
    for &size in &a.cache_blocks {
        for p in &a.policy {
            let mut policy = by_name(p, size).context("policy names were checked")?;
            let (json, line) = one(policy.as_mut(), size)?;
            println!("{}", if a.json { json } else { line });
        }
    }
    Ok(())
}
