//! `arcache mount`: a FUSE view of a SOURCE directory whose metadata
//! (attributes, listings, symlink targets, xattrs) and file data are
//! records of arcache's shared ARC (`docs/fileview.md`). Every change made
//! through the view is made on SOURCE before it is answered; changes made
//! to SOURCE directly are seen within the revalidate window.

mod deferred;
mod direct;
mod envelope;
mod openahead;
mod records;
mod sys;
mod table;
mod watch;

use std::ffi::OsStr;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirEntryExt, FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arc_policy::key::view::{self as vkey, Kind};
use arc_policy::Key;
use arcache_engine::{Cache, Record};
use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    KernelConfig, MountOption, OpenFlags, RenameFlags, ReplyAttr, ReplyCreate, ReplyData, ReplyDirectory,
    ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request,
    TimeOrNow,
};
use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use tracing::warn;

use envelope::Version;
pub use records::{Attr, DirEntry, Fingerprint};
use sys::At;
use table::{ObjState, Object, Table, ROOT};
use watch::Watcher;

/// How a view is set up.
#[derive(Debug, Clone)]
pub struct ViewConfig {
    pub source: PathBuf,
    /// Bytes of file data per record (4K..1M).
    pub recordsize: u64,
    /// How long a file's cached records are used before SOURCE is asked
    /// again whether it changed; also the kernel's entry and attribute TTL.
    pub revalidate: Duration,
    pub read_only: bool,
    /// Threads reading requests from the kernel.
    pub threads: usize,
    /// Let other users than the mounting one use the view (`allow_other`).
    pub allow_other: bool,
    /// How long an object SOURCE's inotify watches vouch for is used
    /// before it is checked anyway (mmap writes and changes through
    /// another mount of the same disk send no event). Zero: no inotify.
    pub watch_max: Duration,
    /// Let the kernel keep its page cache of a file across opens while the
    /// file is unchanged (`FOPEN_KEEP_CACHE`).
    pub keep_cache: bool,
    /// Answer listings with their entries' attributes (`readdirplus`).
    pub readdirplus: bool,
    /// Warm SOURCE's inodes of a directory's entries at an open in it
    /// (`openahead.rs`).
    pub open_ahead: bool,
    /// Answer a read-only open of a file inotify vouches for from the
    /// cache, opening SOURCE's file after the reply (`deferred.rs`).
    pub defer_opens: bool,
}

/// What the view did to SOURCE and found there (`stat --json`'s
/// `fileview_*`).
#[derive(Debug, Default)]
pub struct ViewStats {
    pub source_stats: AtomicU64,
    pub source_readdirs: AtomicU64,
    pub source_reads: AtomicU64,
    pub source_read_bytes: AtomicU64,
    /// Of `source_reads`, those done with `O_DIRECT`.
    pub source_direct_reads: AtomicU64,
    pub source_readlinks: AtomicU64,
    pub source_xattr_reads: AtomicU64,
    pub source_writes: AtomicU64,
    pub revalidations: AtomicU64,
    /// Revalidations that found a file changed behind the view.
    pub changes_seen: AtomicU64,
    /// Directories of SOURCE under an inotify watch, and events read.
    pub watched_dirs: AtomicU64,
    pub inotify_events: AtomicU64,
    /// Records whose envelope named another file version than their key's
    /// object (a number collision): dropped and read again.
    pub envelope_mismatches: AtomicU64,
    /// Opens that let the kernel keep its cached pages (`keep_cache`).
    pub kept_caches: AtomicU64,
    /// Lookups the kernel asked for (a name its dentry cache lacked).
    pub lookups: AtomicU64,
    /// Stats of SOURCE not put in force because one begun later had
    /// settled the file first (`View::settle_as`).
    pub stale_stats: AtomicU64,
    /// Directories whose entries an open warmed on SOURCE, and the
    /// `lstat`s that took (`openahead.rs`; not in `source_stats`, which
    /// counts what the view asks SOURCE about its records).
    pub open_aheads: AtomicU64,
    pub open_ahead_stats: AtomicU64,
    /// Opens answered from the cache (`deferred.rs`), those whose file a
    /// binder thread opened, and those that found another file when it
    /// was opened (their handle then answers ESTALE where it needs SOURCE).
    pub deferred_opens: AtomicU64,
    pub deferred_binds: AtomicU64,
    pub deferred_stale: AtomicU64,
    pub nodes: AtomicU64,
    pub objects: AtomicU64,
    /// Objects dropped from the table to keep it within `arc_dnode_limit`.
    pub objects_trimmed: AtomicU64,
}

impl ViewStats {
    /// Every counter by its `stat --json` name.
    pub fn fields(&self) -> Vec<(&'static str, u64)> {
        let l = |a: &AtomicU64| a.load(Relaxed);
        vec![
            ("fileview_source_stats", l(&self.source_stats)),
            ("fileview_source_readdirs", l(&self.source_readdirs)),
            ("fileview_source_reads", l(&self.source_reads)),
            ("fileview_source_read_bytes", l(&self.source_read_bytes)),
            ("fileview_source_direct_reads", l(&self.source_direct_reads)),
            ("fileview_source_readlinks", l(&self.source_readlinks)),
            ("fileview_source_xattr_reads", l(&self.source_xattr_reads)),
            ("fileview_source_writes", l(&self.source_writes)),
            ("fileview_revalidations", l(&self.revalidations)),
            ("fileview_changes_seen", l(&self.changes_seen)),
            ("fileview_watched_dirs", l(&self.watched_dirs)),
            ("fileview_inotify_events", l(&self.inotify_events)),
            ("fileview_envelope_mismatches", l(&self.envelope_mismatches)),
            ("fileview_kept_caches", l(&self.kept_caches)),
            ("fileview_lookups", l(&self.lookups)),
            ("fileview_stale_stats", l(&self.stale_stats)),
            ("fileview_open_aheads", l(&self.open_aheads)),
            ("fileview_open_ahead_stats", l(&self.open_ahead_stats)),
            ("fileview_deferred_opens", l(&self.deferred_opens)),
            ("fileview_deferred_binds", l(&self.deferred_binds)),
            ("fileview_deferred_stale", l(&self.deferred_stale)),
            ("fileview_nodes", l(&self.nodes)),
            ("fileview_objects", l(&self.objects)),
            ("fileview_objects_trimmed", l(&self.objects_trimmed)),
        ]
    }
}

/// How the view reads its own records: as a demand read a request makes
/// (counted, from RAM or L2), or a look that counts nothing (RAM only).
#[derive(Clone, Copy)]
enum Look {
    Demand,
    Peek,
}

/// The version of `a` as a new object would take it (its number and
/// envelope; `docs/fileview.md`, section 5).
fn version_of(a: &Attr) -> Version {
    Version { dev: a.dev, born: a.fingerprint() }
}

/// The version an object's records are kept under now.
fn version(obj: &Object, st: &ObjState) -> Version {
    Version { dev: obj.dev, born: st.born }
}

/// What a read of an object's records needs, taken under its lock: its
/// number, the version its records carry, and the generation a record
/// read from SOURCE must still match to be cached.
fn keyed(obj: &Object) -> (u64, Version, u64) {
    let st = obj.state.lock();
    (st.id, version(obj, &st), st.gen)
}

/// The metadata prefetch of a listing: how many entries at most, and how
/// many read side by side.
const PREFETCH_MAX: usize = 4096;
const PREFETCH_THREADS: usize = 8;

/// How many times a stat found older than what is in force is taken again
/// (`View::settle_newest`).
const RESTATS: usize = 4;

#[cfg(feature = "failpoints")]
thread_local! {
    /// Set while this thread answers a getattr: the race test delays only
    /// those stats (`view.getattr.settle`), not a write's own.
    static IN_GETATTR: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

#[cfg(feature = "failpoints")]
struct InGetattr;

#[cfg(feature = "failpoints")]
impl InGetattr {
    fn enter() -> InGetattr {
        IN_GETATTR.set(true);
        InGetattr
    }
}

#[cfg(feature = "failpoints")]
impl Drop for InGetattr {
    fn drop(&mut self) {
        IN_GETATTR.set(false);
    }
}

fn key(kind: Kind, object: u64, index: u64) -> u64 {
    vkey::make(kind, object, index)
}

fn errno(e: io::Error) -> Errno {
    match e.raw_os_error() {
        Some(n) if n > 0 => Errno::from_i32(n),
        _ => Errno::EIO,
    }
}

type Res<T> = Result<T, Errno>;

/// What a setattr changes (the kernel's, less what Linux never sends).
struct SetAttr {
    mode: Option<u32>,
    uid: Option<u32>,
    gid: Option<u32>,
    size: Option<u64>,
    atime: Option<TimeOrNow>,
    mtime: Option<TimeOrNow>,
}

impl Handle {
    fn opened(file: File, obj: Arc<Object>, node: u64) -> Handle {
        Handle { file: OnceLock::from(Ok(file)), deferred: None, direct: OnceLock::new(), obj, node }
    }
}

pub(crate) struct Handle {
    /// SOURCE's file: opened by the open itself, or, for an open answered
    /// from the cache (`deferred`), by a binder thread or the first request
    /// that needs it, whichever comes first (`View::file_of`).
    file: OnceLock<Res<File>>,
    deferred: Option<deferred::Deferred>,
    /// The same file reopened with `O_DIRECT` for record reads, at the
    /// first miss (`None` inside: SOURCE refuses it).
    direct: OnceLock<Option<File>>,
    obj: Arc<Object>,
    /// The node it was opened on.
    node: u64,
}

/// The watches in place as a check of a node begins (`View::watch_before`).
struct WatchBefore {
    own: Option<(watch::Before, u64, u64)>,
    parent: Option<(watch::Before, std::ffi::OsString)>,
}

/// The listing a directory handle is read from, and the directory's
/// object number and generation before it was read.
#[derive(Clone)]
struct Snapshot {
    entries: Arc<Vec<DirEntry>>,
    version: Option<(u64, u64)>,
}

struct View {
    cfg: ViewConfig,
    cache: Arc<Cache>,
    table: Arc<Table>,
    handles: Mutex<FxHashMap<u64, Arc<Handle>>>,
    /// Open directory handles (fh from `next_fh`): the listing the handle
    /// is read from, taken at its first readdir at offset 0 and kept until
    /// releasedir, so offsets stay those of that listing whatever changes.
    dirs: Mutex<FxHashMap<u64, Option<Snapshot>>>,
    next_fh: AtomicU64,
    stats: Arc<ViewStats>,
    as_root: bool,
    /// SOURCE (`O_PATH | O_DIRECTORY`): everything the view does to SOURCE
    /// is done beneath it, never following a symlink (`sys`).
    root: OwnedFd,
    /// inotify on SOURCE's directories, unless off or not trustworthy there.
    watcher: Option<Arc<Watcher>>,
    /// Numbers every stat of SOURCE in the order they begin (`ticket`).
    stat_clock: AtomicU64,
    open_ahead: openahead::OpenAhead,
    binder: deferred::Binder,
}

impl Drop for View {
    fn drop(&mut self) {
        if let Some(w) = &self.watcher {
            w.stop();
        }
    }
}

fn to_time((sec, nsec): (i64, u32)) -> SystemTime {
    if sec >= 0 {
        UNIX_EPOCH + Duration::new(sec as u64, nsec)
    } else {
        UNIX_EPOCH - Duration::from_secs(sec.unsigned_abs()) + Duration::from_nanos(u64::from(nsec))
    }
}

fn from_time(t: TimeOrNow) -> Option<(i64, u32)> {
    match t {
        TimeOrNow::Now => None,
        TimeOrNow::SpecificTime(st) => Some(match st.duration_since(UNIX_EPOCH) {
            Ok(d) => (d.as_secs() as i64, d.subsec_nanos()),
            Err(e) => {
                let d = e.duration();
                let (s, n) = (d.as_secs() as i64, d.subsec_nanos());
                if n == 0 {
                    (-s, 0)
                } else {
                    (-s - 1, 1_000_000_000 - n)
                }
            }
        }),
    }
}

fn file_type(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

fn dtype_kind(dtype: u8) -> FileType {
    match dtype {
        libc::DT_DIR => FileType::Directory,
        libc::DT_LNK => FileType::Symlink,
        libc::DT_FIFO => FileType::NamedPipe,
        libc::DT_SOCK => FileType::Socket,
        libc::DT_CHR => FileType::CharDevice,
        libc::DT_BLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

fn dtype_of(ft: std::fs::FileType) -> u8 {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_dir() {
        libc::DT_DIR
    } else if ft.is_symlink() {
        libc::DT_LNK
    } else if ft.is_fifo() {
        libc::DT_FIFO
    } else if ft.is_socket() {
        libc::DT_SOCK
    } else if ft.is_char_device() {
        libc::DT_CHR
    } else if ft.is_block_device() {
        libc::DT_BLK
    } else {
        libc::DT_REG
    }
}

/// The attributes the kernel is given: SOURCE's, with SOURCE's inode number
/// (so hard links show as such); the node id is the view's own.
fn fuse_attr(a: &Attr) -> FileAttr {
    FileAttr {
        ino: INodeNo(a.ino),
        size: a.size,
        blocks: a.blocks,
        atime: to_time(a.atime),
        mtime: to_time(a.mtime),
        ctime: to_time(a.ctime),
        crtime: to_time(a.ctime),
        kind: file_type(a.mode),
        perm: (a.mode & 0o7777) as u16,
        nlink: a.nlink,
        uid: a.uid,
        gid: a.gid,
        rdev: a.rdev as u32,
        blksize: a.blksize,
        flags: 0,
    }
}

impl View {
    fn ttl(&self) -> Duration {
        self.cfg.revalidate
    }

    /// Checked within the window, or within `watch_max` with a watch
    /// vouching that nothing changed since.
    fn fresh(&self, st: &ObjState) -> bool {
        let Some(t) = st.checked else { return false };
        let age = t.elapsed();
        age < self.cfg.revalidate
            || (age < self.cfg.watch_max && self.watcher.as_ref().is_some_and(|w| w.valid(st.watch)))
    }

    fn count(&self, c: &AtomicU64) {
        c.fetch_add(1, Relaxed);
    }

    fn refuse_if_read_only(&self) -> Res<()> {
        if self.cfg.read_only {
            Err(Errno::EROFS)
        } else {
            Ok(())
        }
    }

    /// The directory `rel` of SOURCE opened with `flags`, every component
    /// beneath SOURCE and none a symlink.
    fn open_dir(&self, rel: &Path, flags: i32) -> Res<OwnedFd> {
        sys::open_beneath(self.root.as_fd(), rel, flags | libc::O_DIRECTORY).map_err(errno)
    }

    /// `name` under the directory node `parent`.
    fn at_child(&self, parent: u64, name: &OsStr) -> Res<At> {
        let rel = self.table.path(parent).ok_or(Errno::ENOENT)?;
        At::new(self.open_dir(&rel, libc::O_PATH)?, name).map_err(errno)
    }

    /// Where `node` is: its parent directory and its name (SOURCE itself
    /// is `.` in SOURCE).
    fn at(&self, node: u64) -> Res<At> {
        let rel = self.table.path(node).ok_or(Errno::ENOENT)?;
        match (rel.parent(), rel.file_name()) {
            (Some(dir), Some(name)) => At::new(self.open_dir(dir, libc::O_PATH)?, name).map_err(errno),
            _ => At::new(self.open_dir(Path::new(""), libc::O_PATH)?, OsStr::new(".")).map_err(errno),
        }
    }

    /// `node` itself opened `O_PATH | O_NOFOLLOW` (a symlink is the link).
    fn open_node(&self, node: u64) -> Res<File> {
        Ok(File::from(self.at(node)?.open(libc::O_PATH, 0).map_err(errno)?))
    }

    /// Where a change under `parent` goes on SOURCE, unless read-only.
    fn writable_at(&self, parent: u64, name: &OsStr) -> Res<At> {
        self.refuse_if_read_only()?;
        self.check_before_change(Some(parent));
        self.at_child(parent, name)
    }

    /// Revalidates `node` (as a check of SOURCE) before the view changes
    /// it: the change's own settle (`own`) then adopts only what the view
    /// did, and a change made on SOURCE just before is seen as such (its
    /// records dropped) rather than taken for the view's. A node SOURCE
    /// no longer has is left to the change itself to fail.
    fn check_before_change(&self, node: Option<u64>) {
        if let Some(node) = node {
            let _ = self.stat_node(node, false);
        }
    }

    fn new_state(&self, a: &Attr) -> ObjState {
        let v = version_of(a);
        ObjState {
            id: v.number(),
            born: v.born,
            fp: a.fingerprint(),
            checked: None,
            gen: 0,
            dir_chunks: 0,
            watch: None,
            settled_by: 0,
        }
    }

    /// The number of a stat of SOURCE about to begin: later stats get
    /// higher ones (`settle_as` keeps the newest in force).
    fn ticket(&self) -> u64 {
        self.stat_clock.fetch_add(1, SeqCst)
    }

    /// Record `index` of `kind` of the version `v` (numbered `id`) from the
    /// ARC or L2, as a demand read. One whose envelope names another
    /// version (a number collision) is dropped and missed.
    fn get(&self, kind: Kind, v: &Version, id: u64, index: u64) -> Option<Vec<u8>> {
        let k = key(kind, id, index);
        // View records are kept raw (`envelope::seal`): their stored bytes
        // are the envelope.
        self.open_record(k, self.cache.view_lookup(k)?, kind, v, index)
    }

    /// As `get`, from RAM only and counting nothing (not a demand read:
    /// the view's own look at what it holds, which must not show in the
    /// hit ratios or move the record in the ARC's lists).
    fn peek(&self, kind: Kind, v: &Version, id: u64, index: u64) -> Option<Vec<u8>> {
        let k = key(kind, id, index);
        self.open_record(k, self.cache.view_peek(k)?, kind, v, index)
    }

    /// The payload of record `k` if its envelope names the version `v`;
    /// otherwise (a number collision) the record is dropped.
    fn open_record(&self, k: Key, rec: Arc<Record>, kind: Kind, v: &Version, index: u64) -> Option<Vec<u8>> {
        let payload = envelope::open(rec.stored(), kind, v, index);
        if payload.is_none() {
            self.count(&self.stats.envelope_mismatches);
            self.cache.view_invalidate(k);
        }
        payload
    }

    /// Caches `payload` as record `index` of `kind` of the version `v`.
    fn put(&self, kind: Kind, v: &Version, id: u64, index: u64, payload: &[u8], prefetch: bool) {
        let compress = self.cache.compress_enabled() && kind != Kind::Attr;
        let rec = Arc::new(envelope::seal(kind, v, index, payload, compress));
        if prefetch {
            self.cache.view_insert_prefetch(key(kind, id, index), rec);
        } else {
            self.cache.view_insert(key(kind, id, index), rec);
        }
    }

    /// Drops data records `from..=to` of the version `st` names.
    fn drop_data(&self, st: &ObjState, from: u64, to: u64) {
        for i in from..=to.min(vkey::MAX_INDEX) {
            self.cache.view_invalidate(key(Kind::Data, st.id, i));
        }
    }

    /// Drops the cached listing. Chunk 0 goes even when the object knows of
    /// no chunks: a listing restored from L2 and not read yet in this run
    /// is found through chunk 0 (`cached_listing`), which must not find the
    /// version from before the change.
    fn drop_listing(&self, st: &mut ObjState) {
        for i in 0..st.dir_chunks.max(1) {
            self.cache.view_invalidate(key(Kind::DirChunk, st.id, i));
        }
        st.dir_chunks = 0;
        st.gen += 1;
    }

    /// Drops every record of the version `st` names.
    fn drop_all(&self, st: &mut ObjState) {
        for kind in [Kind::Attr, Kind::Symlink, Kind::Xattrs] {
            self.cache.view_invalidate(key(kind, st.id, 0));
        }
        self.drop_listing(st);
        self.drop_data(st, 0, st.fp.size / self.cfg.recordsize);
    }

    /// Puts what SOURCE shows now (`a`) in force for `obj`. A file changed
    /// behind the view (its fingerprint differs, and `own` is false) has
    /// every record dropped and a new object number; with `own` the view
    /// made the change and has fixed its records already.
    /// `ticket` is the stat's, taken before it began: a stat that began
    /// earlier than the one in force is older news (a revalidation's lstat
    /// from before a write through the view, settling after the write's),
    /// and is not put in force: false.
    fn settle(&self, obj: &Object, a: &Attr, own: bool, ticket: u64) -> bool {
        self.settle_as(obj, a, own, false, ticket)
    }

    /// `settle`; with `prefetch` the attribute record goes in as a
    /// prefetch's (the metadata prefetch of a listing).
    fn settle_as(&self, obj: &Object, a: &Attr, own: bool, prefetch: bool, ticket: u64) -> bool {
        let mut st = obj.state.lock();
        if ticket < st.settled_by {
            self.count(&self.stats.stale_stats);
            return false;
        }
        st.settled_by = ticket;
        if st.fp != a.fingerprint() {
            st.watch = None;
            if own {
                st.gen += 1;
            } else {
                self.count(&self.stats.changes_seen);
                self.drop_all(&mut st);
                let v = version_of(a);
                (st.id, st.born) = (v.number(), v.born);
            }
        }
        st.fp = a.fingerprint();
        st.checked = Some(Instant::now());
        let v = version(obj, &st);
        let encoded = a.encode();
        if !prefetch && self.cached_as(Kind::Attr, &v, st.id, &encoded) {
            // Unchanged: not put again, which would drop its L2 copy and
            // have the feed write it once more at every revalidation.
            return true;
        }
        self.put(Kind::Attr, &v, st.id, 0, &encoded, prefetch);
        true
    }

    /// Settles `obj` with `a`, from a stat that began at `ticket`; if that
    /// is older than what is in force, stats again with `restat` (a few
    /// times at most), so the caller answers the kernel with what SOURCE
    /// shows now, never with a size from before a write it has seen.
    fn settle_newest(
        &self,
        obj: &Object,
        mut a: Attr,
        own: bool,
        mut ticket: u64,
        restat: impl Fn() -> Res<Attr>,
    ) -> Res<Attr> {
        for _ in 0..RESTATS {
            if self.settle(obj, &a, own, ticket) {
                break;
            }
            ticket = self.ticket();
            self.count(&self.stats.source_stats);
            a = restat()?;
        }
        Ok(a)
    }

    /// Whether RAM holds record 0 of `kind` of `v` with this payload
    /// (counting nothing).
    fn cached_as(&self, kind: Kind, v: &Version, id: u64, payload: &[u8]) -> bool {
        self.cache
            .view_peek(key(kind, id, 0))
            .is_some_and(|r| envelope::open(r.stored(), kind, v, 0).as_deref() == Some(payload))
    }

    /// The metadata prefetch of a listing just read from SOURCE: the
    /// attributes of its entries (the first `PREFETCH_MAX`) the view does
    /// not have fresh, read by `PREFETCH_THREADS` at once, before the
    /// listing is answered. A walk (`rsync`, `find`, `ls -l`) asks for
    /// them next, one at a time; on a disk that seeks, reading them side
    /// by side is what makes a cold pass faster. Lookups then find each
    /// object through the listing (`Table::adopt`) without SOURCE.
    fn prefetch_attrs(&self, dir: BorrowedFd, dobj: &Object, entries: &[DirEntry]) {
        let wanted: Vec<&DirEntry> = entries
            .iter()
            .take(PREFETCH_MAX)
            .filter(|e| match self.table.known_object(dobj.dev, e.ino) {
                Some(o) if self.fresh(&o.state.lock()) => {
                    self.cache.count_view_prefetch_hit();
                    false
                }
                _ => true,
            })
            .collect();
        if wanted.is_empty() {
            return;
        }
        let before = self.watcher.as_ref().and_then(|w| w.before(dobj));
        let next = std::sync::atomic::AtomicUsize::new(0);
        std::thread::scope(|s| {
            for _ in 0..PREFETCH_THREADS.min(wanted.len()) {
                s.spawn(|| {
                    while let Some(e) = wanted.get(next.fetch_add(1, Relaxed)) {
                        self.prefetch_one(dir, e, before);
                    }
                });
            }
        });
    }

    /// The metadata prefetch for a listing that came from the ARC or L2,
    /// when some of its entries are not fresh (after a restart none are:
    /// objects are not persisted, each is checked against SOURCE first).
    fn prefetch_cached(&self, node: u64, dobj: &Object, entries: &[DirEntry]) {
        let stale = entries
            .iter()
            .take(PREFETCH_MAX)
            .any(|e| !self.table.known_object(dobj.dev, e.ino).is_some_and(|o| self.fresh(&o.state.lock())));
        if !stale {
            return;
        }
        let Some(rel) = self.table.path(node) else { return };
        if let Ok(dir) = self.open_dir(&rel, libc::O_RDONLY) {
            self.prefetch_attrs(dir.as_fd(), dobj, entries);
        }
    }

    fn prefetch_one(&self, dir: BorrowedFd, e: &DirEntry, before: Option<watch::Before>) {
        let name = OsStr::from_bytes(&e.name);
        let ticket = self.ticket();
        let Ok(a) = sys::lstat_at(dir, name) else { return };
        self.count(&self.stats.source_stats);
        if a.ino != e.ino {
            // Replaced since the listing: left to the lookup.
            return;
        }
        // A known object checked again (a listing from the ARC whose
        // entries' window ran out) is a revalidation, as a lookup's is.
        if self.table.known_object(a.dev, a.ino).is_some() {
            self.count(&self.stats.revalidations);
        }
        let obj = self.table.object_for(&a, || self.new_state(&a));
        if !self.settle_as(&obj, &a, false, true, ticket) {
            return;
        }
        if let (Some(w), Some(b)) = (&self.watcher, before) {
            if !a.is_dir() && a.nlink == 1 {
                w.mark(b, Some(name), &obj);
            }
        }
    }

    /// `lstat`s the node's path and settles its object.
    fn stat_node(&self, node: u64, own: bool) -> Res<(Attr, Arc<Object>)> {
        let mut marks = self.watcher.as_ref().map(|w| self.watch_before(w, node));
        let f = self.open_node(node)?;
        self.count(&self.stats.source_stats);
        let mut ticket = self.ticket();
        let mut a = Attr::from_metadata(&f.metadata().map_err(errno)?);
        self.refuse_another_file(node, &a)?;
        let obj = self.table.bind(node, &a, || self.new_state(&a));
        if let (Some(w), Some(m)) = (&self.watcher, marks.as_mut()) {
            let watched = m.own.as_ref().is_some_and(|&(_, dev, ino)| (dev, ino) == (a.dev, a.ino));
            if a.is_dir() && !watched {
                // A directory seen for the first time is watched from now
                // on, and looked at again once it is (the same inode: the
                // descriptor holds it), so no change after this is missed.
                if let Some(b) = w.watch_dir(f.as_fd(), &obj, node) {
                    ticket = self.ticket();
                    a = Attr::from_metadata(&f.metadata().map_err(errno)?);
                    m.own = Some((b, a.dev, a.ino));
                }
            }
        }
        if !own {
            self.count(&self.stats.revalidations);
        }
        #[cfg(feature = "failpoints")]
        if IN_GETATTR.get() {
            // Widens the gap between a getattr's stat and its settling for
            // the race test of `settle_as`'s tickets.
            fail::fail_point!("view.getattr.settle");
        }
        let a = self
            .settle_newest(&obj, a, own, ticket, || Ok(Attr::from_metadata(&f.metadata().map_err(errno)?)))?;
        if let (Some(w), Some(marks)) = (&self.watcher, marks) {
            self.mark_checked(w, marks, &a, &obj);
        }
        Ok((a, obj))
    }

    /// A node is one file for its life: the kernel's inode of it holds that
    /// file's attributes (its size among them, up to which it reads). A name
    /// that leads to another file by now (replaced on SOURCE: an editor's
    /// save, rsync, a rename over it) is not rebound: the node loses the
    /// name and ESTALE has the kernel look the name up again, which gives
    /// it a new node. (Rebound, the kernel read the new file up to the old
    /// one's size.)
    fn refuse_another_file(&self, node: u64, a: &Attr) -> Res<()> {
        match self.table.object(node) {
            Some(prev) if node != ROOT && !prev.is(a) => {
                // The parent's cached listing names the old file too: the
                // kernel's new lookup must not be answered from it.
                self.parent_stale(node);
                Err(self.retire_node(node))
            }
            _ => Ok(()),
        }
    }

    /// The node shows what SOURCE no longer has under its name: it loses
    /// the name (the next lookup makes a new node) and the kernel is told
    /// ESTALE, which has it look the name up again.
    fn retire_node(&self, node: u64) -> Errno {
        self.table.unname_node(node);
        self.count(&self.stats.changes_seen);
        Errno::ESTALE
    }

    /// The parent of `node` changed on SOURCE (found through the node):
    /// its listing dropped, its attributes checked at the next use.
    fn parent_stale(&self, node: u64) {
        let Some((parent, _)) = self.table.parent_and_name(node) else { return };
        if let Some(dir) = self.table.object(parent) {
            let mut st = dir.state.lock();
            self.drop_listing(&mut st);
            st.checked = None;
        }
    }

    /// The watches that could vouch for `node` once it is checked, taken
    /// before the check: a directory's own (events on its entries and
    /// itself), and for another file its parent's, with its name.
    fn watch_before(&self, w: &Watcher, node: u64) -> WatchBefore {
        let own = self.table.object(node).and_then(|o| w.before(&o).map(|b| (b, o.dev, o.ino)));
        let parent = self.table.parent_and_name(node).and_then(|(parent, name)| {
            let dir = self.table.object(parent)?;
            w.before(&dir).map(|b| (b, name))
        });
        WatchBefore { own, parent }
    }

    /// Marks an object just checked (`a`), if a watch that was in place
    /// before the check vouches for it: a directory by its own watch, a
    /// file with one link by its parent's (a change made through another
    /// link would reach another directory's watch).
    fn mark_checked(&self, w: &Watcher, marks: WatchBefore, a: &Attr, obj: &Arc<Object>) {
        if a.is_dir() {
            if let Some((b, dev, ino)) = marks.own {
                if (dev, ino) == (obj.dev, obj.ino) {
                    w.mark(b, None, obj);
                }
            }
        } else if a.nlink == 1 {
            if let Some((b, name)) = marks.parent {
                w.mark(b, Some(&name), obj);
            }
        }
    }

    /// The node's attributes: from the ARC while its object is fresh, else
    /// from SOURCE (revalidating it).
    fn attr(&self, node: u64) -> Res<(Attr, Arc<Object>)> {
        if let Some(obj) = self.table.object(node) {
            if let Some(a) = self.fresh_attr(&obj) {
                return Ok((a, obj));
            }
        }
        self.stat_node(node, false)
    }

    /// The object's attribute record while the object is fresh.
    fn fresh_attr(&self, obj: &Object) -> Option<Attr> {
        let (id, v) = {
            let st = obj.state.lock();
            if !self.fresh(&st) {
                return None;
            }
            (st.id, version(obj, &st))
        };
        self.get(Kind::Attr, &v, id, 0).and_then(|b| Attr::decode(&b, obj.dev))
    }

    /// Binds `node` to the file just opened for it, by the descriptor's own
    /// `(st_dev, st_ino)`: the object cached for the name before is not
    /// trusted to be what the open found (the name may lead to another
    /// file by now). Settled as a check of SOURCE (`own` false). The
    /// `fstat` of the descriptor is part of the open, not counted in
    /// `source_stats` (it asks the inode the open just found).
    fn bind_opened(&self, node: u64, file: &File) -> Res<(Attr, Arc<Object>)> {
        let restat = || Ok(Attr::from_metadata(&file.metadata().map_err(errno)?));
        let ticket = self.ticket();
        let a = restat()?;
        if a.mode & libc::S_IFMT != libc::S_IFREG {
            // Another kind of file than the kernel asked to open: ESTALE
            // has it look the name up again.
            return Err(Errno::ESTALE);
        }
        self.refuse_another_file(node, &a)?;
        // The kernel holds another size for the node than the file opened
        // has (an open carries no attributes, and reads stop at the size the
        // kernel holds): changed on SOURCE within the window, or, on a file
        // system that reuses inode numbers at once, another file under the
        // same number. As for another file: a new node, through ESTALE and
        // a fresh lookup. (Before, such a read was cut at the old size.)
        if self.table.shown_size(node).is_some_and(|s| s != a.size) && node != ROOT {
            // What the view has of the file is old too: settled now, so the
            // kernel's new lookup gets the size the open found.
            if let Some(obj) = self.table.object(node) {
                self.settle(&obj, &a, false, ticket);
            }
            return Err(self.retire_node(node));
        }
        let obj = self.table.bind(node, &a, || self.new_state(&a));
        let a = self.settle_newest(&obj, a, false, ticket, restat)?;
        Ok((a, obj))
    }

    /// The first open in a directory for a while has SOURCE read the
    /// inodes of the directory's other entries (its cached listing's first
    /// `PREFETCH_MAX`) in the background, `PREFETCH_THREADS` at once, so
    /// the opens that follow do not each wait for one (`openahead.rs`).
    fn open_ahead(&self, node: u64) {
        if !self.cfg.open_ahead {
            return;
        }
        let Some((parent, _)) = self.table.parent_and_name(node) else { return };
        let Some(dobj) = self.table.object(parent) else { return };
        if dobj.state.lock().dir_chunks == 0 || !self.open_ahead.due(parent) {
            return;
        }
        let Some(entries) = self.cached_listing(&dobj, Look::Peek) else { return };
        let Some(rel) = self.table.path(parent) else { return };
        let Ok(dir) = self.open_dir(&rel, libc::O_PATH) else { return };
        let names: Vec<Vec<u8>> = entries.into_iter().take(PREFETCH_MAX).map(|e| e.name).collect();
        let stats = Arc::clone(&self.stats);
        let spawned = std::thread::Builder::new().name("fileview-openahead".into()).spawn(move || {
            let asked = openahead::warm(dir, &names, PREFETCH_THREADS);
            stats.open_aheads.fetch_add(1, Relaxed);
            stats.open_ahead_stats.fetch_add(asked, Relaxed);
        });
        if let Err(e) = spawned {
            tracing::debug!("open-ahead not started: {e}");
        }
    }

    /// Revalidates an open file by its descriptor (it may have no path).
    fn attr_of_handle(&self, h: &Handle, own: bool) -> Res<Attr> {
        self.count(&self.stats.source_stats);
        let file = self.file_of(h)?;
        let restat = || Ok(Attr::from_metadata(&file.metadata().map_err(errno)?));
        let ticket = self.ticket();
        let a = restat()?;
        if !h.obj.is(&a) {
            return Err(Errno::ESTALE);
        }
        self.settle_newest(&h.obj, a, own, ticket, restat)
    }

    /// The cached listing of a directory if all its chunks are in the ARC
    /// or on L2. The chunk count is the object's, or, when it has none yet
    /// (a listing restored from L2 after a restart), found by reading
    /// chunks until the listing's total is reached, and then kept.
    fn cached_listing(&self, obj: &Object, look: Look) -> Option<Vec<DirEntry>> {
        let (id, v, chunks, gen) = {
            let st = obj.state.lock();
            (st.id, version(obj, &st), st.dir_chunks, st.gen)
        };
        let mut out = Vec::new();
        let mut read = 0;
        loop {
            if chunks > 0 && read == chunks {
                break;
            }
            let b = match look {
                Look::Demand => self.get(Kind::DirChunk, &v, id, read)?,
                Look::Peek => self.peek(Kind::DirChunk, &v, id, read)?,
            };
            let before = out.len();
            let total = records::decode_chunk(&b, &mut out)? as usize;
            read += 1;
            if out.len() >= total {
                if out.len() > total || (chunks > 0 && read != chunks) {
                    return None;
                }
                break;
            }
            if out.len() == before || read > vkey::MAX_INDEX {
                return None;
            }
        }
        if chunks == 0 {
            let mut st = obj.state.lock();
            if st.id == id && st.gen == gen {
                st.dir_chunks = read;
            }
        }
        Some(out)
    }

    /// The node's listing, from the ARC or read from SOURCE.
    fn listing(&self, node: u64) -> Res<Vec<DirEntry>> {
        let (a, obj) = self.attr(node)?;
        if !a.is_dir() {
            return Err(Errno::ENOTDIR);
        }
        let (id, gen) = {
            let st = obj.state.lock();
            (st.id, st.gen)
        };
        if let Some(out) = self.cached_listing(&obj, Look::Demand) {
            self.prefetch_cached(node, &obj, &out);
            return Ok(out);
        }
        let rel = self.table.path(node).ok_or(Errno::ENOENT)?;
        let dir = self.open_dir(&rel, libc::O_RDONLY)?;
        // Watched before it is read, so no change after the read is missed.
        let before = self.watcher.as_ref().and_then(|w| w.watch_dir(dir.as_fd(), &obj, node));
        self.count(&self.stats.source_readdirs);
        let mut entries = Vec::new();
        // The directory just opened, through its descriptor's magic link.
        let fd_path = PathBuf::from(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&dir)));
        for e in std::fs::read_dir(&fd_path).map_err(errno)? {
            let e = e.map_err(errno)?;
            let dtype = e.file_type().map(dtype_of).unwrap_or(libc::DT_UNKNOWN);
            entries.push(DirEntry { ino: e.ino(), dtype, name: e.file_name().as_bytes().to_vec() });
        }
        let encoded = records::encode_listing(&entries);
        let dir = File::from(dir);
        if let (Some(w), Some(b)) = (&self.watcher, before) {
            // The directory as read, after its watch began: a change since
            // the attributes used above drops them (and this listing is
            // then not kept, its version being another).
            let ticket = self.ticket();
            let a = Attr::from_metadata(&dir.metadata().map_err(errno)?);
            let same = obj.is(&a);
            let settled = same && self.settle(&obj, &a, false, ticket);
            if self.keep_listing(&obj, id, gen, &encoded) && settled {
                w.mark(b, None, &obj);
            }
        } else {
            self.keep_listing(&obj, id, gen, &encoded);
        }
        self.prefetch_attrs(dir.as_fd(), &obj, &entries);
        Ok(entries)
    }

    /// Caches a listing read from SOURCE for the version `id`/`gen` of a
    /// directory, unless it changed meanwhile; whether it was kept.
    fn keep_listing(&self, obj: &Object, id: u64, gen: u64, encoded: &[Vec<u8>]) -> bool {
        let mut st = obj.state.lock();
        if st.gen != gen || st.id != id {
            return false;
        }
        let v = version(obj, &st);
        for (i, c) in encoded.iter().enumerate() {
            self.put(Kind::DirChunk, &v, id, i as u64, c, false);
        }
        st.dir_chunks = encoded.len() as u64;
        true
    }

    /// The listing directory handle `fh` of `node` is read from: a new
    /// snapshot at offset 0 (the start, or after a rewind) or if it has
    /// none yet, else the one taken then, so the offsets the kernel holds
    /// still name the same entries after changes in between. With it,
    /// whether the directory has not changed since the snapshot was read
    /// (its entries can then be trusted as a fresh listing's).
    fn dir_snapshot(&self, node: u64, fh: FileHandle, offset: u64) -> Res<(Arc<Vec<DirEntry>>, bool)> {
        let version = || {
            self.table.object(node).map(|o| {
                let st = o.state.lock();
                (st.id, st.gen)
            })
        };
        let kept = if offset != 0 { self.dirs.lock().get(&fh.0).cloned().flatten() } else { None };
        let snap = match kept {
            Some(s) => s,
            None => {
                let before = version();
                let s = Snapshot { entries: Arc::new(self.listing(node)?), version: before };
                if let Some(slot) = self.dirs.lock().get_mut(&fh.0) {
                    *slot = Some(s.clone());
                }
                s
            }
        };
        let current = snap.version.is_some() && snap.version == version();
        Ok((snap.entries, current))
    }

    /// Looks `name` up under `parent`; the node and its attributes. The
    /// caller counts the kernel's reference when it replies.
    fn lookup_node(&self, parent: u64, name: &OsStr) -> Res<(u64, Attr)> {
        if name.len() > 255 {
            return Err(Errno::ENAMETOOLONG);
        }
        let (pa, pobj) = self.attr(parent)?;
        if !pa.is_dir() {
            return Err(Errno::ENOTDIR);
        }
        // A name a cached listing lacks is answered without SOURCE.
        let chunks = pobj.state.lock().dir_chunks;
        let mut listed_ino = None;
        if let Some(entries) = (chunks > 0).then(|| self.cached_listing(&pobj, Look::Demand)).flatten() {
            match entries.iter().find(|e| e.name == name.as_bytes()) {
                Some(e) => listed_ino = Some(e.ino),
                None => return Err(Errno::ENOENT),
            }
        }
        self.child_attr(parent, name, listed_ino)
    }

    /// The node of `name` under `parent` and its attributes; `listed_ino`
    /// is what a fresh listing of the parent says the name leads to.
    fn child_attr(&self, parent: u64, name: &OsStr, listed_ino: Option<u64>) -> Res<(u64, Attr)> {
        let node = self.table.child(parent, name);
        if let (Some(ino), Some(dir)) = (listed_ino, self.table.object(parent)) {
            self.table.adopt(node, dir.dev, ino);
        }
        // Freshness is the object's; whether the name still leads to that
        // object is checked here: by the fresh listing, or by the node's
        // own check (a file renamed over another keeps its object).
        let name_fresh = self.table.checked(node).is_some_and(|t| t.elapsed() < self.cfg.revalidate);
        let found = match (listed_ino, self.table.object(node)) {
            (Some(ino), Some(obj)) if obj.ino == ino => self.attr(node),
            (None, Some(_)) if name_fresh => self.attr(node),
            _ => self.stat_node(node, false),
        };
        let (node, found) = match found {
            // The name leads to another file than its node's: a new node.
            Err(e) if e == Errno::ESTALE => {
                self.table.forget(node, 1);
                let fresh = self.table.child(parent, name);
                (fresh, self.stat_node(fresh, false))
            }
            r => (node, r),
        };
        match found {
            Ok((a, _)) => Ok((node, a)),
            Err(e) => {
                self.table.forget(node, 1);
                Err(e)
            }
        }
    }

    fn handle(&self, fh: FileHandle) -> Res<Arc<Handle>> {
        self.handles.lock().get(&fh.0).cloned().ok_or(Errno::EBADF)
    }

    /// An open handle of `node`, if any.
    fn handle_of_node(&self, node: u64) -> Option<Arc<Handle>> {
        self.handles.lock().values().find(|h| h.node == node).cloned()
    }

    fn add_handle(&self, file: File, obj: Arc<Object>, node: u64) -> u64 {
        self.insert_handle(Handle::opened(file, obj, node)).0
    }

    fn insert_handle(&self, h: Handle) -> (u64, Arc<Handle>) {
        let fh = self.next_fh.fetch_add(1, Relaxed);
        let h = Arc::new(h);
        self.handles.lock().insert(fh, Arc::clone(&h));
        (fh, h)
    }

    /// The handle's SOURCE file, opened now if its open was deferred and
    /// no binder has opened it yet.
    fn file_of<'a>(&self, h: &'a Handle) -> Res<&'a File> {
        h.file.get_or_init(|| self.bind_deferred(h)).as_ref().map_err(|e| *e)
    }

    /// Opens a deferred handle's file and checks it is the file the open
    /// was answered for: the same inode *and birth time* (deferred opens
    /// are only of files whose birth time is known; nothing held the inode
    /// meanwhile, so its number alone may by now be another file's).
    /// Another file is ESTALE, for good: the one opened cannot be reached
    /// any more. The same file changed since (written through the view or
    /// on SOURCE) is settled as a check and read as it is now, as a
    /// descriptor opened before the change would read it.
    fn bind_deferred(&self, h: &Handle) -> Res<File> {
        let Some(d) = &h.deferred else { return Err(Errno::EBADF) };
        let ticket = self.ticket();
        let (file, a) = d.open().map_err(|e| match e.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ENOTDIR) | Some(libc::ELOOP) => Errno::ESTALE,
            _ => errno(e),
        })?;
        if !h.obj.is_known(&a) {
            self.count(&self.stats.deferred_stale);
            return Err(Errno::ESTALE);
        }
        if a.fingerprint() != d.granted {
            self.settle(&h.obj, &a, false, ticket);
        }
        Ok(file)
    }

    /// `keyed` for a read through `h`. A handle whose open was deferred and
    /// whose file is not open yet reads records only of the version it was
    /// answered for; another version has the file opened first (which
    /// refuses another file), so the records read are of the file the
    /// descriptor then holds.
    fn keyed_for(&self, h: &Handle) -> Res<(u64, Version, u64)> {
        if let (Some(d), None) = (&h.deferred, h.file.get()) {
            {
                let st = h.obj.state.lock();
                if st.fp == d.granted {
                    return Ok((st.id, version(&h.obj, &st), st.gen));
                }
            }
            self.file_of(h)?;
        }
        Ok(keyed(&h.obj))
    }

    /// A read-only open answered from the cache (`deferred.rs`): only of a
    /// regular file inotify vouches for under the node's own name (every
    /// event queued by now applied first), whose size the kernel holds.
    fn open_from_cache(&self, node: u64, flags: i32) -> Option<(Handle, Attr)> {
        if !self.cfg.defer_opens || flags & libc::O_ACCMODE != libc::O_RDONLY || flags & libc::O_TRUNC != 0 {
            return None;
        }
        let w = self.watcher.as_ref()?;
        // Only a file known by its birth time: nothing holds its inode until
        // SOURCE's file is opened, and a number freed meanwhile and given
        // to another file must make another object, not this one's.
        let obj = self.table.object(node).filter(|o| o.born.is_some())?;
        let (parent, name) = self.table.parent_and_name(node)?;
        let dir = self.table.object(parent)?;
        w.catch_up();
        if !w.vouches_for(&dir, &name, &obj) {
            return None;
        }
        let a = self.fresh_attr(&obj)?;
        if a.mode & libc::S_IFMT != libc::S_IFREG || self.table.shown_size(node) != Some(a.size) {
            return None;
        }
        let at = self.at(node).ok()?;
        let keep = libc::O_NOATIME | libc::O_SYNC | libc::O_DSYNC;
        let flags = libc::O_RDONLY | (flags & keep) | libc::O_NONBLOCK;
        let d = deferred::Deferred { at, flags, granted: a.fingerprint() };
        Some((Handle { file: OnceLock::new(), deferred: Some(d), direct: OnceLock::new(), obj, node }, a))
    }

    /// An open answered once SOURCE's file is opened and bound to the node;
    /// the handle and whether the kernel keeps its pages.
    fn open_on_source(&self, node: u64, flags: i32) -> Res<(u64, bool)> {
        let r = (|| {
            let acc = flags & libc::O_ACCMODE;
            if acc != libc::O_RDONLY {
                self.refuse_if_read_only()?;
            }
            let at = self.at(node)?;
            // O_NONBLOCK: a fifo swapped in for the file does not hang the open.
            let keep = libc::O_APPEND | libc::O_NOATIME | libc::O_SYNC | libc::O_DSYNC;
            let extra = (flags & keep) | libc::O_NONBLOCK;
            // A write-only open still reads records on a miss: ask for read too.
            let want = if acc == libc::O_RDONLY { libc::O_RDONLY } else { libc::O_RDWR };
            let file = at.open(want | extra, 0).or_else(|e| {
                if acc == libc::O_WRONLY {
                    at.open(libc::O_WRONLY | extra, 0)
                } else {
                    Err(e)
                }
            });
            let file = File::from(file.map_err(errno)?);
            let (a, obj) = self.bind_opened(node, &file)?;
            let h = Handle::opened(file, obj, node);
            let truncate = flags & libc::O_TRUNC != 0 && acc != libc::O_RDONLY;
            if truncate {
                self.truncate_handle(&h)?;
            }
            // The kernel's pages of the node are kept only if it last opened
            // the very version the open found (close-to-open, as NFS): a
            // change by anyone, the view's own writes included, drops them.
            // Recorded only once the open succeeded (a failed one leaves the
            // kernel's pages as they were).
            let same = self.table.opened_as(node, (!truncate).then(|| a.fingerprint()));
            let keep = self.cfg.keep_cache && same;
            self.open_ahead(node);
            Ok((self.insert_handle(h).0, keep))
        })();
        if r.is_err() {
            self.table.opened_as(node, None);
        }
        r
    }

    /// Reads `size` bytes at `offset` through the ARC.
    fn read_through(&self, h: &Handle, offset: u64, size: u32) -> Res<Vec<u8>> {
        let fresh = self.fresh(&h.obj.state.lock());
        if !fresh {
            self.attr_of_handle(h, false)?;
        }
        let rs = self.cfg.recordsize;
        let (id, v, gen) = self.keyed_for(h)?;
        let end = offset.saturating_add(u64::from(size));
        let mut out = Vec::with_capacity(size as usize);
        let mut at = offset;
        while at < end {
            let idx = at / rs;
            let within = (at - idx * rs) as usize;
            let rec = if idx > vkey::MAX_INDEX { None } else { self.get(Kind::Data, &v, id, idx) };
            let bytes = match rec {
                Some(b) => b,
                None => {
                    let started = Instant::now();
                    let file = self.file_of(h)?;
                    let buf =
                        read_record(file, &h.direct, idx * rs, rs as usize, &self.stats).map_err(errno)?;
                    let got = buf.len();
                    self.count(&self.stats.source_reads);
                    self.stats.source_read_bytes.fetch_add(got as u64, Relaxed);
                    self.cache.count_view_source_read(got as u64, started.elapsed().as_nanos() as u64);
                    if idx <= vkey::MAX_INDEX {
                        let st = h.obj.state.lock();
                        if st.gen == gen && st.id == id {
                            self.put(Kind::Data, &v, id, idx, &buf, false);
                        }
                    }
                    buf
                }
            };
            if within >= bytes.len() {
                break;
            }
            let take = (bytes.len() - within).min((end - at) as usize);
            out.extend_from_slice(&bytes[within..within + take]);
            at += take as u64;
            if bytes.len() < rs as usize && within + take >= bytes.len() {
                break;
            }
        }
        Ok(out)
    }

    /// After a change to a directory's entries: its listing dropped and
    /// its attributes read again.
    fn entries_changed(&self, dir: u64) {
        if let Some(obj) = self.table.object(dir) {
            self.drop_listing(&mut obj.state.lock());
        }
        let _ = self.stat_node(dir, true);
    }

    /// The owner of what the caller made, as a local file system would set it.
    fn chown_to_caller(&self, req: &Request, at: &At) {
        if self.as_root {
            if let Err(e) = at.chown(Some(req.uid()), Some(req.gid())) {
                warn!("{:?}: setting the owner: {e}", at.name);
            }
        }
    }

    /// A new entry `name` under `parent`, made on SOURCE by `make`: the
    /// node, its attributes and the parent's listing brought up to date.
    fn made(&self, req: &Request, parent: u64, name: &OsStr, at: &At) -> Res<(u64, Attr)> {
        self.count(&self.stats.source_writes);
        self.chown_to_caller(req, at);
        self.entries_changed(parent);
        let node = self.table.child(parent, name);
        // Nothing of the view's to keep: an object found under its
        // `(st_dev, st_ino)` is an older file's (the number reused) unless
        // its fingerprint says otherwise.
        match self.stat_node(node, false) {
            Ok((a, _)) => Ok((node, a)),
            Err(e) => {
                self.table.forget(node, 1);
                Err(e)
            }
        }
    }

    fn xattrs(&self, node: u64) -> Res<Vec<(Vec<u8>, Vec<u8>)>> {
        let (_, obj) = self.attr(node)?;
        let (id, v, gen) = keyed(&obj);
        if let Some(list) = self.get(Kind::Xattrs, &v, id, 0).and_then(|b| records::decode_xattrs(&b)) {
            return Ok(list);
        }
        let f = self.open_node(node)?;
        self.count(&self.stats.source_xattr_reads);
        let list = sys::all_xattrs(f.as_fd()).map_err(errno)?;
        let st = obj.state.lock();
        if st.gen == gen && st.id == id {
            self.put(Kind::Xattrs, &v, id, 0, &records::encode_xattrs(&list), false);
        }
        Ok(list)
    }

    fn xattrs_changed(&self, node: u64) {
        if let Some(obj) = self.table.object(node) {
            let mut st = obj.state.lock();
            self.cache.view_invalidate(key(Kind::Xattrs, st.id, 0));
            st.gen += 1;
        }
        let _ = self.stat_node(node, true);
    }

    /// After a name of `f` went from SOURCE: if it was the last link, the
    /// file's object is forgotten and its records dropped, so a file that
    /// gets the same inode number later never meets them.
    fn forget_if_unlinked(&self, f: Option<&File>) {
        use std::os::unix::fs::MetadataExt;
        let Some(m) = f.and_then(|f| f.metadata().ok()) else { return };
        if m.nlink() > 0 {
            return;
        }
        if let Some(obj) = self.table.forget_object(m.dev(), m.ino()) {
            let mut st = obj.state.lock();
            self.drop_all(&mut st);
            st.checked = None;
        }
    }

    /// unlink or rmdir.
    fn remove(&self, parent: u64, name: &OsStr, dir: bool) -> Res<()> {
        let at = self.writable_at(parent, name)?;
        // Held across the unlink to learn whether it took the last link.
        let gone = at.open(libc::O_PATH, 0).map(File::from).ok();
        at.unlink(dir).map_err(errno)?;
        self.count(&self.stats.source_writes);
        self.forget_if_unlinked(gone.as_ref());
        if let Some(node) = self.table.find(parent, name) {
            if let Some(obj) = self.table.object(node) {
                // Its link count and ctime changed: ask SOURCE next time.
                obj.state.lock().checked = None;
            }
        }
        self.table.unname(parent, name);
        self.entries_changed(parent);
        Ok(())
    }

    fn setattr_inner(&self, node: u64, fh: Option<FileHandle>, change: SetAttr) -> Res<Attr> {
        let SetAttr { mode, uid, gid, size, atime, mtime } = change;
        let handle = fh.and_then(|f| self.handle(f).ok());
        // What SOURCE holds before the change, so a change made there
        // meanwhile is not taken for ours.
        let before = match &handle {
            Some(h) => self.attr_of_handle(h, false)?,
            None => self.stat_node(node, false)?.0,
        };
        self.count(&self.stats.source_writes);
        if let Some(m) = mode {
            match &handle {
                Some(h) => self.file_of(h)?.set_permissions(std::fs::Permissions::from_mode(m & 0o7777)),
                None => {
                    let f = self.open_node(node)?;
                    let link = f.metadata().map_err(errno)?.file_type().is_symlink();
                    sys::chmod(f.as_fd(), link, m & 0o7777)
                }
            }
            .map_err(errno)?;
        }
        if uid.is_some() || gid.is_some() {
            self.at(node)?.chown(uid, gid).map_err(errno)?;
        }
        if let Some(sz) = size {
            let obj = match &handle {
                Some(h) => Arc::clone(&h.obj),
                None => self.table.object(node).ok_or(Errno::ENOENT)?,
            };
            let mut st = obj.state.lock();
            let r = match &handle {
                Some(h) => self.file_of(h)?.set_len(sz),
                None => self
                    .at(node)?
                    .open(libc::O_WRONLY | libc::O_NONBLOCK, 0)
                    .and_then(|fd| File::from(fd).set_len(sz)),
            };
            let rs = self.cfg.recordsize;
            self.drop_data(&st, before.size.min(sz) / rs, before.size.max(sz) / rs);
            st.gen += 1;
            r.map_err(errno)?;
        }
        if atime.is_some() || mtime.is_some() {
            self.at(node)?.utimens(atime.map(from_time), mtime.map(from_time)).map_err(errno)?;
        }
        match &handle {
            Some(h) => self.attr_of_handle(h, true),
            None => Ok(self.stat_node(node, true)?.0),
        }
    }
}

impl Filesystem for View {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> io::Result<()> {
        // Not READDIRPLUS_AUTO: with it the kernel asks for attributes only
        // in a listing's first request (and after a lookup in it), so a walk
        // of a directory larger than one reply (about 20 entries) looked
        // every later name up again, one round trip each; the view has the
        // attributes at hand.
        let plus = if self.cfg.readdirplus { InitFlags::FUSE_DO_READDIRPLUS } else { InitFlags::empty() };
        let wanted = plus
            | InitFlags::FUSE_AUTO_INVAL_DATA
            | InitFlags::FUSE_BIG_WRITES
            | InitFlags::FUSE_PARALLEL_DIROPS;
        // Unknown to an old kernel: it then runs without them.
        let _ = config.add_capabilities(wanted);
        let _ = config.set_max_readahead(self.cfg.recordsize.min(1 << 20) as u32);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        self.count(&self.stats.lookups);
        match self.lookup_node(parent.0, name) {
            Ok((node, a)) => {
                self.table.showed(node, a.size);
                reply.entry(&self.ttl(), &FileAttr { ino: INodeNo(node), ..fuse_attr(&a) }, Generation(0));
            }
            Err(e) => reply.error(e),
        }
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        self.table.forget(ino.0, nlookup);
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, fh: Option<FileHandle>, reply: ReplyAttr) {
        #[cfg(feature = "failpoints")]
        let _in_getattr = InGetattr::enter();
        let r = match fh.and_then(|f| self.handle(f).ok()) {
            Some(h) if self.table.path(ino.0).is_none() => self.attr_of_handle(&h, false),
            // A file unlinked while open (the kernel's fstat sends no
            // handle): answered from a handle of the node.
            _ => self.attr(ino.0).map(|(a, _)| a).or_else(|e| match self.handle_of_node(ino.0) {
                Some(h) if e == Errno::ENOENT => self.attr_of_handle(&h, false),
                _ => Err(e),
            }),
        };
        match r {
            Ok(a) => {
                self.table.showed(ino.0, a.size);
                reply.attr(&self.ttl(), &FileAttr { ino, ..fuse_attr(&a) })
            }
            Err(e) => reply.error(e),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let r = self
            .refuse_if_read_only()
            .and_then(|()| self.setattr_inner(ino.0, fh, SetAttr { mode, uid, gid, size, atime, mtime }));
        match r {
            Ok(a) => {
                self.table.showed(ino.0, a.size);
                reply.attr(&self.ttl(), &FileAttr { ino, ..fuse_attr(&a) })
            }
            Err(e) => reply.error(e),
        }
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let r = (|| {
            let (_, obj) = self.attr(ino.0)?;
            let (id, v, gen) = keyed(&obj);
            if let Some(target) = self.get(Kind::Symlink, &v, id, 0) {
                return Ok(target);
            }
            let f = self.open_node(ino.0)?;
            self.count(&self.stats.source_readlinks);
            let target = sys::readlink(f.as_fd()).map_err(errno)?;
            let st = obj.state.lock();
            if st.gen == gen && st.id == id {
                self.put(Kind::Symlink, &v, id, 0, &target, false);
            }
            Ok(target)
        })();
        match r {
            Ok(t) => reply.data(&t),
            Err(e) => reply.error(e),
        }
    }

    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let r = self.writable_at(parent.0, name).and_then(|at| {
            at.mknod(mode & !umask, u64::from(rdev)).map_err(errno)?;
            self.made(req, parent.0, name, &at)
        });
        self.reply_new_entry(r, reply);
    }

    fn mkdir(&self, req: &Request, parent: INodeNo, name: &OsStr, mode: u32, umask: u32, reply: ReplyEntry) {
        let r = self.writable_at(parent.0, name).and_then(|at| {
            at.mkdir(mode & !umask & 0o7777).map_err(errno)?;
            self.made(req, parent.0, name, &at)
        });
        self.reply_new_entry(r, reply);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(self.remove(parent.0, name, false), reply);
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        reply_empty(self.remove(parent.0, name, true), reply);
    }

    fn symlink(&self, req: &Request, parent: INodeNo, link_name: &OsStr, target: &Path, reply: ReplyEntry) {
        let r = self.writable_at(parent.0, link_name).and_then(|at| {
            at.symlink(target).map_err(errno)?;
            self.made(req, parent.0, link_name, &at)
        });
        self.reply_new_entry(r, reply);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let r = self.refuse_if_read_only().and_then(|()| {
            for node in [parent.0, newparent.0] {
                self.check_before_change(Some(node));
            }
            self.check_before_change(self.table.find(parent.0, name));
            self.check_before_change(self.table.find(newparent.0, newname));
            let from = self.at_child(parent.0, name)?;
            let to = self.at_child(newparent.0, newname)?;
            // What the rename may replace, to learn whether that took its
            // last link.
            let replaced = to.open(libc::O_PATH, 0).map(File::from).ok();
            from.rename(&to, flags.bits()).map_err(errno)?;
            if !flags.contains(RenameFlags::RENAME_EXCHANGE) {
                self.forget_if_unlinked(replaced.as_ref());
            }
            self.count(&self.stats.source_writes);
            let exchange = flags.contains(RenameFlags::RENAME_EXCHANGE);
            if !exchange {
                if let Some(old) = self.table.find(newparent.0, newname).and_then(|n| self.table.object(n)) {
                    old.state.lock().checked = None;
                }
            }
            self.table.rename(parent.0, name, newparent.0, newname, exchange);
            self.entries_changed(parent.0);
            if newparent != parent {
                self.entries_changed(newparent.0);
            }
            // A rename changes the moved file's ctime.
            for (p, n) in [(newparent.0, newname), (parent.0, name)] {
                if let Some(node) = self.table.find(p, n) {
                    let _ = self.stat_node(node, true);
                }
            }
            Ok(())
        });
        reply_empty(r, reply);
    }

    fn link(&self, req: &Request, ino: INodeNo, newparent: INodeNo, newname: &OsStr, reply: ReplyEntry) {
        let r = self.refuse_if_read_only().and_then(|()| {
            self.check_before_change(Some(ino.0));
            self.check_before_change(Some(newparent.0));
            let from = self.at(ino.0)?;
            let to = self.at_child(newparent.0, newname)?;
            from.link(&to).map_err(errno)?;
            let _ = req;
            self.count(&self.stats.source_writes);
            self.entries_changed(newparent.0);
            let _ = self.stat_node(ino.0, true);
            let node = self.table.child(newparent.0, newname);
            match self.stat_node(node, true) {
                Ok((a, _)) => Ok((node, a)),
                Err(e) => {
                    self.table.forget(node, 1);
                    Err(e)
                }
            }
        });
        self.reply_new_entry(r, reply);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let r = match self.open_from_cache(ino.0, flags.0) {
            Some((h, a)) => {
                self.count(&self.stats.deferred_opens);
                let keep = self.table.opened_as(ino.0, Some(a.fingerprint())) && self.cfg.keep_cache;
                let (fh, h) = self.insert_handle(h);
                self.binder.bind_later(&h, &self.stats);
                Ok((fh, keep))
            }
            None => self.open_on_source(ino.0, flags.0),
        };
        match r {
            Ok((fh, keep)) => {
                if keep {
                    self.count(&self.stats.kept_caches);
                }
                let flags = if keep { FopenFlags::FOPEN_KEEP_CACHE } else { FopenFlags::empty() };
                reply.opened(FileHandle(fh), flags)
            }
            Err(e) => reply.error(e),
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyData,
    ) {
        match self.handle(fh).and_then(|h| self.read_through(&h, offset, size)) {
            Ok(d) => reply.data(&d),
            Err(e) => reply.error(e),
        }
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: fuser::WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        reply: ReplyWrite,
    ) {
        let r = self.refuse_if_read_only().and_then(|()| {
            let h = self.handle(fh)?;
            // A change made on SOURCE meanwhile is found before ours is made.
            let before = self.attr_of_handle(&h, false)?;
            let file = self.file_of(&h)?;
            let n = file.write_at(data, offset).map_err(errno)?;
            self.count(&self.stats.source_writes);
            self.cache.count_view_source_write(n as u64);
            let ticket = self.ticket();
            let after = Attr::from_metadata(&file.metadata().map_err(errno)?);
            {
                let mut st = h.obj.state.lock();
                let rs = self.cfg.recordsize;
                let from = offset.min(before.size) / rs;
                let to = (offset + n as u64).max(after.size) / rs;
                self.drop_data(&st, from, to);
                st.gen += 1;
            }
            // Only the size this write makes is the view's own: another
            // (a change on SOURCE between the check above and now, or an
            // O_APPEND descriptor writing elsewhere) drops every record.
            let expected = before.size.max(offset + n as u64);
            self.settle(&h.obj, &after, after.size == expected, ticket);
            if after.size == expected {
                // The kernel sizes the file itself after a write: the same.
                self.table.showed(h.node, after.size);
            }
            Ok(n as u32)
        });
        match r {
            Ok(n) => reply.written(n),
            Err(e) => reply.error(e),
        }
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _lo: fuser::LockOwner,
        reply: ReplyEmpty,
    ) {
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<fuser::LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        self.handles.lock().remove(&fh.0);
        reply.ok();
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, fh: FileHandle, datasync: bool, reply: ReplyEmpty) {
        let r = self.handle(fh).and_then(|h| {
            let file = self.file_of(&h)?;
            if datasync { file.sync_data() } else { file.sync_all() }.map_err(errno)
        });
        reply_empty(r, reply);
    }

    fn opendir(&self, _req: &Request, _ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let fh = self.next_fh.fetch_add(1, Relaxed);
        self.dirs.lock().insert(fh, None);
        reply.opened(FileHandle(fh), FopenFlags::empty());
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.dirs.lock().remove(&fh.0);
        reply.ok();
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let entries = match self.dir_snapshot(ino.0, fh, offset) {
            Ok((e, _)) => e,
            Err(e) => return reply.error(e),
        };
        let dots =
            [(ino.0, FileType::Directory, OsStr::new(".")), (ino.0, FileType::Directory, OsStr::new(".."))];
        let all = dots
            .into_iter()
            .chain(entries.iter().map(|e| (e.ino, dtype_kind(e.dtype), OsStr::from_bytes(&e.name))));
        for (i, (eino, kind, name)) in all.enumerate().skip(offset as usize) {
            if reply.add(INodeNo(eino), i as u64 + 1, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let (entries, current) = match self.dir_snapshot(ino.0, fh, offset) {
            Ok(e) => e,
            Err(e) => return reply.error(e),
        };
        let ttl = self.ttl();
        for i in offset as usize..entries.len() + 2 {
            let (name, node, attr) = if i < 2 {
                let name = if i == 0 { "." } else { ".." };
                match self.attr(ino.0) {
                    // The kernel takes no reference for the dots.
                    Ok((a, _)) => (OsStr::new(name), ino.0, a),
                    Err(e) => return reply.error(e),
                }
            } else {
                let e = &entries[i - 2];
                let name = OsStr::from_bytes(&e.name);
                // A snapshot the directory has not changed since is a fresh
                // listing: no need to look the name up in it again. One it
                // has changed since may name what is gone or replaced: each
                // name is checked as lookup would without a listing.
                match self.child_attr(ino.0, name, current.then_some(e.ino)) {
                    Ok((node, a)) => (name, node, a),
                    // Gone since the listing: left out.
                    Err(_) => continue,
                }
            };
            let fa = FileAttr { ino: INodeNo(node), ..fuse_attr(&attr) };
            if i >= 2 {
                self.table.showed(node, attr.size);
            }
            if reply.add(INodeNo(node), i as u64 + 1, name, &ttl, &fa, Generation(0)) {
                if i >= 2 {
                    // Not handed out (the buffer is full): child's reference back.
                    self.table.forget(node, 1);
                }
                break;
            }
        }
        reply.ok();
    }

    fn fsyncdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        let r = self
            .table
            .path(ino.0)
            .ok_or(Errno::ENOENT)
            .and_then(|p| self.open_dir(&p, libc::O_RDONLY))
            .and_then(|fd| File::from(fd).sync_all().map_err(errno));
        reply_empty(r, reply);
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        match sys::statvfs(self.root.as_fd()) {
            Ok(s) => reply.statfs(
                s.f_blocks,
                s.f_bfree,
                s.f_bavail,
                s.f_files,
                s.f_ffree,
                s.f_bsize as u32,
                s.f_namemax as u32,
                s.f_frsize as u32,
            ),
            Err(e) => reply.error(errno(e)),
        }
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        let r = self.refuse_if_read_only().and_then(|()| {
            self.check_before_change(Some(ino.0));
            let f = self.open_node(ino.0)?;
            sys::set_xattr(f.as_fd(), name, value, flags).map_err(errno)?;
            self.count(&self.stats.source_writes);
            self.xattrs_changed(ino.0);
            Ok(())
        });
        reply_empty(r, reply);
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let r = self.xattrs(ino.0).and_then(|list| {
            list.into_iter().find(|(n, _)| n == name.as_bytes()).map(|(_, v)| v).ok_or(Errno::NO_XATTR)
        });
        reply_xattr(r, size, reply);
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let r = self.xattrs(ino.0).map(|list| {
            let mut names = Vec::new();
            for (n, _) in list {
                names.extend_from_slice(&n);
                names.push(0);
            }
            names
        });
        reply_xattr(r, size, reply);
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let r = self.refuse_if_read_only().and_then(|()| {
            self.check_before_change(Some(ino.0));
            let f = self.open_node(ino.0)?;
            sys::remove_xattr(f.as_fd(), name).map_err(errno)?;
            self.count(&self.stats.source_writes);
            self.xattrs_changed(ino.0);
            Ok(())
        });
        reply_empty(r, reply);
    }

    fn access(&self, _req: &Request, ino: INodeNo, mask: fuser::AccessFlags, reply: ReplyEmpty) {
        let r = self.attr(ino.0).and_then(|_| {
            if mask.bits() & libc::W_OK != 0 {
                self.refuse_if_read_only()?;
            }
            Ok(())
        });
        reply_empty(r, reply);
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let r = self.writable_at(parent.0, name).and_then(|at| {
            let keep = libc::O_APPEND | libc::O_EXCL | libc::O_TRUNC | libc::O_SYNC | libc::O_DSYNC;
            let fd = at
                .open(
                    libc::O_RDWR | libc::O_CREAT | libc::O_NONBLOCK | (flags & keep),
                    mode & !umask & 0o7777,
                )
                .map_err(errno)?;
            let file = File::from(fd);
            let (node, _) = self.made(req, parent.0, name, &at)?;
            // What was created is what this handle shows, whatever the
            // name leads to by now.
            let (a, obj) = self.bind_opened(node, &file).inspect_err(|_| self.table.forget(node, 1))?;
            Ok((node, a, self.add_handle(file, obj, node)))
        });
        match r {
            Ok((node, a, fh)) => {
                self.table.showed(node, a.size);
                let fa = FileAttr { ino: INodeNo(node), ..fuse_attr(&a) };
                reply.created(&self.ttl(), &fa, Generation(0), FileHandle(fh), FopenFlags::empty());
            }
            Err(e) => reply.error(e),
        }
    }
}

impl View {
    fn reply_new_entry(&self, r: Res<(u64, Attr)>, reply: ReplyEntry) {
        match r {
            Ok((node, a)) => {
                self.table.showed(node, a.size);
                reply.entry(&self.ttl(), &FileAttr { ino: INodeNo(node), ..fuse_attr(&a) }, Generation(0));
            }
            Err(e) => reply.error(e),
        }
    }

    /// `O_TRUNC` at open.
    fn truncate_handle(&self, h: &Handle) -> Res<()> {
        let before = self.attr_of_handle(h, false)?;
        {
            let mut st = h.obj.state.lock();
            self.file_of(h)?.set_len(0).map_err(errno)?;
            self.drop_data(&st, 0, before.size / self.cfg.recordsize);
            st.gen += 1;
        }
        self.count(&self.stats.source_writes);
        self.attr_of_handle(h, true)?;
        Ok(())
    }
}

fn reply_empty(r: Res<()>, reply: ReplyEmpty) {
    match r {
        Ok(()) => reply.ok(),
        Err(e) => reply.error(e),
    }
}

fn reply_xattr(r: Res<Vec<u8>>, size: u32, reply: ReplyXattr) {
    match r {
        Ok(v) if size == 0 => reply.size(v.len() as u32),
        Ok(v) if v.len() > size as usize => reply.error(Errno::ERANGE),
        Ok(v) => reply.data(&v),
        Err(e) => reply.error(e),
    }
}

/// A mounted view. Unmounted by [`Mounted::unmount`], or from outside with
/// `fusermount3 -u` (then [`Mounted::ended`] turns true).
pub struct Mounted {
    unmounter: fuser::SessionUnmounter,
    thread: Option<std::thread::JoinHandle<io::Result<()>>>,
    ended: Arc<AtomicBool>,
    pub stats: Arc<ViewStats>,
    table: Arc<Table>,
    inotify: Option<Arc<Watcher>>,
    pub mountpoint: PathBuf,
    watcher: Option<std::process::Child>,
}

impl Mounted {
    /// Whether the session is over (unmounted from outside).
    pub fn ended(&self) -> bool {
        self.ended.load(Relaxed)
    }

    /// The counters by name, with the table's sizes at the time of each call.
    pub fn stat_source(&self) -> Box<dyn Fn() -> Vec<(&'static str, u64)> + Send + Sync> {
        let (stats, table) = (Arc::clone(&self.stats), Arc::clone(&self.table));
        let inotify = self.inotify.clone();
        Box::new(move || {
            let sizes = table.sizes();
            if let Some(w) = &inotify {
                stats.watched_dirs.store(w.watched(), Relaxed);
                stats.inotify_events.store(w.events.load(Relaxed), Relaxed);
            }
            stats.nodes.store(sizes.nodes, Relaxed);
            stats.objects.store(sizes.objects, Relaxed);
            stats.objects_trimmed.store(sizes.trimmed, Relaxed);
            stats.fields()
        })
    }

    /// Unmounts (if still mounted) and waits for the FUSE threads.
    pub fn unmount(mut self) -> io::Result<()> {
        // Called off first: once this unmounts, a new view may be mounted
        // at the same point, which the watcher must not take down.
        if let Some(mut w) = self.watcher.take() {
            let _ = w.kill();
            let _ = w.wait();
        }
        // Even after the session ended (unmounted from outside, or its
        // threads gone): a mount left behind would be a dangling one.
        let r = match self.unmounter.unmount() {
            Err(_) if !is_mounted(&self.mountpoint) => Ok(()),
            r => r,
        };
        if let Some(t) = self.thread.take() {
            match t.join() {
                Ok(Err(e)) => warn!("FUSE session: {e}"),
                Err(_) => warn!("FUSE session thread panicked"),
                Ok(Ok(())) => {}
            }
        }
        r
    }
}

/// Record `offset..offset + len` of the handle's file from SOURCE: with
/// `O_DIRECT` where SOURCE takes it (one request for the whole record),
/// else buffered; fewer bytes only at the end of the file.
fn read_record(
    file: &File,
    direct: &OnceLock<Option<File>>,
    offset: u64,
    len: usize,
    stats: &ViewStats,
) -> io::Result<Vec<u8>> {
    if let Some(d) = direct.get_or_init(|| direct::reopen_direct(file)) {
        match direct::read_direct(d, offset, len) {
            // Refused after all: buffered.
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
            r => {
                stats.source_direct_reads.fetch_add(1, Relaxed);
                return r;
            }
        }
    }
    let mut buf = vec![0u8; len];
    let mut got = 0;
    while got < len {
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    buf.truncate(got);
    Ok(buf)
}

/// The identity of the view of `source` for the L2 export table
/// (docs/format.md, export kind 1): its records on an L2 device are
/// restored only into a view of the same directory with the same
/// recordsize. (name, identity.)
pub fn l2_identity(source: &Path) -> io::Result<(String, u64)> {
    use std::os::unix::fs::MetadataExt;
    let path = std::fs::canonicalize(source)?;
    let m = std::fs::metadata(&path)?;
    let text = format!("view:{}:{}:{}", path.display(), m.dev(), m.ino());
    let name = format!("view:{}", path.display());
    Ok((name, xxhash_rust::xxh3::xxh3_64(text.as_bytes())))
}

/// Mounts a view of `cfg.source` at `mountpoint`, its records in `cache`.
pub fn mount(cfg: ViewConfig, cache: Arc<Cache>, mountpoint: &Path) -> io::Result<Mounted> {
    let source = std::fs::canonicalize(&cfg.source)?;
    if !source.is_dir() {
        return Err(io::Error::other(format!("{} is not a directory", source.display())));
    }
    // A view inside what it shows would look itself up without end (a
    // walk of it deadlocks at depth).
    let at = std::fs::canonicalize(mountpoint)?;
    if at.starts_with(&source) {
        return Err(io::Error::other(format!(
            "MOUNTPOINT {} is inside SOURCE {}",
            at.display(),
            source.display()
        )));
    }
    let root = {
        use std::os::unix::fs::OpenOptionsExt;
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(&source)?
    };
    let as_root = {
        // SAFETY: geteuid has no preconditions.
        unsafe { libc::geteuid() == 0 }
    };
    let stats = Arc::new(ViewStats::default());
    let watcher = if cfg.watch_max.is_zero() { None } else { Watcher::new(root.as_fd()) };
    let inotify = watcher.clone();
    let view = View {
        cfg: ViewConfig { source: source.clone(), ..cfg.clone() },
        table: Arc::new(Table::with_budget(Arc::clone(&cache) as Arc<dyn table::Budget>)),
        cache,
        handles: Mutex::new(FxHashMap::default()),
        dirs: Mutex::new(FxHashMap::default()),
        next_fh: AtomicU64::new(1),
        stats: Arc::clone(&stats),
        as_root,
        watcher,
        root: OwnedFd::from(root),
        stat_clock: AtomicU64::new(1),
        open_ahead: openahead::OpenAhead::default(),
        binder: deferred::Binder::default(),
    };
    let table = Arc::clone(&view.table);
    // The root is SOURCE itself.
    let root_meta = File::from(view.root.try_clone()?).metadata()?;
    let root_attr = Attr::from_metadata(&root_meta);
    view.table.bind(ROOT, &root_attr, || view.new_state(&root_attr));
    let options = vec![
        MountOption::FSName(format!("arcache:{}", source.display())),
        MountOption::Subtype("arcache".into()),
        MountOption::DefaultPermissions,
        MountOption::NoAtime,
        if cfg.read_only { MountOption::RO } else { MountOption::RW },
    ];
    let mut config = fuser::Config::default();
    // No auto_unmount: fuser then leaves the unmount to a fusermount3
    // watcher that was seen to exit early here, and the view's own unmount
    // did nothing. A server killed with -9 leaves the mount point
    // answering ENOTCONN until `fusermount3 -u` (docs/fileview.md).
    if cfg.allow_other {
        config.acl = fuser::SessionACL::All;
    }
    config.mount_options = options;
    config.n_threads = Some(cfg.threads.max(1));
    let session = fuser::Session::new(view, mountpoint, &config)?;
    let mut session = session;
    if let Some(w) = &inotify {
        spawn_inotify(Arc::clone(w), session.notifier(), Arc::clone(&table))?;
    }
    let unmounter = session.unmount_callable();
    let ended = Arc::new(AtomicBool::new(false));
    let e = Arc::clone(&ended);
    let thread = std::thread::Builder::new().name("fileview".into()).spawn(move || {
        let r = session.run();
        e.store(true, Relaxed);
        r
    })?;
    let abs = std::fs::canonicalize(mountpoint)?;
    let watcher = match spawn_watcher(&abs) {
        Ok(w) => Some(w),
        Err(e) => {
            warn!(
                "no unmount watcher ({e}): if this process is killed, run fusermount3 -u {}",
                abs.display()
            );
            None
        }
    };
    Ok(Mounted { unmounter, thread: Some(thread), ended, stats, table, inotify, mountpoint: abs, watcher })
}

/// Reads inotify events: each clears the marks it touches (`watch.rs`) and
/// drops what the kernel caches of the name (its entry, and the node's
/// attributes and pages), so a change made on SOURCE is seen at the next
/// access rather than when the kernel's entry lifetime ends.
fn spawn_inotify(w: Arc<Watcher>, notifier: fuser::Notifier, table: Arc<Table>) -> io::Result<()> {
    let touched = move |dir: u64, name: Option<&OsStr>| match name {
        Some(name) => {
            let _ = notifier.inval_entry(INodeNo(dir), name);
            if let Some(child) = table.find(dir, name) {
                let _ = notifier.inval_inode(INodeNo(child), 0, 0);
            }
        }
        None => {
            let _ = notifier.inval_inode(INodeNo(dir), 0, 0);
        }
    };
    std::thread::Builder::new().name("fileview-inotify".into()).spawn(move || w.run(touched))?;
    Ok(())
}

/// A process that unmounts `mountpoint` when this one is gone without
/// having done it (kill -9, a crash): it waits for the end of a pipe only
/// this process holds open, which the kernel closes when the process dies.
/// In its own process group, so a Ctrl-C meant for the server leaves it to
/// the server's own stop, which ends it first.
fn spawn_watcher(mountpoint: &Path) -> io::Result<std::process::Child> {
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};
    Command::new("/bin/sh")
        .arg("-c")
        .arg(r#"read _; fusermount3 -u -z -- "$0" 2>/dev/null || umount -l -- "$0" 2>/dev/null"#)
        .arg(mountpoint)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
}

/// Whether `/proc/self/mountinfo` lists a mount at `path`.
pub fn is_mounted(path: &Path) -> bool {
    let Ok(abs) = std::fs::canonicalize(path).or_else(|_| std::path::absolute(path)) else { return false };
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else { return false };
    let want = abs.to_string_lossy().replace(' ', "\\040");
    info.lines().any(|l| l.split(' ').nth(4) == Some(want.as_str()))
}
