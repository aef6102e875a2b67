//! The engine against a plain byte-array model: random reads, writes, trims
//! and zeroing with a cache far smaller than the device, so records are
//! evicted and refilled all the time. Every read must equal the model.

use std::sync::Arc;

use arcache_engine::{Cache, CacheConfig, Volume, VolumeConfig};
use blockdev::{BlockDev, FaultPlan, FaultyDev, MemDev};
use proptest::prelude::*;

const DEV: u64 = 256 << 10;

#[derive(Debug, Clone)]
enum Op {
    Read(u64, u64),
    Write(u64, u64, u8),
    Zero(u64, u64),
    Trim(u64, u64),
}

fn range() -> impl Strategy<Value = (u64, u64)> {
    (0..DEV, 1u64..40_000).prop_map(|(o, l)| (o, l.min(DEV - o)))
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => range().prop_map(|(o, l)| Op::Read(o, l)),
        4 => (range(), any::<u8>()).prop_map(|((o, l), b)| Op::Write(o, l, b)),
        1 => range().prop_map(|(o, l)| Op::Zero(o, l)),
        1 => range().prop_map(|(o, l)| Op::Trim(o, l)),
    ]
}

fn volume(dev: Arc<dyn BlockDev>, recordsize: u64, arc_max: u64) -> (Arc<Cache>, Arc<Volume>) {
    let cache =
        Cache::new(CacheConfig { arc_min: arc_max / 2, arc_max, min_prefetch_ms: 1000, compress: true });
    let v = Volume::new(
        0,
        VolumeConfig { name: "t".into(), recordsize, read_only: false },
        dev,
        Arc::clone(&cache),
    );
    (cache, v)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(120))]

    #[test]
    fn reads_always_match_the_model(ops in prop::collection::vec(op(), 1..80), rs_shift in 12u32..16) {
        let dev = Arc::new(MemDev::new(DEV));
        let (cache, v) = volume(dev.clone(), 1 << rs_shift, 64 << 10);
        let mut model = vec![0u8; DEV as usize];
        for op in ops {
            match op {
                Op::Read(o, l) => {
                    let mut b = vec![0u8; l as usize];
                    v.read(o, &mut b).unwrap();
                    prop_assert!(b == model[o as usize..(o + l) as usize], "read {o}+{l}");
                    let mut b2 = vec![0u8; l as usize];
                    if v.try_read_cached(o, &mut b2) {
                        prop_assert!(b2 == b);
                    }
                }
                Op::Write(o, l, byte) => {
                    let data: Vec<u8> = (0..l).map(|i| byte.wrapping_add(i as u8)).collect();
                    v.write(o, &data, false).unwrap();
                    model[o as usize..(o + l) as usize].copy_from_slice(&data);
                }
                Op::Zero(o, l) => {
                    v.write_zeroes(o, l, false).unwrap();
                    model[o as usize..(o + l) as usize].fill(0);
                }
                Op::Trim(o, l) => {
                    // MemDev keeps trimmed bytes, so the model does too.
                    v.trim(o, l, false).unwrap();
                }
            }
            if let Err(e) = cache.validate() {
                return Err(TestCaseError::fail(e));
            }
            let st = cache.stats();
            prop_assert!(st.size <= st.c_max, "size {} above arc_max {}", st.size, st.c_max);
        }
        prop_assert!(dev.snapshot() == model, "device matches the model");
    }
}

#[test]
fn failed_write_is_reported_and_never_cached() {
    let mem = Arc::new(MemDev::new(DEV));
    let faulty = Arc::new(FaultyDev::new(mem.clone(), 1));
    let (_cache, v) = volume(faulty.clone(), 4096, 1 << 20);
    let mut b = vec![0u8; 8192];
    v.read(0, &mut b).unwrap(); // cached
    faulty.set_plan(FaultPlan { fail_writes: std::iter::once(0..4096).collect(), ..Default::default() });
    assert!(v.write(0, &[9u8; 8192], false).is_err());
    faulty.set_plan(FaultPlan::default());
    v.read(0, &mut b).unwrap();
    assert_eq!(b, mem.snapshot()[..8192], "cache agrees with the device after a failed write");
}

#[test]
fn read_errors_reach_the_caller_and_other_ranges_still_work() {
    let faulty = Arc::new(FaultyDev::new(MemDev::new(DEV), 1));
    faulty.set_plan(FaultPlan { fail_reads: std::iter::once(8192..8193).collect(), ..Default::default() });
    let (cache, v) = volume(faulty, 4096, 1 << 20);
    let mut b = vec![0u8; 4096];
    assert_eq!(v.read(8192, &mut b).unwrap_err().errno(), libc_eio());
    v.read(0, &mut b).unwrap();
    assert_eq!(cache.stats().backing_errors, 1);
}

/// A failed zeroing, trim or flush of the backing store is counted in
/// `backing_errors`, as a failed read or write is: the clean stop's
/// decision to keep a writer's L2 rests on that count.
#[test]
fn failed_zeroings_trims_and_flushes_are_counted_as_backing_errors() {
    let faulty = Arc::new(FaultyDev::new(MemDev::new(DEV), 1));
    let (cache, v) = volume(faulty.clone(), 4096, 1 << 20);
    faulty.set_plan(FaultPlan { fail_writes: std::iter::once(0..4096).collect(), ..Default::default() });
    assert!(v.write_zeroes(0, 8192, false).is_err());
    assert_eq!(cache.stats().backing_errors, 1, "a failed zeroing");
    faulty.set_plan(FaultPlan { fail_flush: true, ..Default::default() });
    assert!(v.flush().is_err());
    assert_eq!(cache.stats().backing_errors, 2, "a failed flush");
    faulty.set_plan(FaultPlan { fail_trims: true, ..Default::default() });
    assert!(v.trim(0, 8192, false).is_err());
    assert_eq!(cache.stats().backing_errors, 3, "a failed trim");
    faulty.set_plan(FaultPlan::default());
    v.write_zeroes(0, 8192, false).unwrap();
    v.trim(0, 8192, false).unwrap();
    v.flush().unwrap();
    assert_eq!(cache.stats().backing_errors, 3, "nothing counted once the store works");
}

fn libc_eio() -> i32 {
    5
}

/// Concurrent fills and writes of the same records: after everything
/// settles, the cache must hold what the device holds.
#[test]
fn concurrent_fills_and_writes_never_leave_stale_records() {
    let dev = Arc::new(MemDev::new(DEV));
    let (cache, v) = volume(dev.clone(), 4096, 8 << 20);

    std::thread::scope(|s| {
        for t in 0..4u8 {
            let v = Arc::clone(&v);
            s.spawn(move || {
                for i in 0..2000u64 {
                    let off = (i * 7919 + t as u64 * 131) % (DEV - 8192);
                    if (i + t as u64).is_multiple_of(3) {
                        v.write(off, &[t.wrapping_add(i as u8); 6000], false).unwrap();
                    } else {
                        let mut b = vec![0u8; 6000];
                        v.read(off, &mut b).unwrap();
                    }
                }
            });
        }
    });
    let mut all = vec![0u8; DEV as usize];
    v.read(0, &mut all).unwrap();
    assert!(all == dev.snapshot(), "cached view equals the device");
    cache.validate().unwrap();
}
