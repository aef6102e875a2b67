//! `arcache sim --mrc`: the CSV contract and a real PNG.

mod common;

use std::process::Command;

use common::BIN;

#[test]
fn sim_mrc_writes_the_csv_and_a_png() {
    let out = tempfile::tempdir().unwrap();
    let trace = concat!(env!("CARGO_MANIFEST_DIR"), "/../../traces/arc_paper/P3.csv.gz");
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

/// The ARC of the recorded-trace tests, fixed at its maximum.
const RECORDED_ARC: u64 = 8 << 20;

/// A 4K-record server over a 64 MiB file of random bytes recording its
/// trace while `workload` runs on one connection: the server's demand read
/// hit ratio, and the trace (in the returned directory).
fn recorded(seed: u64, workload: impl FnOnce(&mut nbd::Client)) -> (f64, tempfile::TempDir) {
    recorded_exports(seed, 1, |c| workload(&mut c[0]))
}

/// [`recorded`] with `exports` exports of their own 64 MiB files, the
/// workload given a connection to each (the first is the unnamed export).
fn recorded_exports(
    seed: u64,
    exports: usize,
    workload: impl FnOnce(&mut [nbd::Client]),
) -> (f64, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("t.csv");
    let mut specs = Vec::new();
    for i in 0..exports {
        let backing = dir.path().join(format!("b{i}.img"));
        common::random_file(&backing, 64 << 20, seed + i as u64);
        let path = backing.to_str().unwrap();
        specs.push(if i == 0 { path.to_string() } else { format!("e{i}={path}") });
    }
    let (max, trace_arg) = (RECORDED_ARC.to_string(), trace.to_str().unwrap().to_string());
    let mut args = vec!["--arc-max", &max, "--arc-min", &max, "--record-trace", &trace_arg];
    for spec in &specs[1..] {
        args.extend(["--export", spec.as_str()]);
    }
    let s = serve_4k(&specs[0], &args);
    let names: Vec<String> =
        (0..exports).map(|i| if i == 0 { String::new() } else { format!("e{i}") }).collect();
    let mut clients: Vec<nbd::Client> =
        names.iter().map(|n| nbd::Client::connect(&s.target(), n).unwrap()).collect();
    workload(&mut clients);
    drop(clients);
    let st = s.stat();
    let n = |k: &str| st[k].as_u64().unwrap() as f64;
    let server = (n("demand_data_hits") + n("demand_data_iohits"))
        / (n("demand_data_hits") + n("demand_data_iohits") + n("demand_data_misses"));
    assert_eq!(st["trace_dropped"], 0, "{st}");
    s.stop();
    (server, dir)
}

/// `arcache sim --policy default` of a trace `recorded` made, at the ARC's
/// size: the records plus a 112-byte header each (RECORD_OVERHEAD).
fn replay_recorded(dir: &tempfile::TempDir, extra: &[&str]) -> serde_json::Value {
    let blocks = (RECORDED_ARC / (4096 + 112)).to_string();
    let o = Command::new(BIN)
        .args(["sim", "--json", "--policy", "default", "--trace"])
        .arg(dir.path().join("t.csv"))
        .args(["--cache-blocks", &blocks])
        .args(extra)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    serde_json::from_slice(&o.stdout).unwrap()
}

#[test]
fn a_recorded_trace_replays_to_the_servers_own_hit_ratio() {
    use rand::{Rng, SeedableRng};
    let (server, dir) = recorded(3, |c| {
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let mut buf = vec![0u8; 4096];
        for _ in 0..30_000 {
            // A hot eighth of the export takes most reads; the rest is a long tail.
            let blocks = 16_384u64;
            let b = if rng.gen_bool(0.7) { rng.gen_range(0..blocks / 8) } else { rng.gen_range(0..blocks) };
            c.read(b * 4096, &mut buf).unwrap();
        }
    });
    let r = replay_recorded(&dir, &[]);
    assert_eq!(r["requests"], 30_000, "every read was recorded");
    let sim = r["hit_ratio"].as_f64().unwrap();
    eprintln!("server hit ratio {server:.4}, replay of the recorded trace {sim:.4}");
    assert!((sim - server).abs() <= 0.01, "server {server:.4} vs replay {sim:.4}");
}

/// 30,000 requests over `clients`' exports (one picked at random for each
/// when there are several): a fifth write a whole block, a tenth 512 bytes
/// of one, the rest read; most go to a hot eighth. Random bytes: the
/// simulator counts blocks, not what they compress to. Returns the reads.
fn reads_and_writes(clients: &mut [nbd::Client], seed: u64) -> u64 {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let (mut buf, mut data) = (vec![0u8; 4096], vec![0u8; 4096]);
    let blocks = 16_384u64;
    let mut reads = 0;
    for _ in 0..30_000 {
        let c = if clients.len() > 1 { rng.gen_range(0..clients.len()) } else { 0 };
        let c = &mut clients[c];
        let hot = rng.gen_bool(0.7);
        let b = if hot { rng.gen_range(0..blocks / 8) } else { rng.gen_range(0..blocks) };
        rng.fill(&mut data[..]);
        match rng.gen_range(0..10) {
            0..=1 => c.write(b * 4096, &data, false).unwrap(),
            2 => c.write(b * 4096 + 1024, &data[..512], false).unwrap(),
            _ => {
                c.read(b * 4096, &mut buf).unwrap();
                reads += 1;
            }
        }
    }
    reads
}

/// With writes among the reads, `--writes-as-server` replays the recorded
/// trace to the server's own read hit ratio; the libCacheSim-style replay,
/// which looks writes up and counts them, answers another question.
#[test]
fn a_recorded_trace_with_writes_replays_to_the_servers_own_hit_ratio() {
    let mut reads = 0u64;
    let (server, dir) = recorded(5, |c| reads = reads_and_writes(std::slice::from_mut(c), 12));
    let r = replay_recorded(&dir, &["--writes-as-server"]);
    assert_eq!(r["requests"], reads, "reads alone are counted");
    let sim = r["hit_ratio"].as_f64().unwrap();
    let counted = replay_recorded(&dir, &[]);
    assert_eq!(counted["requests"], 30_000);
    let every = counted["hit_ratio"].as_f64().unwrap();
    eprintln!("server {server:.4}, --writes-as-server {sim:.4}, every access counted {every:.4}");
    // The reference tools' replay is another measure, over other requests.
    assert!((every - server).abs() > 0.01, "server {server:.4}, every access counted {every:.4}");
    // Seen: server and replay 0.5778, every access 0.5954. Half a point,
    // tighter than the read-only test: writes looked up replay to about
    // 0.589 and fail; a patched block stored again, 0.5794, passes here
    // (the server's clock and the trace's differ a little under load)
    // and fails `a_patched_block_stays_where_it_is` in arcache-sim.
    assert!((sim - server).abs() <= 0.005, "server {server:.4} vs replay {sim:.4}");
}

/// The same over two exports: the trace's `dev` column names the export
/// (a trace that merged them replays to 0.57 against the server's 0.30).
/// The replay keys each record as the server does, so arc-adaptive's
/// copies sample the records the server's did; with the reference tools'
/// keys it replayed to 0.2982 against 0.2985, within the bound: the keys
/// are pinned by `blocks_of_a_recorded_trace_take_the_servers_keys` in
/// arcache-sim.
#[test]
fn a_recorded_trace_of_two_exports_replays_to_the_servers_own_hit_ratio() {
    let mut reads = 0u64;
    let (server, dir) = recorded_exports(7, 2, |c| reads = reads_and_writes(c, 13));
    let trace = std::fs::read_to_string(dir.path().join("t.csv")).unwrap();
    assert!(
        trace.lines().skip(1).any(|l| l.ends_with(",1")),
        "the second export's requests are in the trace"
    );
    let r = replay_recorded(&dir, &["--writes-as-server"]);
    assert_eq!(r["requests"], reads, "reads alone are counted");
    let sim = r["hit_ratio"].as_f64().unwrap();
    eprintln!("server {server:.4}, --writes-as-server {sim:.4}");
    assert!((sim - server).abs() <= 0.005, "server {server:.4} vs replay {sim:.4}");
}

#[test]
fn live_sizing_sees_a_working_set_larger_than_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("b.img");
    common::random_file(&backing, 128 << 20, 4);
    let s = serve_4k(&backing, &["--arc-max", "16M"]);
    let mut c = nbd::Client::connect(&s.target(), "").unwrap();
    let mut buf = vec![0u8; 64 << 10];
    // 96 MiB read round-robin three times: six times the ARC.
    for _ in 0..3 {
        for i in 0..(96u64 << 20) / buf.len() as u64 {
            c.read(i * buf.len() as u64, &mut buf).unwrap();
        }
    }
    let z = &s.stat()["sizing"];
    let k1 = z["key_ratio_1"].as_f64().unwrap();
    assert!((4.0..9.0).contains(&k1), "active 96 MiB over a 16 MiB ARC: {z}");
    let curve: Vec<f64> =
        z["lru_curve"].as_array().unwrap().iter().map(|p| p["hit_ratio"].as_f64().unwrap()).collect();
    assert!(curve[2] < 0.1 && curve[5] > 0.5, "a loop: nothing at 1x, most at 8x: {curve:?}");
    let policy: Vec<f64> =
        z["policy_curve"].as_array().unwrap().iter().map(|p| p["hit_ratio"].as_f64().unwrap()).collect();
    assert!(policy.len() == 6 && policy[5] > 0.5, "the serving policy's curve too: {policy:?}");
    let advice = z["advice"].to_string();
    assert!(advice.contains("add RAM"), "{advice}");
    let summary = String::from_utf8_lossy(&s.ctl(&["summary"]).stdout).to_string();
    assert!(summary.contains("Key ratio 1") && summary.contains("add RAM"), "{summary}");
    assert!(summary.contains("arc-adaptive hit ratio at 8.0x capacity"), "{summary}");
}

/// A server over `backing` with 4K records and no prefetch, so its hits are
/// the clients' own; plus `extra`.
fn serve_4k(backing: impl AsRef<std::path::Path>, extra: &[&str]) -> common::Serve {
    let backing = backing.as_ref().to_str().unwrap();
    let mut args = vec!["--export", backing, "--recordsize", "4K", "--set", "zfs_prefetch_disable=1"];
    args.extend_from_slice(extra);
    common::Serve::start(tempfile::tempdir().unwrap(), &args)
}

#[test]
fn sim_l2_size_reports_arc_hits_l2_hits_and_misses() {
    let trace = concat!(env!("CARGO_MANIFEST_DIR"), "/../../traces/cloudphysics_io/cloudphysics_io.csv.gz");
    let run = |rate: &str| -> serde_json::Value {
        let o = Command::new(BIN)
            .args(["sim", "--json", "--policy", "arc", "--cache-blocks", "10000", "--l2-size", "512M"])
            .args(["--l2-feed-rate", rate, "--trace", trace])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let (limited, free) = (run("32M"), run("0"));
    for r in [&limited, &free] {
        let n = |k: &str| r[k].as_u64().unwrap();
        assert_eq!(n("arc_hits") + n("l2_hits") + n("misses"), n("requests"), "{r}");
        assert_eq!(n("l2_blocks"), 131_072);
    }
    assert!(free["l2_hits"].as_u64() > limited["l2_hits"].as_u64(), "a feed limit costs L2 hits");
    assert_eq!(free["arc_hits"], limited["arc_hits"], "the L2 does not change what the ARC holds");
    assert!(limited["feed_skipped"].as_u64().unwrap() > 0);
}
