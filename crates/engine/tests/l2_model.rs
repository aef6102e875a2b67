//! The engine with an L2 device, against a byte-array model: the ARC is tiny
//! so almost every re-read comes from L2 or the backing store, the L2 is
//! small so its hand wraps over and over, and faults are injected into it.
//! Every read must equal the model.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use arcache_engine::{ArcStats, Cache, CacheConfig, Feed, FeedTunables, Held, Volume, VolumeConfig};
use arcache_l2::{L2Arc, L2Device, HEADER_RESERVED};
use blockdev::{BlockDev, FaultPlan, FaultyDev, MemDev};
use proptest::prelude::*;
use rand::{Rng, SeedableRng};

const DEV: u64 = 2 << 20;

struct Rig {
    cache: Arc<Cache>,
    vol: Arc<Volume>,
    feed: Feed,
    l2dev: Arc<FaultyDev<MemDev>>,
    backing: Arc<MemDev>,
}

fn rig(recordsize: u64, arc_max: u64, l2_mib: u64, compress: bool) -> Rig {
    let backing = Arc::new(MemDev::new(DEV));
    let l2dev = Arc::new(FaultyDev::new(MemDev::new(HEADER_RESERVED + (l2_mib << 20)), 9));
    let l2 =
        L2Arc::new(vec![L2Device::new("l2".into(), l2dev.clone() as Arc<dyn BlockDev>).unwrap()]).unwrap();
    let cache = Cache::with_l2(
        CacheConfig { arc_min: arc_max / 2, arc_max, min_prefetch_ms: 1000, compress },
        Some(Arc::new(l2)),
    );
    let tun = Arc::new(FeedTunables::default());
    tun.dwpd_limit.store(0, Relaxed);
    let feed = Feed::new(Arc::clone(&cache), tun, Arc::new(AtomicU64::new(arc_max))).unwrap();
    let vol = Volume::new(
        0,
        VolumeConfig { name: "t".into(), recordsize, read_only: false },
        backing.clone(),
        Arc::clone(&cache),
    );
    Rig { cache, vol, feed, l2dev, backing }
}

/// Noise with runs of zeroes, so some records compress and some do not.
fn payload(seed: u8, len: usize) -> Vec<u8> {
    let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ u64::from(seed);
    (0..len)
        .map(|i| {
            arc_policy::xorshift(&mut x);
            if (i / 2000) % 4 == 0 {
                0
            } else {
                x as u8
            }
        })
        .collect()
}

#[derive(Debug, Clone)]
enum Op {
    Read(u64, u64),
    /// A read answered with the records themselves (`read_held`), aligned
    /// to whole records when the flag says so.
    ReadHeld(u64, u64, bool),
    Write(u64, u64, u8),
    Zero(u64, u64),
    Feed,
    Faults(u8),
}

fn op() -> impl Strategy<Value = Op> {
    let range = (0..DEV, 1u64..70_000).prop_map(|(o, l)| (o, l.min(DEV - o)));
    prop_oneof![
        6 => range.clone().prop_map(|(o, l)| Op::Read(o, l)),
        3 => (range.clone(), any::<bool>()).prop_map(|((o, l), a)| Op::ReadHeld(o, l, a)),
        3 => (range.clone(), any::<u8>()).prop_map(|((o, l), b)| Op::Write(o, l, b)),
        1 => range.prop_map(|(o, l)| Op::Zero(o, l)),
        4 => Just(Op::Feed),
        1 => (0u8..4).prop_map(Op::Faults),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn reads_match_the_model_with_l2_and_faults(ops in prop::collection::vec(op(), 1..250), rs in 12u32..15) {
        let r = rig(1 << rs, 96 << 10, 4, true);
        let mut model = vec![0u8; DEV as usize];
        // The records of the last held read and the bytes they had: no
        // write may change them while they are held.
        let mut kept: Option<(Vec<Held>, Vec<u8>)> = None;
        for op in ops {
            match op {
                Op::Read(o, l) => {
                    let mut b = vec![0u8; l as usize];
                    r.vol.read(o, &mut b).unwrap();
                    prop_assert!(b == model[o as usize..(o + l) as usize], "read {}+{}", o, l);
                }
                Op::ReadHeld(o, l, aligned) => {
                    let rsz = 1u64 << rs;
                    let (o, l) = if aligned { (o / rsz * rsz, l.div_ceil(rsz) * rsz) } else { (o, l) };
                    let l = l.min(DEV - o);
                    let whole = o % rsz == 0 && (l % rsz == 0 || o + l == DEV) && l > 0;
                    match r.vol.read_held(o, l as usize).unwrap() {
                        Some(held) => {
                            prop_assert!(whole, "held a read of part of a record: {}+{}", o, l);
                            let b = held_bytes(&held);
                            prop_assert!(b == model[o as usize..(o + l) as usize], "held read {}+{}", o, l);
                            kept = Some((held, b));
                        }
                        None => prop_assert!(!whole, "declined a read of whole records: {}+{}", o, l),
                    }
                }
                Op::Write(o, l, s) => {
                    let d = payload(s, l as usize);
                    r.vol.write(o, &d, false).unwrap();
                    model[o as usize..(o + l) as usize].copy_from_slice(&d);
                }
                Op::Zero(o, l) => {
                    r.vol.write_zeroes(o, l, false).unwrap();
                    model[o as usize..(o + l) as usize].fill(0);
                }
                Op::Feed => {
                    r.feed.cycle_once();
                }
                Op::Faults(k) => r.l2dev.set_plan(match k {
                    0 => FaultPlan::default(),
                    1 => FaultPlan { flip_bit_probability: 0.3, ..Default::default() },
                    2 => FaultPlan { fail_reads: std::iter::once(HEADER_RESERVED..HEADER_RESERVED + (1 << 20)).collect(), ..Default::default() },
                    _ => FaultPlan { fail_writes: std::iter::once(0..u64::MAX).collect(), ..Default::default() },
                }),
            }
            if let Err(e) = r.cache.validate() {
                return Err(TestCaseError::fail(e));
            }
            if let Some((held, bytes)) = &kept {
                prop_assert!(&held_bytes(held) == bytes, "a held record changed under its reader");
            }
        }
        prop_assert!(r.backing.snapshot() == model);
    }
}

fn held_bytes(held: &[Held]) -> Vec<u8> {
    held.iter().flat_map(Held::as_slice).copied().collect()
}

/// The real feed thread, three clients on disjoint regions (each checks its
/// own model), a 4 MiB L2 that wraps many times, and bit flips on L2.
#[test]
fn concurrent_clients_while_the_feed_wraps_the_device() {
    let r = rig(4096, 256 << 10, 4, true);
    let stats = r.feed.stats.clone();
    r.feed.tunables.feed_min_ms.store(10, Relaxed);
    r.feed.tunables.write_boost.store(0, Relaxed);
    let stop = Arc::new(AtomicBool::new(false));
    let cache = Arc::clone(&r.cache);
    let feeder = r.feed.spawn(Arc::clone(&stop));
    r.l2dev.set_plan(FaultPlan { flip_bit_probability: 0.02, ..Default::default() });
    let region = DEV / 3 / 4096 * 4096;
    std::thread::scope(|s| {
        for t in 0..3u64 {
            let vol = Arc::clone(&r.vol);
            s.spawn(move || {
                let base = t * region;
                let mut model = vec![0u8; region as usize];
                let mut rng = rand::rngs::StdRng::seed_from_u64(t);
                let until = std::time::Instant::now() + std::time::Duration::from_secs(3);
                for i in 0.. {
                    if std::time::Instant::now() > until {
                        break;
                    }
                    let o = rng.gen_range(0..region - 9000);
                    let l = rng.gen_range(1..9000);
                    if i % 4 == 0 {
                        let d = payload((i as u8).wrapping_add(t as u8), l as usize);
                        vol.write(base + o, &d, false).unwrap();
                        model[o as usize..(o + l) as usize].copy_from_slice(&d);
                    } else {
                        let mut b = vec![0u8; l as usize];
                        vol.read(base + o, &mut b).unwrap();
                        assert!(b == model[o as usize..(o + l) as usize], "thread {t} op {i}: read {o}+{l}");
                    }
                }
            });
        }
    });
    stop.store(true, Relaxed);
    feeder.join().unwrap();
    let st = cache.stats();
    assert!(st.l2_hits > 1000, "L2 served reads: {st:?}");
    assert!(st.l2_write_bytes > 16 << 20, "the 4 MiB device wrapped several times: {}", st.l2_write_bytes);
    assert!(st.l2_cksum_bad > 0, "flipped bits were caught");
    assert!(stats.cycles.load(Relaxed) > 10);
    cache.validate().unwrap();
}

/// What each feed rule lets onto L2: `l2arc_mfuonly`, `l2arc_noprefetch`,
/// and `l2arc_trim_ahead` issuing trims beyond the batch.
#[test]
fn feed_rules_decide_what_reaches_l2() {
    use blockdev::CountingDev;
    let backing: Arc<dyn BlockDev> = Arc::new(MemDev::new(DEV));
    let l2dev = Arc::new(CountingDev::new(MemDev::new(HEADER_RESERVED + (8 << 20))));
    let l2 =
        L2Arc::new(vec![L2Device::new("l2".into(), l2dev.clone() as Arc<dyn BlockDev>).unwrap()]).unwrap();
    // OpenZFS's rule, whose hit moves a record to MFU at once: what
    // `l2arc_mfuonly` means is clearest there. Under arc-adaptive a re-used
    // record reaches MFU only at MRU's eviction end (lazy promotion).
    let cache = Cache::with_policy(
        CacheConfig { arc_min: 1 << 20, arc_max: 4 << 20, min_prefetch_ms: 1000, compress: false },
        Some(Arc::new(l2)),
        "arc",
    )
    .unwrap();
    let tun = Arc::new(FeedTunables::default());
    tun.dwpd_limit.store(0, Relaxed);
    let feed = Feed::new(Arc::clone(&cache), Arc::clone(&tun), Arc::new(AtomicU64::new(4 << 20))).unwrap();
    let vol = Volume::new(
        0,
        VolumeConfig { name: "t".into(), recordsize: 4096, read_only: false },
        backing,
        Arc::clone(&cache),
    );
    let l2 = cache.l2().unwrap();
    let mut b = vec![0u8; 4096];
    // Record 1: read twice, 100 ms apart: MFU. Record 2: read once: MRU.
    // Record 3: brought in by NBD CACHE: a prefetch.
    vol.read(4096, &mut b).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(100));
    vol.read(4096, &mut b).unwrap();
    vol.read(2 * 4096, &mut b).unwrap();
    vol.prefetch(3 * 4096, 4096).unwrap();

    tun.mfuonly.store(true, Relaxed);
    tun.noprefetch.store(1, Relaxed);
    feed.cycle_once();
    assert!(l2.contains(1) && !l2.contains(2) && !l2.contains(3), "mfuonly: only the MFU record");

    tun.mfuonly.store(false, Relaxed);
    feed.cycle_once();
    assert!(l2.contains(2) && !l2.contains(3), "noprefetch=1: demand records, not the prefetch");

    tun.noprefetch.store(0, Relaxed);
    let trims_before = l2dev.counts().trims;
    tun.trim_ahead.store(10, Relaxed);
    feed.cycle_once();
    assert!(l2.contains(3), "noprefetch=0: prefetched records too");
    assert!(l2dev.counts().trims > trims_before, "trim_ahead trims beyond the batch");
}

/// Under the default policy's fill variant MFU also takes in records read
/// once; `l2arc_mfuonly` feeds none of them until one is read again.
#[test]
fn mfuonly_feeds_a_filled_record_only_once_it_is_read_again() {
    let backing: Arc<dyn BlockDev> = Arc::new(MemDev::new(DEV));
    let l2dev = MemDev::new(HEADER_RESERVED + (8 << 20));
    let l2 =
        L2Arc::new(vec![L2Device::new("l2".into(), Arc::new(l2dev) as Arc<dyn BlockDev>).unwrap()]).unwrap();
    let arc = 1u64 << 20;
    let mut policy = arc_policy::AdaptiveArc::filling(arc_policy::ZfsArcConfig::fixed(arc));
    arc_policy::Policy::set_min_prefetch_ns(&mut policy, 1_000_000_000);
    let cache = Cache::with_policy_instance(
        CacheConfig { arc_min: arc, arc_max: arc, min_prefetch_ms: 1000, compress: false },
        Some(Arc::new(l2)),
        Box::new(policy),
    );
    let tun = Arc::new(FeedTunables::default());
    tun.dwpd_limit.store(0, Relaxed);
    tun.mfuonly.store(true, Relaxed);
    let feed = Feed::new(Arc::clone(&cache), Arc::clone(&tun), Arc::new(AtomicU64::new(arc))).unwrap();
    let vol = Volume::new(
        0,
        VolumeConfig { name: "t".into(), recordsize: 4096, read_only: false },
        backing,
        Arc::clone(&cache),
    );
    let l2 = cache.l2().unwrap();
    let records = DEV / 4096;
    // Twice the cache, each record once, in an order no stream detector
    // takes for a stream: what leaves MRU first fills MFU's room.
    let order: Vec<u64> = (0..records).map(|i| (i * 97) % records).collect();
    let mut b = vec![0u8; 4096];
    for &r in &order {
        vol.read(r * 4096, &mut b).unwrap();
    }
    let st = cache.stats();
    assert!(st.mfu_size > arc / 2, "the fill did not move records into MFU: {st:?}");
    feed.cycle_once();
    let fed: Vec<u64> = (0..records).filter(|&r| l2.contains(r)).collect();
    assert!(fed.is_empty(), "mfuonly fed records read once: {fed:?}");
    // The first record read left MRU first: it is in MFU. Read again, long
    // enough after its first read to count as re-use, it is fed.
    std::thread::sleep(std::time::Duration::from_millis(100));
    let hits = cache.stats().hits;
    vol.read(order[0] * 4096, &mut b).unwrap();
    assert_eq!(cache.stats().hits, hits + 1, "the first record read is no longer cached");
    feed.cycle_once();
    let fed: Vec<u64> = (0..records).filter(|&r| l2.contains(r)).collect();
    assert_eq!(fed, vec![order[0]], "mfuonly: only the record read again");
}

/// A backing store whose reads of one offset wait, once armed, until
/// released: holds a prefetch in flight while a demand read arrives.
struct HeldRead {
    inner: MemDev,
    held: AtomicU64,
    entered: AtomicBool,
    released: AtomicBool,
}

impl BlockDev for HeldRead {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> blockdev::DevResult<()> {
        if offset == self.held.load(Relaxed) {
            self.entered.store(true, Relaxed);
            HeldRead::wait_for(&self.released);
        }
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> blockdev::DevResult<()> {
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> blockdev::DevResult<()> {
        self.inner.flush()
    }
    fn describe(&self) -> String {
        "held".into()
    }
}

impl HeldRead {
    fn wait_for(flag: &AtomicBool) {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !flag.load(Relaxed) {
            assert!(std::time::Instant::now() < until, "timed out");
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    fn new() -> Arc<HeldRead> {
        Arc::new(HeldRead {
            inner: MemDev::new(DEV),
            held: AtomicU64::new(u64::MAX),
            entered: AtomicBool::new(false),
            released: AtomicBool::new(false),
        })
    }

    /// For a few records far apart (zfetch sees no stream): `first(r)` is
    /// held in its backing read of record `r` while `second(r)` starts,
    /// for longer than the 62.5 ms a re-use must wait; then both end.
    /// `joined(r, before, after)` checks the stats of each round where the
    /// second read was a demand iohit. Returns how many rounds were: a few
    /// tries, in case the second was not yet waiting when the first ended.
    fn race(
        &self,
        cache: &Cache,
        first: &(dyn Fn(u64) + Sync),
        second: &(dyn Fn(u64) + Sync),
        mut joined: impl FnMut(u64, &ArcStats, &ArcStats),
    ) -> usize {
        let mut rounds = 0;
        for r in (16u64..).step_by(64).take(5) {
            let before = cache.stats();
            self.entered.store(false, Relaxed);
            self.released.store(false, Relaxed);
            self.held.store(r * 4096, Relaxed);
            std::thread::scope(|s| {
                s.spawn(|| first(r));
                HeldRead::wait_for(&self.entered);
                s.spawn(|| second(r));
                std::thread::sleep(std::time::Duration::from_millis(100));
                self.released.store(true, Relaxed);
            });
            let after = cache.stats();
            if after.demand_data_iohits == before.demand_data_iohits + 1 {
                rounds += 1;
                joined(r, &before, &after);
            }
        }
        rounds
    }
}

fn demand_read(vol: &Volume, r: u64) {
    let mut b = vec![0u8; 4096];
    vol.read(r * 4096, &mut b).unwrap();
}

/// A demand read that arrives while a prefetch of its record is in flight
/// (an iohit) is the demand that prefetch was made for: the record must
/// become a demand record, as after a hit, or `l2arc_noprefetch=1` never
/// feeds a record a stream's reads waited for (CI saw the feed-rules test
/// fail this way when zfetch raced its reads).
#[test]
fn a_demand_read_joining_a_prefetch_makes_a_demand_record() {
    let held = HeldRead::new();
    let l2dev = Arc::new(MemDev::new(HEADER_RESERVED + (8 << 20)));
    let l2 = L2Arc::new(vec![L2Device::new("l2".into(), l2dev as Arc<dyn BlockDev>).unwrap()]).unwrap();
    let cache = Cache::with_l2(
        CacheConfig { arc_min: 1 << 20, arc_max: 4 << 20, min_prefetch_ms: 1000, compress: false },
        Some(Arc::new(l2)),
    );
    let tun = Arc::new(FeedTunables::default());
    tun.dwpd_limit.store(0, Relaxed);
    tun.noprefetch.store(1, Relaxed);
    let feed = Feed::new(Arc::clone(&cache), tun, Arc::new(AtomicU64::new(4 << 20))).unwrap();
    let vol = Volume::new(
        0,
        VolumeConfig { name: "t".into(), recordsize: 4096, read_only: false },
        held.clone() as Arc<dyn BlockDev>,
        Arc::clone(&cache),
    );
    let prefetch = |r: u64| vol.prefetch(r * 4096, 4096).unwrap();
    let joined = held.race(&cache, &prefetch, &|r| demand_read(&vol, r), |r, before, after| {
        assert_eq!(
            after.demand_hit_predictive_prefetch,
            before.demand_hit_predictive_prefetch + 1,
            "the join counted as the prefetch's demand"
        );
        assert_eq!(
            after.mru_hits + after.mfu_hits,
            before.mru_hits + before.mfu_hits,
            "an iohit is not a hit of MRU or MFU"
        );
        feed.cycle_once();
        assert!(cache.l2().unwrap().contains(r), "l2arc_noprefetch=1 feeds the joined record");
    });
    assert!(joined > 0, "no demand read reached the prefetch in flight");
}

/// Two demand reads of one record, the second arriving while the first
/// reads it from the backing store: the second joins (an iohit) right after
/// the first inserted the record, and OpenZFS's rule (`arc`: a re-use 62.5
/// ms after the last access moves a record to MFU at once) times re-use
/// from that insert, so the join does not promote the record however long
/// it waited.
#[test]
fn a_demand_read_joining_another_does_not_promote_the_record() {
    let held = HeldRead::new();
    let cache = Cache::with_policy(
        CacheConfig { arc_min: 1 << 20, arc_max: 4 << 20, min_prefetch_ms: 1000, compress: false },
        None,
        "arc",
    )
    .unwrap();
    cache.zfetch.disable.store(true, Relaxed);
    let vol = Volume::new(
        0,
        VolumeConfig { name: "t".into(), recordsize: 4096, read_only: false },
        held.clone() as Arc<dyn BlockDev>,
        Arc::clone(&cache),
    );
    let read = |r: u64| demand_read(&vol, r);
    let joined = held.race(&cache, &read, &read, |_, before, after| {
        assert_eq!(after.mfu_size, before.mfu_size, "the join promoted the record to MFU");
        assert_eq!(after.mru_hits + after.mfu_hits, before.mru_hits + before.mfu_hits);
    });
    assert!(joined > 0, "no demand read reached the other in flight");
}

/// The feed stops when L2 headers would take more than
/// `l2arc_meta_percent` of the ARC target, and says so.
#[test]
fn feed_pauses_when_l2_headers_exceed_their_share() {
    let r = rig(4096, 64 << 10, 4, false);
    let mut b = vec![0u8; 64 << 10];
    r.vol.read(0, &mut b).unwrap();
    r.feed.cycle_once();
    let fed = r.cache.stats().l2_records;
    assert!(fed > 0);
    // 1 % of a 64 KiB target is 655 bytes: less than the index already holds.
    r.feed.tunables.meta_percent.store(1, Relaxed);
    r.vol.read(1 << 20, &mut b).unwrap();
    r.feed.cycle_once();
    let st = r.cache.stats();
    assert_eq!(st.l2_records, fed, "nothing more fed");
    assert!(st.l2_abort_lowmem > 0);
}

/// `l2arc_dwpd_limit`: once a device has wrapped (and L2 is at least twice
/// arc_max), one drive write per day on a 4 MiB device is ~50 bytes a
/// second, so the feed all but stops; with the bound off it keeps writing.
#[test]
fn wear_bound_slows_the_feed_after_the_first_pass() {
    let fed_after_wrap = |dwpd: u64| -> u64 {
        let r = rig(4096, 256 << 10, 4, false);
        r.feed.tunables.dwpd_limit.store(dwpd, Relaxed);
        r.feed.tunables.feed_min_ms.store(10, Relaxed);
        let stop = Arc::new(AtomicBool::new(false));
        let cache = Arc::clone(&r.cache);
        let feeder = r.feed.spawn(Arc::clone(&stop));
        // Writes make new contents that must be fed again, so the 4 MiB
        // device fills and wraps although the export is only 2 MiB.
        let mut off = 0u64;
        let mut round = 0u8;
        let mut write_some = |n: usize| {
            for _ in 0..n {
                round = round.wrapping_add(1);
                r.vol.write(off, &payload(round, 64 << 10), false).unwrap();
                off = (off + (64 << 10)) % (DEV - (64 << 10));
                std::thread::sleep(std::time::Duration::from_micros(300));
            }
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while !cache.stats().l2_devices[0].wrapped {
            assert!(std::time::Instant::now() < deadline, "the device never wrapped");
            write_some(16);
        }
        write_some(50); // let a batch in flight finish
        let before = cache.stats().l2_write_bytes;
        write_some(1500);
        let fed = cache.stats().l2_write_bytes - before;
        stop.store(true, Relaxed);
        feeder.join().unwrap();
        fed
    };
    let bounded = fed_after_wrap(100);
    let free = fed_after_wrap(0);
    assert!(bounded <= 64 << 10, "with 1 DWPD the feed nearly stops: {bounded} bytes");
    assert!(free > 1 << 20, "without the bound it keeps feeding: {free} bytes");
}
