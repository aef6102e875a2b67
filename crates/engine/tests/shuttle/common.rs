//! What every shuttle test builds on: self-describing record contents and
//! devices at which other threads may run.

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
use std::sync::Arc;

use arcache_engine::Volume;
use blockdev::{BlockDev, DevResult, MemDev};
use shuttle::thread;

/// Record `r` at `version`, `len` bytes: self-describing, so any read
/// tells what it got, and a mix of two versions matches neither.
pub fn content(r: u64, version: u8, len: u64) -> Vec<u8> {
    let mut v: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31) ^ version ^ (r as u8)).collect();
    v[..8].copy_from_slice(&r.to_le_bytes());
    v[8] = version;
    v
}

/// The record and version a buffer holds, if it is exactly one of ours.
pub fn identify(buf: &[u8]) -> Option<(u64, u8)> {
    let r = u64::from_le_bytes(buf[..8].try_into().ok()?);
    let version = buf[8];
    (buf == content(r, version, buf.len() as u64)).then_some((r, version))
}

/// Reads record `r` of `rs` bytes whole; panics on bytes that are no
/// version of any record (a torn or foreign read).
pub fn read_record(vol: &Volume, r: u64, rs: u64) -> (u64, u8) {
    let mut buf = vec![0u8; rs as usize];
    vol.read(r * rs, &mut buf).expect("reads succeed");
    identify(&buf).unwrap_or_else(|| panic!("record {r}: bytes that are no version of any record"))
}

/// A device at which other threads may run before each IO.
pub struct Yielding(pub Arc<dyn BlockDev>);

impl BlockDev for Yielding {
    fn size(&self) -> u64 {
        self.0.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> DevResult<()> {
        thread::yield_now();
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> DevResult<()> {
        thread::yield_now();
        self.0.write_at(buf, offset)
    }
    fn flush(&self) -> DevResult<()> {
        thread::yield_now();
        self.0.flush()
    }
    fn describe(&self) -> String {
        format!("{} (yielding)", self.0.describe())
    }
}

pub fn device(size: u64) -> Arc<dyn BlockDev> {
    Arc::new(Yielding(Arc::new(MemDev::new(size))))
}

/// A logical clock for the intervals a test compares (who was inside
/// what when), ticking on every reading.
#[derive(Default)]
pub struct Clock(AtomicU64);

impl Clock {
    pub fn now(&self) -> u64 {
        self.0.fetch_add(1, SeqCst)
    }
}

/// Whether two `(start, end)` intervals of one [`Clock`] overlap.
pub fn overlap(a: (u64, u64), b: (u64, u64)) -> bool {
    a.0 < b.1 && b.0 < a.1
}

/// Schedules run and schedules that reached a test's race, counted per
/// test: proof that its race happened, not just that nothing failed.
#[derive(Default)]
pub struct Reached {
    pub runs: AtomicU64,
    pub hits: AtomicU64,
}

impl Reached {
    pub fn run(&self, reached: bool) {
        self.runs.fetch_add(1, SeqCst);
        if reached {
            self.hits.fetch_add(1, SeqCst);
        }
    }

    /// Asserts that some schedule reached the race `what`.
    pub fn assert_reached(&self, test: &str, what: &str) {
        let (runs, hits) = (self.runs.load(SeqCst), self.hits.load(SeqCst));
        eprintln!("{test}: {hits} of {runs} schedules reached {what}");
        assert!(hits > 0, "{test}: no schedule reached {what}");
    }
}

/// Runs `body` for `schedules` PCT schedules (few preemptions, where most
/// races show) and as many random ones, and asserts that some of them
/// reached the race `what`.
pub fn explore(test: &str, what: &str, schedules: usize, body: fn(&Reached)) {
    let reached = Arc::new(Reached::default());
    let r = Arc::clone(&reached);
    shuttle::check_pct(move || body(&r), schedules, 3);
    let r = Arc::clone(&reached);
    shuttle::check_random(move || body(&r), schedules);
    reached.assert_reached(test, what);
}
