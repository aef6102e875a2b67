//! One server per device: a second `arcache serve` naming an L2 device, an
//! intent log or a writable backing store that a running server holds is
//! refused at once, names the path and the holder, and writes nothing; the
//! first server's data stays intact. Headers record who had a device last
//! and whether they closed it cleanly.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{random_file, Serve, BIN};

const SIZE: usize = 16 << 20;

/// Starts a second server on `args` (with its own sockets) and returns its
/// exit status and stderr; it must exit by itself.
fn second_server(dir: &Path, args: &[&str]) -> (std::process::ExitStatus, String) {
    let started = Instant::now();
    let child = Command::new(BIN)
        .arg("serve")
        .arg("--listen")
        .arg(format!("unix:{}", dir.join("second.sock").display()))
        .arg("--control")
        .arg(dir.join("second.ctl"))
        .args(args)
        .current_dir(dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn second server");
    let out = common::wait_timeout(child, Duration::from_secs(20));
    assert!(started.elapsed() < Duration::from_secs(10), "refusal took {:?}", started.elapsed());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("serving"), "the second server served: {stdout}");
    (out.status, String::from_utf8_lossy(&out.stderr).into_owned())
}

fn read_all(s: &Serve) -> Vec<u8> {
    let mut c = nbd::Client::connect(&s.target(), "").expect("connect");
    let mut buf = vec![0u8; SIZE];
    for (i, chunk) in buf.chunks_mut(1 << 20).enumerate() {
        c.read((i << 20) as u64, chunk).expect("read");
    }
    buf
}

#[test]
fn a_second_server_on_a_held_device_is_refused_and_the_first_keeps_its_data() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_path_buf();
    let mut want = random_file(&d.join("back.img"), SIZE, 7);
    random_file(&d.join("other.img"), SIZE, 8);
    let first = Serve::start(
        dir,
        &[
            "--export",
            d.join("back.img").to_str().unwrap(),
            "--l2",
            &format!("{}:64M", d.join("l2.img").display()),
            "--log",
            &format!("{}:8M", d.join("log.img").display()),
            "--set",
            "l2arc_rebuild_blocks_min_l2size=1M",
        ],
    );
    let pid = first.child.as_ref().unwrap().id();
    // Acknowledged writes still in the log and in RAM when the others try.
    let mut c = nbd::Client::connect(&first.target(), "").unwrap();
    let patch = vec![0xA5u8; 1 << 20];
    c.write(3 << 20, &patch, false).unwrap();
    c.flush().unwrap();
    want[3 << 20..4 << 20].copy_from_slice(&patch);
    assert_eq!(read_all(&first), want);
    let log_before = std::fs::read(d.join("log.img")).unwrap();

    let other = d.join("other.img").display().to_string();
    let cases: Vec<(&str, Vec<String>)> = vec![
        ("l2.img", vec!["--export".into(), other.clone(), "--l2".into(), "l2.img".into()]),
        ("log.img", vec!["--export".into(), other.clone(), "--log".into(), "log.img".into()]),
        ("back.img", vec!["--export".into(), "back.img".into()]),
        ("back.img", vec!["--export".into(), "back.img".into(), "--read-only".into()]),
    ];
    for (path, args) in &cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (status, err) = second_server(&d, &args);
        assert!(!status.success(), "second server on {path} exited 0: {err}");
        let line = err.lines().find(|l| l.contains("in use")).unwrap_or_else(|| panic!("no refusal: {err}"));
        assert!(line.contains(path), "the refusal does not name {path}: {line}");
        assert!(line.contains(&format!("pid {pid}")), "the refusal does not name the holder: {line}");
    }
    // The refused servers wrote nothing to the log (the first one wrote
    // nothing either: its client was idle).
    assert_eq!(std::fs::read(d.join("log.img")).unwrap(), log_before, "the log changed");

    // Offline tools that change a device are refused too.
    for (cmd, path) in [("l2", "l2.img"), ("log", "log.img")] {
        let out = Command::new(BIN).args([cmd, "forget", path]).current_dir(&d).output().unwrap();
        assert!(!out.status.success(), "{cmd} forget ran on a held device");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(path) && err.contains("in use"), "{err}");
    }
    let dump = Command::new(BIN).args(["log", "dump", "log.img"]).current_dir(&d).output().unwrap();
    let text = String::from_utf8_lossy(&dump.stdout);
    assert!(text.contains(&format!("yes, by pid {pid}")), "log dump: {text}");
    assert!(text.contains(&format!("pid {pid}, opened")), "log dump: {text}");

    assert_eq!(read_all(&first), want, "the first server's data changed");
    let dir = first.stop();
    assert_eq!(std::fs::read(dir.path().join("back.img")).unwrap(), want, "backing store after stop");
    for cmd in ["l2", "log"] {
        let out =
            Command::new(BIN).args([cmd, "dump", &format!("{cmd}.img")]).current_dir(dir.path()).output();
        let text = String::from_utf8_lossy(&out.unwrap().stdout).into_owned();
        assert!(text.contains(&format!("pid {pid}, closed cleanly")), "{cmd} dump after stop: {text}");
        assert!(text.contains("no (no server has it open)"), "{cmd} dump after stop: {text}");
    }
}

#[test]
fn a_killed_server_leaves_no_stale_lock_and_its_devices_say_so() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_path_buf();
    random_file(&d.join("back.img"), SIZE, 9);
    let args = [
        "--export".to_string(),
        d.join("back.img").display().to_string(),
        "--l2".into(),
        format!("{}:64M", d.join("l2.img").display()),
        "--log".into(),
        format!("{}:8M", d.join("log.img").display()),
        "--set".into(),
        "l2arc_rebuild_blocks_min_l2size=1M".into(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let first = Serve::start(dir, &args);
    let pid = first.child.as_ref().unwrap().id();
    let dir = first.kill9();
    for cmd in ["l2", "log"] {
        let out =
            Command::new(BIN).args([cmd, "dump", &format!("{cmd}.img")]).current_dir(dir.path()).output();
        let text = String::from_utf8_lossy(&out.unwrap().stdout).into_owned();
        assert!(text.contains(&format!("pid {pid}, opened")) && text.contains("not closed"), "{cmd}: {text}");
        assert!(text.contains("no (no server has it open)"), "{cmd}: {text}");
    }
    // The kernel dropped the dead server's locks: a restart is not refused.
    let second = Serve::start(dir, &args);
    second.stop();
}
