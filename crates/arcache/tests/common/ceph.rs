//! A throwaway one-node Ceph for the tests that need one
//! (`tests/ceph/ceph-up.sh`): a monitor, a memstore OSD and, if asked, an
//! RGW, on free ports of 127.0.0.1; it stops (and its directory goes)
//! when the test binary exits however it exits, as the script follows
//! its parent.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub struct Ceph {
    pub conf: PathBuf,
    /// RGW's S3 endpoint, when started with one (user test, secret
    /// testtesttest).
    pub s3_endpoint: Option<String>,
}

fn free_port() -> Result<u16, String> {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map_err(|e| e.to_string()).map(|a| a.port())
}

/// Starts the cluster (with an RGW if `rgw`); the reason when it cannot.
pub fn start(rgw: bool) -> Result<Ceph, String> {
    let rgw_tools: &[&str] = if rgw { &["radosgw", "radosgw-admin"] } else { &[] };
    for tool in ["ceph-mon", "ceph-osd", "ceph", "rbd", "monmaptool", "uuidgen"].iter().chain(rgw_tools) {
        if !on_path(tool) {
            return Err(format!(
                "{tool} is not installed (apt-get install ceph-mon ceph-osd ceph-common radosgw librbd-dev librados-dev)"
            ));
        }
    }
    // The script removes this directory when it stops; nothing else does.
    let dir = tempfile::Builder::new().prefix("arcache-ceph-").tempdir().map_err(|e| e.to_string())?.keep();
    let port = free_port()?;
    let rgw_port = free_port()?;
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/ceph/ceph-up.sh");
    let started = Instant::now();
    let mut child = Command::new("bash")
        .arg(script)
        .arg(&dir)
        .env("CEPH_UP_RGW", if rgw { "1" } else { "0" })
        .env("CEPH_UP_MON_PORT", port.to_string())
        .env("CEPH_UP_RGW_PORT", rgw_port.to_string())
        // It stays in the foreground and stops the cluster once this test
        // binary is gone (its parent: the process, not a test thread).
        .env("CEPH_UP_EXIT_WITH_PARENT", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("starting {script}: {e}"))?;
    let stdout = child.stdout.take().ok_or("no stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = started + Duration::from_secs(120);
    loop {
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(line) if line.starts_with("ceph up") => break,
            Ok(_) | Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let out = child.wait_with_output().map_err(|e| e.to_string())?;
                return Err(format!("{script} failed: {}", String::from_utf8_lossy(&out.stderr)));
            }
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err(format!("{script} did not bring Ceph up within 120 s"));
        }
    }
    let _ = std::io::Write::write_fmt(
        &mut std::io::stderr(),
        format_args!("one-node Ceph up in {:.1} s\n", started.elapsed().as_secs_f64()),
    );
    // The child is never waited for: it runs until this process exits.
    std::mem::forget(child);
    let s3_endpoint = rgw.then(|| format!("http://127.0.0.1:{rgw_port}"));
    Ok(Ceph { conf: dir.join("ceph.conf"), s3_endpoint })
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(tool).is_file()))
}
