use std::time::Duration;

use parking_lot::{Condvar, Mutex};

use crate::{Alloc, BlockDev, DevResult};

/// How slow a [`SlowDev`] is: a model of an array of spinning disks.
#[derive(Debug, Clone, Copy)]
pub struct SlowDevConfig {
    /// Fixed cost of every request (seek plus rotation).
    pub latency: Duration,
    /// How many requests the array serves at once (its spindles).
    pub parallelism: usize,
    /// Aggregate transfer rate in bytes per second, shared by the spindles.
    pub bandwidth: u64,
}

impl SlowDevConfig {
    /// Time one request of `len` bytes occupies a spindle.
    pub fn service_time(&self, len: u64) -> Duration {
        let per_spindle = (self.bandwidth / self.parallelism.max(1) as u64).max(1);
        self.latency + Duration::from_secs_f64(len as f64 / per_spindle as f64)
    }
}

/// Wraps a device so every request waits for a spindle and then for its
/// service time; flushes are not delayed (a battery-backed controller).
pub struct SlowDev<D> {
    inner: D,
    cfg: SlowDevConfig,
    busy: Mutex<usize>,
    freed: Condvar,
}

impl<D: BlockDev> SlowDev<D> {
    pub fn new(inner: D, cfg: SlowDevConfig) -> Self {
        SlowDev { inner, cfg, busy: Mutex::new(0), freed: Condvar::new() }
    }

    fn occupy(&self, len: u64) {
        let mut busy = self.busy.lock();
        while *busy >= self.cfg.parallelism.max(1) {
            self.freed.wait(&mut busy);
        }
        *busy += 1;
        drop(busy);
        std::thread::sleep(self.cfg.service_time(len));
        *self.busy.lock() -= 1;
        self.freed.notify_one();
    }
}

impl<D: BlockDev> BlockDev for SlowDev<D> {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> DevResult<()> {
        self.occupy(buf.len() as u64);
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> DevResult<()> {
        self.occupy(buf.len() as u64);
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> DevResult<()> {
        self.inner.flush()
    }
    fn trim(&self, offset: u64, len: u64) -> DevResult<()> {
        self.occupy(0);
        self.inner.trim(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> DevResult<()> {
        self.occupy(0);
        self.inner.write_zeroes(offset, len)
    }
    fn zeroes_fast(&self) -> bool {
        self.inner.zeroes_fast()
    }
    fn zero_fast(&self, offset: u64, len: u64, keep_allocated: bool) -> DevResult<()> {
        self.inner.zero_fast(offset, len, keep_allocated)
    }
    fn allocation(&self, offset: u64, len: u64) -> DevResult<Vec<(u64, Alloc)>> {
        self.inner.allocation(offset, len)
    }
    fn describe(&self) -> String {
        format!("slow({})", self.inner.describe())
    }
    fn is_read_only(&self) -> bool {
        self.inner.is_read_only()
    }
    fn flush_covers_all_handles(&self) -> bool {
        self.inner.flush_covers_all_handles()
    }
    crate::forward_store_hints!();
}
