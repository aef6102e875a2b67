//! Partial L2 reads: a small read of a record that lives only on L2 reads
//! half of its copy, checked on its own, and leaves the record out of RAM
//! until it is read again within the window.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use arcache_engine::{Cache, CacheConfig, Feed, FeedTunables, Volume, VolumeConfig};
use arcache_l2::{L2Arc, L2Device, HEADER_RESERVED};
use blockdev::{BlockDev, MemDev};

const RS: u64 = 16 << 10;
const RECORDS: u64 = 64;

struct Rig {
    cache: Arc<Cache>,
    vol: Arc<Volume>,
    l2mem: Arc<MemDev>,
    data: Vec<u8>,
}

fn noise(len: usize) -> Vec<u8> {
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    (0..len)
        .map(|_| {
            arc_policy::xorshift(&mut x);
            x as u8
        })
        .collect()
}

/// 64 incompressible 16 KiB records, all fed to L2, then the ARC shrunk to
/// four records so nearly all of them live only on L2 and have no ghost.
fn rig() -> Rig {
    let backing = Arc::new(MemDev::new(RS * RECORDS));
    let l2mem = Arc::new(MemDev::new(HEADER_RESERVED + (8 << 20)));
    let l2 =
        L2Arc::new(vec![L2Device::new("l2".into(), l2mem.clone() as Arc<dyn BlockDev>).unwrap()]).unwrap();
    let cache = Cache::with_l2(
        CacheConfig { arc_min: 1 << 20, arc_max: 2 << 20, min_prefetch_ms: 1000, compress: false },
        Some(Arc::new(l2)),
    );
    let tun = Arc::new(FeedTunables::default());
    tun.dwpd_limit.store(0, Relaxed);
    let feed = Feed::new(Arc::clone(&cache), tun, Arc::new(AtomicU64::new(2 << 20))).unwrap();
    let vol = Volume::new(
        0,
        VolumeConfig { name: "t".into(), recordsize: RS, read_only: false },
        backing,
        Arc::clone(&cache),
    );
    // No prefetches: they would bring records into RAM behind the test's back.
    cache.zfetch.disable.store(true, Relaxed);
    let data = noise((RS * RECORDS) as usize);
    vol.write(0, &data, false).unwrap();
    feed.cycle_once();
    let l2 = cache.l2().unwrap();
    assert!((0..RECORDS).all(|r| l2.contains(r)), "every record fed to L2");
    cache.set_limits(4 * RS, 4 * RS);
    Rig { cache, vol, l2mem, data }
}

fn read(r: &Rig, offset: u64, len: usize) -> Vec<u8> {
    let mut b = vec![0u8; len];
    r.vol.read(offset, &mut b).unwrap();
    assert!(b[..] == r.data[offset as usize..offset as usize + len], "read {offset}+{len}");
    b
}

#[test]
fn a_small_read_of_an_l2_only_record_reads_half_and_leaves_it_out_of_ram() {
    let r = rig();
    let before = r.cache.stats();
    // Second half of record 0.
    read(&r, RS / 2 + 4096, 4096);
    let after = r.cache.stats();
    assert_eq!(after.l2_partial_reads - before.l2_partial_reads, 1);
    assert_eq!(after.l2_read_bytes - before.l2_read_bytes, RS / 2, "half the copy read");
    assert_eq!(after.l2_hits - before.l2_hits, 1);
    assert_eq!(r.cache.count_cached(&[0]), 0, "not brought into RAM");

    // Read again soon: now it is worth caching, read whole.
    read(&r, 0, 4096);
    let again = r.cache.stats();
    assert_eq!(again.l2_partial_reads, after.l2_partial_reads);
    assert_eq!(again.l2_read_bytes - after.l2_read_bytes, RS, "the whole copy read");
    assert_eq!(r.cache.count_cached(&[0]), 1, "cached on the second read");
    r.cache.validate().unwrap();
}

#[test]
fn a_read_across_the_halves_or_with_partial_reads_off_reads_whole() {
    let r = rig();
    let before = r.cache.stats();
    read(&r, RS + RS / 2 - 512, 1024);
    let after = r.cache.stats();
    assert_eq!(after.l2_partial_reads, before.l2_partial_reads);
    assert_eq!(r.cache.count_cached(&[1]), 1);

    r.cache.set_partial_reads(false);
    read(&r, 2 * RS, 4096);
    assert_eq!(r.cache.stats().l2_partial_reads, before.l2_partial_reads);
    assert_eq!(r.cache.count_cached(&[2]), 1);
}

#[test]
fn a_damaged_half_is_caught_on_its_own_and_the_read_served_from_the_backing_store() {
    let r = rig();
    let l2 = r.cache.l2().unwrap();
    let ptr = l2.lookup(5).unwrap();
    assert!(ptr.split());
    // Garbage over the second half of record 5's copy.
    r.l2mem.write_at(&vec![0xA5; 4096], ptr.daddr() + ptr.blob_len() / 2).unwrap();
    let before = r.cache.stats();
    // The first half is intact and verifies alone.
    read(&r, 5 * RS, 4096);
    let mid = r.cache.stats();
    assert_eq!(mid.l2_partial_reads - before.l2_partial_reads, 1);
    assert_eq!(mid.l2_cksum_bad, before.l2_cksum_bad);
    // The second read of record 5 soon after the first goes whole, and
    // damage in either half fails the whole copy.
    read(&r, 5 * RS + RS / 2, 4096);
    let after = r.cache.stats();
    assert_eq!(after.l2_cksum_bad - mid.l2_cksum_bad, 1, "the damaged copy is caught");
    assert!(l2.lookup(5).is_none(), "and dropped");
    assert!(after.backing_reads > mid.backing_reads, "served from the backing store");

    // A damaged half caught by a partial read: record 7, second half.
    let ptr = l2.lookup(7).unwrap();
    r.l2mem.write_at(&vec![0x5A; 4096], ptr.daddr() + ptr.blob_len() / 2 + 4096).unwrap();
    read(&r, 7 * RS + RS / 2, 4096);
    let last = r.cache.stats();
    assert_eq!(last.l2_cksum_bad - after.l2_cksum_bad, 1);
    assert_eq!(
        last.l2_partial_reads, after.l2_partial_reads,
        "the failed half read is not counted as served"
    );
    assert!(l2.lookup(7).is_none());
}
