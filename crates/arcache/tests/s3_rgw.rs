//! S3 chunked disks against Ceph RGW (a one-node Ceph with an RGW,
//! `tests/ceph/ceph-up.sh`), through the real binary: a server other than
//! moto, with its own reading of conditional requests. RGW 16.2 answers
//! 412 to a PUT whose If-Match holds the ETag quoted (as servers return
//! it), so before crates/s3/src/cond.rs every chunk rewrite and lease
//! renewal failed there and the writer fenced itself. Without Ceph's
//! packages or moto's venv (for boto3) the test skips, and fails under
//! CI=true.

mod common;

use std::time::Duration;

use common::*;

const KEY: &str = "test";
const SECRET: &str = "testtesttest";

fn s3ctl(endpoint: &str, args: &[&str]) {
    let venv = moto_venv();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/s3/s3ctl.py");
    run(std::process::Command::new(venv.join("bin/python"))
        .arg(script)
        .arg(endpoint)
        .args(args)
        .env("S3CTL_KEY_ID", KEY)
        .env("S3CTL_SECRET", SECRET));
}

/// A chunk written, flushed (one txg: a create-only PUT), rewritten and
/// flushed again (a PUT conditional on its ETag), across a lease renewal
/// (also conditional), then read back by a fresh server: every FLUSH
/// succeeds, the writer never fences itself, the bucket has the newest
/// bytes. A read-only server beside the writer follows its generations
/// through the head object (a GET with If-None-Match, answered 304 while
/// nothing changed) and serves the rewritten bytes.
#[test]
fn a_chunked_disk_on_ceph_rgw_rewrites_chunks_and_renews_its_lease() {
    let venv_python = moto_venv().join("bin/python");
    if !venv_python.is_file() {
        skip_or_fail("no python venv with boto3 (.ci/run makes it)");
        return;
    }
    let ceph = match common::ceph::start(true) {
        Ok(c) => c,
        Err(why) => {
            skip_or_fail(&why);
            return;
        }
    };
    let endpoint = ceph.s3_endpoint.clone().expect("started with an RGW");
    s3ctl(&endpoint, &["mkbucket", "vms"]);
    let env = [
        ("AWS_ACCESS_KEY_ID", KEY),
        ("AWS_SECRET_ACCESS_KEY", SECRET),
        ("AWS_ENDPOINT_URL", endpoint.as_str()),
        ("AWS_PROFILE", ""),
    ];
    let args = ["--export", "s3://vms/d/?size=16M&chunk=1M", "--arc-max", "16M"];
    let mut s = Serve::start_with_env(tempfile::tempdir().unwrap(), &args, &env);
    let pattern = |seed: u32| -> Vec<u8> {
        (0..(256u32 << 10)).map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8).collect()
    };
    let (first, second, third) = (pattern(1), pattern(2), pattern(3));
    write_flush(&s, 0, &first);
    let reader_args = ["--export", "s3://vms/d/?head_poll_ms=200", "--arc-max", "16M", "--read-only"];
    let mut r = Serve::start_with_env(tempfile::tempdir().unwrap(), &reader_args, &env);
    assert!(read_at(&r, 0, first.len()) == first);
    write_flush(&s, 0, &second);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while read_at(&r, 0, second.len()) != second {
        assert!(std::time::Instant::now() < deadline, "the reader did not follow the rewrite: {}", r.stat());
        std::thread::sleep(Duration::from_millis(100));
    }
    let (status, log) = r.terminate();
    assert!(status.success() && !log.contains("WARN"), "the reader: {log}");
    // The lease is renewed every 10 s, conditional on its ETag.
    std::thread::sleep(Duration::from_secs(12));
    write_flush(&s, 512 << 10, &third);
    let (status, log) = s.terminate();
    assert!(status.success(), "arcache serve failed at stop: {log}");
    for bad in ["fenced", "lease was lost", "could not be synced"] {
        assert!(!log.contains(bad), "{bad}: {log}");
    }
    let s = Serve::start_with_env(tempfile::tempdir().unwrap(), &args, &env);
    assert!(read_at(&s, 0, second.len()) == second, "the rewritten bytes");
    assert!(read_at(&s, 512 << 10, third.len()) == third, "the bytes written after a renewal");
    s.stop();
}
