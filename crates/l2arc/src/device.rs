//! One L2 device as a rotary log: batches are written one after another at
//! the write hand; when the hand reaches the end it wraps to the start, and
//! whatever a new batch would overwrite is evicted first.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use arcache_sync::atomic::{AtomicBool, AtomicU32};
use arcache_sync::Mutex;
use blockdev::{BlockDev, DevResult};
use serde::Serialize;

arcache_sync::thread_local! {
    /// Each thread's aligned buffer for L2 reads.
    static READ_BUF: std::cell::RefCell<Option<blockdev::AlignedBuf>> = const { std::cell::RefCell::new(None) };
}

/// The first MiB of every device is kept for its header (persistent L2ARC).
pub const HEADER_RESERVED: u64 = 1 << 20;
/// Failed reads or writes in a row (IO errors or bad data) that take a
/// device out of service.
pub const FAILURES_TO_RETIRE: u32 = 8;

/// Batches start and end on this boundary, so O_DIRECT can write them.
pub const ALIGN: u64 = 4096;
/// A device smaller than this is refused: too small to be worth a log.
pub const MIN_DEVICE: u64 = HEADER_RESERVED + (4 << 20);

/// Keys written by one batch, to find their index entries when the hand
/// comes round again.
#[derive(Debug)]
pub struct Batch {
    pub end: u64,
    pub keys: Box<[u64]>,
}

/// The write hand is kept as a log position (`lpos`, docs/format.md): bytes
/// advanced since the device's incarnation began, wrap skips included, so
/// the address is `start + lpos % capacity` and "overwritten since" is
/// arithmetic.
#[derive(Debug)]
struct Ring {
    hand_lpos: u64,
    /// Anything below this lpos may have been overwritten (or is about to be).
    floor: u64,
    batches: BTreeMap<u64, Batch>,
    batch_key_bytes: u64,
}

/// Per-device counters, reported by `arcache stat`.
#[derive(Debug, Default, Serialize)]
pub struct DeviceStats {
    pub reads: AtomicU64,
    pub read_bytes: AtomicU64,
    pub writes: AtomicU64,
    pub write_bytes: AtomicU64,
    pub io_errors: AtomicU64,
    pub cksum_bad: AtomicU64,
    pub evicted: AtomicU64,
}

/// Buffers for records read whole from a device, of any contents (the
/// read overwrites every byte): the engine's buffers of records the ARC
/// evicted, which are in memory already.
pub trait BufSource: Send + Sync {
    fn uninit(&self, len: usize) -> Box<[std::mem::MaybeUninit<u8>]>;

    /// A boxed copy of `data` in one of the source's buffers.
    fn copy_of(&self, data: &[u8]) -> Box<[u8]> {
        let mut b = self.uninit(data.len());
        for (to, &from) in b.iter_mut().zip(data) {
            to.write(from);
        }
        // SAFETY: `b` has `data.len()` elements and the loop wrote each.
        unsafe { b.assume_init() }
    }
}

pub struct L2Device {
    pub path: String,
    dev: Arc<dyn BlockDev>,
    start: u64,
    end: u64,
    ring: Mutex<Ring>,
    pub stats: DeviceStats,
    /// Set by whichever thread saw the last failure, read by every reader
    /// and the feed: arcache-sync's, so shuttle sees the hand-over.
    degraded: AtomicBool,
    consecutive_errors: AtomicU32,
}

/// A region taken from the ring, and what had to be evicted for it.
pub struct Reservation {
    pub offset: u64,
    pub lpos: u64,
    pub evicted: Vec<(u64, Batch)>,
}

impl L2Device {
    pub fn new(path: String, dev: Arc<dyn BlockDev>) -> Result<L2Device, String> {
        let size = dev.size();
        if size < MIN_DEVICE {
            return Err(format!(
                "{path}: {size} bytes is too small for an L2 device (at least {MIN_DEVICE})"
            ));
        }
        let end = size / ALIGN * ALIGN;
        Ok(L2Device {
            path,
            dev,
            start: HEADER_RESERVED,
            end,
            ring: Mutex::new(Ring { hand_lpos: 0, floor: 0, batches: BTreeMap::new(), batch_key_bytes: 0 }),
            stats: DeviceStats::default(),
            degraded: AtomicBool::new(false),
            consecutive_errors: AtomicU32::new(0),
        })
    }

    /// Bytes available for cached data.
    pub fn capacity(&self) -> u64 {
        self.end - self.start
    }

    pub fn hand(&self) -> u64 {
        self.addr(self.ring.lock().hand_lpos)
    }

    pub fn hand_lpos(&self) -> u64 {
        self.ring.lock().hand_lpos
    }

    /// Log positions below this may have been overwritten.
    pub fn floor(&self) -> u64 {
        self.ring.lock().floor
    }

    pub fn wrapped(&self) -> bool {
        self.ring.lock().hand_lpos >= self.capacity()
    }

    /// The device address of a log position.
    pub fn addr(&self, lpos: u64) -> u64 {
        self.start + lpos % self.capacity()
    }

    pub fn start(&self) -> u64 {
        self.start
    }

    pub fn size(&self) -> u64 {
        self.dev.size()
    }

    /// Sets the hand of a device whose log is being restored: nothing may
    /// be written below `lpos`, and below `lpos - capacity` nothing is live.
    pub fn restore_hand(&self, lpos: u64) {
        let mut r = self.ring.lock();
        r.hand_lpos = lpos;
        r.floor = lpos.saturating_sub(self.capacity());
    }

    /// RAM held by the batch key lists.
    pub fn batch_key_bytes(&self) -> u64 {
        self.ring.lock().batch_key_bytes
    }

    pub fn is_degraded(&self) -> bool {
        self.degraded.load(Relaxed)
    }

    /// Takes the device out of service whatever its error count: its log
    /// or header could not be written, so nothing on it may be trusted.
    pub(crate) fn take_out_of_service(&self) {
        self.degraded.store(true, Relaxed);
    }

    /// Takes `len` bytes at the hand (wrapping if they do not fit before the
    /// end) plus `ahead` more to keep clear, evicting every batch that
    /// overlaps. `len` must be a multiple of [`ALIGN`].
    pub fn reserve(&self, len: u64, ahead: u64) -> Option<Reservation> {
        assert_eq!(len % ALIGN, 0);
        if len == 0 || len > self.capacity() {
            return None;
        }
        let cap = self.capacity();
        let mut r = self.ring.lock();
        let within = r.hand_lpos % cap;
        if within + len > cap {
            r.hand_lpos += cap - within;
        }
        let lpos = r.hand_lpos;
        let offset = self.addr(lpos);
        let ahead = ahead.min(cap - len);
        r.floor = r.floor.max((lpos + len + ahead).saturating_sub(cap));
        let clear_end = (offset + len + ahead).min(self.end);
        // Batches never overlap each other, so one starting before `offset`
        // can reach into the region only if it is the last such batch.
        let mut doomed: Vec<u64> = r.batches.range(offset..clear_end).map(|(s, _)| *s).collect();
        if let Some((s, b)) = r.batches.range(..offset).next_back() {
            if b.end > offset {
                doomed.push(*s);
            }
        }
        let mut evicted = Vec::with_capacity(doomed.len());
        for s in doomed {
            if let Some(b) = r.batches.remove(&s) {
                r.batch_key_bytes -= (b.keys.len() * 8) as u64;
                evicted.push((s, b));
            }
        }
        r.hand_lpos = lpos + len;
        Some(Reservation { offset, lpos, evicted })
    }

    /// Records that a batch with `keys` now lives at `offset..offset+len`.
    pub fn commit(&self, offset: u64, len: u64, keys: Vec<u64>) {
        let keys = keys.into_boxed_slice();
        let mut r = self.ring.lock();
        r.batch_key_bytes += (keys.len() * 8) as u64;
        r.batches.insert(offset, Batch { end: offset + len, keys });
    }

    /// Forgets every batch (the device is taken out of service or emptied);
    /// returns them so their index entries can be dropped.
    pub fn clear(&self) -> Vec<(u64, Batch)> {
        let mut r = self.ring.lock();
        r.batch_key_bytes = 0;
        std::mem::take(&mut r.batches).into_iter().collect()
    }

    /// Writes a batch, `parts` back to back from `offset`, in one call: its
    /// records from where they lie in RAM where they can be (one
    /// `pwritev` on an O_DIRECT device), the rest from the staging buffer.
    /// An O_DIRECT write of megabytes already reaches the device as several
    /// requests in flight; writing it as threads of 2 MiB each, spawned per
    /// batch, made the feed wait for them to be scheduled on a host whose
    /// cores a cold stream kept busy, and the feed fell behind the stream
    /// (bench/README.md, the claims).
    pub fn write_vectored(&self, offset: u64, parts: &[&[u8]]) -> DevResult<()> {
        fail::fail_point!("l2.write", |_| blockdev::injected("l2.write", offset));
        let len: u64 = parts.iter().map(|p| p.len() as u64).sum();
        self.stats.writes.fetch_add(1, Relaxed);
        self.stats.write_bytes.fetch_add(len, Relaxed);
        let mut at = offset;
        let placed: Vec<(u64, &[u8])> = parts
            .iter()
            .map(|p| {
                let part = (at, *p);
                at += p.len() as u64;
                part
            })
            .collect();
        self.dev.write_parts(&placed)
    }

    /// The aligned superset of `len` bytes at `daddr` a read must fetch:
    /// its start, its length and where the wanted bytes begin in it.
    /// Counted as a read of `len` bytes.
    pub fn aligned_extent(&self, daddr: u64, len: u64) -> (u64, usize, usize) {
        let lo = daddr / ALIGN * ALIGN;
        let hi = ((daddr + len).div_ceil(ALIGN) * ALIGN).min(self.end);
        self.stats.reads.fetch_add(1, Relaxed);
        self.stats.read_bytes.fetch_add(len, Relaxed);
        (lo, (hi - lo) as usize, (daddr - lo) as usize)
    }

    /// A descriptor reading this device O_DIRECT, if it has one.
    pub fn direct_read_fd(&self) -> Option<std::os::fd::RawFd> {
        self.dev.direct_read_fd()
    }

    /// Reads records lying back to back from `daddr`, `lens` bytes each,
    /// straight into a buffer of its own each (one `preadv`), so the
    /// caller keeps them without the copy out of one run buffer that
    /// [`L2Device::read_with`] needs. `Ok(None)` when this device or these
    /// buffers cannot take it (no O_DIRECT descriptor, an address, length
    /// or buffer not aligned); the caller then reads through `read_with`.
    /// The buffers come from `source` when given (the cache's buffers of
    /// evicted records), else new ones.
    pub fn read_records(
        &self,
        daddr: u64,
        lens: &[u64],
        source: Option<&dyn BufSource>,
    ) -> DevResult<Option<Vec<Box<[u8]>>>> {
        let Some(fd) = self.dev.direct_read_fd() else { return Ok(None) };
        let total: u64 = lens.iter().sum();
        if !daddr.is_multiple_of(ALIGN) || lens.iter().any(|l| *l == 0 || !l.is_multiple_of(ALIGN)) {
            return Ok(None);
        }
        let mut bufs: Vec<Box<[std::mem::MaybeUninit<u8>]>> = Vec::with_capacity(lens.len());
        for &l in lens {
            let b = match source {
                Some(s) => s.uninit(l as usize),
                None => Box::new_uninit_slice(l as usize),
            };
            // Whole pages come page-aligned from the server's allocator
            // (mimalloc); another allocator may not place them so, and
            // then the first such buffer ends the attempt.
            if !(b.as_ptr() as usize).is_multiple_of(ALIGN as usize) {
                return Ok(None);
            }
            bufs.push(b);
        }
        // Here, not first: a read that goes through `read_with` instead
        // meets the fail point there, once.
        fail::fail_point!("l2.read", |_| blockdev::injected("l2.read", daddr));
        self.stats.reads.fetch_add(1, Relaxed);
        self.stats.read_bytes.fetch_add(total, Relaxed);
        let mut views: Vec<&mut [std::mem::MaybeUninit<u8>]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
        blockdev::vectored::preadv_all(fd, &mut views, daddr).map_err(|source| blockdev::DevError::Io {
            op: "read",
            dev: self.path.clone(),
            offset: daddr,
            len: total,
            source,
        })?;
        // SAFETY: preadv_all returned Ok, so the kernel wrote every byte of
        // every buffer.
        Ok(Some(bufs.into_iter().map(|b| unsafe { b.assume_init() }).collect()))
    }

    /// Reads `len` bytes at `daddr` through an aligned superset, so an
    /// O_DIRECT device serves it without a bounce through the page cache,
    /// and hands them to `f`. The aligned buffer is the calling thread's
    /// own and reused: a fresh megabyte per read would cost page faults.
    pub fn read_with<T>(&self, daddr: u64, len: u64, f: impl FnOnce(&[u8]) -> T) -> DevResult<T> {
        fail::fail_point!("l2.read", |_| blockdev::injected("l2.read", daddr));
        let (lo, need, from) = self.aligned_extent(daddr, len);
        READ_BUF.with(|cell| {
            let mut buf = cell.borrow_mut();
            if buf.as_ref().is_none_or(|b| b.capacity() < need) {
                *buf = Some(blockdev::AlignedBuf::new(need.max(64 << 10)));
            }
            let b = buf.as_mut().expect("just filled");
            let slice = &mut b.as_mut_slice()[..need];
            self.dev.read_at(slice, lo)?;
            Ok(f(&slice[from..from + len as usize]))
        })
    }

    /// Writes metadata (a header copy or a log block) at `offset`, through
    /// an aligned copy so an O_DIRECT device takes it.
    pub fn write_meta(&self, offset: u64, bytes: &[u8]) -> DevResult<()> {
        let mut buf = blockdev::AlignedBuf::new(bytes.len().div_ceil(ALIGN as usize) * ALIGN as usize);
        buf.as_mut_slice()[..bytes.len()].copy_from_slice(bytes);
        self.dev.write_at(buf.as_slice(), offset)
    }

    /// Reads metadata at `offset` into an owned buffer.
    pub fn read_meta(&self, offset: u64, len: usize) -> DevResult<Vec<u8>> {
        let mut buf = blockdev::AlignedBuf::new(len.div_ceil(ALIGN as usize) * ALIGN as usize);
        self.dev.read_at(buf.as_mut_slice(), offset)?;
        Ok(buf.as_slice()[..len].to_vec())
    }

    pub fn flush(&self) -> DevResult<()> {
        self.dev.flush()
    }

    /// Registers records restored from the log at `lpos..lpos+len` if the
    /// hand has not overwritten them since and they overlap nothing known.
    pub fn register_restored(&self, lpos: u64, len: u64, keys: Vec<u64>) -> bool {
        let cap = self.capacity();
        if len == 0 || lpos % cap + len > cap {
            return false;
        }
        let offset = self.addr(lpos);
        let end = offset + len;
        let mut r = self.ring.lock();
        if lpos < r.floor || lpos + len > r.hand_lpos {
            return false;
        }
        let before = r.batches.range(..end).next_back();
        if before.is_some_and(|(_, b)| b.end > offset) {
            return false;
        }
        r.batch_key_bytes += (keys.len() * 8) as u64;
        r.batches.insert(offset, Batch { end, keys: keys.into_boxed_slice() });
        true
    }

    /// Punches out a region ahead of the hand (`l2arc_trim_ahead`).
    pub fn trim(&self, offset: u64, len: u64) -> DevResult<()> {
        self.dev.trim(offset, len.min(self.end.saturating_sub(offset)))
    }

    /// Notes an IO error; returns true when this one takes the device out
    /// of service (several failures in a row).
    pub fn note_error(&self) -> bool {
        self.stats.io_errors.fetch_add(1, Relaxed);
        self.note_failure()
    }

    /// Notes a read whose bytes failed verification: a device that keeps
    /// returning wrong data is failing as surely as one returning errors.
    pub fn note_bad_data(&self) -> bool {
        self.note_failure()
    }

    fn note_failure(&self) -> bool {
        let n = self.consecutive_errors.fetch_add(1, Relaxed) + 1;
        n >= FAILURES_TO_RETIRE && !self.degraded.swap(true, Relaxed)
    }

    pub fn note_success(&self) {
        self.consecutive_errors.store(0, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use blockdev::MemDev;

    fn device(mib: u64) -> L2Device {
        L2Device::new("t".into(), Arc::new(MemDev::new(HEADER_RESERVED + (mib << 20)))).unwrap()
    }

    #[test]
    fn wraps_and_evicts_by_overlap_not_by_age() {
        let d = device(16);
        let cap = d.capacity();
        let a = 6 << 20;
        let r1 = d.reserve(a, 0).unwrap();
        d.commit(r1.offset, a, vec![1]);
        let r2 = d.reserve(a, 0).unwrap();
        d.commit(r2.offset, a, vec![2]);
        // 12 of 16 MiB used; 6 more do not fit: wrap, evict batch 1 only.
        let r3 = d.reserve(a, 0).unwrap();
        assert_eq!(r3.offset, HEADER_RESERVED);
        assert_eq!(r3.evicted.iter().flat_map(|(_, b)| b.keys.iter().copied()).collect::<Vec<_>>(), vec![1]);
        d.commit(r3.offset, a, vec![3]);
        // Next: 6 MiB at 6 MiB overlaps batch 2.
        let r4 = d.reserve(a, 0).unwrap();
        assert_eq!(r4.evicted.iter().flat_map(|(_, b)| b.keys.iter().copied()).collect::<Vec<_>>(), vec![2]);
        d.commit(r4.offset, a, vec![4]);
        // Wrap again: batch 3 at the start must go even though an older
        // batch (none here) or a newer one sits elsewhere.
        let r5 = d.reserve(a, 0).unwrap();
        assert_eq!(r5.offset, HEADER_RESERVED);
        assert_eq!(r5.evicted.iter().flat_map(|(_, b)| b.keys.iter().copied()).collect::<Vec<_>>(), vec![3]);
        assert!(d.reserve(cap + ALIGN, 0).is_none());
    }

    #[test]
    fn evict_ahead_clears_more_than_the_batch() {
        let d = device(16);
        for k in 0..4 {
            let r = d.reserve(4 << 20, 0).unwrap();
            d.commit(r.offset, 4 << 20, vec![k]);
        }
        let r = d.reserve(1 << 20, 4 << 20).unwrap();
        let keys: Vec<u64> = r.evicted.iter().flat_map(|(_, b)| b.keys.iter().copied()).collect();
        assert_eq!(keys, vec![0, 1], "the batch under the hand and the next one");
    }
}
