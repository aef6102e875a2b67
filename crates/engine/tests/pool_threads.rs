//! A cache's prefetch threads end with the cache: each cache starts its own
//! pool on first use, and its workers used to sleep on forever once the
//! cache was gone (8 threads a cache; the model test ran out of threads
//! after about 2,000 cases in one process).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arcache_engine::{Cache, CacheConfig, Volume, VolumeConfig};
use blockdev::MemDev;

/// The tests of this file count the process's threads: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Threads of this process whose name starts with `prefix`.
fn threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with(prefix))
        .count()
}

/// A cache and a volume over 8 MiB, read in order so zfetch prefetches;
/// returns the prefetch threads there were before they were dropped.
fn streamed_cache() -> usize {
    let cache = Cache::new(CacheConfig {
        arc_min: 4 << 20,
        arc_max: 8 << 20,
        min_prefetch_ms: 1000,
        compress: false,
    });
    let dev = Arc::new(MemDev::new(8 << 20));
    let vol =
        Volume::new(0, VolumeConfig { name: "t".into(), recordsize: 64 << 10, read_only: false }, dev, cache);
    let mut buf = vec![0u8; 128 << 10];
    for i in 0..64u64 {
        vol.read(i * buf.len() as u64, &mut buf).expect("read");
    }
    threads_named("prefetch-")
}

#[test]
fn a_dropped_caches_prefetch_threads_end() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut most = 0;
    for _ in 0..20 {
        most = most.max(streamed_cache());
    }
    assert!(most > 0, "no prefetch thread ever ran: the test reached nothing");
    let until = Instant::now() + Duration::from_secs(10);
    while threads_named("prefetch-") > 0 {
        assert!(
            Instant::now() < until,
            "{} prefetch threads left after every cache was dropped",
            threads_named("prefetch-")
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Nothing keeps a cache alive once its volumes and its owner let go: no
/// thread or queued job holds it (a cycle through the prefetch pool, or a
/// job left waiting, would keep every record in RAM). A guard against such
/// cycles, not a test of the pool's end: it passed with the old pool too
/// (the pool's workers never held the cache).
#[test]
fn a_dropped_cache_is_freed() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let cache =
        Cache::new(CacheConfig { arc_min: 4 << 20, arc_max: 8 << 20, min_prefetch_ms: 1000, compress: true });
    let weak = Arc::downgrade(&cache);
    let dev = Arc::new(MemDev::new(8 << 20));
    let vol =
        Volume::new(0, VolumeConfig { name: "t".into(), recordsize: 64 << 10, read_only: false }, dev, cache);
    let mut buf = vec![0u8; 128 << 10];
    for i in 0..64u64 {
        vol.read(i * buf.len() as u64, &mut buf).expect("read");
        vol.write(i * buf.len() as u64, &buf[..4096], false).expect("write");
    }
    drop(vol);
    let until = Instant::now() + Duration::from_secs(10);
    while weak.strong_count() > 0 {
        assert!(Instant::now() < until, "{} references to a dropped cache remain", weak.strong_count());
        std::thread::sleep(Duration::from_millis(10));
    }
}
