//! Faults of the backing store through the real binary (issue 7): a read
//! error is that request's EIO only; a write error is never reported as
//! durable.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{random_file, Nbdkit, Serve};

#[test]
fn a_backing_read_error_fails_that_request_only() {
    let dir = tempfile::tempdir().unwrap();
    let inject = dir.path().join("inject");
    let good = dir.path().join("good.img");
    let data = random_file(&good, 4 << 20, 2);
    let arg = format!("error-pread-file={}", inject.display());
    let origin = Nbdkit::start(
        dir.path(),
        "origin",
        &["--filter=error", "memory", "4M", "error-pread=EIO", "error-pread-rate=100%", &arg],
    );
    let s = Serve::start(
        tempfile::tempdir().unwrap(),
        &[
            "--export",
            &format!("bad={}", origin.uri()),
            "--export",
            &format!("good={}", good.display()),
            "--set",
            "zfs_prefetch_disable=1",
        ],
    );
    let mut bad = nbd::Client::connect(&s.target(), "bad").unwrap();
    let mut ok = nbd::Client::connect(&s.target(), "good").unwrap();
    let mut buf = vec![0u8; 4096];
    std::fs::write(&inject, b"").unwrap();
    for i in 0..5u64 {
        let e = bad.read(i * (256 << 10), &mut buf);
        assert!(e.is_err(), "a read of a failing backing store must fail");
        ok.read(i * 4096, &mut buf).unwrap();
        assert!(buf[..] == data[(i * 4096) as usize..(i * 4096 + 4096) as usize]);
    }
    // The same connection goes on once the store recovers; nothing bad was cached.
    std::fs::remove_file(&inject).unwrap();
    bad.read(0, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0), "the memory origin reads zeroes");
    let st = s.stat();
    assert!(st["backing_errors"].as_u64().unwrap() >= 5, "{st}");
}

#[test]
fn a_backing_write_error_is_never_reported_as_durable() {
    let dir = tempfile::tempdir().unwrap();
    let inject = dir.path().join("inject");
    let arg = format!("error-pwrite-file={}", inject.display());
    let origin = Nbdkit::start(
        dir.path(),
        "origin",
        &["--filter=error", "memory", "4M", "error-pwrite=EIO", "error-pwrite-rate=100%", &arg],
    );
    let s = Serve::start(tempfile::tempdir().unwrap(), &["--export", &origin.uri()]);
    let mut c = nbd::Client::connect(&s.target(), "").unwrap();
    let data = vec![0x5au8; 4096];
    std::fs::write(&inject, b"").unwrap();
    c.write(8192, &data, false).unwrap();
    assert!(c.flush().is_err(), "FLUSH must fail while the backing store refuses the write");
    assert!(c.write(0, &data, true).is_err(), "a FUA write must fail too");
    // Reads still see what was written (it stays dirty, not lost).
    let mut buf = vec![0u8; 4096];
    c.read(8192, &mut buf).unwrap();
    assert_eq!(buf, data);
    std::fs::remove_file(&inject).unwrap();
    c.flush().expect("once the store takes writes again, FLUSH succeeds");
    // Now the origin itself has it.
    let mut direct = nbd::Client::connect(&nbd::Target::Unix(origin.sock.clone()), "").unwrap();
    direct.read(8192, &mut buf).unwrap();
    assert_eq!(buf, data, "the write reached the backing store");
}

/// A small tmpfs, unmounted on drop; None when mounting is not allowed.
struct SmallFs(std::path::PathBuf);

impl SmallFs {
    fn mount(at: &Path, size: &str) -> Option<SmallFs> {
        std::fs::create_dir_all(at).ok()?;
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .status();
        ok.ok().filter(|s| s.success()).map(|_| SmallFs(at.to_path_buf()))
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn a_full_disk_under_the_l2_file_or_the_trace_degrades_them_and_serving_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let Some(fs) = SmallFs::mount(&dir.path().join("small"), "2M") else {
        eprintln!("skipped: cannot mount a tmpfs here (needs root)");
        return;
    };
    let backing = dir.path().join("b.img");
    let data = random_file(&backing, 32 << 20, 6);
    let l2 = format!("{}:64M", fs.0.join("l2.img").display());
    let trace = fs.0.join("trace.csv");
    let s = Serve::start(
        tempfile::tempdir().unwrap(),
        &[
            "--export",
            backing.to_str().unwrap(),
            "--arc-max",
            "4M",
            "--l2",
            &l2,
            "--record-trace",
            trace.to_str().unwrap(),
            "--set",
            "l2arc_feed_min_ms=10",
        ],
    );
    let mut c = nbd::Client::connect(&s.target(), "").unwrap();
    let mut buf = vec![0u8; 64 << 10];
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        for off in (0..data.len()).step_by(buf.len()) {
            c.read(off as u64, &mut buf).unwrap();
            assert!(buf[..] == data[off..off + buf.len()], "wrong bytes at {off}");
        }
        let st = s.stat();
        if st["l2_devices"][0]["state"] == "DEGRADED" && st["trace_dropped"].as_u64().unwrap_or(0) > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the 2 MiB filesystem never filled: {st}");
    }
    let st = s.stat();
    assert_eq!(st["nbd_request_errors"], 0, "clients saw no error: {st}");
    assert!(st["trace_records"].as_u64().unwrap() > 0, "the trace was written until the disk filled");
}
