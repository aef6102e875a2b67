//! Block devices behind one trait: where bytes live (a file, a block device,
//! RAM; a remote NBD export is `arcache-remote`'s) apart from how they behave under test (slow,
//! faulty, counted), which decorators add around any device; and the IO
//! engine (`uring`) through which reads of devices that hand out an
//! O_DIRECT descriptor skip a blocking thread.

use std::mem::MaybeUninit;

mod counting;
mod crash;
mod error;
mod faulty;
mod file;
pub mod le;
mod lock;
mod mem;
pub mod owner;
mod slow;
pub mod uring;
pub mod vectored;

pub use counting::{CountingDev, IoCounts};
pub use crash::CrashDev;
pub use error::{DevError, DevResult};
pub use faulty::{FaultPlan, FaultyDev};
pub use file::{AlignedBuf, FileDev, FileDevOptions};
pub use lock::{current_holder, lock_holders, DevLock};
pub use mem::MemDev;
pub use slow::{SlowDev, SlowDevConfig};

/// What a range of a store holds, as far as the store can tell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alloc {
    /// Allocated, or not known to be a hole: contents unknown.
    Data,
    /// Not allocated: reads as zeroes.
    Hole,
    /// Allocated, and reads as zeroes.
    Zero,
}

/// A random-access store of `size()` bytes. Implementations are shared
/// between threads; every call may block.
pub trait BlockDev: Send + Sync {
    fn size(&self) -> u64;

    /// Fills `buf` from `offset`. The range must lie within the device.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> DevResult<()>;

    fn write_at(&self, buf: &[u8], offset: u64) -> DevResult<()>;

    /// Makes every completed write durable, whoever issued it.
    fn flush(&self) -> DevResult<()>;

    /// Tells the device a range is unused; its contents become unspecified.
    fn trim(&self, _offset: u64, _len: u64) -> DevResult<()> {
        Ok(())
    }

    /// Makes a range read as zeroes.
    fn write_zeroes(&self, offset: u64, len: u64) -> DevResult<()> {
        write_zeroes_by_writing(self, offset, len)
    }

    /// True when [`BlockDev::zero_fast`] can zero a range without writing
    /// the zeroes (asked before a cache changes anything for it).
    fn zeroes_fast(&self) -> bool {
        false
    }

    /// Makes a range read as zeroes without writing them: a hole punched
    /// (`keep_allocated` false) or an extent marked zero in place (true).
    /// Where that cannot be done, fails with `Unsupported` and changes
    /// nothing.
    fn zero_fast(&self, _offset: u64, _len: u64, _keep_allocated: bool) -> DevResult<()> {
        Err(DevError::Unsupported(format!("fast zeroing on {}", self.describe())))
    }

    /// Which parts of `[offset, offset+len)` hold data and which are holes
    /// (read as zeroes), in order from `offset`; may stop short of `len`
    /// after many extents. The default, all data, is always true.
    fn allocation(&self, _offset: u64, len: u64) -> DevResult<Vec<(u64, Alloc)>> {
        Ok(vec![(len, Alloc::Data)])
    }

    /// A name for logs and errors.
    fn describe(&self) -> String;

    /// What this store is, stable across restarts and different for a
    /// different store (the intent log binds its writes to it).
    fn identity(&self) -> String {
        self.describe()
    }

    /// What a persistent cache binds its copies of this store's bytes to:
    /// the identity, and for a store other servers may change while this
    /// one is stopped (and that can tell), a version of its contents: as
    /// found at open, then as this handle's own changes move it, so that a
    /// later open finds the same value only if nobody else changed the
    /// store since. A store whose value is its identity never changes it.
    fn contents_identity(&self) -> String {
        self.identity()
    }

    fn is_read_only(&self) -> bool {
        false
    }

    /// True if `flush` covers writes done through other connections or
    /// handles too; NBD multi-connection safety rests on it.
    fn flush_covers_all_handles(&self) -> bool {
        true
    }

    /// A descriptor that reads this store's bytes at their own offsets,
    /// bypassing the page cache (O_DIRECT: aligned buffers, offsets and
    /// lengths), for callers that queue reads to the kernel themselves
    /// (io_uring). `None` when reads must go through [`BlockDev::read_at`]:
    /// decorators, memory, remote stores, buffered files.
    fn direct_read_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }

    /// The unit this store is best written in, when a write of part of one
    /// costs as much as the whole (an object store's chunk: a part is a
    /// read, a patch and a put of the whole chunk). Writers that hold many
    /// changes (a txg) group them by unit and hand each group to
    /// [`BlockDev::write_parts`]. `None`: any write is fine.
    fn write_unit(&self) -> Option<u64> {
        None
    }

    /// The size this store is best read in once a reader is known to want
    /// what follows (a sequential stream): a store whose every request
    /// costs a round trip of its own (an object store's GET) serves one
    /// large read far faster than the same bytes in many small ones.
    /// Readers of a stream widen their misses to whole units, aligned to
    /// multiples of it. `None`: small reads cost no more than their bytes.
    fn read_unit(&self) -> Option<u64> {
        None
    }

    /// Why the store is no longer the one its cached records came from
    /// (an S3 object replaced underneath), once it knows: from then on the
    /// export answers every read EIO, cached or not, rather than serve
    /// the old version. `None`: as far as it knows, unchanged.
    fn changed(&self) -> Option<String> {
        None
    }

    /// Gives back what this handle holds so that it alone writes the store
    /// (an object store disk's lease, an RBD image's exclusive lock), for
    /// a clean stop once every write it took is durable there: another
    /// server may take the store at once. Writes through this handle fail
    /// afterwards. A store that holds nothing of the kind does nothing.
    fn release(&self) -> DevResult<()> {
        Ok(())
    }

    /// Writes several `(offset, bytes)` parts, which a caller that asked
    /// [`BlockDev::write_unit`] gives one unit at a time; a store whose
    /// unit is costly writes each unit once. Parts do not overlap.
    fn write_parts(&self, parts: &[(u64, &[u8])]) -> DevResult<()> {
        parts.iter().try_for_each(|&(offset, data)| self.write_at(data, offset))
    }

    /// Whether [`BlockDev::read_scattered`] fills many buffers with one
    /// request: a reader of several records then reads them straight into
    /// their own buffers instead of through one buffer and a copy each.
    fn scatters_reads(&self) -> bool {
        false
    }

    /// Reads from `offset` into `bufs`, back to back; on success every byte
    /// of every buffer has been written. The default reads each buffer on
    /// its own (a request each): callers ask [`BlockDev::scatters_reads`]
    /// first.
    fn read_scattered(&self, bufs: &mut [&mut [MaybeUninit<u8>]], offset: u64) -> DevResult<()> {
        let mut at = offset;
        for b in bufs.iter_mut() {
            let len = b.len() as u64;
            self.read_at(initialized(b), at)?;
            at += len;
        }
        Ok(())
    }

    /// Hands the store whoever caches its bytes, for a store another
    /// server changes while this one reads it (a read-only server of a
    /// chunked S3 disk following its writer): it tells `watcher` what
    /// changed. Stores nobody else changes ignore it.
    fn watch_changes(&self, _watcher: std::sync::Arc<dyn ChangeWatcher>) {}

    /// Stops telling the watcher anything, once a change it was telling
    /// is done: for a server that stops, before its caches close.
    fn stop_watching(&self) {}
}

/// What a store another server changes tells the cache in front of it.
/// Both calls may block; neither is made from inside a `read_at` that
/// holds the cache's locks of the range it reads, except
/// `before_first_change`, which takes none of them.
pub trait ChangeWatcher: Send + Sync {
    /// Once, before the first change the store lets this server see (the
    /// first byte of new contents read included): whatever the cache
    /// keeps across restarts must stop vouching for the store as it was.
    fn before_first_change(&self);

    /// Bytes `[offset, offset + len)` now read differently: nothing cached
    /// of them may be served again, nor come back after a restart.
    fn changed(&self, offset: u64, len: u64);
}

/// The failure a named fail point injects (`fail::fail_point!(NAME, |_|
/// injected(NAME, offset))`, armed in fault-test builds only).
pub fn injected<T>(op: &'static str, offset: u64) -> DevResult<T> {
    Err(DevError::Injected { op, offset })
}

/// Checks that `[offset, offset+len)` lies within a device of `size` bytes.
pub fn check_range(size: u64, offset: u64, len: u64) -> DevResult<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(DevError::OutOfRange { offset, len, size }),
    }
}

/// The fallback for devices with no native zeroing: plain writes of zeroes.
pub fn write_zeroes_by_writing<D: BlockDev + ?Sized>(dev: &D, offset: u64, len: u64) -> DevResult<()> {
    const CHUNK: u64 = 1 << 20;
    let zeroes = vec![0u8; CHUNK.min(len) as usize];
    let mut done = 0;
    while done < len {
        let n = CHUNK.min(len - done);
        dev.write_at(&zeroes[..n as usize], offset + done)?;
        done += n;
    }
    Ok(())
}

/// `buf` zeroed, as plain bytes a read may be given.
fn initialized(buf: &mut [MaybeUninit<u8>]) -> &mut [u8] {
    for x in buf.iter_mut() {
        x.write(0);
    }
    // SAFETY: every byte was just written; MaybeUninit<u8> and u8 have the
    // same layout.
    unsafe { &mut *(buf as *mut [MaybeUninit<u8>] as *mut [u8]) }
}

/// The store's hints a decorator passes through unchanged: how it is best
/// addressed (`write_unit`, `read_unit`), whether it changed underneath
/// (`changed`) and what the log and the L2 bind to (`identity`,
/// `contents_identity`). `write_parts` is left to the default on purpose, so each
/// part still goes through the decorator's own `write_at` (its counting,
/// delay or faults). Used inside a decorator's `impl BlockDev` whose inner
/// store is the field `inner`.
#[macro_export]
macro_rules! forward_store_hints {
    () => {
        fn write_unit(&self) -> Option<u64> {
            self.inner.write_unit()
        }
        fn read_unit(&self) -> Option<u64> {
            self.inner.read_unit()
        }
        fn changed(&self) -> Option<String> {
            self.inner.changed()
        }
        fn identity(&self) -> String {
            self.inner.identity()
        }
        fn contents_identity(&self) -> String {
            self.inner.contents_identity()
        }
        fn watch_changes(&self, watcher: std::sync::Arc<dyn $crate::ChangeWatcher>) {
            self.inner.watch_changes(watcher)
        }
        fn stop_watching(&self) {
            self.inner.stop_watching()
        }
        fn release(&self) -> DevResult<()> {
            self.inner.release()
        }
    };
}

impl<T: BlockDev + ?Sized> BlockDev for std::sync::Arc<T> {
    fn size(&self) -> u64 {
        (**self).size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> DevResult<()> {
        (**self).read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> DevResult<()> {
        (**self).write_at(buf, offset)
    }
    fn flush(&self) -> DevResult<()> {
        (**self).flush()
    }
    fn trim(&self, offset: u64, len: u64) -> DevResult<()> {
        (**self).trim(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> DevResult<()> {
        (**self).write_zeroes(offset, len)
    }
    fn zeroes_fast(&self) -> bool {
        (**self).zeroes_fast()
    }
    fn zero_fast(&self, offset: u64, len: u64, keep_allocated: bool) -> DevResult<()> {
        (**self).zero_fast(offset, len, keep_allocated)
    }
    fn allocation(&self, offset: u64, len: u64) -> DevResult<Vec<(u64, Alloc)>> {
        (**self).allocation(offset, len)
    }
    fn describe(&self) -> String {
        (**self).describe()
    }
    fn identity(&self) -> String {
        (**self).identity()
    }
    fn contents_identity(&self) -> String {
        (**self).contents_identity()
    }
    fn is_read_only(&self) -> bool {
        (**self).is_read_only()
    }
    fn flush_covers_all_handles(&self) -> bool {
        (**self).flush_covers_all_handles()
    }
    fn direct_read_fd(&self) -> Option<std::os::fd::RawFd> {
        (**self).direct_read_fd()
    }
    fn write_unit(&self) -> Option<u64> {
        (**self).write_unit()
    }
    fn read_unit(&self) -> Option<u64> {
        (**self).read_unit()
    }
    fn changed(&self) -> Option<String> {
        (**self).changed()
    }
    fn release(&self) -> DevResult<()> {
        (**self).release()
    }
    fn write_parts(&self, parts: &[(u64, &[u8])]) -> DevResult<()> {
        (**self).write_parts(parts)
    }
    fn scatters_reads(&self) -> bool {
        (**self).scatters_reads()
    }
    fn read_scattered(&self, bufs: &mut [&mut [MaybeUninit<u8>]], offset: u64) -> DevResult<()> {
        (**self).read_scattered(bufs, offset)
    }
    fn watch_changes(&self, watcher: std::sync::Arc<dyn ChangeWatcher>) {
        (**self).watch_changes(watcher)
    }
    fn stop_watching(&self) {
        (**self).stop_watching()
    }
}
