//! Reads answered with the records themselves (`Volume::read_held`, the
//! NBD server's large reads): each record a read brings in is kept the
//! moment it is found. A read larger than the whole ARC evicts its own
//! first records before it is over; looked up again afterwards, they would
//! be gone and read from the store a second time.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use arcache_engine::{Cache, CacheConfig, Held, Volume, VolumeConfig, WriteBack, WriteTunables};
use blockdev::{BlockDev, CountingDev, MemDev};
use rand::{Rng, SeedableRng};

const RS: u64 = 16 << 10;
/// The last record is short.
const DEV: u64 = (16 << 20) + 5000;

/// A read-only volume of `data` over a store that counts what it reads,
/// with no prefetches: every read counted is the test's own.
fn volume(data: &[u8], arc_max: u64, compress: bool) -> (Arc<CountingDev<MemDev>>, Arc<Volume>) {
    let inner = MemDev::new(data.len() as u64);
    inner.write_at(data, 0).unwrap();
    let dev = Arc::new(CountingDev::new(inner));
    let cache = Cache::new(CacheConfig { arc_min: arc_max / 2, arc_max, min_prefetch_ms: 0, compress });
    cache.zfetch.disable.store(true, Relaxed);
    let cfg = VolumeConfig { name: "t".into(), recordsize: RS, read_only: true };
    let vol = Volume::new(0, cfg, Arc::clone(&dev) as Arc<dyn BlockDev>, cache);
    (dev, vol)
}

fn bytes_of(held: &[Held]) -> Vec<u8> {
    held.iter().flat_map(Held::as_slice).copied().collect()
}

#[test]
fn a_held_read_larger_than_the_arc_reads_each_record_once() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let data: Vec<u8> = (0..DEV).map(|_| rng.gen()).collect();
    let arc_max = 1 << 20;
    let (dev, vol) = volume(&data, arc_max, false);
    let len = 4 << 20;
    let held = vol.read_held(RS, len).unwrap().expect("a read of whole records is held");
    assert_eq!(held.len() as u64, len as u64 / RS);
    assert!(bytes_of(&held) == data[RS as usize..RS as usize + len], "the held bytes");
    assert_eq!(
        dev.counts().read_bytes,
        len as u64,
        "bytes read from the store for a {len}-byte read through a {arc_max}-byte ARC"
    );
    // Held records are the cached ones where RAM kept them: the last
    // records of the read, still cached, come back as they are, and so
    // they do on the connection thread's path.
    assert!(matches!(held.last(), Some(Held::Record(_))));
    let end = RS + len as u64;
    let again =
        vol.try_read_cached_held(end - 4 * RS, 4 * RS as usize).expect("the read's last records are cached");
    assert!(again.iter().all(|h| matches!(h, Held::Record(_))), "uncompressed records are held as they are");
    assert!(bytes_of(&again) == data[(end - 4 * RS) as usize..end as usize]);
    // A read that is not of whole records is the copying path's.
    assert!(vol.read_held(RS + 512, 4096).unwrap().is_none());
    assert!(vol.read_held(0, RS as usize + 1).unwrap().is_none());
    // The volume's last record may be short and is still whole.
    let tail = vol.read_held(DEV - 5000, 5000).unwrap().expect("the last record");
    assert!(bytes_of(&tail) == data[(DEV - 5000) as usize..]);
    assert_eq!(dev.counts().read_bytes, len as u64 + 5000, "the last record read once");
}

/// The connection thread's path: a read of whole records all in RAM is
/// answered with them (compressed ones as their plain bytes), anything
/// else is left to the blocking path, having read nothing.
#[test]
fn a_cached_read_of_whole_records_is_held_without_io() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    // Zeroes in the first half of each record (where the compression
    // probe looks), noise in the second, so records compress.
    let data: Vec<u8> = (0..DEV).map(|i| if (i % RS) < RS / 2 { 0 } else { rng.gen() }).collect();
    let (dev, vol) = volume(&data, 64 << 20, true);
    assert!(vol.try_read_cached_held(0, 4 * RS as usize).is_none(), "nothing cached yet");
    // A cold held read of compressed records keeps the plain bytes it read,
    // each record read once.
    let cold = vol.read_held(0, 8 * RS as usize).unwrap().expect("whole records");
    assert!(bytes_of(&cold) == data[..8 * RS as usize]);
    assert!(cold.iter().all(|h| matches!(h, Held::Bytes(_))));
    assert_eq!(dev.counts().read_bytes, 8 * RS, "each record read once");
    let reads = dev.counts().reads;
    let held = vol.try_read_cached_held(RS, 4 * RS as usize).expect("cached whole records");
    assert!(bytes_of(&held) == data[RS as usize..5 * RS as usize]);
    assert!(held.iter().all(|h| matches!(h, Held::Bytes(_))), "compressed records come as plain bytes");
    assert!(vol.try_read_cached_held(RS, 4096).is_none(), "part of a record");
    assert!(vol.try_read_cached_held(7 * RS, 2 * RS as usize).is_none(), "a record not cached");
    assert_eq!(dev.counts().reads, reads, "the connection thread's path reads nothing");
}

/// Dirty bytes of a written-back volume that has not synced them yet are
/// laid over the records a held read brings back from the store, as over a
/// copying read's: the records were evicted, the writes were not.
#[test]
fn a_held_read_sees_the_dirty_bytes_of_evicted_records() {
    let backing = Arc::new(MemDev::new(DEV));
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut model: Vec<u8> = (0..DEV).map(|_| rng.gen()).collect();
    backing.write_at(&model, 0).unwrap();
    let arc_max = 1 << 20;
    let cache =
        Cache::new(CacheConfig { arc_min: arc_max / 2, arc_max, min_prefetch_ms: 0, compress: false });
    cache.zfetch.disable.store(true, Relaxed);
    let tun = Arc::new(WriteTunables::default());
    // Nothing syncs during the test: the dirty bytes stay beside the ARC.
    tun.dirty_data_max.store(512 << 20, Relaxed);
    tun.dirty_data_sync_percent.store(100, Relaxed);
    tun.delay_min_dirty_percent.store(100, Relaxed);
    tun.txg_timeout_secs.store(1000, Relaxed);
    let wb = WriteBack::new(None, None, tun);
    let cfg = VolumeConfig { name: "t".into(), recordsize: RS, read_only: false };
    let vol = Volume::with_writeback(0, cfg, Arc::clone(&backing) as Arc<dyn BlockDev>, cache, wb);
    // 4K into each of the first 16 records.
    for r in 0..16u64 {
        let at = r * RS + 4096;
        let bytes = vec![r as u8 ^ 0x5a; 4096];
        vol.write(at, &bytes, false).unwrap();
        model[at as usize..at as usize + 4096].copy_from_slice(&bytes);
    }
    // Read 4 MiB elsewhere through the 1 MiB ARC: the written records leave RAM.
    let mut buf = vec![0u8; 4 << 20];
    vol.read(8 << 20, &mut buf).unwrap();
    assert!(
        vol.try_read_cached_held(0, 16 * RS as usize).is_none(),
        "the written records are still in RAM: the test shows nothing"
    );
    let held = vol.read_held(0, 16 * RS as usize).unwrap().expect("whole records");
    assert!(bytes_of(&held) == model[..16 * RS as usize], "the dirty bytes over the store's");
    assert!(
        backing.snapshot()[4096..8192] != model[4096..8192],
        "the writes were synced: the test shows nothing"
    );
}
