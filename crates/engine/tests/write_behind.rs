//! When the txg thread takes a txg before its timeout: a stream of writes
//! is written behind as soon as there is enough of it; scattered small
//! writes wait (they coalesce and are overwritten in RAM); a filling intent
//! log starts a txg before a commit could find it full.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arcache_engine::{Cache, CacheConfig, Volume, VolumeConfig, WriteBack, WriteTunables};
use blockdev::{BlockDev, MemDev};
use zil::{IntentLog, LogExport};

const SIZE: u64 = 256 << 20;
/// The write-behind size with the dirty limit below (its 16 MiB floor).
const WRITE_BEHIND: u64 = 16 << 20;

fn rig(log_size: Option<u64>) -> (Arc<Volume>, Arc<WriteBack>) {
    let cache =
        Cache::new(CacheConfig { arc_min: 1 << 20, arc_max: 4 << 20, min_prefetch_ms: 0, compress: false });
    let log = log_size.map(|size| {
        let dev: Arc<dyn BlockDev> = Arc::new(MemDev::new(size));
        let x = LogExport { id: 0, name: "t".into(), identity: 1, size: SIZE };
        Arc::new(IntentLog::open(dev, vec![x]).expect("log"))
    });
    let tun = Arc::new(WriteTunables::default());
    // Only write-behind or log pressure can start a txg in these tests.
    tun.dirty_data_max.store(512 << 20, Relaxed);
    tun.dirty_data_sync_percent.store(100, Relaxed);
    tun.delay_min_dirty_percent.store(100, Relaxed);
    tun.txg_timeout_secs.store(1000, Relaxed);
    let wb = WriteBack::new(log, None, tun);
    wb.spawn();
    let backing: Arc<dyn BlockDev> = Arc::new(MemDev::new(SIZE));
    let cfg = VolumeConfig { name: "t".into(), recordsize: 4096, read_only: false };
    let vol = Volume::with_writeback(0, cfg, backing, cache, Arc::clone(&wb));
    (vol, wb)
}

fn synced_within(wb: &WriteBack, limit: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if wb.view().txg_syncs > 0 {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    false
}

#[test]
fn a_stream_is_written_behind_and_scattered_pages_wait() {
    let (vol, wb) = rig(None);
    let mb = vec![0x5au8; 1 << 20];
    for i in 0..(WRITE_BEHIND >> 20) + 4 {
        vol.write(i << 20, &mb, false).expect("write");
    }
    assert!(synced_within(&wb, Duration::from_secs(10)), "a stream past the write-behind size is synced");
    wb.shutdown().expect("shutdown");

    let (vol, wb) = rig(None);
    let page = vec![0xa5u8; 4096];
    // Every other page: runs of one page, past the write-behind size.
    for i in 0..(WRITE_BEHIND / 4096) + 1024 {
        vol.write(i * 8192, &page, false).expect("write");
    }
    assert!(!synced_within(&wb, Duration::from_millis(1500)), "scattered pages wait for the timeout");
    assert!(wb.view().dirty_bytes > WRITE_BEHIND);
    wb.shutdown().expect("shutdown");
    assert_eq!(wb.view().dirty_bytes, 0, "shutdown syncs them");
}

#[test]
fn a_half_full_log_starts_a_txg_that_empties_it() {
    let log_size = 8 << 20;
    let (vol, wb) = rig(Some(log_size));
    let page = vec![0x3cu8; 4096];
    // Scattered pages, each FLUSHed into the log, until just past half of
    // it: far below the write-behind size, so only the log can start a txg.
    let mut i = 0u64;
    while wb.view().zil_log_used <= log_size / 2 {
        assert!(wb.view().txg_syncs == 0, "no txg before the log is half full");
        vol.write(i * 8192, &page, false).expect("write");
        vol.flush().expect("flush");
        i += 1;
    }
    assert!(synced_within(&wb, Duration::from_secs(10)), "log pressure started a txg");
    let start = Instant::now();
    while wb.view().zil_log_used > log_size / 4 && start.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let v = wb.view();
    assert!(v.zil_log_used <= log_size / 4, "the synced txg released its log space: {v:?}");
    assert_eq!(v.zil_txg_fallbacks, 0, "no commit found the log full: {v:?}");
    wb.shutdown().expect("shutdown");
}

/// A txg's writes are counted as backing-store writes, as write-through
/// ones are: `backing_writes` and `backing_write_bytes` tell what reached
/// the store, whichever way.
#[test]
fn a_txgs_writes_are_counted_as_backing_writes() {
    let (vol, wb) = rig(None);
    let mb = vec![0x3cu8; 1 << 20];
    for i in 0..4u64 {
        vol.write(i << 21, &mb, false).expect("write");
    }
    vol.flush().expect("a FLUSH without a log syncs a txg");
    let st = vol.cache().stats();
    assert_eq!(st.backing_write_bytes, 4 << 20, "{st:?}");
    assert!(st.backing_writes >= 4, "{st:?}");
    wb.shutdown().expect("shutdown");
}
