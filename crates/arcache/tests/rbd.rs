//! Ceph RBD backing stores against a real one-node Ceph (mon + memstore
//! OSD, `tests/ceph/ceph-up.sh`), started once for this file and stopped
//! when the test binary exits however it exits (the script follows its
//! parent), driven through the real binary and real NBD clients. Each test
//! makes an image of its own with `rbd create`. Built only with the `rbd`
//! feature (`cargo test -p arcache --features rbd --test rbd`); without
//! Ceph's packages the tests skip, and fail under CI=true.

mod common;

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use common::*;

struct Ceph {
    conf: PathBuf,
}

static CEPH: OnceLock<Result<Ceph, String>> = OnceLock::new();

/// The cluster (no RGW), started by the first test that asks; `None`
/// (after a skip line, or a failure under CI) when it cannot be.
fn ceph() -> Option<&'static Ceph> {
    let started = CEPH.get_or_init(|| common::ceph::start(false).map(|c| Ceph { conf: c.conf }));
    match started {
        Ok(c) => Some(c),
        Err(why) => {
            skip_or_fail(why);
            None
        }
    }
}

impl Ceph {
    fn rbd(&self, args: &[&str]) -> Vec<u8> {
        run(Command::new("rbd").arg("-c").arg(&self.conf).args(args)).stdout
    }

    /// A new image of `size` in the pool rbd.
    fn create(&self, image: &str, size: &str) {
        self.rbd(&["create", "--size", size, &format!("rbd/{image}")]);
    }

    /// The whole image (or snapshot) as `rbd export` reads it.
    fn export(&self, spec: &str) -> Vec<u8> {
        self.rbd(&["export", "--no-progress", spec, "-"])
    }

    fn spec(&self, image: &str) -> String {
        format!("rbd:rbd/{image}?conf={}", self.conf.display())
    }

    fn serve(&self, dir: tempfile::TempDir, spec: &str, extra: &[&str]) -> Serve {
        let export = format!("disk={spec}");
        let mut args = vec!["--export", export.as_str(), "--arc-max", "64M"];
        args.extend_from_slice(extra);
        Serve::start(dir, &args)
    }

    /// `arcache serve` of `spec`, expected to refuse: its standard error.
    fn refused(&self, spec: &str) -> String {
        let dir = tempfile::tempdir().unwrap();
        serve_refused(dir.path(), &["--export", &format!("disk={spec}")])
    }
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32).map(|i| (i.wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8).collect()
}

fn write_flush(s: &Serve, offset: u64, data: &[u8]) {
    let mut c = nbd::Client::connect(&s.target(), "disk").unwrap();
    for (i, piece) in data.chunks(1 << 20).enumerate() {
        c.write(offset + ((i as u64) << 20), piece, false).unwrap();
    }
    c.flush().unwrap();
}

fn read_at(s: &Serve, offset: u64, len: usize) -> Vec<u8> {
    let mut c = nbd::Client::connect(&s.target(), "disk").unwrap();
    let mut out = vec![0u8; len];
    for (i, piece) in out.chunks_mut(1 << 20).enumerate() {
        c.read(offset + ((i as u64) << 20), piece).unwrap();
    }
    out
}

/// 32 MiB of random bytes in with nbdcopy and out again byte-exact; after
/// a clean stop `rbd export` reads the same bytes from the image, and a
/// restarted server (a cold cache) serves them too.
#[test]
fn an_image_round_trips_byte_exact_and_is_there_after_a_restart() {
    let Some(ceph) = ceph() else { return };
    ceph.create("round", "32M");
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.img");
    let data = random_file(&input, 32 << 20, 21);
    let s = ceph.serve(tempfile::tempdir().unwrap(), &ceph.spec("round"), &[]);
    run(Command::new(need("nbdcopy")).arg(&input).arg(s.uri("disk")));
    let out = dir.path().join("out.img");
    run(Command::new("nbdcopy").arg(s.uri("disk")).arg(&out));
    assert!(std::fs::read(&out).unwrap() == data, "nbdcopy's copy out differs from what went in");
    let sdir = s.stop();
    assert!(ceph.export("rbd/round") == data, "rbd export reads other bytes than were written");
    let s = ceph.serve(sdir, &ceph.spec("round"), &[]);
    assert!(read_at(&s, 0, data.len()) == data, "a restarted server serves other bytes");
    s.stop();
}

/// fio's verified random writes (each block checksummed, read back and
/// checked) through the cache to an image.
#[test]
fn fio_verified_writes_pass() {
    let Some(ceph) = ceph() else { return };
    ceph.create("fio", "64M");
    let s = ceph.serve(tempfile::tempdir().unwrap(), &ceph.spec("fio"), &[]);
    fio_verified_writes(&s.uri("disk"), "rbd", "16M", &["--offset=8M"]);
    s.stop();
}

/// A second writer is refused, naming the lock's holder; after kill -9 of
/// a server on a log, every byte a FLUSH acknowledged is there once the
/// dead writer's lock is removed (`rbd lock rm`, which also blocklists
/// it) and the server restarts with its log; after a clean stop `rbd
/// export` has them, and the lock is given back at once.
#[test]
fn kill9_after_flush_loses_nothing_and_a_second_writer_is_refused() {
    let Some(ceph) = ceph() else { return };
    ceph.create("crash", "32M");
    let spec = ceph.spec("crash");
    let dir = tempfile::tempdir().unwrap();
    let log = format!("{}:64M", dir.path().join("log.img").display());
    // A txg would not reach the image before the kill: the log is what
    // keeps the flushed bytes.
    let args = ["--log", log.as_str(), "--set", "zfs_txg_timeout=600"];
    let s = ceph.serve(dir, &spec, &args);
    let err = ceph.refused(&spec);
    assert!(err.contains("exclusive lock is held by"), "{err}");
    let data = pattern(3 << 20, 7);
    write_flush(&s, 5 << 20, &data);
    let dir = s.kill9();
    let image = ceph.export("rbd/crash");
    assert!(image[5 << 20..(5 << 20) + data.len()] != data[..], "the txg was to stay in the log");
    let locks: serde_json::Value =
        serde_json::from_slice(&ceph.rbd(&["lock", "ls", "--format", "json", "rbd/crash"])).unwrap();
    let lock = &locks[0];
    let (id, locker) = (lock["id"].as_str().unwrap(), lock["locker"].as_str().unwrap());
    ceph.rbd(&["lock", "rm", "rbd/crash", id, locker]);
    let s = ceph.serve(dir, &spec, &args);
    assert!(read_at(&s, 5 << 20, data.len()) == data, "a FLUSHed write survives kill -9");
    s.stop();
    let image = ceph.export("rbd/crash");
    assert!(image[5 << 20..(5 << 20) + data.len()] == data[..], "replayed data reaches the image");
    let locks = ceph.rbd(&["lock", "ls", "--format", "json", "rbd/crash"]);
    assert_eq!(String::from_utf8_lossy(&locks).trim(), "[]", "a clean stop gives the lock back");
}

/// `@SNAP` serves the image as of the snapshot, read-only: the NBD
/// clients see a read-only export and their writes are refused, while a
/// writable server of the live image serves the newer bytes.
#[test]
fn a_snapshot_is_served_read_only_as_of_the_snapshot() {
    let Some(ceph) = ceph() else { return };
    ceph.create("snapped", "16M");
    let spec = ceph.spec("snapped");
    let old = pattern(2 << 20, 1);
    let new = pattern(2 << 20, 2);
    let s = ceph.serve(tempfile::tempdir().unwrap(), &spec, &[]);
    write_flush(&s, 1 << 20, &old);
    let dir = s.stop();
    ceph.rbd(&["snap", "create", "rbd/snapped@before"]);
    let live = ceph.serve(dir, &spec, &[]);
    write_flush(&live, 1 << 20, &new);
    let snap_spec = format!("rbd:rbd/snapped@before?conf={}", ceph.conf.display());
    let snap = ceph.serve(tempfile::tempdir().unwrap(), &snap_spec, &[]);
    assert!(read_at(&snap, 1 << 20, old.len()) == old, "the snapshot serves its own bytes");
    assert!(read_at(&live, 1 << 20, new.len()) == new, "the live image serves the new ones");
    let mut c = nbd::Client::connect(&snap.target(), "disk").unwrap();
    assert!(c.read_only(), "a snapshot is exported read-only");
    assert!(c.write(0, &[1u8; 4096], false).is_err(), "a write to a snapshot must fail");
    let info = run(Command::new(need("nbdinfo")).arg(snap.uri("disk"))).stdout;
    assert!(String::from_utf8_lossy(&info).contains("is_read_only: true"), "nbdinfo says read-only");
    let out = Command::new(need("qemu-io"))
        .args(["-f", "raw", "-c", "write -P 7 0 4k"])
        .arg(snap.uri("disk"))
        .output()
        .unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        !out.status.success() || said.contains("ermission") || said.contains("read-only"),
        "qemu-io: {said}"
    );
    assert!(!said.contains("wrote 4096"), "qemu-io wrote to a snapshot: {said}");
    snap.stop();
    live.stop();
    let before = ceph.export("rbd/snapped@before");
    assert!(before[1 << 20..3 << 20] == old[..], "the snapshot itself is unchanged");
}

/// TRIM reaches the image as `rbd_discard` (whole objects removed: `rbd
/// du` counts less, and they read as zeros), zeroing as `rbd_write_zeroes`.
#[test]
fn discard_and_zeroing_reach_the_image() {
    let Some(ceph) = ceph() else { return };
    ceph.create("holes", "32M");
    let spec = ceph.spec("holes");
    let data = pattern(16 << 20, 3);
    let s = ceph.serve(tempfile::tempdir().unwrap(), &spec, &[]);
    write_flush(&s, 0, &data);
    let dir = s.stop();
    let used = |ceph: &Ceph| -> u64 {
        let du: serde_json::Value =
            serde_json::from_slice(&ceph.rbd(&["du", "--format", "json", "rbd/holes"])).unwrap();
        du["images"][0]["used_size"].as_u64().unwrap()
    };
    assert_eq!(used(ceph), 16 << 20, "four 4 MiB objects written");
    let s = ceph.serve(dir, &spec, &[]);
    let mut c = nbd::Client::connect(&s.target(), "disk").unwrap();
    c.trim(0, 8 << 20).unwrap();
    c.write_zeroes(9 << 20, 1 << 20).unwrap();
    c.flush().unwrap();
    assert!(read_at(&s, 0, 8 << 20).iter().all(|&b| b == 0), "trimmed objects read as zeros");
    s.stop();
    assert_eq!(used(ceph), 8 << 20, "the two trimmed objects are gone from the image");
    let image = ceph.export("rbd/holes");
    assert!(image[..8 << 20].iter().all(|&b| b == 0), "rbd export: the trimmed range is zeros");
    assert!(image[9 << 20..10 << 20].iter().all(|&b| b == 0), "rbd export: the zeroed range is zeros");
    assert!(image[8 << 20..9 << 20] == data[8 << 20..9 << 20], "around it, the data");
    assert!(image[10 << 20..16 << 20] == data[10 << 20..16 << 20], "around it, the data");
}

/// What is wrong is said at start: no such image, pool or snapshot, a
/// malformed spec, a conf file that is not there.
#[test]
fn start_errors_name_the_cause() {
    let Some(ceph) = ceph() else { return };
    let conf = ceph.conf.display();
    for (spec, expect) in [
        (format!("rbd:rbd/nosuch?conf={conf}"), "image nosuch does not exist in pool rbd".to_string()),
        (format!("rbd:nopool/img?conf={conf}"), "pool nopool does not exist".to_string()),
        (format!("rbd:rbd/disk0@nosnap?conf={conf}"), "or its snapshot nosnap does not exist".to_string()),
        ("rbd:rbd?conf=/x".to_string(), "no /IMAGE after the pool".to_string()),
        (
            "rbd:rbd/disk0?conf=/nonexistent/ceph.conf".to_string(),
            "reading /nonexistent/ceph.conf".to_string(),
        ),
    ] {
        let err = ceph.refused(&spec);
        assert!(err.contains(&expect), "{spec}: expected {expect:?} in {err}");
    }
}

/// A client that takes the exclusive lock automatically and hands it over
/// when asked (here `rbd bench --io-type write`, as qemu would) is not
/// robbed of it: arcache is refused while it writes, and it goes on
/// writing to the end.
#[test]
fn a_writer_that_hands_its_lock_over_is_not_robbed_of_it() {
    let Some(ceph) = ceph() else { return };
    ceph.create("vm", "64M");
    let spec = ceph.spec("vm");
    let mut bench = Command::new("rbd")
        .arg("-c")
        .arg(&ceph.conf)
        // Long enough to outlast arcache's start on a loaded CI host: a
        // bench of 12M had ended (and released the lock) before arcache
        // looked, which then took the image and served it.
        .args(["bench", "--io-type", "write", "--io-size", "4K", "--io-threads", "1", "--io-total", "48M"])
        .args(["--io-pattern", "rand", "rbd/vm"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Until the bench holds the lock.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let locks = ceph.rbd(&["lock", "ls", "--format", "json", "rbd/vm"]);
        let held = serde_json::from_slice::<serde_json::Value>(&locks).is_ok_and(|l| l[0].is_object());
        if held {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "rbd bench never took the lock");
        assert!(bench.try_wait().unwrap().is_none(), "rbd bench ended before it took the lock");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let err = ceph.refused(&spec);
    assert!(err.contains("exclusive lock is held by"), "{err}");
    assert!(bench.try_wait().unwrap().is_none(), "rbd bench ended before arcache was refused: no proof");
    let out = bench.wait_with_output().unwrap();
    assert!(out.status.success(), "the writer lost its lock: {}", String::from_utf8_lossy(&out.stderr));
}

/// An image another server changed while this one was stopped (the
/// exclusive lock lets an image move between servers): what this one's
/// persistent L2 holds of the old bytes is never served after its restart,
/// whether the other server wrote or zeroed; an image nobody changed keeps
/// its L2 (a read-only server's).
#[test]
fn an_l2_never_brings_back_what_another_writer_changed_meanwhile() {
    let Some(ceph) = ceph() else { return };
    ceph.create("moved", "16M");
    let keep = tempfile::tempdir().unwrap();
    let l2_args = persistent_l2_args(keep.path());
    let with_l2: Vec<&str> = l2_args.iter().map(String::as_str).collect();
    let mut reader_args = with_l2.clone();
    reader_args.push("--read-only");
    let spec = ceph.spec("moved");
    let old = pattern(1 << 20, 5);
    let new: Vec<u8> = old.iter().map(|b| b ^ 0x5a).collect();
    let a = ceph.serve(tempfile::tempdir().unwrap(), &spec, &with_l2);
    write_flush(&a, 0, &old);
    a.stop();
    // A reader fills the L2 (it keeps what the writer's clean stop left)...
    let a = ceph.serve(tempfile::tempdir().unwrap(), &spec, &reader_args);
    assert!(read_at(&a, 0, old.len()) == old);
    wait_l2_holds(&a, old.len() as u64);
    a.stop();
    // ...which a start with nobody's change between keeps.
    let a = ceph.serve(tempfile::tempdir().unwrap(), &spec, &reader_args);
    let st = restored(&a, 0);
    assert!(read_at(&a, 0, old.len()) == old);
    assert!(a.stat()["l2_hits"].as_u64().unwrap() > 0, "an unchanged image's L2 was not used: {st}");
    a.stop();
    // Another server writes the image: nothing of the old bytes comes back.
    let b = ceph.serve(tempfile::tempdir().unwrap(), &spec, &[]);
    write_flush(&b, 0, &new);
    b.stop();
    let a = ceph.serve(tempfile::tempdir().unwrap(), &spec, &reader_args);
    let st = restored(&a, 1);
    assert!(read_at(&a, 0, new.len()) == new, "old bytes came back after another server wrote: {st}");
    wait_l2_holds(&a, new.len() as u64);
    a.stop();
    // Another server only zeroes a part: that too.
    let b = ceph.serve(tempfile::tempdir().unwrap(), &spec, &[]);
    let mut c = nbd::Client::connect(&b.target(), "disk").unwrap();
    c.write_zeroes(0, 64 << 10).unwrap();
    c.flush().unwrap();
    drop(c);
    b.stop();
    let a = ceph.serve(tempfile::tempdir().unwrap(), &spec, &reader_args);
    let st = restored(&a, 1);
    let got = read_at(&a, 0, new.len());
    assert!(got[..64 << 10].iter().all(|&b| b == 0), "zeroed bytes came back from L2: {st}");
    assert!(got[64 << 10..] == new[64 << 10..]);
    a.stop();
    // A reader started beside a writer that has already renewed the epoch
    // and goes on writing: the epoch stays, so the reader's records must
    // not be restored at all.
    let b = ceph.serve(tempfile::tempdir().unwrap(), &spec, &[]);
    write_flush(&b, 4 << 20, &old[..4096]);
    let mut a = ceph.serve(tempfile::tempdir().unwrap(), &spec, &reader_args);
    assert!(read_at(&a, 0, got.len()) == got);
    wait_l2_holds(&a, got.len() as u64);
    write_flush(&b, 0, &old);
    let (status, err) = a.terminate();
    assert!(status.success() && err.contains("will not be restored"), "{err}");
    b.stop();
    let a = ceph.serve(tempfile::tempdir().unwrap(), &spec, &reader_args);
    restored(&a, 1);
    assert!(read_at(&a, 0, old.len()) == old, "a reader's L2 brought back what a writer beside it rewrote");
    a.stop();
}

/// A writer's persistent L2 is bound at its clean stop to the epoch it set
/// before its first write: its clean restart keeps it and serves what it
/// wrote; another server's write meanwhile still discards it.
#[test]
fn a_writer_keeps_its_l2_of_what_it_wrote_across_restarts() {
    let Some(ceph) = ceph() else { return };
    ceph.create("own", "16M");
    let keep = tempfile::tempdir().unwrap();
    let l2_args = persistent_l2_args(keep.path());
    let args: Vec<&str> = l2_args.iter().map(String::as_str).collect();
    let spec = ceph.spec("own");
    let mine = pattern(1 << 20, 7);
    let theirs: Vec<u8> = mine.iter().map(|b| b ^ 0x3c).collect();
    let w = ceph.serve(tempfile::tempdir().unwrap(), &spec, &args);
    write_flush(&w, 0, &mine);
    assert!(read_at(&w, 0, mine.len()) == mine);
    wait_l2_holds(&w, mine.len() as u64);
    w.stop();
    let w = ceph.serve(tempfile::tempdir().unwrap(), &spec, &args);
    let st = restored(&w, 0);
    assert!(
        st["l2_rebuild_bufs"].as_u64().unwrap() > 0,
        "a writer's L2 was given up at a clean restart: {st}"
    );
    assert!(read_at(&w, 0, mine.len()) == mine);
    assert!(w.stat()["l2_hits"].as_u64().unwrap() > 0);
    w.stop();
    let b = ceph.serve(tempfile::tempdir().unwrap(), &spec, &[]);
    write_flush(&b, 0, &theirs);
    b.stop();
    let w = ceph.serve(tempfile::tempdir().unwrap(), &spec, &args);
    let st = restored(&w, 1);
    assert!(read_at(&w, 0, theirs.len()) == theirs, "old bytes came back after another server wrote: {st}");
    w.stop();
}

/// An image without the exclusive-lock feature has no lock for a writer to
/// hold (an arcache writer refuses it), so a read-only server's L2 of it is
/// restored after a restart rather than given up as perhaps written. Its
/// contents epoch was set by hand longer than arcache's own (which librbd
/// answers ERANGE to at first): the server starts, and reads it alike
/// each time.
#[test]
fn a_read_only_l2_of_an_image_without_a_lock_is_restored() {
    let Some(ceph) = ceph() else { return };
    ceph.rbd(&["create", "--size", "16M", "--image-feature", "layering", "rbd/nolock"]);
    let long = "e".repeat(300);
    ceph.rbd(&["image-meta", "set", "rbd/nolock", "arcache.contents-epoch", &long]);
    let keep = tempfile::tempdir().unwrap();
    let mut args = persistent_l2_args(keep.path());
    args.push("--read-only".into());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let spec = ceph.spec("nolock");
    let a = ceph.serve(tempfile::tempdir().unwrap(), &spec, &args);
    assert!(read_at(&a, 0, 1 << 20).iter().all(|&b| b == 0));
    wait_l2_holds(&a, 1 << 20);
    a.stop();
    let a = ceph.serve(tempfile::tempdir().unwrap(), &spec, &args);
    let st = restored(&a, 0);
    assert!(st["l2_rebuild_bufs"].as_u64().unwrap() > 0, "nothing restored: {st}");
    a.stop();
}
