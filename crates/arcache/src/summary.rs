//! `arcache summary`: an arc_summary-like report of a running server.

use anyhow::{Context, Result};
use clap::Args;
use serde_json::Value;

use crate::control::{call, Request};
use crate::size::human;
use crate::ControlArg;

#[derive(Debug, Args)]
pub struct SummaryArgs {
    #[command(flatten)]
    pub control: ControlArg,
}

fn n(v: &Value, k: &str) -> u64 {
    v.get(k).and_then(Value::as_u64).unwrap_or(0)
}

fn pct(part: u64, all: u64) -> String {
    if all == 0 {
        "n/a".into()
    } else {
        format!("{:.1} %", 100.0 * part as f64 / all as f64)
    }
}

fn row(label: &str, value: impl std::fmt::Display) {
    println!("    {label:<40} {value:>16}");
}

pub fn run(a: &SummaryArgs) -> Result<()> {
    let path = a.control.path();
    let s = call(&path, &Request::Stat)?;
    let tunables = call(&path, &Request::GetAll)?;
    print_arc(&s);
    print_hits(&s);
    print_l2(&s);
    print_prefetch(&s);
    print_writes(&s);
    print_sizing(&s);
    print_tunables(tunables.as_array().context("tunables are a list")?);
    Ok(())
}

fn print_arc(s: &Value) {
    println!("ARC size");
    row("Current size", format!("{} ({})", human(n(s, "size")), pct(n(s, "size"), n(s, "c_max"))));
    row("Target size (c)", human(n(s, "c")));
    row("Min / max size", format!("{} / {}", human(n(s, "c_min")), human(n(s, "c_max"))));
    row("MRU size", human(n(s, "mru_size")));
    row("MFU size", human(n(s, "mfu_size")));
    row(
        "MRU ghost / MFU ghost",
        format!("{} / {}", human(n(s, "mru_ghost_size")), human(n(s, "mfu_ghost_size"))),
    );
    row("MRU target share (pd)", pct(n(s, "pd"), 1 << 32));
    row("Metadata target share (meta)", pct(n(s, "meta"), 1 << 32));
    row("Record headers", human(n(s, "hdr_size")));
    let (c, u) = (n(s, "compressed_size"), n(s, "uncompressed_size"));
    let ratio = if c == 0 { "n/a".to_string() } else { format!("{:.2}:1", u as f64 / c as f64) };
    row("Compression ratio", ratio);
    println!();
}

fn print_hits(s: &Value) {
    let reads = n(s, "hits") + n(s, "iohits") + n(s, "misses");
    let dreads = n(s, "demand_data_hits") + n(s, "demand_data_iohits") + n(s, "demand_data_misses");
    let preads = n(s, "prefetch_data_hits") + n(s, "prefetch_data_iohits") + n(s, "prefetch_data_misses");
    println!("ARC hits and misses");
    row("Record reads", reads);
    row("Hit ratio", pct(n(s, "hits") + n(s, "iohits"), reads));
    row("Demand hit ratio", pct(n(s, "demand_data_hits") + n(s, "demand_data_iohits"), dreads));
    row("Prefetch hit ratio", pct(n(s, "prefetch_data_hits") + n(s, "prefetch_data_iohits"), preads));
    row("MRU hits / MFU hits", format!("{} / {}", n(s, "mru_hits"), n(s, "mfu_hits")));
    row(
        "MRU ghost hits / MFU ghost hits",
        format!("{} / {}", n(s, "mru_ghost_hits"), n(s, "mfu_ghost_hits")),
    );
    row("Demand hits on prefetched records", n(s, "demand_hit_predictive_prefetch"));
    row("Backing store errors", n(s, "backing_errors"));
    println!();
}

fn print_l2(s: &Value) {
    if n(s, "l2_ndev") == 0 && n(s, "l2_size") == 0 {
        return;
    }
    let errors = ["l2_cksum_bad", "l2_io_error", "l2_writes_error"].iter().map(|k| n(s, k)).sum::<u64>();
    let degraded = errors > 0 || n(s, "l2_ndev_healthy") < n(s, "l2_ndev");
    println!("L2ARC status: {}", if degraded { "DEGRADED" } else { "HEALTHY" });
    row("Devices (in service)", format!("{} ({})", n(s, "l2_ndev"), n(s, "l2_ndev_healthy")));
    row(
        "Bad checksums / IO errors / write errors",
        format!("{} / {} / {}", n(s, "l2_cksum_bad"), n(s, "l2_io_error"), n(s, "l2_writes_error")),
    );
    row("Size (logical)", human(n(s, "l2_size")));
    row("Size (on devices)", human(n(s, "l2_asize")));
    let records = n(s, "l2_records");
    let per = if records == 0 {
        "n/a".into()
    } else {
        format!("{:.1} B/record", n(s, "l2_hdr_size") as f64 / records as f64)
    };
    row("Header RAM", format!("{} ({per})", human(n(s, "l2_hdr_size"))));
    row("Hit ratio", pct(n(s, "l2_hits"), n(s, "l2_hits") + n(s, "l2_misses")));
    row("Read / written", format!("{} / {}", human(n(s, "l2_read_bytes")), human(n(s, "l2_write_bytes"))));
    row("Evicted by the write hand", n(s, "l2_evict_hand"));
    row(
        "Feed: prefetched records fed (key ratio 2)",
        if n(s, "l2_feed_prefetch") == 1 { "yes" } else { "no" },
    );
    row("Feed: eligible bytes evicted unfed", human(n(s, "evict_l2_eligible")));
    row("Feed: cycles skipped for the header cap", n(s, "l2_abort_lowmem"));
    let rebuild = match (n(s, "l2_rebuild_running"), n(s, "l2_rebuild_success")) {
        (1, _) => "running",
        (_, 0) => "none",
        _ => "done",
    };
    row("Rebuild at start", rebuild);
    row(
        "Rebuild: records restored / log blocks / ms",
        format!("{} / {} / {}", n(s, "l2_rebuild_bufs"), n(s, "l2_rebuild_log_blks"), n(s, "l2_rebuild_ms")),
    );
    if let Some(devs) = s.get("l2_devices").and_then(Value::as_array) {
        for d in devs {
            let path = d.get("path").and_then(Value::as_str).unwrap_or("?");
            let state = d.get("state").and_then(Value::as_str).unwrap_or("?");
            row(&format!("  {path}"), state);
        }
    }
    println!();
}

fn print_prefetch(s: &Value) {
    println!("Prefetch (zfetch)");
    let total = ["zfetch_hits", "zfetch_future", "zfetch_stride", "zfetch_past", "zfetch_misses"]
        .iter()
        .map(|k| n(s, k))
        .sum::<u64>();
    row("Stream hit ratio", pct(n(s, "zfetch_hits") + n(s, "zfetch_stride"), total));
    row(
        "Prefetch reads issued / in flight",
        format!("{} / {}", n(s, "zfetch_io_issued"), n(s, "zfetch_io_active")),
    );
    println!();
}

fn print_writes(s: &Value) {
    let log = match (n(s, "zil_present"), n(s, "zil_degraded")) {
        (0, _) => "none (FLUSH writes in place)",
        (_, 0) => "ONLINE",
        _ => "DEGRADED (FLUSH falls back to txgs)",
    };
    println!("Writes: intent log {log}");
    row("Dirty data / limit", format!("{} / {}", human(n(s, "dirty_bytes")), human(n(s, "dirty_max"))));
    row("Open txg / age ms", format!("{} / {}", n(s, "txg_open"), n(s, "txg_age_ms")));
    row("Txgs synced / bytes", format!("{} / {}", n(s, "txg_syncs"), human(n(s, "txg_sync_bytes"))));
    row("Txg sync errors", n(s, "txg_sync_errors"));
    row(
        "FLUSHes / log commits",
        format!("{} / {}", n(s, "zil_commit_count"), n(s, "zil_commit_writer_count")),
    );
    row("Log IO per commit (us)", n(s, "zil_commit_us"));
    row(
        "Log used / capacity",
        format!("{} / {}", human(n(s, "zil_log_used")), human(n(s, "zil_log_capacity"))),
    );
    row("Replayed at start (entries)", n(s, "zil_replay_records"));
    row("Throttled writes / waits", format!("{} / {}", n(s, "throttle_delays"), n(s, "throttle_waits")));
    println!();
}

fn print_sizing(s: &Value) {
    let z = &s["sizing"];
    println!("Sizing (sampled live workload: LRU's curve and the serving policy's)");
    let f = |k: &str| z.get(k).and_then(Value::as_f64);
    let show = |x: Option<f64>, suffix: &str| x.map_or("n/a".to_string(), |v| format!("{v:.2}{suffix}"));
    row("Active data set", human(n(z, "active_bytes")));
    row("ARC + L2 capacity", human(n(z, "capacity_bytes")));
    row("Key ratio 1: active / (ARC + L2)", show(f("key_ratio_1"), "x"));
    row("Key ratio 2: L2 / backing speed", show(f("key_ratio_2"), "x"));
    row("Demand hit ratio now", show(f("demand_hit_ratio").map(|v| v * 100.0), "%"));
    row("If the ARC were twice as large", show(f("hit_ratio_if_arc_doubled").map(|v| v * 100.0), "%"));
    let policy = s["policy"].as_str().unwrap_or("policy");
    for (key, name) in [("lru_curve", "LRU"), ("policy_curve", policy)] {
        for p in z[key].as_array().into_iter().flatten() {
            let label = format!("{name} hit ratio at {}x capacity", p["of_capacity"]);
            row(&label, format!("{:.1}%", p["hit_ratio"].as_f64().unwrap_or(0.0) * 100.0));
        }
    }
    for a in z["advice"].as_array().into_iter().flatten() {
        println!("    * {}", a.as_str().unwrap_or(""));
    }
    println!();
}

fn print_tunables(rows: &[Value]) {
    println!("Tunables that differ from their defaults");
    let mut any = false;
    for r in rows {
        if r["value"] != r["default"] {
            any = true;
            row(r["name"].as_str().unwrap_or("?"), r["text"].as_str().unwrap_or("?"));
        }
    }
    if !any {
        println!("    (none)");
    }
}
