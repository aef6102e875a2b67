//! A device taken out of service hears of no more writes, so its log must
//! never be restored, even when its own header cannot be reset (it fails
//! writes) and the device works again at the next start: the other
//! devices' headers record that log as abandoned (docs/format.md,
//! "Abandoned-logs block").

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use arcache_l2::{
    BlobFlags, ExportDesc, FeedItem, L2Arc, L2Device, PersistOptions, SharedBytes, HEADER_RESERVED,
};
use blockdev::{BlockDev, CrashDev, FaultPlan, FaultyDev};

const REC: usize = 4096;
const RECORDS: u64 = 1000;
const DEV_SIZE: u64 = HEADER_RESERVED + (4 << 20);

fn export() -> ExportDesc {
    ExportDesc { id: 0, name: "e".into(), recordsize: REC as u32, size: RECORDS * REC as u64, identity: 5 }
}

fn contents(key: u64) -> Vec<u8> {
    let mut v = vec![0u8; REC];
    v[..8].copy_from_slice(&key.to_le_bytes());
    v
}

type Faulty = Arc<FaultyDev<Arc<CrashDev>>>;

/// Devices over power-cut recorders, with faults switchable at run time.
fn devices(images: Vec<Option<Vec<u8>>>) -> (Vec<Arc<CrashDev>>, Vec<Faulty>) {
    let crash: Vec<Arc<CrashDev>> = images
        .into_iter()
        .map(|i| Arc::new(i.map_or_else(|| CrashDev::new(DEV_SIZE), CrashDev::from_bytes)))
        .collect();
    let faulty = crash.iter().map(|c| Arc::new(FaultyDev::new(Arc::clone(c), 1))).collect();
    (crash, faulty)
}

/// Opens `devs` (named by their letters) and runs the rebuild to its end.
fn open(devs: &[(&str, &Faulty)]) -> L2Arc {
    try_open(devs).unwrap()
}

fn try_open(devs: &[(&str, &Faulty)]) -> Result<L2Arc, String> {
    let l2devs = devs
        .iter()
        .map(|(name, d)| L2Device::new((*name).into(), Arc::clone(d) as Arc<dyn BlockDev>).unwrap())
        .collect();
    let opts = PersistOptions { rebuild_enabled: true, min_l2size: 0 };
    let l2 = L2Arc::open(l2devs, &[export()], &opts)?;
    l2.rebuild(u64::MAX, &|_| 0, &AtomicBool::new(false));
    Ok(l2)
}

fn feed(l2: &L2Arc, dev: usize, keys: std::ops::Range<u64>) {
    let items: Vec<FeedItem> = keys
        .filter(|&k| l2.begin_feed(k))
        .map(|k| FeedItem { key: k, data: Arc::new(contents(k)) as SharedBytes, flags: BlobFlags::default() })
        .collect();
    l2.write_batch(dev, items, 0, false).unwrap();
}

/// Stops `l2` cleanly and starts again over both devices' images.
fn stop_and_start_both(l2: L2Arc, crash: &[Arc<CrashDev>]) -> L2Arc {
    l2.sync_logs();
    l2.mark_closed();
    drop(l2);
    let (_, faulty) = devices(crash.iter().map(|c| Some(c.image_bytes(|_| true))).collect());
    open(&[("a", &faulty[0]), ("b", &faulty[1])])
}

fn on_device(l2: &L2Arc, dev: usize) -> usize {
    (0..RECORDS).filter(|&k| l2.lookup(k).is_some_and(|p| p.dev() == dev)).count()
}

/// Two devices, records 0..20 on the first and 20..40 on the second, all
/// logged; then the first fails every write and flush, and a client write
/// of record 5 retires it (its log commit fails) and cannot reset its
/// header. Returns the devices' images as a kill -9 leaves them.
fn first_device_retired_unreset() -> Vec<Vec<u8>> {
    first_device_retired(FaultPlan {
        fail_writes: std::iter::once(0..DEV_SIZE).collect(),
        fail_flush: true,
        ..Default::default()
    })
}

/// As [`first_device_retired_unreset`], the first device failing as `plan` says.
fn first_device_retired(plan: FaultPlan) -> Vec<Vec<u8>> {
    let (crash, faulty) = devices(vec![None, None]);
    let l2 = open(&[("a", &faulty[0]), ("b", &faulty[1])]);
    feed(&l2, 0, 0..20);
    feed(&l2, 1, 20..40);
    l2.sync_logs();
    assert_eq!((on_device(&l2, 0), on_device(&l2, 1)), (20, 20));
    faulty[0].set_plan(plan);
    // The write's INVALIDATE cannot be logged on the first device: it is
    // retired, and the write goes on without its log.
    l2.begin_write(&[5]);
    l2.end_write(&[5]);
    assert_eq!(l2.healthy_devices(), 1, "the failing device was not retired");
    crash.iter().map(|c| c.image_bytes(|_| true)).collect()
}

#[test]
fn a_retired_device_whose_header_could_not_be_reset_restores_nothing() {
    let images = first_device_retired_unreset();
    // The first device works again at the next start; its log still
    // describes record 5 as it was before the write.
    let (_, faulty) = devices(images.into_iter().map(Some).collect());
    let l2 = open(&[("a", &faulty[0]), ("b", &faulty[1])]);
    assert!(
        l2.lookup(5).is_none(),
        "record 5 restored from the log of a device retired before it was written"
    );
    assert_eq!(on_device(&l2, 0), 0, "records restored from an abandoned log");
    assert_eq!(on_device(&l2, 1), 20, "the healthy device's records were lost");
    assert_eq!(l2.persist_stats().l2_rebuild_abandoned, 1);
}

#[test]
fn the_record_survives_a_start_without_the_retired_device() {
    let images = first_device_retired_unreset();
    let (crash, faulty) = devices(images.into_iter().map(Some).collect());
    // A start with the second device only: the first's entry is carried on.
    let l2 = open(&[("b", &faulty[1])]);
    assert_eq!(on_device(&l2, 0), 20, "the healthy device is now the first");
    let l2 = stop_and_start_both(l2, &crash);
    assert!(l2.lookup(5).is_none(), "record 5 restored once the device came back");
    assert_eq!(on_device(&l2, 0), 0);
    assert_eq!(l2.persist_stats().l2_rebuild_abandoned, 1);
}

#[test]
fn a_device_refused_once_is_trusted_again_with_its_new_log() {
    let images = first_device_retired_unreset();
    let (crash, faulty) = devices(images.into_iter().map(Some).collect());
    let l2 = open(&[("a", &faulty[0]), ("b", &faulty[1])]);
    assert_eq!(on_device(&l2, 0), 0);
    // Its new incarnation's log is its own, and is restored as any other.
    feed(&l2, 0, 100..110);
    let l2 = stop_and_start_both(l2, &crash);
    assert_eq!(on_device(&l2, 0), 10, "the refused device's new log was not restored");
    assert_eq!(on_device(&l2, 1), 20);
    assert_eq!(l2.persist_stats().l2_rebuild_abandoned, 0, "refused again for its old incarnation's entry");
}

#[test]
fn an_entry_names_one_incarnation_of_its_device_only() {
    // The first device fails writes to its data area only: retired, its
    // header is reset (a new, empty incarnation), and the second device
    // records the old incarnation anyway.
    let images = first_device_retired(FaultPlan {
        fail_writes: std::iter::once(HEADER_RESERVED..DEV_SIZE).collect(),
        ..Default::default()
    });
    let (crash, faulty) = devices(images.into_iter().map(Some).collect());
    // Started alone, it fills its new incarnation.
    let l2 = open(&[("a", &faulty[0])]);
    assert_eq!(on_device(&l2, 0), 0, "the reset header still described the old log");
    feed(&l2, 0, 100..110);
    // With the second device again, whose header still names the old
    // incarnation: the new log is restored.
    let l2 = stop_and_start_both(l2, &crash);
    assert_eq!(on_device(&l2, 0), 10, "a log of another incarnation was refused");
    assert_eq!(on_device(&l2, 1), 20);
    assert_eq!(l2.persist_stats().l2_rebuild_abandoned, 0);
}

#[test]
fn a_start_where_the_retired_device_still_fails_keeps_the_record() {
    let images = first_device_retired_unreset();
    let (crash, faulty) = devices(images.into_iter().map(Some).collect());
    // Listed after the device that recorded it, and still failing writes:
    // its reset cannot be written and the start fails, after the recorder's
    // header was written.
    faulty[0]
        .set_plan(FaultPlan { fail_writes: std::iter::once(0..DEV_SIZE).collect(), ..Default::default() });
    assert!(
        try_open(&[("b", &faulty[1]), ("a", &faulty[0])]).is_err(),
        "a device that cannot be written opened"
    );
    let (_, faulty) = devices(crash.iter().map(|c| Some(c.image_bytes(|_| true))).collect());
    let l2 = open(&[("b", &faulty[1]), ("a", &faulty[0])]);
    assert!(l2.lookup(5).is_none(), "record 5 restored: the failed start dropped the record");
    assert_eq!(on_device(&l2, 1), 0);
    assert_eq!(on_device(&l2, 0), 20);
}

#[test]
fn a_recorder_retired_in_turn_still_names_the_first_at_a_clean_stop() {
    let (crash, faulty) = devices(vec![None, None]);
    let l2 = open(&[("a", &faulty[0]), ("b", &faulty[1])]);
    feed(&l2, 0, 0..20);
    feed(&l2, 1, 20..40);
    l2.sync_logs();
    faulty[0]
        .set_plan(FaultPlan { fail_writes: std::iter::once(0..DEV_SIZE).collect(), ..Default::default() });
    l2.begin_write(&[5]);
    l2.end_write(&[5]);
    // The second device fails writes to its data area only (its header
    // stays writable) and is retired by a write of one of its records.
    faulty[1].set_plan(FaultPlan {
        fail_writes: std::iter::once(HEADER_RESERVED..DEV_SIZE).collect(),
        ..Default::default()
    });
    l2.begin_write(&[25]);
    l2.end_write(&[25]);
    assert_eq!(l2.healthy_devices(), 0);
    // A clean stop writes a fresh header on both: the second's must still
    // name the first's log.
    l2.sync_logs();
    l2.mark_closed();
    drop(l2);
    let (_, faulty) = devices(crash.iter().map(|c| Some(c.image_bytes(|_| true))).collect());
    let l2 = open(&[("a", &faulty[0]), ("b", &faulty[1])]);
    assert!(l2.lookup(5).is_none(), "record 5 restored from the first device's log");
    assert_eq!(on_device(&l2, 0), 0);
    assert_eq!(l2.persist_stats().l2_rebuild_abandoned, 1);
}
