//! `arcache serve --metrics HOST:PORT`: the statistics in Prometheus text
//! format (version 0.0.4) over a minimal HTTP/1.1 endpoint, `GET /metrics`.
//!
//! Every numeric field of `arcache stat --json` becomes `arcache_<field>`;
//! counters (everything not listed in [`GAUGES`]) get the `_total` suffix.
//! L2 devices and exports become labelled series. Names are documented in
//! docs/metrics.md.

use std::fmt::Write as _;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use nbd::Listeners;
use serde_json::Value;
use tracing::{info, warn};

/// Top-level stat fields that are levels, not running counts.
pub const GAUGES: &[&str] = &[
    "c",
    "c_min",
    "c_max",
    "pd",
    "meta",
    "size",
    "data_size",
    "metadata_size",
    "arc_meta_used",
    "arc_meta_max",
    "dnode_size",
    "arc_dnode_limit",
    "fileview_nodes",
    "fileview_objects",
    "fileview_watched_dirs",
    "hdr_size",
    "anon_size",
    "mru_size",
    "mfu_size",
    "mru_ghost_size",
    "mfu_ghost_size",
    "hash_elements",
    "compressed_size",
    "uncompressed_size",
    "l2_ndev",
    "l2_ndev_healthy",
    "l2_size",
    "l2_asize",
    "l2_records",
    "l2_hdr_size",
    "l2_hdr_bytes_per_record",
    "l2_log_blk_asize",
    "l2_log_blk_avg_asize",
    "l2_log_blk_count",
    "l2_log_uncommitted_bytes",
    "l2_rebuild_running",
    "l2_feed_budget",
    "l2_feed_prefetch",
    "l2_device_write_bw",
    "zfetch_max_streams",
    "zfetch_io_active",
    "backing_read_bw",
    "exports",
    "uptime_secs",
    "nbd_active_connections",
    "dirty_bytes",
    "dirty_max",
    "txg_open",
    "txg_syncing",
    "txg_synced",
    "txg_age_ms",
    "txg_last_sync_ms",
    "zil_present",
    "zil_degraded",
    "zil_commit_us",
    "zil_log_used",
    "zil_log_capacity",
    "zil_replay_records",
    "zil_replay_bytes",
    "l2_rebuild_ms",
    "l2_rebuild_success",
];

/// Per-device fields that are levels.
const DEVICE_GAUGES: &[&str] = &["capacity", "hand", "wrapped", "persistent", "rebuilding"];
/// Per-export fields that are levels.
const EXPORT_GAUGES: &[&str] = &["size", "read_only"];

fn is_gauge(list: &[&str], name: &str) -> bool {
    list.contains(&name)
}

fn number(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::Bool(b) => Some(if *b { 1.0 } else { 0.0 }),
        _ => None,
    }
}

/// Label values escaped as the text format requires.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

struct Family {
    name: String,
    kind: &'static str,
    help: String,
    samples: Vec<(String, f64)>,
}

fn family(prefix: &str, field: &str, gauge: bool, help: String) -> Family {
    let mut name = format!("{prefix}{field}");
    if !gauge {
        name.push_str("_total");
    }
    Family { name, kind: if gauge { "gauge" } else { "counter" }, help, samples: Vec::new() }
}

/// The exposition text for one `stat --json` object.
pub fn render(stat: &Value) -> String {
    let mut families: Vec<Family> = Vec::new();
    if let Some(obj) = stat.as_object() {
        for (k, v) in obj {
            if let Some(x) = number(v) {
                let gauge = is_gauge(GAUGES, k);
                let mut f = family(
                    "arcache_",
                    k,
                    gauge,
                    format!("arcache stat field {k} (docs/tunables-and-stats.md)"),
                );
                f.samples.push((String::new(), x));
                families.push(f);
            }
        }
        labelled(&mut families, obj.get("l2_devices"), "arcache_l2_device_", "device", "path", DEVICE_GAUGES);
        labelled(&mut families, obj.get("export_stats"), "arcache_export_", "export", "name", EXPORT_GAUGES);
        states(&mut families, obj);
    }
    let mut out = String::new();
    for f in families {
        let _ = writeln!(out, "# HELP {} {}", f.name, f.help);
        let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind);
        for (labels, x) in f.samples {
            let _ = writeln!(out, "{}{} {}", f.name, labels, x);
        }
    }
    out
}

/// One labelled series per object of an array (devices, exports).
fn labelled(out: &mut Vec<Family>, arr: Option<&Value>, prefix: &str, key: &str, id: &str, gauges: &[&str]) {
    let Some(items) = arr.and_then(Value::as_array) else { return };
    for item in items {
        let Some(obj) = item.as_object() else { continue };
        let who = obj.get(id).and_then(Value::as_str).unwrap_or("");
        let labels = format!("{{{key}=\"{}\"}}", label(who));
        for (k, v) in obj {
            let Some(x) = number(v) else { continue };
            let gauge = is_gauge(gauges, k);
            let name = format!("{prefix}{k}{}", if gauge { "" } else { "_total" });
            match out.iter_mut().find(|f| f.name == name) {
                Some(f) => f.samples.push((labels.clone(), x)),
                None => {
                    let mut f = family(prefix, k, gauge, format!("per-{key} field {k} of arcache stat"));
                    f.samples.push((labels.clone(), x));
                    out.push(f);
                }
            }
        }
    }
}

/// Text states as 0/1 gauges: device health, export sync mode.
fn states(out: &mut Vec<Family>, obj: &serde_json::Map<String, Value>) {
    let mut online =
        family("arcache_", "l2_device_online", true, "1 when the L2 device is in service".into());
    for d in obj.get("l2_devices").and_then(Value::as_array).into_iter().flatten() {
        let path = d.get("path").and_then(Value::as_str).unwrap_or("");
        let up = d.get("state").and_then(Value::as_str) == Some("ONLINE");
        online.samples.push((format!("{{device=\"{}\"}}", label(path)), if up { 1.0 } else { 0.0 }));
    }
    let mut sync = family("arcache_", "export_sync", true, "1 for the export's sync mode".into());
    for e in obj.get("export_stats").and_then(Value::as_array).into_iter().flatten() {
        let name = e.get("name").and_then(Value::as_str).unwrap_or("");
        let mode = e.get("sync").and_then(Value::as_str).unwrap_or("");
        sync.samples.push((format!("{{export=\"{}\",mode=\"{}\"}}", label(name), label(mode)), 1.0));
    }
    out.extend([online, sync].into_iter().filter(|f| !f.samples.is_empty()));
}

/// Serves `GET /metrics` on `addr` from a background thread until
/// `stop.close_all()`; returns the bound address. `source` produces the
/// stat object per scrape.
pub fn serve(
    addr: &str,
    source: Arc<dyn Fn() -> Result<Value> + Send + Sync>,
    stop: &Arc<Listeners>,
) -> Result<SocketAddr> {
    let listener = TcpListener::bind(addr).with_context(|| format!("binding metrics {addr}"))?;
    stop.keep(listener.try_clone().with_context(|| format!("keeping metrics {addr}"))?.into());
    let stop = Arc::clone(stop);
    let local = listener.local_addr()?;
    if !local.ip().is_loopback() {
        warn!("metrics on {local} are reachable from other hosts");
    }
    info!("metrics at http://{local}/metrics");
    std::thread::Builder::new().name("metrics".into()).spawn(move || {
        for stream in listener.incoming() {
            if stop.closed() {
                break;
            }
            let Ok(stream) = stream else { continue };
            let src = Arc::clone(&source);
            // One scrape at a time is plenty; a slow client only delays scrapes.
            if let Err(e) = answer(stream, src.as_ref()) {
                warn!("metrics request: {e:#}");
            }
        }
    })?;
    Ok(local)
}

fn answer(mut s: TcpStream, source: &(dyn Fn() -> Result<Value> + Send + Sync)) -> Result<()> {
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut req = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    while !req.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut buf)?;
        if n == 0 || req.len() > 16 << 10 {
            break;
        }
        req.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&req);
    let first = line.lines().next().unwrap_or("");
    let mut parts = first.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (status, ctype, body) = if method == "GET" && (path == "/metrics" || path.starts_with("/metrics?")) {
        match source() {
            Ok(v) => ("200 OK", "text/plain; version=0.0.4; charset=utf-8", render(&v)),
            Err(e) => ("500 Internal Server Error", "text/plain", format!("{e:#}\n")),
        }
    } else {
        ("404 Not Found", "text/plain", "arcache serves GET /metrics\n".to_string())
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes())?;
    s.write_all(body.as_bytes())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_gauges_and_labels() {
        let v = serde_json::json!({
            "hits": 5, "size": 100, "uptime_secs": 1.5,
            "l2_devices": [{"path": "/a\"b", "state": "ONLINE", "reads": 3, "capacity": 9}],
            "export_stats": [{"name": "vm", "sync": "always", "reads": 2, "size": 7}],
            "sync": {"vm": "always"}
        });
        let t = render(&v);
        assert!(t.contains("# TYPE arcache_hits_total counter\narcache_hits_total 5\n"), "{t}");
        assert!(t.contains("# TYPE arcache_size gauge\narcache_size 100\n"), "{t}");
        assert!(t.contains("arcache_l2_device_reads_total{device=\"/a\\\"b\"} 3"), "{t}");
        assert!(t.contains("arcache_l2_device_capacity{device=\"/a\\\"b\"} 9"), "{t}");
        assert!(t.contains("arcache_export_reads_total{export=\"vm\"} 2"), "{t}");
        assert!(t.contains("arcache_export_sync{export=\"vm\",mode=\"always\"} 1"), "{t}");
        assert!(t.contains("arcache_l2_device_online{device=\"/a\\\"b\"} 1"), "{t}");
    }
}
