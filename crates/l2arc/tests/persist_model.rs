//! Persistence against a model: random feeds, writes (durable
//! invalidations) and reads, with restarts from clean stops, from kill -9
//! (every write issued survives) and from power-cut images (only flushed
//! writes survive, plus any subset of the rest). After every restart, every
//! restored record must read back as its latest contents: never an older
//! version.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use arcache_l2::{
    BlobFlags, ExportDesc, FeedItem, L2Arc, L2Device, L2Miss, PersistOptions, SharedBytes, HEADER_RESERVED,
};
use blockdev::{BlockDev, CrashDev, FaultPlan, FaultyDev};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const REC: usize = 4096;
const RECORDS: u64 = 3000;
const DEV_SIZE: u64 = HEADER_RESERVED + (6 << 20);

fn contents(key: u64, version: u32) -> Vec<u8> {
    let mut v = vec![0u8; REC];
    for (i, c) in v.chunks_mut(16).enumerate() {
        c[..8].copy_from_slice(&key.to_le_bytes());
        c[8..12].copy_from_slice(&version.to_le_bytes());
        c[12..16].copy_from_slice(&(i as u32).to_le_bytes());
    }
    v
}

fn export() -> ExportDesc {
    ExportDesc {
        id: 0,
        name: "e".into(),
        recordsize: REC as u32,
        size: RECORDS * REC as u64,
        identity: 77,
        contents: 77,
    }
}

fn open(dev: Arc<CrashDev>, exports: &[ExportDesc]) -> L2Arc {
    let d = L2Device::new("p".into(), dev as Arc<dyn BlockDev>).unwrap();
    let l2 = L2Arc::open(
        vec![d],
        exports,
        &PersistOptions { rebuild_enabled: true, min_l2size: 0, state_dir: None },
    )
    .unwrap();
    l2.rebuild(u64::MAX, &|_| 0, &AtomicBool::new(false));
    l2
}

struct World {
    dev: Arc<CrashDev>,
    l2: L2Arc,
    version: HashMap<u64, u32>,
    ever_fed: HashSet<u64>,
    rng: StdRng,
    /// Log commits deferred over several batches, as the feed does them.
    lazy: bool,
}

impl World {
    fn new(seed: u64) -> World {
        let dev = Arc::new(CrashDev::new(DEV_SIZE));
        let l2 = open(Arc::clone(&dev), &[export()]);
        World {
            dev,
            l2,
            version: HashMap::new(),
            ever_fed: HashSet::new(),
            rng: StdRng::seed_from_u64(seed),
            lazy: false,
        }
    }

    /// Five batches fed with log commits put off indefinitely.
    fn fed_uncommitted(seed: u64) -> World {
        let mut w = World::new(seed);
        w.l2.set_commit_every(u64::MAX);
        for _ in 0..5 {
            w.feed();
        }
        w
    }

    fn lazy(seed: u64) -> World {
        let mut w = World::new(seed);
        w.lazy = true;
        w.defer_commits();
        w
    }

    fn defer_commits(&mut self) {
        if self.lazy {
            self.l2.set_commit_every(self.rng.gen_range(64 << 10..4 << 20));
        }
    }

    fn v(&self, key: u64) -> u32 {
        self.version.get(&key).copied().unwrap_or(0)
    }

    /// Fed at some point and not on L2 now.
    fn fed(&self, k: u64) -> bool {
        self.l2.lookup(k).is_none() && self.ever_fed.contains(&k)
    }

    fn feed(&mut self) {
        let n = self.rng.gen_range(1..40);
        let start = self.rng.gen_range(0..RECORDS);
        let mut items = Vec::new();
        for k in (start..start + n).map(|k| k % RECORDS) {
            if self.l2.begin_feed(k) {
                self.ever_fed.insert(k);
                let data: SharedBytes = Arc::new(contents(k, self.v(k)));
                items.push(FeedItem { key: k, data, flags: BlobFlags::default() });
            }
        }
        if !items.is_empty() {
            self.l2.write_batch(0, items, 0, false).unwrap();
        }
        if self.lazy && self.rng.gen_bool(0.1) {
            self.l2.commit_pending();
        }
    }

    fn write(&mut self) {
        // Half the time, a record the hand evicted: the case where a copy
        // left the index but its bytes and log entry may still be there.
        let evicted: Vec<u64> = (0..RECORDS).filter(|k| self.fed(*k)).collect();
        let start = if self.rng.gen_bool(0.5) && !evicted.is_empty() {
            evicted[self.rng.gen_range(0..evicted.len())].min(RECORDS - 4)
        } else {
            self.rng.gen_range(0..RECORDS - 4)
        };
        let keys: Vec<u64> = (start..start + self.rng.gen_range(1..4)).collect();
        self.l2.begin_write(&keys);
        for k in &keys {
            *self.version.entry(*k).or_insert(0) += 1;
        }
        self.l2.end_write(&keys);
    }

    /// Every indexed record reads back as its latest version, or not at all.
    fn check(&self, what: &str) -> usize {
        let mut good = 0;
        for k in 0..RECORDS {
            let Some(p) = self.l2.lookup(k) else { continue };
            if let Ok(bytes) = self.l2.read(k, p) {
                let got = u32::from_le_bytes(bytes[8..12].try_into().unwrap());
                assert_eq!(&bytes[..], &contents(k, self.v(k))[..], "{what}: record {k} read version {got}");
                good += 1;
            }
        }
        good
    }

    fn restart(&mut self, image: Vec<u8>) {
        self.dev = Arc::new(CrashDev::from_bytes(image));
        self.l2 = open(Arc::clone(&self.dev), &[export()]);
        self.defer_commits();
    }

    fn step(&mut self) {
        match self.rng.gen_range(0..10) {
            0..=4 => self.feed(),
            5..=8 => self.write(),
            _ => {
                self.check("running");
            }
        }
    }
}

#[test]
fn clean_restart_restores_everything_that_was_indexed() {
    let mut w = World::new(1);
    for _ in 0..400 {
        w.step();
    }
    let before = w.l2.sizes().0;
    assert!(before > 500, "the test should fill the device: {before}");
    w.l2.sync_logs();
    let image = w.dev.image_bytes(|_| true);
    w.restart(image);
    let st = w.l2.persist_stats();
    assert_eq!(w.l2.sizes().0, before, "{st:?}");
    assert_eq!(st.l2_rebuild_bufs, before);
    assert_eq!(st.l2_rebuild_success, 1);
    assert_eq!(w.check("after clean restart"), before as usize);
}

#[test]
fn kill_and_power_cut_never_bring_back_an_old_version() {
    let total_restored = crash_rounds(World::new);
    assert!(total_restored > 10_000, "crashes should still restore most records: {total_restored}");
}

#[test]
fn deferred_log_commits_never_bring_back_an_old_version() {
    let total_restored = crash_rounds(World::lazy);
    assert!(total_restored > 100_000, "crashes should still restore many records: {total_restored}");
}

#[test]
fn batches_after_the_last_commit_are_not_restored_and_a_commit_restores_them() {
    let mut w = World::fed_uncommitted(9);
    let fed = w.l2.sizes().0;
    assert!(fed > 0);
    assert!(w.l2.persist_stats().l2_log_uncommitted_bytes >= fed * REC as u64);
    let killed = Arc::new(CrashDev::from_bytes(w.dev.image_bytes(|_| true)));
    assert_eq!(open(killed, &[export()]).sizes().0, 0, "nothing was committed yet");
    w.l2.commit_pending();
    assert_eq!(w.l2.persist_stats().l2_log_uncommitted_bytes, 0);
    w.restart(w.dev.image_bytes(|_| true));
    assert_eq!(w.l2.sizes().0, fed);
    assert_eq!(w.check("after commit_pending and kill -9"), fed as usize);
}

/// Rounds of random steps, each ended by a clean stop, kill -9 or power
/// cut; every restored record is checked. Returns how many were restored.
fn crash_rounds(world: fn(u64) -> World) -> usize {
    let mut total_restored = 0;
    for seed in 0..60u64 {
        let mut w = world(100 + seed);
        for round in 0..4 {
            let steps = w.rng.gen_range(20..200);
            for _ in 0..steps {
                w.step();
            }
            // 0: clean stop, 1: kill -9, 2: power cut.
            let mode = w.rng.gen_range(0..3);
            let keep_p = w.rng.gen_range(0.0..1.0);
            let mut r = StdRng::seed_from_u64(seed * 31 + round);
            if mode == 0 {
                w.l2.sync_logs();
            }
            let image = if mode == 2 {
                w.dev.image_bytes(|_| r.gen_bool(keep_p))
            } else {
                w.dev.image_bytes(|_| true)
            };
            w.restart(image);
            total_restored += w.check(&format!("seed {seed} round {round} mode {mode}"));
        }
    }
    total_restored
}

#[test]
fn a_changed_backing_store_discards_its_records() {
    let mut w = World::new(7);
    for _ in 0..200 {
        w.feed();
    }
    w.l2.sync_logs();
    let image = w.dev.image_bytes(|_| true);
    let mut moved = export();
    moved.identity = 78;
    let l2 = open(Arc::new(CrashDev::from_bytes(image.clone())), &[moved]);
    assert_eq!(l2.sizes().0, 0);
    assert_eq!(l2.persist_stats().l2_rebuild_discarded_exports, 1);
    // And the discard is durable: the old identity does not come back either.
    let image2 = {
        let dev = Arc::new(CrashDev::from_bytes(image));
        let l2 = open(Arc::clone(&dev), &[ExportDesc { identity: 78, contents: 78, ..export() }]);
        drop(l2);
        dev.image_bytes(|_| true)
    };
    let l2 = open(Arc::new(CrashDev::from_bytes(image2)), &[export()]);
    assert_eq!(l2.sizes().0, 0, "records of the first backing store came back");
}

/// A writer binds its records to what it changed its store to: a start
/// that finds the store so keeps them (after a power cut too: the binding
/// is durable when `rebind_contents` returns), one that finds it as it was
/// before does not, and the checksum seed stays the store's identity. An
/// unbound export is restored by no store at all.
#[test]
fn a_binding_keeps_records_only_for_the_store_it_names_and_is_durable_at_once() {
    let mut w = World::new(8);
    for _ in 0..200 {
        w.feed();
    }
    w.l2.sync_logs();
    let held = w.l2.sizes().0;
    assert!(held > 0);
    w.l2.unbind_contents(0);
    let unbound = w.dev.image_bytes(|_| false);
    w.l2.rebind_contents(0, 90);
    w.l2.rebind_contents(0, 90);
    w.l2.rebind_contents(7, 91);
    assert_eq!(
        w.l2.persist_stats().l2_contents_rebinds,
        2,
        "rewritten unchanged, or an unknown export bound"
    );
    let image = w.dev.image_bytes(|_| false);
    let now = ExportDesc { contents: 90, ..export() };
    let l2 = open(Arc::new(CrashDev::from_bytes(image.clone())), std::slice::from_ref(&now));
    assert_eq!(l2.sizes().0, held, "the records bound to the store as it is now");
    assert_eq!(l2.persist_stats().l2_rebuild_discarded_exports, 0);
    w.l2 = l2;
    assert_eq!(w.check("rebound"), held as usize, "a restored record failed its checksum");
    for (img, desc) in [
        (&image, export()),
        (&image, ExportDesc { identity: 78, ..now.clone() }),
        (&unbound, export()),
        (&unbound, now),
    ] {
        let l2 = open(Arc::new(CrashDev::from_bytes(img.clone())), std::slice::from_ref(&desc));
        assert_eq!(l2.sizes().0, 0, "restored for {desc:?}");
        assert_eq!(l2.persist_stats().l2_rebuild_discarded_exports, 1);
    }
}

fn flip(image: &mut [u8], at: u64) {
    image[at as usize] ^= 0x40;
}

#[test]
fn damaged_headers_and_log_blocks_stop_the_rebuild_safely() {
    let mut w = World::new(9);
    for _ in 0..300 {
        w.feed();
    }
    w.l2.sync_logs();
    let full = w.l2.sizes().0;
    let image = w.dev.image_bytes(|_| true);

    // One header copy damaged: the other one serves, everything comes back
    // (perhaps minus the last commit if the newer copy was the damaged one).
    for copy in [0u64, 4096] {
        let mut img = image.clone();
        flip(&mut img, copy + 100);
        let l2 = open(Arc::new(CrashDev::from_bytes(img)), &[export()]);
        assert!(l2.sizes().0 > full / 2, "copy {copy}: {} of {full}", l2.sizes().0);
    }
    // Both copies damaged: empty, counted.
    let mut img = image.clone();
    flip(&mut img, 100);
    flip(&mut img, 4096 + 100);
    let l2 = open(Arc::new(CrashDev::from_bytes(img)), &[export()]);
    assert_eq!(l2.sizes().0, 0);
    assert_eq!(l2.persist_stats().l2_rebuild_dh_errors, 1);

    // A flipped bit in the newest log block: nothing restored past it.
    let hdr = match arcache_l2::read_header(
        &L2Device::new("x".into(), w.dev.clone() as Arc<dyn BlockDev>).unwrap(),
    ) {
        arcache_l2::HeaderRead::Valid(h) => h,
        _ => panic!("no header"),
    };
    let newest = hdr.newest[0];
    let mut img = image.clone();
    flip(&mut img, hdr.start + newest.lpos % hdr.capacity + 200);
    let l2 = open(Arc::new(CrashDev::from_bytes(img)), &[export()]);
    assert_eq!(l2.sizes().0, 0);
    assert_eq!(l2.persist_stats().l2_rebuild_cksum_lb_errors, 1);

    // A truncated device: another geometry, so nothing is trusted.
    let img = image[..image.len() - (1 << 20)].to_vec();
    let l2 = open(Arc::new(CrashDev::from_bytes(img)), &[export()]);
    assert_eq!(l2.sizes().0, 0);
    assert_eq!(l2.persist_stats().l2_rebuild_unsupported, 1);
}

/// Stops `w` cleanly and opens its image again, the rebuild not yet run.
fn stopped_and_reopened(w: &World) -> (Arc<CrashDev>, L2Arc) {
    w.l2.sync_logs();
    let dev = Arc::new(CrashDev::from_bytes(w.dev.image_bytes(|_| true)));
    let d = L2Device::new("p".into(), dev.clone() as Arc<dyn BlockDev>).unwrap();
    let l2 = L2Arc::open(
        vec![d],
        &[export()],
        &PersistOptions { rebuild_enabled: true, min_l2size: 0, state_dir: None },
    )
    .unwrap();
    (dev, l2)
}

#[test]
fn writes_during_a_rebuild_are_never_undone_by_it() {
    let mut w = World::new(11);
    for _ in 0..300 {
        w.feed();
    }
    let (dev, l2) = stopped_and_reopened(&w);
    assert!(l2.is_rebuilding());
    // Writes before the rebuild reads the log: they must win.
    let written: Vec<u64> = (0..RECORDS).step_by(7).collect();
    l2.begin_write(&written);
    for k in &written {
        *w.version.entry(*k).or_insert(0) += 1;
    }
    l2.end_write(&written);
    l2.rebuild(u64::MAX, &|_| 0, &AtomicBool::new(false));
    for k in &written {
        assert!(l2.lookup(*k).is_none(), "record {k} restored over a newer write");
    }
    w.l2 = l2;
    w.check("after rebuild");
    // And after another restart, still not.
    let image = dev.image_bytes(|_| true);
    w.restart(image);
    for k in &written {
        assert!(w.l2.lookup(*k).is_none(), "record {k} came back after a second restart");
    }
    w.check("second restart");
}

/// Writes and bare invalidations while the rebuild is half way through the
/// log (made from its per-block callback), of records it restored and of
/// records it has not reached yet: none may come back from an older block,
/// nor in a later restart. The rebuild keeps only the records it
/// did not restore in its own set and reads "restored" off the index, so
/// this is what guards that every removal during a rebuild is remembered.
#[test]
fn writes_midway_through_a_rebuild_are_never_undone_by_older_blocks() {
    let mut w = World::new(17);
    for round in 0..400 {
        // Feeds and writes mixed, so records have copies in several blocks.
        if round % 3 == 2 {
            w.write();
        } else {
            w.feed();
        }
    }
    let (dev, l2) = stopped_and_reopened(&w);
    let versions = std::sync::Mutex::new(std::mem::take(&mut w.version));
    let touched = std::sync::Mutex::new(Vec::new());
    let blocks = std::sync::atomic::AtomicU64::new(0);
    l2.rebuild(
        u64::MAX,
        &|restored: &[u64]| {
            let n = blocks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            for (i, &k) in restored.iter().enumerate().filter(|(i, _)| i % 3 == 0) {
                if (n + i as u64).is_multiple_of(2) {
                    l2.begin_write(&[k]);
                    *versions.lock().unwrap().entry(k).or_insert(0) += 1;
                    l2.end_write(&[k]);
                } else {
                    l2.invalidate(k);
                }
                touched.lock().unwrap().push(k);
            }
            // And records the walk has not reached yet, whose copies in
            // older blocks must stay dead.
            let ahead: Vec<u64> = (0..4).map(|j| (n * 131 + j * 977) % RECORDS).collect();
            l2.begin_write(&ahead);
            for k in &ahead {
                *versions.lock().unwrap().entry(*k).or_insert(0) += 1;
            }
            l2.end_write(&ahead);
            touched.lock().unwrap().extend(ahead);
            0
        },
        &AtomicBool::new(false),
    );
    let touched = touched.into_inner().unwrap();
    assert!(blocks.into_inner() >= 5 && touched.len() >= 20, "the rebuild met too little to test");
    for k in &touched {
        assert!(l2.lookup(*k).is_none(), "record {k} restored again after it was dropped mid-rebuild");
    }
    w.version = versions.into_inner().unwrap();
    w.l2 = l2;
    w.check("after rebuild");
    w.l2.sync_logs();
    w.restart(dev.image_bytes(|_| true));
    w.check("second restart");
}

#[test]
fn rebuild_disabled_forgets_the_log_for_good() {
    let mut w = World::new(13);
    for _ in 0..100 {
        w.feed();
    }
    w.l2.sync_logs();
    assert!(w.l2.sizes().0 > 0);
    let image = w.dev.image_bytes(|_| true);
    let dev = Arc::new(CrashDev::from_bytes(image));
    let d = L2Device::new("p".into(), dev.clone() as Arc<dyn BlockDev>).unwrap();
    let off = PersistOptions { rebuild_enabled: false, min_l2size: 0, state_dir: None };
    let l2 = L2Arc::open(vec![d], &[export()], &off).unwrap();
    assert!(!l2.is_rebuilding());
    assert_eq!(l2.sizes().0, 0);
    drop(l2);
    // Enabled again: the old log is gone, since writes meanwhile were not
    // logged against it.
    let l2 = open(Arc::new(CrashDev::from_bytes(dev.image_bytes(|_| true))), &[export()]);
    assert_eq!(l2.sizes().0, 0);
}

/// A device with faults switchable at run time, over a power-cut recorder.
/// Feeds version 0 of records `keys` and makes their entries durable.
fn feed_first_versions(l2: &L2Arc, keys: std::ops::Range<u64>) {
    let items: Vec<FeedItem> = keys
        .filter(|&k| l2.begin_feed(k))
        .map(|k| FeedItem {
            key: k,
            data: Arc::new(contents(k, 0)) as SharedBytes,
            flags: BlobFlags::default(),
        })
        .collect();
    l2.write_batch(0, items, 0, false).unwrap();
    l2.sync_logs();
}

fn faulty_world() -> (Arc<CrashDev>, Arc<FaultyDev<Arc<CrashDev>>>, L2Arc) {
    let crash = Arc::new(CrashDev::new(DEV_SIZE));
    let faulty = Arc::new(FaultyDev::new(Arc::clone(&crash), 3));
    let d = L2Device::new("f".into(), Arc::clone(&faulty) as Arc<dyn BlockDev>).unwrap();
    let l2 = L2Arc::open(
        vec![d],
        &[export()],
        &PersistOptions { rebuild_enabled: true, min_l2size: 0, state_dir: None },
    )
    .unwrap();
    feed_first_versions(&l2, 0..20);
    (crash, faulty, l2)
}

#[test]
fn a_copy_dropped_for_bad_data_stays_dead_once_its_record_is_written() {
    let (crash, faulty, l2) = faulty_world();
    faulty.set_plan(FaultPlan { flip_bit_probability: 1.0, ..Default::default() });
    let p = l2.lookup(5).unwrap();
    assert_eq!(l2.read(5, p), Err(L2Miss::ChecksumBad));
    faulty.set_plan(FaultPlan::default());
    // The drop's INVALIDATE is not durable yet: the write must wait for it,
    // or a power cut right after the write restores version 0.
    l2.begin_write(&[5]);
    l2.end_write(&[5]);
    let l2 = open(Arc::new(CrashDev::from_bytes(crash.image_bytes(|_| false))), &[export()]);
    assert!(l2.lookup(5).is_none(), "record 5 restored although it was written after its copy was dropped");
    assert_eq!(l2.sizes().0, 19);
}

#[test]
fn a_retired_device_restores_nothing() {
    let (crash, faulty, l2) = faulty_world();
    faulty.set_plan(FaultPlan {
        fail_reads: std::iter::once(HEADER_RESERVED..DEV_SIZE).collect(),
        ..Default::default()
    });
    for k in 0..arcache_l2::device::FAILURES_TO_RETIRE as u64 {
        if let Some(p) = l2.lookup(k) {
            assert_eq!(l2.read(k, p), Err(L2Miss::IoError));
        }
    }
    assert_eq!(l2.healthy_devices(), 0);
    // Writes while it is out are not logged on it, so its log must be dead.
    let l2 = open(Arc::new(CrashDev::from_bytes(crash.image_bytes(|_| false))), &[export()]);
    assert_eq!(l2.sizes().0, 0);
}

#[test]
fn a_commit_for_a_write_also_counts_the_fed_batches_as_committed() {
    let mut w = World::fed_uncommitted(11);
    assert!(w.l2.persist_stats().l2_log_uncommitted_bytes > 0);
    let k = (0..RECORDS).find(|k| w.l2.lookup(*k).is_some()).expect("something was fed");
    // The write's INVALIDATE is committed at once, with every entry before it.
    w.l2.begin_write(&[k]);
    *w.version.entry(k).or_insert(0) += 1;
    w.l2.end_write(&[k]);
    assert_eq!(w.l2.persist_stats().l2_log_uncommitted_bytes, 0);
    let fed = w.l2.sizes().0;
    w.restart(w.dev.image_bytes(|_| true));
    assert_eq!(w.l2.sizes().0, fed, "the batches went out with the write's commit");
    w.check("after a write's commit and kill -9");
}

/// An export whose name is longer than a table entry keeps (64 bytes, a
/// file view of a deep path) finds its entry at the next start: names are
/// matched as the table keeps them. Before, it was discarded as "not
/// served" at every start.
#[test]
fn an_export_with_a_name_longer_than_its_table_entry_is_restored() {
    let long = ExportDesc { name: format!("view:/{}/é", "deep/".repeat(20)), ..export() };
    let dev = Arc::new(CrashDev::new(DEV_SIZE));
    let l2 = open(Arc::clone(&dev), std::slice::from_ref(&long));
    feed_first_versions(&l2, 0..50);
    let image = dev.image_bytes(|_| false);
    let l2 = open(Arc::new(CrashDev::from_bytes(image)), std::slice::from_ref(&long));
    assert_eq!(l2.sizes().0, 50, "a long-named export's records were not restored");
    assert_eq!(l2.persist_stats().l2_rebuild_discarded_exports, 0);
}
