//! The feed skips records it found on L2 (or sent there) without asking L2
//! again, but only while L2 has dropped nothing since: a record whose copy
//! never landed (a failed batch write) or was dropped while the record
//! stayed in RAM is fed at a later cycle.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use arcache_engine::{Cache, CacheConfig, Feed, FeedTunables, Volume, VolumeConfig};
use arcache_l2::{L2Arc, L2Device, HEADER_RESERVED};
use blockdev::{BlockDev, FaultPlan, FaultyDev, MemDev};

const RS: u64 = 16 << 10;
const RECORDS: u64 = 64;
const L2_BYTES: u64 = HEADER_RESERVED + (8 << 20);

#[test]
fn records_of_a_failed_batch_are_fed_at_the_next_cycle() {
    let l2dev = Arc::new(FaultyDev::new(MemDev::new(L2_BYTES), 1));
    let l2 = L2Arc::new(vec![L2Device::new("l2".into(), Arc::clone(&l2dev) as Arc<dyn BlockDev>).unwrap()])
        .unwrap();
    let cache = Cache::with_l2(
        CacheConfig { arc_min: 16 << 20, arc_max: 32 << 20, min_prefetch_ms: 0, compress: false },
        Some(Arc::new(l2)),
    );
    let tun = Arc::new(FeedTunables::default());
    tun.dwpd_limit.store(0, Relaxed);
    let feed = Feed::new(Arc::clone(&cache), tun, Arc::new(AtomicU64::new(32 << 20))).unwrap();
    let vol = Volume::new(
        0,
        VolumeConfig { name: "t".into(), recordsize: RS, read_only: false },
        Arc::new(MemDev::new(RS * RECORDS)),
        Arc::clone(&cache),
    );
    cache.zfetch.disable.store(true, Relaxed);
    let data: Vec<u8> = (0..RS * RECORDS).map(|i| (i * 7 / 3) as u8).collect();
    vol.write(0, &data, false).unwrap();
    let l2 = Arc::clone(cache.l2().unwrap());
    let on_l2 = || (0..RECORDS).filter(|&r| l2.contains(r)).count() as u64;

    let data_area = HEADER_RESERVED..L2_BYTES;
    l2dev.set_plan(FaultPlan { fail_writes: Vec::from([data_area]), ..FaultPlan::default() });
    let (wrote, _) = feed.cycle_once();
    assert_eq!((wrote, on_l2()), (0, 0), "the batch write failed");
    assert!(l2.stats.l2_writes_error.load(Relaxed) > 0, "a write was tried");

    l2dev.set_plan(FaultPlan::default());
    feed.cycle_once();
    assert_eq!(on_l2(), RECORDS, "every record fed once the device takes writes");
    assert_eq!(cache.count_cached(&(0..RECORDS).collect::<Vec<_>>()), RECORDS, "all still in RAM");
}
