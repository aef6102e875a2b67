//! `--metrics`: Prometheus text format scraped over HTTP and parsed.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::TcpStream;

use common::{random_file, Serve};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn get(port: u16, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    (head.to_string(), body.to_string())
}

/// Samples by series (name plus labels), and each family's TYPE.
fn parse(body: &str) -> (BTreeMap<String, f64>, BTreeMap<String, String>) {
    let (mut samples, mut types, mut helps) = (BTreeMap::new(), BTreeMap::new(), BTreeSet::new());
    for line in body.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            helps.insert(rest.split_whitespace().next().unwrap().to_string());
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split_whitespace();
            let (name, kind) = (it.next().unwrap(), it.next().unwrap());
            assert!(helps.contains(name), "TYPE without HELP for {name}");
            types.insert(name.to_string(), kind.to_string());
        } else if !line.is_empty() {
            let (series, value) = line.rsplit_once(' ').unwrap();
            let name = series.split('{').next().unwrap();
            assert!(types.contains_key(name), "sample of {name} before its TYPE");
            if types[name] == "counter" {
                assert!(name.ends_with("_total"), "counter {name} must end in _total");
            }
            samples.insert(series.to_string(), value.parse::<f64>().unwrap());
        }
    }
    (samples, types)
}

#[test]
fn metrics_are_scraped_parsed_and_move_with_io() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.img");
    random_file(&a, 4 << 20, 1);
    let l2 = format!("{}:64M", dir.path().join("l2.img").display());
    let port = free_port();
    let s = Serve::start(
        tempfile::tempdir().unwrap(),
        &["--export", &format!("vm={}", a.display()), "--l2", &l2, "--metrics", &format!("127.0.0.1:{port}")],
    );
    let (head, body) = get(port, "/metrics");
    assert!(head.starts_with("HTTP/1.1 200") && head.contains("text/plain; version=0.0.4"), "{head}");
    let (before, types) = parse(&body);
    // Every numeric field of `stat --json` is exported.
    let stat = s.stat();
    for (k, v) in stat.as_object().unwrap() {
        if v.is_number() {
            let found = types.contains_key(&format!("arcache_{k}"))
                || types.contains_key(&format!("arcache_{k}_total"));
            assert!(found, "stat field {k} has no metric");
        }
    }
    let reads = |m: &BTreeMap<String, f64>| m.get("arcache_export_reads_total{export=\"vm\"}").copied();
    assert_eq!(reads(&before), Some(0.0), "per-export series: {body}");
    assert!(before.contains_key(&format!(
        "arcache_l2_device_online{{device=\"{}\"}}",
        dir.path().join("l2.img").display()
    )));
    assert_eq!(before.get("arcache_export_sync{export=\"vm\",mode=\"standard\"}"), Some(&1.0));

    let mut c = nbd::Client::connect(&s.target(), "vm").unwrap();
    let mut buf = vec![0u8; 64 << 10];
    for i in 0..10u64 {
        c.read(i * buf.len() as u64, &mut buf).unwrap();
    }
    c.write(0, &buf[..4096], false).unwrap();
    let (after, _) = parse(&get(port, "/metrics").1);
    assert_eq!(reads(&after), Some(10.0));
    assert_eq!(after.get("arcache_export_read_bytes_total{export=\"vm\"}"), Some(&(10.0 * 65536.0)));
    assert_eq!(after.get("arcache_export_writes_total{export=\"vm\"}"), Some(&1.0));
    assert!(after["arcache_misses_total"] > before["arcache_misses_total"]);
    assert!(after["arcache_dirty_bytes"] > 0.0, "the write is dirty");
    let (head, _) = get(port, "/nothing");
    assert!(head.starts_with("HTTP/1.1 404"), "{head}");

    // The Grafana dashboard asks only for metrics the server exports.
    let dash: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../contrib/grafana-dashboard.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let mut used = 0;
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            let expr = t["expr"].as_str().unwrap();
            for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                if word.starts_with("arcache_") {
                    assert!(
                        types.contains_key(word),
                        "dashboard panel {:?} uses unknown metric {word}",
                        p["title"]
                    );
                    used += 1;
                }
            }
        }
    }
    assert!(used > 10);
}
