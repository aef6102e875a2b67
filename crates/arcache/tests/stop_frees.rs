//! A server stopped in-process (as `arcache demo` and `arcache mount` run
//! one, and as an embedder would) leaves nothing running and nothing held:
//! every thread it started ends and its cache is freed, an idle control
//! session included. Alone in its test binary, since it counts the
//! process's threads.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arcache::config::{ExportSpec, L2Spec, Listen, ServeSettings};
use arcache::serve;
use arcache::tunables::Tunables;
use nbd::{Client, ServerConfig, Target};

/// The names of this process's threads.
fn thread_names() -> Vec<String> {
    let tasks = std::fs::read_dir("/proc/self/task").expect("list /proc/self/task");
    let mut names: Vec<String> = tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|comm| comm.trim_end().to_string())
        .collect();
    names.sort();
    names
}

fn settings(dir: &std::path::Path) -> ServeSettings {
    let image = dir.join("disk.img");
    std::fs::write(&image, vec![9u8; 8 << 20]).expect("write the backing image");
    let export = ExportSpec::plain(String::new(), image.display().to_string());
    let listen = vec![Listen::Unix(dir.join("nbd.sock")), Listen::Tcp("127.0.0.1:0".into())];
    let mut settings = ServeSettings::in_dir(vec![export], listen, dir, Tunables::defaults());
    settings.workers = 4;
    settings.l2 = vec![L2Spec { path: dir.join("l2.img"), size: Some(64 << 20) }];
    settings.log = Some(L2Spec { path: dir.join("log.img"), size: Some(16 << 20) });
    settings.metrics = Some("127.0.0.1:0".into());
    settings
}

/// Writes, flushes (the intent log), and reads the disk twice in order
/// (misses on workers, zfetch's prefetch pool, hits).
fn use_it(target: &Target) {
    let mut c = Client::connect(target, "").expect("connect");
    c.write(4096, &[1u8; 8192], false).expect("write");
    c.flush().expect("flush");
    let mut buf = vec![0u8; 128 << 10];
    for _ in 0..2 {
        for off in (0..(8u64 << 20)).step_by(buf.len()) {
            c.read(off, &mut buf).expect("read");
        }
    }
    c.read(4096, &mut buf[..8192]).expect("read back");
    assert!(buf[..8192].iter().all(|&b| b == 1), "the write reads back");
    c.disconnect().expect("disconnect");
}

/// Waits up to 10 s for the process's threads to be `before` again and for
/// `freed` to hold; `what` names the moment waited from.
fn back_to(before: &[String], freed: impl Fn() -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = thread_names();
        if left == before && freed() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "10 s after {what}: threads {left:?} against {before:?} before the start; what it held freed: {}",
            freed()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A start that fails once threads run and a socket is bound (here the
/// second listener's path is the first's, in use) stops what it started:
/// no thread is left, and the socket it bound is removed.
fn a_failed_start_leaves_nothing(dir: &std::path::Path, before: &[String]) {
    let mut settings = settings(dir);
    let sock = dir.join("nbd.sock");
    settings.listen = vec![Listen::Unix(sock.clone()), Listen::Unix(sock.clone())];
    let failed = serve::start(&settings, settings.apply_limits(ServerConfig::default()), true);
    let e = failed.err().expect("a start with one socket path twice fails");
    assert!(format!("{e:#}").contains("in use"), "the error says why: {e:#}");
    assert!(!sock.exists(), "the socket the failed start bound is removed");
    back_to(before, || true, "the failed start");
}

#[test]
fn a_stopped_server_or_a_failed_start_ends_its_threads_and_frees_its_cache() {
    let dir = tempfile::tempdir().expect("tempdir");
    let before = thread_names();
    a_failed_start_leaves_nothing(dir.path(), &before);
    let settings = settings(dir.path());
    let running =
        serve::start(&settings, settings.apply_limits(ServerConfig::default()), true).expect("start");
    use_it(&Target::Unix(dir.path().join("nbd.sock")));
    let during = thread_names();
    assert!(during.len() > before.len() + 8, "the server started its threads: {during:?}");
    let cache = Arc::downgrade(&running.cache);
    let server = Arc::downgrade(&running.server);
    // A control client that asked once and then sits idle: its session
    // must not keep the server.
    let mut idle = UnixStream::connect(dir.path().join("control.sock")).expect("connect to control");
    idle.write_all(b"{\"op\":\"stat\"}\n").expect("ask");
    let mut answer = BufReader::new(idle.try_clone().expect("clone"));
    let mut line = String::new();
    answer.read_line(&mut line).expect("answer");
    assert!(line.contains("\"ok\":true"), "stat answered: {line}");
    running.stop().expect("stop");
    // The server's own idle timeout is 60 s: an end later than this is not
    // the stop's doing.
    idle.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    line.clear();
    assert_eq!(answer.read_line(&mut line).expect("read after the stop"), 0, "the idle session was ended");

    back_to(&before, || cache.upgrade().is_none() && server.upgrade().is_none(), "the stop");
}
