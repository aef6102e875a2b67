//! The file view's records on a persistent L2 (docs/format.md, export kind
//! 1): their log entries carry whole view keys, and the rebuild restores a
//! view key only under the view's export, only of a kind the view has
//! (attributes, listing chunks, symlink targets, xattrs, file data), and
//! not at all once the view's source is another (its identity changed).

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use arc_policy::key::view::{make, Kind};
use arcache_l2::{
    BlobFlags, ExportDesc, FeedItem, L2Arc, L2Device, PersistOptions, SharedBytes, HEADER_RESERVED,
    VIEW_EXPORT_ID,
};
use blockdev::{BlockDev, CrashDev};

const REC: usize = 4096;
const DEV_SIZE: u64 = HEADER_RESERVED + (4 << 20);

fn volume() -> ExportDesc {
    ExportDesc {
        id: 0,
        name: "vol".into(),
        recordsize: REC as u32,
        size: 64 * REC as u64,
        identity: 7,
        contents: 7,
    }
}

fn view(identity: u64) -> ExportDesc {
    ExportDesc {
        id: VIEW_EXPORT_ID,
        name: "/srv/src".into(),
        recordsize: REC as u32,
        size: 0,
        identity,
        contents: identity,
    }
}

fn open(dev: &Arc<CrashDev>, exports: &[ExportDesc]) -> L2Arc {
    let d = L2Device::new("p".into(), Arc::clone(dev) as Arc<dyn BlockDev>).unwrap();
    let l2 = L2Arc::open(
        vec![d],
        exports,
        &PersistOptions { rebuild_enabled: true, min_l2size: 0, state_dir: None },
    )
    .unwrap();
    l2.rebuild(u64::MAX, &|_| 0, &AtomicBool::new(false));
    l2
}

fn bytes(key: u64) -> Vec<u8> {
    key.to_le_bytes().iter().copied().cycle().take(REC).collect()
}

fn feed(l2: &L2Arc, keys: &[u64]) {
    let items: Vec<FeedItem> = keys
        .iter()
        .filter(|&&k| l2.begin_feed(k))
        .map(|&k| FeedItem { key: k, data: Arc::new(bytes(k)) as SharedBytes, flags: BlobFlags::default() })
        .collect();
    assert_eq!(items.len(), keys.len(), "every key is taken for the feed");
    l2.write_batch(0, items, 0, false).unwrap();
    l2.sync_logs();
}

/// A view key whose kind bits name no kind the view has.
fn unknown_kind(kind_bits: u64, object: u64) -> u64 {
    (1 << 63) | (kind_bits << 60) | (object << 24)
}

#[test]
fn view_keys_come_back_under_the_view_only_and_unknown_kinds_never() {
    let good: Vec<u64> = [Kind::Attr, Kind::DirChunk, Kind::Symlink, Kind::Xattrs, Kind::Data]
        .iter()
        .enumerate()
        .map(|(i, &kind)| make(kind, 1000 + i as u64, i as u64))
        .collect();
    let bad: Vec<u64> = (5..=7).map(|k| unknown_kind(k, 77)).collect();
    let volume_keys: Vec<u64> = (0..4).map(|r| arc_policy::key::make(0, r)).collect();

    let dev = Arc::new(CrashDev::new(DEV_SIZE));
    let exports = [volume(), view(42)];
    let l2 = open(&dev, &exports);
    feed(&l2, &[good.clone(), bad.clone(), volume_keys.clone()].concat());
    drop(l2);

    // The same view: its known kinds come back, read byte-exact; the
    // unknown kinds are refused and counted.
    let l2 = open(&dev, &exports);
    let st = l2.persist_stats();
    for &k in good.iter().chain(&volume_keys) {
        let p = l2.lookup(k).unwrap_or_else(|| panic!("key {k:#x} not restored: {st:?}"));
        assert_eq!(l2.read(k, p).unwrap()[..], bytes(k)[..], "key {k:#x}");
    }
    for &k in &bad {
        assert!(l2.lookup(k).is_none(), "a view key of unknown kind {k:#x} was restored");
    }
    assert!(st.l2_rebuild_invalid_entries >= bad.len() as u64, "{st:?}");
    drop(l2);

    // Another source under the view (its identity differs): none of the
    // view's keys come back; the volume's still do.
    let l2 = open(&dev, &[volume(), view(43)]);
    for &k in &good {
        assert!(l2.lookup(k).is_none(), "a view key {k:#x} came back for another source");
    }
    for &k in &volume_keys {
        assert!(l2.lookup(k).is_some(), "volume key {k:#x} lost with the view's source");
    }
    drop(l2);

    // No view in this run: view keys are not taken for a volume's.
    let l2 = open(&dev, &[volume()]);
    for &k in good.iter().chain(&bad) {
        assert!(l2.lookup(k).is_none(), "a view key {k:#x} restored with no view");
    }
}
