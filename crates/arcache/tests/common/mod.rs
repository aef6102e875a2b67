//! Starting the real `arcache` binary for tests, and finding real clients.
#![allow(dead_code)]

pub mod ceph;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_arcache");

/// A running `arcache serve`, killed on drop if the test did not stop it.
pub struct Serve {
    pub child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub sock: PathBuf,
    pub control: PathBuf,
}

impl Serve {
    /// Starts `arcache serve` with a unix socket and control socket in a
    /// fresh directory, plus `args`; waits until both sockets answer.
    pub fn start(dir: tempfile::TempDir, args: &[&str]) -> Serve {
        Serve::start_with_env(dir, args, &[])
    }

    /// As [`Serve::start`], with `env` added to the server's environment.
    pub fn start_with_env(dir: tempfile::TempDir, args: &[&str], env: &[(&str, &str)]) -> Serve {
        let sock = dir.path().join("nbd.sock");
        let control = dir.path().join("control.sock");
        let mut cmd = Command::new(BIN);
        cmd.arg("serve")
            .arg("--listen")
            .arg(format!("unix:{}", sock.display()))
            .arg("--control")
            .arg(&control);
        // Every server gets a state directory of its own, unless the test
        // names one.
        if !args.iter().any(|a| *a == "--state-dir" || a.starts_with("--state-dir=")) {
            cmd.arg("--state-dir").arg(dir.path().join("state"));
        }
        cmd.args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .env("RUST_LOG", "warn")
            .envs(env.iter().copied());
        let child = cmd.spawn().expect("spawn arcache serve");
        let mut s = Serve { child: Some(child), dir, sock, control };
        s.wait_ready();
        s
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if std::os::unix::net::UnixStream::connect(&self.sock).is_ok()
                && std::os::unix::net::UnixStream::connect(&self.control).is_ok()
            {
                return;
            }
            if let Some(status) = self.child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                let out = self.child.take().map(|c| c.wait_with_output());
                panic!("arcache serve exited early ({status}): {out:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("arcache serve did not come up in 20 s");
    }

    pub fn uri(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.sock.display())
    }

    pub fn target(&self) -> nbd::Target {
        nbd::Target::Unix(self.sock.clone())
    }

    /// Runs an `arcache` client subcommand against this server.
    pub fn ctl(&self, args: &[&str]) -> Output {
        Command::new(BIN).args(args).arg("--control").arg(&self.control).output().expect("run arcache")
    }

    pub fn stat(&self) -> serde_json::Value {
        let out = self.ctl(&["stat", "--json"]);
        assert!(out.status.success(), "stat failed: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("stat --json prints JSON")
    }

    /// Kills the server with SIGKILL (no chance to clean up) and hands back
    /// its directory for a restart.
    pub fn kill9(mut self) -> tempfile::TempDir {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.take_dir()
    }

    /// Stops the server with SIGTERM, checks it exited cleanly, and hands
    /// back its directory.
    pub fn stop(mut self) -> tempfile::TempDir {
        let (status, err) = self.terminate();
        assert!(status.success(), "arcache serve failed at stop: {err}");
        self.take_dir()
    }

    fn take_dir(&mut self) -> tempfile::TempDir {
        std::mem::replace(&mut self.dir, tempfile::tempdir().expect("tempdir"))
    }

    /// Sends SIGTERM and waits; returns the exit status and stderr.
    pub fn terminate(&mut self) -> (std::process::ExitStatus, String) {
        let child = self.child.take().expect("still running");
        // SAFETY: sending a signal to our own child process.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let out = wait_timeout(child, Duration::from_secs(40));
        (out.status, String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub fn wait_timeout(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    loop {
        if child.try_wait().expect("wait").is_some() {
            return child.wait_with_output().expect("collect output");
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("process did not exit within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `arcache serve` with sockets in `dir` plus `args`, expecting it to
/// refuse to start: asserts a non-zero exit and returns its standard error.
pub fn serve_refused(dir: &Path, args: &[&str]) -> String {
    let child = Command::new(BIN)
        .arg("serve")
        .arg("--listen")
        .arg(format!("unix:{}", dir.join("refused.sock").display()))
        .arg("--control")
        .arg(dir.join("refused.ctl"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run arcache serve");
    // A server that starts when it should not never exits by itself.
    let out = wait_timeout(child, Duration::from_secs(60));
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "arcache serve {args:?} started; it was to refuse: {err}");
    err
}

/// Fails loudly when a client the tests need is missing: `.ci/run` installs
/// them, and a skipped test would claim coverage it does not give.
pub fn need(tool: &str) -> PathBuf {
    let found = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(tool))
        .find(|p| p.is_file());
    found.unwrap_or_else(|| {
        panic!("{tool} is not installed; run .ci/run (or apt-get install fio nbdkit libnbd-bin qemu-utils)")
    })
}

/// For a test that cannot make its real check on this machine (no root,
/// no loop devices...); the caller returns after it. Under CI (`CI=true`
/// or `CI=1`, as CI services set it) it fails instead: CI provides what
/// these tests need (`.ci/run`), so a pass there would claim coverage the
/// run did not give. Elsewhere the skip is one loud line on stderr.
#[track_caller]
pub fn skip_or_fail(why: &str) {
    let test = std::thread::current().name().unwrap_or("?").to_string();
    let at = std::panic::Location::caller();
    let ci = std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1");
    assert!(!ci, "{test} ({at}) cannot run its real check under CI: {why}");
    // Written to fd 2 itself: the test harness captures eprintln! of a
    // passing test, which would hide the skip.
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED: {test} ({at}): {why}");
}

/// A file of `size` pseudo-random bytes.
pub fn random_file(path: &Path, size: usize, seed: u64) -> Vec<u8> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut data = vec![0u8; size];
    rng.fill(&mut data[..]);
    std::fs::write(path, &data).expect("write test image");
    data
}

pub fn run(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("running {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Random writes through fio's nbd engine, each block checksummed and read
/// back and verified (`--verify=crc32c`, fatal on the first mismatch).
/// `extra` adds or overrides fio options (`--bs`, `--iodepth`, `--rate`...).
pub fn fio_verified_writes(uri: &str, name: &str, size: &str, extra: &[&str]) {
    need("fio");
    run(Command::new("fio")
        .args([
            &format!("--name={name}"),
            "--ioengine=nbd",
            "--rw=randwrite",
            "--bs=4k",
            &format!("--size={size}"),
        ])
        .args([
            "--iodepth=16",
            "--verify=crc32c",
            "--verify_state_save=0",
            "--do_verify=1",
            "--verify_fatal=1",
        ])
        .args(extra)
        .arg(format!("--uri={uri}")));
}

/// An nbdkit server on a unix socket, killed on drop.
pub struct Nbdkit {
    child: Child,
    pub sock: std::path::PathBuf,
}

impl Nbdkit {
    pub fn start(dir: &Path, name: &str, args: &[&str]) -> Nbdkit {
        need("nbdkit");
        let sock = dir.join(format!("{name}.sock"));
        let child = Command::new("nbdkit")
            .args(["--foreground", "--exit-with-parent", "-U"])
            .arg(&sock)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nbdkit");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::os::unix::net::UnixStream::connect(&sock).is_err() {
            assert!(Instant::now() < deadline, "nbdkit did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Nbdkit { child, sock }
    }

    pub fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.sock.display())
    }
}

impl Drop for Nbdkit {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// moto, the S3 server the S3 tests run against: started here on
/// 127.0.0.1 from the venv `.ci/run` makes (`ARCACHE_MOTO_VENV`, default
/// /var/tmp/arcache-moto-venv), stopped when dropped; the venv's python
/// runs the tests' S3 helpers.
#[allow(dead_code)]
pub struct Moto {
    child: Child,
    port: u16,
    pub python: PathBuf,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The venv `.ci/run` makes for moto and boto3 (`ARCACHE_MOTO_VENV`).
pub fn moto_venv() -> PathBuf {
    std::env::var_os("ARCACHE_MOTO_VENV").map_or(PathBuf::from("/var/tmp/arcache-moto-venv"), PathBuf::from)
}

/// Writes `data` at `offset` of the default export and FLUSHes it.
pub fn write_flush(s: &Serve, offset: u64, data: &[u8]) {
    let mut c = nbd::Client::connect(&s.target(), "").unwrap();
    c.write(offset, data, false).unwrap();
    c.flush().expect("FLUSH");
}

/// `len` bytes at `offset` of the default export.
pub fn read_at(s: &Serve, offset: u64, len: usize) -> Vec<u8> {
    let mut c = nbd::Client::connect(&s.target(), "").unwrap();
    let mut b = vec![0u8; len];
    c.read(offset, &mut b).unwrap();
    b
}

#[allow(dead_code)]
impl Moto {
    /// None (after `skip_or_fail`) when the venv is missing; `env` is
    /// moto's own (e.g. INITIAL_NO_AUTH_ACTION_COUNT).
    pub fn start(env: &[(&str, &str)]) -> Option<Moto> {
        let venv = moto_venv();
        let server = venv.join("bin/moto_server");
        if !server.is_file() {
            skip_or_fail(&format!("no moto_server in {} (.ci/run makes it)", venv.display()));
            return None;
        }
        let (child, port) = start_moto(&server, env);
        Some(Moto { child, port, python: venv.join("bin/python") })
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// `tests/s3/s3ctl.py` against this server.
    pub fn ctl(&self, args: &[&str]) -> String {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/s3/s3ctl.py");
        let out = Command::new(&self.python).arg(script).arg(self.endpoint()).args(args).output().unwrap();
        assert!(out.status.success(), "s3ctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// What `arcache serve` needs in its environment to use this server.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ACCESS_KEY_ID", "testing".into()),
            ("AWS_SECRET_ACCESS_KEY", "testing".into()),
            ("AWS_ENDPOINT_URL", self.endpoint()),
            ("AWS_PROFILE", String::new()),
        ]
    }
}

/// Starts moto (`moto_server` of the venv) on a free port of 127.0.0.1 and
/// waits until *it* answers there: a port found free can be taken by
/// another test's server before moto binds it (moto then exits and the
/// other server answers the probe), so a start that does not answer as
/// moto is retried on another port.
fn start_moto(server: &Path, env: &[(&str, &str)]) -> (Child, u16) {
    for _ in 0..5 {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut child = Command::new(server)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start moto_server");
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if moto_answers(port) {
                return (child, port);
            }
            if child.try_wait().ok().flatten().is_some() || Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    panic!("moto_server did not start on a free port in 5 tries");
}

/// True when the server on `port` is moto (its API answers 200).
fn moto_answers(port: u16) -> bool {
    use std::io::{Read, Write};
    let Ok(mut c) = std::net::TcpStream::connect(("127.0.0.1", port)) else { return false };
    let _ = c.set_read_timeout(Some(Duration::from_secs(5)));
    if c.write_all(b"GET /moto-api/data.json HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").is_err() {
        return false;
    }
    let mut head = [0u8; 12];
    c.read_exact(&mut head).is_ok() && head.starts_with(b"HTTP/1.") && &head[9..12] == b"200"
}

/// Fail points exist only in a `failpoints` build (`.ci/run` builds the
/// tests with one); without one a test arming them cannot make its checks.
#[track_caller]
pub fn failpoints_armed() -> bool {
    if cfg!(feature = "failpoints") {
        return true;
    }
    skip_or_fail(
        "the binary was built without the failpoints feature (cargo test --features arcache/failpoints)",
    );
    false
}

/// Waits up to 30 s for the server's counters to show `what`.
pub fn wait_stat(s: &Serve, what: &str, done: impl Fn(&serde_json::Value) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let st = s.stat();
        if done(&st) {
            return;
        }
        assert!(Instant::now() < deadline, "waited in vain for {what}: {st}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until the L2 holds `bytes` of records (logical size).
pub fn wait_l2_holds(s: &Serve, bytes: u64) {
    wait_stat(s, "the L2 feed", |st| st["l2_size"].as_u64().unwrap_or(0) >= bytes);
}

/// Arguments for a persistent L2 of 64M (and the state directory beside
/// it) in `dir`, which outlives the servers started with them, fed often.
pub fn persistent_l2_args(dir: &Path) -> Vec<String> {
    let l2 = format!("{}:64M", dir.join("l2.img").display());
    let state = dir.join("state").display().to_string();
    let sets = ["l2arc_rebuild_blocks_min_l2size=0", "l2arc_feed_min_ms=10"];
    let mut args = vec!["--l2".to_string(), l2, "--state-dir".into(), state];
    args.extend(sets.iter().flat_map(|s| ["--set".to_string(), s.to_string()]));
    args
}

/// The counters once the L2's rebuild at start has ended, which found
/// `discarded` exports' records there stale.
pub fn restored(s: &Serve, discarded: u64) -> serde_json::Value {
    wait_stat(s, "the rebuild's end", |st| st["l2_rebuild_running"].as_u64() == Some(0));
    let st = s.stat();
    assert_eq!(st["l2_rebuild_discarded_exports"], discarded, "{st}");
    st
}

/// An in-process server (as `arcache demo`, `arcache mount` or an embedder
/// runs one) of one chunked S3 disk `uri` as export `name`, at the S3
/// server `endpoint` with moto's keys, listening on `dir`/nbd.sock.
pub fn start_in_process_s3(dir: &Path, name: &str, uri: &str, endpoint: String) -> arcache::serve::Running {
    use arcache::config::{ExportSpec, Listen, ServeSettings};
    let mut export = ExportSpec::plain(name.to_string(), uri.to_string());
    export.s3 = arcache_s3::S3Settings {
        access_key_id: Some("testing".into()),
        secret_access_key: Some("testing".into()),
        endpoint: Some(endpoint),
        ..Default::default()
    };
    let listen = vec![Listen::Unix(dir.join("nbd.sock"))];
    let settings = ServeSettings::in_dir(vec![export], listen, dir, arcache::tunables::Tunables::defaults());
    let nbd = settings.apply_limits(nbd::ServerConfig::default());
    arcache::serve::start(&settings, nbd, false).expect("start")
}
