//! A bounded soak: 64 NBD connections over four exports doing verified
//! reads, writes, trims and flushes for ARCACHE_SOAK_SECS seconds (default
//! 8; `bench/soak.sh` runs it for minutes). No error, no wrong byte, memory
//! within arc_max + zfs_dirty_data_max + a fixed overhead, no growth of
//! file descriptors or threads between the first and the last part.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{random_file, Serve};
use rand::{Rng, SeedableRng};

const EXPORTS: usize = 4;
const CONNS: usize = 64;
const SIZE: usize = 32 << 20;
const ARC_MAX: u64 = 64 << 20;
const DIRTY_MAX: u64 = 32 << 20;
/// Process overhead allowed besides ARC and dirty data: threads' stacks,
/// per-connection buffers, the allocator's slack.
const OVERHEAD: u64 = 160 << 20;

fn proc_status(pid: u32, key: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

#[test]
fn soak_with_64_connections_verifies_every_byte_and_stays_bounded() {
    let secs: u64 = std::env::var("ARCACHE_SOAK_SECS").ok().and_then(|v| v.parse().ok()).unwrap_or(8);
    let dir = tempfile::tempdir().unwrap();
    let mut args: Vec<String> = Vec::new();
    let mut images = Vec::new();
    for e in 0..EXPORTS {
        let p = dir.path().join(format!("e{e}.img"));
        images.push(random_file(&p, SIZE, e as u64));
        args.push("--export".into());
        args.push(format!("e{e}={}", p.display()));
    }
    let l2 = format!("{}:128M", dir.path().join("l2.img").display());
    let log = format!("{}:32M", dir.path().join("log.img").display());
    args.push("--arc-max".into());
    args.push(ARC_MAX.to_string());
    args.extend(["--l2".to_string(), l2, "--log".to_string(), log]);
    args.push("--set".into());
    args.push(format!("zfs_dirty_data_max={DIRTY_MAX}"));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let s = Serve::start(tempfile::tempdir().unwrap(), &refs);
    let pid = s.child.as_ref().unwrap().id();
    let stop = Arc::new(AtomicBool::new(false));
    let (ops, bytes) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let started = Instant::now();
    let mut baseline = None;
    std::thread::scope(|sc| {
        for c in 0..CONNS {
            let (stop, ops, bytes) = (Arc::clone(&stop), Arc::clone(&ops), Arc::clone(&bytes));
            let export = c % EXPORTS;
            // Each connection owns a disjoint slice of its export.
            let slice = SIZE / (CONNS / EXPORTS);
            let base = (c / EXPORTS) * slice;
            let mut model = images[export][base..base + slice].to_vec();
            let target = s.target();
            sc.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(c as u64);
                let mut cl = nbd::Client::connect(&target, &format!("e{export}")).unwrap();
                let mut buf = vec![0u8; 64 << 10];
                while !stop.load(Relaxed) {
                    let len = 512 * rng.gen_range(1..=128usize);
                    let off = 512 * rng.gen_range(0..(slice - len) / 512);
                    let at = (base + off) as u64;
                    match rng.gen_range(0..100) {
                        0..=59 => {
                            cl.read(at, &mut buf[..len]).unwrap();
                            assert!(buf[..len] == model[off..off + len], "conn {c}: wrong bytes at {at}");
                            bytes.fetch_add(len as u64, Relaxed);
                        }
                        60..=89 => {
                            rng.fill(&mut buf[..len]);
                            cl.write(at, &buf[..len], rng.gen_bool(0.05)).unwrap();
                            model[off..off + len].copy_from_slice(&buf[..len]);
                        }
                        90..=94 => cl.flush().unwrap(),
                        _ => {
                            cl.write_zeroes(at, len as u32).unwrap();
                            model[off..off + len].fill(0);
                        }
                    }
                    ops.fetch_add(1, Relaxed);
                }
            });
        }
        let mut peak_rss = 0;
        while started.elapsed() < Duration::from_secs(secs) {
            std::thread::sleep(Duration::from_millis(200));
            peak_rss = peak_rss.max(proc_status(pid, "VmRSS:") << 10);
            if baseline.is_none() && started.elapsed() > Duration::from_secs(secs / 4) {
                baseline = Some(settled(pid));
            }
        }
        // The end is looked at once the clients stop: under load a txg
        // sync can keep its writer threads up across every look (seen
        // in CI: 10 threads more, all gone a moment later); a leak stays.
        stop.store(true, Relaxed);
        let end = settled(pid);
        let st = s.stat();
        eprintln!(
            "soak {secs} s: {} requests, {} MiB read and verified, peak RSS {} MiB (arc_max {} MiB + dirty {} MiB), fds/threads {:?} -> {end:?}, l2 hits {}, log commits {}",
            ops.load(Relaxed),
            bytes.load(Relaxed) >> 20,
            peak_rss >> 20,
            ARC_MAX >> 20,
            DIRTY_MAX >> 20,
            baseline,
            st["l2_hits"],
            st["zil_commit_writer_count"]
        );
        assert!(peak_rss <= ARC_MAX + DIRTY_MAX + OVERHEAD, "peak RSS {peak_rss} past the bound");
        let (f0, t0) = baseline.unwrap_or(end);
        assert!(end.0 <= f0 + 4 && end.1 <= t0 + 8, "fds or threads grew: {:?} -> {end:?}", (f0, t0));
        assert_eq!(st["nbd_request_errors"], 0, "{st}");
    });
    assert!(ops.load(Relaxed) > 1000);
}

/// Open fds and threads, each the least of several looks over two
/// seconds: a txg sync briefly runs 32 writer threads, a leak never goes
/// away.
fn settled(pid: u32) -> (usize, u64) {
    let mut least = (usize::MAX, u64::MAX);
    for _ in 0..20 {
        least = (least.0.min(fds(pid)), least.1.min(proc_status(pid, "Threads:")));
        std::thread::sleep(Duration::from_millis(100));
    }
    least
}
