//! Reads served from L2 through the io_uring ring (`Volume::read_async`),
//! against per-client models: the L2 device is a real O_DIRECT file (the
//! ring reads files only), small enough that the feed's hand wraps it many
//! times, while clients overwrite what others read and the file's bytes
//! are damaged or cut off underneath.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arcache_engine::{
    Cache, CacheConfig, Feed, FeedTunables, Volume, VolumeConfig, WriteBack, WriteTunables,
};
use arcache_l2::{L2Arc, L2Device, HEADER_RESERVED};
use blockdev::{BlockDev, FileDev, FileDevOptions, MemDev};
use rand::{Rng, SeedableRng};

const DEV: u64 = 3 << 20;
const L2_BYTES: u64 = HEADER_RESERVED + (4 << 20);

struct Rig {
    cache: Arc<Cache>,
    vol: Arc<Volume>,
    feed: Feed,
    _dir: tempfile::TempDir,
    l2_path: std::path::PathBuf,
}

/// The L2 file lives under the build's target directory: a real disk
/// filesystem, where O_DIRECT works (tmpfs refuses it, and the ring with it).
/// With `write_back`, writes stay dirty in RAM until a transaction group
/// syncs them, as in the server (small dirty limit: frequent txgs).
fn rig(recordsize: u64, write_back: bool) -> Rig {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let l2_path = dir.path().join("l2.img");
    let opts = FileDevOptions { direct: true, create_size: Some(L2_BYTES), ..Default::default() };
    let file = FileDev::open(&l2_path, opts).unwrap();
    assert!(file.is_direct(), "O_DIRECT refused under {}", dir.path().display());
    let l2dev: Arc<dyn BlockDev> = Arc::new(file);
    let l2 = L2Arc::new(vec![L2Device::new("l2".into(), l2dev).unwrap()]).unwrap();
    l2.start_async_reads().expect("io_uring is available to tests");
    let arc_max = 256 << 10;
    let cache = Cache::with_l2(
        CacheConfig { arc_min: arc_max / 2, arc_max, min_prefetch_ms: 1000, compress: false },
        Some(Arc::new(l2)),
    );
    let tun = Arc::new(FeedTunables::default());
    tun.dwpd_limit.store(0, Relaxed);
    tun.feed_min_ms.store(10, Relaxed);
    tun.write_boost.store(0, Relaxed);
    let feed = Feed::new(Arc::clone(&cache), tun, Arc::new(AtomicU64::new(arc_max))).unwrap();
    let backing: Arc<dyn BlockDev> = Arc::new(MemDev::new(DEV));
    let cfg = VolumeConfig { name: "t".into(), recordsize, read_only: false };
    let vol = if write_back {
        let wtun = Arc::new(WriteTunables::default());
        wtun.dirty_data_max.store(256 << 10, Relaxed);
        wtun.txg_timeout_secs.store(1, Relaxed);
        let wb = WriteBack::new(None, cache.l2().cloned(), wtun);
        wb.spawn();
        Volume::with_writeback(0, cfg, backing, Arc::clone(&cache), wb)
    } else {
        Volume::new(0, cfg, backing, Arc::clone(&cache))
    };
    Rig { cache, vol, feed, _dir: dir, l2_path }
}

mod common;

fn read(vol: &Volume, offset: u64, len: usize) -> Vec<u8> {
    common::try_read(vol, offset, len).unwrap()
}

fn payload(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.gen()).collect()
}

/// Three clients on disjoint regions, each checking its own model: mostly
/// small reads within a record (what the ring serves), some spanning
/// records (blocking path), and overwrites that must never be undone by a
/// ring read that completes after them.
fn clients(vol: &Arc<Volume>, secs: u64, stop_early: &AtomicBool) {
    let region = DEV / 3 / 4096 * 4096;
    std::thread::scope(|s| {
        for t in 0..3u64 {
            let vol = Arc::clone(vol);
            s.spawn(move || {
                let base = t * region;
                let mut model = payload(1000 + t, region as usize);
                vol.write(base, &model, false).unwrap();
                let mut rng = rand::rngs::StdRng::seed_from_u64(t);
                let until = Instant::now() + Duration::from_secs(secs);
                for i in 0u64.. {
                    if Instant::now() > until || stop_early.load(Relaxed) {
                        break;
                    }
                    let (o, l) = if i % 10 == 0 {
                        (rng.gen_range(0..region - 20_000), rng.gen_range(1..20_000))
                    } else {
                        (rng.gen_range(0..region / 4096) * 4096, 4096)
                    };
                    if i % 7 == 0 {
                        let d = payload(i * 3 + t, l as usize);
                        vol.write(base + o, &d, false).unwrap();
                        model[o as usize..(o + l) as usize].copy_from_slice(&d);
                    } else {
                        let b = read(&vol, base + o, l as usize);
                        assert!(b == model[o as usize..(o + l) as usize], "client {t} op {i}: read {o}+{l}");
                    }
                }
            });
        }
    });
}

/// Overwrites random 4K blocks of the L2 file's data area with garbage
/// until stopped: what a failing SSD returns.
fn damage(path: &Path, stop: &AtomicBool) -> u64 {
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    let mut rng = rand::rngs::StdRng::seed_from_u64(99);
    let mut n = 0;
    while !stop.load(Relaxed) {
        let at = HEADER_RESERVED + rng.gen_range(0..(L2_BYTES - HEADER_RESERVED) / 4096) * 4096;
        f.write_all_at(&payload(n, 4096), at).unwrap();
        f.sync_data().unwrap();
        n += 1;
        std::thread::sleep(Duration::from_millis(2));
    }
    n
}

#[test]
fn ring_reads_match_the_model_while_the_hand_wraps_and_l2_bytes_rot() {
    for recordsize in [16 << 10, 4 << 10] {
        let r = rig(recordsize, false);
        let stop = Arc::new(AtomicBool::new(false));
        let feeder = r.feed.spawn(Arc::clone(&stop));
        let rot = Arc::new(AtomicBool::new(false));
        let damager = {
            let (path, rot) = (r.l2_path.clone(), Arc::clone(&rot));
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_secs(2));
                damage(&path, &rot)
            })
        };
        // At least 4 s, and on a loaded host until what the asserts below
        // need has happened (once, 4 s alone wrote 14.9 of the 16 MiB).
        let reached = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                let (start, limit) = (Instant::now(), Duration::from_secs(60));
                while start.elapsed() < limit {
                    std::thread::sleep(Duration::from_millis(100));
                    let st = r.cache.stats();
                    let enough =
                        st.l2_write_bytes > 16 << 20 && st.l2_cksum_bad > 0 && st.l2_ring_reads > 1000;
                    if enough && start.elapsed() >= Duration::from_secs(4) {
                        break;
                    }
                }
                reached.store(true, Relaxed);
            });
            clients(&r.vol, 60, &reached);
        });
        rot.store(true, Relaxed);
        let damaged = damager.join().unwrap();
        stop.store(true, Relaxed);
        feeder.join().unwrap();
        let st = r.cache.stats();
        assert!(st.l2_ring_reads > 1000, "recordsize {recordsize}: reads went through the ring: {st:?}");
        assert!(
            st.l2_write_bytes > 16 << 20,
            "the 4 MiB device wrapped several times: {}",
            st.l2_write_bytes
        );
        assert!(
            damaged > 100 && st.l2_cksum_bad > 0,
            "damaged blocks were caught: {damaged} written, {st:?}"
        );
        if recordsize == 16 << 10 {
            assert!(st.l2_partial_reads > 0, "4K reads of cold records used half copies: {st:?}");
        }
        r.cache.validate().unwrap();
    }
}

/// The L2 file is cut to nothing mid-run, as a device that goes away:
/// ring reads come back short (IO errors) or, once the feed has written
/// past the hole, as zeroes (checksum failures); every client read is
/// still right.
#[test]
fn ring_reads_survive_the_device_disappearing() {
    let r = rig(16 << 10, false);
    let stop = Arc::new(AtomicBool::new(false));
    let feeder = r.feed.spawn(Arc::clone(&stop));
    let cut = {
        let path = r.l2_path.clone();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(2));
            let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
            f.set_len(0).unwrap();
        })
    };
    clients(&r.vol, 4, &AtomicBool::new(false));
    cut.join().unwrap();
    stop.store(true, Relaxed);
    feeder.join().unwrap();
    let st = r.cache.stats();
    assert!(st.l2_ring_reads > 100, "reads went through the ring before the cut: {st:?}");
    assert!(st.l2_io_error + st.l2_cksum_bad > 0, "failed reads were counted: {st:?}");
    r.cache.validate().unwrap();
}

/// One writer keeps overwriting records that four readers read through
/// the ring, so ring reads are often in flight across a write to their
/// record. A read must never return a version older than one acknowledged
/// before it began: a ring read that completed after an overwrite and put
/// its old bytes into the ARC would be caught by the next read. Writes go
/// through, then (as in the server) stay dirty in RAM until a txg.
#[test]
fn a_ring_read_overtaken_by_a_write_never_brings_back_the_old_version() {
    overtaken_reads(false);
    overtaken_reads(true);
}

fn overtaken_reads(write_back: bool) {
    let r = rig(16 << 10, write_back);
    let stop = Arc::new(AtomicBool::new(false));
    let feeder = r.feed.spawn(Arc::clone(&stop));
    common::overtaken_reads(&r.vol, 16 << 10, 96, 4);
    stop.store(true, Relaxed);
    feeder.join().unwrap();
    let st = r.cache.stats();
    assert!(st.l2_ring_reads > 1000, "write_back {write_back}: reads went through the ring: {st:?}");
    r.cache.validate().unwrap();
}
