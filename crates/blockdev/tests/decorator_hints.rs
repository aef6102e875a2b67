//! Every decorator passes the store's hints through: a decorator that did
//! not (as once the `Arc` forwarding did not for `write_unit`) would make
//! the engine treat an object store as a disk, silently, or a persistent
//! L2 restore records of a store that changed since (`contents_identity`),
//! or a reader serve records of chunks its writer rewrote (`watch_changes`),
//! or a stop keep a disk's lease that it meant to give back (`release`).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use blockdev::{BlockDev, ChangeWatcher, CountingDev, DevResult, FaultyDev, MemDev, SlowDev, SlowDevConfig};

/// A store with every hint set; it tells a watcher it is handed that its
/// first megabyte changed, and counts the times it was told to stop.
struct Hinted(MemDev, AtomicU64);

/// Counts what it is told.
#[derive(Default)]
struct Told(AtomicU64);

impl ChangeWatcher for Told {
    fn before_first_change(&self) {
        self.0.fetch_add(1, Relaxed);
    }
    fn changed(&self, _offset: u64, len: u64) {
        self.0.fetch_add(len, Relaxed);
    }
}

impl BlockDev for Hinted {
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> DevResult<()> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> DevResult<()> {
        self.0.write_at(buf, offset)
    }
    fn flush(&self) -> DevResult<()> {
        Ok(())
    }
    fn describe(&self) -> String {
        "hinted".into()
    }
    fn write_unit(&self) -> Option<u64> {
        Some(1 << 20)
    }
    fn read_unit(&self) -> Option<u64> {
        Some(8 << 20)
    }
    fn changed(&self) -> Option<String> {
        Some("replaced".into())
    }
    fn identity(&self) -> String {
        "store".into()
    }
    fn contents_identity(&self) -> String {
        "store#v2".into()
    }
    fn watch_changes(&self, watcher: Arc<dyn ChangeWatcher>) {
        watcher.before_first_change();
        watcher.changed(0, 1 << 20);
    }
    fn stop_watching(&self) {
        self.1.fetch_add(1, Relaxed);
    }
    fn release(&self) -> DevResult<()> {
        self.1.fetch_add(100, Relaxed);
        Ok(())
    }
}

type Hints = (Option<u64>, Option<u64>, Option<String>, String, String, u64);

/// The hints as `d` passes them on; `stops` counts the `stop_watching`
/// calls (1 each) and `release` calls (100 each) that reached the store.
fn hints(d: &dyn BlockDev, stops: impl Fn() -> u64) -> (Hints, u64) {
    let told = Arc::new(Told::default());
    d.watch_changes(told.clone());
    d.stop_watching();
    d.release().expect("release");
    let h = (
        d.write_unit(),
        d.read_unit(),
        d.changed(),
        d.identity(),
        d.contents_identity(),
        told.0.load(Relaxed),
    );
    (h, stops())
}

#[test]
fn decorators_pass_the_stores_hints_through() {
    let want: Hints = (
        Some(1 << 20),
        Some(8 << 20),
        Some("replaced".to_string()),
        "store".into(),
        "store#v2".into(),
        (1 << 20) + 1,
    );
    let slow = SlowDevConfig { latency: Duration::ZERO, parallelism: 1, bandwidth: u64::MAX };
    let inner = || Arc::new(Hinted(MemDev::new(1 << 20), AtomicU64::new(0)));
    let stops = |h: &Arc<Hinted>| {
        let h = Arc::clone(h);
        move || h.1.load(Relaxed)
    };
    let h = inner();
    assert_eq!(hints(&CountingDev::new(Arc::clone(&h)), stops(&h)), (want.clone(), 101), "counting");
    let h = inner();
    assert_eq!(hints(&FaultyDev::new(Arc::clone(&h), 1), stops(&h)), (want.clone(), 101), "faulty");
    let h = inner();
    assert_eq!(hints(&SlowDev::new(Arc::clone(&h), slow), stops(&h)), (want.clone(), 101), "slow");
    let h = inner();
    assert_eq!(hints(&Arc::clone(&h), stops(&h)), (want, 101), "Arc");
}
