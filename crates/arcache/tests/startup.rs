//! Start-up can be stopped and is bounded: SIGTERM ends `arcache serve` at
//! any stage before it serves (within a second), and an NBD backing store
//! that accepts but never answers fails start-up after
//! `nbd_connect_timeout` with a message naming it.

mod common;

use std::os::unix::net::UnixListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::{random_file, wait_timeout, Nbdkit, Serve, BIN};

/// A unix socket that accepts connections and never says a word.
fn silent_server(dir: &std::path::Path) -> (std::path::PathBuf, std::thread::JoinHandle<()>) {
    let sock = dir.join("silent.sock");
    let listener = UnixListener::bind(&sock).unwrap();
    let handle = std::thread::spawn(move || {
        let mut held = Vec::new();
        // Hold what we accept (dropping would close it and end the wait);
        // stop after a few so the thread ends with the test.
        for conn in listener.incoming().take(4) {
            held.push(conn);
        }
    });
    (sock, handle)
}

fn spawn_serve(dir: &std::path::Path, args: &[&str]) -> Child {
    Command::new(BIN)
        .arg("serve")
        .arg("--listen")
        .arg(format!("unix:{}", dir.join("nbd.sock").display()))
        .arg("--control")
        .arg(dir.join("ctl.sock"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn arcache serve")
}

fn sigterm_and_time(child: Child) -> (Duration, std::process::Output) {
    let t = Instant::now();
    // SAFETY: a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let out = wait_timeout(child, Duration::from_secs(20));
    (t.elapsed(), out)
}

#[test]
fn sigterm_ends_a_start_up_stuck_in_a_backing_handshake() {
    let dir = tempfile::tempdir().unwrap();
    let (sock, _h) = silent_server(dir.path());
    let uri = format!("nbd+unix:///?socket={}", sock.display());
    // No connect timeout: only the signal can end it.
    let child = spawn_serve(dir.path(), &["--export", &uri, "--set", "nbd_connect_timeout=0"]);
    std::thread::sleep(Duration::from_millis(1500));
    let (took, out) = sigterm_and_time(child);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(took < Duration::from_secs(1), "SIGTERM took {took:?} to end a stuck start-up: {err}");
    assert!(!out.status.success(), "a start-up stopped before serving exits non-zero");
    assert!(err.contains("stopped by a signal while opening the backing stores"), "{err}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("serving"));
}

#[test]
fn a_backing_store_that_never_answers_fails_start_up_after_the_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let (sock, _h) = silent_server(dir.path());
    let uri = format!("nbd+unix:///?socket={}", sock.display());
    let t = Instant::now();
    let child = spawn_serve(dir.path(), &["--export", &uri, "--set", "nbd_connect_timeout=1"]);
    let out = wait_timeout(child, Duration::from_secs(20));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(t.elapsed() < Duration::from_secs(5), "took {:?}", t.elapsed());
    assert!(err.contains(&uri) && err.contains("no answer within 1s"), "{err}");
}

/// A log full of acknowledged writes, replayed onto a backing store whose
/// every write takes 100 ms: SIGTERM during the replay ends the process at
/// once, and the next start replays it all (nothing lost, nothing torn).
#[test]
fn sigterm_during_log_replay_stops_at_once_and_the_next_start_finishes_it() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_path_buf();
    let want = random_file(&d.join("back.img"), 8 << 20, 3);
    let log = format!("{}:16M", d.join("log.img").display());
    // One socket path throughout: an NBD store's identity is its URI.
    let kit = |delay: &str| {
        let _ = std::fs::remove_file(d.join("origin.sock"));
        let file = format!("file={}", d.join("back.img").display());
        Nbdkit::start(&d, "origin", &["--filter=delay", "file", &file, &format!("delay-write={delay}")])
    };
    let origin = kit("0");
    let first = Serve::start(
        tempfile::tempdir().unwrap(),
        &["--export", &origin.uri(), "--log", &log, "--set", "zfs_txg_timeout=3600"],
    );
    let mut c = nbd::Client::connect(&first.target(), "").unwrap();
    let mut want = want;
    // Scattered pages, so the replay makes many backing-store writes.
    for i in 0..200u64 {
        let at = (i * 37 % 2000) * 4096;
        let page = vec![(i % 251) as u8 + 1; 4096];
        c.write(at, &page, false).unwrap();
        want[at as usize..at as usize + 4096].copy_from_slice(&page);
    }
    c.flush().unwrap();
    drop(c);
    first.kill9();
    drop(origin);

    let slow = kit("100ms");
    let child = spawn_serve(&d, &["--export", &slow.uri(), "--log", &log]);
    std::thread::sleep(Duration::from_millis(1500));
    let (took, out) = sigterm_and_time(child);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(took < Duration::from_secs(1), "SIGTERM took {took:?} during the replay: {err}");
    assert!(err.contains("stopped by a signal while replaying the intent log"), "{err}");
    drop(slow);

    let origin = kit("0");
    let again = Serve::start(tempfile::tempdir().unwrap(), &["--export", &origin.uri(), "--log", &log]);
    let mut c = nbd::Client::connect(&again.target(), "").unwrap();
    let mut got = vec![0u8; want.len()];
    for (i, chunk) in got.chunks_mut(1 << 20).enumerate() {
        c.read((i << 20) as u64, chunk).unwrap();
    }
    assert!(got == want, "the replay after the interrupted one lost or tore writes");
    drop(c);
    again.stop();
}
