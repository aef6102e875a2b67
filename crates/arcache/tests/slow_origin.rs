//! Behaviour that only shows with a slow backing store: `nbdkit` with its
//! `delay` filter as the origin.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::*;
use nbd::proto::*;

struct Nbdkit(Child);
impl Drop for Nbdkit {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn slow_origin(dir: &Path, image: &Path, rdelay: &str) -> (Nbdkit, String) {
    need("nbdkit");
    let sock = dir.join("origin.sock");
    let child = Command::new("nbdkit")
        .args(["--foreground", "--exit-with-parent", "-U"])
        .arg(&sock)
        .args(["--filter=delay", "file"])
        .arg(image)
        .arg(format!("rdelay={rdelay}"))
        .spawn()
        .expect("start nbdkit");
    let deadline = Instant::now() + Duration::from_secs(10);
    while UnixStream::connect(&sock).is_err() {
        assert!(Instant::now() < deadline, "nbdkit did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    (Nbdkit(child), format!("nbd+unix:///?socket={}", sock.display()))
}

#[test]
fn a_hit_overtakes_a_slow_miss_on_the_same_connection() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("img");
    let data = random_file(&img, 4 << 20, 11);
    let (_kit, origin) = slow_origin(dir.path(), &img, "600ms");
    let s = Serve::start(tempfile::tempdir().unwrap(), &["--export", &origin]);
    // Warm record 0.
    let mut warm = nbd::Client::connect(&s.target(), "").unwrap();
    let mut b = vec![0u8; 4096];
    warm.read(0, &mut b).unwrap();
    // One connection: a cold read, then a hot one.
    let mut c = UnixStream::connect(&s.sock).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut hello = [0u8; 18];
    c.read_exact(&mut hello).unwrap();
    c.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes()).unwrap();
    let mut o = Vec::new();
    o.extend_from_slice(&IHAVEOPT.to_be_bytes());
    o.extend_from_slice(&OPT_EXPORT_NAME.to_be_bytes());
    o.extend_from_slice(&0u32.to_be_bytes());
    c.write_all(&o).unwrap();
    let mut info = [0u8; 10];
    c.read_exact(&mut info).unwrap();
    let t0 = Instant::now();
    c.write_all(&Request { flags: 0, kind: CMD_READ, handle: 1, offset: 2 << 20, length: 4096 }.encode())
        .unwrap();
    c.write_all(&Request { flags: 0, kind: CMD_READ, handle: 2, offset: 0, length: 4096 }.encode()).unwrap();
    let mut h = [0u8; 16];
    c.read_exact(&mut h).unwrap();
    assert_eq!(u64::from_be_bytes(h[8..16].try_into().unwrap()), 2, "the hit is answered first");
    assert!(t0.elapsed() < Duration::from_millis(400), "without waiting for the miss");
    let mut got = vec![0u8; 4096];
    c.read_exact(&mut got).unwrap();
    assert_eq!(got, data[..4096]);
    c.read_exact(&mut h).unwrap();
    assert_eq!(u64::from_be_bytes(h[8..16].try_into().unwrap()), 1);
    c.read_exact(&mut got).unwrap();
    assert_eq!(got, data[2 << 20..(2 << 20) + 4096]);
}

#[test]
fn sigterm_answers_a_request_in_flight() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("img");
    let data = random_file(&img, 4 << 20, 12);
    let (_kit, origin) = slow_origin(dir.path(), &img, "800ms");
    let mut s = Serve::start(tempfile::tempdir().unwrap(), &["--export", &origin]);
    let target = s.target();
    let reader = std::thread::spawn(move || {
        let mut c = nbd::Client::connect(&target, "").unwrap();
        let mut b = vec![0u8; 65536];
        c.read(1 << 20, &mut b).map(|_| b)
    });
    // Signal only once the server has the request (its 800 ms origin read
    // is then under way), however slow the machine is.
    let deadline = Instant::now() + Duration::from_secs(20);
    while s.stat()["nbd_requests"].as_u64().unwrap_or(0) == 0 {
        assert!(Instant::now() < deadline, "the read never reached the server");
        std::thread::sleep(Duration::from_millis(10));
    }
    let (status, stderr) = s.terminate();
    let got = reader.join().unwrap().expect("the in-flight read is answered, not dropped");
    assert_eq!(got, data[1 << 20..(1 << 20) + 65536]);
    assert!(status.success(), "{status}: {stderr}");
}

#[test]
fn many_concurrent_misses_reach_the_origin_in_parallel() {
    // 16 clients each missing a different record: with 600 ms per origin
    // read, serial handling would take 9.6 s.
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("img");
    random_file(&img, 4 << 20, 13);
    let (_kit, origin) = slow_origin(dir.path(), &img, "600ms");
    let s = Serve::start(tempfile::tempdir().unwrap(), &["--export", &origin]);
    let t0 = Instant::now();
    std::thread::scope(|sc| {
        for i in 0..16u64 {
            let t = s.target();
            sc.spawn(move || {
                let mut c = nbd::Client::connect(&t, "").unwrap();
                let mut b = vec![0u8; 4096];
                c.read(i * 65536, &mut b).unwrap();
            });
        }
    });
    assert!(t0.elapsed() < Duration::from_secs(4), "took {:?}", t0.elapsed());
}

#[test]
fn direct_io_backing_passes_fio_verification() {
    need("fio");
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("img");
    random_file(&img, 16 << 20, 14);
    let s = Serve::start(
        dir,
        &["--export", img.to_str().unwrap(), "--direct", "--arc-max", "4M", "--recordsize", "4K"],
    );
    fio_verified_writes(&s.uri(""), "direct", "12M", &["--bs=4k,512", "--iodepth=8"]);
}

#[test]
fn zfetch_prefetches_ahead_of_a_sequential_reader() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("img");
    let data = random_file(&img, 16 << 20, 15);
    let (_kit, origin) = slow_origin(dir.path(), &img, "20ms");
    let s = Serve::start(tempfile::tempdir().unwrap(), &["--export", &origin, "--arc-max", "64M"]);
    let mut c = nbd::Client::connect(&s.target(), "").unwrap();
    let mut buf = vec![0u8; 128 << 10];
    for off in (0..16 << 20).step_by(buf.len()) {
        c.read(off as u64, &mut buf).unwrap();
        assert!(buf[..] == data[off..off + buf.len()]);
    }
    let st = s.stat();
    assert!(st["zfetch_hits"].as_u64().unwrap() > 50, "{st}");
    assert!(st["zfetch_io_issued"].as_u64().unwrap() > 0, "{st}");
    assert!(st["prefetch_data_misses"].as_u64().unwrap() > 0, "prefetch reads went to the origin: {st}");
    assert!(
        st["demand_hit_predictive_prefetch"].as_u64().unwrap() > 0,
        "the reader found prefetched records: {st}"
    );
    // Turned off at run time: no more prefetch IO.
    let o = s.ctl(&["set", "zfs_prefetch_disable=1"]);
    assert!(o.status.success());
    let issued = s.stat()["zfetch_io_issued"].as_u64().unwrap();
    for off in (0..16 << 20).step_by(buf.len()) {
        c.read(off as u64, &mut buf).unwrap();
    }
    assert_eq!(s.stat()["zfetch_io_issued"].as_u64().unwrap(), issued, "disabled means no prefetch");
}
