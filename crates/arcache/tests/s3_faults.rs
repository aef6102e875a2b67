//! S3 faults through the real binary and NBD (issue 21's fault bullet):
//! 5xx, SlowDown, resets and slow answers are retried, byte-exact; a fault
//! that outlasts the retry budget is EIO for that request only; writes
//! during a fault stay dirty and reach the bucket once it clears; wrong
//! credentials, a missing bucket and 403 stop `arcache serve` at start
//! with a message naming the cause. The same proxy counts the requests
//! of two workloads that must stay few: a txg's chunk PUTs, and the GETs
//! of sequential readers.
//!
//! Faults come from `tests/s3/faultproxy.py` between arcache and moto (a
//! real S3 server started per test from the venv `.ci/run` makes,
//! `ARCACHE_MOTO_VENV`); every test asserts the proxy's counters, so a
//! fault that was never injected fails it. Everything is on 127.0.0.1.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{json, Value};

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// A child process killed on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn wait_listening(port: u16, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "{what} did not listen on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `tests/s3/faultproxy.py` in front of an S3 server.
struct Proxy {
    _proc: Proc,
    port: u16,
}

impl Proxy {
    fn start(s3: &Moto) -> Proxy {
        let dir = tempfile::tempdir().unwrap();
        let port_file = dir.path().join("port");
        let child = Command::new(&s3.python)
            .arg(format!("{ROOT}/tests/s3/faultproxy.py"))
            .arg(s3.endpoint())
            .arg(&port_file)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start faultproxy.py");
        let proc = Proc(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        let port = loop {
            if let Some(p) = std::fs::read_to_string(&port_file).ok().and_then(|t| t.trim().parse().ok()) {
                break p;
            }
            assert!(Instant::now() < deadline, "faultproxy.py did not start");
            std::thread::sleep(Duration::from_millis(50));
        };
        wait_listening(port, "faultproxy.py");
        Proxy { _proc: proc, port }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// One control request; the proxy answers with its counters.
    fn control(&self, method: &str, what: &str, body: &str) -> Value {
        let mut c = TcpStream::connect(("127.0.0.1", self.port)).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let req = format!(
            "{method} /__faultproxy/{what} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
        c.write_all(req.as_bytes()).unwrap();
        let mut out = String::new();
        c.read_to_string(&mut out).unwrap();
        let (head, json) = out.split_once("\r\n\r\n").expect("an HTTP answer");
        assert!(head.starts_with("HTTP/1.1 200"), "faultproxy {what}: {out}");
        serde_json::from_str(json).unwrap()
    }

    /// Applies `rule` from now on (see faultproxy.py), counters kept.
    fn rule(&self, rule: Value) {
        self.control("POST", "rule", &rule.to_string());
    }

    fn pass(&self) {
        self.rule(json!({}));
    }

    fn stats(&self) -> Value {
        self.control("GET", "stats", "")
    }

    fn injected(&self, kind: &str) -> u64 {
        self.stats()["injected"][kind].as_u64().unwrap_or(0)
    }
}

/// moto with `buckets` made, and the proxy in front of it.
fn moto_behind_proxy(buckets: &[&str]) -> Option<(Moto, Proxy)> {
    let s3 = Moto::start(&[])?;
    for b in buckets {
        s3.ctl(&["mkbucket", b]);
    }
    let proxy = Proxy::start(&s3);
    Some((s3, proxy))
}

fn s3_env(endpoint: &str) -> Vec<(&'static str, String)> {
    vec![
        ("AWS_ACCESS_KEY_ID", "testing".into()),
        ("AWS_SECRET_ACCESS_KEY", "testing".into()),
        ("AWS_ENDPOINT_URL", endpoint.to_string()),
        ("AWS_PROFILE", String::new()),
    ]
}

fn serve(endpoint: &str, args: &[&str]) -> Serve {
    let env = s3_env(endpoint);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut all = vec!["--arc-max", "64M", "--set", "zfs_prefetch_disable=1"];
    all.extend_from_slice(args);
    Serve::start_with_env(tempfile::tempdir().unwrap(), &all, &env)
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    (0..len as u32).map(|i| (i.wrapping_add(seed).wrapping_mul(2_654_435_761) >> 11) as u8).collect()
}

fn read(c: &mut nbd::Client, offset: u64, len: usize) -> std::io::Result<Vec<u8>> {
    let mut b = vec![0u8; len];
    c.read(offset, &mut b).map(|_| b).map_err(|e| std::io::Error::other(format!("{e}")))
}

fn timed<T>(limit: Duration, what: &str, f: impl FnOnce() -> T) -> T {
    let t = Instant::now();
    let r = f();
    assert!(t.elapsed() < limit, "{what} took {:?}, more than {limit:?}", t.elapsed());
    r
}

/// Transient faults while reading an object and while txgs write a chunked
/// disk: 500s, 503 SlowDown, resets before and mid-answer, slow answers,
/// and resets after the server acted on a conditional PUT (its answer
/// lost). Every read is byte-exact, every FLUSH succeeds, and what reaches
/// the bucket is what was written; the proxy counted each fault.
#[test]
fn transient_faults_are_retried_and_the_data_is_byte_exact() {
    let Some((s3, proxy)) = moto_behind_proxy(&["games", "vms"]) else { return };
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    let object = random_file(&img, 8 << 20, 21);
    s3.ctl(&["put", "games", "disk.img", img.to_str().unwrap()]);
    let s = serve(
        &proxy.endpoint(),
        &["--export", "obj=s3://games/disk.img", "--export", "disk=s3://vms/d/?size=32M"],
    );

    let mut obj = nbd::Client::connect(&s.target(), "obj").unwrap();
    let reads = [
        (json!({"fault": "500", "count": 3, "methods": ["GET"]}), "500", 3),
        (json!({"fault": "slowdown", "count": 3, "methods": ["GET"]}), "slowdown", 3),
        (json!({"fault": "reset", "count": 3, "methods": ["GET"]}), "reset", 3),
        (json!({"fault": "reset_body", "count": 2, "methods": ["GET"]}), "reset_body", 2),
        (json!({"fault": "delay", "delay": 0.5, "count": 1, "methods": ["GET"]}), "delay", 1),
        (json!({"fault": "503", "rate": 0.5, "seed": 7, "methods": ["GET"]}), "503", 2),
    ];
    for (i, (rule, kind, at_least)) in reads.into_iter().enumerate() {
        proxy.rule(rule);
        // 1 MiB in reads of 128 KiB: a ranged GET each.
        for piece in 0..8u64 {
            let at = ((i as u64) << 20) + (piece << 17);
            let got = timed(Duration::from_secs(30), kind, || read(&mut obj, at, 128 << 10))
                .unwrap_or_else(|e| panic!("a read under transient {kind} faults failed: {e}"));
            assert!(got[..] == object[at as usize..][..128 << 10], "bytes differ under {kind} faults");
        }
        let n = proxy.injected(kind);
        assert!(n >= at_least, "{kind}: {n} faults injected, wanted {at_least}: {}", proxy.stats());
    }
    proxy.pass();

    // Txg writes: the FLUSH (no log) writes the dirty pages to the bucket.
    let mut disk = nbd::Client::connect(&s.target(), "disk").unwrap();
    let mut written = Vec::new();
    let writes = [
        (json!({"fault": "slowdown", "count": 2, "methods": ["PUT"], "path": "/d/c/"}), "slowdown", 0u64),
        (json!({"fault": "500", "count": 2, "methods": ["PUT"], "path": "/d/c/"}), "500", 4 << 20),
        (json!({"fault": "reset", "count": 2, "methods": ["PUT"], "path": "/d/c/"}), "reset", 8 << 20),
        // A create-only PUT that landed, its answer lost: the retry's 412
        // is our own write.
        (
            json!({"fault": "reset_after", "count": 1, "methods": ["PUT"], "path": "/d/c/"}),
            "reset_after",
            12 << 20,
        ),
        // The same for an If-Match PUT over a chunk that exists.
        (
            json!({"fault": "reset_after", "count": 1, "methods": ["PUT"], "path": "/d/c/"}),
            "reset_after",
            (12 << 20) + (512 << 10),
        ),
        // And for a read-modify-write's GET of that chunk.
        (
            json!({"fault": "reset", "count": 1, "methods": ["GET"], "path": "/d/c/"}),
            "reset",
            (13 << 20) + 4096,
        ),
    ];
    for (i, (rule, kind, at)) in writes.into_iter().enumerate() {
        let before = proxy.injected(kind);
        proxy.rule(rule);
        let data = pattern(256 << 10, i as u32);
        disk.write(at, &data, false).unwrap();
        timed(Duration::from_secs(40), kind, || disk.flush())
            .unwrap_or_else(|e| panic!("a FLUSH under transient {kind} faults failed: {e}"));
        assert!(
            proxy.injected(kind) > before,
            "no {kind} fault was injected on write {i}: {}",
            proxy.stats()
        );
        written.push((at, data));
    }
    proxy.pass();
    let st = s.stat();
    eprintln!(
        "faults injected: {}; server backing_errors {}",
        proxy.stats()["injected"],
        st["backing_errors"]
    );
    assert_eq!(st["backing_errors"], 0, "transient faults reached a client");
    s.stop();

    // What the bucket holds, read by a server talking to moto directly.
    let s = serve(&s3.endpoint(), &["--export", "disk=s3://vms/d/"]);
    let mut c = nbd::Client::connect(&s.target(), "disk").unwrap();
    for (at, data) in &written {
        assert!(read(&mut c, *at, data.len()).unwrap() == *data, "the bucket lacks the write at {at}");
    }
    s.stop();
}

/// A fault that outlasts the export's retry budget (`retry_timeout=2`):
/// that read gets EIO after about the budget, while cached data of the
/// same export, another export and the same connection go on; once the
/// fault clears, the same read succeeds byte-exact.
#[test]
fn a_persistent_fault_is_eio_for_that_read_only_and_clears() {
    let Some((s3, proxy)) = moto_behind_proxy(&["games"]) else { return };
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    let object = random_file(&img, 4 << 20, 22);
    s3.ctl(&["put", "games", "disk.img", img.to_str().unwrap()]);
    let good = dir.path().join("good.img");
    let local = random_file(&good, 1 << 20, 23);
    let good_arg = format!("good={}", good.display());
    let s = serve(
        &proxy.endpoint(),
        &["--export", "obj=s3://games/disk.img?retry_timeout=2", "--export", &good_arg],
    );
    let mut obj = nbd::Client::connect(&s.target(), "obj").unwrap();
    let mut other = nbd::Client::connect(&s.target(), "good").unwrap();
    assert!(read(&mut obj, 0, 65536).unwrap()[..] == object[..65536]);

    for (n, kind) in ["slowdown", "reset"].into_iter().enumerate() {
        proxy.rule(json!({"fault": kind, "methods": ["GET"], "path": "/games/"}));
        let at = (1 + n as u64) << 20;
        let err =
            timed(Duration::from_secs(20), "a read past the retry budget", || read(&mut obj, at, 65536));
        assert!(err.is_err(), "a read whose every GET fails ({kind}) must fail with EIO");
        let tries = proxy.injected(kind);
        assert!(tries >= 3, "the failing read was retried before EIO ({kind}: {tries} faults)");
        // The same connection, cached data, and another export go on.
        assert!(read(&mut obj, 0, 65536).unwrap()[..] == object[..65536], "cached data is still served");
        assert!(read(&mut other, 4096, 4096).unwrap()[..] == local[4096..8192], "another export is served");
        proxy.pass();
        let again = read(&mut obj, at, 65536).expect("once the fault clears, the read succeeds");
        assert!(again[..] == object[at as usize..][..65536]);
        eprintln!("{kind}: {tries} faults injected before EIO");
    }
    let st = s.stat();
    assert!(st["backing_errors"].as_u64().unwrap() >= 2, "{st}");
    s.stop();
}

/// Writes during a fault that outlasts the retry budget: without a log the
/// FLUSH gets EIO but the data stays dirty (reads return it) and is
/// retried; with a log the FLUSH succeeds. After the fault clears, every
/// byte reaches the bucket, as a fresh server reading it directly shows.
#[test]
fn writes_during_a_persistent_fault_are_kept_and_reach_the_bucket() {
    let Some((s3, proxy)) = moto_behind_proxy(&["vms"]) else { return };
    for (n, with_log) in [false, true].into_iter().enumerate() {
        let log_dir = tempfile::tempdir().unwrap();
        let log_arg = format!("{}:64M", log_dir.path().join("log.img").display());
        let uri = format!("disk=s3://vms/d{n}/?size=32M&retry_timeout=2");
        let mut args = vec!["--export", uri.as_str()];
        if with_log {
            args.extend(["--log", log_arg.as_str()]);
        }
        let s = serve(&proxy.endpoint(), &args);
        let mut c = nbd::Client::connect(&s.target(), "disk").unwrap();
        let first = pattern(1 << 20, 40);
        c.write(1 << 20, &first, false).unwrap();
        c.flush().unwrap();

        // Every chunk PUT fails: 500s and resets, for longer than the budget.
        let kind = if with_log { "reset" } else { "500" };
        proxy.rule(json!({"fault": kind, "methods": ["PUT"], "path": "/c/"}));
        let before = proxy.injected(kind);
        let second = pattern(3 << 20, 41);
        let third = pattern(512 << 10, 42);
        c.write(3 << 20, &second, false).unwrap();
        c.write(20 << 20, &third, false).unwrap();
        let flushed = timed(Duration::from_secs(60), "a FLUSH during the fault", || c.flush());
        if with_log {
            flushed.expect("with a log, a FLUSH is durable in the log while the bucket fails");
            // Let a txg try (and fail) to reach the bucket.
            let deadline = Instant::now() + Duration::from_secs(30);
            while s.stat()["txg_sync_errors"].as_u64().unwrap_or(0) == 0 {
                assert!(Instant::now() < deadline, "no txg sync was tried during the fault: {}", s.stat());
                std::thread::sleep(Duration::from_millis(200));
            }
        } else {
            assert!(flushed.is_err(), "a FLUSH whose data cannot reach the bucket must fail");
        }
        assert!(proxy.injected(kind) > before, "no {kind} fault was injected: {}", proxy.stats());
        // Dirty data is kept: reads return it during the fault.
        assert!(read(&mut c, 3 << 20, second.len()).unwrap() == second, "dirty data must not be dropped");
        assert!(read(&mut c, 20 << 20, third.len()).unwrap() == third);
        let injected = proxy.injected(kind) - before;

        proxy.pass();
        timed(Duration::from_secs(60), "a FLUSH after the fault", || c.flush())
            .expect("once the fault clears, the FLUSH succeeds");
        let st = s.stat();
        eprintln!(
            "log {with_log}: {injected} {kind} faults injected; txg_sync_errors {}",
            st["txg_sync_errors"]
        );
        drop(c);
        s.stop();

        // The bucket has every byte: a fresh server, no log, no proxy.
        let during = format!("log {with_log}: a write made during the fault is not in the bucket");
        assert_in_bucket(
            &s3.endpoint(),
            &format!("disk=s3://vms/d{n}/"),
            &[
                (1 << 20, &first, "before the fault"),
                (3 << 20, &second, &during),
                (20 << 20, &third, &during),
            ],
        );
    }
}

/// `arcache serve` refusing to start, with its standard error.
fn refused(env: &[(&str, &str)], export: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new(BIN)
        .args(["serve", "--export", export, "--listen"])
        .arg(format!("unix:{}", dir.path().join("r.sock").display()))
        .arg("--control")
        .arg(dir.path().join("r.ctl"))
        .env("AWS_PROFILE", "")
        .env("AWS_SHARED_CREDENTIALS_FILE", dir.path().join("none"))
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = wait_timeout(child, Duration::from_secs(60));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{export} was served; it was to be refused: {err}");
    err
}

/// Wrong credentials (unknown key id, wrong secret), a user denied access
/// (403 AccessDenied), and a missing bucket stop `arcache serve` at start,
/// for an object and for a chunked disk, saying which. moto checks
/// signatures once its first actions (the set-up) are spent.
#[test]
fn wrong_credentials_403_and_a_missing_bucket_are_clear_errors_at_start() {
    // Seven unauthenticated actions make the bucket, the object and two
    // users; every request after is checked.
    let Some(s3) = Moto::start(&[("INITIAL_NO_AUTH_ACTION_COUNT", "7")]) else { return };
    let setup = r#"
import boto3, json, sys
kw = dict(endpoint_url=sys.argv[1], region_name="us-east-1", aws_access_key_id="testing", aws_secret_access_key="testing")
s3, iam = boto3.client("s3", **kw), boto3.client("iam", **kw)
s3.create_bucket(Bucket="data")
s3.put_object(Bucket="data", Key="disk.img", Body=b"x" * 65536)
iam.create_user(UserName="admin")
iam.put_user_policy(UserName="admin", PolicyName="all", PolicyDocument=json.dumps(
    {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:*", "Resource": "*"}]}))
admin = iam.create_access_key(UserName="admin")["AccessKey"]
iam.create_user(UserName="nobody")
nobody = iam.create_access_key(UserName="nobody")["AccessKey"]
print(json.dumps([admin["AccessKeyId"], admin["SecretAccessKey"], nobody["AccessKeyId"], nobody["SecretAccessKey"]]))
"#;
    let out = Command::new(&s3.python).arg("-c").arg(setup).arg(s3.endpoint()).output().unwrap();
    assert!(out.status.success(), "setting up users: {}", String::from_utf8_lossy(&out.stderr));
    let keys: Vec<String> = serde_json::from_slice(&out.stdout).unwrap();
    let ep = s3.endpoint();
    let as_user = |id: &str, secret: &str| -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID", id.to_string()),
            ("AWS_SECRET_ACCESS_KEY", secret.to_string()),
            ("AWS_ENDPOINT_URL", ep.clone()),
        ]
    };
    let cases = [
        (as_user("AKIAUNKNOWNUNKNOWN00", "wrong"), "wrong credentials", "InvalidAccessKeyId"),
        (as_user(&keys[0], "not-the-secret"), "wrong credentials", "SignatureDoesNotMatch"),
        (as_user(&keys[2], &keys[3]), "access denied", "AccessDenied"),
    ];
    for (env, says, code) in &cases {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        for export in ["s3://data/disk.img", "s3://data/vm/?size=16M"] {
            let err = refused(&env, export);
            assert!(
                err.contains(says) && err.contains(code) && err.contains("s3://data/"),
                "{export}: {err}"
            );
        }
    }
    let admin = as_user(&keys[0], &keys[1]);
    let admin: Vec<(&str, &str)> = admin.iter().map(|(k, v)| (*k, v.as_str())).collect();
    for export in ["s3://nobucket/disk.img", "s3://nobucket/vm/?size=16M"] {
        let err = refused(&admin, export);
        assert!(err.contains("the bucket nobucket does not exist"), "{export}: {err}");
    }
    let err = refused(&admin, "s3://data/none.img");
    assert!(err.contains("no object none.img in bucket data"), "{err}");
    // The right keys are served: the refusals above were about them.
    let s = Serve::start_with_env(tempfile::tempdir().unwrap(), &["--export", "s3://data/disk.img"], &admin);
    let mut c = nbd::Client::connect(&s.target(), "").unwrap();
    assert!(read(&mut c, 0, 4096).unwrap().iter().all(|&b| b == b'x'));
    drop(c);
    s.stop();
}

/// 403 answered by the proxy (as a server's policy would) for every
/// request: the start fails at once with the cause, not after retries.
#[test]
fn a_403_at_start_is_not_retried_and_says_access_denied() {
    let Some((_s3, proxy)) = moto_behind_proxy(&["vms"]) else { return };
    proxy.rule(json!({"fault": "403"}));
    let env = s3_env(&proxy.endpoint());
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    for export in ["s3://vms/disk.img", "s3://vms/d/?size=16M"] {
        let before = proxy.injected("403");
        let err = timed(Duration::from_secs(10), "a refused start", || refused(&env, export));
        assert!(err.contains("access denied (403 AccessDenied)"), "{export}: {err}");
        let n = proxy.injected("403") - before;
        assert!((1..=3).contains(&n), "{export}: {n} requests refused; a 403 is not retried");
    }
}

/// A txg writes each chunk it changes once: 64 scattered 4K writes into
/// two chunks reach the bucket as one PUT per chunk (and one GET for the
/// chunk that exists and is not covered whole), not a read-modify-write
/// each; the bytes are all there after a restart.
#[test]
fn a_txg_writes_each_chunk_it_changes_once() {
    let Some((_s3, proxy)) = moto_behind_proxy(&["vms"]) else { return };
    let disk = "d=s3://vms/t/?size=16M";
    let mut want = vec![0u8; 8 << 20];
    let s = serve(&proxy.endpoint(), &["--export", disk]);
    let mut c = nbd::Client::connect(&s.target(), "d").unwrap();
    let first = pattern(4 << 20, 1);
    c.write(0, &first, false).unwrap();
    c.flush().unwrap();
    want[..4 << 20].copy_from_slice(&first);
    proxy.control("POST", "reset", "");
    for i in 0..64u64 {
        // Every other 4K of chunk 0's first half and chunk 1's first half.
        let offset = (i % 2) * (4 << 20) + (i / 2) * 8192;
        let data = pattern(4096, 100 + i as u32);
        c.write(offset, &data, false).unwrap();
        want[offset as usize..offset as usize + 4096].copy_from_slice(&data);
    }
    c.flush().unwrap();
    let st = proxy.stats();
    let (puts, gets) =
        (st["by_method"]["PUT"].as_u64().unwrap_or(0), st["by_method"]["GET"].as_u64().unwrap_or(0));
    // Two chunks; a txg the timer started meanwhile or a lease renewal
    // may add a few. Written one by one it would be 64 PUTs and 32 GETs.
    assert!((2..=5).contains(&puts), "chunk PUTs for 64 writes into 2 chunks: {puts} ({st})");
    assert!((1..=3).contains(&gets), "chunk GETs: {gets} ({st})");
    drop(c);
    s.stop();
    let s = serve(&proxy.endpoint(), &["--export", disk]);
    let mut c = nbd::Client::connect(&s.target(), "d").unwrap();
    assert!(read(&mut c, 0, want.len()).unwrap() == want, "the disk differs from what was written");
    drop(c);
    s.stop();
}

/// Four sequential readers of one object at once, each over its own quarter
/// (two 8 MiB read units), in 256 KiB reads, on four connections, with
/// zfetch on as by default: every byte as stored, and the object comes
/// from the bucket once, mostly in whole units, not a GET per read or per
/// prefetch. `backing_read_units=0` shows the count tells the two apart.
#[test]
fn four_sequential_readers_take_an_object_in_few_large_gets() {
    let Some((s3, proxy)) = moto_behind_proxy(&["games"]) else { return };
    const SIZE: usize = 64 << 20;
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    let object = std::sync::Arc::new(random_file(&img, SIZE, 44));
    s3.ctl(&["put", "games", "disk.img", img.to_str().unwrap()]);
    let gets = |units: &str| {
        let env = s3_env(&proxy.endpoint());
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let args = ["--arc-max", "256M", "--set", units, "--export", "obj=s3://games/disk.img"];
        let s = Serve::start_with_env(tempfile::tempdir().unwrap(), &args, &env);
        proxy.control("POST", "reset", "");
        let readers: Vec<_> = (0..4usize)
            .map(|q| {
                let (target, object, units) = (s.target(), std::sync::Arc::clone(&object), units.to_string());
                std::thread::spawn(move || {
                    let mut c = nbd::Client::connect(&target, "obj").unwrap();
                    let quarter = SIZE / 4;
                    for at in (q * quarter..(q + 1) * quarter).step_by(256 << 10) {
                        let got = read(&mut c, at as u64, 256 << 10).unwrap();
                        assert!(got[..] == object[at..at + (256 << 10)], "{units}: bytes differ at {at}");
                    }
                })
            })
            .collect();
        timed(Duration::from_secs(60), "four readers", || {
            readers.into_iter().for_each(|r| r.join().unwrap())
        });
        // Read-ahead still in flight is counted too: the counts are taken
        // once they stop moving.
        let counts = || {
            let gets = proxy.stats()["by_method"]["GET"].as_u64().unwrap_or(0);
            (gets, s.stat()["backing_read_bytes"].as_u64().unwrap())
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut last = counts();
        let (got, bytes) = loop {
            std::thread::sleep(Duration::from_millis(300));
            let now = counts();
            if now == last {
                break now;
            }
            assert!(Instant::now() < deadline, "{units}: reads from the bucket still going after 10 s");
            last = now;
        };
        s.stop();
        assert_eq!(bytes, SIZE as u64, "{units}: bytes read from the bucket for a {SIZE}-byte object");
        got
    };
    let units = gets("backing_read_units=1");
    let pieces = gets("backing_read_units=0");
    // 8 units, and at each reader's start a few smaller GETs: its first
    // misses come before zfetch has seen a stream, and its first stream
    // miss reads on to the end of the unit it is in (measured: 23 to 26 in
    // all; without units 130 to 144, for 256 reads of 256 KiB).
    assert!((8..=32).contains(&units), "GETs for 64 MiB in 8 MiB units by four readers: {units}");
    assert!(pieces > 3 * units, "without read units: {pieces} GETs against {units}; the count tells nothing");
}

/// Self-fence: a writer whose lease renewals keep failing stops writing to
/// the bucket after three renewal periods (a FLUSH without a log fails, the
/// data stays dirty, no chunk reaches the bucket), and goes on once a
/// renewal succeeds again; nothing written meanwhile is lost.
#[test]
fn a_writer_that_cannot_renew_its_lease_stops_writing_until_it_can() {
    let Some((s3, proxy)) = moto_behind_proxy(&["vms"]) else { return };
    let export = "disk=s3://vms/f/?size=16M&retry_timeout=1&lease_renew=1";
    let s = serve(&proxy.endpoint(), &["--export", export]);
    let mut c = nbd::Client::connect(&s.target(), "disk").unwrap();
    let first = pattern(64 << 10, 50);
    c.write(0, &first, false).unwrap();
    c.flush().unwrap();

    proxy.rule(json!({"fault": "503", "methods": ["PUT"], "path": "arcache-lease"}));
    // Renewed every second: past three seconds without one, it fences.
    std::thread::sleep(Duration::from_secs(5));
    assert!(proxy.injected("503") > 0, "no renewal was refused: {}", proxy.stats());
    let second = pattern(64 << 10, 51);
    c.write(8 << 20, &second, false).unwrap();
    assert!(c.flush().is_err(), "a FLUSH while the lease cannot be renewed must fail");
    let chunks = s3.ctl(&["list", "vms", "f/c/"]);
    assert_eq!(chunks, "f/c/0000000000000000", "nothing reached the bucket while fenced");
    assert!(read(&mut c, 8 << 20, second.len()).unwrap() == second, "the dirty data is kept");

    proxy.pass();
    let deadline = Instant::now() + Duration::from_secs(20);
    while c.flush().is_err() {
        assert!(Instant::now() < deadline, "writes did not resume after the lease was renewed");
        std::thread::sleep(Duration::from_millis(500));
    }
    drop(c);
    s.stop();
    let parts: [(u64, &[u8], &str); 2] =
        [(0, &first, "before the fence"), (8 << 20, &second, "the write made while fenced")];
    assert_in_bucket(&s3.endpoint(), "disk=s3://vms/f/", &parts);
}

/// A fresh server of `export` at `endpoint` (no log, no proxy) reads each
/// `(offset, data, what)` back byte for byte: what the bucket holds.
fn assert_in_bucket(endpoint: &str, export: &str, parts: &[(u64, &[u8], &str)]) {
    let s = serve(endpoint, &["--export", export]);
    let mut c = nbd::Client::connect(&s.target(), "disk").unwrap();
    for &(offset, data, what) in parts {
        assert!(read(&mut c, offset, data.len()).unwrap() == data, "{what}");
    }
    drop(c);
    s.stop();
}

/// A writer whose run had a failed backing write does not bind its
/// persistent L2 to the disk at its clean stop (a write that failed may
/// still land later, under a record refilled from older bytes): it says so,
/// and its next start discards the export's records; a run without one
/// keeps them (docs/persistence.md, "A writer's own changes").
#[test]
fn a_writer_whose_run_had_a_failed_write_keeps_no_l2_for_the_next_start() {
    let Some((_s3, proxy)) = moto_behind_proxy(&["vms"]) else { return };
    let keep = tempfile::tempdir().unwrap();
    let l2 = persistent_l2_args(keep.path());
    let mut args = vec!["--export", "disk=s3://vms/e/?size=16M&retry_timeout=2"];
    args.extend(l2.iter().map(String::as_str));
    let data = pattern(1 << 20, 50);
    for fail in [false, true] {
        let mut s = serve(&proxy.endpoint(), &args);
        let mut c = nbd::Client::connect(&s.target(), "disk").unwrap();
        c.write(0, &data, false).unwrap();
        c.flush().unwrap();
        if fail {
            proxy.rule(json!({"fault": "500", "methods": ["PUT"], "path": "/c/"}));
            c.write(8 << 20, &data[..4096], false).unwrap();
            let flushed = timed(Duration::from_secs(60), "a FLUSH during the fault", || c.flush());
            assert!(flushed.is_err(), "a FLUSH whose data cannot reach the bucket must fail");
            proxy.pass();
            timed(Duration::from_secs(60), "a FLUSH after the fault", || c.flush()).expect("FLUSH");
            let st = s.stat();
            assert!(
                st["backing_errors"].as_u64().unwrap() > 0,
                "the failed in-place commit went uncounted: {st}"
            );
        }
        assert!(read(&mut c, 0, data.len()).unwrap() == data);
        wait_l2_holds(&s, data.len() as u64);
        drop(c);
        let (status, err) = s.terminate();
        assert!(status.success(), "{err}");
        assert_eq!(err.contains("are not kept for the next start"), fail, "{err}");
        let s = serve(&proxy.endpoint(), &args);
        let st = restored(&s, u64::from(fail));
        let mut c = nbd::Client::connect(&s.target(), "disk").unwrap();
        assert!(read(&mut c, 0, data.len()).unwrap() == data, "{st}");
        drop(c);
        s.stop();
    }
}

/// A writer's head PUT that fails does not fail its FLUSH (the chunks are
/// in the bucket): read-only servers lag until a later head lands, which
/// lists what the failed one would have. A head whose answer is lost is
/// taken as written; one that landed although every try of it seemed to
/// fail has its number used up, and the next head is written over it. A
/// writer killed with changes no head named: the next writer's first head
/// makes every reader list the chunks, so they see them.
#[test]
fn readers_see_what_a_failed_head_left_out_once_a_later_head_lands() {
    let Some((s3, proxy)) = moto_behind_proxy(&["vms"]) else { return };
    let w = serve(&proxy.endpoint(), &["--export", "disk=s3://vms/h/?size=16M&retry_timeout=1"]);
    let mut c = nbd::Client::connect(&w.target(), "disk").unwrap();
    let (a, b, d) = (pattern(64 << 10, 60), pattern(64 << 10, 61), pattern(64 << 10, 62));
    c.write(0, &a, false).unwrap();
    c.flush().unwrap();
    let r = serve(&s3.endpoint(), &["--read-only", "--export", "disk=s3://vms/h/?head_poll_ms=100"]);
    let mut rc = nbd::Client::connect(&r.target(), "disk").unwrap();
    assert!(read(&mut rc, 0, a.len()).unwrap() == a);
    let reads_until_at = |rc: &mut nbd::Client, at: u64, want: &[u8], what: &str| {
        let deadline = Instant::now() + Duration::from_secs(15);
        while read(rc, at, want.len()).unwrap() != want {
            assert!(Instant::now() < deadline, "{what}: the reader still serves other bytes");
            std::thread::sleep(Duration::from_millis(100));
        }
    };

    proxy.rule(json!({"fault": "503", "methods": ["PUT"], "path": "arcache-head"}));
    c.write(0, &b, false).unwrap();
    c.flush().expect("a FLUSH whose head PUT failed still succeeds");
    assert!(proxy.injected("503") > 0, "no head PUT was refused: {}", proxy.stats());
    std::thread::sleep(Duration::from_secs(1));
    assert!(read(&mut rc, 0, a.len()).unwrap() == a, "the reader learnt the change without a head");
    // The later head lands, but its answer is lost: the retry's 412 finds
    // our own head there, and the writer goes on from it.
    proxy.rule(json!({"fault": "reset_after", "count": 1, "methods": ["PUT"], "path": "arcache-head"}));
    c.write(8 << 20, &d, false).unwrap();
    c.flush().unwrap();
    assert!(proxy.injected("reset_after") > 0, "no head answer was lost: {}", proxy.stats());
    reads_until_at(&mut rc, 0, &b, "after a later head landed");
    // Cached by the reader, so only a head can tell it of the next write.
    assert!(read(&mut rc, 8 << 20, d.len()).unwrap() == d);
    c.write(8 << 20, &b, false).unwrap();
    c.flush().unwrap();
    reads_until_at(&mut rc, 8 << 20, &b, "the head after the one whose answer was lost");

    // Every head PUT lands but loses its answer, retries included, until
    // the budget is spent: the flush goes on (the chunks are in the
    // bucket), and that generation's number is used up. The next head
    // finds our earlier one there (412) and is written over it under a
    // new number, listing what is still pending.
    let env = s3_env(&s3.endpoint());
    let generation = || {
        let out = Command::new(BIN)
            .args(["s3", "show", "--json", "s3://vms/h/"])
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).expect("s3 show --json");
        v["head_generation"].as_u64().expect("a head")
    };
    let before = generation();
    proxy.rule(json!({"fault": "reset_after", "methods": ["PUT"], "path": "arcache-head"}));
    c.write(12 << 20, &d, false).unwrap();
    c.flush().expect("a FLUSH whose head PUTs all lost their answers still succeeds");
    assert_eq!(generation(), before + 1, "the head PUT landed");
    proxy.pass();
    assert!(read(&mut rc, 0, b.len()).unwrap() == b);
    c.write(0, &a, false).unwrap();
    c.flush().expect("the next head is written over our earlier one");
    assert_eq!(
        generation(),
        before + 3,
        "one number used up by the refused PUT, one by the head written over it"
    );
    reads_until_at(&mut rc, 0, &a, "the head written over our earlier one");
    reads_until_at(&mut rc, 12 << 20, &d, "what the earlier head listed");

    proxy.rule(json!({"fault": "503", "methods": ["PUT"], "path": "arcache-head"}));
    c.write(0, &d, false).unwrap();
    c.flush().unwrap();
    drop(c);
    let _dir = w.kill9();
    let out = Command::new(BIN)
        .args(["s3", "break-lease", "--force", "s3://vms/h/"])
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    std::thread::sleep(Duration::from_secs(1));
    assert!(read(&mut rc, 0, a.len()).unwrap() == a, "the reader learnt the change without a head");
    let w = serve(&s3.endpoint(), &["--export", "disk=s3://vms/h/"]);
    reads_until_at(&mut rc, 0, &d, "after the next writer's first head");
    drop(rc);
    w.stop();
    r.stop();
}

/// `arcache s3 ARGS` against `endpoint`.
fn s3cmd(endpoint: &str, args: &[&str]) -> std::process::Output {
    let out = Command::new(BIN).arg("s3").args(args).envs(s3_env(endpoint)).output().unwrap();
    assert!(out.status.success(), "arcache s3 {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    out
}

fn lease_state(endpoint: &str, uri: &str) -> Value {
    let out = s3cmd(endpoint, &["show", "--json", uri]);
    let shown: Value = serde_json::from_slice(&out.stdout).expect("s3 show --json prints JSON");
    shown["lease"]["state"].clone()
}

/// A stop that could not write everything to the bucket (every chunk PUT
/// failing) fails, and leaves the lease held as a crash does: the log has
/// what the bucket lacks, so another writer is refused until
/// `break-lease`, and the next start with the log puts it in the bucket.
/// (The binary held it before too: its process ends before its failed
/// stop drops the disk. The in-process test below is the one that tells.)
#[test]
fn a_stop_that_could_not_write_everything_leaves_the_lease_held() {
    let Some((s3, proxy)) = moto_behind_proxy(&["vms"]) else { return };
    let log_dir = tempfile::tempdir().unwrap();
    let log_arg = format!("{}:64M", log_dir.path().join("log.img").display());
    let export = "disk=s3://vms/k/?size=16M&retry_timeout=1";
    let mut s = serve(&proxy.endpoint(), &["--export", export, "--log", &log_arg]);
    let mut c = nbd::Client::connect(&s.target(), "disk").unwrap();
    let (first, second) = (pattern(256 << 10, 70), pattern(256 << 10, 71));
    c.write(0, &first, false).unwrap();
    c.flush().unwrap();
    proxy.rule(json!({"fault": "500", "methods": ["PUT"], "path": "/c/"}));
    c.write(4 << 20, &second, false).unwrap();
    c.flush().expect("with a log, a FLUSH is durable in the log while the bucket fails");
    drop(c);
    let (status, err) = s.terminate();
    assert!(proxy.injected("500") > 0, "no chunk PUT was refused: {}", proxy.stats());
    assert!(!status.success(), "a stop that could not write everything must fail: {err}");
    proxy.pass();
    assert_eq!(lease_state(&s3.endpoint(), "s3://vms/k/"), "held", "{err}");
    let env = s3_env(&s3.endpoint());
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let refusal = refused(&env, "disk=s3://vms/k/");
    assert!(refusal.contains("is held by host"), "{refusal}");

    s3cmd(&s3.endpoint(), &["break-lease", "--force", "s3://vms/k/"]);
    let s = serve(&s3.endpoint(), &["--export", "disk=s3://vms/k/", "--log", &log_arg]);
    let mut c = nbd::Client::connect(&s.target(), "disk").unwrap();
    assert!(read(&mut c, 0, first.len()).unwrap() == first);
    assert!(read(&mut c, 4 << 20, second.len()).unwrap() == second, "the write only the log had");
    drop(c);
    s.stop();
    assert_eq!(lease_state(&s3.endpoint(), "s3://vms/k/"), "released", "after a clean stop");
    assert_in_bucket(&s3.endpoint(), "disk=s3://vms/k/", &[(4 << 20, &second, "the replayed write")]);
}

/// The same in-process (`arcache demo`, `arcache mount`, an embedder), where
/// the server's devices are dropped as its failed stop returns: the lease
/// stays held until broken (whether it is still renewed, this test cannot
/// tell: `break-lease` refuses a lease renewed within a minute either way).
#[test]
fn an_in_process_stop_that_could_not_write_everything_leaves_the_lease_held() {
    let Some((s3, proxy)) = moto_behind_proxy(&["vms"]) else { return };
    let dir = tempfile::tempdir().unwrap();
    let uri = "s3://vms/p/?size=16M&retry_timeout=1";
    let running = start_in_process_s3(dir.path(), "disk", uri, proxy.endpoint());
    let mut c = nbd::Client::connect(&nbd::Target::Unix(dir.path().join("nbd.sock")), "disk").unwrap();
    c.write(0, &pattern(64 << 10, 80), false).unwrap();
    c.flush().unwrap();
    proxy.rule(json!({"fault": "500", "methods": ["PUT"], "path": "/c/"}));
    c.write(1 << 20, &pattern(64 << 10, 81), false).unwrap();
    drop(c);
    let stopped = timed(Duration::from_secs(60), "a failing stop", || running.stop());
    assert!(stopped.is_err(), "a stop that could not write everything must fail");
    assert!(proxy.injected("500") > 0, "no chunk PUT was refused: {}", proxy.stats());
    proxy.pass();
    assert_eq!(lease_state(&s3.endpoint(), "s3://vms/p/"), "held");
    let out = Command::new(BIN)
        .args(["s3", "break-lease", "s3://vms/p/"])
        .envs(s3_env(&s3.endpoint()))
        .output()
        .unwrap();
    assert!(!out.status.success(), "a lease renewed seconds ago is not broken without --force: {out:?}");
}
