//! `arcache sim --policy`: the names it accepts, `default` as the server
//! runs it, and the clock of traces without timestamps.

mod common;

use std::process::Command;

use arc_policy::{serving, Access, SERVING_POLICIES};
use arcache::tunables::Tunables;
use arcache_sim::{expand, read_trace};
use common::BIN;

const P3: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../traces/arc_paper/P3.csv.gz");
const P3_LIS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../traces/arc_paper/P3.first10000.lis.zst");
const CLOUD: &str =
    concat!(env!("CARGO_MANIFEST_DIR"), "/../../traces/cloudphysics_io/cloudphysics_io.csv.gz");

fn sim(args: &[&str]) -> Vec<serde_json::Value> {
    let o = Command::new(BIN).arg("sim").arg("--json").args(args).output().unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn hits(args: &[&str]) -> u64 {
    sim(args)[0]["hits"].as_u64().unwrap()
}

#[test]
fn sim_lists_every_policy_it_accepts() {
    let o = Command::new(BIN).args(["sim", "--list-policies"]).output().unwrap();
    assert!(o.status.success());
    let listed: Vec<String> = String::from_utf8(o.stdout).unwrap().lines().map(String::from).collect();
    let help = String::from_utf8(Command::new(BIN).args(["sim", "--help"]).output().unwrap().stdout).unwrap();
    let mut want = vec!["default"];
    want.extend(arc_policy::POLICY_NAMES);
    assert_eq!(listed, want);
    for name in &want {
        assert!(help.contains(&format!("{name} (")) || help.contains(&format!("{name},")), "--help: {name}");
        // Every listed name runs.
        assert_eq!(sim(&["--trace", P3_LIS, "--policy", name, "--cache-blocks", "100"]).len(), 1);
    }
    let o = Command::new(BIN)
        .args(["sim", "--trace", P3, "--policy", "nope", "--cache-blocks", "9"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && want.iter().all(|n| err.contains(n)), "{err}");
}

/// `arcache sim ... | head -1` ends quietly: killed by SIGPIPE as any
/// Unix report is, not a panic on the next line.
#[test]
fn sim_into_a_closed_pipe_ends_without_a_panic() {
    use std::io::{BufRead, BufReader};
    use std::os::unix::process::ExitStatusExt;
    use std::process::Stdio;
    let sizes = (1..=40).map(|i| (i * 100).to_string()).collect::<Vec<_>>().join(",");
    let mut child = Command::new(BIN)
        .args(["sim", "--json", "--trace", P3, "--policy", "arc,lru", "--cache-blocks", &sizes])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut first).unwrap();
    assert!(first.starts_with('{'), "{first}");
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(o.status.signal(), Some(libc::SIGPIPE), "{:?} {err}", o.status);
}

/// `default` is the server's first serving policy in bytes, with the
/// limits `arcache serve --arc-max SIZE` sets from the tunables.
#[test]
fn sim_default_replays_what_serve_runs() {
    let blocks = 5117u64;
    let c_max = blocks * 4096;
    let mut t = Tunables::defaults();
    t.set("zfs_arc_max", c_max).unwrap();
    let ns = t.value("zfs_arc_min_prefetch_ms") * 1_000_000;
    let mut p = serving(SERVING_POLICIES[0], t.value("zfs_arc_min"), c_max, ns).unwrap();
    let mut reqs = read_trace(std::path::Path::new(CLOUD)).unwrap();
    reqs.truncate(40_000);
    let path = tempfile::NamedTempFile::with_suffix(".csv").unwrap();
    let csv: String = std::iter::once("timestamp_us,op,offset_bytes,length_bytes\n".to_string())
        .chain(
            reqs.iter()
                .map(|r| format!("{},{},{},{}\n", r.ts_us, if r.write { "W" } else { "R" }, r.offset, r.len)),
        )
        .collect();
    std::fs::write(path.path(), csv).unwrap();
    let (mut want, mut ev) = (0, Vec::new());
    for a in expand(&reqs, 4096, false) {
        let acc = Access::demand(a.now_ns);
        if p.lookup(a.key, acc).is_hit() {
            want += 1;
        } else {
            p.insert(a.key, 4096, acc, &mut ev);
        }
    }
    let trace = path.path().to_str().unwrap();
    let r = &sim(&["--trace", trace, "--policy", "default", "--cache-blocks", &blocks.to_string()])[0];
    assert_eq!(r["policy"], format!("default:{}", SERVING_POLICIES[0]));
    assert_eq!(r["hits"].as_u64(), Some(want));
}

/// Without timestamps the replay is 1 ms a request unless told otherwise;
/// at the trace's own 1 µs a line no re-access would ever pass the 62.5 ms
/// promotion rule, which changes what the ARC does.
#[test]
fn sim_traces_without_time_get_a_clock() {
    let at = |spacing: Option<&str>| {
        let mut args = vec!["--trace", P3_LIS, "--policy", "arc", "--cache-blocks", "2000"];
        if let Some(s) = spacing {
            args.extend(["--request-spacing-us", s]);
        }
        hits(&args)
    };
    assert_eq!(at(None), at(Some("1000")));
    assert_ne!(at(Some("1")), at(Some("1000")));
    // A trace with timestamps keeps them.
    let own = hits(&["--trace", CLOUD, "--policy", "arc", "--cache-blocks", "2692"]);
    let reqs = read_trace(std::path::Path::new(CLOUD)).unwrap();
    let mut p = arc_policy::by_name("arc", 2692).unwrap();
    assert_eq!(own, arcache_sim::replay(p.as_mut(), 2692, &expand(&reqs, 4096, false)).hits);
}

/// `--writes-as-server` counts reads only and stores what writes cover,
/// as the server does; without it a write is looked up and counted.
#[test]
fn sim_replays_writes_as_the_server_when_asked() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("w.csv");
    // Ten whole-block writes, a partial write of block 20 (not cached),
    // then reads of blocks 0..10 and 20.
    let mut csv = String::from("timestamp_us,op,offset_bytes,length_bytes\n");
    let mut t = 0;
    let mut line = |op: &str, off: u64, len: u64| {
        t += 1000;
        csv.push_str(&format!("{t},{op},{off},{len}\n"));
    };
    (0..10).for_each(|b| line("W", b * 4096, 4096));
    line("W", 20 * 4096 + 512, 512);
    (0..10).for_each(|b| line("R", b * 4096, 4096));
    line("R", 20 * 4096, 4096);
    std::fs::write(&trace, csv).unwrap();
    let t = trace.to_str().unwrap();
    for policy in ["default", "arc", "lru", "s3fifo", "sieve", "2q", "arc-paper"] {
        let base = ["--trace", t, "--policy", policy, "--cache-blocks", "100"];
        let as_server = sim(&[&base[..], &["--writes-as-server"]].concat());
        assert_eq!(as_server[0]["requests"], 11, "{policy}: reads only");
        assert_eq!(as_server[0]["hits"], 10, "{policy}: written blocks hit, the partly written one misses");
        // libCacheSim's way: 22 accesses, the writes missing and inserting
        // what they touch, block 20 too.
        let counted = sim(&base);
        assert_eq!(
            (counted[0]["requests"].as_u64(), counted[0]["hits"].as_u64()),
            (Some(22), Some(11)),
            "{policy}"
        );
    }
    let o = Command::new(BIN)
        .args(["sim", "--trace", t, "--cache-blocks", "9", "--writes-as-server", "--reads-only"])
        .output()
        .unwrap();
    assert!(!o.status.success(), "--writes-as-server with --reads-only was accepted");
}
