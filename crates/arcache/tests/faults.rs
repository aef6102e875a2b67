//! Faults of the backing store through the real binary (issue 7): a read
//! error is that request's EIO only; a write error is never reported as
//! durable; a full disk under the L2 file, the trace or the control socket
//! degrades that part only.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{random_file, skip_or_fail, wait_timeout, Nbdkit, Serve, BIN};

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

/// A small tmpfs, unmounted on drop; why not when mounting is not allowed.
struct SmallFs(std::path::PathBuf);

impl SmallFs {
    fn mount(at: &Path, size: &str) -> Result<SmallFs, String> {
        SmallFs::mount_with(at, &format!("size={size}"))
    }

    fn mount_with(at: &Path, options: &str) -> Result<SmallFs, String> {
        std::fs::create_dir_all(at).unwrap();
        let out = Command::new("mount").args(["-t", "tmpfs", "-o", options, "tmpfs"]).arg(at).output();
        match out {
            Ok(o) if o.status.success() => Ok(SmallFs(at.to_path_buf())),
            Ok(o) => Err(format!(
                "cannot mount a tmpfs (needs root): mount {}: {}",
                o.status,
                String::from_utf8_lossy(&o.stderr).trim()
            )),
            Err(e) => Err(format!("cannot run mount: {e}")),
        }
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
    let fs = match SmallFs::mount(&dir.path().join("small"), "2M") {
        Ok(fs) => fs,
        Err(why) => return skip_or_fail(&why),
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

#[test]
fn a_full_disk_for_the_control_socket_does_not_stop_serving() {
    let dir = tempfile::tempdir().unwrap();
    let fs = match SmallFs::mount_with(&dir.path().join("full"), "size=1M,nr_inodes=8") {
        Ok(fs) => fs,
        Err(why) => return skip_or_fail(&why),
    };
    // Use up every inode: binding a socket there then fails with ENOSPC.
    let filled = (0..100).take_while(|i| std::fs::File::create(fs.0.join(format!("f{i}"))).is_ok()).count();
    assert!(filled < 100, "the filesystem never filled");
    let backing = dir.path().join("b.img");
    let data = random_file(&backing, 4 << 20, 8);
    let sock = dir.path().join("nbd.sock");
    let mut child = Command::new(BIN)
        .args(["serve", "--export", backing.to_str().unwrap(), "--listen"])
        .arg(format!("unix:{}", sock.display()))
        .arg("--control")
        .arg(fs.0.join("control.sock"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut c = loop {
        if let Ok(c) = nbd::Client::connect(&nbd::Target::Unix(sock.clone()), "") {
            break c;
        }
        assert!(child.try_wait().unwrap().is_none(), "the server gave up: {:?}", child.wait_with_output());
        assert!(Instant::now() < deadline, "the server never listened");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut buf = vec![0u8; 1 << 20];
    c.read(1 << 20, &mut buf).unwrap();
    assert!(buf[..] == data[1 << 20..2 << 20], "reads are served");
    c.write(0, &[7u8; 4096], false).unwrap();
    c.flush().unwrap();
    drop(c);
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = wait_timeout(child, Duration::from_secs(30));
    assert!(out.status.success(), "clean stop");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no control socket"), "the missing control socket is reported: {err}");
    assert_eq!(std::fs::read(&backing).unwrap()[..4096], [7u8; 4096], "the write reached the backing store");
}
