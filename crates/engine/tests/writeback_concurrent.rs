//! Write-back under concurrency: threads write byte-granular ranges (so
//! partial sectors are read, modified and written) and flush, while the txg
//! thread syncs with a tiny dirty limit and the feed copies records to L2.
//! Every read must equal the model, and after shutdown the backing store
//! must hold exactly the model's bytes.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use arcache_engine::{
    Cache, CacheConfig, Feed, FeedTunables, Volume, VolumeConfig, WriteBack, WriteTunables,
};
use arcache_l2::{L2Arc, L2Device, HEADER_RESERVED};
use blockdev::{BlockDev, MemDev, SlowDev, SlowDevConfig};
use rand::{Rng, SeedableRng};

const THREADS: usize = 6;
const REGION: usize = 96 << 10;

#[test]
fn concurrent_unaligned_writes_flushes_and_syncs_match_the_model() {
    let backing = Arc::new(MemDev::new((THREADS * REGION) as u64));
    let slow_cfg = SlowDevConfig {
        latency: std::time::Duration::from_micros(300),
        parallelism: 8,
        bandwidth: 400 << 20,
    };
    let slow: Arc<dyn BlockDev> = Arc::new(SlowDev::new(Arc::clone(&backing), slow_cfg));
    let l2dev = Arc::new(MemDev::new(HEADER_RESERVED + (4 << 20)));
    let l2 =
        Arc::new(L2Arc::new(vec![L2Device::new("l2".into(), l2dev as Arc<dyn BlockDev>).unwrap()]).unwrap());
    let cache = Cache::with_l2(
        CacheConfig { arc_min: 64 << 10, arc_max: 192 << 10, min_prefetch_ms: 0, compress: true },
        Some(Arc::clone(&l2)),
    );
    let tun = Arc::new(WriteTunables::default());
    tun.dirty_data_max.store(256 << 10, Relaxed);
    tun.txg_timeout_secs.store(1, Relaxed);
    let wb = WriteBack::new(None, Some(l2), tun);
    wb.spawn();
    let vol = Volume::with_writeback(
        0,
        VolumeConfig { name: "t".into(), recordsize: 16 << 10, read_only: false },
        slow,
        Arc::clone(&cache),
        Arc::clone(&wb),
    );
    let ftun = Arc::new(FeedTunables::default());
    ftun.dwpd_limit.store(0, Relaxed);
    ftun.feed_min_ms.store(10, Relaxed);
    let feed = Feed::new(Arc::clone(&cache), ftun, Arc::new(AtomicU64::new(192 << 10))).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let feeder = feed.spawn(Arc::clone(&stop));

    let models: Vec<Vec<u8>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let vol = Arc::clone(&vol);
                s.spawn(move || {
                    let mut rng = rand::rngs::StdRng::seed_from_u64(t as u64);
                    let base = (t * REGION) as u64;
                    let mut model = vec![0u8; REGION];
                    for i in 0..1500 {
                        let off = rng.gen_range(0..REGION - 1);
                        let len = rng.gen_range(1..=(REGION - off).min(20_000));
                        match rng.gen_range(0..10) {
                            0..=5 => {
                                let data: Vec<u8> = (0..len).map(|_| rng.gen()).collect();
                                vol.write(base + off as u64, &data, rng.gen_bool(0.05)).unwrap();
                                model[off..off + len].copy_from_slice(&data);
                            }
                            6 => vol.flush().unwrap(),
                            7 => {
                                vol.write_zeroes(base + off as u64, len as u64, false).unwrap();
                                model[off..off + len].fill(0);
                            }
                            _ => {
                                let mut buf = vec![0u8; len];
                                vol.read(base + off as u64, &mut buf).unwrap();
                                assert!(
                                    buf == model[off..off + len],
                                    "thread {t} op {i}: read differs at {off}+{len}"
                                );
                            }
                        }
                    }
                    model
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    stop.store(true, Relaxed);
    feeder.join().unwrap();
    let v = wb.view();
    assert!(v.txg_syncs > 0, "txgs ran: {v:?}");
    wb.shutdown().unwrap();
    assert_eq!(wb.view().dirty_bytes, 0);
    let disk = backing.snapshot();
    for (t, model) in models.iter().enumerate() {
        assert!(
            disk[t * REGION..(t + 1) * REGION] == model[..],
            "thread {t}: backing store differs after shutdown"
        );
    }
    cache.validate().unwrap();
}
