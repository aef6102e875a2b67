//! A cache's prefetch threads end with the cache: each cache starts its own
//! pool on first use, and its workers used to sleep on forever once the
//! cache was gone (8 threads a cache; the model test ran out of threads
//! after about 2,000 cases in one process).

use std::sync::{Arc, Mutex, Weak};
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

/// A cache and a volume of its own over 8 MiB.
fn cache_and_volume(compress: bool) -> (Weak<Cache>, Arc<Volume>) {
    let cache =
        Cache::new(CacheConfig { arc_min: 4 << 20, arc_max: 8 << 20, min_prefetch_ms: 1000, compress });
    let weak = Arc::downgrade(&cache);
    let dev = Arc::new(MemDev::new(8 << 20));
    let cfg = VolumeConfig { name: "t".into(), recordsize: 64 << 10, read_only: false };
    (weak, Volume::new(0, cfg, dev, cache))
}

/// Reads the volume in order (so zfetch prefetches), writing a little
/// after each read when `write`.
fn stream(vol: &Volume, write: bool) {
    let mut buf = vec![0u8; 128 << 10];
    for i in 0..64u64 {
        vol.read(i * buf.len() as u64, &mut buf).expect("read");
        if write {
            vol.write(i * buf.len() as u64, &buf[..4096], false).expect("write");
        }
    }
}

/// A cache streamed through and dropped; returns the prefetch threads
/// there were before it was.
fn streamed_cache() -> usize {
    let (_, vol) = cache_and_volume(false);
    stream(&vol, false);
    threads_named("prefetch-")
}

/// Fails with `what()` unless `done` holds within 10 s.
fn within_10s(mut done: impl FnMut() -> bool, what: impl Fn() -> String) {
    let until = Instant::now() + Duration::from_secs(10);
    while !done() {
        assert!(Instant::now() < until, "{}", what());
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn a_dropped_caches_prefetch_threads_end() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut most = 0;
    for _ in 0..20 {
        most = most.max(streamed_cache());
    }
    assert!(most > 0, "no prefetch thread ever ran: the test reached nothing");
    within_10s(
        || threads_named("prefetch-") == 0,
        || format!("{} prefetch threads left after every cache was dropped", threads_named("prefetch-")),
    );
}

/// Nothing keeps a cache alive once its volumes and its owner let go: no
/// thread or queued job holds it (a cycle through the prefetch pool, or a
/// job left waiting, would keep every record in RAM). A guard against such
/// cycles, not a test of the pool's end: it passed with the old pool too
/// (the pool's workers never held the cache).
#[test]
fn a_dropped_cache_is_freed() {
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (weak, vol) = cache_and_volume(true);
    stream(&vol, true);
    drop(vol);
    within_10s(
        || weak.strong_count() == 0,
        || format!("{} references to a dropped cache remain", weak.strong_count()),
    );
}
