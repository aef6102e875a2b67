//! L2 reads through the io_uring ring on a real O_DIRECT file (the ring
//! reads files only; the file lives under the build's target directory, on
//! a disk filesystem, since tmpfs refuses O_DIRECT).

use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use arcache_l2::{BlobFlags, FeedItem, L2Arc, L2Device, L2Miss, HEADER_RESERVED};
use blockdev::{FileDev, FileDevOptions};

mod common;
use common::OldBuffers;

const RECORDS: u64 = 64;
const LEN: usize = 16 << 10;

fn bytes_for(key: u64) -> Vec<u8> {
    (0..LEN).map(|i| (key as u8).wrapping_mul(29).wrapping_add((i / 7) as u8)).collect()
}

/// An L2 on a file in `dir` opened O_DIRECT, with nothing fed.
fn empty_file_l2(dir: &tempfile::TempDir) -> Arc<L2Arc> {
    let opts =
        FileDevOptions { direct: true, create_size: Some(HEADER_RESERVED + (8 << 20)), ..Default::default() };
    let dev = FileDev::open(&dir.path().join("l2.img"), opts).unwrap();
    assert!(dev.is_direct(), "O_DIRECT refused under {}", dir.path().display());
    Arc::new(L2Arc::new(vec![L2Device::new("f".into(), Arc::new(dev)).unwrap()]).unwrap())
}

fn file_l2(dir: &tempfile::TempDir) -> Arc<L2Arc> {
    let l2 = empty_file_l2(dir);
    let items: Vec<FeedItem> = (0..RECORDS)
        .map(|k| {
            assert!(l2.begin_feed(k));
            FeedItem { key: k, data: Arc::new(bytes_for(k)), flags: BlobFlags::default() }
        })
        .collect();
    l2.write_batch(0, items, 0, false).unwrap();
    l2
}

/// A record's key and what its read returned.
type Answer = (u64, Result<Box<[u8]>, L2Miss>);

/// Starts a ring read of every record; their answers arrive on the channel.
fn read_all_async(l2: &Arc<L2Arc>) -> mpsc::Receiver<Answer> {
    let (tx, rx) = mpsc::channel();
    for k in 0..RECORDS {
        let ptr = l2.lookup(k).unwrap();
        let tx = tx.clone();
        let queued = l2.read_async(k, ptr, None, Box::new(move |r, _| tx.send((k, r)).unwrap()));
        if let Err(done) = queued {
            done(Err(L2Miss::Unavailable), &mut arcache_batch::Batch::new());
        }
    }
    rx
}

/// When the ring itself fails (here injected, as a kernel error would),
/// reads in flight end as `Unavailable`, not as device errors: the device
/// stays in service, its copies stay indexed and readable the blocking way,
/// and the ring is offered no more reads.
#[test]
fn a_failed_ring_is_not_blamed_on_the_device() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let l2 = file_l2(&dir);
    l2.start_async_reads().expect("io_uring is available to tests");
    let ptr0 = l2.lookup(0).unwrap();
    assert!(l2.can_read_async(ptr0));
    let rx = read_all_async(&l2);
    for _ in 0..RECORDS {
        let (k, r) = rx.recv_timeout(Duration::from_secs(10)).expect("answered");
        assert_eq!(&*r.expect("a working ring reads the copy"), &bytes_for(k)[..]);
    }

    let rx = read_all_async(&l2);
    l2.inject_ring_failure();
    for _ in 0..RECORDS {
        let (k, r) = rx.recv_timeout(Duration::from_secs(10)).expect("every read is answered");
        match r {
            Ok(b) => assert_eq!(&*b, &bytes_for(k)[..]),
            Err(e) => assert_eq!(e, L2Miss::Unavailable, "record {k}"),
        }
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while l2.can_read_async(ptr0) {
        assert!(Instant::now() < deadline, "a failed ring is still offered reads");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        l2.stats.l2_io_error.load(std::sync::atomic::Ordering::Relaxed),
        0,
        "not counted against the device"
    );
    assert_eq!(l2.healthy_devices(), 1, "the device stays in service");
    for k in 0..RECORDS {
        let ptr = l2.lookup(k).expect("the copy stays indexed");
        assert_eq!(&*l2.read(k, ptr).unwrap(), &bytes_for(k)[..], "and reads back the blocking way");
    }
}

/// The server's allocator, which places buffers of whole pages on page
/// boundaries (as the cache's buffers of evicted records are).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Raw records of whole pages, read whole through the ring, are read
/// straight into buffers the source hands out (no copy out of the ring's
/// own buffer), and are verified there: a copy changed on the device is
/// refused and dropped, the others served.
#[test]
fn raw_records_read_through_the_ring_land_in_the_sources_buffers_and_are_verified_there() {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let l2 = empty_file_l2(&dir);
    let raw = BlobFlags { raw: true, lshift: 2, ..Default::default() };
    let items: Vec<FeedItem> = (0..RECORDS)
        .map(|k| {
            assert!(l2.begin_feed(k));
            FeedItem { key: k, data: Arc::new(bytes_for(k)), flags: raw }
        })
        .collect();
    l2.write_batch(0, items, 0, false).unwrap();
    let bad = 5;
    let file = std::fs::OpenOptions::new().write(true).open(dir.path().join("l2.img")).unwrap();
    file.write_all_at(b"garbage", l2.lookup(bad).unwrap().daddr() + 100).unwrap();
    file.sync_all().unwrap();
    let source = Arc::new(OldBuffers::default());
    l2.set_buf_source(Arc::clone(&source) as Arc<dyn arcache_l2::BufSource>);
    l2.start_async_reads().expect("io_uring is available to tests");
    let rx = read_all_async(&l2);
    let mut served = Vec::new();
    for _ in 0..RECORDS {
        let (k, r) = rx.recv_timeout(Duration::from_secs(10)).expect("answered");
        if k == bad {
            assert_eq!(r.err(), Some(L2Miss::ChecksumBad), "the changed copy was served");
            continue;
        }
        let b = r.expect("a good copy");
        assert!(b[..] == bytes_for(k)[..], "record {k}: old bytes stayed");
        served.push(b.as_ptr() as usize);
    }
    assert!(l2.lookup(bad).is_none(), "the bad copy stays indexed");
    assert_eq!(source.copies.load(std::sync::atomic::Ordering::Relaxed), 0, "records were copied");
    let handed = source.handed.lock().unwrap().clone();
    assert_eq!(handed.len(), RECORDS as usize, "a buffer asked of the source for each read");
    for at in &served {
        assert!(handed.contains(at), "a record was not read into the source's buffer");
    }
}

/// A compressed copy is framed: 4,092 bytes of it frame to exactly a page,
/// so its read through the ring has the shape of a raw record of whole
/// pages. It must not be read into the source's buffer and handed on as
/// the record (the frame would be served as data): it comes back
/// unframed, in a buffer of its own.
#[test]
fn a_compressed_copy_framed_to_a_page_is_read_through_the_ring_unframed_and_not_into_the_source() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let l2 = empty_file_l2(&dir);
    let compressed = BlobFlags { compressed: true, lshift: 2, ..Default::default() };
    let data: Vec<u8> = (0..4092u32).map(|i| (i * 31 + i / 5) as u8).collect();
    assert!(l2.begin_feed(7));
    let item = FeedItem { key: 7, data: Arc::new(data.clone()), flags: compressed };
    l2.write_batch(0, vec![item], 0, false).unwrap();
    let ptr = l2.lookup(7).unwrap();
    assert_eq!(ptr.blob_len(), 4096, "the frame makes a page: the case this test is for");
    let source = Arc::new(OldBuffers::default());
    l2.set_buf_source(Arc::clone(&source) as Arc<dyn arcache_l2::BufSource>);
    l2.start_async_reads().expect("io_uring is available to tests");
    let (tx, rx) = mpsc::channel();
    let queued = l2.read_async(7, ptr, None, Box::new(move |r, _| tx.send(r).unwrap()));
    assert!(queued.is_ok(), "the ring took the read");
    let got = rx.recv_timeout(Duration::from_secs(10)).expect("answered").expect("reads back");
    assert!(got[..] == data[..], "the compressed bytes, unframed");
    assert!(source.handed.lock().unwrap().is_empty(), "a compressed copy was read into the source's buffer");
}
