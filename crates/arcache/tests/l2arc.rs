//! The L2ARC through the real binary: it warms, serves re-reads, survives a
//! corrupted and then a vanished cache file without a wrong byte, and
//! follows tunables changed at run time.

mod common;

use std::io::{Seek, SeekFrom, Write};
use std::time::{Duration, Instant};

use common::*;

const SIZE: usize = 24 << 20;

/// Reads the whole export in 64 KiB requests, `passes` times, checking
/// every byte, with a pause between requests so the feed keeps up.
fn read_all(s: &Serve, data: &[u8], pause: Duration) {
    let mut c = nbd::Client::connect(&s.target(), "").unwrap();
    let mut buf = vec![0u8; 64 << 10];
    for off in (0..SIZE).step_by(buf.len()) {
        c.read(off as u64, &mut buf).unwrap();
        assert!(buf[..] == data[off..off + buf.len()], "wrong bytes at {off}");
        std::thread::sleep(pause);
    }
}

fn stat_u64(s: &Serve, k: &str) -> u64 {
    s.stat()[k].as_u64().unwrap_or_else(|| panic!("{k} in stat"))
}

fn start(dir: tempfile::TempDir, data_seed: u64, extra: &[&str]) -> (Serve, Vec<u8>, std::path::PathBuf) {
    let backing = dir.path().join("backing.img");
    let data = random_file(&backing, SIZE, data_seed);
    let l2 = dir.path().join("l2.img");
    let mut args = vec![
        "--export".to_string(),
        backing.display().to_string(),
        "--l2".into(),
        format!("{}:32M", l2.display()),
        "--arc-max".into(),
        "4M".into(),
        "--set".into(),
        "l2arc_feed_min_ms=10".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    (Serve::start(dir, &refs), data, l2)
}

/// Waits until the feed has written at least `bytes` to L2.
fn wait_fed(s: &Serve, bytes: u64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while stat_u64(s, "l2_write_bytes") < bytes {
        assert!(Instant::now() < deadline, "the feed did not write {bytes} bytes: {}", s.stat());
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn l2_serves_rereads_and_survives_corruption_and_loss() {
    let (s, data, l2) = start(tempfile::tempdir().unwrap(), 21, &[]);
    read_all(&s, &data, Duration::from_millis(2));
    wait_fed(&s, 12 << 20);
    let before = s.stat();
    read_all(&s, &data, Duration::ZERO);
    let after = s.stat();
    let l2_hits = after["l2_hits"].as_u64().unwrap() - before["l2_hits"].as_u64().unwrap();
    assert!(l2_hits > 500, "re-reads come from L2: {l2_hits} hits; {after}");
    assert!(after["l2_size"].as_u64().unwrap() > 0 && after["l2_asize"].as_u64().unwrap() > 0);
    assert!(after["l2_hdr_size"].as_u64().unwrap() > 0);
    assert!(after["evict_l2_cached"].as_u64().unwrap() > 0);
    assert_eq!(after["l2_devices"][0]["state"], "ONLINE");

    // Garbage over the first 8 MiB of cached data, under the running server.
    let mut f = std::fs::OpenOptions::new().write(true).open(&l2).unwrap();
    f.seek(SeekFrom::Start(1 << 20)).unwrap();
    f.write_all(&vec![0xA5u8; 8 << 20]).unwrap();
    f.sync_all().unwrap();
    read_all(&s, &data, Duration::ZERO);
    assert!(stat_u64(&s, "l2_cksum_bad") > 0, "corruption was detected: {}", s.stat());

    // The device vanishes: every read of it fails from now on.
    assert!(stat_u64(&s, "l2_records") > 100, "copies left on L2 to lose: {}", s.stat());
    f.set_len(0).unwrap();
    drop(f);
    for _ in 0..3 {
        read_all(&s, &data, Duration::ZERO);
        if stat_u64(&s, "l2_ndev_healthy") == 0 {
            break;
        }
    }
    let st = s.stat();
    assert!(st["l2_io_error"].as_u64().unwrap() > 0, "{st}");
    assert_eq!(st["l2_devices"][0]["state"], "DEGRADED", "{st}");
    assert_eq!(st["l2_ndev_healthy"], 0);
    assert_eq!(st["backing_errors"], 0, "clients never saw an error");
}

#[test]
fn fio_verified_writes_with_l2_and_a_tiny_arc() {
    need("fio");
    let (s, _, _) = start(tempfile::tempdir().unwrap(), 22, &["--recordsize", "4K"]);
    run(std::process::Command::new("fio")
        .args(["--name=l2verify", "--ioengine=nbd", "--rw=randwrite", "--bs=4k", "--size=20M"])
        .args(["--iodepth=16", "--verify=crc32c", "--do_verify=1", "--verify_fatal=1", "--randseed=3"])
        .args(["--rate=12m,12m"])
        .arg(format!("--uri={}", s.uri(""))));
    let st = s.stat();
    assert!(st["l2_write_bytes"].as_u64().unwrap() > 0, "{st}");
}

#[test]
fn lowering_l2arc_write_max_at_run_time_slows_the_feed() {
    let (s, data, _) = start(tempfile::tempdir().unwrap(), 23, &["--set", "l2arc_feed_again=0"]);
    for (k, v) in [("l2arc_write_max", "64K"), ("l2arc_write_boost", "0")] {
        let o = s.ctl(&["set", &format!("{k}={v}")]);
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    }
    let before = stat_u64(&s, "l2_write_bytes");
    let t0 = Instant::now();
    read_all(&s, &data, Duration::from_millis(1));
    std::thread::sleep(Duration::from_millis(1500));
    let secs = t0.elapsed().as_secs_f64();
    let fed = stat_u64(&s, "l2_write_bytes") - before;
    // One 64 KiB batch per second (plus 4K alignment), never more.
    let bound = ((secs.ceil() + 1.0) * (68 << 10) as f64) as u64;
    assert!(fed <= bound, "fed {fed} bytes in {secs:.1}s with write_max 64K (bound {bound})");
    assert!(fed > 0, "but it still feeds");
    let o = s.ctl(&["get", "l2arc_write_max"]);
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "65536");
}
