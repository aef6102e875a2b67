//! A device taken out of service hears of no more writes, so its log must
//! never be restored, even when its own header cannot be reset (it fails
//! writes) and the device works again at the next start: the other
//! devices' headers record that log as abandoned (docs/format.md,
//! "Abandoned-logs block").

use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arcache_l2::{
    BlobFlags, ExportDesc, FeedItem, L2Arc, L2Device, PersistOptions, SharedBytes, HEADER_RESERVED,
};
use blockdev::{BlockDev, CrashDev, FaultPlan, FaultyDev};

const REC: usize = 4096;
const RECORDS: u64 = 1000;
const DEV_SIZE: u64 = HEADER_RESERVED + (4 << 20);

fn export() -> ExportDesc {
    ExportDesc {
        id: 0,
        name: "e".into(),
        recordsize: REC as u32,
        size: RECORDS * REC as u64,
        identity: 5,
        contents: 5,
    }
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
    try_open_in(devs, None)
}

/// [`try_open`] with abandoned-log marks kept in `state_dir`.
fn try_open_in(devs: &[(&str, &Faulty)], state_dir: Option<&std::path::Path>) -> Result<L2Arc, String> {
    try_open_sized(devs, state_dir, 0)
}

/// [`try_open_in`] where devices smaller than `min_l2size` keep no log.
fn try_open_sized(
    devs: &[(&str, &Faulty)],
    state_dir: Option<&std::path::Path>,
    min_l2size: u64,
) -> Result<L2Arc, String> {
    let l2devs = devs
        .iter()
        .map(|(name, d)| L2Device::new((*name).into(), Arc::clone(d) as Arc<dyn BlockDev>).unwrap())
        .collect();
    let opts =
        PersistOptions { rebuild_enabled: true, min_l2size, state_dir: state_dir.map(|d| d.to_path_buf()) };
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

/// Fresh devices over what `crash` holds as a kill -9 leaves it.
fn restarted(crash: &[Arc<CrashDev>]) -> (Vec<Arc<CrashDev>>, Vec<Faulty>) {
    devices(crash.iter().map(|c| Some(c.image_bytes(|_| true))).collect())
}

/// Stops `l2` cleanly and starts again over both devices' images.
fn stop_and_start_both(l2: L2Arc, crash: &[Arc<CrashDev>]) -> L2Arc {
    l2.sync_logs();
    l2.mark_closed();
    drop(l2);
    let (_, faulty) = restarted(crash);
    open(&[("a", &faulty[0]), ("b", &faulty[1])])
}

fn on_device(l2: &L2Arc, dev: usize) -> usize {
    (0..RECORDS).filter(|&k| l2.lookup(k).is_some_and(|p| p.dev() == dev)).count()
}

/// Two devices, records 0..20 on the first and 20..40 on the second, all
/// logged; then the first fails every write and flush, and a client write
/// of record 5 retires it (its log commit fails) and cannot reset its
/// header. Returns new devices over what a kill -9 then leaves.
fn first_device_retired_unreset() -> (Vec<Arc<CrashDev>>, Vec<Faulty>) {
    first_device_retired(FaultPlan {
        fail_writes: std::iter::once(0..DEV_SIZE).collect(),
        fail_flush: true,
        ..Default::default()
    })
}

/// As [`first_device_retired_unreset`], the first device failing as `plan` says.
fn first_device_retired(plan: FaultPlan) -> (Vec<Arc<CrashDev>>, Vec<Faulty>) {
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
    restarted(&crash)
}

#[test]
fn a_retired_device_whose_header_could_not_be_reset_restores_nothing() {
    // The first device works again at the next start; its log still
    // describes record 5 as it was before the write.
    let (_, faulty) = first_device_retired_unreset();
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
    let (crash, faulty) = first_device_retired_unreset();
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
    let (crash, faulty) = first_device_retired_unreset();
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
    let (crash, faulty) = first_device_retired(FaultPlan {
        fail_writes: std::iter::once(HEADER_RESERVED..DEV_SIZE).collect(),
        ..Default::default()
    });
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
    let (crash, faulty) = first_device_retired_unreset();
    // Listed after the device that recorded it, and still failing writes:
    // its reset cannot be written and the start fails, after the recorder's
    // header was written.
    faulty[0]
        .set_plan(FaultPlan { fail_writes: std::iter::once(0..DEV_SIZE).collect(), ..Default::default() });
    assert!(
        try_open(&[("b", &faulty[1]), ("a", &faulty[0])]).is_err(),
        "a device that cannot be written opened"
    );
    let (_, faulty) = restarted(&crash);
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
    let l2 = stop_and_start_both(l2, &crash);
    assert!(l2.lookup(5).is_none(), "record 5 restored from the first device's log");
    assert_eq!(on_device(&l2, 0), 0);
    assert_eq!(l2.persist_stats().l2_rebuild_abandoned, 1);
}

/// A device whose header writes wait, once armed, until released.
struct HeaderGate {
    inner: CrashDev,
    armed: AtomicBool,
    entered: AtomicBool,
    released: AtomicBool,
}

impl BlockDev for HeaderGate {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> blockdev::DevResult<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> blockdev::DevResult<()> {
        if offset < HEADER_RESERVED && self.armed.load(SeqCst) {
            self.entered.store(true, SeqCst);
            wait_for(&self.released, "the gate's release");
        }
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> blockdev::DevResult<()> {
        self.inner.flush()
    }
    fn describe(&self) -> String {
        "header gate".into()
    }
}

fn wait_for(flag: &AtomicBool, what: &str) {
    let until = Instant::now() + Duration::from_secs(20);
    while !flag.load(SeqCst) {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// While the first writer to find the device failing is still recording
/// its log as abandoned on the other device, a second write of a record
/// on it must not be acknowledged: its invalidation is not logged, and no
/// header says yet that the log is not to be trusted.
#[test]
fn no_write_is_acknowledged_before_the_abandoned_log_is_recorded() {
    let (_, faulty) = devices(vec![None]);
    let gate = Arc::new(HeaderGate {
        inner: CrashDev::new(DEV_SIZE),
        armed: AtomicBool::new(false),
        entered: AtomicBool::new(false),
        released: AtomicBool::new(false),
    });
    let devs = vec![
        L2Device::new("a".into(), Arc::clone(&faulty[0]) as Arc<dyn BlockDev>).unwrap(),
        L2Device::new("b".into(), Arc::clone(&gate) as Arc<dyn BlockDev>).unwrap(),
    ];
    let l2 = L2Arc::open(
        devs,
        &[export()],
        &PersistOptions { rebuild_enabled: true, min_l2size: 0, state_dir: None },
    )
    .unwrap();
    l2.rebuild(u64::MAX, &|_| 0, &AtomicBool::new(false));
    feed(&l2, 0, 0..20);
    l2.sync_logs();
    faulty[0]
        .set_plan(FaultPlan { fail_writes: std::iter::once(0..DEV_SIZE).collect(), ..Default::default() });
    gate.armed.store(true, SeqCst);
    let (second_started, second_done) = (AtomicBool::new(false), AtomicBool::new(false));
    std::thread::scope(|s| {
        s.spawn(|| {
            l2.begin_write(&[5]);
            l2.end_write(&[5]);
        });
        // The race: the first writer is recording the abandoned log.
        wait_for(&gate.entered, "the first writer's record on the other device");
        let second = s.spawn(|| {
            second_started.store(true, SeqCst);
            l2.begin_write(&[6]);
            second_done.store(true, SeqCst);
            l2.end_write(&[6]);
        });
        std::thread::sleep(Duration::from_millis(300));
        assert!(second_started.load(SeqCst), "the second writer never reached its write");
        let early = second_done.load(SeqCst);
        gate.released.store(true, SeqCst);
        second.join().unwrap();
        assert!(!early, "a write was acknowledged while the abandoned log was not yet recorded");
    });
    assert!(second_done.load(SeqCst));
    assert_eq!(l2.healthy_devices(), 1);
}

/// `arcache l2 forget` of the device holding the record forgets that
/// device's own contents, not the other device's abandoned log.
#[test]
fn forgetting_the_recorder_keeps_the_record() {
    let (crash, faulty) = first_device_retired_unreset();
    let recorder = L2Device::new("b".into(), Arc::clone(&faulty[1]) as Arc<dyn BlockDev>).unwrap();
    arcache_l2::forget(&recorder).unwrap();
    drop(recorder);
    let (_, faulty) = restarted(&crash);
    let l2 = open(&[("a", &faulty[0]), ("b", &faulty[1])]);
    assert!(l2.lookup(5).is_none(), "record 5 restored after the recorder was forgotten");
    assert_eq!(on_device(&l2, 0), 0);
    assert_eq!(on_device(&l2, 1), 0, "the forgotten device kept its records");
    assert_eq!(l2.persist_stats().l2_rebuild_abandoned, 1);
}

/// One device, records 0..20 logged, a state directory for marks; then the
/// device fails every write and flush and a client write of record 5
/// retires it: no other header can record its log. Returns new devices
/// over what a kill -9 then leaves, twice (two independent starts).
fn single_device_retired(state: &std::path::Path) -> [Faulty; 2] {
    let (crash, faulty) = devices(vec![None]);
    let l2 = started_in(state, &faulty[0]);
    feed(&l2, 0, 0..20);
    l2.sync_logs();
    assert_eq!(on_device(&l2, 0), 20);
    faulty[0].set_plan(FaultPlan {
        fail_writes: std::iter::once(0..DEV_SIZE).collect(),
        fail_flush: true,
        ..Default::default()
    });
    l2.begin_write(&[5]);
    l2.end_write(&[5]);
    assert_eq!(l2.healthy_devices(), 0, "the failing device was not retired");
    let (_, mut a) = restarted(&crash);
    let (_, mut b) = restarted(&crash);
    [a.remove(0), b.remove(0)]
}

fn marks_in(state: &std::path::Path) -> Vec<String> {
    match std::fs::read_dir(state.join("l2-abandoned")) {
        Ok(d) => d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect(),
        Err(_) => Vec::new(),
    }
}

/// Device "a" started with the state directory, its log rebuilt where
/// the marks let it be.
fn started_in(state: &std::path::Path, device: &Faulty) -> L2Arc {
    let l2 = try_open_in(&[("a", device)], Some(state)).unwrap();
    l2.rebuild(u64::MAX, &|_| 0, &AtomicBool::new(false));
    l2
}

/// The one mark in `state`, and the name its temporary file has.
fn the_mark(state: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let names = marks_in(state);
    assert_eq!(names.len(), 1, "{names:?}");
    let dir = state.join("l2-abandoned");
    (dir.join(&names[0]), dir.join(format!("{}.tmp", names[0])))
}

#[test]
fn a_single_devices_abandoned_log_is_refused_by_its_mark_in_the_state_dir() {
    let state = tempfile::tempdir().unwrap();
    let [unmarked, marked] = single_device_retired(state.path());
    assert_eq!(marks_in(state.path()).len(), 1, "the abandoned log was not marked");
    // Without the mark the device's stale log comes back: what the mark is for.
    let l2 = open(&[("a", &unmarked)]);
    assert!(l2.lookup(5).is_some(), "the control start restored record 5 from the stale log");
    drop(l2);
    let l2 = started_in(state.path(), &marked);
    assert!(l2.lookup(5).is_none(), "record 5 restored from a log marked abandoned");
    assert_eq!(on_device(&l2, 0), 0, "records restored from an abandoned log");
    assert_eq!(l2.persist_stats().l2_rebuild_abandoned, 1);
    assert!(marks_in(state.path()).is_empty(), "the spent mark was kept: {:?}", marks_in(state.path()));
}

/// A marked device started again below `l2arc_rebuild_blocks_min_l2size`
/// keeps no log: its header is written anew, with a new incarnation, so
/// its old log can never come back and the mark is spent too.
#[test]
fn the_mark_of_a_device_that_now_keeps_no_log_is_removed_as_spent() {
    let state = tempfile::tempdir().unwrap();
    let [_, device] = single_device_retired(state.path());
    assert_eq!(marks_in(state.path()).len(), 1);
    let l2 = try_open_sized(&[("a", &device)], Some(state.path()), DEV_SIZE + 1).unwrap();
    assert!(l2.lookup(5).is_none());
    assert!(marks_in(state.path()).is_empty(), "the spent mark was kept: {:?}", marks_in(state.path()));
}

/// With no device that keeps a log there is nothing to mark, so the start
/// does not try the state directory (which it would make, to probe it).
#[test]
fn a_start_with_no_device_that_keeps_a_log_leaves_the_state_dir_alone() {
    let state = tempfile::tempdir().unwrap();
    let (_, fresh) = devices(vec![None]);
    drop(try_open_sized(&[("a", &fresh[0])], Some(state.path()), DEV_SIZE + 1).unwrap());
    assert!(!state.path().join("l2-abandoned").exists(), "the mark directory was probed");
    drop(try_open_sized(&[("a", &fresh[0])], Some(state.path()), 0).unwrap());
    assert!(state.path().join("l2-abandoned").exists(), "a device with a log: the directory is probed");
}

#[test]
fn a_damaged_mark_still_refuses_its_log_and_absent_devices_keep_theirs() {
    let state = tempfile::tempdir().unwrap();
    let [other, marked] = single_device_retired(state.path());
    let names = marks_in(state.path());
    assert_eq!(names.len(), 1);
    std::fs::write(state.path().join("l2-abandoned").join(&names[0]), b"not a mark").unwrap();
    // A start without the device keeps its mark.
    let (_, fresh) = devices(vec![None]);
    drop(try_open_in(&[("z", &fresh[0])], Some(state.path())).unwrap());
    assert_eq!(marks_in(state.path()), names, "the mark of an absent device was removed");
    drop(other);
    let l2 = started_in(state.path(), &marked);
    assert!(l2.lookup(5).is_none(), "a damaged mark let its log be restored");
    assert_eq!(l2.persist_stats().l2_rebuild_abandoned, 1);
}

#[test]
fn a_mark_directory_that_cannot_be_read_fails_the_start() {
    let state = tempfile::tempdir().unwrap();
    // Not a directory: read_dir fails with something other than NotFound.
    std::fs::write(state.path().join("l2-abandoned"), b"").unwrap();
    let (_, faulty) = devices(vec![None]);
    let e = try_open_in(&[("a", &faulty[0])], Some(state.path())).err().expect("the start went on");
    assert!(e.contains("abandoned-log marks"), "{e}");
}

/// A mark whose rename failed, or was cut short by a crash after its
/// temporary file was durable, is whole: its writer may have gone on as
/// if marked, so it refuses the log like a mark, and goes once spent.
#[test]
fn a_whole_temporary_mark_refuses_its_log() {
    let state = tempfile::tempdir().unwrap();
    let [_, device] = single_device_retired(state.path());
    let (mark, temp) = the_mark(state.path());
    std::fs::rename(mark, temp).unwrap();
    let l2 = started_in(state.path(), &device);
    assert!(l2.lookup(5).is_none(), "record 5 restored past a whole temporary mark");
    assert_eq!(l2.persist_stats().l2_rebuild_abandoned, 1);
    assert!(marks_in(state.path()).is_empty(), "the spent temporary mark was kept");
}

/// A temporary mark cut short by a crash was not durable, so its writer
/// had not gone on: it refuses nothing, and a start holding its device
/// removes it. Another uuid's (another server's write in progress, whole
/// or not) is left.
#[test]
fn a_partial_temporary_mark_is_removed_by_the_start_holding_its_device() {
    let state = tempfile::tempdir().unwrap();
    let [_, device] = single_device_retired(state.path());
    let (mark, temp) = the_mark(state.path());
    let whole = std::fs::read(&mark).unwrap();
    std::fs::remove_file(&mark).unwrap();
    std::fs::write(temp, &whole[..20]).unwrap();
    let foreign = format!("{:032x}-{:016x}.abandoned.tmp", 7u128, 9u64);
    std::fs::write(state.path().join("l2-abandoned").join(&foreign), b"in progress").unwrap();
    let l2 = started_in(state.path(), &device);
    assert!(l2.lookup(5).is_some(), "a partial temporary mark refused the log");
    assert_eq!(marks_in(state.path()), vec![foreign], "the partial mark of the held device was kept");
}

/// A temporary mark that cannot be read may be whole: it refuses its log
/// and is not removed as partial. (Root reads any file, so a directory of
/// that name stands in for a file on a failing disk.)
#[test]
fn an_unreadable_temporary_mark_refuses_its_log() {
    let state = tempfile::tempdir().unwrap();
    let [_, device] = single_device_retired(state.path());
    let (mark, temp) = the_mark(state.path());
    std::fs::remove_file(mark).unwrap();
    std::fs::create_dir(temp).unwrap();
    let l2 = started_in(state.path(), &device);
    assert!(l2.lookup(5).is_none(), "record 5 restored past an unreadable temporary mark");
    assert_eq!(l2.persist_stats().l2_rebuild_abandoned, 1);
}

/// A device whose header cannot take a writer's unbinding at start leaves
/// service with its log recorded abandoned: its header still binds the
/// records to the store as it is now, which the writer is about to change
/// (docs/persistence.md, "A writer's own changes"). After a kill -9 and a
/// start that finds the store as it was, neither device restores anything:
/// the first is abandoned, the second unbound.
#[test]
fn a_device_that_cannot_be_unbound_leaves_service_and_restores_nothing() {
    let (crash, faulty) = devices(vec![None, None]);
    let l2 = open(&[("a", &faulty[0]), ("b", &faulty[1])]);
    feed(&l2, 0, 0..20);
    feed(&l2, 1, 20..40);
    l2.sync_logs();
    faulty[0].set_plan(FaultPlan {
        fail_writes: std::iter::once(0..DEV_SIZE).collect(),
        fail_flush: true,
        ..Default::default()
    });
    l2.unbind_contents(0);
    assert_eq!(l2.healthy_devices(), 1, "the device that kept the old binding was not retired");
    drop(l2);
    let (_, faulty) = restarted(&crash);
    let l2 = open(&[("a", &faulty[0]), ("b", &faulty[1])]);
    assert_eq!(on_device(&l2, 0), 0, "restored from the device whose binding could not be moved");
    assert_eq!(on_device(&l2, 1), 0, "restored from the unbound device");
}
