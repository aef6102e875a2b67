//! Model-based: arbitrary sequences of reads, writes (byte-granular),
//! zeroings, flushes, txg syncs, feed cycles and clean restarts against an
//! export with write-back and an L2 device that corrupts some reads. Every
//! read must equal the model of expected contents.
#![no_main]

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use arcache_engine::{
    Cache, CacheConfig, Feed, FeedTunables, Volume, VolumeConfig, WriteBack, WriteTunables,
};
use arcache_l2::{L2Arc, L2Device, HEADER_RESERVED};
use blockdev::{BlockDev, FaultPlan, FaultyDev, MemDev};
use libfuzzer_sys::fuzz_target;

const SIZE: usize = 256 << 10;

struct Rig {
    vol: Arc<Volume>,
    wb: Arc<WriteBack>,
    feed: Feed,
}

fn rig(backing: &Arc<MemDev>, l2dev: &Arc<FaultyDev<MemDev>>, recordsize: u64) -> Rig {
    let l2 = Arc::new(
        L2Arc::new(vec![L2Device::new("l2".into(), l2dev.clone() as Arc<dyn BlockDev>).unwrap()]).unwrap(),
    );
    let cache = Cache::with_l2(
        CacheConfig { arc_min: 32 << 10, arc_max: 256 << 10, min_prefetch_ms: 0, compress: true },
        Some(Arc::clone(&l2)),
    );
    // No prefetch: its thread pool would be started again by every rig.
    cache.zfetch.disable.store(true, std::sync::atomic::Ordering::Relaxed);
    let wb = WriteBack::new(None, Some(l2), Arc::new(WriteTunables::default()));
    let vol = Volume::with_writeback(
        0,
        VolumeConfig { name: "f".into(), recordsize, read_only: false },
        backing.clone() as Arc<dyn BlockDev>,
        Arc::clone(&cache),
        Arc::clone(&wb),
    );
    let feed =
        Feed::new(cache, Arc::new(FeedTunables::default()), Arc::new(AtomicU64::new(64 << 10))).unwrap();
    Rig { vol, wb, feed }
}

fuzz_target!(|data: &[u8]| {
    // The first byte picks the record size: 64 KiB records take the paths
    // of large records (kept plain once read or written in part, patched
    // in place).
    let Some((&pick, data)) = data.split_first() else { return };
    let recordsize = [4096, 16384, 65536][usize::from(pick) % 3];
    let backing = Arc::new(MemDev::new(SIZE as u64));
    let l2dev = Arc::new(FaultyDev::new(MemDev::new(HEADER_RESERVED + (4 << 20)), 5));
    let mut r = rig(&backing, &l2dev, recordsize);
    let mut model = vec![0u8; SIZE];
    let mut buf = vec![0u8; 64 << 10];
    for (i, op) in data.chunks(5).enumerate() {
        if op.len() < 5 {
            break;
        }
        let off = (u32::from_le_bytes([op[1], op[2], op[3], 0]) as usize) % SIZE;
        let len = ((op[4] as usize + 1) * 97).min(SIZE - off).max(1);
        match op[0] % 8 {
            0 | 1 => {
                let bytes: Vec<u8> =
                    (0..len).map(|j| (i as u8).wrapping_mul(31).wrapping_add(j as u8)).collect();
                r.vol.write(off as u64, &bytes, op[0] & 0x80 != 0).unwrap();
                model[off..off + len].copy_from_slice(&bytes);
            }
            2 | 3 => {
                let len = len.min(buf.len());
                r.vol.read(off as u64, &mut buf[..len]).unwrap();
                assert!(buf[..len] == model[off..off + len], "op {i}: read {off}+{len} differs");
            }
            4 => {
                r.vol.write_zeroes(off as u64, len as u64, false).unwrap();
                model[off..off + len].fill(0);
            }
            5 => r.vol.flush().unwrap(),
            6 => {
                r.feed.cycle_once();
                let flips = if op[4] % 2 == 0 { 0.0 } else { 0.3 };
                l2dev.set_plan(FaultPlan { flip_bit_probability: flips, ..Default::default() });
            }
            _ => {
                // A clean restart: dirty data synced, a new cache over the same disks.
                r.wb.shutdown().unwrap();
                r = rig(&backing, &l2dev, recordsize);
            }
        }
    }
    r.wb.shutdown().unwrap();
    assert!(backing.snapshot() == model, "the backing store differs from the model after shutdown");
});
