//! `arcache sim`: trace replay through the policy core.

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use arc_policy::{by_name, serving, InBlocks, Policy, POLICY_NAMES, SERVING_POLICIES};
use arcache_sim::{
    expand, expand_as_server, has_timestamps, read_trace, replay, replay_as_server, replay_l2, respace,
    SimResult, DEFAULT_SPACING_US,
};

use crate::size::parse_size;
use crate::tunables::Tunables;
use clap::Args;

#[derive(Debug, Args)]
pub struct SimArgs {
    /// A block trace: the CSV form `timestamp_us,op,offset_bytes,length_bytes[,dev]`, the ARC paper's
    /// `.lis` (512-byte blocks) or libCacheSim's `*.oracleGeneral*` binary; plain, .gz or .zst.
    #[arg(long, value_name = "FILE", required_unless_present = "list_policies")]
    pub trace: Option<PathBuf>,
    /// Policies to compare, comma-separated: default (exactly what `arcache serve` runs by default:
    /// its policy in bytes, --block-size bytes a block, its default zfs_arc_min and
    /// zfs_arc_min_prefetch_ms), arc (OpenZFS-style), arc-paper (FAST'03), lru, s3fifo (SOSP'23),
    /// 2q (VLDB'94), sieve (NSDI'24), arc-adaptive (an ARC whose lists decide like S3-FIFO,
    /// its MRU share picked by miniature simulations). --list-policies prints them.
    #[arg(long, value_delimiter = ',', default_value = "default,arc,arc-paper,lru")]
    pub policy: Vec<String>,
    /// Print every policy name --policy accepts, and exit.
    #[arg(long)]
    pub list_policies: bool,
    /// Re-time the trace with requests this many µs apart. A trace without
    /// time of its own (`.lis`, or timestamps that are its line numbers, as
    /// in the ARC paper's and w106's CSVs) gets 1000 µs unless this is set;
    /// a trace with timestamps keeps them unless this is set.
    #[arg(long, value_name = "US")]
    pub request_spacing_us: Option<u64>,
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
    /// Replay writes as `arcache serve` meets them and count only reads: a
    /// write is never looked up; it stores each block it covers whole,
    /// patches a block it covers in part where it is if cached (as the
    /// server patches a plain record; a compressed one it stores again,
    /// which this does not model), and drops it if not. Without this every
    /// access, write or read, is looked up and counted, as libCacheSim and
    /// the reference figures count. Blocks of a recorded trace (its `dev`
    /// is the export, below 4096) are keyed as the server keys records, so
    /// with `--block-size` equal to the exports' recordsize the default
    /// policy samples the records the server sampled.
    #[arg(long, conflicts_with_all = ["reads_only", "mrc", "l2_size"])]
    pub writes_as_server: bool,
    /// One JSON object per (policy, size) line.
    #[arg(long)]
    pub json: bool,
}

/// The name that replays what `arcache serve` runs by default.
pub const DEFAULT: &str = "default";

/// Every name `--policy` accepts.
pub fn policy_names() -> Vec<&'static str> {
    std::iter::once(DEFAULT).chain(POLICY_NAMES.iter().copied()).collect()
}

/// The server's default ARC limits for a cache of `c_max` bytes, as
/// `arcache serve --arc-max` would set them (tunables.rs): zfs_arc_min
/// keeps this machine's default unless that exceeds the new maximum,
/// which pulls it down to half.
fn serve_limits(c_max: u64) -> (u64, u64) {
    let t = Tunables::defaults();
    let c_min = t.value("zfs_arc_min");
    let c_min = if c_min > c_max { c_max / 2 } else { c_min };
    (c_min, t.value("zfs_arc_min_prefetch_ms").saturating_mul(1_000_000))
}

/// A policy for `blocks` blocks of `block_bytes`, by its `--policy` name.
pub fn build(name: &str, blocks: u64, block_bytes: u64) -> Option<Box<dyn Policy>> {
    if name != DEFAULT {
        return by_name(name, blocks);
    }
    let c_max = blocks.saturating_mul(block_bytes);
    let (c_min, prefetch_ns) = serve_limits(c_max);
    let inner = serving(SERVING_POLICIES[0], c_min, c_max, prefetch_ns)?;
    Some(Box::new(InBlocks::new(inner, block_bytes)))
}

pub fn run(a: &SimArgs) -> Result<()> {
    if a.list_policies {
        println!("{}", policy_names().join("\n"));
        return Ok(());
    }
    if a.block_size == 0 {
        bail!("--block-size must be positive");
    }
    for p in &a.policy {
        if !policy_names().contains(&p.as_str()) {
            bail!("unknown policy {p:?}; choose from {}", policy_names().join(", "));
        }
    }
    if a.policy.iter().any(|p| p == DEFAULT) {
        let (c_min, ns) = serve_limits(u64::MAX);
        eprintln!(
            "default: {} as `arcache serve` runs it: sizes in bytes ({} a block), zfs_arc_min {} \
             (half the cache if that is smaller), zfs_arc_min_prefetch_ms {}",
            SERVING_POLICIES[0],
            a.block_size,
            c_min,
            ns / 1_000_000
        );
    }
    let trace = a.trace.as_ref().context("give --trace FILE")?;
    let mut requests = read_trace(trace).with_context(|| format!("loading {}", trace.display()))?;
    match a.request_spacing_us {
        Some(us) => respace(&mut requests, us),
        None if !has_timestamps(&requests) => {
            eprintln!(
                "{}: no timestamps; replaying requests {DEFAULT_SPACING_US} µs apart (--request-spacing-us)",
                trace.display()
            );
            respace(&mut requests, DEFAULT_SPACING_US);
        }
        None => {}
    }
    if a.cache_blocks.is_empty() && !a.mrc {
        bail!("give --cache-blocks N[,N...] (or --mrc for a whole curve)");
    }
    if a.writes_as_server {
        let accesses = expand_as_server(&requests, a.block_size);
        return plain_runs(a, |policy, size| replay_as_server(policy, size, &accesses));
    }
    let accesses = expand(&requests, a.block_size, a.reads_only);
    if a.mrc {
        return crate::mrccmd::run(a, &accesses);
    }
    match &a.l2_size {
        Some(l2) => {
            let (l2_blocks, feed) =
                (parse_size(l2)? / a.block_size, parse_size(&a.l2_feed_rate)? / a.block_size);
            let header = format!(
                "{:<10} {:>12} {:>12} {:>9} {:>9} {:>9} {:>12}",
                "policy", "cache_blocks", "l2_blocks", "arc_hit%", "l2_hit%", "miss%", "feed_skip"
            );
            each_run(a, &header, |policy, shown, size| {
                let mut r = replay_l2(policy, size, l2_blocks, feed, &accesses);
                r.policy = shown.to_string();
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
        None => plain_runs(a, |policy, size| replay(policy, size, &accesses)),
    }
}

/// Runs `replay_one` for every (size, policy) and prints its hits.
fn plain_runs(a: &SimArgs, replay_one: impl Fn(&mut dyn Policy, u64) -> SimResult) -> Result<()> {
    let header =
        format!("{:<10} {:>12} {:>12} {:>12} {:>9}", "policy", "cache_blocks", "requests", "hits", "hit%");
    each_run(a, &header, |policy, shown, size| {
        let mut r = replay_one(policy, size);
        r.policy = shown.to_string();
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

/// Runs `one` for every (size, policy) and prints its JSON or its table
/// line under `header`.
fn each_run(
    a: &SimArgs,
    header: &str,
    mut one: impl FnMut(&mut dyn Policy, &str, u64) -> Result<(String, String)>,
) -> Result<()> {
    if !a.json {
        println!("{header}");
    }
    for &size in &a.cache_blocks {
        for p in &a.policy {
            let mut policy = build(p, size, a.block_size).context("policy names were checked")?;
            // "default" is shown with what it resolved to, so a table says what ran.
            let shown = if p == DEFAULT { format!("{DEFAULT}:{}", policy.name()) } else { p.clone() };
            let (json, line) = one(policy.as_mut(), &shown, size)?;
            println!("{}", if a.json { json } else { line });
        }
    }
    Ok(())
}
