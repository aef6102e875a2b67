//! Buffers of evicted records (and of records read that were then kept
//! compressed), handed to the next reads from the backing stores instead
//! of going back to the allocator.
//!
//! The server makes its allocator give freed pages back at once (main.rs:
//! RSS must stay near `arc_max`). On a cold pass every record read evicts
//! one of the same size, so each read's new buffer took pages the
//! allocator had just given back: a page fault and a cleared page for
//! every 4 KiB read, and the unmapping before it (perf of a cold 2 GiB
//! pass from S3 on two cores: 17 % of the server's samples when the GET
//! went straight into buffers allocated ahead of it, 6 % through one
//! shared block buffer and a copy). A buffer kept here is reused as it is.
//!
//! Only whole buffers no reader still holds come here (the cache's own
//! reference was the last, or the record read into it was kept
//! compressed and the buffer was never shared), at most [`RecordBufs::cap`] bytes of them,
//! and no more than reads needed lately ([`WINDOW_MS`]): the RAM they hold
//! is beside the ARC's, and a few units of read-ahead are all a cold pass
//! needs between evictions and reads.

use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Instant;

use arcache_sync::Mutex;

/// Buffers smaller than this are left to the allocator: small records'
/// pages are shared with other allocations and do not go back one by one.
const MIN_LEN: usize = 4096;

/// At most this many bytes are kept, whatever the ARC's size: the eight
/// prefetch threads' units of read-ahead (8 MiB each for an S3 object) are
/// what must find buffers waiting.
const MAX_KEPT: usize = 64 << 20;

/// The pool's size follows what reads needed of it, measured over windows
/// of this many milliseconds: in the window after, it keeps at most how far
/// it fell below its highest (buffers taken faster than evictions gave
/// them) plus what reads asked for and did not find. Reads that take
/// buffers in runs (a stream's 8 MiB units, taken when each GET starts)
/// keep it large; a workload whose reads take one now and then while
/// evictions give many (4K random reads answered from RAM and through the
/// L2 ring) lets it shrink to a few buffers. With only the cap, or only
/// what reads asked for in a window, that job held 56-64 MiB beside a
/// 256 MiB ARC: 3.5-4 KiB more RSS per cached record (`bench/ab-read.sh`'s
/// L2-hit job; bench/README).
const WINDOW_MS: u64 = 1000;

pub(crate) struct RecordBufs {
    kept: Mutex<Kept>,
    /// Buffers handed to reads that were kept ones (`record_bufs_reused`).
    reused: AtomicU64,
    epoch: Instant,
}

impl Default for RecordBufs {
    fn default() -> Self {
        // The first window keeps up to the cap: nothing is known yet.
        let kept = Kept { limit: usize::MAX, ..Kept::default() };
        RecordBufs { kept: Mutex::new(kept), reused: AtomicU64::new(0), epoch: Instant::now() }
    }
}

#[derive(Default)]
struct Kept {
    /// The current window (milliseconds since `epoch` / [`WINDOW_MS`]);
    /// the most bytes kept in it so far, the most the pool has fallen
    /// below that, and the bytes reads asked for and did not find.
    window: u64,
    high: usize,
    fell: usize,
    missed: usize,
    /// At most this many bytes are kept in this window: from the one
    /// before, `fell + missed` (what is kept beyond it is freed when
    /// the window begins).
    limit: usize,
    bytes: usize,
    /// By length: exports of one cache may differ in `recordsize`, and a
    /// record at an export's end is shorter.
    by_len: Vec<(usize, Vec<Box<[u8]>>)>,
}

impl RecordBufs {
    /// How many bytes of buffers are kept for a cache of `arc_max` bytes:
    /// a quarter of it, at most [`MAX_KEPT`]. An eighth (32 MiB for a
    /// 256 MiB ARC) found a kept buffer for 70 % of the records of a cold
    /// pass from S3, a quarter for nearly all: the prefetch threads' units
    /// are taken all at once, when each GET starts.
    pub(crate) fn cap(arc_max: u64) -> usize {
        usize::try_from(arc_max / 4).unwrap_or(usize::MAX).min(MAX_KEPT)
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// Keeps `buf` for a later read if it fits under the cap and what reads
    /// needed in the window before, else frees it. Its bytes are left as
    /// they are: whoever takes it overwrites them.
    pub(crate) fn give(&self, buf: Box<[u8]>, cap: usize) {
        self.give_at(buf, cap, self.now_ms());
    }

    fn give_at(&self, buf: Box<[u8]>, cap: usize, now: u64) {
        let len = buf.len();
        if len < MIN_LEN || !len.is_multiple_of(MIN_LEN) {
            return;
        }
        let mut k = self.kept.lock();
        // Freed after the lock is let go, with `buf` if it is not kept.
        let unneeded = k.roll(now);
        if k.bytes + len <= cap.min(k.limit) {
            k.bytes += len;
            k.high = k.high.max(k.bytes);
            match k.by_len.iter_mut().find(|(l, _)| *l == len) {
                Some((_, v)) => v.push(buf),
                None => k.by_len.push((len, vec![buf])),
            }
        }
        drop(k);
        drop(unneeded);
    }

    /// A kept buffer of exactly `len` bytes, holding some earlier record's
    /// bytes.
    fn take(&self, len: usize) -> Option<Box<[u8]>> {
        self.take_at(len, self.now_ms())
    }

    fn take_at(&self, len: usize, now: u64) -> Option<Box<[u8]>> {
        let mut k = self.kept.lock();
        let unneeded = k.roll(now);
        let Some(buf) = k.by_len.iter_mut().find(|(l, _)| *l == len).and_then(|(_, v)| v.pop()) else {
            k.missed += len;
            drop(k);
            drop(unneeded);
            return None;
        };
        k.bytes -= len;
        k.fell = k.fell.max(k.high - k.bytes);
        drop(k);
        drop(unneeded);
        self.reused.fetch_add(1, Relaxed);
        Some(buf)
    }

    /// A boxed copy of `data`, in a kept buffer when one fits.
    pub(crate) fn copy_of(&self, data: &[u8]) -> Box<[u8]> {
        match self.take(data.len()) {
            Some(mut buf) => {
                buf.copy_from_slice(data);
                buf
            }
            None => data.into(),
        }
    }

    /// Bytes kept now (`record_bufs_size`).
    pub(crate) fn kept_bytes(&self) -> usize {
        self.kept.lock().bytes
    }

    pub(crate) fn reused(&self) -> u64 {
        self.reused.load(Relaxed)
    }
}

impl arcache_l2::BufSource for RecordBufs {
    fn uninit(&self, len: usize) -> Box<[MaybeUninit<u8>]> {
        RecordBufs::uninit(self, len)
    }

    fn copy_of(&self, data: &[u8]) -> Box<[u8]> {
        RecordBufs::copy_of(self, data)
    }
}

impl RecordBufs {
    /// A buffer of `len` bytes for a read to fill (from a backing store or
    /// L2): a kept one, else a new one. Its contents are unspecified either
    /// way.
    pub(crate) fn uninit(&self, len: usize) -> Box<[MaybeUninit<u8>]> {
        match self.take(len) {
            Some(buf) => {
                // SAFETY: `MaybeUninit<u8>` has the size, alignment and
                // layout of `u8`, so a boxed `[u8]` is a valid boxed
                // `[MaybeUninit<u8>]` of the same length; the allocation
                // is handed over whole.
                unsafe { Box::from_raw(Box::into_raw(buf) as *mut [MaybeUninit<u8>]) }
            }
            None => Box::new_uninit_slice(len),
        }
    }
}

impl Kept {
    /// Moves on to the window `now` falls in: sets its limit from the
    /// window before and takes out what is kept beyond it, to be freed.
    #[must_use]
    fn roll(&mut self, now: u64) -> Vec<Box<[u8]>> {
        let w = now / WINDOW_MS;
        if w == self.window {
            return Vec::new();
        }
        // A window with nothing taken or given needed nothing, and then
        // neither does a window after a gap of such windows.
        self.limit = if w == self.window + 1 { self.fell + self.missed } else { 0 };
        self.window = w;
        self.missed = 0;
        let mut out = Vec::new();
        for (len, v) in self.by_len.iter_mut() {
            while self.bytes > self.limit {
                let Some(b) = v.pop() else { break };
                self.bytes -= *len;
                out.push(b);
            }
        }
        self.high = self.bytes;
        self.fell = 0;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_given_buffer_is_the_next_one_of_its_length() {
        let bufs = RecordBufs::default();
        let buf: Box<[u8]> = vec![1u8; 16384].into();
        let at = buf.as_ptr();
        bufs.give(buf, 1 << 20);
        assert_eq!(bufs.kept_bytes(), 16384);
        // Another length does not take it.
        let other = bufs.uninit(8192);
        assert_ne!(other.as_ptr().cast::<u8>(), at);
        let same = bufs.uninit(16384);
        assert_eq!(same.as_ptr().cast::<u8>(), at, "not reused");
        assert_eq!(bufs.kept_bytes(), 0);
        // Nothing kept (and `same` still held): a new buffer.
        let new = bufs.uninit(16384);
        assert_ne!(new.as_ptr().cast::<u8>(), at);
        assert_eq!(bufs.reused(), 1);
    }

    #[test]
    fn a_copy_in_a_kept_buffer_has_the_new_bytes() {
        let bufs = RecordBufs::default();
        bufs.give(vec![1u8; 8192].into(), 1 << 20);
        let data: Vec<u8> = (0..8192u32).map(|i| i as u8).collect();
        let copy = bufs.copy_of(&data);
        assert_eq!(&copy[..], &data[..]);
        assert_eq!(bufs.kept_bytes(), 0, "the kept buffer was not used");
    }

    #[test]
    fn no_more_than_the_cap_is_kept_and_odd_sizes_not_at_all() {
        let bufs = RecordBufs::default();
        for _ in 0..5 {
            bufs.give(vec![0u8; 16384].into(), 65536);
        }
        assert_eq!(bufs.kept_bytes(), 65536);
        let bufs = RecordBufs::default();
        bufs.give(vec![0u8; 2048].into(), 1 << 20);
        bufs.give(vec![0u8; 6000].into(), 1 << 20);
        assert_eq!(bufs.kept_bytes(), 0);
    }

    #[test]
    fn the_pool_keeps_what_reads_needed_of_it_in_the_window_before() {
        const REC: usize = 16384;
        let bufs = RecordBufs::default();
        let give = |at| bufs.give_at(vec![0u8; REC].into(), 1 << 20, at);
        let take = |at| bufs.take_at(REC, at);
        // The first window keeps up to the cap.
        give(0);
        give(0);
        assert_eq!(bufs.kept_bytes(), 2 * REC);
        // Nothing was taken in it: the next window keeps none.
        give(WINDOW_MS);
        assert_eq!(bufs.kept_bytes(), 0);
        // Reads ask for three and find none...
        for _ in 0..3 {
            assert!(take(WINDOW_MS + 10).is_none());
        }
        // ...so the window after keeps three, and no more.
        for _ in 0..5 {
            give(2 * WINDOW_MS);
        }
        assert_eq!(bufs.kept_bytes(), 3 * REC);
        // Taken two at a time and given back (a reader of two records at
        // a time between evictions): the pool fell by two at most.
        for _ in 0..4 {
            assert!(take(2 * WINDOW_MS + 10).is_some());
            assert!(take(2 * WINDOW_MS + 10).is_some());
            give(2 * WINDOW_MS + 10);
            give(2 * WINDOW_MS + 10);
        }
        // The window after keeps two: the third went unused.
        give(3 * WINDOW_MS);
        assert_eq!(bufs.kept_bytes(), 2 * REC);
        // After a gap of windows with nothing taken or given: none.
        give(5 * WINDOW_MS);
        assert_eq!(bufs.kept_bytes(), 0);
        assert_eq!(bufs.reused(), 8);
    }

    #[test]
    fn the_cap_is_a_quarter_of_the_arc_up_to_a_bound() {
        assert_eq!(RecordBufs::cap(64 << 20), 16 << 20);
        assert_eq!(RecordBufs::cap(1 << 40), MAX_KEPT);
    }
}
