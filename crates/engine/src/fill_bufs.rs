//! Buffers for reads from the backing store, shared by the cache's threads.
//!
//! A read from the backing store lands in a buffer before its records are
//! copied into the ARC. Each thread used to keep its own: with 32 NBD
//! workers and 8 prefetch threads each at some time reading a whole S3
//! unit (8 MiB), the buffers alone came to hundreds of MiB beside a 256M
//! ARC, every one first touched page by page, and each was zeroed again
//! whenever it grew back from a smaller read (perf of bench/s3.sh's cold
//! pass). A few buffers shared by every volume of a cache serve as well:
//! that many reads of the stores are rarely under way at once.

use arcache_sync::Mutex;

/// Buffers kept between reads; more may be in use at once (made for the
/// read and dropped after). Enough for the prefetch threads' units and a
/// stream's own miss with one to spare.
const KEPT: usize = crate::prefetch::PREFETCH_THREADS + 2;
/// Larger buffers are not kept: reads this large (64 records of 1M, an
/// object store's chunk of tens of MiB) are rare, and ten of them kept
/// would hold more RAM than many an ARC. An S3 chunked disk's chunk (4 MiB
/// by default) is kept; S3 objects read into the records' own buffers
/// (`volume/scatter.rs`) and need none.
const KEPT_MAX_LEN: usize = 16 << 20;

#[derive(Default)]
pub(crate) struct FillBufs {
    kept: Mutex<Vec<Vec<u8>>>,
}

impl FillBufs {
    /// Runs `f` on a buffer of `len` bytes whose contents are unspecified
    /// (earlier reads' bytes): `f` must overwrite what it uses.
    pub(crate) fn with<T>(&self, len: usize, f: impl FnOnce(&mut [u8]) -> T) -> T {
        let mut buf = self.take(len);
        if buf.len() < len {
            // Zeroed once, when it first grows this large; kept at that
            // length since, so a smaller read followed by a larger one
            // does not zero it again.
            buf.resize(len, 0);
        }
        let out = f(&mut buf[..len]);
        if buf.len() <= KEPT_MAX_LEN {
            let mut kept = self.kept.lock();
            if kept.len() < KEPT {
                kept.push(buf);
            }
        }
        out
    }

    /// The smallest kept buffer that holds `len` bytes, else the largest
    /// (to be grown), else a new one.
    fn take(&self, len: usize) -> Vec<u8> {
        let mut kept = self.kept.lock();
        let fits = kept.iter().enumerate().filter(|(_, b)| b.len() >= len).min_by_key(|(_, b)| b.len());
        let pick = fits.or_else(|| kept.iter().enumerate().max_by_key(|(_, b)| b.len())).map(|(i, _)| i);
        pick.map(|i| kept.swap_remove(i)).unwrap_or_default()
    }

    #[cfg(test)]
    fn kept_lens(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self.kept.lock().iter().map(Vec::len).collect();
        v.sort_unstable();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_is_zeroed_only_when_it_first_grows() {
        let bufs = FillBufs::default();
        bufs.with(8192, |b| b.fill(7));
        // A smaller read then a larger one get the same buffer back with
        // the first read's bytes: not zeroed again.
        bufs.with(4096, |b| assert!(b.iter().all(|&x| x == 7)));
        bufs.with(8192, |b| assert!(b.iter().all(|&x| x == 7), "zeroed again"));
        assert_eq!(bufs.kept_lens(), vec![8192]);
    }

    #[test]
    fn reads_take_the_smallest_buffer_that_fits() {
        let bufs = FillBufs::default();
        bufs.with(1 << 20, |_| {
            bufs.with(4096, |_| ());
        });
        assert_eq!(bufs.kept_lens(), vec![4096, 1 << 20]);
        bufs.with(4096, |_| assert_eq!(bufs.kept_lens(), vec![1 << 20], "not the 4K buffer"));
        bufs.with(64 << 10, |_| assert_eq!(bufs.kept_lens(), vec![4096], "not the megabyte"));
        // Both fitted a buffer kept: nothing grew.
        assert_eq!(bufs.kept_lens(), vec![4096, 1 << 20]);
        // None fits: the largest grows, the small one stays for small reads.
        bufs.with(2 << 20, |_| ());
        assert_eq!(bufs.kept_lens(), vec![4096, 2 << 20]);
    }

    #[test]
    fn buffers_beyond_the_size_kept_are_dropped_after_use() {
        let bufs = FillBufs::default();
        bufs.with(KEPT_MAX_LEN + 1, |_| ());
        bufs.with(KEPT_MAX_LEN, |_| ());
        assert_eq!(bufs.kept_lens(), vec![KEPT_MAX_LEN]);
    }

    #[test]
    fn no_more_than_kept_buffers_stay() {
        let bufs = FillBufs::default();
        fn nest(bufs: &FillBufs, depth: usize) {
            if depth > 0 {
                bufs.with(4096, |_| nest(bufs, depth - 1));
            }
        }
        nest(&bufs, KEPT + 5);
        assert_eq!(bufs.kept_lens().len(), KEPT);
    }
}
