//! A cache's prefetch threads end with the cache: each cache starts its own
//! pool on first use, and its workers used to sleep on forever once the
//! cache was gone (8 threads a cache; the model test ran out of threads
//! after about 2,000 cases in one process).

use std::sync::Arc;
use std::time::{Duration, Instant};

use arcache_engine::{Cache, CacheConfig, Volume, VolumeConfig};
use blockdev::MemDev;

/// Threads of this process whose name starts with `prefix`.
fn threads_named(prefix: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.starts_with(prefix))
        .count()
}

/// A cache and a volume over 8 MiB, read in order so zfetch prefetches.
fn streamed_cache() {
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
}

#[test]
fn a_dropped_caches_prefetch_threads_end() {
    let mut most = 0;
    for _ in 0..20 {
        streamed_cache();
        most = most.max(threads_named("prefetch-"));
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
/// job left waiting, would keep every record in RAM).
#[test]
fn a_dropped_cache_is_freed() {
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
