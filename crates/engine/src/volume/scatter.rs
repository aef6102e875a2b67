//! Backing reads straight into the records' own buffers, for stores that
//! fill many buffers with one request (a file's `preadv`, an S3 GET's
//! body): each record kept raw is the very buffer the store wrote, where
//! reading through one block buffer cost a copy of every byte read (about
//! 5 % of the server's CPU on a cold sequential pass from a file, 8 % from
//! S3; perf). The buffers are evicted records' where any are kept
//! (`record_bufs.rs`): new ones cost S3 more than the copy. A record that
//! compresses is kept compressed, and the buffer it was read into goes
//! back to the pool.

use std::mem::MaybeUninit;
use std::ops::Range;
use std::sync::Arc;

use blockdev::DevResult;

use super::out::{Keep, Out};
use super::tiers::{asked, injected_backing_error};
use super::Volume;
use crate::cache::Found;
use crate::dirty::Page;
use crate::record::Record;

impl Volume {
    /// What `fill_from_backing` does, for a store that scatters reads: the
    /// records `need` read with one request, `wanted` among them inserted
    /// as asked (`prefetch`, kept for `out`), the others as prefetches.
    pub(super) fn fill_scattered(
        &self,
        need: Range<u64>,
        wanted: Range<u64>,
        prefetch: bool,
        offset: u64,
        mut out: Option<&mut Out>,
        snap: &[(u64, Arc<Page>)],
    ) -> DevResult<()> {
        let start = self.record_range(need.start).start;
        let mut bufs: Vec<Box<[MaybeUninit<u8>]>> = need
            .clone()
            .map(|r| {
                let rr = self.record_range(r);
                self.cache.record_bufs.uninit((rr.end - rr.start) as usize)
            })
            .collect();
        let len = bufs.iter().map(|b| b.len()).sum();
        let started = std::time::Instant::now();
        let read = injected_backing_error(start).and_then(|()| {
            let mut views: Vec<&mut [MaybeUninit<u8>]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
            self.dev.read_scattered(&mut views, start)
        });
        self.count_backing_read(len, started, read)?;
        // SAFETY: the read succeeded, so every byte of every buffer was
        // written (`BlockDev::read_scattered`).
        let mut records: Vec<Box<[u8]>> = bufs.into_iter().map(|b| unsafe { b.assume_init() }).collect();
        for (r, rec) in need.clone().zip(records.iter_mut()) {
            self.overlay_block(r..r + 1, rec, offset, out.as_deref_mut().and_then(Out::buf), snap);
        }
        let asked = asked(&need, &wanted);
        let mut keep = out.and_then(Out::keep);
        for (r, rec) in need.clone().zip(records) {
            let mine = asked.contains(&r);
            let k = if mine { keep.as_deref_mut() } else { None };
            self.insert_owned(r, rec, !mine || prefetch, k);
        }
        let n = asked.end - asked.start;
        if n > 0 {
            self.cache.count(Found::Miss, prefetch, n);
        }
        if need.end - need.start > n {
            self.cache.count(Found::Miss, true, need.end - need.start - n);
        }
        Ok(())
    }

    /// Record `r`'s bytes as read into the cache: kept as they are (the
    /// buffer itself) or compressed, as `insert_block` does.
    pub(super) fn insert_owned(&self, r: u64, bytes: Box<[u8]>, prefetch: bool, keep: Option<&mut Keep>) {
        let rec = match self.probes.compressed_of(&bytes, self.cache.compress_enabled()) {
            Some(c) => {
                if let Some(k) = keep {
                    // The plain bytes are in hand: kept, not decompressed.
                    k.keep_bytes(r, &bytes);
                }
                // The read most likely took this buffer from the pool; with
                // the record kept compressed, the next read can have it
                // (freed, a compressible export's reads drained the pool).
                self.cache.give_record_buf(bytes);
                Arc::new(c)
            }
            None => {
                let rec = Arc::new(Record::raw_boxed(bytes));
                if let Some(k) = keep {
                    k.keep(r, &rec);
                }
                rec
            }
        };
        self.cache.insert_read(self.key(r), rec, prefetch);
    }
}
