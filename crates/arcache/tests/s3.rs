//! S3 backing stores against a real S3 server: moto, started here on
//! 127.0.0.1 from the venv `.ci/run` makes (`ARCACHE_MOTO_VENV`, default
//! /var/tmp/arcache-moto-venv), driven through the real binary and NBD.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

fn serve_s3(moto: &Moto, dir: tempfile::TempDir, backing: &str, extra: &[&str]) -> Serve {
    serve_s3_failing(moto, dir, backing, extra, "")
}

/// `serve_s3` with fail points armed (FAILPOINTS; "" arms none).
fn serve_s3_failing(
    moto: &Moto,
    dir: tempfile::TempDir,
    backing: &str,
    extra: &[&str],
    failpoints: &str,
) -> Serve {
    let armed = [("FAILPOINTS", failpoints)];
    serve_s3_with_env(moto, dir, backing, extra, if failpoints.is_empty() { &[] } else { &armed })
}

/// `serve_s3` with `env` added to the server's (after moto's credentials
/// and endpoint, so it may override them or RUST_LOG).
fn serve_s3_with_env(
    moto: &Moto,
    dir: tempfile::TempDir,
    backing: &str,
    extra: &[&str],
    env: &[(&str, &str)],
) -> Serve {
    let base = moto.env();
    let mut all: Vec<(&str, &str)> = base.iter().map(|(k, v)| (*k, v.as_str())).collect();
    all.extend_from_slice(env);
    let mut args = vec!["--export", backing, "--arc-max", "16M"];
    args.extend_from_slice(extra);
    Serve::start_with_env(dir, &args, &all)
}

fn read_all(s: &Serve, len: usize) -> Vec<u8> {
    let mut c = nbd::Client::connect(&s.target(), "").unwrap();
    let mut out = vec![0u8; len];
    for (i, chunk) in out.chunks_mut(1 << 20).enumerate() {
        c.read((i << 20) as u64, chunk).unwrap();
    }
    out
}

/// Moto with a bucket `vms`, and a read-only server's arguments with a
/// persistent L2 kept in the directory returned, which restarts share.
fn moto_and_reader_l2() -> Option<(Moto, tempfile::TempDir, Vec<String>)> {
    let moto = Moto::start(&[])?;
    moto.ctl(&["mkbucket", "vms"]);
    let keep = tempfile::tempdir().unwrap();
    let args = read_only_with_l2(keep.path());
    Some((moto, keep, args))
}

/// `len` bytes of a fixed pattern, each XORed with `xor`: versions of a
/// disk's contents that differ in every byte.
fn pattern(len: usize, xor: u8) -> Vec<u8> {
    (0..len as u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8 ^ xor).collect()
}

/// A read-only server's arguments with a persistent L2 kept in `dir`.
fn read_only_with_l2(dir: &Path) -> Vec<String> {
    let mut args = persistent_l2_args(dir);
    args.push("--read-only".into());
    args
}

fn put(moto: &Moto, dir: &Path, key: &str, size: usize, seed: u64) -> (Vec<u8>, String) {
    let f = dir.join(format!("{}.{seed}", key.replace('/', "_")));
    let data = random_file(&f, size, seed);
    let etag = moto.ctl(&["put", "games", key, f.to_str().unwrap()]);
    (data, etag)
}

/// One object served read-only through ranged GETs: every byte as stored,
/// through our client and through nbdcopy; writes refused.
#[test]
fn an_object_is_served_byte_exact_and_read_only() {
    let Some(moto) = Moto::start(&[]) else { return };
    moto.ctl(&["mkbucket", "games"]);
    let dir = tempfile::tempdir().unwrap();
    let (data, _) = put(&moto, dir.path(), "lib/disk.img", 6 << 20, 3);
    let s = serve_s3(&moto, dir, "s3://games/lib/disk.img", &[]);
    assert!(read_all(&s, data.len()) == data, "bytes differ from the object");
    let out = tempfile::NamedTempFile::new().unwrap();
    run(Command::new(need("nbdcopy")).arg(s.uri("")).arg(out.path()));
    assert!(std::fs::read(out.path()).unwrap() == data, "nbdcopy's copy differs");
    let mut c = nbd::Client::connect(&s.target(), "").unwrap();
    assert!(c.write(0, &[1u8; 4096], false).is_err(), "a write to a read-only object must fail");
    s.stop();
}

/// The object changes while every read hits the cache: the recheck
/// (`recheck=1`: a HEAD each second) finds it, and from then on the cached
/// records of the old version are not served either: every read is EIO,
/// and the server says why.
#[test]
fn a_change_found_by_the_recheck_stops_cached_reads_too() {
    let Some(moto) = Moto::start(&[]) else { return };
    moto.ctl(&["mkbucket", "games"]);
    let dir = tempfile::tempdir().unwrap();
    let (old, _) = put(&moto, dir.path(), "disk.img", 1 << 20, 7);
    let keep = tempfile::tempdir().unwrap();
    let s = serve_s3(&moto, dir, "s3://games/disk.img?recheck=1", &[]);
    let mut c = nbd::Client::connect(&s.target(), "").unwrap();
    assert!(read_all(&s, old.len()) == old, "read whole: every record cached");
    let reads_before = s.stat()["backing_reads"].as_u64().unwrap();
    let mut b = vec![0u8; 65536];
    c.read(0, &mut b).unwrap();
    assert_eq!(s.stat()["backing_reads"].as_u64().unwrap(), reads_before, "a hit, not a GET");
    put(&moto, keep.path(), "disk.img", 1 << 20, 8);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while c.read(0, &mut b).is_ok() {
        assert!(b[..] == old[..65536], "before the change is found, the old version only");
        assert!(std::time::Instant::now() < deadline, "the recheck never found the change");
        std::thread::sleep(Duration::from_millis(200));
    }
    for at in [0u64, 512 << 10] {
        let e = c.read(at, &mut b).unwrap_err();
        assert_eq!(e.errno(), libc::EIO, "a cached record of the old version after the change is found");
    }
    assert_eq!(s.stat()["backing_reads"].as_u64().unwrap(), reads_before, "refused without asking S3");
    let mut s = s;
    let (_, log) = s.terminate();
    assert!(log.contains("changed underneath"), "the server says why: {log}");
}

/// The object changes underneath: a read that must go to S3 fails (EIO)
/// rather than mixing versions, and a restart serves the new version.
#[test]
fn an_object_changed_underneath_is_never_mixed_with_the_old() {
    let Some(moto) = Moto::start(&[]) else { return };
    moto.ctl(&["mkbucket", "games"]);
    let dir = tempfile::tempdir().unwrap();
    let (old, _) = put(&moto, dir.path(), "disk.img", 4 << 20, 5);
    let keep = tempfile::tempdir().unwrap();
    let s = serve_s3(&moto, dir, "s3://games/disk.img", &["--set", "zfs_prefetch_disable=1"]);
    let mut c = nbd::Client::connect(&s.target(), "").unwrap();
    let mut first = vec![0u8; 65536];
    c.read(0, &mut first).unwrap();
    assert!(first[..] == old[..65536]);
    let (new, _) = put(&moto, keep.path(), "disk.img", 4 << 20, 6);
    let mut far = vec![0u8; 65536];
    let err = c.read(3 << 20, &mut far);
    assert!(err.is_err(), "a read of the changed object must fail, not serve either version");
    let mut s = s;
    let (_, log) = s.terminate();
    assert!(log.contains("changed"), "the server says why: {log}");
    let s = serve_s3(&moto, tempfile::tempdir().unwrap(), "s3://games/disk.img", &[]);
    assert!(read_all(&s, new.len()) == new, "after a restart, the new version");
    s.stop();
}

/// What is wrong is said at start: no such bucket, no such object, wrong
/// credentials.
#[test]
fn a_missing_bucket_or_object_or_bad_key_is_refused_at_start() {
    let Some(moto) = Moto::start(&[]) else { return };
    moto.ctl(&["mkbucket", "games"]);
    let dir = tempfile::tempdir().unwrap();
    put(&moto, dir.path(), "disk.img", 1 << 20, 7);
    let env = moto.env();
    for (uri, expect) in [("s3://nobucket/disk.img", "nobucket"), ("s3://games/none.img", "none.img")] {
        let out = Command::new(BIN)
            .args([
                "serve",
                "--export",
                uri,
                "--listen",
                &format!("unix:{}", dir.path().join("x.sock").display()),
            ])
            .args(["--control", dir.path().join("x.ctl").to_str().unwrap()])
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(expect), "{uri}: {err}");
    }
    let out = Command::new(BIN)
        .args(["serve", "--export", "s3://games/disk.img"])
        .args(["--listen", &format!("unix:{}", dir.path().join("y.sock").display())])
        .args(["--control", dir.path().join("y.ctl").to_str().unwrap()])
        .env("AWS_ACCESS_KEY_ID", "")
        .env("AWS_SECRET_ACCESS_KEY", "")
        .env("AWS_PROFILE", "")
        .env("AWS_SHARED_CREDENTIALS_FILE", dir.path().join("none"))
        .env("AWS_ENDPOINT_URL", moto.endpoint())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("AWS_ACCESS_KEY_ID"), "{err}");
}

/// A writable disk of chunk objects: fio's verified writes pass, what was
/// flushed is there after a restart, never-written chunks are not stored.
#[test]
fn a_chunked_disk_keeps_what_was_written_across_restarts() {
    let Some(moto) = Moto::start(&[]) else { return };
    moto.ctl(&["mkbucket", "vms"]);
    let uri = "s3://vms/disk1/?size=64M";
    let s = serve_s3(&moto, tempfile::tempdir().unwrap(), uri, &[]);
    fio_verified_writes(&s.uri(""), "s3", "16M", &["--offset=8M"]);
    let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    write_flush(&s, 40 << 20, &data);
    s.stop();
    let keys = moto.ctl(&["list", "vms", "disk1/"]);
    let chunks = keys.lines().filter(|k| k.starts_with("disk1/c/")).count();
    assert!(keys.contains("disk1/arcache-manifest") && keys.contains("disk1/arcache-lease"), "{keys}");
    // 16 MiB at 8 MiB: chunks 2..=5 of 4 MiB, and chunk 10 for 40 MiB.
    assert_eq!(chunks, 5, "only written chunks are stored: {keys}");
    let s = serve_s3(&moto, tempfile::tempdir().unwrap(), "s3://vms/disk1/", &[]);
    assert!(read_at(&s, 40 << 20, data.len()) == data, "flushed data after a restart");
    assert!(read_at(&s, 0, 65536).iter().all(|&b| b == 0), "never written reads as zeros");
    s.stop();
    // A different size for an existing disk is an error.
    let err = serve_refused_s3(&moto, "s3://vms/disk1/?size=128M");
    assert!(err.contains("not 134217728"), "{err}");
}

/// `chunk=` picks a new disk's chunk size: the bucket holds chunks of that
/// size, a later start reads the manifest's, and a `chunk=` that differs
/// from an existing disk's, is no power of two in 64K..64M, or is smaller
/// than the export's recordsize is refused at start.
#[test]
fn chunk_picks_a_new_disks_chunk_size_and_an_existing_one_keeps_it() {
    let Some(moto) = Moto::start(&[]) else { return };
    moto.ctl(&["mkbucket", "vms"]);
    let s = serve_s3(&moto, tempfile::tempdir().unwrap(), "s3://vms/small/?size=16M&chunk=256K", &[]);
    let data: Vec<u8> = pattern(64 << 10, 0);
    write_flush(&s, (3 << 20) + 4096, &data);
    s.stop();
    // 64K at 3M+4K: chunk 12 of 256K, and only it.
    let sizes = moto.ctl(&["sizes", "vms", "small/c/"]);
    assert_eq!(sizes, "small/c/000000000000000c 262144", "one chunk of 256K stored");
    let s = serve_s3(&moto, tempfile::tempdir().unwrap(), "s3://vms/small/", &[]);
    assert!(read_at(&s, (3 << 20) + 4096, data.len()) == data, "read back without chunk=");
    s.stop();
    let err = serve_refused_s3(&moto, "s3://vms/small/?chunk=1M");
    assert!(err.contains("in chunks of 262144 bytes, not 1048576"), "{err}");
    let err = serve_refused_s3(&moto, "s3://vms/other/?size=16M&chunk=96K");
    assert!(err.contains("not a power of two from 64K to 64M"), "{err}");
    let err = serve_refused_s3(&moto, "s3://vms/other/?size=16M&chunk=128M");
    assert!(err.contains("not a power of two from 64K to 64M"), "{err}");
    let err = serve_refused_s3_with(&moto, "s3://vms/other/?size=16M&chunk=64K", &["--recordsize", "128K"]);
    assert!(err.contains("smaller than the export's recordsize"), "{err}");
    assert!(moto.ctl(&["list", "vms", "other/"]).is_empty(), "nothing made for a refused disk");
}

fn serve_refused_s3(moto: &Moto, uri: &str) -> String {
    serve_refused_s3_with(moto, uri, &[])
}

fn serve_refused_s3_with(moto: &Moto, uri: &str, extra: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new(BIN)
        .args([
            "serve",
            "--export",
            uri,
            "--listen",
            &format!("unix:{}", dir.path().join("r.sock").display()),
        ])
        .args(["--control", dir.path().join("r.ctl").to_str().unwrap()])
        .args(extra)
        .envs(moto.env().iter().map(|(k, v)| (*k, v.clone())))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A server that starts when it should not never exits by itself.
    let out = wait_timeout(child, Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{uri} was served; it was to be refused: {err}");
    err
}

fn s3cmd(moto: &Moto, args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .arg("s3")
        .args(args)
        .envs(moto.env().iter().map(|(k, v)| (*k, v.clone())))
        .output()
        .unwrap()
}

fn show_json(moto: &Moto, uri: &str) -> serde_json::Value {
    let out = s3cmd(moto, &["show", "--json", uri]);
    assert!(out.status.success(), "s3 show: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("s3 show --json prints JSON")
}

/// `s3 create` makes a disk without serving it (again with the same size:
/// left as it is; with another: refused), and `s3 show` prints what the
/// bucket holds of it: the manifest, the lease, the chunks stored.
#[test]
fn s3_create_and_show_tell_a_disk_as_the_bucket_holds_it() {
    let Some(moto) = Moto::start(&[]) else { return };
    moto.ctl(&["mkbucket", "vms"]);
    let made = s3cmd(&moto, &["create", "s3://vms/made/?size=32M&chunk=1M"]);
    let said = String::from_utf8_lossy(&made.stdout);
    assert!(
        made.status.success() && said.contains("made a disk of 33554432 bytes in chunks of 1048576"),
        "{said}"
    );
    let again = s3cmd(&moto, &["create", "s3://vms/made/?size=32M&chunk=1M"]);
    assert!(again.status.success() && String::from_utf8_lossy(&again.stdout).contains("already there"));
    let other = s3cmd(&moto, &["create", "s3://vms/made/?size=64M"]);
    let err = String::from_utf8_lossy(&other.stderr);
    assert!(!other.status.success() && err.contains("not 67108864"), "{err}");
    let v = show_json(&moto, "s3://vms/made/");
    assert_eq!((v["size"].as_u64(), v["chunk_size"].as_u64()), (Some(32 << 20), Some(1 << 20)), "{v}");
    assert_eq!(v["chunks_stored"].as_u64(), Some(0), "{v}");
    assert!(v["lease"].is_null(), "never served: no lease: {v}");

    let s = serve_s3(&moto, tempfile::tempdir().unwrap(), "s3://vms/made/", &[]);
    write_flush(&s, 0, &vec![7u8; 1 << 20]);
    s.stop();
    let v = show_json(&moto, "s3://vms/made/");
    assert_eq!((v["chunks_stored"].as_u64(), v["bytes_stored"].as_u64()), (Some(1), Some(1 << 20)), "{v}");
    assert_eq!(v["lease"]["state"], "released", "released at the clean stop: {v}");
    assert_eq!(v["lease"]["pid"].as_u64().map(|p| p > 0), Some(true), "{v}");
    let text = s3cmd(&moto, &["show", "s3://vms/made/"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("lease: released by host") && text.contains("chunks stored 1 of 32"), "{text}");
    let not_disk = s3cmd(&moto, &["show", "s3://vms/made.img"]);
    assert!(String::from_utf8_lossy(&not_disk.stderr).contains("ending in /"));
    let none = s3cmd(&moto, &["show", "s3://vms/nothing/"]);
    assert!(String::from_utf8_lossy(&none.stderr).contains("holds no disk"));
}

fn break_lease(moto: &Moto, uri: &str, force: bool) -> std::process::Output {
    let mut cmd = Command::new(BIN);
    cmd.args(["s3", "break-lease", uri]).envs(moto.env().iter().map(|(k, v)| (*k, v.clone())));
    if force {
        cmd.arg("--force");
    }
    cmd.output().unwrap()
}

/// One writer: a second server is refused with the holder's identity, a
/// read-only one is served; after kill -9 the lease stays until broken,
/// and every byte acknowledged by a FLUSH on the log is there after.
#[test]
fn one_writer_and_kill9_after_flush_loses_nothing() {
    let Some(moto) = Moto::start(&[]) else { return };
    moto.ctl(&["mkbucket", "vms"]);
    let uri = "s3://vms/d2/?size=32M";
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log.img");
    let log_arg = format!("{}:64M", log.display());
    let s = serve_s3(&moto, dir, uri, &["--log", &log_arg]);
    let err = serve_refused_s3(&moto, uri);
    assert!(err.contains("is held by host") && err.contains("break-lease"), "{err}");
    let ro = serve_s3(&moto, tempfile::tempdir().unwrap(), "s3://vms/d2/", &["--read-only"]);
    drop(ro);
    let data: Vec<u8> = (0..(300u32 << 10)).map(|i| (i % 251) as u8).collect();
    write_flush(&s, 5 << 20, &data);
    let dir = s.kill9();
    let err = serve_refused_s3(&moto, uri);
    assert!(err.contains("is held by host"), "after kill -9 the lease is still held: {err}");
    let out = break_lease(&moto, "s3://vms/d2/", false);
    assert!(!out.status.success(), "a lease renewed just now is not broken without --force");
    let out = break_lease(&moto, "s3://vms/d2/", true);
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("broke the lease"),
        "{out:?}"
    );
    let s = serve_s3(&moto, dir, uri, &["--log", &log_arg]);
    assert!(read_at(&s, 5 << 20, data.len()) == data, "a FLUSHed write survives kill -9");
    s.stop();
}

/// Per-export settings in the config file: an export whose keys and
/// endpoint are its own is served with none of them in the environment,
/// and a key id without its secret is refused at start by name.
#[test]
fn an_exports_own_keys_and_endpoint_come_from_the_config_file() {
    let Some(moto) = Moto::start(&[]) else { return };
    moto.ctl(&["mkbucket", "games"]);
    let dir = tempfile::tempdir().unwrap();
    let (data, _) = put(&moto, dir.path(), "own.img", 2 << 20, 9);
    let config = |extra: &str| {
        format!(
            "[[export]]\nname = \"own\"\nbacking = \"s3://games/own.img\"\ns3_endpoint = \"{}\"\n\
             s3_access_key_id = \"testing\"\n{extra}",
            moto.endpoint()
        )
    };
    let cfg = dir.path().join("own.toml");
    std::fs::write(&cfg, config("s3_secret_access_key = \"testing\"\n")).unwrap();
    let half = dir.path().join("half.toml");
    std::fs::write(&half, config("")).unwrap();
    // Nothing from the environment: no keys, no endpoint, no profile file.
    let bare = [
        ("AWS_ACCESS_KEY_ID", ""),
        ("AWS_SECRET_ACCESS_KEY", ""),
        ("AWS_ENDPOINT_URL", ""),
        ("AWS_PROFILE", ""),
        ("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent"),
        ("AWS_CONFIG_FILE", "/nonexistent"),
    ];
    let out = Command::new(BIN)
        .args(["serve", "--config", half.to_str().unwrap()])
        .args(["--listen", &format!("unix:{}", dir.path().join("h.sock").display())])
        .args(["--control", dir.path().join("h.ctl").to_str().unwrap()])
        .envs(bare)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_timeout(out, Duration::from_secs(30));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("s3_secret_access_key"), "half a key pair: {err}");
    let s = Serve::start_with_env(dir, &["--config", cfg.to_str().unwrap(), "--arc-max", "16M"], &bare);
    let mut c = nbd::Client::connect(&s.target(), "own").unwrap();
    let mut got = vec![0u8; data.len()];
    c.read(0, &mut got).unwrap();
    assert!(got == data, "the export read with its own keys differs from the object");
    s.stop();
}

/// A disk another server changed while this one was stopped: what this
/// one's persistent L2 holds of the old contents is never served after
/// its restart (the lease lets the disk move between servers, so the
/// bucket, not this server's log, says what the disk holds); a disk nobody
/// changed keeps its L2 (a read-only server's).
#[test]
fn an_l2_never_brings_back_what_another_writer_changed_meanwhile() {
    let Some((moto, _keep, reader_args)) = moto_and_reader_l2() else { return };
    let reader: Vec<&str> = reader_args.iter().map(String::as_str).collect();
    let old: Vec<u8> = pattern(1 << 20, 0);
    let new: Vec<u8> = old.iter().map(|b| b ^ 0x5a).collect();
    let b = serve_s3(&moto, tempfile::tempdir().unwrap(), "s3://vms/moved/?size=16M", &[]);
    write_flush(&b, 0, &old);
    b.stop();
    // A reader fills its L2...
    let a = serve_s3(&moto, tempfile::tempdir().unwrap(), "s3://vms/moved/", &reader);
    assert!(read_at(&a, 0, old.len()) == old);
    wait_l2_holds(&a, old.len() as u64);
    a.stop();
    // ...which a start with nobody's change between keeps.
    let a = serve_s3(&moto, tempfile::tempdir().unwrap(), "s3://vms/moved/", &reader);
    let st = restored(&a, 0);
    assert!(read_at(&a, 0, old.len()) == old);
    assert!(a.stat()["l2_hits"].as_u64().unwrap() > 0, "an unchanged disk's L2 was not used: {st}");
    a.stop();
    // Another server rewrites those chunks in place: none of the old
    // bytes comes back.
    let b = serve_s3(&moto, tempfile::tempdir().unwrap(), "s3://vms/moved/", &[]);
    write_flush(&b, 0, &new);
    b.stop();
    // (A reader that does not follow its writer: one that does is
    // a_reader_follows_its_writer_generation_by_generation's.)
    let a = serve_s3(&moto, tempfile::tempdir().unwrap(), "s3://vms/moved/?head_poll_ms=0", &reader);
    let st = restored(&a, 1);
    assert!(read_at(&a, 0, new.len()) == new, "old bytes came back after another server wrote: {st}");
    wait_l2_holds(&a, new.len() as u64);
    // A writer beside the running reader rewrites them: the reader's L2
    // holds the chunks as of its start, and its next start finds them
    // changed.
    let b = serve_s3(&moto, tempfile::tempdir().unwrap(), "s3://vms/moved/", &[]);
    write_flush(&b, 0, &old);
    a.stop();
    b.stop();
    let a = serve_s3(&moto, tempfile::tempdir().unwrap(), "s3://vms/moved/", &reader);
    restored(&a, 1);
    assert!(read_at(&a, 0, old.len()) == old, "a reader's L2 brought back what a writer beside it rewrote");
    a.stop();
}

/// A writer's persistent L2 is bound at its clean stop to the chunks'
/// ETags its own PUTs left, so its clean restart keeps it; a kill -9
/// leaves it bound to nothing (records newer than a disk another server
/// then put back as it was at the last binding must not come back), and
/// another server's change meanwhile discards it too.
#[test]
fn a_writer_keeps_its_l2_of_what_it_wrote_across_restarts() {
    let Some(moto) = Moto::start(&[]) else { return };
    moto.ctl(&["mkbucket", "vms"]);
    let keep = tempfile::tempdir().unwrap();
    let l2_args = persistent_l2_args(keep.path());
    let args: Vec<&str> = l2_args.iter().map(String::as_str).collect();
    let versions: Vec<Vec<u8>> = (0..3u8).map(|v| pattern(1 << 20, v)).collect();
    let len = versions[0].len();
    let fill = |s: &Serve, data: &[u8]| {
        write_flush(s, 0, data);
        assert!(read_at(s, 0, len) == data);
        wait_l2_holds(s, len as u64);
    };
    let w = serve_s3(&moto, tempfile::tempdir().unwrap(), "s3://vms/own/?size=16M", &args);
    fill(&w, &versions[0]);
    w.stop();
    let w = serve_s3(&moto, tempfile::tempdir().unwrap(), "s3://vms/own/", &args);
    let st = restored(&w, 0);
    assert!(
        st["l2_rebuild_bufs"].as_u64().unwrap() > 0,
        "a writer's L2 was given up at a clean restart: {st}"
    );
    assert!(read_at(&w, 0, len) == versions[0]);
    assert!(w.stat()["l2_hits"].as_u64().unwrap() > 0);
    // Rewritten, its L2 filled and logged durably, then killed; another
    // server puts the chunk back as it was at the last binding (the same
    // bytes, so the same ETag): the disk looks as bound, and the records
    // of the rewrite must not come back.
    fill(&w, &versions[1]);
    wait_stat(&w, "the log", |st| st["l2_log_uncommitted_bytes"] == 0);
    let dir = w.kill9();
    let out = break_lease(&moto, "s3://vms/own/", true);
    assert!(out.status.success(), "{out:?}");
    let b = serve_s3(&moto, tempfile::tempdir().unwrap(), "s3://vms/own/", &[]);
    write_flush(&b, 0, &versions[0]);
    b.stop();
    let w = serve_s3(&moto, dir, "s3://vms/own/", &args);
    let st = restored(&w, 1);
    assert!(read_at(&w, 0, len) == versions[0], "the killed writer's newer records came back: {st}");
    wait_l2_holds(&w, len as u64);
    w.stop();
    // A clean stop binds again.
    let w = serve_s3(&moto, tempfile::tempdir().unwrap(), "s3://vms/own/", &args);
    let st = restored(&w, 0);
    assert!(st["l2_rebuild_bufs"].as_u64().unwrap() > 0, "not bound again at a clean stop: {st}");
    w.stop();
    // Another server writes meanwhile: nothing of the writer's L2 is kept.
    let b = serve_s3(&moto, tempfile::tempdir().unwrap(), "s3://vms/own/", &[]);
    write_flush(&b, 0, &versions[2]);
    b.stop();
    let w = serve_s3(&moto, tempfile::tempdir().unwrap(), "s3://vms/own/", &args);
    let st = restored(&w, 1);
    assert!(read_at(&w, 0, len) == versions[2], "old bytes came back after another server wrote: {st}");
    w.stop();
}

/// A writer whose transaction groups changed the disk since it opened it,
/// killed with FLUSHed writes only in its intent log: the log is replayed
/// at the next start (the disk is the same disk to the log, whatever its
/// chunks hold now), and nothing flushed is lost.
#[test]
fn a_log_is_replayed_on_a_disk_its_writer_changed_since_opening_it() {
    let Some(moto) = Moto::start(&[]) else { return };
    moto.ctl(&["mkbucket", "vms"]);
    let uri = "s3://vms/d3/?size=16M";
    let dir = tempfile::tempdir().unwrap();
    let log_arg = format!("{}:64M", dir.path().join("log.img").display());
    let s = serve_s3(&moto, dir, uri, &["--log", &log_arg, "--set", "zfs_txg_timeout=1"]);
    let synced: Vec<u8> = (0..(256u32 << 10)).map(|i| (i % 241) as u8).collect();
    write_flush(&s, 1 << 20, &synced);
    wait_stat(&s, "a txg sync", |st| st["txg_syncs"].as_u64().unwrap_or(0) > 0);
    // Only in the log: a txg every hour from now on.
    let o = s.ctl(&["set", "zfs_txg_timeout=3600"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let logged: Vec<u8> = synced.iter().map(|b| b ^ 0xa5).collect();
    write_flush(&s, 9 << 20, &logged);
    let dir = s.kill9();
    let out = break_lease(&moto, "s3://vms/d3/", true);
    assert!(out.status.success(), "{out:?}");
    let s = serve_s3(&moto, dir, "s3://vms/d3/", &["--log", &log_arg]);
    assert!(read_at(&s, 1 << 20, synced.len()) == synced, "a synced write");
    assert!(read_at(&s, 9 << 20, logged.len()) == logged, "a FLUSHed write only in the log was lost");
    s.stop();
}

/// Reads `len` bytes at `offset` until they are `want` (a reader applies
/// its writer's generations within its poll period); panics with what it
/// last read after `secs`.
fn read_until(s: &Serve, offset: u64, want: &[u8], secs: u64, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    loop {
        let got = read_at(s, offset, want.len());
        if got == want {
            return;
        }
        let differ = got.iter().zip(want).position(|(a, b)| a != b).unwrap_or(0);
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: after {secs} s the reader still serves other bytes (first at {}); {}",
            offset + differ as u64,
            s.stat()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn export_stat(s: &Serve, field: &str) -> u64 {
    s.stat()["export_stats"][0][field].as_u64().unwrap()
}

/// A read-only server of a chunked disk follows its writer: each flush the
/// writer commits (a txg or an in-place commit) publishes a generation in
/// the head object, and the reader, polling it, drops what it caches of
/// every chunk changed (in RAM and on L2) and serves the new bytes: a
/// rewritten chunk, a chunk trimmed whole (deleted: zeros), a chunk
/// written for the first time. A chunk the writer rewrote that the
/// reader reads before it polls is taken at once (its GET is refused:
/// 412). Stopped cleanly, it binds its L2 to the disk as it last applied
/// it, so its restart keeps it.
#[test]
fn a_reader_follows_its_writer_generation_by_generation() {
    let Some((moto, _keep, reader_args)) = moto_and_reader_l2() else { return };
    let reader: Vec<&str> = reader_args.iter().map(String::as_str).collect();
    let mib = 1usize << 20;
    let v0: Vec<u8> = pattern(12 * mib, 0);
    let w = serve_s3(&moto, tempfile::tempdir().unwrap(), "s3://vms/f/?size=32M", &[]);
    write_flush(&w, 0, &v0[..8 * mib]);
    let g1 = show_json(&moto, "s3://vms/f/")["head_generation"]
        .as_u64()
        .expect("a flush after writes commits a head");
    // The reader caches chunks 0 and 1 (4 MiB each), in RAM and on L2.
    let r = serve_s3(&moto, tempfile::tempdir().unwrap(), "s3://vms/f/?head_poll_ms=200", &reader);
    assert!(read_at(&r, 0, 8 * mib) == v0[..8 * mib]);
    wait_l2_holds(&r, 8 * mib as u64);
    // The writer rewrites part of chunk 0, trims chunk 1 whole and writes
    // chunk 2 for the first time.
    let v1: Vec<u8> = v0[..mib].iter().map(|b| b ^ 0x5a).collect();
    write_flush(&w, 0, &v1);
    {
        let mut c = nbd::Client::connect(&w.target(), "").unwrap();
        c.trim(4 << 20, 4 << 20).unwrap();
        c.flush().unwrap();
    }
    write_flush(&w, 8 << 20, &v0[8 * mib..]);
    let g2 = show_json(&moto, "s3://vms/f/")["head_generation"].as_u64().unwrap();
    assert!(g2 >= g1 + 2, "generations {g1} then {g2}");
    let mut want = v1.clone();
    want.extend_from_slice(&v0[mib..4 * mib]);
    want.extend(std::iter::repeat_n(0u8, 4 * mib));
    want.extend_from_slice(&v0[8 * mib..]);
    read_until(&r, 0, &want, 15, "the reader after three generations");
    assert!(export_stat(&r, "store_changes") >= 2, "{}", r.stat());
    // A reader that polls only once an hour: what it cached stays as of
    // its last poll, but a chunk it never read is fetched as the writer
    // left it, the refused GET taking the new ETag.
    let slow =
        serve_s3(&moto, tempfile::tempdir().unwrap(), "s3://vms/f/?head_poll_ms=3600000", &["--read-only"]);
    let v2: Vec<u8> = v0[8 * mib..9 * mib].iter().map(|b| b ^ 0xa5).collect();
    write_flush(&w, 8 << 20, &v2);
    assert!(read_at(&slow, 8 << 20, mib) == v2, "a refused GET did not take the chunk's new ETag");
    read_until(&r, 8 << 20, &v2, 15, "the polling reader after a fourth generation");
    // What it read since fed to its L2 again (the changes dropped the
    // copies it had).
    assert!(read_at(&r, 0, 12 * mib)[8 * mib..9 * mib] == v2[..]);
    wait_l2_holds(&r, 8 * mib as u64);
    slow.stop();
    w.stop();
    r.stop();
    // Stopped cleanly once it had applied the last generation, the
    // reader's L2 is bound to the disk as it follows it: a restart keeps
    // it, and serves the newest bytes from it.
    let r = serve_s3(&moto, tempfile::tempdir().unwrap(), "s3://vms/f/", &reader);
    let st = restored(&r, 0);
    assert!(
        st["l2_rebuild_bufs"].as_u64().unwrap() > 0,
        "a reader that followed lost its L2 at a clean stop: {st}"
    );
    want[8 * mib..9 * mib].copy_from_slice(&v2);
    assert!(read_at(&r, 0, want.len()) == want, "{st}");
    assert!(r.stat()["l2_hits"].as_u64().unwrap() > 0, "{}", r.stat());
    r.stop();
}

/// A reader's persistent L2 vouches for the disk as the reader opened it.
/// Once it follows a change it may hold records of newer chunks; killed
/// then, and the disk put back as it was at its start (the same bytes,
/// the same ETags), its next start must not take those records for the
/// disk's: the first change unbinds them.
#[test]
fn a_reader_that_followed_a_change_never_restores_newer_records() {
    let Some((moto, _keep, reader_args)) = moto_and_reader_l2() else { return };
    let reader: Vec<&str> = reader_args.iter().map(String::as_str).collect();
    let mib = 1usize << 20;
    let old: Vec<u8> = pattern(4 * mib, 0);
    let new: Vec<u8> = old.iter().map(|b| b ^ 0x3c).collect();
    let w = serve_s3(&moto, tempfile::tempdir().unwrap(), "s3://vms/aba/?size=16M", &[]);
    write_flush(&w, 0, &old);
    let r = serve_s3(&moto, tempfile::tempdir().unwrap(), "s3://vms/aba/?head_poll_ms=200", &reader);
    assert!(read_at(&r, 0, old.len()) == old);
    write_flush(&w, 0, &new);
    read_until(&r, 0, &new, 15, "the reader after the rewrite");
    wait_l2_holds(&r, new.len() as u64);
    wait_stat(&r, "the log", |st| st["l2_log_uncommitted_bytes"] == 0);
    let dir = r.kill9();
    write_flush(&w, 0, &old);
    w.stop();
    let r = serve_s3(&moto, dir, "s3://vms/aba/", &reader);
    let st = restored(&r, 1);
    assert!(read_at(&r, 0, old.len()) == old, "records of the newer chunk came back: {st}");
    r.stop();
}

/// A disk made again under the same prefix (every object deleted, a new
/// disk created, its writer started): a reader following the old one sees
/// the new head name another disk and answers EIO from then on, its cached
/// records of the old disk included, rather than mix the two.
#[test]
fn a_reader_of_a_disk_made_again_answers_eio() {
    let Some(moto) = Moto::start(&[]) else { return };
    moto.ctl(&["mkbucket", "vms"]);
    let data: Vec<u8> = pattern(1 << 20, 0);
    let w = serve_s3(&moto, tempfile::tempdir().unwrap(), "s3://vms/re/?size=16M", &[]);
    write_flush(&w, 0, &data);
    w.stop();
    let r = serve_s3(&moto, tempfile::tempdir().unwrap(), "s3://vms/re/?head_poll_ms=100", &["--read-only"]);
    assert!(read_at(&r, 0, data.len()) == data);
    moto.ctl(&["delete", "vms", "re/"]);
    let w = serve_s3(&moto, tempfile::tempdir().unwrap(), "s3://vms/re/?size=16M", &[]);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let mut c = nbd::Client::connect(&r.target(), "").unwrap();
    let mut b = vec![0u8; 4096];
    while c.read(0, &mut b).is_ok() {
        assert!(b == data[..4096], "the reader served other bytes than the old disk's instead of failing");
        assert!(std::time::Instant::now() < deadline, "the reader never noticed the disk was made again");
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(c);
    w.stop();
    r.stop();
}

/// A reader whose poller dies (a panic while it applies a change) answers
/// EIO from then on, its cached records included: it no longer knows
/// which of them the writer has rewritten, and old bytes served as new
/// would be silent wrong data.
#[test]
fn a_reader_whose_poller_died_answers_eio() {
    if !failpoints_armed() {
        return;
    }
    let Some(moto) = Moto::start(&[]) else { return };
    moto.ctl(&["mkbucket", "vms"]);
    let old: Vec<u8> = pattern(1 << 20, 0);
    let new: Vec<u8> = old.iter().map(|b| b ^ 0x77).collect();
    let w = serve_s3(&moto, tempfile::tempdir().unwrap(), "s3://vms/dies/?size=16M", &[]);
    write_flush(&w, 0, &old);
    let mut r = serve_s3_failing(
        &moto,
        tempfile::tempdir().unwrap(),
        "s3://vms/dies/?head_poll_ms=100",
        &["--read-only"],
        "s3.follow.apply=panic",
    );
    assert!(read_at(&r, 0, old.len()) == old);
    write_flush(&w, 0, &new);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let mut c = nbd::Client::connect(&r.target(), "").unwrap();
    let mut b = vec![0u8; 4096];
    let errno = loop {
        match c.read(0, &mut b) {
            Ok(()) => assert!(b == old[..4096], "the dying reader served bytes of neither version"),
            Err(nbd::ClientError::Request { errno, .. }) => break errno,
            Err(e) => panic!("the connection failed instead of the request: {e}"),
        }
        assert!(std::time::Instant::now() < deadline, "a reader whose poller died went on serving");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(errno, 5, "EIO");
    // Every read now, cached or not: none is known to be current.
    for offset in [0u64, 512 << 10, 8 << 20] {
        assert!(c.read(offset, &mut b).is_err(), "a read at {offset} was served after the poller died");
    }
    drop(c);
    w.stop();
    let (status, log) = r.terminate();
    assert!(status.success(), "{log}");
    assert!(log.contains("following the writer failed"), "{log}");
}

/// A reader stopped while a chunk a refused read took is still waiting
/// for its cached records to be dropped (its poller behind) holds records
/// of the chunk's old contents beside a map naming the new: it must not
/// bind its L2 at the stop, or its next start would serve those records
/// as the new chunk's.
#[test]
fn a_reader_stopped_before_dropping_a_changed_chunk_keeps_no_l2() {
    if !failpoints_armed() {
        return;
    }
    let Some((moto, _keep, mut reader_args)) = moto_and_reader_l2() else { return };
    // Only what the test reads is cached: a prefetch of the chunk's rest
    // would leave no part of it to be refused.
    reader_args.extend(["--set".to_string(), "zfs_prefetch_disable=1".to_string()]);
    let reader: Vec<&str> = reader_args.iter().map(String::as_str).collect();
    let mib = 1usize << 20;
    let old: Vec<u8> = pattern(4 * mib, 0);
    let new: Vec<u8> = old.iter().map(|b| b ^ 0xc3).collect();
    let w = serve_s3(&moto, tempfile::tempdir().unwrap(), "s3://vms/behind/?size=16M", &[]);
    write_flush(&w, 0, &old);
    let r = serve_s3_failing(
        &moto,
        tempfile::tempdir().unwrap(),
        "s3://vms/behind/?head_poll_ms=3600000",
        &reader,
        "s3.follow.drop_adopted=return",
    );
    // Its first MiB cached, in RAM and durably on L2.
    assert!(read_at(&r, 0, mib) == old[..mib]);
    wait_l2_holds(&r, mib as u64);
    wait_stat(&r, "the log", |st| st["l2_log_uncommitted_bytes"] == 0);
    write_flush(&w, 0, &new);
    // A part it never read: the GET is refused and takes the new ETag.
    assert!(read_at(&r, 2 << 20, mib) == new[2 * mib..3 * mib], "the refused GET did not adopt");
    w.stop();
    r.stop();
    let r = serve_s3(&moto, tempfile::tempdir().unwrap(), "s3://vms/behind/?head_poll_ms=0", &reader);
    let st = restored(&r, 1);
    assert!(read_at(&r, 0, mib) == new[..mib], "old records came back as the new chunk's: {st}");
    r.stop();
}

/// A deletion the head reports is checked against the bucket before the
/// reader takes it: a refused read may already have taken a newer write of
/// the chunk than the head names (the writer's chunk PUT landed, its head
/// PUT not yet), and a chunk taken as absent reads as zeros with no GET
/// that could be refused, so the reader would go back in time for good.
/// The bucket is made to hold that moment: the head as of the trim, the
/// chunk as written after it.
#[test]
fn a_deletion_the_head_reports_is_checked_against_the_bucket() {
    let Some(moto) = Moto::start(&[]) else { return };
    moto.ctl(&["mkbucket", "vms"]);
    let keep = tempfile::tempdir().unwrap();
    let mib = 1usize << 20;
    let old: Vec<u8> = pattern(4 * mib, 0);
    let new: Vec<u8> = old.iter().map(|b| b ^ 0x3c).collect();
    let w = serve_s3(&moto, tempfile::tempdir().unwrap(), "s3://vms/gone/?size=16M", &[]);
    write_flush(&w, 0, &old);
    let g1 = show_json(&moto, "s3://vms/gone/")["head_generation"].as_u64().expect("a head");
    // The reader's log at info for the S3 crate: it says when it kept a
    // chunk the head has deleted, which shows this test reached that.
    let mut r = serve_s3_with_env(
        &moto,
        tempfile::tempdir().unwrap(),
        "s3://vms/gone/?head_poll_ms=3600000",
        &["--read-only", "--set", "zfs_prefetch_disable=1"],
        &[("RUST_LOG", "warn,arcache_s3=info")],
    );
    assert!(read_at(&r, 0, mib) == old[..mib]);
    // The poller's one round before the refused GET (the one its start
    // asks for) must be over before the writer's next head lands: later,
    // it would apply that head itself and no GET would be refused.
    std::thread::sleep(Duration::from_millis(1000));
    // The writer trims chunk 0 whole (deleting its object), then writes it
    // again; the head as of the trim is kept aside.
    {
        let mut c = nbd::Client::connect(&w.target(), "").unwrap();
        c.trim(0, 4 << 20).unwrap();
        c.flush().unwrap();
    }
    let g2 = show_json(&moto, "s3://vms/gone/")["head_generation"].as_u64().unwrap();
    assert!(g2 > g1, "the trim committed no generation ({g1}, {g2})");
    let saved = keep.path().join("head-at-trim");
    moto.ctl(&["get", "vms", "gone/arcache-head", saved.to_str().unwrap()]);
    write_flush(&w, 0, &new);
    w.stop();
    moto.ctl(&["put", "vms", "gone/arcache-head", saved.to_str().unwrap()]);
    assert_eq!(show_json(&moto, "s3://vms/gone/")["head_generation"].as_u64(), Some(g2));
    // A part the reader never read: its GET is refused and takes the
    // chunk's newest ETag, which wakes the poller, which finds the head as
    // of the trim.
    assert!(read_at(&r, 2 << 20, mib) == new[2 * mib..3 * mib], "the refused GET did not adopt");
    read_until(&r, 0, &new[..mib], 15, "the reader after its refused GET");
    let until = std::time::Instant::now() + Duration::from_millis(1500);
    while std::time::Instant::now() < until {
        let got = read_at(&r, 0, mib);
        assert!(
            got == new[..mib],
            "the reader went back to {}",
            if got.iter().all(|&b| b == 0) { "zeros" } else { "other bytes" }
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (status, log) = r.terminate();
    assert!(status.success(), "{log}");
    assert!(
        log.contains("chunk 0 is absent from the head or listing, but the bucket holds it"),
        "the poller never applied the head as of the trim: {log}"
    );
}

/// A reader stopped while a round of its poller is between taking a
/// change into the chunk map and dropping the chunk's cached records: the
/// stop waits for the round, so the cache holds the disk as the map says
/// when the L2 is bound, and the restart keeps the L2 and serves the new
/// bytes. A stop that did not wait would find the change half applied and
/// bind nothing (the restart then discards the L2), or close the caches
/// under the round.
#[test]
fn a_reader_stopped_during_a_round_waits_for_it_and_keeps_its_l2() {
    if !failpoints_armed() {
        return;
    }
    let Some((moto, _keep, reader_args)) = moto_and_reader_l2() else { return };
    let reader: Vec<&str> = reader_args.iter().map(String::as_str).collect();
    let mib = 1usize << 20;
    let old: Vec<u8> = pattern(8 * mib, 0);
    let new: Vec<u8> = old[..mib].iter().map(|b| b ^ 0x99).collect();
    let w = serve_s3(&moto, tempfile::tempdir().unwrap(), "s3://vms/mid/?size=16M", &[]);
    write_flush(&w, 0, &old);
    let hold = Duration::from_secs(4);
    let mut r = serve_s3_failing(
        &moto,
        tempfile::tempdir().unwrap(),
        "s3://vms/mid/?head_poll_ms=100",
        &reader,
        &format!("s3.follow.before_drop=sleep({})", hold.as_millis()),
    );
    assert!(read_at(&r, 0, 8 * mib) == old);
    wait_l2_holds(&r, 8 * mib as u64);
    wait_stat(&r, "the log", |st| st["l2_log_uncommitted_bytes"] == 0);
    // The writer's next generation rewrites chunk 0; the reader's poller
    // takes it within about 100 ms and then holds for `hold`.
    write_flush(&w, 0, &new);
    std::thread::sleep(Duration::from_millis(1000));
    let asked = std::time::Instant::now();
    let (status, log) = r.terminate();
    let took = asked.elapsed();
    assert!(status.success(), "{log}");
    assert!(
        took >= Duration::from_millis(1500),
        "the stop took {took:?}: it did not wait for the round under way (or the round had not begun)"
    );
    w.stop();
    let r = serve_s3(&moto, tempfile::tempdir().unwrap(), "s3://vms/mid/", &reader);
    let st = restored(&r, 0);
    assert!(st["l2_rebuild_bufs"].as_u64().unwrap() > 0, "the reader's L2 was not kept: {st}");
    let mut want = old.clone();
    want[..mib].copy_from_slice(&new);
    assert!(read_at(&r, 0, want.len()) == want, "{st}");
    assert!(r.stat()["l2_hits"].as_u64().unwrap() > 0, "{}", r.stat());
    r.stop();
}

/// Two servers in one process (as an embedder may run them), each with a
/// disk of its own: the first one's clean stop gives back its own disk's
/// lease only, and the second goes on writing to its disk until its own
/// stop (once, every stop gave back every lease of the process).
#[test]
fn a_stop_gives_back_only_its_own_servers_leases() {
    let Some(moto) = Moto::start(&[]) else { return };
    moto.ctl(&["mkbucket", "vms"]);
    let start = |dir: &Path, disk: &str| {
        start_in_process_s3(dir, "", &format!("s3://vms/{disk}/?size=16M"), moto.endpoint())
    };
    let write = |dir: &Path, fill: u8| {
        let mut c = nbd::Client::connect(&nbd::Target::Unix(dir.join("nbd.sock")), "").expect("connect");
        c.write(1 << 20, &[fill; 65536], false).expect("write");
        c.flush().expect("FLUSH");
    };
    let lease = |disk: &str| show_json(&moto, &format!("s3://vms/{disk}/"))["lease"]["state"].clone();
    let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let first = start(one.path(), "first");
    let second = start(two.path(), "second");
    write(one.path(), 1);
    write(two.path(), 2);
    first.stop().expect("the first server's stop");
    assert_eq!(lease("first"), "released", "the stopped server's own disk");
    assert_eq!(lease("second"), "held", "the running server's disk");
    write(two.path(), 3);
    second.stop().expect("the second server's stop");
    assert_eq!(lease("second"), "released");
    let s = serve_s3(&moto, tempfile::tempdir().unwrap(), "s3://vms/second/", &[]);
    assert!(read_at(&s, 1 << 20, 65536).iter().all(|&b| b == 3), "the write after the other's stop");
    s.stop();
}

/// A start that fails before anything was written gives back the leases
/// it took: a later export that cannot be opened, an L2 that cannot be
/// made. The next start needs no `break-lease`.
#[test]
fn a_failed_start_gives_back_the_leases_it_took() {
    let Some(moto) = Moto::start(&[]) else { return };
    moto.ctl(&["mkbucket", "vms"]);
    let dir = tempfile::tempdir().unwrap();
    let no_l2 = format!("{}:64M", dir.path().join("missing/l2.img").display());
    let cases: [&[&str]; 2] = [&["--export", "b=s3://nobucket/x/?size=16M"], &["--l2", no_l2.as_str()]];
    for extra in cases {
        let err = serve_refused_s3_with(&moto, "a=s3://vms/a/?size=16M", extra);
        assert_eq!(show_json(&moto, "s3://vms/a/")["lease"]["state"], "released", "{extra:?}: {err}");
        let s = serve_s3(&moto, tempfile::tempdir().unwrap(), "a=s3://vms/a/", &[]);
        s.stop();
    }
}
