//! A backing store that refuses writes while a txg syncs: the txg's data
//! stays dirty and readable, FLUSH does not claim durability, and once the
//! store takes writes again the retried txg puts everything on it. With an
//! intent log the FLUSH is durable in the log meanwhile.

use std::sync::Arc;

use arcache_engine::{Cache, CacheConfig, Volume, VolumeConfig, WriteBack, WriteTunables};
use blockdev::{BlockDev, FaultPlan, FaultyDev, MemDev};
use zil::{IntentLog, LogExport};

const SIZE: u64 = 1 << 20;

struct Rig {
    backing: Arc<FaultyDev<Arc<MemDev>>>,
    disk: Arc<MemDev>,
    vol: Arc<Volume>,
    wb: Arc<WriteBack>,
}

fn rig(with_log: bool) -> Rig {
    let disk = Arc::new(MemDev::new(SIZE));
    let backing = Arc::new(FaultyDev::new(Arc::clone(&disk), 3));
    let cache = Cache::new(CacheConfig {
        arc_min: 64 << 10,
        arc_max: 128 << 10,
        min_prefetch_ms: 0,
        compress: false,
    });
    let log = with_log.then(|| {
        let dev: Arc<dyn BlockDev> = Arc::new(MemDev::new(2 << 20));
        let x = LogExport { id: 0, name: "t".into(), identity: 1, size: SIZE };
        Arc::new(IntentLog::open(dev, vec![x]).unwrap())
    });
    let wb = WriteBack::new(log, None, Arc::new(WriteTunables::default()));
    let vol = Volume::with_writeback(
        0,
        VolumeConfig { name: "t".into(), recordsize: 4096, read_only: false },
        Arc::clone(&backing) as Arc<dyn BlockDev>,
        cache,
        Arc::clone(&wb),
    );
    Rig { backing, disk, vol, wb }
}

fn refuse_writes(dev: &FaultyDev<Arc<MemDev>>, on: bool) {
    let fail_writes = if on { std::iter::once(0..SIZE).collect() } else { Vec::new() };
    dev.set_plan(FaultPlan { fail_writes, ..Default::default() });
}

#[test]
fn a_failed_txg_keeps_its_data_and_is_retried() {
    for with_log in [false, true] {
        let Rig { backing, disk, vol, wb } = rig(with_log);
        let data = vec![0x3cu8; 16384];
        refuse_writes(&backing, true);
        vol.write(8192, &data, false).unwrap();
        // With a log the FLUSH is durable there; without, it must fail.
        assert_eq!(vol.flush().is_ok(), with_log, "log {with_log}");
        assert!(wb.sync_now().is_err(), "the txg cannot be written");
        let v = wb.view();
        assert!(v.txg_sync_errors > 0 && v.dirty_bytes >= 16384, "log {with_log}: {v:?}");
        let mut buf = vec![0u8; 16384];
        vol.read(8192, &mut buf).unwrap();
        assert_eq!(buf, data, "the data stays readable while it cannot be written");
        refuse_writes(&backing, false);
        // The failed txg's pages went back into the open one.
        wb.sync_now().unwrap();
        vol.flush().unwrap();
        assert_eq!(wb.view().dirty_bytes, 0);
        assert_eq!(&disk.snapshot()[8192..8192 + 16384], &data[..], "log {with_log}: the retry wrote it");
    }
}
