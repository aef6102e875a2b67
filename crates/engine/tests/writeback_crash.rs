//! Write-back against a model of every sector's versions, across crashes.
//!
//! Each sector written carries the id of the write that wrote it, so a read
//! after recovery tells which version survived. The rules (issue 5):
//! every write whose FLUSH (or FUA, or `sync=always` write) was
//! acknowledged reads back or a later version does; nothing reads older than
//! its last flushed write; a value does not change on re-read.
//!
//! Devices are `CrashDev`s: a crash keeps what was flushed and any subset of
//! what was not (a power cut) or all of it (kill -9). A persistent L2 is fed
//! between operations so its INVALIDATE ordering is exercised too.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use arcache_engine::{
    Cache, CacheConfig, Feed, FeedTunables, SyncMode, Volume, VolumeConfig, WriteBack, WriteTunables,
};
use arcache_l2::{ExportDesc, L2Arc, L2Device, PersistOptions, HEADER_RESERVED};
use blockdev::{BlockDev, CrashDev, FaultPlan, FaultyDev, SlowDev, SlowDevConfig};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use zil::{IntentLog, LogExport};

const SIZE: u64 = 512 << 10;
const SECTORS: u64 = SIZE / 512;
const RS: u64 = 16 << 10;

struct Disks {
    backing: Arc<CrashDev>,
    log: Arc<CrashDev>,
    l2: Arc<CrashDev>,
}

impl Disks {
    fn new() -> Disks {
        Disks {
            backing: Arc::new(CrashDev::new(SIZE)),
            log: Arc::new(CrashDev::new(1 << 20)),
            l2: Arc::new(CrashDev::new(HEADER_RESERVED + (4 << 20))),
        }
    }

    fn copy(&self) -> Disks {
        let copy = |d: &CrashDev| Arc::new(CrashDev::from_bytes(d.image_bytes(|_| true)));
        Disks { backing: copy(&self.backing), log: copy(&self.log), l2: copy(&self.l2) }
    }

    /// The disks after a crash: everything flushed, and of the rest what
    /// `keep` says.
    fn crash(&self, rng: &mut StdRng, power_cut: bool) -> Disks {
        let mut keep = |_| !power_cut || rng.gen_bool(0.5);
        Disks {
            backing: Arc::new(CrashDev::from_bytes(self.backing.image_bytes(&mut keep))),
            log: Arc::new(CrashDev::from_bytes(self.log.image_bytes(&mut keep))),
            l2: Arc::new(CrashDev::from_bytes(self.l2.image_bytes(&mut keep))),
        }
    }
}

struct Boot {
    vol: Arc<Volume>,
    wb: Arc<WriteBack>,
    feed: Feed,
    log_dev: Arc<FaultyDev<Arc<dyn BlockDev>>>,
}

fn boot(d: &Disks, mode: SyncMode, with_log: bool) -> Boot {
    boot_with(d, mode, with_log, &|dev: &Arc<CrashDev>, _| Arc::clone(dev) as Arc<dyn BlockDev>)
}

/// How a test presents a disk to the engine.
type Wrap<'a> = dyn Fn(&Arc<CrashDev>, &str) -> Arc<dyn BlockDev> + 'a;

/// Boots on the disks as `wrap` presents them (it is told which: "backing",
/// "log" or "l2").
fn boot_with(d: &Disks, mode: SyncMode, with_log: bool, wrap: &Wrap<'_>) -> Boot {
    let desc =
        ExportDesc { id: 0, name: "t".into(), recordsize: RS as u32, size: SIZE, identity: 7, contents: 7 };
    let l2dev = L2Device::new("l2".into(), wrap(&d.l2, "l2")).unwrap();
    let opts = PersistOptions { rebuild_enabled: true, min_l2size: 0, state_dir: None };
    let l2 = Arc::new(L2Arc::open(vec![l2dev], std::slice::from_ref(&desc), &opts).unwrap());
    let cache = Cache::with_l2(
        CacheConfig { arc_min: 64 << 10, arc_max: 128 << 10, min_prefetch_ms: 0, compress: true },
        Some(Arc::clone(&l2)),
    );
    let log_dev = Arc::new(FaultyDev::new(wrap(&d.log, "log"), 1));
    let lx = LogExport { id: 0, name: "t".into(), identity: 7, size: SIZE };
    let log = with_log.then(|| {
        Arc::new(IntentLog::open(Arc::clone(&log_dev) as Arc<dyn BlockDev>, vec![lx.clone()]).unwrap())
    });
    let wb = WriteBack::new(log, Some(Arc::clone(&l2)), Arc::new(WriteTunables::default()));
    let vol = Volume::with_writeback(
        0,
        VolumeConfig { name: "t".into(), recordsize: RS, read_only: false },
        wrap(&d.backing, "backing"),
        Arc::clone(&cache),
        Arc::clone(&wb),
    );
    arcache_engine::replay_log(&wb, &[(lx, Arc::clone(&vol))]).unwrap();
    let c = Arc::clone(&cache);
    l2.rebuild(1 << 20, &|keys: &[u64]| c.count_cached(keys), &AtomicBool::new(false));
    vol.set_sync_mode(mode);
    let tun = Arc::new(FeedTunables::default());
    tun.dwpd_limit.store(0, Relaxed);
    let feed = Feed::new(Arc::clone(&cache), tun, Arc::new(AtomicU64::new(128 << 10))).unwrap();
    Boot { vol, wb, feed, log_dev }
}

/// Sector contents that name the write that made them.
fn sector_bytes(id: u64, sector: u64) -> [u8; 512] {
    let mut b = [0u8; 512];
    b[..8].copy_from_slice(&id.to_le_bytes());
    b[8..16].copy_from_slice(&sector.to_le_bytes());
    for (i, x) in b[16..].iter_mut().enumerate() {
        *x = (id as u8).wrapping_mul(31).wrapping_add(i as u8);
    }
    b
}

fn decode(b: &[u8], sector: u64) -> Result<u64, String> {
    if b.iter().all(|&x| x == 0) {
        return Ok(0);
    }
    let id = u64::from_le_bytes(b[..8].try_into().unwrap());
    if b[..] != sector_bytes(id, sector)[..] {
        return Err(format!("sector {sector} holds bytes no write made (id field {id})"));
    }
    Ok(id)
}

/// Per sector: every version in order (0 = zeroes) and the index of the
/// last one a flush covered.
struct Model {
    versions: Vec<Vec<u64>>,
    flushed: Vec<usize>,
    next_id: u64,
}

impl Model {
    fn new() -> Model {
        Model { versions: vec![vec![0]; SECTORS as usize], flushed: vec![0; SECTORS as usize], next_id: 1 }
    }

    fn flush_all(&mut self) {
        for (f, v) in self.flushed.iter_mut().zip(&self.versions) {
            *f = v.len() - 1;
        }
    }

    /// After a crash: the surviving value of each sector must be its last
    /// flushed version or a later one; it becomes the only version.
    fn recover(&mut self, read: &[u8]) -> Result<(), String> {
        for s in 0..SECTORS as usize {
            let id = decode(&read[s * 512..(s + 1) * 512], s as u64)?;
            let allowed = &self.versions[s][self.flushed[s]..];
            if !allowed.contains(&id) {
                return Err(format!(
                    "sector {s} reads version {id}; flushed {} then {:?}",
                    self.versions[s][self.flushed[s]],
                    &allowed[1..]
                ));
            }
            self.versions[s] = vec![id];
            self.flushed[s] = 0;
        }
        Ok(())
    }

    fn current(&self, s: usize) -> u64 {
        *self.versions[s].last().unwrap()
    }
}

fn read_all(vol: &Volume) -> Vec<u8> {
    let mut buf = vec![0u8; SIZE as usize];
    vol.read(0, &mut buf).unwrap();
    buf
}

fn run_seed(seed: u64) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut disks = Disks::new();
    let mut model = Model::new();
    for round in 0..4 {
        let mode = [SyncMode::Standard, SyncMode::Always, SyncMode::Disabled][rng.gen_range(0..3)];
        let with_log = rng.gen_bool(0.75);
        let b = boot(&disks, mode, with_log);
        let fail_log_at = if with_log && rng.gen_bool(0.2) { rng.gen_range(0..60) } else { usize::MAX };
        let mut log_failed = false;
        for step in 0..rng.gen_range(10..80) {
            if step == fail_log_at {
                log_failed = true;
                b.log_dev.set_plan(FaultPlan {
                    fail_writes: std::iter::once(0..u64::MAX).collect(),
                    fail_flush: true,
                    ..Default::default()
                });
                // The next log operation finds the failure; the sync it
                // falls back to puts everything on the backing store. Clients
                // see no error.
                b.wb.sync_now().map_err(|e| format!("sync after log failure: {e}"))?;
                let id = model.next_id;
                model.next_id += 1;
                model.versions[0].push(id);
                b.vol
                    .write(0, &sector_bytes(id, 0), false)
                    .map_err(|e| format!("write after log failure: {e}"))?;
                b.vol.flush().map_err(|e| format!("flush after log failure: {e}"))?;
                if mode != SyncMode::Disabled {
                    model.flush_all();
                }
                if mode != SyncMode::Disabled && b.wb.view().zil_degraded != 1 {
                    return Err("the failed log is not reported".into());
                }
            }
            match rng.gen_range(0..100) {
                0..=54 => {
                    let first = rng.gen_range(0..SECTORS);
                    let n = rng.gen_range(1..=64).min(SECTORS - first);
                    let id = model.next_id;
                    model.next_id += 1;
                    let mut data = Vec::with_capacity(n as usize * 512);
                    for s in first..first + n {
                        data.extend_from_slice(&sector_bytes(id, s));
                        model.versions[s as usize].push(id);
                    }
                    let fua = rng.gen_bool(0.1);
                    b.vol.write(first * 512, &data, fua).map_err(|e| format!("write: {e}"))?;
                    if mode == SyncMode::Always || (fua && mode == SyncMode::Standard) {
                        // Durable once acknowledged; earlier writes too.
                        model.flush_all();
                    }
                }
                55..=64 => {
                    b.vol.flush().map_err(|e| format!("flush: {e}"))?;
                    if mode != SyncMode::Disabled {
                        model.flush_all();
                    }
                }
                65..=69 => {
                    let first = rng.gen_range(0..SECTORS);
                    let n = rng.gen_range(1..=128).min(SECTORS - first);
                    b.vol.write_zeroes(first * 512, n * 512, false).map_err(|e| format!("zero: {e}"))?;
                    for s in first..first + n {
                        model.versions[s as usize].push(0);
                    }
                    if mode == SyncMode::Always {
                        model.flush_all();
                    }
                }
                70..=79 => {
                    b.wb.sync_now().map_err(|e| format!("sync: {e}"))?;
                }
                80..=89 => {
                    b.feed.cycle_once();
                }
                _ => {
                    let got = read_all(&b.vol);
                    for s in 0..SECTORS as usize {
                        let id = decode(&got[s * 512..(s + 1) * 512], s as u64)?;
                        if id != model.current(s) {
                            return Err(format!(
                                "round {round} step {step}: sector {s} reads {id}, wrote {}",
                                model.current(s)
                            ));
                        }
                    }
                }
            }
        }
        // Crash: kill -9 or power cut; the old process's state is dropped.
        let power_cut = rng.gen_bool(0.5);
        disks = disks.crash(&mut rng, power_cut);
        if log_failed {
            // The log device died: it is replaced by an empty one, as
            // `arcache log forget` would leave it. What was acknowledged
            // after the failure went to the backing store in txgs, and what
            // was acknowledged before it must have been synced too.
            disks.log = Arc::new(CrashDev::new(1 << 20));
        }
        drop(b);
        let b = boot(&disks, SyncMode::Standard, true);
        let first = read_all(&b.vol);
        model
            .recover(&first)
            .map_err(|e| format!("round {round} ({mode:?}, log {with_log}, power cut {power_cut}): {e}"))?;
        // Read again from a fresh boot on the same disks: nothing changes by itself.
        b.wb.shutdown().map_err(|e| format!("shutdown: {e}"))?;
        drop(b);
        for n in 0..3 {
            let again = read_all(&boot(&disks, SyncMode::Standard, true).vol);
            if again != first {
                return Err(format!(
                    "round {round}: contents changed between reads with no write (boot {n})"
                ));
            }
        }
    }
    Ok(())
}

#[test]
fn flushed_writes_survive_crashes_in_every_sync_mode() {
    let seeds: u64 = std::env::var("ARCACHE_WB_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
    let mut failures = Vec::new();
    for seed in 0..seeds {
        if let Err(e) = run_seed(seed) {
            failures.push(format!("seed {seed}: {e}"));
        }
    }
    assert!(failures.is_empty(), "{} of {seeds} seeds failed:\n{}", failures.len(), failures.join("\n"));
}

/// The power switch of a machine's disks: after the cut no device takes a
/// write, and every write or flush happened wholly before it or not at
/// all, so the images are what one instant left, as in a real power cut.
#[derive(Default)]
struct Power {
    off: parking_lot::RwLock<bool>,
}

struct Switched {
    dev: Arc<CrashDev>,
    power: Arc<Power>,
}

impl Switched {
    /// Runs `f` on the device unless the power is off (then the request
    /// vanishes, as the caller will never know).
    fn powered(&self, f: impl FnOnce(&CrashDev) -> blockdev::DevResult<()>) -> blockdev::DevResult<()> {
        let off = self.power.off.read();
        if *off {
            return Ok(());
        }
        f(&self.dev)
    }
}

impl BlockDev for Switched {
    fn size(&self) -> u64 {
        self.dev.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> blockdev::DevResult<()> {
        self.dev.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> blockdev::DevResult<()> {
        self.powered(|d| d.write_at(buf, offset))
    }
    fn flush(&self) -> blockdev::DevResult<()> {
        self.powered(|d| d.flush())
    }
    fn trim(&self, offset: u64, len: u64) -> blockdev::DevResult<()> {
        self.powered(|d| d.trim(offset, len))
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> blockdev::DevResult<()> {
        self.powered(|d| d.write_zeroes(offset, len))
    }
    fn describe(&self) -> String {
        self.dev.describe()
    }
    fn identity(&self) -> String {
        self.dev.identity()
    }
}

const CUT_THREADS: u64 = 4;

/// One writer thread: writes (some with FUA) and flushes in its own sectors
/// until told to stop, noting in the model what each acknowledgement
/// covered, but only while the power is on (an answer after the cut is a
/// device's lie that the test must not believe).
fn cut_writer(
    t: u64,
    seed: u64,
    vol: &Volume,
    model: &parking_lot::Mutex<Model>,
    power: &Power,
    stop: &AtomicBool,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let per = SECTORS / CUT_THREADS;
    let own = t * per..(t + 1) * per;
    while !stop.load(Relaxed) {
        if rng.gen_bool(0.6) {
            let first = rng.gen_range(own.clone());
            let n = rng.gen_range(1..=16).min(own.end - first);
            let mut data = Vec::with_capacity(n as usize * 512);
            {
                let mut m = model.lock();
                let id = m.next_id;
                m.next_id += 1;
                for s in first..first + n {
                    data.extend_from_slice(&sector_bytes(id, s));
                    m.versions[s as usize].push(id);
                }
            }
            let fua = rng.gen_bool(0.1);
            let covered = latest_versions(model, own.clone());
            vol.write(first * 512, &data, fua).expect("write");
            if fua {
                note_durable(model, power, own.clone(), &covered);
            }
        } else {
            let covered = latest_versions(model, own.clone());
            if rng.gen_bool(0.5) {
                vol.flush().expect("flush");
            } else {
                // As the NBD server does: answered later by the commit thread.
                let (tx, rx) = std::sync::mpsc::channel();
                let done: arcache_engine::CommitDone = Box::new(move |r, _| {
                    let _ = tx.send(r.is_ok());
                });
                if let Err(done) = vol.flush_async(done, &mut arcache_engine::Batch::new()) {
                    done(&vol.flush(), &mut arcache_engine::Batch::new());
                }
                assert!(rx.recv().expect("flush answered"), "async flush failed");
            }
            note_durable(model, power, own.clone(), &covered);
        }
    }
}

/// The index of each sector's newest version: what an acknowledgement
/// received now covers (every write of the thread was acknowledged).
fn latest_versions(model: &parking_lot::Mutex<Model>, own: std::ops::Range<u64>) -> Vec<usize> {
    let m = model.lock();
    own.map(|s| m.versions[s as usize].len() - 1).collect()
}

fn note_durable(
    model: &parking_lot::Mutex<Model>,
    power: &Power,
    own: std::ops::Range<u64>,
    covered: &[usize],
) {
    let off = power.off.read();
    if *off {
        return;
    }
    let mut m = model.lock();
    for (s, &c) in own.zip(covered) {
        m.flushed[s as usize] = m.flushed[s as usize].max(c);
    }
}

/// Several threads flush at once, so log commits overlap and a power cut
/// catches some of them half done: every acknowledged FLUSH or FUA write
/// still reads back after recovery, whichever chunks reached the log.
fn cut_round(seed: u64) -> Result<(), String> {
    let mut rng = StdRng::seed_from_u64(seed);
    let disks = Disks::new();
    let power = Arc::new(Power::default());
    let slow =
        SlowDevConfig { latency: std::time::Duration::from_micros(150), parallelism: 4, bandwidth: 1 << 30 };
    let wrap = |dev: &Arc<CrashDev>, what: &str| -> Arc<dyn BlockDev> {
        let switched = Switched { dev: Arc::clone(dev), power: Arc::clone(&power) };
        match what {
            "l2" => Arc::new(switched),
            _ => Arc::new(SlowDev::new(switched, slow)),
        }
    };
    let b = boot_with(&disks, SyncMode::Standard, true, &wrap);
    b.wb.tunables.dirty_data_max.store(rng.gen_range(64..512) << 10, Relaxed);
    b.wb.tunables.log_writes_in_flight.store(rng.gen_range(1..=3), Relaxed);
    b.wb.spawn();
    let model = parking_lot::Mutex::new(Model::new());
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..CUT_THREADS {
            let (vol, model, power, stop) = (&b.vol, &model, &*power, &stop);
            s.spawn(move || cut_writer(t, t + seed * CUT_THREADS, vol, model, power, stop));
        }
        std::thread::sleep(std::time::Duration::from_millis(rng.gen_range(10..120)));
        *power.off.write() = true;
        stop.store(true, Relaxed);
    });
    let _ = b.wb.shutdown();
    let stats = b.wb.view();
    drop(b);
    let power_cut = rng.gen_bool(0.7);
    let after = disks.crash(&mut rng, power_cut);
    let before_boot = after.copy();
    let read = read_all(&boot(&after, SyncMode::Standard, true).vol);
    let checked = model.lock().recover(&read);
    checked.map_err(|e| {
        let story = e
            .strip_prefix("sector ")
            .and_then(|r| r.split(' ').next())
            .and_then(|n| n.parse().ok())
            .map_or(String::new(), |s| sector_story(&before_boot, s));
        format!(
            "seed {seed} (power cut {power_cut}, {} log writes for {} commits): {e}{story}",
            stats.zil_commit_writer_count, stats.zil_commit_count
        )
    })
}

/// What the crashed disks hold for one sector: the backing store's version
/// and, in replay order, every logged version, to tell a lost log write
/// from a replay that applied an old version over a newer one.
fn sector_story(d: &Disks, sector: u64) -> String {
    let backing = d.backing.image_bytes(|_| true);
    let at = sector as usize * 512;
    let mut story = format!("\n  backing holds {:?}", decode(&backing[at..at + 512], sector));
    let log = Arc::new(CrashDev::from_bytes(d.log.image_bytes(|_| true)));
    let Ok(log) = IntentLog::open(log as Arc<dyn BlockDev>, Vec::new()) else {
        return story + "\n  log: unreadable";
    };
    let mut chunk = 0;
    let res = log.replay(&|_| true, &mut |_, e| {
        chunk += 1;
        if let zil::Entry::Page { page, mask, data, .. } = e {
            let mut packed = data.chunks(512);
            for i in 0..8u64 {
                if mask & (1 << i) != 0 {
                    let bytes = packed.next().unwrap_or(&[]);
                    if page * 8 + i == sector {
                        story += &format!("\n  log entry {chunk}: {:?}", decode(bytes, sector));
                    }
                }
            }
        }
        Ok(())
    });
    story + &format!("\n  replay: {res:?}")
}

#[test]
fn a_power_cut_amid_overlapping_log_commits_loses_no_acknowledged_write() {
    let rounds: u64 = std::env::var("ARCACHE_CUT_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(40);
    for seed in 0..rounds {
        cut_round(seed).unwrap();
    }
}
