//! A feed batch writes raw records whose memory is aligned from where they
//! lie and copies the rest; every record reads back as it was fed, from
//! a file opened O_DIRECT (one vectored write) as from memory.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use arcache_l2::{BlobFlags, FeedItem, L2Arc, L2Device, L2Miss, SharedBytes, HEADER_RESERVED};
use blockdev::{AlignedBuf, BlockDev, FileDev, FileDevOptions, MemDev};

mod common;
use common::OldBuffers;

/// The server's allocator, which places buffers of whole pages on page
/// boundaries: reads of runs of such records then go straight into each
/// record's buffer.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Aligned(AlignedBuf);

impl AsRef<[u8]> for Aligned {
    fn as_ref(&self) -> &[u8] {
        self.0.as_slice()
    }
}

/// Bytes one past an allocation's start: never aligned.
struct Unaligned(Vec<u8>);

impl AsRef<[u8]> for Unaligned {
    fn as_ref(&self) -> &[u8] {
        &self.0[1..]
    }
}

fn unaligned(key: u64, len: usize) -> SharedBytes {
    let mut v = vec![0u8];
    v.extend_from_slice(&bytes(key, len));
    Arc::new(Unaligned(v))
}

fn bytes(key: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (key as u8).wrapping_mul(13).wrapping_add((i / 7) as u8)).collect()
}

fn aligned(key: u64, len: usize) -> SharedBytes {
    let mut b = AlignedBuf::new(len);
    b.as_mut_slice().copy_from_slice(&bytes(key, len));
    Arc::new(Aligned(b))
}

/// Keys 0..8 in key order: which are written in place depends on the
/// memory, the length and where the record falls in the batch.
fn batch() -> (Vec<FeedItem>, u64) {
    let raw = BlobFlags::default();
    let items = vec![
        (0, aligned(0, 8192)),   // in place
        (1, unaligned(1, 8192)), // unaligned memory: staged; offsets stay aligned
        (2, aligned(2, 16384)),  // in place
        (3, aligned(3, 1024)),   // a 1 KiB record: staged
        (4, aligned(4, 4096)),   // starts 1 KiB past a boundary: staged
        (5, unaligned(5, 3072)), // brings the batch back to a boundary
        (6, aligned(6, 4096)),   // in place again
        (7, aligned(7, 2048)),   // staged, padded to the batch's end
    ];
    let in_place = 8192 + 16384 + 4096;
    (items.into_iter().map(|(key, data)| FeedItem { key, data, flags: raw }).collect(), in_place)
}

fn feed_and_read_back(dev: Arc<dyn BlockDev>) -> L2Arc {
    let l2 = L2Arc::new(vec![L2Device::new("d".into(), dev).unwrap()]).unwrap();
    let (items, in_place) = batch();
    let lens: Vec<usize> = items.iter().map(|it| (*it.data).as_ref().len()).collect();
    for it in &items {
        assert!(l2.begin_feed(it.key));
    }
    let written = l2.write_batch(0, items, 0, false).unwrap();
    assert_eq!(written, 49152, "8K + 8K + 16K + 1K + 4K + 3K + 4K + 2K = 46K, padded to 48K");
    assert_eq!(l2.stats.l2_write_bytes_in_place.load(Relaxed), in_place);
    for (key, &len) in (0u64..).zip(&lens) {
        let p = l2.lookup(key).expect("indexed");
        let got = l2.read(key, p).expect("reads back");
        assert!(got[..] == bytes(key, len)[..], "record {key}");
    }
    // Runs read with one device read: records 0..3 (whole pages: in
    // place where the device allows), and all eight (a 1 KiB copy among
    // them: through one run buffer).
    for n in [3, 8] {
        let wanted: Vec<_> = (0..n).map(|k| (k, l2.lookup(k).expect("indexed"))).collect();
        for ((key, _), got) in wanted.iter().zip(l2.read_many(&wanted)) {
            let got = got.expect("reads back");
            assert!(got[..] == bytes(*key, lens[*key as usize])[..], "record {key} of a run of {n}");
        }
    }
    l2
}

/// Whether the run of records 0..3 can be read into their own buffers.
fn reads_in_place(l2: &L2Arc) -> bool {
    let ptrs: Vec<_> = (0..3).map(|k| l2.lookup(k).expect("indexed")).collect();
    let lens: Vec<u64> = ptrs.iter().map(|p| p.blob_len()).collect();
    let got = l2.devices()[0].read_records(ptrs[0].daddr(), &lens, None).expect("read");
    if let Some(bufs) = &got {
        for (k, b) in (0u64..).zip(bufs) {
            assert!(b[..] == bytes(k, lens[k as usize] as usize)[..], "record {k} read in place");
        }
    }
    got.is_some()
}

#[test]
fn records_written_in_place_and_copied_read_back_from_memory() {
    let l2 = feed_and_read_back(Arc::new(MemDev::new(HEADER_RESERVED + (8 << 20))));
    assert!(!reads_in_place(&l2), "memory has no O_DIRECT descriptor");
}

/// An L2 on a file in `dir` opened with O_DIRECT, fed and read back.
fn direct_l2(dir: &tempfile::TempDir) -> L2Arc {
    let opts =
        FileDevOptions { direct: true, create_size: Some(HEADER_RESERVED + (8 << 20)), ..Default::default() };
    let dev = FileDev::open(&dir.path().join("l2.img"), opts).unwrap();
    assert!(dev.is_direct(), "this test needs a file system that takes O_DIRECT");
    feed_and_read_back(Arc::new(dev))
}

#[test]
fn records_written_in_place_and_copied_read_back_from_a_file_opened_direct() {
    let dir = tempfile::tempdir().unwrap();
    let l2 = direct_l2(&dir);
    assert!(reads_in_place(&l2), "whole pages on a direct file are read in place");
}

/// A copy changed on the device after it was fed fails its checksum when
/// a run is read into a buffer per record, and only that copy: the
/// others of the run are served, the bad one dropped.
#[test]
fn a_bad_copy_read_in_place_is_caught_and_only_it_is_dropped() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let l2 = direct_l2(&dir);
    assert!(reads_in_place(&l2));
    let bad = l2.lookup(1).expect("indexed");
    let file = std::fs::OpenOptions::new().write(true).open(dir.path().join("l2.img")).unwrap();
    file.write_all_at(b"garbage", bad.daddr() + 100).unwrap();
    file.sync_all().unwrap();
    let wanted: Vec<_> = (0..3).map(|k| (k, l2.lookup(k).expect("indexed"))).collect();
    let got = l2.read_many(&wanted);
    assert_eq!(got[1], Err(L2Miss::ChecksumBad), "the changed copy was served");
    for k in [0u64, 2] {
        let b = got[k as usize].as_ref().expect("a good copy of the run");
        assert!(b[..] == bytes(k, b.len())[..], "record {k}");
    }
    assert!(l2.lookup(1).is_none(), "the bad copy stays indexed");
    assert_eq!(l2.stats.l2_cksum_bad.load(Relaxed), 1);
}

#[test]
fn a_run_read_in_place_goes_into_the_buffers_the_source_hands_out() {
    let dir = tempfile::tempdir().unwrap();
    let l2 = direct_l2(&dir);
    let source = Arc::new(OldBuffers::default());
    l2.set_buf_source(Arc::clone(&source) as Arc<dyn arcache_l2::BufSource>);
    let wanted: Vec<_> = (0..3).map(|k| (k, l2.lookup(k).expect("indexed"))).collect();
    let got: Vec<Box<[u8]>> = l2.read_many(&wanted).into_iter().map(|g| g.expect("reads back")).collect();
    let lens = [8192, 8192, 16384];
    for (k, b) in got.iter().enumerate() {
        assert!(b[..] == bytes(k as u64, lens[k])[..], "record {k}: the old bytes stayed");
    }
    let at: Vec<usize> = got.iter().map(|b| b.as_ptr() as usize).collect();
    assert_eq!(*source.handed.lock().unwrap(), at, "not the source's buffers");
}

/// One record read whole, through a device buffer (memory here; the ring
/// and the blocking path alike) and copied out: the copy goes into a
/// buffer the source hands out, full of old bytes, and reads back right.
#[test]
fn a_record_read_whole_is_copied_into_a_buffer_the_source_hands_out() {
    let l2 = feed_and_read_back(Arc::new(MemDev::new(HEADER_RESERVED + (8 << 20))));
    let source = Arc::new(OldBuffers::default());
    l2.set_buf_source(Arc::clone(&source) as Arc<dyn arcache_l2::BufSource>);
    let (items, _) = batch();
    let mut at = Vec::new();
    for it in &items {
        let got = l2.read(it.key, l2.lookup(it.key).expect("indexed")).expect("reads back");
        assert!(got[..] == (*it.data).as_ref()[..], "record {}: the old bytes stayed", it.key);
        at.push(got.as_ptr() as usize);
    }
    assert_eq!(*source.handed.lock().unwrap(), at, "not the source's buffers");
    // A half (a small read of a split copy) is no record: its length
    // matches no evicted one, and asking the source for it would only
    // teach the source to keep buffers nobody takes.
    let half = l2.read_half(2, l2.lookup(2).expect("indexed"), 1).expect("reads back");
    assert!(half[..] == bytes(2, 16384)[8192..], "the second half of record 2");
    assert_eq!(source.handed.lock().unwrap().len(), at.len(), "a half was read into the source's buffer");
}

/// A compressed copy read whole is framed, and what it holds is the
/// compressed bytes, whose length says nothing of any evicted record's: it
/// goes into a new buffer, and the source is not asked (asking would only
/// teach it to keep buffers of lengths nobody takes). Its length here is
/// a page, one a source could well hold.
#[test]
fn a_compressed_copy_read_whole_takes_no_buffer_from_the_source() {
    let dev = Arc::new(MemDev::new(HEADER_RESERVED + (8 << 20)));
    let l2 = L2Arc::new(vec![L2Device::new("d".into(), dev).unwrap()]).unwrap();
    let source = Arc::new(OldBuffers::default());
    l2.set_buf_source(Arc::clone(&source) as Arc<dyn arcache_l2::BufSource>);
    let compressed = BlobFlags { compressed: true, lshift: 2, ..Default::default() };
    assert!(l2.begin_feed(9));
    l2.write_batch(0, vec![FeedItem { key: 9, data: aligned(9, 4096), flags: compressed }], 0, false)
        .unwrap();
    let got = l2.read(9, l2.lookup(9).expect("indexed")).expect("reads back");
    assert!(got[..] == bytes(9, 4096)[..], "the compressed bytes as fed");
    assert!(source.handed.lock().unwrap().is_empty(), "a compressed copy was read into the source's buffer");
}
