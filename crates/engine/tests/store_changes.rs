//! A store another server changes underneath (a read-only server of a
//! chunked S3 disk following its writer) tells the volume what changed:
//! every cached copy of it goes, in RAM and on L2, the next read returns
//! the store's new bytes, and the first change unbinds the export's
//! persistent L2 from the store as it was (what keeps a restart from
//! restoring any of it; s3.rs checks that through the binary).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use arcache_engine::{Cache, CacheConfig, Feed, FeedTunables, Volume, VolumeConfig};
use arcache_l2::{ExportDesc, L2Arc, L2Device, PersistOptions, HEADER_RESERVED};
use blockdev::{BlockDev, ChangeWatcher, DevResult, MemDev};

const RS: u64 = 16 << 10;
const RECORDS: u64 = 256;

/// A memory store whose bytes the test changes "from elsewhere", telling
/// the watcher the volume handed it, as a following S3 reader does.
struct ChangingDev {
    inner: MemDev,
    watcher: Mutex<Option<Arc<dyn ChangeWatcher>>>,
    reads: AtomicU64,
}

impl BlockDev for ChangingDev {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> DevResult<()> {
        self.reads.fetch_add(1, Relaxed);
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> DevResult<()> {
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> DevResult<()> {
        Ok(())
    }
    fn describe(&self) -> String {
        "changing".into()
    }
    fn is_read_only(&self) -> bool {
        true
    }
    fn watch_changes(&self, watcher: Arc<dyn ChangeWatcher>) {
        *self.watcher.lock().unwrap() = Some(watcher);
    }
}

impl ChangingDev {
    fn change(&self, offset: u64, data: &[u8]) {
        self.inner.write_at(data, offset).unwrap();
        let w = self.watcher.lock().unwrap().clone().expect("the volume watches its store");
        w.before_first_change();
        w.changed(offset, data.len() as u64);
    }
}

#[test]
fn a_change_underneath_drops_every_cached_copy_and_unbinds_the_l2() {
    let size = RS * RECORDS;
    let desc = ExportDesc { id: 0, name: "t".into(), recordsize: RS as u32, size, identity: 7, contents: 7 };
    let l2dev = L2Device::new("l2".into(), Arc::new(MemDev::new(HEADER_RESERVED + (16 << 20)))).unwrap();
    let opts = PersistOptions { rebuild_enabled: true, min_l2size: 0, state_dir: None };
    let l2 = L2Arc::open(vec![l2dev], &[desc], &opts).unwrap();
    l2.rebuild(1 << 20, &|_: &[u64]| 0, &AtomicBool::new(false));
    let arc_max = 4 * size;
    let cache = Cache::with_l2(
        CacheConfig { arc_min: arc_max / 2, arc_max, min_prefetch_ms: 0, compress: false },
        Some(Arc::new(l2)),
    );
    cache.zfetch.disable.store(true, Relaxed);
    let tun = Arc::new(FeedTunables::default());
    tun.dwpd_limit.store(0, Relaxed);
    let feed = Feed::new(Arc::clone(&cache), tun, Arc::new(AtomicU64::new(arc_max))).unwrap();
    let old: Vec<u8> = (0..size).map(|i| (i * 7 / 3) as u8).collect();
    let dev = Arc::new(ChangingDev {
        inner: MemDev::new(size),
        watcher: Mutex::new(None),
        reads: AtomicU64::new(0),
    });
    dev.inner.write_at(&old, 0).unwrap();
    let cfg = VolumeConfig { name: "t".into(), recordsize: RS, read_only: true };
    let vol = Volume::new(0, cfg, Arc::clone(&dev) as Arc<dyn BlockDev>, Arc::clone(&cache));
    let l2 = Arc::clone(cache.l2().unwrap());

    let mut buf = vec![0u8; size as usize];
    vol.read(0, &mut buf).unwrap();
    assert!(buf == old);
    feed.cycle_once();
    l2.commit_pending();
    assert!((0..RECORDS).all(|r| l2.contains(r)), "every record fed to L2");
    let reads = dev.reads.load(Relaxed);
    vol.read(0, &mut buf).unwrap();
    assert_eq!(dev.reads.load(Relaxed), reads, "a second pass is served from the cache");

    // Records 10 to 19, and part of record 40.
    let new: Vec<u8> = old[(10 * RS) as usize..(20 * RS) as usize].iter().map(|b| b ^ 0xff).collect();
    dev.change(10 * RS, &new);
    dev.change(40 * RS + 100, &[1, 2, 3]);
    let mut want = old.clone();
    want[(10 * RS) as usize..(20 * RS) as usize].copy_from_slice(&new);
    want[(40 * RS + 100) as usize..(40 * RS + 103) as usize].copy_from_slice(&[1, 2, 3]);
    let gone: Vec<u64> = (10..20).chain([40]).collect();
    for r in 0..RECORDS {
        assert_eq!(l2.contains(r), !gone.contains(&r), "record {r} on L2");
    }
    assert_eq!(cache.count_cached(&gone), 0, "changed records left RAM");
    assert_eq!(l2.stats.l2_contents_rebinds.load(Relaxed), 1, "the first change unbinds the L2, once");
    vol.read(0, &mut buf).unwrap();
    assert!(buf == want, "the store's new bytes are served");
    assert_eq!(vol.counts().store_changes.load(Relaxed), 2);
    assert_eq!(vol.counts().store_changed_bytes.load(Relaxed), 10 * RS + 3);
}
