//! `arcache sim --mrc`: the CSV contract and a real PNG.

mod common;

use std::process::Command;

use common::BIN;

#[test]
fn sim_mrc_writes_the_csv_and_a_png() {
    let out = tempfile::tempdir().unwrap();
    let trace = concat!(env!("CARGO_MANIFEST_DIR"), "/../../../shared/traces/arc_paper/P3.csv.gz");
    let o = Command::new(BIN)
        .args(["sim", "--mrc", "--trace", trace, "--policy", "lru,arc", "--out"])
        .arg(out.path())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let csv = std::fs::read_to_string(out.path().join("mrc.csv")).unwrap();
    let mut lines = csv.lines();
    assert_eq!(lines.next(), Some("policy,cache_blocks,hit_ratio"));
    let rows: Vec<(String, u64, f64)> = lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f[0].to_string(), f[1].parse().unwrap(), f[2].parse().unwrap())
        })
        .collect();
    assert_eq!(rows.iter().filter(|r| r.0 == "lru").count(), 20);
    assert_eq!(rows.iter().filter(|r| r.0 == "arc").count(), 20);
    // LRU's hit ratio never falls as the cache grows (the inclusion property).
    let lru: Vec<f64> = rows.iter().filter(|r| r.0 == "lru").map(|r| r.2).collect();
    assert!(lru.windows(2).all(|w| w[0] <= w[1]), "{lru:?}");
    let png = std::fs::read(out.path().join("mrc.png")).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    assert!(png.len() > 5000, "a chart, not an empty image");
    // Without --out, --mrc is refused with a message.
    let o = Command::new(BIN).args(["sim", "--mrc", "--trace", trace]).output().unwrap();
    assert!(!o.status.success());
}
