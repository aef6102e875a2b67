//! The L2ARC through the real binary: it warms, serves re-reads, survives a
//! corrupted and then a vanished cache file without a wrong byte, and
//! follows tunables changed at run time.

mod common;

use std::io::{Seek, SeekFrom, Write};
use std::process::Command;
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

/// 4K reads at scattered offsets, checking every byte: reads within one
/// record, which the server answers through its io_uring ring.
fn read_scattered(s: &Serve, data: &[u8], n: usize) {
    read_scattered_at(&s.target(), data, n);
}

fn read_scattered_at(target: &nbd::Target, data: &[u8], n: usize) {
    let mut c = nbd::Client::connect(target, "").unwrap();
    let mut buf = vec![0u8; 4096];
    for i in 0..n {
        let off = (i * 7919 * 4096) % SIZE;
        c.read(off as u64, &mut buf).unwrap();
        assert!(buf[..] == data[off..off + buf.len()], "wrong bytes at {off}");
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

/// Waits until the feed has written at least `bytes` to L2, calling
/// `read_again` whenever two seconds pass without that: one pass leaves on
/// L2 only what the feed reached before the ARC evicted it, less when
/// other tests keep the machine busy (a CI run fed 11 of 12 MiB in its one
/// pass, and nothing after it, as the ARC then held no new records).
fn feed_until(s: &Serve, bytes: u64, mut read_again: impl FnMut()) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let settled = Instant::now() + Duration::from_secs(2);
        while Instant::now() < settled {
            if stat_u64(s, "l2_write_bytes") >= bytes {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(Instant::now() < deadline, "the feed did not write {bytes} bytes: {}", s.stat());
        read_again();
    }
}

/// Warms L2 and re-reads from it; returns the server, the data and the L2 path.
fn warm(seed: u64) -> (Serve, Vec<u8>, std::path::PathBuf) {
    warm_with(seed, &[])
}

fn warm_with(seed: u64, extra: &[&str]) -> (Serve, Vec<u8>, std::path::PathBuf) {
    let (s, data, l2) = start(tempfile::tempdir().unwrap(), seed, extra);
    read_all(&s, &data, Duration::from_millis(2));
    feed_until(&s, 12 << 20, || read_all(&s, &data, Duration::from_millis(2)));
    let before = s.stat();
    read_all(&s, &data, Duration::ZERO);
    let after = s.stat();
    let l2_hits = after["l2_hits"].as_u64().unwrap() - before["l2_hits"].as_u64().unwrap();
    assert!(l2_hits > 500, "re-reads come from L2: {l2_hits} hits; {after}");
    assert!(after["l2_size"].as_u64().unwrap() > 0 && after["l2_asize"].as_u64().unwrap() > 0);
    assert!(after["l2_hdr_size"].as_u64().unwrap() > 0);
    assert!(after["evict_l2_cached"].as_u64().unwrap() > 0);
    assert_eq!(after["l2_devices"][0]["state"], "ONLINE");
    let ring = stat_u64(&s, "l2_ring_reads");
    read_scattered(&s, &data, 2000);
    let ring = stat_u64(&s, "l2_ring_reads") - ring;
    assert!(ring > 500, "4K re-reads were served through the io_uring ring: {ring}; {}", s.stat());
    // Turned off at run time, L2 reads go back to the worker threads.
    assert!(s.ctl(&["set", "l2arc_ring_reads=0"]).status.success());
    let (ring, hits) = (stat_u64(&s, "l2_ring_reads"), stat_u64(&s, "l2_hits"));
    read_scattered(&s, &data, 1000);
    assert_eq!(stat_u64(&s, "l2_ring_reads"), ring, "l2arc_ring_reads=0: no read through the ring");
    assert!(stat_u64(&s, "l2_hits") > hits + 100, "and L2 still serves them: {}", s.stat());
    assert!(s.ctl(&["set", "l2arc_ring_reads=1"]).status.success());
    // An idle feed sleeps: at most one cycle per l2arc_feed_min_ms (10 ms here).
    let cycles = stat_u64(&s, "l2_feed_cycles");
    std::thread::sleep(Duration::from_secs(1));
    let idle = stat_u64(&s, "l2_feed_cycles") - cycles;
    assert!(idle <= 150, "{idle} feed cycles in an idle second");
    (s, data, l2)
}

#[test]
fn l2_serves_rereads_and_a_corrupted_device_never_returns_a_wrong_byte() {
    let (s, data, l2) = warm(21);
    // Garbage over the first 8 MiB of cached data, under the running server.
    let mut f = std::fs::OpenOptions::new().write(true).open(&l2).unwrap();
    f.seek(SeekFrom::Start(1 << 20)).unwrap();
    f.write_all(&vec![0xA5u8; 8 << 20]).unwrap();
    f.sync_all().unwrap();
    drop(f);
    read_all(&s, &data, Duration::ZERO);
    read_scattered(&s, &data, 3000);
    assert!(stat_u64(&s, "l2_cksum_bad") > 0, "corruption was detected: {}", s.stat());
    // A real client's full copy is byte-identical too.
    need("nbdcopy");
    let copy = s.dir.path().join("copy.img");
    run(std::process::Command::new("nbdcopy").arg(s.uri("")).arg(&copy));
    assert!(std::fs::read(&copy).unwrap() == data, "nbdcopy through a corrupted L2 is exact");
    let st = s.stat();
    assert_eq!(st["l2_devices"][0]["state"], "DEGRADED", "a device returning bad data is retired: {st}");
    assert_eq!(st["backing_errors"], 0, "clients never saw an error");
    let o = s.ctl(&["summary"]);
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    assert!(text.contains("L2ARC status: DEGRADED"), "{text}");
    assert!(text.contains("l2arc_feed_min_ms"), "changed tunables are listed: {text}");
}

/// A client that asks for 4K reads of L2-cached data and never collects
/// the replies fills its socket, and the thread writing those replies (the
/// L2 ring, which answers every client) blocks on it. `--reply-timeout`
/// cuts that client off, and another client's L2 reads carry on.
#[test]
fn a_client_that_stops_collecting_replies_does_not_stall_other_clients() {
    let (s, data, _) = warm_with(25, &["--reply-timeout", "2"]);
    let target = s.target();
    let greedy = std::thread::spawn(move || {
        let mut g = nbd::Client::connect(&target, "").unwrap();
        (0..200_000u64).take_while(|i| g.send_read((i * 7919 * 4096) % SIZE as u64, 4096).is_ok()).count()
    });
    std::thread::sleep(Duration::from_secs(1));
    let (tx, rx) = std::sync::mpsc::channel();
    let target = s.target();
    // Not joined: if it hangs, the test fails on the timeout below.
    std::thread::spawn(move || {
        let t = Instant::now();
        read_scattered_at(&target, &data, 3000);
        tx.send(t.elapsed()).unwrap();
    });
    let took = rx.recv_timeout(Duration::from_secs(60)).expect("the other client's reads finished");
    eprintln!("3,000 L2 reads beside a stuck client: {took:?}");
    let sent = greedy.join().unwrap();
    assert!(sent < 200_000, "the stuck client was disconnected after {sent} requests");
    assert!(stat_u64(&s, "l2_ring_reads") > 0);
}

/// Every byte of the L2 device is gone; what the feed writes later lands in
/// a file that reads back holes and end-of-file for the old copies. Reads
/// until the server takes the device out of service (or three rounds).
fn lose_the_device(s: &Serve, data: &[u8], l2: &std::path::Path) {
    std::fs::OpenOptions::new().write(true).open(l2).unwrap().set_len(0).unwrap();
    for _ in 0..3 {
        read_scattered(s, data, 3000);
        read_all(s, data, Duration::ZERO);
        if stat_u64(s, "l2_ndev_healthy") == 0 {
            break;
        }
    }
}

#[test]
fn a_vanished_l2_device_costs_speed_not_data() {
    let (s, data, l2) = warm(24);
    assert!(stat_u64(&s, "l2_records") > 100, "copies left on L2 to lose: {}", s.stat());
    let errors = |s: &Serve| stat_u64(s, "l2_io_error") + stat_u64(s, "l2_cksum_bad");
    let before = errors(&s);
    lose_the_device(&s, &data, &l2);
    let st = s.stat();
    assert!(errors(&s) > before, "the loss was noticed: {st}");
    assert_eq!(st["l2_devices"][0]["state"], "DEGRADED", "{st}");
    assert_eq!(st["backing_errors"], 0, "clients never saw an error");
}

/// A persistent device taken out of service is marked in the state
/// directory (`--state-dir`), so its log is refused at the next start even
/// with no other device to record it (docs/format.md, "Abandoned-log
/// marks"; the start that refuses it is tested in crates/l2arc).
#[test]
fn a_retired_persistent_device_is_marked_in_the_state_dir() {
    let (s, data, l2) = warm_with(25, &["--set", "l2arc_rebuild_blocks_min_l2size=0"]);
    let marks = s.dir.path().join("state").join("l2-abandoned");
    let names_now = || -> Vec<String> {
        std::fs::read_dir(&marks)
            .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default()
    };
    assert!(names_now().is_empty(), "a mark before any device left service: {:?}", names_now());
    lose_the_device(&s, &data, &l2);
    assert_eq!(s.stat()["l2_devices"][0]["state"], "DEGRADED", "{}", s.stat());
    // The state shows before the mark is written (by the thread retiring it).
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while names_now().is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let names = names_now();
    assert_eq!(names.len(), 1, "one mark for the retired device: {names:?}");
    assert!(names[0].ends_with(".abandoned"), "{names:?}");
}

/// A state directory where no mark can be written is found at start, not
/// when a device fails: the server says so and serves on.
#[test]
fn a_state_dir_where_marks_cannot_be_written_is_reported_at_start() {
    let dir = tempfile::tempdir().unwrap();
    // The marks' directory is a link to a volume that is not mounted: it
    // reads as empty and nothing can be made in it (root ignores
    // permissions, so a read-only mode would not stop the probe).
    let state = dir.path().join("state-elsewhere");
    std::fs::create_dir(&state).unwrap();
    std::os::unix::fs::symlink(dir.path().join("unmounted/marks"), state.join("l2-abandoned")).unwrap();
    let state = state.display().to_string();
    let (mut s, data, _) =
        start(dir, 26, &["--state-dir", &state, "--set", "l2arc_rebuild_blocks_min_l2size=0"]);
    read_all(&s, &data, Duration::ZERO);
    let (status, err) = s.terminate();
    assert!(status.success(), "{err}");
    assert!(err.contains("abandoned-log marks cannot be written in"), "no warning at start: {err}");
}

#[test]
fn a_device_too_small_to_keep_a_log_is_reported_at_start() {
    // The harness's device is 32M, below the default minimum of 1G.
    let (mut s, _, _) = start(tempfile::tempdir().unwrap(), 27, &[]);
    assert_eq!(s.stat()["l2_devices"][0]["persistent"], false, "{}", s.stat());
    let (status, err) = s.terminate();
    assert!(status.success(), "{err}");
    assert!(err.contains("no persistent log"), "no warning at start: {err}");
    // With the minimum lowered it keeps a log, and nothing is said.
    let (mut s, _, _) =
        start(tempfile::tempdir().unwrap(), 27, &["--set", "l2arc_rebuild_blocks_min_l2size=0"]);
    assert_eq!(s.stat()["l2_devices"][0]["persistent"], true, "{}", s.stat());
    let (status, err) = s.terminate();
    assert!(status.success(), "{err}");
    assert!(!err.contains("no persistent log"), "warned of a device that keeps a log: {err}");
}

#[test]
fn fio_verified_writes_with_l2_and_a_tiny_arc() {
    need("fio");
    let (s, _, _) =
        start(tempfile::tempdir().unwrap(), 22, &["--recordsize", "4K", "--set", "zfs_txg_timeout=1"]);
    fio_verified_writes(&s.uri(""), "l2verify", "20M", &["--randseed=3", "--rate=12m,12m"]);
    // Written records reach L2 only once their txg has synced.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while stat_u64(&s, "l2_write_bytes") == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    let st = s.stat();
    assert!(st["l2_write_bytes"].as_u64().unwrap() > 0, "{st}");
    assert!(st["txg_syncs"].as_u64().unwrap() > 0, "{st}");
}

/// fio's 4K random reads at queue depth 64, answered from L2 through the
/// connection's io_uring ring. The ring's completions interrupt the
/// connection thread's blocking sends (EINTR), and such a send was taken
/// for a lost client: the connection was dropped within a few thousand
/// reads (bench/l2arc.sh's queue-depth sweep found it at 64; libnbd saw
/// the socket closed and fio failed the job). Then at 160, beyond the
/// server's 64 requests in flight per connection (`max_in_flight`), as
/// the kernel's client and qemu may keep: the rest wait in the socket.
/// Last, four connections at depth 64 at once (fio's jobs, a connection
/// each), as a storage server's clients keep: each connection thread has
/// its own ring, and all share the device and the ARC.
#[test]
fn fio_at_queue_depths_64_and_160_on_l2_hits_through_the_ring_keeps_its_connection() {
    need("fio");
    let (s, data, _) = start(tempfile::tempdir().unwrap(), 24, &[]);
    read_all(&s, &data, Duration::from_millis(2));
    feed_until(&s, 12 << 20, || read_all(&s, &data, Duration::from_millis(2)));
    let interrupted = stat_u64(&s, "nbd_sends_interrupted");
    for (depth, jobs) in [(64, 1), (160, 1), (64, 4)] {
        let ring = stat_u64(&s, "l2_ring_reads");
        let connections = stat_u64(&s, "nbd_connections");
        let mut fio = Command::new("fio")
            .args(["--name=deep", "--ioengine=nbd", "--rw=randread", "--bs=4k", "--size=24M"])
            .args([&format!("--iodepth={depth}"), &format!("--numjobs={jobs}"), "--group_reporting"])
            .args(["--time_based", "--runtime=3", "--randseed=7"])
            .arg(format!("--uri={}", s.uri("")))
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // How many of its connections were open at once, sampled while it
        // runs (fio's output is small enough to wait in its pipes).
        let mut open_at_once = 0;
        let t0 = Instant::now();
        while fio.try_wait().unwrap().is_none() {
            if t0.elapsed() > Duration::from_secs(60) {
                let _ = fio.kill();
                panic!("fio at depth {depth} on {jobs} connection(s) still running after 60 s");
            }
            open_at_once = open_at_once.max(stat_u64(&s, "nbd_active_connections"));
            std::thread::sleep(Duration::from_millis(100));
        }
        let out = fio.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        let case = format!("depth {depth} on {jobs} connection(s)");
        assert!(out.status.success() && text.contains("err= 0"), "fio at {case} failed: {text}");
        let ring = stat_u64(&s, "l2_ring_reads") - ring;
        // The race needs many ring reads completing while replies are sent.
        assert!(ring > 5_000, "at {case} only {ring} reads went through the ring: {}", s.stat());
        let opened = stat_u64(&s, "nbd_connections") - connections;
        assert!(opened >= jobs, "at {case} the server saw {opened} connections: {}", s.stat());
        assert!(open_at_once >= jobs, "at {case} at most {open_at_once} connections were open at once");
    }
    // The case the test is for: sends were interrupted, and sent again.
    let interrupted = stat_u64(&s, "nbd_sends_interrupted") - interrupted;
    assert!(interrupted > 0, "no send was interrupted: the race was not reached; {}", s.stat());
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

#[test]
fn two_devices_share_the_feed_and_secondarycache_none_keeps_an_export_off_l2() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.img");
    let b = dir.path().join("b.img");
    let data_a = random_file(&a, SIZE, 31);
    let data_b = random_file(&b, 8 << 20, 32);
    let cfg = dir.path().join("arcache.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[export]]\nname = \"cached\"\nbacking = \"{}\"\n[[export]]\nname = \"private\"\nbacking = \"{}\"\nsecondarycache = \"none\"\n",
            a.display(),
            b.display()
        ),
    )
    .unwrap();
    let l2a = format!("{}:16M", dir.path().join("l2a.img").display());
    let l2b = format!("{}:16M", dir.path().join("l2b.img").display());
    let s = Serve::start(
        dir,
        &[
            "--config",
            cfg.to_str().unwrap(),
            "--l2",
            &l2a,
            "--l2",
            &l2b,
            "--arc-max",
            "4M",
            "--set",
            "l2arc_feed_min_ms=10",
        ],
    );
    let mut ca = nbd::Client::connect(&s.target(), "cached").unwrap();
    let mut cb = nbd::Client::connect(&s.target(), "private").unwrap();
    let mut buf = vec![0u8; 64 << 10];
    for off in (0..8 << 20).step_by(buf.len()) {
        cb.read(off as u64, &mut buf).unwrap();
        assert!(buf[..] == data_b[off..off + buf.len()]);
    }
    let ineligible = stat_u64(&s, "evict_l2_ineligible");
    assert!(ineligible > 0, "evicted records of the private export were not eligible");
    let mut read_a = || {
        for off in (0..SIZE).step_by(buf.len()) {
            ca.read(off as u64, &mut buf).unwrap();
            assert!(buf[..] == data_a[off..off + buf.len()]);
            std::thread::sleep(Duration::from_millis(1));
        }
    };
    read_a();
    feed_until(&s, 8 << 20, read_a);
    let st = s.stat();
    let devs = st["l2_devices"].as_array().unwrap();
    assert_eq!(devs.len(), 2);
    for d in devs {
        assert!(d["write_bytes"].as_u64().unwrap() > 0, "both devices are fed: {st}");
    }
    // Re-reading the private export never touches L2.
    let l2_hits = stat_u64(&s, "l2_hits");
    for off in (0..8 << 20).step_by(buf.len()) {
        cb.read(off as u64, &mut buf).unwrap();
        assert!(buf[..] == data_b[off..off + buf.len()]);
    }
    assert_eq!(stat_u64(&s, "l2_hits"), l2_hits, "secondarycache=none: nothing of it on L2");
}

#[test]
fn compressible_records_are_held_compressed() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("zeros.img");
    std::fs::write(&img, vec![0u8; 8 << 20]).unwrap();
    let s = Serve::start(dir, &["--export", img.to_str().unwrap(), "--arc-max", "64M"]);
    let mut c = nbd::Client::connect(&s.target(), "").unwrap();
    let mut buf = vec![1u8; 1 << 20];
    for off in (0..8 << 20).step_by(buf.len()) {
        c.read(off as u64, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
    }
    let st = s.stat();
    let (cs, us) = (st["compressed_size"].as_u64().unwrap(), st["uncompressed_size"].as_u64().unwrap());
    assert_eq!(us, 8 << 20);
    assert!(cs * 20 < us, "zeroes compress: {cs} of {us}");
    let o = s.ctl(&["set", "zfs_compressed_arc_enabled=0"]);
    assert!(o.status.success());
}
