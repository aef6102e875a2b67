use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::{Alloc, BlockDev, DevResult};

/// A snapshot of what a [`CountingDev`] has seen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IoCounts {
    pub reads: u64,
    pub read_bytes: u64,
    pub writes: u64,
    pub write_bytes: u64,
    pub flushes: u64,
    pub trims: u64,
    pub zeroes: u64,
}

/// Counts the requests that reach the device below it.
pub struct CountingDev<D> {
    inner: D,
    reads: AtomicU64,
    read_bytes: AtomicU64,
    writes: AtomicU64,
    write_bytes: AtomicU64,
    flushes: AtomicU64,
    trims: AtomicU64,
    zeroes: AtomicU64,
}

impl<D: BlockDev> CountingDev<D> {
    pub fn new(inner: D) -> Self {
        CountingDev {
            inner,
            reads: AtomicU64::new(0),
            read_bytes: AtomicU64::new(0),
            writes: AtomicU64::new(0),
            write_bytes: AtomicU64::new(0),
            flushes: AtomicU64::new(0),
            trims: AtomicU64::new(0),
            zeroes: AtomicU64::new(0),
        }
    }

    pub fn counts(&self) -> IoCounts {
        IoCounts {
            reads: self.reads.load(Relaxed),
            read_bytes: self.read_bytes.load(Relaxed),
            writes: self.writes.load(Relaxed),
            write_bytes: self.write_bytes.load(Relaxed),
            flushes: self.flushes.load(Relaxed),
            trims: self.trims.load(Relaxed),
            zeroes: self.zeroes.load(Relaxed),
        }
    }

    pub fn inner(&self) -> &D {
        &self.inner
    }
}

impl<D: BlockDev> BlockDev for CountingDev<D> {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> DevResult<()> {
        self.reads.fetch_add(1, Relaxed);
        self.read_bytes.fetch_add(buf.len() as u64, Relaxed);
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> DevResult<()> {
        self.writes.fetch_add(1, Relaxed);
        self.write_bytes.fetch_add(buf.len() as u64, Relaxed);
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> DevResult<()> {
        self.flushes.fetch_add(1, Relaxed);
        self.inner.flush()
    }
    fn trim(&self, offset: u64, len: u64) -> DevResult<()> {
        self.trims.fetch_add(1, Relaxed);
        self.inner.trim(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> DevResult<()> {
        self.zeroes.fetch_add(1, Relaxed);
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
        self.inner.describe()
    }
    fn is_read_only(&self) -> bool {
        self.inner.is_read_only()
    }
    fn flush_covers_all_handles(&self) -> bool {
        self.inner.flush_covers_all_handles()
    }
    crate::forward_store_hints!();
}
