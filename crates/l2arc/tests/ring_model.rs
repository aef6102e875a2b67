//! L2 writes, reads, wrap-around and invalidation against a model of which
//! records must (or must not) be readable, with faults injected.

use std::collections::HashMap;
use std::sync::Arc;

use arcache_l2::{BlobFlags, FeedItem, L2Arc, L2Device, L2Miss, SharedBytes, HEADER_RESERVED};
use blockdev::{FaultPlan, FaultyDev, MemDev};
use proptest::prelude::*;

fn bytes_for(key: u64, version: u8, len: usize) -> Vec<u8> {
    (0..len).map(|i| (key as u8).wrapping_mul(31).wrapping_add(version).wrapping_add(i as u8)).collect()
}

/// Bytes whose memory is aligned for O_DIRECT, as the server's allocator
/// places records of whole pages: the feed writes those in place.
struct Aligned(blockdev::AlignedBuf);

impl AsRef<[u8]> for Aligned {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

/// Half the keys' bytes aligned, the others not, so batches mix records
/// written in place with records copied.
fn data_for(key: u64, version: u8, len: usize) -> SharedBytes {
    let bytes = bytes_for(key, version, len);
    if (key + u64::from(version)).is_multiple_of(2) {
        return Arc::new(bytes);
    }
    let mut buf = blockdev::AlignedBuf::new(len);
    buf.as_mut_slice().copy_from_slice(&bytes);
    Arc::new(Aligned(buf))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Whatever the L2 returns for a key is that key's latest fed version,
    /// never an older one and never another key's bytes.
    #[test]
    fn never_returns_stale_or_foreign_bytes(ops in prop::collection::vec((0u8..4, 0u64..200, 1usize..40), 1..300)) {
        let dev = L2Device::new("m".into(), Arc::new(MemDev::new(HEADER_RESERVED + (17 << 20)))).unwrap();
        let l2 = L2Arc::new(vec![dev]).unwrap();
        let mut version: HashMap<u64, u8> = HashMap::new();
        for (op, key, kib) in ops {
            match op {
                0 | 1 => {
                    // Feed a batch of this key and a few neighbours.
                    let mut items = Vec::new();
                    for k in key..key + 8 {
                        if l2.begin_feed(k) {
                            let v = *version.entry(k).or_insert(0);
                            items.push(FeedItem { key: k, data: data_for(k, v, kib * 1024), flags: BlobFlags::default() });
                        }
                    }
                    if !items.is_empty() {
                        l2.write_batch(0, items, 1 << 20, false).unwrap();
                    }
                }
                2 => {
                    // A client write: the record changes, any L2 copy must die.
                    *version.entry(key).or_insert(0) += 1;
                    l2.invalidate(key);
                }
                _ => {
                    if let Some(p) = l2.lookup(key) {
                        let got = l2.read(key, p).unwrap();
                        let v = version.get(&key).copied().unwrap_or(0);
                        prop_assert!(got.len().is_multiple_of(1024));
                        prop_assert_eq!(&got[..], &bytes_for(key, v, got.len())[..], "key {}", key);
                    }
                }
            }
        }
        let (n, _, asize) = l2.sizes();
        prop_assert!(asize <= 17 << 20);
        prop_assert!(n <= 200 + 8);
    }
}

/// An L2 on a fault-injecting device, holding records 0..64 of 8 KiB.
fn faulty_l2_with_64_records(seed: u64) -> (Arc<FaultyDev<MemDev>>, L2Arc) {
    let faulty = Arc::new(FaultyDev::new(MemDev::new(HEADER_RESERVED + (17 << 20)), seed));
    let l2 = L2Arc::new(vec![L2Device::new("f".into(), faulty.clone()).unwrap()]).unwrap();
    let items: Vec<FeedItem> = (0..64)
        .map(|k| {
            assert!(l2.begin_feed(k));
            FeedItem { key: k, data: data_for(k, 0, 8192), flags: BlobFlags::default() }
        })
        .collect();
    l2.write_batch(0, items, 0, false).unwrap();
    (faulty, l2)
}

#[test]
fn a_write_during_the_feed_keeps_the_old_bytes_out_of_the_index() {
    let dev = L2Device::new("m".into(), Arc::new(MemDev::new(HEADER_RESERVED + (17 << 20)))).unwrap();
    let l2 = L2Arc::new(vec![dev]).unwrap();
    assert!(l2.begin_feed(5));
    assert!(!l2.begin_feed(5), "already being fed");
    l2.invalidate(5); // the client overwrote record 5 while the feed held the old bytes
    l2.write_batch(
        0,
        vec![FeedItem { key: 5, data: data_for(5, 0, 4096), flags: BlobFlags::default() }],
        0,
        false,
    )
    .unwrap();
    assert!(l2.lookup(5).is_none());
}

#[test]
fn flipped_bits_and_io_errors_are_caught_and_a_failing_device_is_retired() {
    let (faulty, l2) = faulty_l2_with_64_records(3);
    faulty.set_plan(FaultPlan { flip_bit_probability: 1.0, ..Default::default() });
    let p = l2.lookup(1).unwrap();
    assert_eq!(l2.read(1, p), Err(L2Miss::ChecksumBad));
    assert!(l2.lookup(1).is_none(), "a bad copy is dropped");
    faulty.set_plan(FaultPlan::default());
    let p = l2.lookup(50).unwrap();
    assert!(l2.read(50, p).is_ok(), "a good read resets the failure count");
    faulty.set_plan(FaultPlan { fail_reads: std::iter::once(0..u64::MAX).collect(), ..Default::default() });
    for k in 2..2 + arcache_l2::device::FAILURES_TO_RETIRE as u64 {
        let p = l2.lookup(k).unwrap();
        assert_eq!(l2.read(k, p), Err(L2Miss::IoError));
    }
    assert_eq!(l2.healthy_devices(), 0, "failures in a row retire the device");
    assert_eq!(l2.sizes().0, 0, "and forget everything on it");
    assert!(l2.stats.l2_io_error.load(std::sync::atomic::Ordering::Relaxed) >= 4);
}

/// A device that keeps nothing: lets the index be measured at millions of
/// records without writing gigabytes.
struct NullDev(u64);

impl blockdev::BlockDev for NullDev {
    fn size(&self) -> u64 {
        self.0
    }
    fn read_at(&self, buf: &mut [u8], _offset: u64) -> blockdev::DevResult<()> {
        buf.fill(0);
        Ok(())
    }
    fn write_at(&self, _buf: &[u8], _offset: u64) -> blockdev::DevResult<()> {
        Ok(())
    }
    fn flush(&self) -> blockdev::DevResult<()> {
        Ok(())
    }
    fn describe(&self) -> String {
        "null".into()
    }
}

/// The RAM cost of an L2-only record (index slot plus its key in the batch
/// list) stays within 48 bytes at five million records; OpenZFS spends 96.
#[test]
fn hdr_bytes_per_record_at_five_million_records() {
    const N: u64 = 5_000_000;
    let dev =
        L2Device::new("null".into(), Arc::new(NullDev(HEADER_RESERVED + N * 512 + (64 << 20)))).unwrap();
    let l2 = L2Arc::new(vec![dev]).unwrap();
    let tiny: SharedBytes = Arc::new([7u8; 16]);
    let mut key = 0;
    while key < N {
        let items: Vec<FeedItem> = (key..(key + 20_000).min(N))
            .map(|k| {
                assert!(l2.begin_feed(k));
                FeedItem {
                    key: k,
                    data: Arc::clone(&tiny),
                    flags: BlobFlags { lshift: 2, ..Default::default() },
                }
            })
            .collect();
        key += items.len() as u64;
        l2.write_batch(0, items, 0, false).unwrap();
    }
    let (records, size, _) = l2.sizes();
    assert_eq!(records, N);
    assert_eq!(size, N * 16384);
    let per = l2.hdr_size() as f64 / records as f64;
    println!("l2_hdr_size / records at {records} records: {per:.1} bytes");
    assert!(per <= 48.0, "{per} bytes per L2 record");
}

#[test]
fn a_device_returning_bad_data_again_and_again_is_retired() {
    let (faulty, l2) = faulty_l2_with_64_records(4);
    faulty.set_plan(FaultPlan { flip_bit_probability: 1.0, ..Default::default() });
    for k in 0..arcache_l2::device::FAILURES_TO_RETIRE as u64 - 1 {
        let p = l2.lookup(k).unwrap();
        assert_eq!(l2.read(k, p), Err(L2Miss::ChecksumBad));
    }
    assert_eq!(l2.healthy_devices(), 1, "a few bad reads are tolerated");
    faulty.set_plan(FaultPlan::default());
    let p = l2.lookup(40).unwrap();
    assert!(l2.read(40, p).is_ok(), "a good read resets the count");
    faulty.set_plan(FaultPlan { flip_bit_probability: 1.0, ..Default::default() });
    for k in 20..20 + arcache_l2::device::FAILURES_TO_RETIRE as u64 {
        let p = l2.lookup(k).unwrap();
        assert_eq!(l2.read(k, p), Err(L2Miss::ChecksumBad));
    }
    assert_eq!(l2.healthy_devices(), 0, "bad data every time retires it");
}
