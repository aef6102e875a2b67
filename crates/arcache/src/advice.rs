//! Sizing advice from the live workload: seed 003's two key ratios (active
//! data set / (ARC + L2), and L2 speed / backing speed), the hit ratio the
//! ARC would reach if it were twice as large (ghost-list hits), and the
//! sampled LRU curve at multiples of the present capacity, turned into
//! plain sentences.

use arcache_engine::{SizingView, RECORD_OVERHEAD};
use serde_json::{json, Value};

use crate::size::human;

/// Multiples of the present ARC + L2 capacity the curve is shown at.
pub const MULTIPLES: [f64; 6] = [0.25, 0.5, 1.0, 2.0, 4.0, 8.0];

fn num(s: &Value, k: &str) -> f64 {
    s.get(k).and_then(Value::as_f64).unwrap_or(0.0)
}

/// Cache sizes, in records, at [`MULTIPLES`] of the capacity.
pub fn sizes(capacity_records: u64) -> Vec<u64> {
    MULTIPLES.iter().map(|m| ((capacity_records as f64 * m) as u64).max(1)).collect()
}

/// Records the ARC and the L2 devices hold at most.
pub fn capacity_records(stat: &Value, recordsize: u64) -> (u64, u64) {
    let arc = num(stat, "c_max") as u64 / (recordsize + RECORD_OVERHEAD);
    let l2: f64 = stat
        .get("l2_devices")
        .and_then(Value::as_array)
        .map(|d| d.iter().map(|x| num(x, "capacity")).sum())
        .unwrap_or(0.0);
    (arc, l2 as u64 / recordsize)
}

/// The `sizing` object of `arcache stat --json`.
pub fn sizing(stat: &Value, view: &SizingView, recordsize: u64) -> Value {
    let (arc_rec, l2_rec) = capacity_records(stat, recordsize);
    let cap = arc_rec + l2_rec;
    let hits = num(stat, "demand_data_hits") + num(stat, "demand_data_iohits");
    let total = hits + num(stat, "demand_data_misses");
    let ghosts = num(stat, "mru_ghost_hits") + num(stat, "mfu_ghost_hits");
    let ratio = |a: f64, b: f64| if b > 0.0 { Some(a / b) } else { None };
    let now = ratio(hits, total);
    let doubled = ratio((hits + ghosts).min(total), total);
    let key1 = ratio(view.active_records as f64, cap as f64);
    let (l2_bw, backing_bw) = (num(stat, "l2_device_write_bw"), num(stat, "backing_read_bw"));
    let key2 = if l2_rec > 0 { ratio(l2_bw, backing_bw) } else { None };
    let points = |c: &[(u64, f64)]| -> Vec<Value> {
        c.iter()
            .zip(MULTIPLES)
            .map(|(&(records, hit), m)| {
                json!({ "of_capacity": m, "records": records, "bytes": records * recordsize, "hit_ratio": hit })
            })
            .collect()
    };
    let curve = points(&view.curve);
    json!({
        "sample_rate": view.sample_rate,
        "window_reads": view.window_reads,
        "active_records": view.active_records,
        "active_bytes": view.active_records * recordsize,
        "capacity_bytes": cap * recordsize,
        "demand_hit_ratio": now,
        "hit_ratio_if_arc_doubled": doubled,
        "key_ratio_1": key1,
        "key_ratio_2": key2,
        "lru_curve": curve,
        "policy_curve": points(&view.policy_curve),
        "advice": advice(view, now, doubled, key1, key2, l2_rec > 0, recordsize),
    })
}

fn pct(x: f64) -> String {
    format!("{:.0}%", x * 100.0)
}

fn advice(
    view: &SizingView,
    now: Option<f64>,
    doubled: Option<f64>,
    key1: Option<f64>,
    key2: Option<f64>,
    has_l2: bool,
    recordsize: u64,
) -> Vec<String> {
    let mut out = Vec::new();
    if view.window_reads < 10_000 {
        out.push("Too few reads observed yet to size the cache; ask again after more traffic.".into());
        return out;
    }
    match key1 {
        Some(k) if k > 1.0 => out.push(format!(
            "The active data set is {k:.1}x what the ARC and L2 hold: add RAM (zfs_arc_max) or an L2 device of at least {} more.",
            human((view.active_records as f64 * (1.0 - 1.0 / k) * recordsize as f64) as u64)
        )),
        Some(k) => out.push(format!(
            "The active data set fits: it is {:.0}% of the ARC and L2 capacity.",
            k * 100.0
        )),
        None => {}
    }
    if let (Some(n), Some(d)) = (now, doubled) {
        if d - n > 0.05 {
            out.push(format!(
                "Ghost-list hits say a twice larger ARC would lift the demand hit ratio from {} to about {}.",
                pct(n),
                pct(d)
            ));
        }
    }
    // The L2 rate is what the feed managed to write, a lower bound of the
    // device's speed; the feed keeps streams off L2 below 1 (docs/l2arc.md).
    if let (true, Some(k2)) = (has_l2, key2) {
        if k2 < 1.0 {
            out.push(format!(
                "The L2 device wrote slower than the backing store reads (key ratio 2 = {k2:.1}): it helps random reads; streaming reads are kept off it."
            ));
        }
    }
    if out.len() == 1 && key1.is_some_and(|k| k <= 1.0) {
        out.push("No change needed.".into());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_working_set_larger_than_the_cache_asks_for_more() {
        let stat = json!({
            "c_max": 4096 * 1000 + RECORD_OVERHEAD * 1000,
            "demand_data_hits": 100, "demand_data_misses": 900,
            "mru_ghost_hits": 300, "mfu_ghost_hits": 0,
        });
        let view = SizingView {
            sample_rate: 1.0 / 64.0,
            window_reads: 1_000_000,
            active_records: 4000,
            curve: vec![(250, 0.0), (500, 0.01), (1000, 0.1), (2000, 0.3), (4000, 0.9), (8000, 0.9)],
            policy_curve: vec![(250, 0.02), (500, 0.05)],
        };
        let v = sizing(&stat, &view, 4096);
        assert_eq!(v["key_ratio_1"], 4.0);
        assert_eq!(v["hit_ratio_if_arc_doubled"], 0.4);
        let advice: Vec<&str> = v["advice"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
        assert!(advice[0].contains("4.0x") && advice[0].contains("add RAM"), "{advice:?}");
        assert!(advice.iter().any(|a| a.contains("twice larger ARC")), "{advice:?}");
        assert_eq!(v["lru_curve"][4]["of_capacity"], 4.0);
    }
}
