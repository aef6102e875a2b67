//! The write-back the server always runs: its txg sync thread and commit
//! thread started, FLUSHes queued with the commit thread and FUA commits run
//! by the writer, an ARC smaller than the volume so reads also lay dirty
//! pages over the backing store's bytes, and an L2 fed while records are
//! written.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering::SeqCst};
use std::sync::Arc;

use arcache_engine::{
    replay_log, Batch, Cache, CacheConfig, CommitDone, Feed, FeedTunables, Volume, VolumeConfig, WriteBack,
    WriteTunables,
};
use arcache_l2::{L2Arc, L2Device, HEADER_RESERVED};
use blockdev::{BlockDev, CrashDev, MemDev};
use shuttle::sync::{mpsc, Mutex};
use shuttle::thread;
use zil::{IntentLog, LogExport};

use crate::common::{content, device, explore, overlap, read_record, Clock, Reached, Yielding};

/// Small records (four 4 KiB pages) where no L2 is involved, so a
/// schedule is cheap; an L2 device holds at least 4 MiB and its rig needs
/// records it can hold a few of.
const RS: u64 = 16 << 10;
const L2_RS: u64 = 1 << 20;
const RECORDS: u64 = 4;

struct Rig {
    vol: Arc<Volume>,
    wb: Arc<WriteBack>,
    cache: Arc<Cache>,
    backing: Arc<CrashDev>,
    log: Arc<CrashDev>,
    feed: Option<Feed>,
    rs: u64,
    arc_records: u64,
}

fn export(rs: u64) -> LogExport {
    LogExport { id: 0, name: "t".into(), identity: 7, size: RECORDS * rs }
}

fn tunables() -> Arc<WriteTunables> {
    let t = WriteTunables::default();
    // Two writers per txg: enough to interleave, few enough to explore.
    t.sync_writers.store(2, SeqCst);
    Arc::new(t)
}

fn cache(rs: u64, arc_records: u64, l2: Option<Arc<L2Arc>>) -> Arc<Cache> {
    let cfg = CacheConfig { arc_min: rs, arc_max: arc_records * rs, min_prefetch_ms: 0, compress: false };
    let cache = Cache::with_l2(cfg, l2);
    // Prefetch runs on a pool of real threads, outside shuttle's control.
    cache.zfetch.disable.store(true, SeqCst);
    cache
}

fn volume(dev: Arc<dyn BlockDev>, cache: &Arc<Cache>, wb: &Arc<WriteBack>, rs: u64) -> Arc<Volume> {
    let cfg = VolumeConfig { name: "t".into(), recordsize: rs, read_only: false };
    Volume::with_writeback(0, cfg, dev, Arc::clone(cache), Arc::clone(wb))
}

/// Version 0 of every record on the backing store, an ARC of
/// `arc_records` records, an intent log when `with_log`, and with `l2` an
/// L2 of four records and its feed.
fn rig(rs: u64, arc_records: u64, with_log: bool, with_l2: bool) -> Rig {
    let backing = Arc::new(CrashDev::new(RECORDS * rs));
    for r in 0..RECORDS {
        backing.write_at(&content(r, 0, rs), r * rs).expect("memory takes writes");
    }
    backing.flush().expect("memory flushes");
    let log = Arc::new(CrashDev::new(1 << 20));
    let l2 = with_l2.then(|| {
        let dev = L2Device::new("l2".into(), device(HEADER_RESERVED + 4 * rs)).expect("an L2 device");
        Arc::new(L2Arc::new(vec![dev]).expect("an L2"))
    });
    let log_dev: Arc<dyn BlockDev> = Arc::new(Yielding(Arc::clone(&log) as Arc<dyn BlockDev>));
    let intent =
        with_log.then(|| Arc::new(IntentLog::open(log_dev, vec![export(rs)]).expect("a fresh log opens")));
    let wb = WriteBack::new(intent, l2.clone(), tunables());
    let cache = cache(rs, arc_records, l2);
    let vol = volume(Arc::new(Yielding(Arc::clone(&backing) as Arc<dyn BlockDev>)), &cache, &wb, rs);
    // As the server: the txg sync thread runs from the start.
    wb.spawn();
    let feed = with_l2.then(|| {
        let tun = Arc::new(FeedTunables::default());
        tun.dwpd_limit.store(0, SeqCst);
        let arc_max = Arc::new(std::sync::atomic::AtomicU64::new(arc_records * rs));
        Feed::new(Arc::clone(&cache), tun, arc_max).expect("an L2 device is there")
    });
    Rig { vol, wb, cache, backing, log, feed, rs, arc_records }
}

impl Rig {
    fn read(&self, r: u64) -> u8 {
        let (got, version) = read_record(&self.vol, r, self.rs);
        assert_eq!(got, r, "record {r} read back record {got}'s bytes");
        version
    }

    fn write(&self, r: u64, version: u8) {
        self.vol.write(r * self.rs, &content(r, version, self.rs), false).expect("writes succeed");
    }

    /// Pushes every record out of the ARC without reading any (reads
    /// would hit L2 and blur which thread did).
    fn evict_all(&self) {
        self.cache.set_limits(0, 0);
        self.cache.set_limits(self.rs, self.arc_records * self.rs);
    }

    /// Record `r`'s version on the backing store itself.
    fn on_backing(&self, r: u64) -> u8 {
        let mut buf = vec![0u8; self.rs as usize];
        self.backing.read_at(&mut buf, r * self.rs).expect("memory reads");
        buf[8]
    }

    fn stop(&self) {
        self.wb.shutdown().expect("everything dirty syncs at stop");
    }

    /// Once the threads are done: record 0 reads as `version` from the
    /// ARC and again from below it (L2, dirty pages, backing store).
    fn ends_with(&self, version: u8) {
        assert_eq!(self.read(0), version, "the last acknowledged write is what stays");
        self.evict_all();
        assert_eq!(self.read(0), version, "the last acknowledged write, read again from below the ARC");
        self.stop();
    }
}

/// Record `r`'s version after a power cut that kept only what was flushed:
/// the log replayed over the backing store, as at the server's start.
fn recovered(backing: Vec<u8>, log: Vec<u8>, r: u64) -> u8 {
    let log = IntentLog::open(Arc::new(MemDev::from_bytes(log)), vec![export(RS)]).expect("the log opens");
    let wb = WriteBack::new(Some(Arc::new(log)), None, tunables());
    let cache = cache(RS, 2, None);
    let vol = volume(Arc::new(MemDev::from_bytes(backing)), &cache, &wb, RS);
    replay_log(&wb, &[(export(RS), Arc::clone(&vol))]).expect("the log replays");
    read_record(&vol, r, RS).1
}

/// Two writers FLUSH at once, one through the commit thread (an NBD
/// FLUSH), one running the commit itself (a FUA write on a worker). Each
/// write whose FLUSH was answered must survive a power cut at any moment
/// after the answer. Reached: the two FLUSHes overlapped in time.
fn overlapping_flushes(reached: &Reached) {
    let rig = Arc::new(rig(RS, 2, true, false));
    let clock = Arc::new(Clock::default());
    let images = Arc::new(Mutex::new(Vec::new()));
    let flushers: Vec<_> = (0..2u64)
        .map(|r| {
            let (rig, clock, images) = (Arc::clone(&rig), Arc::clone(&clock), Arc::clone(&images));
            thread::spawn(move || {
                rig.write(r, 1);
                let start = clock.now();
                if r == 0 {
                    let (tx, rx) = mpsc::channel();
                    let done: CommitDone = Box::new(move |res, _| {
                        let _ = tx.send(res.is_ok());
                    });
                    assert!(
                        rig.vol.flush_async(done, &mut Batch::new()).is_ok(),
                        "write-back queues FLUSHes"
                    );
                    assert!(rx.recv().expect("the FLUSH is answered"), "the FLUSH failed");
                } else {
                    rig.vol.flush().expect("the commit succeeds");
                }
                let end = clock.now();
                // A power cut now keeps only what the devices flushed.
                let image = (r, rig.backing.image_bytes(|_| false), rig.log.image_bytes(|_| false));
                images.lock().expect("no test thread panicked").push(image);
                (start, end)
            })
        })
        .collect();
    let spans: Vec<(u64, u64)> =
        flushers.into_iter().map(|t| t.join().expect("no thread panicked")).collect();
    reached.run(overlap(spans[0], spans[1]));
    rig.stop();
    for (r, backing, log) in std::mem::take(&mut *images.lock().expect("no test thread panicked")) {
        assert_eq!(
            recovered(backing, log, r),
            1,
            "record {r}: its answered FLUSH did not survive a power cut"
        );
    }
}

#[test]
fn overlapping_flush_commits() {
    explore("overlapping_flush_commits", "two FLUSHes in flight at once", 300, overlapping_flushes);
}

/// Reads of record 0 race writes of it (FLUSHed in place, as without a
/// log), while other reads push it out of the ARC and a txg syncs: a read
/// never returns a version older than one acknowledged before it began,
/// nor a mix of two. Reached: a write was acknowledged during a read.
fn reads_overtaken(reached: &Reached) {
    let rig = Arc::new(rig(RS, 2, false, false));
    let acked = Arc::new(AtomicU8::new(0));
    let overtaken = Arc::new(AtomicBool::new(false));
    let writer = {
        let (rig, acked) = (Arc::clone(&rig), Arc::clone(&acked));
        thread::spawn(move || {
            for v in 1..=2u8 {
                rig.write(0, v);
                acked.store(v, SeqCst);
            }
            rig.vol.flush().expect("the in-place commit succeeds");
        })
    };
    let reader = {
        let (rig, acked, overtaken) = (Arc::clone(&rig), Arc::clone(&acked), Arc::clone(&overtaken));
        thread::spawn(move || {
            for _ in 0..3 {
                let floor = acked.load(SeqCst);
                let v = rig.read(0);
                assert!(v >= floor, "stale read: version {v} after version {floor} was acknowledged");
                if acked.load(SeqCst) > floor {
                    overtaken.store(true, SeqCst);
                }
            }
        })
    };
    let churn = {
        let rig = Arc::clone(&rig);
        thread::spawn(move || {
            for r in 1..RECORDS {
                assert_eq!(rig.read(r), 0, "record {r} was never written");
            }
            rig.wb.sync_now().expect("the txg syncs");
        })
    };
    for t in [writer, reader, churn] {
        t.join().expect("no thread panicked");
    }
    reached.run(overtaken.load(SeqCst));
    rig.ends_with(2);
}

#[test]
fn a_read_overtaken_by_a_write() {
    explore("a_read_overtaken_by_a_write", "a write acknowledged during a read", 300, reads_overtaken);
}

/// A txg holding version 1 of record 0 syncs while versions 2 and 3 are
/// written and other reads push record 0 out of the ARC: no read goes
/// back to a version once a newer one was acknowledged or seen, and the
/// backing store ends with version 3, not the older synced copy.
/// Reached: a write ran while a txg was being written.
fn sync_racing_writes(reached: &Reached) {
    let rig = Arc::new(rig(RS, 2, false, false));
    rig.write(0, 1);
    let acked = Arc::new(AtomicU8::new(1));
    let raced = Arc::new(AtomicBool::new(false));
    let syncer = {
        let rig = Arc::clone(&rig);
        thread::spawn(move || rig.wb.sync_now().expect("the txg syncs"))
    };
    let writer = {
        let (rig, acked, raced) = (Arc::clone(&rig), Arc::clone(&acked), Arc::clone(&raced));
        thread::spawn(move || {
            for v in 2..=3u8 {
                let before = rig.wb.view().txg_syncing != 0;
                rig.write(0, v);
                if before || rig.wb.view().txg_syncing != 0 {
                    raced.store(true, SeqCst);
                }
                acked.store(v, SeqCst);
            }
        })
    };
    let reader = {
        let (rig, acked) = (Arc::clone(&rig), Arc::clone(&acked));
        thread::spawn(move || {
            let mut seen = 0;
            for _ in 0..2 {
                let floor = acked.load(SeqCst).max(seen);
                seen = rig.read(0);
                assert!(seen >= floor, "version {seen} came back after version {floor}");
            }
        })
    };
    let churn = {
        let rig = Arc::clone(&rig);
        thread::spawn(move || {
            for r in 1..RECORDS {
                assert_eq!(rig.read(r), 0, "record {r} was never written");
            }
        })
    };
    for t in [syncer, writer, reader, churn] {
        t.join().expect("no thread panicked");
    }
    reached.run(raced.load(SeqCst));
    rig.wb.sync_now().expect("the last txg syncs");
    assert_eq!(rig.on_backing(0), 3, "an older synced copy overwrote the newest write");
    rig.ends_with(3);
}

#[test]
fn a_txg_sync_racing_a_new_write() {
    explore(
        "a_txg_sync_racing_a_new_write",
        "a write while a txg was being written",
        300,
        sync_racing_writes,
    );
}

/// Record 0 lives only on L2 when a reader asks for it and a writer
/// overwrites it, while the feed runs, the ARC is emptied and txgs sync:
/// no read returns a version older than one acknowledged before it began,
/// and after everything the newest version is what is read, from L2 or
/// the backing store. Reached: a write began while a read of the record
/// was being served from L2.
fn l2_copy_overwritten(reached: &Reached) {
    let rig = Arc::new(rig(L2_RS, 3, false, true));
    let feed = || rig.feed.as_ref().expect("the rig has a feed");
    assert_eq!(rig.read(0), 0);
    feed().cycle_once();
    rig.evict_all();
    let clock = Arc::new(Clock::default());
    let acked = Arc::new(AtomicU8::new(0));
    let writer = {
        let (rig, acked, clock) = (Arc::clone(&rig), Arc::clone(&acked), Arc::clone(&clock));
        thread::spawn(move || {
            let mut spans = Vec::new();
            for v in 1..=2u8 {
                let start = clock.now();
                rig.write(0, v);
                spans.push((start, clock.now()));
                acked.store(v, SeqCst);
            }
            spans
        })
    };
    let reader = {
        let (rig, acked, clock) = (Arc::clone(&rig), Arc::clone(&acked), Arc::clone(&clock));
        thread::spawn(move || {
            let mut from_l2 = Vec::new();
            for _ in 0..2 {
                let floor = acked.load(SeqCst);
                let (hits, start) = (rig.cache.stats().l2_hits, clock.now());
                let v = rig.read(0);
                assert!(v >= floor, "stale read: version {v} after version {floor} was acknowledged");
                // Only this thread reads: an L2 hit meanwhile is this read's.
                if rig.cache.stats().l2_hits > hits {
                    from_l2.push((start, clock.now()));
                }
            }
            from_l2
        })
    };
    let background = {
        let rig = Arc::clone(&rig);
        thread::spawn(move || {
            rig.feed.as_ref().expect("the rig has a feed").cycle_once();
            rig.wb.sync_now().expect("the txg syncs");
            rig.evict_all();
            rig.feed.as_ref().expect("the rig has a feed").cycle_once();
        })
    };
    let writes = writer.join().expect("no thread panicked");
    let l2_reads = reader.join().expect("no thread panicked");
    background.join().expect("no thread panicked");
    reached.run(l2_reads.iter().any(|&r| writes.iter().any(|&w| overlap(r, w))));
    rig.ends_with(2);
}

#[test]
fn an_l2_copy_overwritten_while_read() {
    explore(
        "an_l2_copy_overwritten_while_read",
        "a write of a record being read from L2",
        200,
        l2_copy_overwritten,
    );
}
