//! Reads that miss RAM and L2 served from the backing store through the
//! io_uring ring (`Volume::read_async` with a backing store opened
//! O_DIRECT): the bytes are the store's, a failed or short device read is
//! that request's error only, and a ring read overtaken by a write never
//! brings an older version back.

use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use arcache_engine::{Cache, CacheConfig, Volume, VolumeConfig, WriteBack, WriteTunables};
use blockdev::uring::Uring;
use blockdev::{BlockDev, DevResult, FileDev, FileDevOptions, MemDev};
use rand::{Rng, SeedableRng};

const DEV: u64 = 4 << 20;
const RS: u64 = 16 << 10;

/// A small ARC (records are evicted all the time) in front of `dev`, with
/// the ring; `write_back` as the server runs it (small dirty limit:
/// frequent txgs).
fn volume(dev: Arc<dyn BlockDev>, write_back: bool) -> (Arc<Cache>, Arc<Volume>) {
    let arc_max = 256 << 10;
    let cache =
        Cache::new(CacheConfig { arc_min: arc_max / 2, arc_max, min_prefetch_ms: 0, compress: false });
    let cfg = VolumeConfig { name: "t".into(), recordsize: RS, read_only: false };
    let vol = if write_back {
        let wtun = Arc::new(WriteTunables::default());
        wtun.dirty_data_max.store(256 << 10, Relaxed);
        wtun.txg_timeout_secs.store(1, Relaxed);
        let wb = WriteBack::new(None, None, wtun);
        wb.spawn();
        Volume::with_writeback(0, cfg, dev, Arc::clone(&cache), wb)
    } else {
        Volume::new(0, cfg, dev, Arc::clone(&cache))
    };
    vol.use_ring(Arc::new(Uring::start("test-ring").expect("io_uring is available to tests")));
    (cache, vol)
}

/// A file of `bytes` opened O_DIRECT under the build's target directory
/// (a disk filesystem: tmpfs refuses O_DIRECT).
fn direct_file(bytes: &[u8]) -> (tempfile::TempDir, std::path::PathBuf, Arc<FileDev>) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("backing.img");
    std::fs::write(&path, bytes).unwrap();
    let file = FileDev::open(&path, FileDevOptions { direct: true, ..Default::default() }).unwrap();
    assert!(file.is_direct(), "O_DIRECT refused under {}", dir.path().display());
    (dir, path, Arc::new(file))
}

fn payload(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.gen()).collect()
}

mod common;

use common::try_read as read;

#[test]
fn cold_reads_come_from_the_backing_store_through_the_ring() {
    let data = payload(1, DEV as usize);
    let (_dir, _, file) = direct_file(&data);
    let (cache, vol) = volume(file, false);
    let mut rng = rand::rngs::StdRng::seed_from_u64(2);
    for i in 0..3000u64 {
        // Mostly 4K within a record; some unaligned or spanning records
        // (the blocking path), all checked against the file.
        let (o, l) = if i % 10 == 0 {
            (rng.gen_range(0..DEV - 40_000), rng.gen_range(1..40_000))
        } else {
            (rng.gen_range(0..DEV / 4096) * 4096, 4096)
        };
        let got = read(&vol, o, l as usize).unwrap();
        assert!(got == data[o as usize..(o + l) as usize], "read {i}: {o}+{l}");
    }
    let st = cache.stats();
    assert!(st.backing_ring_reads > 1000, "cold 4K reads went through the ring: {st:?}");
    vol.set_backing_ring_reads(false);
    let before = cache.stats().backing_ring_reads;
    for i in 0..200u64 {
        let o = (i * 7919 % (DEV / 4096)) * 4096;
        assert!(read(&vol, o, 4096).unwrap() == data[o as usize..o as usize + 4096]);
    }
    assert_eq!(cache.stats().backing_ring_reads, before, "backing_ring_reads=0: no read through the ring");
    cache.validate().unwrap();
}

/// The file is cut short under the volume: ring reads past its new end
/// come back short, and each is that request's error, counted; reads of
/// what is left still return the file's bytes.
#[test]
fn a_short_backing_read_is_that_requests_error() {
    let data = payload(3, DEV as usize);
    let (_dir, path, file) = direct_file(&data);
    let (cache, vol) = volume(file, false);
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(DEV / 2).unwrap();
    let mut errors = 0;
    // Out of order, or zfetch would prefetch what the ring is to read.
    for rec in (0..DEV / RS).map(|i| i * 37 % (DEV / RS)) {
        let o = rec * RS + 4096;
        match read(&vol, o, 4096) {
            Ok(b) => {
                assert!(o < DEV / 2, "record {rec} read past the end of the file");
                assert!(b == data[o as usize..o as usize + 4096], "record {rec}");
            }
            Err(e) => {
                assert!(o >= DEV / 2, "record {rec} failed within the file: {e}");
                errors += 1;
            }
        }
    }
    let st = cache.stats();
    assert_eq!(errors, DEV / 2 / RS, "every read past the end failed");
    assert!(st.backing_errors >= errors, "the failures were counted: {st:?}");
    assert!(st.backing_ring_reads >= DEV / 2 / RS, "the rest went through the ring: {st:?}");
    cache.validate().unwrap();
}

/// A store whose reads through its descriptor fail (the descriptor is
/// write-only, so the kernel answers EBADF, as a dying disk answers EIO):
/// each ring read is its request's error; the volume stays usable.
struct FailingDescriptor {
    inner: MemDev,
    fd: std::fs::File,
}

impl BlockDev for FailingDescriptor {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> DevResult<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> DevResult<()> {
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> DevResult<()> {
        Ok(())
    }
    fn describe(&self) -> String {
        "memory, with a descriptor that cannot be read".into()
    }
    fn direct_read_fd(&self) -> Option<RawFd> {
        Some(self.fd.as_raw_fd())
    }
}

/// EIO on Linux.
const EIO: i32 = 5;

#[test]
fn a_failed_backing_read_is_that_requests_error() {
    let dir = tempfile::tempdir().unwrap();
    let fd = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(dir.path().join("w"))
        .unwrap();
    let dev = Arc::new(FailingDescriptor { inner: MemDev::new(DEV), fd });
    dev.write_at(&[7u8; 8192], 0).unwrap();
    let (cache, vol) = volume(Arc::clone(&dev) as Arc<dyn BlockDev>, false);
    for rec in [3, 90, 17, 200, 41, 133, 6, 251] {
        let e = read(&vol, rec * RS, 4096).expect_err("the device failed the read");
        assert_eq!(e.errno(), EIO, "an IO error: {e}");
        let msg = e.to_string();
        assert!(
            msg.contains("Bad file descriptor") && msg.contains("cannot be read"),
            "the device's error: {msg}"
        );
    }
    assert_eq!(cache.stats().backing_errors, 8);
    vol.set_backing_ring_reads(false);
    assert_eq!(read(&vol, 0, 4096).unwrap(), vec![7u8; 4096], "the volume still reads, the blocking way");
}

/// Ring reads from the backing store (the ARC is too small to keep the
/// records) overtaken by writes, with txgs syncing under them when
/// `write_back`: never an older version than one acknowledged before.
#[test]
fn a_backing_ring_read_overtaken_by_a_write_never_brings_back_the_old_version() {
    for write_back in [false, true] {
        let (_dir, _, file) = direct_file(&vec![0u8; DEV as usize]);
        let (cache, vol) = volume(file, write_back);
        common::overtaken_reads(&vol, RS, 96, 3);
        let st = cache.stats();
        assert!(st.backing_ring_reads > 100, "write_back {write_back}: reads went through the ring: {st:?}");
        cache.validate().unwrap();
    }
}
