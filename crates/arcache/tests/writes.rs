//! The write path through the real binary: a log device that fails mid-run,
//! back-pressure from a slow backing store, and a real filesystem that must
//! be fsck-clean after a kill -9.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{need, random_file, run, skip_or_fail, Nbdkit, Serve, BIN};
use rand::{Rng, SeedableRng};

/// Runs `arcache serve` expecting it to refuse to start; its stderr.
fn serve_must_fail(dir: &Path, args: &[&str]) -> String {
    let out = Command::new(BIN)
        .arg("serve")
        .args(args)
        .arg("--listen")
        .arg(format!("unix:{}", dir.join("x.sock").display()))
        .arg("--control")
        .arg(dir.join("x.ctl"))
        .output()
        .unwrap();
    assert!(!out.status.success(), "arcache serve {args:?} should have refused to start");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stat_u64(s: &Serve, k: &str) -> u64 {
    s.stat()[k].as_u64().unwrap_or_else(|| panic!("{k} missing"))
}

fn block(seed: u64) -> Vec<u8> {
    let mut r = rand::rngs::StdRng::seed_from_u64(seed);
    (0..4096).map(|_| r.gen()).collect()
}

#[test]
fn a_failing_log_device_loses_nothing_and_clients_see_no_error() {
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("backing.img");
    random_file(&backing, 8 << 20, 4);
    let inject = dir.path().join("inject");
    let inject_arg = format!("error-file={}", inject.display());
    let log = Nbdkit::start(
        dir.path(),
        "log",
        &["--filter=error", "memory", "16M", "error-rate=100%", &inject_arg],
    );
    let s = Serve::start(
        tempfile::tempdir().unwrap(),
        &["--export", backing.to_str().unwrap(), "--log", &log.uri(), "--set", "zfs_txg_timeout=60"],
    );
    let mut c = nbd::Client::connect(&s.target(), "").unwrap();
    let mut model: Vec<Option<Vec<u8>>> = vec![None; 2048];
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    for round in 0..400u64 {
        if round == 200 {
            std::fs::write(&inject, b"").unwrap();
        }
        let blk = rng.gen_range(0..2048usize);
        let data = block(round);
        c.write(blk as u64 * 4096, &data, false).unwrap();
        model[blk] = Some(data);
        if round % 10 == 9 {
            c.flush().expect("a FLUSH succeeds with a failing log device");
        }
    }
    c.flush().unwrap();
    let st = s.stat();
    assert_eq!(st["zil_degraded"], 1, "the failed log is reported: {st}");
    assert!(st["zil_commit_writer_count"].as_u64().unwrap() > 0, "the log was used before it failed: {st}");
    assert!(st["zil_txg_fallbacks"].as_u64().unwrap() > 0, "FLUSHes fell back to txgs: {st}");
    assert_eq!(st["nbd_request_errors"], 0, "{st}");
    let summary = String::from_utf8_lossy(&s.ctl(&["summary"]).stdout).to_string();
    assert!(summary.contains("intent log DEGRADED"), "{summary}");
    let dir_back = s.kill9();
    drop(c);

    // The log device is dead for reads too: starting with it is refused
    // with a clear message; without it, every flushed write is there.
    let err = serve_must_fail(dir_back.path(), &["--export", backing.to_str().unwrap(), "--log", &log.uri()]);
    assert!(err.contains("log"), "the error names the log: {err}");
    let s = Serve::start(dir_back, &["--export", backing.to_str().unwrap()]);
    let mut c = nbd::Client::connect(&s.target(), "").unwrap();
    let mut buf = vec![0u8; 4096];
    for (blk, want) in model.iter().enumerate() {
        if let Some(want) = want {
            c.read(blk as u64 * 4096, &mut buf).unwrap();
            assert!(&buf == want, "block {blk} lost its flushed write");
        }
    }
}

fn vm_hwm_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find(|l| l.starts_with("VmHWM:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_writer_faster_than_the_backing_store_is_slowed_not_failed_and_ram_stays_bounded() {
    let dir = tempfile::tempdir().unwrap();
    // 40 MB/s backing store; the client writes 256 MiB as fast as it can.
    let origin = Nbdkit::start(dir.path(), "origin", &["--filter=rate", "memory", "256M", "rate=320M"]);
    let dirty_max = 8u64 << 20;
    let s = Serve::start(
        tempfile::tempdir().unwrap(),
        &["--export", &origin.uri(), "--arc-max", "16M", "--set", &format!("zfs_dirty_data_max={dirty_max}")],
    );
    let pid = s.child.as_ref().unwrap().id();
    let mut c = nbd::Client::connect(&s.target(), "").unwrap();
    let chunk = 1usize << 20;
    let started = Instant::now();
    let mut peak_dirty = 0;
    for i in 0..256u64 {
        let data: Vec<u8> = (0..chunk).map(|j| (i as usize * 31 + j / 4096) as u8).collect();
        c.write(i * chunk as u64, &data, false).unwrap();
        if i % 16 == 0 {
            peak_dirty = peak_dirty.max(stat_u64(&s, "dirty_bytes"));
        }
    }
    c.flush().unwrap();
    let secs = started.elapsed().as_secs_f64();
    let st = s.stat();
    eprintln!(
        "256 MiB in {secs:.1} s ({:.0} MB/s); peak dirty {peak_dirty}; VmHWM {} KiB",
        268.4 / secs,
        vm_hwm_kib(pid)
    );
    assert!(st["throttle_waits"].as_u64().unwrap() + st["throttle_delays"].as_u64().unwrap() > 0, "{st}");
    assert!(peak_dirty <= dirty_max + (1 << 20), "dirty data {peak_dirty} passed the limit {dirty_max}");
    // ARC 16 MiB + dirty 8 MiB + the process itself: far below the 256 MiB written.
    let hwm = vm_hwm_kib(pid) << 10;
    assert!(hwm < 120 << 20, "peak RSS {hwm} bytes: memory was not bounded");
    assert_eq!(st["nbd_request_errors"], 0);
    // Everything reached the origin.
    let copy = dir.path().join("copy.img");
    run(Command::new("nbdcopy").arg(origin.uri()).arg(&copy));
    let got = std::fs::read(&copy).unwrap();
    for i in 0..256usize {
        let want = (i * 31 + 5) as u8;
        assert_eq!(got[i * chunk + 5 * 4096], want, "MiB {i} did not reach the backing store");
    }
}

/// Mounts `image` (a file inside a FUSE mount) with a loop device.
fn mount_loop(image: &Path, at: &Path) -> bool {
    std::fs::create_dir_all(at).unwrap();
    Command::new("mount").args(["-o", "loop"]).arg(image).arg(at).status().is_ok_and(|s| s.success())
}

fn umount(at: &Path) {
    let _ = Command::new("umount").arg("-l").arg(at).status();
}

#[test]
fn ext4_on_an_export_is_fsck_clean_after_kill_9() {
    need("nbdfuse");
    need("mkfs.ext4");
    need("e2fsck");
    if !nix_is_root() {
        return skip_or_fail("loop mounts need root");
    }
    if !Path::new("/dev/loop-control").exists() {
        return skip_or_fail("no loop devices (/dev/loop-control; modprobe loop)");
    }
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("fs.img");
    std::fs::write(&backing, vec![0u8; 64 << 20]).unwrap();
    let log = format!("{}:16M", dir.path().join("log.img").display());
    let args = ["--export", backing.to_str().unwrap(), "--log", &log, "--set", "zfs_txg_timeout=30"];
    let s = Serve::start(tempfile::tempdir().unwrap(), &args);
    let fuse = dir.path().join("fuse");
    std::fs::create_dir_all(&fuse).unwrap();
    let mut nbdfuse =
        Command::new("nbdfuse").arg(fuse.join("disk")).arg(s.uri("")).stderr(Stdio::null()).spawn().unwrap();
    let image = fuse.join("disk");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !image.exists() {
        assert!(Instant::now() < deadline, "nbdfuse did not mount");
        std::thread::sleep(Duration::from_millis(50));
    }
    run(Command::new("mkfs.ext4").args(["-q", "-F", "-E", "nodiscard"]).arg(&image));
    let mnt = dir.path().join("mnt");
    assert!(mount_loop(&image, &mnt), "loop mount of the nbdfuse file failed");
    let mut written = Vec::new();
    for i in 0..40u64 {
        let data: Vec<u8> = (0..(50_000 + i * 997) as usize).map(|j| (j as u64 * 7 + i) as u8).collect();
        std::fs::write(mnt.join(format!("f{i}")), &data).unwrap();
        written.push(data);
    }
    run(Command::new("sync").arg("-f").arg(mnt.join("f0")));
    // Written after the last sync: may be lost, must not corrupt anything.
    for i in 0..20u64 {
        let _ = std::fs::write(mnt.join(format!("late{i}")), vec![i as u8; 30_000]);
    }
    let dir_back = s.kill9();
    umount(&mnt);
    let _ = Command::new("fusermount3").arg("-u").arg(&fuse).status();
    let _ = nbdfuse.kill();
    let _ = nbdfuse.wait();
    // Restart: the log is replayed into the backing file; a clean stop
    // writes the rest.
    let s = Serve::start(dir_back, &args);
    let st = s.stat();
    assert!(st["zil_replay_records"].as_u64().unwrap() > 0, "the sync left records in the log: {st}");
    s.stop();
    let out = Command::new("e2fsck").args(["-fn"]).arg(&backing).output().unwrap();
    assert!(
        out.status.success(),
        "e2fsck -fn is not clean:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let check = dir.path().join("check");
    std::fs::create_dir_all(&check).unwrap();
    // Mounted as a user would (the journal is replayed), then read.
    let ok = Command::new("mount").args(["-o", "loop"]).arg(&backing).arg(&check).status().unwrap();
    assert!(ok.success());
    for (i, data) in written.iter().enumerate() {
        let got = std::fs::read(check.join(format!("f{i}"))).unwrap_or_default();
        let same = got == *data;
        if !same {
            umount(&check);
        }
        assert!(same, "file f{i}, written before the sync, is not intact");
    }
    umount(&check);
}

fn nix_is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

#[test]
fn sync_is_set_per_export_and_at_run_time_and_sigterm_writes_dirty_data() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.img"), dir.path().join("b.img"));
    random_file(&a, 4 << 20, 1);
    random_file(&b, 4 << 20, 2);
    let cfg = dir.path().join("arcache.toml");
    std::fs::write(
        &cfg,
        format!(
            "[[export]]\nname = \"a\"\nbacking = \"{}\"\nsync = \"always\"\n\n[[export]]\nname = \"b\"\nbacking = \"{}\"\n",
            a.display(),
            b.display()
        ),
    )
    .unwrap();
    let s = Serve::start(tempfile::tempdir().unwrap(), &["--config", cfg.to_str().unwrap()]);
    let st = s.stat();
    assert_eq!(st["sync"]["a"], "always", "{st}");
    assert_eq!(st["sync"]["b"], "standard", "{st}");
    let bad = s.ctl(&["set", "sync=sometimes"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("standard, always or disabled"));
    assert!(s.ctl(&["set", "sync=disabled"]).status.success());
    let st = s.stat();
    assert_eq!((st["sync"]["a"].as_str(), st["sync"]["b"].as_str()), (Some("disabled"), Some("disabled")));
    let got = s.ctl(&["get", "sync"]);
    assert!(String::from_utf8_lossy(&got.stdout).contains("disabled"));
    assert!(s.ctl(&["set", "sync=standard"]).status.success());

    // Written, never flushed: SIGTERM must still put it on the backing store.
    let mut c = nbd::Client::connect(&s.target(), "b").unwrap();
    let data = block(77);
    c.write(8192, &data, false).unwrap();
    assert!(stat_u64(&s, "dirty_bytes") > 0, "the write is dirty in RAM");
    drop(c);
    let mut s = s;
    let (status, err) = s.terminate();
    assert!(status.success(), "{err}");
    let disk = std::fs::read(&b).unwrap();
    assert!(disk[8192..8192 + 4096] == data[..], "dirty data reached the backing file at stop");
}

#[test]
fn a_log_for_another_backing_store_is_refused_and_can_be_dumped_and_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.img"), dir.path().join("b.img"));
    random_file(&a, 4 << 20, 1);
    random_file(&b, 4 << 20, 2);
    let log = dir.path().join("log.img");
    let log_arg = format!("{}:2M", log.display());
    let s = Serve::start(
        tempfile::tempdir().unwrap(),
        &["--export", a.to_str().unwrap(), "--log", &log_arg, "--set", "zfs_txg_timeout=60"],
    );
    // A new log file is written in full when created: no holes, so commits
    // never allocate blocks (and cannot meet a full filesystem later).
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::metadata(&log).unwrap();
    assert!(
        m.blocks() * 512 >= m.len(),
        "the log file is sparse: {} blocks for {} bytes",
        m.blocks(),
        m.len()
    );
    let mut c = nbd::Client::connect(&s.target(), "").unwrap();
    let data = block(5);
    c.write(4096, &data, false).unwrap();
    c.flush().unwrap();
    let back = s.kill9();
    drop(c);

    let dump = Command::new(BIN).args(["log", "dump"]).arg(&log).arg("-v").output().unwrap();
    let text = String::from_utf8_lossy(&dump.stdout);
    assert!(
        dump.status.success() && text.contains("PAGE") && text.contains("replayed at the next start"),
        "{text}"
    );

    // Same export name, another backing file: its writes must not land there.
    let err = serve_must_fail(back.path(), &["--export", b.to_str().unwrap(), "--log", &log_arg]);
    assert!(err.contains("arcache log forget"), "the error says what to do: {err}");
    assert!(std::fs::read(&b).unwrap()[4096..8192] != data[..], "nothing was written into b");

    // With the right export it replays; a forgotten log replays nothing.
    let s = Serve::start(back, &["--export", a.to_str().unwrap(), "--log", &log_arg]);
    assert!(stat_u64(&s, "zil_replay_records") > 0);
    let back = s.stop();
    assert!(std::fs::read(&a).unwrap()[4096..8192] == data[..], "the flushed write is on a after replay");
    let forget = Command::new(BIN).args(["log", "forget"]).arg(&log).output().unwrap();
    assert!(forget.status.success());
    let s = Serve::start(back, &["--export", b.to_str().unwrap(), "--log", &log_arg]);
    assert_eq!(stat_u64(&s, "zil_replay_records"), 0);
}
