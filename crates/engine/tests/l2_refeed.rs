//! The feed sends a record once per stay in RAM, and skips the records it
//! marked without asking L2 again until copies are lost to a fault: a
//! record whose copy never landed (a failed batch write) is fed at a later
//! cycle; one whose copy the hand overwrote, for room for newer records,
//! is not fed again while it stays in RAM, so an L2 smaller than what RAM
//! holds is not rewritten in circles, nor is it once clients write; a
//! record a write changed is fed again. Copies lost with a retired device
//! are fed to the device left. A device smaller than two of the feed's
//! batches gets smaller batches.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use arcache_engine::{Cache, CacheConfig, Feed, FeedRules, FeedTunables, ScanMarks, Volume, VolumeConfig};
use arcache_l2::FeedItem;
use arcache_l2::{ExportDesc, L2Arc, L2Device, PersistOptions, HEADER_RESERVED};
use blockdev::{BlockDev, FaultPlan, FaultyDev, MemDev};

const RS: u64 = 16 << 10;

struct Rig {
    cache: Arc<Cache>,
    feed: Feed,
    l2: Arc<L2Arc>,
    vol: Arc<Volume>,
    records: u64,
}

impl Rig {
    /// `records` records of an export written into an ARC twice their size
    /// (all stay in RAM), with an L2 on `l2dev`; nothing fed yet.
    fn new(l2dev: Arc<dyn BlockDev>, records: u64) -> Rig {
        Rig::on_devices(vec![l2dev], records, records, false)
    }

    /// The same with an L2 of several devices, persistent (each with its
    /// log) or not, and an export of `size` records of which the first
    /// `records` are written.
    fn on_devices(l2devs: Vec<Arc<dyn BlockDev>>, records: u64, size: u64, persistent: bool) -> Rig {
        let devices =
            l2devs.into_iter().enumerate().map(|(i, d)| L2Device::new(format!("l2-{i}"), d).unwrap());
        let l2 = if persistent {
            let desc = ExportDesc {
                id: 0,
                name: "t".into(),
                recordsize: RS as u32,
                size: RS * size,
                identity: 7,
                contents: 7,
            };
            let opts = PersistOptions { rebuild_enabled: true, min_l2size: 0, state_dir: None };
            let l2 = L2Arc::open(devices.collect(), &[desc], &opts).unwrap();
            l2.rebuild(1 << 20, &|_: &[u64]| 0, &AtomicBool::new(false));
            l2
        } else {
            L2Arc::new(devices.collect()).unwrap()
        };
        let arc_max = 2 * RS * size;
        let cache = Cache::with_l2(
            CacheConfig { arc_min: arc_max / 2, arc_max, min_prefetch_ms: 0, compress: false },
            Some(Arc::new(l2)),
        );
        let tun = Arc::new(FeedTunables::default());
        tun.dwpd_limit.store(0, Relaxed);
        let feed = Feed::new(Arc::clone(&cache), tun, Arc::new(AtomicU64::new(arc_max))).unwrap();
        let cfg = VolumeConfig { name: "t".into(), recordsize: RS, read_only: false };
        let vol = Volume::new(0, cfg, Arc::new(MemDev::new(RS * size)), Arc::clone(&cache));
        cache.zfetch.disable.store(true, Relaxed);
        let data: Vec<u8> = (0..RS * records).map(|i| (i * 7 / 3) as u8).collect();
        vol.write(0, &data, false).unwrap();
        let l2 = Arc::clone(cache.l2().unwrap());
        Rig { cache, feed, l2, vol, records }
    }

    fn on_l2(&self) -> u64 {
        (0..self.records).filter(|&r| self.l2.contains(r)).count() as u64
    }

    /// Records among the export's first `n` whose copy is on device `dev`.
    fn on_device(&self, dev: usize, n: u64) -> usize {
        (0..n).filter(|&r| self.l2.lookup(r).is_some_and(|p| p.dev() == dev)).count()
    }

    /// One feed cycle, its log committed (`cycle_once` leaves it open).
    fn cycle(&self) {
        self.feed.cycle_once();
        self.l2.commit_pending();
    }

    fn all_in_ram(&self) -> bool {
        self.cache.count_cached(&(0..self.records).collect::<Vec<_>>()) == self.records
    }
}

#[test]
fn records_of_a_failed_batch_are_fed_at_the_next_cycle() {
    const L2_BYTES: u64 = HEADER_RESERVED + (8 << 20);
    let l2dev = Arc::new(FaultyDev::new(MemDev::new(L2_BYTES), 1));
    let rig = Rig::new(Arc::clone(&l2dev) as Arc<dyn BlockDev>, 64);

    let data_area = HEADER_RESERVED..L2_BYTES;
    l2dev.set_plan(FaultPlan { fail_writes: Vec::from([data_area]), ..FaultPlan::default() });
    let (wrote, _) = rig.feed.cycle_once();
    assert_eq!((wrote, rig.on_l2()), (0, 0), "the batch write failed");
    assert!(rig.l2.stats.l2_writes_error.load(Relaxed) > 0, "a write was tried");

    l2dev.set_plan(FaultPlan::default());
    rig.feed.cycle_once();
    assert_eq!(rig.on_l2(), 64, "every record fed once the device takes writes");
    assert!(rig.all_in_ram());
}

#[test]
fn an_l2_smaller_than_ram_is_filled_once_not_rewritten_in_circles() {
    // Room for about 1,024 of the 1,536 records RAM holds (and for the
    // feed's batches of 8 MiB).
    let rig = Rig::new(Arc::new(MemDev::new(HEADER_RESERVED + (16 << 20))), 1536);
    let written = || rig.l2.stats.l2_write_bytes.load(Relaxed);
    let cycles = |n| (0..n).for_each(|_| rig.cycle());

    cycles(4);
    let filled = written();
    assert!(filled >= 16 << 20, "{filled} bytes written: the test needs the hand to wrap");
    assert!(
        filled <= RS * 1536 + (1 << 20),
        "{filled} bytes written to fill a 16 MiB L2 from 24 MiB of records"
    );
    cycles(4);
    assert_eq!(written(), filled, "nothing new in RAM, yet the feed wrote again");
    assert!(rig.all_in_ram());
    assert!(rig.on_l2() > 768, "{} records on L2: it is full of them", rig.on_l2());

    // A client writes a few records: those are fed again, and only those
    // (a write once made every overwritten record look dropped).
    for r in [3u64, 700, 1500] {
        rig.vol.write(r * RS + 4096, &[0xa5; 4096], false).unwrap();
    }
    cycles(4);
    let more = written() - filled;
    assert!(more <= 3 * RS + (64 << 10), "{more} bytes written after three records changed");
    assert!([3, 700, 1500].iter().all(|&r| rig.l2.contains(r)), "the changed records fed again");
}

#[test]
fn an_l2_smaller_than_a_batch_is_fed_in_smaller_ones() {
    // 4 MiB for records, below the feed's 8 MiB batches; 6 MiB of records.
    let rig = Rig::new(Arc::new(MemDev::new(HEADER_RESERVED + (4 << 20))), 384);
    rig.cycle();
    rig.cycle();
    assert!(rig.on_l2() > 128, "{} records on L2", rig.on_l2());
    assert_eq!(rig.l2.stats.l2_writes_error.load(Relaxed), 0);
}

#[test]
fn a_cycle_of_many_batches_examines_each_record_once() {
    // 32 MiB of records: the first cycle (nothing measured yet) feeds 16 MiB
    // in two 8 MiB batches, the second the rest in two more.
    let rig = Rig::new(Arc::new(MemDev::new(HEADER_RESERVED + (64 << 20))), 2048);
    rig.cycle();
    let after_one = rig.feed.stats.examined.load(Relaxed);
    assert_eq!(rig.on_l2(), 1024, "the first cycle's budget is 16 MiB");
    rig.cycle();
    assert_eq!(rig.on_l2(), 2048);
    let examined = rig.feed.stats.examined.load(Relaxed);
    // Each batch used to look at every record from the tail again: 7,168
    // records examined here, 3.5 per record fed.
    assert_eq!(after_one, 1024, "the first cycle's second batch looked again at the first's records");
    assert!(examined <= 2 * 2048, "{examined} records examined in two cycles over 2,048");
}

#[test]
fn a_batch_goes_on_where_the_last_one_stopped_even_if_its_record_moved() {
    let rig = Rig::new(Arc::new(MemDev::new(HEADER_RESERVED + (64 << 20))), 300);
    let rules = FeedRules { scan_bytes: u64::MAX, budget: 100 * RS, mfu_only: false, include_prefetch: true };
    let mut marks = ScanMarks::default();
    let keys = |items: Vec<FeedItem>| items.iter().map(|i| i.key).collect::<Vec<_>>();
    let first = keys(rig.cache.feed_candidates(rules, &mut marks));
    assert_eq!(first, (0..100).collect::<Vec<_>>(), "oldest first");
    assert_eq!(std::mem::take(&mut marks.examined), 100);

    let second = keys(rig.cache.feed_candidates(rules, &mut marks));
    assert_eq!(second, (100..200).collect::<Vec<_>>());
    assert_eq!(std::mem::take(&mut marks.examined), 100, "the first batch's records looked at again");

    // The record the batch stopped at moves to the head (a write stores it
    // again): the next batch goes by depth, and passes over one record
    // it never examined, which the next cycle's scan finds.
    rig.vol.write(199 * RS, &[0x5a; RS as usize], false).unwrap();
    let third = keys(rig.cache.feed_candidates(rules, &mut marks));
    assert_eq!(third[..3], [201, 202, 203], "{third:?}");
    assert!(!third.iter().any(|k| first.contains(k) || second[..99].contains(k)), "{third:?}");

    let mut fresh = ScanMarks::default();
    let next_cycle = keys(rig.cache.feed_candidates(rules, &mut fresh));
    assert!(next_cycle.contains(&200), "{next_cycle:?}");
}

const TWO_DEV_BYTES: u64 = HEADER_RESERVED + (8 << 20);

/// 64 records in RAM, an export of `size`, all fed to `first`, the first
/// of two L2 devices of `TWO_DEV_BYTES` (the caller keeps a handle on it to
/// make it fail).
fn fed_to_the_first_of_two(first: Arc<dyn BlockDev>, size: u64, persistent: bool) -> Rig {
    let healthy: Arc<dyn BlockDev> = Arc::new(MemDev::new(TWO_DEV_BYTES));
    let rig = Rig::on_devices(vec![first, healthy], 64, size, persistent);
    rig.cycle();
    assert_eq!(rig.on_device(0, size), 64, "the first device takes the first batch whole");
    rig
}

fn failing_device() -> Arc<FaultyDev<MemDev>> {
    Arc::new(FaultyDev::new(MemDev::new(TWO_DEV_BYTES), 1))
}

/// Retired by its error count, whose path always marked it out of
/// service, and whose failed batches each bump the drop generation: a
/// regression test of that path (the log-failure test below is the one
/// that needs retire's own marking and bump).
#[test]
fn copies_lost_with_a_retired_device_are_fed_to_the_device_left() {
    let failing = failing_device();
    let rig = fed_to_the_first_of_two(Arc::clone(&failing) as Arc<dyn BlockDev>, 80, false);
    let on_device = |dev| rig.on_device(dev, 80);

    // The first device fails every write from now on; each cycle one new
    // record gives it a batch to fail, until it is taken out of service.
    let data_area = HEADER_RESERVED..TWO_DEV_BYTES;
    failing.set_plan(FaultPlan { fail_writes: Vec::from([data_area]), ..FaultPlan::default() });
    let mut cycles = 0;
    while !rig.l2.devices()[0].is_degraded() {
        assert!(cycles < 20, "the failing device was never retired");
        rig.vol.write((64 + cycles as u64) * RS, &[0x5a; RS as usize], false).unwrap();
        rig.cycle();
        cycles += 1;
    }
    assert_eq!(on_device(0), 0, "a retired device's copies are forgotten");

    rig.cycle();
    assert!(rig.all_in_ram());
    assert_eq!(on_device(1) as u64, 64 + cycles as u64, "every record in RAM is on the device left");
}

#[test]
fn copies_lost_when_a_devices_log_fails_are_fed_to_the_device_left() {
    let failing = failing_device();
    let rig = fed_to_the_first_of_two(Arc::clone(&failing) as Arc<dyn BlockDev>, 64, true);
    let on_device = |dev| rig.on_device(dev, 64);

    // A client's write must make the forgetting of its record's copy
    // durable in the first device's log; the log cannot be written, so the
    // device is retired, with no failed batch or read to say copies went.
    let whole = 0..TWO_DEV_BYTES;
    failing.set_plan(FaultPlan { fail_writes: Vec::from([whole]), ..FaultPlan::default() });
    rig.vol.write(5 * RS, &[0x5a; RS as usize], false).unwrap();
    assert!(rig.l2.devices()[0].is_degraded(), "the device whose log failed is out of service");
    assert_eq!(on_device(0), 0);

    rig.cycle();
    assert!(rig.all_in_ram());
    assert_eq!(on_device(1), 64, "every record in RAM is on the device left, not only the one written");
}

/// An L2 device that, once armed, holds the next large write (a feed
/// batch) until released, and fails every smaller write (log blocks,
/// headers) while it holds it: a batch under way while its device fails
/// and is retired.
struct GateDev {
    inner: MemDev,
    armed: AtomicBool,
    entered: AtomicBool,
    released: AtomicBool,
}

impl GateDev {
    fn wait_for(flag: &AtomicBool, what: &str) {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !flag.load(Relaxed) {
            assert!(std::time::Instant::now() < until, "timed out waiting for {what}");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }
}

impl BlockDev for GateDev {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> blockdev::DevResult<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> blockdev::DevResult<()> {
        if self.armed.load(Relaxed) {
            if buf.len() < 512 << 10 {
                if self.entered.load(Relaxed) && !self.released.load(Relaxed) {
                    return blockdev::injected("gate", offset);
                }
            } else if !self.entered.swap(true, Relaxed) {
                GateDev::wait_for(&self.released, "the gate's release");
            }
        }
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> blockdev::DevResult<()> {
        self.inner.flush()
    }
    fn describe(&self) -> String {
        "gate".into()
    }
}

#[test]
fn a_batch_under_way_when_its_device_is_retired_is_not_indexed_there() {
    let gate = Arc::new(GateDev {
        inner: MemDev::new(TWO_DEV_BYTES),
        armed: AtomicBool::new(false),
        entered: AtomicBool::new(false),
        released: AtomicBool::new(false),
    });
    let rig = fed_to_the_first_of_two(Arc::clone(&gate) as Arc<dyn BlockDev>, 104, true);

    // 40 new records in RAM: the next cycle's batch for the first device.
    rig.vol.write(64 * RS, &vec![0x77; 40 * RS as usize], false).unwrap();
    gate.armed.store(true, Relaxed);
    std::thread::scope(|s| {
        let feeding = s.spawn(|| rig.feed.cycle_once());
        GateDev::wait_for(&gate.entered, "the batch's write");
        // A client's write must have its record's copy forgotten in the
        // first device's log, which fails: the device is retired while the
        // batch is being written to it.
        rig.vol.write(5 * RS, &[0x5a; RS as usize], false).unwrap();
        assert!(rig.l2.devices()[0].is_degraded());
        gate.released.store(true, Relaxed);
        feeding.join().unwrap();
    });
    assert_eq!(rig.on_device(0, 104), 0, "records indexed on a retired device");
}
