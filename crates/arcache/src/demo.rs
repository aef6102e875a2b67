//! `arcache demo`: builds a slow "HDD array" in a temporary file, serves it
//! through arcache, reads through a real NBD connection twice (cold, then
//! warm) and shows what the cache bought. Needs no arguments and cleans up.

use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use blockdev::{BlockDev, FileDev, FileDevOptions, SlowDev, SlowDevConfig};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use nbd::{Client, ServerConfig, Target};
use rand::{rngs::StdRng, Rng, SeedableRng};
use serde::Serialize;

use crate::config::{ExportSpec, Listen, ServeSettings};
use crate::serve::{start_on, Running};
use crate::size::human;
use crate::tunables::Tunables;

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// A smaller, faster run (for tests).
    #[arg(long)]
    pub quick: bool,
    /// Print the results as one JSON object at the end.
    #[arg(long)]
    pub json: bool,
    /// Hide the progress bars.
    #[arg(long)]
    pub no_progress: bool,
}

struct Plan {
    disk: u64,
    file: u64,
    io: usize,
    working_set: u64,
    random_reads: usize,
    clients: usize,
    slow: SlowDevConfig,
}

impl Plan {
    fn new(quick: bool) -> Plan {
        let slow = SlowDevConfig { latency: Duration::from_millis(5), parallelism: 4, bandwidth: 120 << 20 };
        if quick {
            Plan {
                disk: 48 << 20,
                file: 16 << 20,
                io: 1 << 20,
                working_set: 4 << 20,
                random_reads: 400,
                clients: 8,
                slow,
            }
        } else {
            Plan {
                disk: 192 << 20,
                file: 96 << 20,
                io: 1 << 20,
                working_set: 16 << 20,
                random_reads: 2000,
                clients: 8,
                slow,
            }
        }
    }
}

#[derive(Debug, Serialize, Clone, Copy)]
struct Pass {
    seconds: f64,
    bytes: u64,
    requests: u64,
    mb_per_s: f64,
    iops: f64,
    hit_ratio: f64,
}

#[derive(Debug, Serialize)]
struct DemoResult {
    sequential_cold: Pass,
    sequential_warm: Pass,
    random_cold: Pass,
    random_warm: Pass,
    sequential_speedup: f64,
    random_speedup: f64,
}

fn bar(show: bool, len: u64, msg: &str, bytes: bool) -> ProgressBar {
    if !show {
        return ProgressBar::hidden();
    }
    let tpl = if bytes {
        "{msg:32} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec}"
    } else {
        "{msg:32} [{bar:30}] {pos}/{len} {per_sec}"
    };
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template(tpl)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb.set_message(msg.to_string());
    pb
}

/// Fills the image with incompressible, position-dependent bytes.
fn make_image(path: &std::path::Path, size: u64, show: bool) -> Result<()> {
    let mut f = std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let pb = bar(show, size, "writing the disk image", true);
    let mut rng = StdRng::seed_from_u64(0xA4C);
    let mut buf = vec![0u8; 1 << 20];
    let mut done = 0;
    while done < size {
        rng.fill(&mut buf[..]);
        let n = (size - done).min(buf.len() as u64) as usize;
        f.write_all(&buf[..n])?;
        done += n as u64;
        pb.inc(n as u64);
    }
    f.sync_all()?;
    pb.finish_and_clear();
    Ok(())
}

/// The share of the client's own record reads served from RAM (prefetch
/// reads the cache made on its own are not the client's).
fn hit_ratio(r: &Running, before: &arcache_engine::ArcStats) -> f64 {
    let s = r.cache.stats();
    let hits =
        (s.demand_data_hits + s.demand_data_iohits) - (before.demand_data_hits + before.demand_data_iohits);
    let all = hits + s.demand_data_misses - before.demand_data_misses;
    if all == 0 {
        0.0
    } else {
        hits as f64 / all as f64
    }
}

fn sequential(r: &Running, target: &Target, plan: &Plan, label: &str, show: bool) -> Result<Pass> {
    let before = r.cache.stats();
    let mut c = Client::connect(target, "").context("connecting to the demo server")?;
    let pb = bar(show, plan.file, label, true);
    let mut buf = vec![0u8; plan.io];
    let t0 = Instant::now();
    let mut off = 0;
    let mut n = 0;
    while off < plan.file {
        c.read(off, &mut buf)?;
        off += plan.io as u64;
        n += 1;
        pb.inc(plan.io as u64);
    }
    let secs = t0.elapsed().as_secs_f64();
    pb.finish_and_clear();
    c.disconnect()?;
    Ok(Pass {
        seconds: secs,
        bytes: plan.file,
        requests: n,
        mb_per_s: plan.file as f64 / secs / 1e6,
        iops: n as f64 / secs,
        hit_ratio: hit_ratio(r, &before),
    })
}

fn random(r: &Running, target: &Target, plan: &Plan, label: &str, show: bool) -> Result<Pass> {
    let before = r.cache.stats();
    let base = plan.disk - plan.working_set;
    let pb = bar(show, plan.random_reads as u64, label, false);
    let per_client = plan.random_reads / plan.clients;
    let t0 = Instant::now();
    std::thread::scope(|s| -> Result<()> {
        let mut handles = Vec::new();
        for i in 0..plan.clients {
            let pb = pb.clone();
            handles.push(s.spawn(move || -> Result<()> {
                let mut c = Client::connect(target, "")?;
                // The same seed each pass: the warm pass re-reads the cold pass's blocks.
                let mut rng = StdRng::seed_from_u64(i as u64);
                let mut buf = [0u8; 4096];
                for _ in 0..per_client {
                    let off = base + rng.gen_range(0..plan.working_set / 4096) * 4096;
                    c.read(off, &mut buf)?;
                    pb.inc(1);
                }
                c.disconnect()?;
                Ok(())
            }));
        }
        for h in handles {
            h.join().map_err(|_| anyhow::anyhow!("a demo client panicked"))??;
        }
        Ok(())
    })?;
    let secs = t0.elapsed().as_secs_f64();
    pb.finish_and_clear();
    let n = (per_client * plan.clients) as u64;
    Ok(Pass {
        seconds: secs,
        bytes: n * 4096,
        requests: n,
        mb_per_s: (n * 4096) as f64 / secs / 1e6,
        iops: n as f64 / secs,
        hit_ratio: hit_ratio(r, &before),
    })
}

pub fn run(a: &DemoArgs) -> Result<()> {
    let plan = Plan::new(a.quick);
    let show = !a.no_progress && !a.json;
    let dir = tempfile::Builder::new()
        .prefix("arcache-demo-")
        .tempdir()
        .context("creating a temporary directory")?;
    let image = dir.path().join("hdd-array.img");
    if !a.json {
        println!(
            "arcache demo: a simulated HDD array of {} ({} spindles, {} ms per request, {}/s in all)",
            human(plan.disk),
            plan.slow.parallelism,
            plan.slow.latency.as_millis(),
            human(plan.slow.bandwidth)
        );
    }
    make_image(&image, plan.disk, show)?;
    let file = FileDev::open(&image, FileDevOptions::default())?;
    let slow: Arc<dyn BlockDev> = Arc::new(SlowDev::new(file, plan.slow));
    let sock = dir.path().join("nbd.sock");
    let mut tunables = Tunables::defaults();
    tunables.set("zfs_arc_max", plan.disk * 2)?;
    tunables.set("zfs_arc_min", plan.disk)?;
    let arc_max = tunables.value("zfs_arc_max");
    let export =
        ExportSpec { read_only: true, ..ExportSpec::plain(String::new(), image.display().to_string()) };
    let settings =
        ServeSettings::in_dir(vec![export], vec![Listen::Unix(sock.clone())], dir.path(), tunables);
    let running = start_on(&settings, vec![slow], ServerConfig::default(), false)?;
    if !a.json {
        println!("serving it at {} through a RAM ARC of up to {}\n", running.uris[0], human(arc_max));
    }
    let target = Target::Unix(sock);
    let seq_label = format!("sequential {} file", human(plan.file));
    let sc = sequential(&running, &target, &plan, &format!("{seq_label}, cold"), show)?;
    let sw = sequential(&running, &target, &plan, &format!("{seq_label}, warm"), show)?;
    let rnd_label = format!("random 4K in {}", human(plan.working_set));
    let rc = random(&running, &target, &plan, &format!("{rnd_label}, cold"), show)?;
    let rw = random(&running, &target, &plan, &format!("{rnd_label}, warm"), show)?;
    running.stop()?;
    let result = DemoResult {
        sequential_cold: sc,
        sequential_warm: sw,
        random_cold: rc,
        random_warm: rw,
        sequential_speedup: sw.mb_per_s / sc.mb_per_s,
        random_speedup: rw.iops / rc.iops,
    };
    if a.json {
        println!("{}", serde_json::to_string(&result)?);
    } else {
        print_table(&result, &plan);
    }
    Ok(())
}

fn print_table(r: &DemoResult, plan: &Plan) {
    println!("{:<34} {:>12} {:>12} {:>9}", "", "cold (disk)", "warm (ARC)", "speed-up");
    println!(
        "{:<34} {:>9.1} MB/s {:>7.1} MB/s {:>8.1}x",
        format!("sequential read, {} file", human(plan.file)),
        r.sequential_cold.mb_per_s,
        r.sequential_warm.mb_per_s,
        r.sequential_speedup
    );
    println!(
        "{:<34} {:>9.0} IOPS {:>7.0} IOPS {:>8.1}x",
        format!("random 4K read, {} clients", plan.clients),
        r.random_cold.iops,
        r.random_warm.iops,
        r.random_speedup
    );
    println!(
        "{:<34} {:>11.1}% {:>11.1}%",
        "ARC hit ratio (sequential)",
        100.0 * r.sequential_cold.hit_ratio,
        100.0 * r.sequential_warm.hit_ratio
    );
    println!(
        "{:<34} {:>11.1}% {:>11.1}%",
        "ARC hit ratio (random)",
        100.0 * r.random_cold.hit_ratio,
        100.0 * r.random_warm.hit_ratio
    );
    println!("\nThe second read of a warm working set comes from RAM instead of the disks.");
}
