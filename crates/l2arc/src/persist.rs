//! The persistent side of a device: its header, its log of entries, and
//! the rule that makes a write wait until no log can bring back an older
//! copy of what it overwrites (docs/persistence.md).

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::atomic::Ordering::Relaxed;

use blockdev::owner::{Owner, OwnerState};
use tracing::{info, warn};

use crate::format::{
    self, table_name, Abandoned, ExportId, Header, LogBlock, LogPtr, FLAG_FIRST_PASS, FLAG_PERSISTENT,
    HEADER_OFFSETS,
};
use crate::marks::MarkDir;
use crate::{EntryKind, ExportMap, L2Arc, L2Device, Ticket, ALIGN, MAX_DEVICES};

/// An export as configured in this run, with the identity of its backing
/// store.
#[derive(Debug, Clone)]
pub struct ExportDesc {
    /// The engine's export id (the high bits of its keys), or
    /// [`VIEW_EXPORT_ID`] for the file view, whose keys are whole
    /// `arc_policy::key::view` keys.
    pub id: u16,
    pub name: String,
    pub recordsize: u32,
    pub size: u64,
    /// A fingerprint of the backing store (see docs/format.md): the seed
    /// of its records' checksums.
    pub identity: u64,
    /// A fingerprint of what the store holds now (docs/format.md); equal
    /// to `identity` for a store no other server changes.
    pub contents: u64,
}

/// The id of the file view's export (`arcache mount`): no volume has it
/// (volume ids are below `arc_policy::key::VOLUME_IDS`).
pub const VIEW_EXPORT_ID: u16 = u16::MAX;

impl ExportDesc {
    fn kind(&self) -> u16 {
        if self.id == VIEW_EXPORT_ID {
            format::EXPORT_VIEW
        } else {
            format::EXPORT_VOLUME
        }
    }
}

#[derive(Debug, Clone)]
pub struct PersistOptions {
    /// `l2arc_rebuild_enabled`: restore the cache at start.
    pub rebuild_enabled: bool,
    /// `l2arc_rebuild_blocks_min_l2size`: smaller devices keep no log.
    pub min_l2size: u64,
    /// Where abandoned-log marks are kept (docs/format.md); `None`: only
    /// in the other devices' headers.
    pub state_dir: Option<std::path::PathBuf>,
}

impl Default for PersistOptions {
    fn default() -> Self {
        PersistOptions { rebuild_enabled: true, min_l2size: 1 << 30, state_dir: None }
    }
}

/// The durable state of a logging device, as last written (plus what the
/// next header write will record).
pub(crate) struct DevPersist {
    pub hdr: Header,
    pub seed: u64,
    /// Log blocks that a rebuild could still read, oldest first.
    pub live: VecDeque<LogPtr>,
}

/// How far the durable evict position runs ahead of the hand, so a header
/// write is needed only every so often rather than for every batch.
fn evict_chunk(capacity: u64) -> u64 {
    (capacity / 16).clamp(ALIGN, 256 << 20) / ALIGN * ALIGN
}

pub(crate) fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.write_u64(COUNTER.fetch_add(1, Relaxed));
    h.finish()
}

/// What the two header copies of a device say.
// Read once per device at open and then taken apart: its size costs nothing.
#[allow(clippy::large_enum_variant)]
pub enum HeaderRead {
    /// The valid copy with the highest sequence number.
    Valid(Header),
    /// Neither copy carries our magic: a new (or foreign) device.
    Blank,
    /// A copy carries our magic but none validates.
    Damaged(String),
    /// A copy is valid but of another version.
    Unsupported(String),
    IoError(String),
}

pub fn read_header(dev: &L2Device) -> HeaderRead {
    let mut best: Option<Header> = None;
    let mut damaged = None;
    let mut unsupported = None;
    for off in HEADER_OFFSETS {
        let bytes = match dev.read_meta(off, format::HEADER_SIZE) {
            Ok(b) => b,
            Err(e) => return HeaderRead::IoError(e.to_string()),
        };
        match Header::decode(&bytes) {
            Ok(h) if best.as_ref().is_none_or(|b| h.header_seq > b.header_seq) => best = Some(h),
            Ok(_) | Err(format::FormatError::Magic) => {}
            Err(format::FormatError::Version(v)) => unsupported = Some(format!("version {v}")),
            Err(e) => damaged = Some(format!("header copy at {off}: {e}")),
        }
    }
    match (best, unsupported, damaged) {
        (Some(h), _, _) => HeaderRead::Valid(h),
        (None, Some(u), _) => HeaderRead::Unsupported(u),
        (None, None, Some(d)) => HeaderRead::Damaged(d),
        (None, None, None) => HeaderRead::Blank,
    }
}

/// Why a valid header cannot be rebuilt from, if it cannot.
fn unusable(h: &Header, dev: &L2Device) -> Option<String> {
    if h.start != dev.start() || h.capacity != dev.capacity() {
        return Some(format!(
            "geometry changed (start {} capacity {} in the header, {} {} now)",
            h.start,
            h.capacity,
            dev.start(),
            dev.capacity()
        ));
    }
    if !h.evict_lpos.is_multiple_of(ALIGN) {
        return Some("evict position not aligned".into());
    }
    let floor = h.evict_lpos.saturating_sub(h.capacity);
    for p in h.newest.iter().filter(|p| !p.is_none()) {
        if p.lpos + u64::from(p.asize) > h.evict_lpos || p.seq >= h.next_seq || p.lpos < floor {
            return Some(format!("log pointer {p:?} outside the log"));
        }
    }
    None
}

impl L2Arc {
    /// Opens devices with persistence: reads each header, forgets what
    /// cannot be trusted, matches exports to the recorded backing stores,
    /// and prepares the rebuild ([`L2Arc::rebuild`]), which the caller runs
    /// in the background.
    pub fn open(
        devices: Vec<L2Device>,
        exports: &[ExportDesc],
        opts: &PersistOptions,
    ) -> Result<L2Arc, String> {
        if devices.len() > MAX_DEVICES {
            return Err(format!("at most {MAX_DEVICES} L2 devices"));
        }
        let volumes = || exports.iter().filter(|e| e.id != VIEW_EXPORT_ID);
        let max_id = volumes().map(|e| e.id as usize + 1).max().unwrap_or(0);
        let mut maps: Vec<Option<ExportMap>> = vec![None; max_id];
        let mut view = None;
        for e in exports {
            let map = ExportMap {
                identity: e.identity,
                records: if e.id == VIEW_EXPORT_ID {
                    u64::MAX
                } else {
                    e.size.div_ceil(u64::from(e.recordsize.max(1)))
                },
                tags: [0; MAX_DEVICES],
            };
            match e.id {
                VIEW_EXPORT_ID => view = Some(map),
                id => maps[id as usize] = Some(map),
            }
        }
        warn_of_shared_table_names(exports);
        let stats = crate::L2Stats::default();
        let mut persist = Vec::with_capacity(devices.len());
        let mut rebuild = Vec::with_capacity(devices.len());
        let headers: Vec<HeaderRead> = devices.iter().map(read_header).collect();
        let marks = opts.state_dir.as_deref().map(MarkDir::new);
        let found = marks.as_ref().map(MarkDir::list).transpose()?.unwrap_or_default();
        let abandoned = AbandonedLogs::found(&devices, &headers, &found.marks);
        // Every device's incarnation as its durable header now has it,
        // with a log or without (a device below `min_l2size`).
        let mut present: Vec<Abandoned> = Vec::with_capacity(devices.len());
        for ((d, dev), old) in devices.iter().enumerate().zip(headers) {
            let (p, needs_rebuild, identity) = open_device(dev, old, &abandoned, exports, opts, &stats)?;
            present.push(identity);
            if let Some(p) = &p {
                for e in exports {
                    let tag = p
                        .hdr
                        .exports
                        .iter()
                        .find(|x| x.name == table_name(&e.name) && matches(x, e))
                        .map_or(0, |x| x.tag);
                    let map =
                        if e.id == VIEW_EXPORT_ID { view.as_mut() } else { maps[e.id as usize].as_mut() };
                    if let Some(m) = map {
                        m.tags[d] = tag;
                    }
                }
            }
            persist.push(p);
            rebuild.push(needs_rebuild);
        }
        // Marks are written only of logs: without a device that keeps one,
        // the directory need not be writable.
        let keeps_logs = persist.iter().any(Option::is_some);
        let mut l2 = Self::assemble(devices, maps, view, persist)?;
        *l2.abandoned.lock() = abandoned.all;
        if let Some(m) = marks {
            // Every present device's header is durable by now.
            found.remove_spent(&present);
            if keeps_logs {
                if let Err(e) = m.probe() {
                    warn!(
                        "abandoned-log marks cannot be written in {} ({e}): a failing L2 device's log is then recorded only on the other L2 devices, with one device nowhere (docs/persistence.md, Limits)",
                        m.path().display()
                    );
                }
            }
            l2.marks = Some(m);
        }
        for (d, r) in rebuild.into_iter().enumerate() {
            l2.rebuilding[d].store(r, Relaxed);
        }
        l2.stats.add_open(&stats);
        Ok(l2)
    }

    /// Makes sure the hand may reach `need` (an lpos) with the durable
    /// header agreeing: nothing the hand overwrites may still be restorable.
    pub(crate) fn ensure_evict(&self, d: usize, need: u64) -> Result<(), String> {
        let mut g = self.persist[d].lock();
        let Some(p) = g.as_mut() else { return Ok(()) };
        self.ensure_evict_locked(d, p, need)
    }

    fn ensure_evict_locked(&self, d: usize, p: &mut DevPersist, need: u64) -> Result<(), String> {
        if p.hdr.evict_lpos >= need {
            return Ok(());
        }
        p.hdr.evict_lpos = (need + evict_chunk(p.hdr.capacity)).div_ceil(ALIGN) * ALIGN;
        self.write_header(d, p)
    }

    /// Writes the next header copy, after everything written before it is
    /// durable, and makes it durable.
    pub(crate) fn write_header(&self, d: usize, p: &mut DevPersist) -> Result<(), String> {
        let dev = &self.devices[d];
        let floor = p.hdr.evict_lpos.saturating_sub(p.hdr.capacity);
        while p.live.front().is_some_and(|b| b.lpos < floor || b.seq < p.hdr.horizon_seq) {
            p.live.pop_front();
        }
        p.hdr.hand_lpos = dev.hand_lpos();
        p.hdr.flags = FLAG_PERSISTENT | if p.hdr.hand_lpos < p.hdr.capacity { FLAG_FIRST_PASS } else { 0 };
        p.hdr.lb_count = p.live.len() as u64;
        p.hdr.lb_asize = p.live.iter().map(|b| u64::from(b.asize)).sum();
        p.hdr.abandoned = self.abandoned.lock().clone();
        write_header_copy(dev, &mut p.hdr)?;
        self.stats.l2_header_writes.fetch_add(1, Relaxed);
        Ok(())
    }

    /// Waits until every ticket's log position is durable. A device whose
    /// log cannot be written is taken out of service: it will hear of no
    /// more writes, so it must not be trusted again.
    pub fn make_durable(&self, tickets: &[Ticket]) {
        for t in tickets {
            if self.committed[t.dev].load(Relaxed) >= t.upto {
                continue;
            }
            if let Err(e) = self.commit(t.dev, t.upto) {
                warn!(
                    "L2 device {} taken out of service: its log cannot be written ({e})",
                    self.devices[t.dev].path
                );
                self.retire(t.dev);
            }
        }
    }

    /// Writes the open entries of device `d` as log blocks, then the
    /// header, if position `upto` is not durable yet. Concurrent callers
    /// share one commit (group commit).
    fn commit(&self, d: usize, upto: u64) -> Result<(), String> {
        let mut g = self.persist[d].lock();
        let Some(p) = g.as_mut() else {
            // No log on this device: nothing fed is ever restored, nothing waits.
            self.uncommitted[d].store(0, Relaxed);
            return Ok(());
        };
        if self.committed[d].load(Relaxed) >= upto {
            return Ok(());
        }
        // A batch adds its bytes after appending its entries, so every byte
        // counted now has its entries in this commit.
        let pending = self.uncommitted[d].load(Relaxed);
        let (entries, through) = {
            let mut m = self.meta.lock();
            let log = &mut m.logs[d];
            (std::mem::take(&mut log.entries), log.appended)
        };
        for chunk in entries.chunks(format::MAX_ENTRIES) {
            self.write_log_block(d, p, chunk.to_vec())?;
        }
        self.write_header(d, p)?;
        self.stats.l2_log_commits.fetch_add(1, Relaxed);
        self.committed[d].store(through, Relaxed);
        self.uncommitted[d].fetch_sub(pending, Relaxed);
        let mut m = self.meta.lock();
        m.logs[d].invalidated.retain(|_, at| *at > through);
        Ok(())
    }

    fn write_log_block(
        &self,
        d: usize,
        p: &mut DevPersist,
        entries: Vec<format::Entry>,
    ) -> Result<(), String> {
        let dev = &self.devices[d];
        let payload_start =
            entries.iter().filter(|e| e.kind == EntryKind::Cached).map(|e| e.lpos_or_count).min();
        let mut blk = LogBlock {
            seq: p.hdr.next_seq,
            lpos: 0,
            payload_start: 0,
            prev: p.hdr.newest[1],
            compressed: false,
            entries,
        };
        let asize = blk.encode(p.seed).0.len() as u64;
        let res = dev.reserve(asize, 0).ok_or_else(|| format!("no room for a log block on {}", dev.path))?;
        self.forget_evicted(d, &res.evicted, res.offset..res.offset + asize);
        self.ensure_evict_locked(d, p, res.lpos + asize)?;
        blk.lpos = res.lpos;
        blk.payload_start = payload_start.unwrap_or(res.lpos);
        let (bytes, ptr) = blk.encode(p.seed);
        dev.write_meta(res.offset, &bytes).map_err(|e| e.to_string())?;
        p.hdr.next_seq += 1;
        p.hdr.newest = [ptr, p.hdr.newest[0]];
        p.live.push_back(ptr);
        let s = &self.stats;
        s.l2_log_blk_writes.fetch_add(1, Relaxed);
        let avg = s.l2_log_blk_avg_asize.load(Relaxed);
        s.l2_log_blk_avg_asize.store(avg - avg / 3 + asize / 3, Relaxed);
        Ok(())
    }

    /// Makes every entry durable: at a clean stop, so nothing fed is lost
    /// (OpenZFS loses the partial log block).
    pub fn sync_logs(&self) {
        for d in 0..self.devices.len() {
            let upto = self.meta.lock().logs[d].appended;
            self.make_durable(&[Ticket { dev: d, upto }]);
            // The evict position ran ahead of the hand so that not every
            // batch needs a header write; with the hand stopped, pull it
            // back to what was really overwritten, so the next start
            // restores every record still intact.
            let mut g = self.persist[d].lock();
            if let Some(p) = g.as_mut() {
                let dev = &self.devices[d];
                let reached = (dev.floor() + dev.capacity()).max(dev.hand_lpos()).div_ceil(ALIGN) * ALIGN;
                if reached < p.hdr.evict_lpos {
                    p.hdr.evict_lpos = reached;
                    if let Err(e) = self.write_header(d, p) {
                        warn!("L2 device {}: writing the header at stop: {e}", dev.path);
                    }
                }
            }
        }
    }

    /// Binds volume `id`'s records on every device to `contents`: what its
    /// store holds now, as its one writer knows it at a clean stop
    /// (docs/persistence.md, "A writer's own changes"). Durable when this
    /// returns; nothing to do where it is bound so already. A device whose
    /// header cannot be written keeps the binding [`L2Arc::unbind_contents`]
    /// gave it, which no store holds: its records are discarded.
    pub fn rebind_contents(&self, id: u16, contents: u64) {
        self.bind_contents(id, contents);
    }

    /// Binds volume `id`'s records to a value no store holds, durably,
    /// before its writer changes the store: until a clean stop binds them
    /// again, a start after a crash discards them. A device whose header
    /// cannot be written leaves service (its log is recorded abandoned), so
    /// its binding cannot outlive what the store is about to become.
    pub fn unbind_contents(&self, id: u16) {
        for d in self.bind_contents(id, random_u64() | 1) {
            self.retire(d);
        }
    }

    /// The devices whose header could not be written.
    fn bind_contents(&self, id: u16, contents: u64) -> Vec<usize> {
        let Some(map) = self.exports.get(id as usize).and_then(Option::as_ref) else { return Vec::new() };
        let mut failed = Vec::new();
        for (d, dev) in self.devices.iter().enumerate() {
            let tag = map.tags[d];
            let mut g = self.persist[d].lock();
            let Some(p) = g.as_mut() else { continue };
            let Some(x) = p.hdr.exports.iter_mut().find(|x| tag != 0 && x.tag == tag) else { continue };
            if x.contents == contents {
                continue;
            }
            let before = std::mem::replace(&mut x.contents, contents);
            match self.write_header(d, p) {
                Ok(()) => {
                    self.stats.l2_contents_rebinds.fetch_add(1, Relaxed);
                }
                Err(e) => {
                    warn!("L2 device {}: binding export {id}'s records to its contents: {e}", dev.path);
                    if let Some(x) = p.hdr.exports.iter_mut().find(|x| x.tag == tag) {
                        x.contents = before;
                    }
                    failed.push(d);
                }
            }
        }
        failed
    }

    /// Records in every header that this server closed the device cleanly;
    /// after [`L2Arc::sync_logs`], as the last write of a clean stop.
    pub fn mark_closed(&self) {
        for (d, dev) in self.devices.iter().enumerate() {
            let mut g = self.persist[d].lock();
            let written = match g.as_mut() {
                Some(p) => {
                    p.hdr.owner = Owner::this_process(OwnerState::Closed);
                    self.write_header(d, p)
                }
                // Nothing to restore from it: a fresh empty header says so
                // (and still names the logs never to restore).
                None => {
                    let abandoned = self.abandoned.lock().clone();
                    reset_header(dev, None, false, &[], OwnerState::Closed, &abandoned).map(|_| ())
                }
            };
            if let Err(e) = written {
                warn!("L2 device {}: recording the clean stop: {e}", dev.path);
            }
        }
    }

    /// Stops logging on a device leaving service, and tries to reset its
    /// header so its old log is never restored. First, while writes still
    /// wait for this device's log (and so fail and come here too), its log
    /// is recorded as abandoned on every other persistent device: the
    /// reset may fail on a failing device, which could work again at the
    /// next start, and no write may be acknowledged unlogged before some
    /// header says that log is not to be trusted.
    pub(crate) fn abandon_log(&self, d: usize) {
        let id = self.persist[d].lock().as_ref().map(|p| Abandoned::of(&p.hdr));
        if let Some(id) = id {
            self.record_abandoned(d, id);
        }
        self.logs_on[d].store(false, Relaxed);
        self.committed[d].store(u64::MAX, Relaxed);
        let had = self.persist[d].lock().take();
        {
            let mut m = self.meta.lock();
            m.logs[d] = Default::default();
        }
        if let Some(p) = had {
            let abandoned = self.abandoned.lock().clone();
            if let Err(e) =
                reset_header(&self.devices[d], Some(&p.hdr), false, &[], OwnerState::InUse, &abandoned)
            {
                warn!(
                    "could not reset the header of {} ({e}); run `arcache l2 forget {}` before using it again",
                    self.devices[d].path, self.devices[d].path
                );
            }
        }
    }

    /// Adds `id` (device `d`'s log) to the abandoned logs and writes the
    /// header of every other persistent device, durably. Every header
    /// write carries the whole list, so a device whose write fails here
    /// (failing too) still records it at its next successful one.
    fn record_abandoned(&self, d: usize, id: Abandoned) {
        if let Some(m) = &self.marks {
            if let Err(e) = m.record(id) {
                warn!(
                    "could not mark the log of {} as abandoned in the state directory ({e})",
                    self.devices[d].path
                );
            }
        }
        Abandoned::add(&mut self.abandoned.lock(), id);
        for (o, dev) in self.devices.iter().enumerate().filter(|&(o, _)| o != d) {
            let mut g = self.persist[o].lock();
            let Some(p) = g.as_mut() else { continue };
            if let Err(e) = self.write_header(o, p) {
                warn!(
                    "L2 device {}: could not record that the log of {} must not be restored ({e})",
                    dev.path, self.devices[d].path
                );
            }
        }
    }

    /// Live log blocks and their bytes, summed over devices.
    pub fn log_blocks(&self) -> (u64, u64) {
        self.persist.iter().fold((0, 0), |(n, b), p| match p.lock().as_ref() {
            Some(p) => (n + p.live.len() as u64, b + p.live.iter().map(|x| u64::from(x.asize)).sum::<u64>()),
            None => (n, b),
        })
    }
}

fn matches(x: &ExportId, e: &ExportDesc) -> bool {
    x.kind == e.kind()
        && x.recordsize == e.recordsize
        && x.size == e.size
        && x.identity == e.identity
        && x.contents == e.contents
}

/// The abandoned-logs blocks found at start (docs/format.md): which logs
/// must not be restored.
struct AbandonedLogs {
    /// Every entry found, with the path of a device that recorded it.
    found: Vec<(Abandoned, String)>,
    /// The same entries, oldest first: what every header carries on. None
    /// is dropped because its device is present: headers are written one
    /// device at a time, and a crash (or a failing device's reset) between
    /// them must not leave the only record gone. An entry whose device got
    /// a new incarnation can never match again; it costs 24 bytes.
    all: Vec<Abandoned>,
}

impl AbandonedLogs {
    fn found(devices: &[L2Device], headers: &[HeaderRead], marked: &[(Abandoned, PathBuf)]) -> AbandonedLogs {
        let mut found: Vec<(Abandoned, String)> = Vec::new();
        let mut all = Vec::new();
        for &(a, ref path) in marked {
            if Abandoned::add(&mut all, a) {
                found.push((a, path.display().to_string()));
            }
        }
        for (dev, h) in devices.iter().zip(headers) {
            if let HeaderRead::Valid(h) = h {
                for a in &h.abandoned {
                    if Abandoned::add(&mut all, *a) {
                        found.push((*a, dev.path.clone()));
                    }
                }
            }
        }
        AbandonedLogs { found, all }
    }

    /// The device that recorded `h`'s log as abandoned, if one did.
    fn recorded_by(&self, h: &Header) -> Option<&str> {
        let me = Abandoned::of(h);
        self.found.iter().find(|(a, _)| *a == me).map(|(_, by)| by.as_str())
    }
}

/// Opens one device whose header read as `old`; returns its persistent
/// state (None when it keeps no log), whether it has a log to rebuild
/// from, and the incarnation its header, durable by now, names.
fn open_device(
    dev: &L2Device,
    old: HeaderRead,
    abandoned: &AbandonedLogs,
    exports: &[ExportDesc],
    opts: &PersistOptions,
    stats: &crate::L2Stats,
) -> Result<(Option<DevPersist>, bool, Abandoned), String> {
    let persistent = dev.size() >= opts.min_l2size;
    if !persistent {
        // Said at every start: OpenZFS is silent about it, and a user who
        // sized a small device for a trial learns only after a restart
        // that it came back empty.
        warn!(
            "L2 device {}: no persistent log, so it starts empty after a restart: its {} bytes are fewer \
             than l2arc_rebuild_blocks_min_l2size ({}; lower it with --set to keep a log)",
            dev.path,
            dev.size(),
            opts.min_l2size
        );
    }
    let previous = match &old {
        HeaderRead::Valid(h) => Some(h.clone()),
        _ => None,
    };
    if let Some(h) = previous.as_ref().filter(|h| h.owner.state == OwnerState::InUse) {
        // Safe to restore (the log is crash-consistent), but worth a line:
        // a crash, a kill, or a server on another host that still has it.
        warn!(
            "L2 device {} was not closed cleanly (last opened by host {} pid {})",
            dev.path, h.owner.host, h.owner.pid
        );
    }
    let reset = |why: Option<String>| -> Result<(Option<DevPersist>, bool, Abandoned), String> {
        if let Some(why) = why {
            warn!("L2 device {}: starting empty: {why}", dev.path);
        }
        let hdr =
            reset_header(dev, previous.as_ref(), persistent, exports, OwnerState::InUse, &abandoned.all)
                .map_err(|e| format!("{}: writing the header: {e}", dev.path))?;
        dev.restore_hand(0);
        let identity = Abandoned::of(&hdr);
        Ok((persistent.then(|| persist_state(hdr)), false, identity))
    };
    let h = match old {
        HeaderRead::Blank => return reset(None),
        HeaderRead::IoError(e) => {
            stats.l2_rebuild_dh_errors.fetch_add(1, Relaxed);
            return reset(Some(format!("the header cannot be read: {e}")));
        }
        HeaderRead::Damaged(e) => {
            stats.l2_rebuild_dh_errors.fetch_add(1, Relaxed);
            return reset(Some(format!("the header is damaged: {e}")));
        }
        HeaderRead::Unsupported(e) => {
            stats.l2_rebuild_unsupported.fetch_add(1, Relaxed);
            return reset(Some(format!("unsupported header: {e}")));
        }
        HeaderRead::Valid(h) => h,
    };
    if let Some(by) = abandoned.recorded_by(&h) {
        stats.l2_rebuild_abandoned.fetch_add(1, Relaxed);
        return reset(Some(format!(
            "an earlier server took it out of service and recorded on {by} that its log must not be restored"
        )));
    }
    if let Some(why) = unusable(&h, dev) {
        stats.l2_rebuild_unsupported.fetch_add(1, Relaxed);
        return reset(Some(why));
    }
    if !h.persistent() {
        return reset(None);
    }
    if !persistent {
        // Said above, at the decision.
        return reset(None);
    }
    if !opts.rebuild_enabled {
        return reset(Some("l2arc_rebuild_enabled is 0".into()));
    }
    let mut hdr = h;
    let mut kept = Vec::new();
    for x in hdr.exports.drain(..) {
        match exports.iter().find(|e| table_name(&e.name) == x.name) {
            Some(e) if matches(&x, e) => kept.push(x),
            Some(e) => {
                stats.l2_rebuild_discarded_exports.fetch_add(1, Relaxed);
                warn!(
                    "L2 device {}: discarding the records of export {:?}: its backing store changed \
                     (size {} -> {}, recordsize {} -> {}, identity {:016x} -> {:016x}, contents {:016x} -> {:016x})",
                    dev.path,
                    x.name,
                    x.size,
                    e.size,
                    x.recordsize,
                    e.recordsize,
                    x.identity,
                    e.identity,
                    x.contents,
                    e.contents
                );
            }
            None => {
                stats.l2_rebuild_discarded_exports.fetch_add(1, Relaxed);
                warn!(
                    "L2 device {}: discarding the records of export {:?}: it is not served now",
                    dev.path, x.name
                );
            }
        }
    }
    hdr.exports = kept;
    add_new_exports(&mut hdr, exports)?;
    let has_log = !hdr.newest[0].is_none();
    hdr.owner = Owner::this_process(OwnerState::InUse);
    hdr.abandoned = abandoned.all.clone();
    let mut p = persist_state(hdr);
    dev.restore_hand(p.hdr.evict_lpos);
    // The export table must be durable before any entry uses a new tag.
    p.hdr.hand_lpos = dev.hand_lpos();
    write_header_copy(dev, &mut p.hdr).map_err(|e| format!("{}: writing the header: {e}", dev.path))?;
    let identity = Abandoned::of(&p.hdr);
    Ok((Some(p), has_log, identity))
}

fn persist_state(hdr: Header) -> DevPersist {
    let seed = format::log_seed(hdr.uuid, hdr.incarnation);
    DevPersist { hdr, seed, live: VecDeque::new() }
}

/// Two exports whose names agree in the bytes the export table keeps of a
/// name share one entry: only the one that made it keeps its records
/// across restarts (the other's identity never matches it, so nothing
/// wrong is restored). Said at start rather than left to be found.
fn warn_of_shared_table_names(exports: &[ExportDesc]) {
    for (i, a) in exports.iter().enumerate() {
        if let Some(b) = exports[..i].iter().find(|b| table_name(&b.name) == table_name(&a.name)) {
            warn!(
                "exports {:?} and {:?} agree in the first {} bytes of their names, all the L2's export table keeps: \
                 only one of them keeps its L2 records across restarts (shorten one name)",
                b.name,
                a.name,
                table_name(&a.name).len()
            );
        }
    }
}

fn add_new_exports(hdr: &mut Header, exports: &[ExportDesc]) -> Result<(), String> {
    for e in exports {
        if hdr.exports.iter().any(|x| x.name == table_name(&e.name)) {
            continue;
        }
        if hdr.exports.len() >= format::MAX_EXPORTS {
            warn!(
                "export {:?} is not persisted on L2: at most {} exports per device",
                e.name,
                format::MAX_EXPORTS
            );
            continue;
        }
        let tag = hdr.last_tag.checked_add(1).ok_or("export tags exhausted; run `arcache l2 forget`")?;
        hdr.last_tag = tag;
        hdr.exports.push(ExportId {
            tag,
            kind: e.kind(),
            recordsize: e.recordsize,
            size: e.size,
            identity: e.identity,
            contents: e.contents,
            name: table_name(&e.name).to_string(),
        });
    }
    Ok(())
}

/// Writes `hdr` as the next header copy (the one its new sequence number
/// picks), after everything written before it is durable, and makes it
/// durable.
fn write_header_copy(dev: &L2Device, hdr: &mut Header) -> Result<(), String> {
    hdr.header_seq += 1;
    let bytes = hdr.encode().map_err(|e| e.to_string())?;
    dev.flush().map_err(|e| e.to_string())?;
    dev.write_meta(HEADER_OFFSETS[(hdr.header_seq % 2) as usize], &bytes).map_err(|e| e.to_string())?;
    dev.flush().map_err(|e| e.to_string())
}

/// Writes `hdr` to both copies, so no older copy is ever read again.
fn write_both_copies(dev: &L2Device, hdr: &mut Header) -> Result<(), String> {
    for _ in 0..2 {
        write_header_copy(dev, hdr)?;
    }
    Ok(())
}

/// Starts a new incarnation: a header with no log, written to both copies
/// (so neither copy of the old incarnation survives to be trusted).
pub(crate) fn reset_header(
    dev: &L2Device,
    previous: Option<&Header>,
    persistent: bool,
    exports: &[ExportDesc],
    state: OwnerState,
    abandoned: &[Abandoned],
) -> Result<Header, String> {
    let uuid =
        previous.map_or_else(|| (u128::from(random_u64()) << 64) | u128::from(random_u64()), |h| h.uuid);
    let mut hdr = Header {
        flags: FLAG_FIRST_PASS | if persistent { FLAG_PERSISTENT } else { 0 },
        uuid,
        incarnation: random_u64(),
        header_seq: previous.map_or(0, |h| h.header_seq),
        device_size: dev.size(),
        start: dev.start(),
        capacity: dev.capacity(),
        hand_lpos: 0,
        evict_lpos: 0,
        next_seq: 1,
        horizon_seq: 1,
        newest: [LogPtr::default(); 2],
        lb_count: 0,
        lb_asize: 0,
        last_tag: 0,
        exports: Vec::new(),
        owner: Owner::this_process(state),
        abandoned: abandoned.to_vec(),
    };
    if persistent {
        add_new_exports(&mut hdr, exports)?;
    }
    write_both_copies(dev, &mut hdr)?;
    Ok(hdr)
}

/// `arcache l2 forget --export NAME`: drops the named exports from the
/// export table, so no start restores their records (log entries name an
/// export by tag, and a tag is never given again in an incarnation); the
/// other exports' records are kept. Both header copies are rewritten. The
/// names must all be in the table.
pub fn forget_exports(dev: &L2Device, names: &[String]) -> Result<(), String> {
    let mut hdr = match read_header(dev) {
        HeaderRead::Valid(h) => h,
        HeaderRead::Blank => return Err(format!("{}: no header: the device holds nothing", dev.path)),
        _ => {
            return Err(format!(
            "{}: its header cannot be read or is not this version's; `l2 forget` without --export empties it",
            dev.path
        ))
        }
    };
    let listed = |x: &ExportId| names.iter().any(|n| table_name(n) == x.name);
    let missing: Vec<&String> =
        names.iter().filter(|n| !hdr.exports.iter().any(|x| x.name == table_name(n))).collect();
    if !missing.is_empty() {
        let known: Vec<&str> = hdr.exports.iter().map(|x| x.name.as_str()).collect();
        return Err(format!("{}: no export {missing:?} in its table (it has {known:?})", dev.path));
    }
    hdr.exports.retain(|x| !listed(x));
    // The copies name who wrote them last; the state (clean stop or not)
    // stays what the server left.
    hdr.owner = Owner::this_process(hdr.owner.state);
    write_both_copies(dev, &mut hdr)?;
    info!("L2 device {}: records of {names:?} forgotten", dev.path);
    Ok(())
}

/// `arcache l2 forget`: a new incarnation with nothing in it.
pub fn forget(dev: &L2Device) -> Result<(), String> {
    let previous = match read_header(dev) {
        HeaderRead::Valid(h) => Some(h),
        _ => None,
    };
    let persistent = previous.as_ref().is_some_and(|h| h.persistent());
    // Other devices' abandoned logs stay recorded: forgetting this one's
    // contents says nothing of theirs.
    let abandoned = previous.as_ref().map_or_else(Vec::new, |h| h.abandoned.clone());
    reset_header(dev, previous.as_ref(), persistent, &[], OwnerState::Closed, &abandoned)?;
    info!("L2 device {}: contents forgotten", dev.path);
    Ok(())
}
