//! inotify on SOURCE's directories (`docs/fileview.md`, "inotify"): while
//! a directory is watched and no event has come for a name in it, what the
//! view last checked of that name is still what SOURCE has, so its object
//! stays fresh past the revalidate window (up to `watch_max`), and a change
//! made on this machine is seen as soon as its event is read, not at the
//! end of the window.
//!
//! A *mark* on an object says "an event will clear this": it is set only
//! when the watch's event count did not move between the check of SOURCE
//! and the mark, so an event that raced the check is never lost, and it is
//! cleared by any event for the object's name, for the directory itself,
//! by the watch going away, and (all marks at once, through the epoch) by
//! a queue overflow. An event also ends the object's revalidate window:
//! its next use checks SOURCE.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use rustc_hash::FxHashMap;
use tracing::{debug, warn};

use crate::table::Object;

/// What a marked object remembers: the epoch it was marked in (an
/// overflow starts a new one and ends every mark). Which watch holds it
/// needs no remembering: every other end of a mark (an event, the watch
/// going away) clears it on the object itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    pub epoch: u64,
}

/// An event says the object may have changed: its next use checks
/// SOURCE, whatever the revalidate window says. (An object the table has
/// dropped since needs nothing: found again, it starts unchecked.)
fn changed(obj: &Weak<Object>) {
    if let Some(obj) = obj.upgrade() {
        let mut st = obj.state.lock();
        st.watch = None;
        st.checked = None;
    }
}

/// File systems whose changes made on other machines send no event here
/// (statfs f_type): no object is marked on them.
const REMOTE_FS: [i64; 9] = [
    0x6969,      // NFS
    0x517B,      // SMB
    0xFF53_4D42, // CIFS
    0xFE53_4D42, // SMB2
    0x6573_5546, // FUSE (sshfs, rclone, another view, ...)
    0x00C3_6400, // Ceph
    0x0102_1997, // 9p
    0x5346_414F, // AFS
    0x0BD0_0BD0, // Lustre
];

const MASK: u32 = libc::IN_MODIFY
    | libc::IN_ATTRIB
    | libc::IN_MOVED_FROM
    | libc::IN_MOVED_TO
    | libc::IN_CREATE
    | libc::IN_DELETE
    | libc::IN_DELETE_SELF
    | libc::IN_MOVE_SELF
    | libc::IN_ONLYDIR;

struct Dir {
    /// The view's node of the directory when it was last watched or
    /// listed: whose kernel caches an event invalidates.
    node: u64,
    /// Events seen on it; a mark is set only if this did not move since
    /// the check it rests on began.
    events: u64,
    /// The directory's own object, if marked. Marks do not hold their
    /// objects: the table may drop one nothing else holds (`table.rs`).
    own: Option<Weak<Object>>,
    /// Marked objects by their name in the directory.
    children: FxHashMap<OsString, Weak<Object>>,
}

#[derive(Default)]
struct Inner {
    by_wd: FxHashMap<i32, Dir>,
    by_object: FxHashMap<(u64, u64), i32>,
    /// inotify refused a watch (ENOSPC: max_user_watches): said once.
    full_said: bool,
    /// Marks made since marks of dropped objects were last swept out, and
    /// how many were left then: a sweep when the first passes the second
    /// keeps the marks within twice the objects alive, at a constant cost
    /// per mark.
    marked_since_sweep: u64,
    left_by_sweep: u64,
}

impl Inner {
    fn sweep(&mut self) {
        let mut left = 0;
        for d in self.by_wd.values_mut() {
            d.children.retain(|_, o| o.strong_count() > 0);
            if d.own.as_ref().is_some_and(|o| o.strong_count() == 0) {
                d.own = None;
            }
            left += d.children.len() as u64;
        }
        (self.marked_since_sweep, self.left_by_sweep) = (0, left);
    }
}

/// A directory node and a name in it (None: the directory itself) whose
/// kernel caches an event invalidates.
type Touched = (u64, Option<OsString>);

pub struct Watcher {
    fd: OwnedFd,
    inner: Mutex<Inner>,
    epoch: AtomicU64,
    stop: AtomicBool,
    /// Held while a batch of events is read and applied, so a reader that
    /// gets it knows every event read before has been applied.
    reading: Mutex<()>,
    /// What `catch_up` read for the kernel to forget, told by `run`.
    pending: Mutex<Vec<Touched>>,
    /// Events read, for statistics.
    pub events: AtomicU64,
}

/// The watch of a directory as a check begins: `(wd, events)`.
pub type Before = (i32, u64);

impl Watcher {
    /// A watcher for SOURCE (`root`), or `None` where events cannot be
    /// trusted to cover every change (a network or FUSE file system) or
    /// inotify is unavailable.
    pub fn new(root: BorrowedFd) -> Option<Arc<Watcher>> {
        // SAFETY: statfs fills the struct it is given.
        let mut sfs: libc::statfs = unsafe { std::mem::zeroed() };
        // SAFETY: a valid descriptor and a struct of the right type.
        if unsafe { libc::fstatfs(root.as_raw_fd(), &mut sfs) } != 0 {
            return None;
        }
        #[allow(clippy::unnecessary_cast)]
        let kind = sfs.f_type as i64;
        if REMOTE_FS.contains(&kind) {
            debug!("SOURCE is on a network or FUSE file system ({kind:#x}): no inotify");
            return None;
        }
        // SAFETY: no pointers; the result is checked.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            warn!(
                "inotify_init1: {}; changes in SOURCE are seen by revalidation only",
                io::Error::last_os_error()
            );
            return None;
        }
        Some(Arc::new(Watcher {
            // SAFETY: a descriptor inotify_init1 just returned, owned here only.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
            inner: Mutex::new(Inner::default()),
            epoch: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            reading: Mutex::new(()),
            pending: Mutex::new(Vec::new()),
            events: AtomicU64::new(0),
        }))
    }

    /// Whether `mark` still vouches for its object.
    pub fn valid(&self, mark: Option<Mark>) -> bool {
        mark.is_some_and(|m| m.epoch == self.epoch.load(Relaxed))
    }

    /// Watches the directory open as `dir` (object `obj`) if it is not
    /// yet; its watch as a check of it begins. `None` if it cannot be.
    pub fn watch_dir(&self, dir: BorrowedFd, obj: &Object, node: u64) -> Option<Before> {
        let mut inner = self.inner.lock();
        if let Some(&wd) = inner.by_object.get(&(obj.dev, obj.ino)) {
            return inner.by_wd.get_mut(&wd).map(|d| {
                d.node = node;
                (wd, d.events)
            });
        }
        let path = format!("/proc/self/fd/{}\0", dir.as_raw_fd());
        // SAFETY: a NUL-terminated path and a valid inotify descriptor.
        let wd = unsafe { libc::inotify_add_watch(self.fd.as_raw_fd(), path.as_ptr().cast(), MASK) };
        if wd < 0 {
            let e = io::Error::last_os_error();
            if !inner.full_said {
                inner.full_said = true;
                warn!("inotify_add_watch: {e}; directories past this are checked by revalidation only");
            }
            return None;
        }
        // A wd already known (a directory reached twice) keeps its state.
        inner.by_object.insert((obj.dev, obj.ino), wd);
        let d = inner.by_wd.entry(wd).or_insert(Dir {
            node,
            events: 0,
            own: None,
            children: FxHashMap::default(),
        });
        Some((wd, d.events))
    }

    /// The watch of the directory object `dir`, as a check of one of its
    /// names begins.
    pub fn before(&self, dir: &Object) -> Option<Before> {
        let inner = self.inner.lock();
        let wd = *inner.by_object.get(&(dir.dev, dir.ino))?;
        inner.by_wd.get(&wd).map(|d| (wd, d.events))
    }

    /// Whether `obj` is marked under `name` in the directory object `dir`
    /// and no event has ended the mark: what the name leads to is `obj`
    /// as last checked. (A mark on the object alone is not enough: it
    /// vouches for the name it was checked under, and a node of another
    /// name may still point at the object.)
    pub fn vouches_for(&self, dir: &Object, name: &OsStr, obj: &Arc<Object>) -> bool {
        let marked_here = {
            let inner = self.inner.lock();
            inner
                .by_object
                .get(&(dir.dev, dir.ino))
                .and_then(|wd| inner.by_wd.get(wd))
                .and_then(|d| d.children.get(name))
                .is_some_and(|o| std::ptr::eq(o.as_ptr(), Arc::as_ptr(obj)))
        };
        marked_here && self.valid(obj.state.lock().watch)
    }

    /// Marks `obj`, just checked under `name` in the watched directory
    /// (`before` taken as the check began), unless an event came since.
    /// `name` None marks the directory itself.
    pub fn mark(&self, before: Before, name: Option<&OsStr>, obj: &Arc<Object>) -> bool {
        let (wd, events) = before;
        let mut inner = self.inner.lock();
        let epoch = self.epoch.load(Relaxed);
        let Some(d) = inner.by_wd.get_mut(&wd) else { return false };
        if d.events != events {
            return false;
        }
        match name {
            Some(n) => {
                if let Some(old) = d.children.insert(n.to_os_string(), Arc::downgrade(obj)) {
                    if !std::ptr::eq(old.as_ptr(), Arc::as_ptr(obj)) {
                        if let Some(old) = old.upgrade() {
                            old.state.lock().watch = None;
                        }
                    }
                }
            }
            None => d.own = Some(Arc::downgrade(obj)),
        }
        obj.state.lock().watch = Some(Mark { epoch });
        inner.marked_since_sweep += 1;
        if inner.marked_since_sweep > inner.left_by_sweep.max(1024) {
            inner.sweep();
        }
        true
    }

    /// Reads and applies the events queued, clearing the marks they touch;
    /// what the kernel must forget goes to `out`.
    fn drain(&self, out: &mut Vec<Touched>) {
        let mut buf = [0u8; 16 << 10];
        loop {
            let _batch = self.reading.lock();
            // SAFETY: reads into a buffer of the given length.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                return;
            }
            let mut at = 0usize;
            let n = n as usize;
            const HEAD: usize = std::mem::size_of::<libc::inotify_event>();
            while at + HEAD <= n {
                // SAFETY: the kernel wrote a whole event header here; read
                // unaligned, the buffer being bytes.
                let ev: libc::inotify_event = unsafe { std::ptr::read_unaligned(buf[at..].as_ptr().cast()) };
                let len = ev.len as usize;
                let name_bytes = buf.get(at + HEAD..at + HEAD + len).unwrap_or(&[]);
                let name = OsStr::from_bytes(name_bytes.split(|&b| b == 0).next().unwrap_or(&[]));
                if let Some(node) = self.event(ev.wd, ev.mask, name) {
                    out.push((node, (!name.is_empty()).then(|| name.to_os_string())));
                }
                at += HEAD + len;
            }
        }
    }

    /// Applies every event queued by now, in the caller's thread: a change
    /// made on SOURCE before a request began is queued before the request
    /// comes (the kernel queues an event within the call that makes the
    /// change), so after this no mark vouches for what it changed, however
    /// far behind the watcher thread is. What the kernel must forget is left
    /// for that thread to tell (a request must not wait on the kernel).
    pub fn catch_up(&self) {
        let mut out = Vec::new();
        self.drain(&mut out);
        if !out.is_empty() {
            self.pending.lock().extend(out);
        }
    }

    /// Clears what one event touches; the directory's node, if known.
    fn event(&self, wd: i32, mask: u32, name: &OsStr) -> Option<u64> {
        self.events.fetch_add(1, Relaxed);
        if mask & libc::IN_Q_OVERFLOW != 0 {
            // Events were lost: no mark can be trusted.
            self.epoch.fetch_add(1, Relaxed);
            let mut inner = self.inner.lock();
            for d in inner.by_wd.values_mut() {
                d.events += 1;
                d.own = None;
                d.children.clear();
            }
            return None;
        }
        let mut inner = self.inner.lock();
        let gone = mask & libc::IN_IGNORED != 0;
        let d = inner.by_wd.get_mut(&wd)?;
        d.events += 1;
        let node = d.node;
        // The directory's own entries or attributes changed (an event on a
        // file in it, a write or its attributes, leaves the directory be).
        let entries = libc::IN_CREATE | libc::IN_DELETE | libc::IN_MOVED_FROM | libc::IN_MOVED_TO;
        if name.is_empty() || mask & entries != 0 {
            if let Some(own) = d.own.take() {
                changed(&own);
            }
        }
        if !name.is_empty() {
            if let Some(child) = d.children.remove(name) {
                changed(&child);
            }
        }
        if gone {
            if let Some(d) = inner.by_wd.remove(&wd) {
                for (_, c) in d.children {
                    changed(&c);
                }
            }
            inner.by_object.retain(|_, w| *w != wd);
        }
        Some(node)
    }

    /// Reads events until told to stop, telling `touched` each directory
    /// node and name (None: the directory itself) whose kernel caches to
    /// drop; outside every lock, since telling the kernel may wait for a
    /// request on that directory to end.
    pub fn run(self: Arc<Self>, touched: impl Fn(u64, Option<&OsStr>)) {
        let mut pfd = libc::pollfd { fd: self.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
        let mut out = Vec::new();
        while !self.stop.load(Relaxed) {
            // SAFETY: one valid pollfd.
            let r = unsafe { libc::poll(&mut pfd, 1, 200) };
            if r > 0 {
                self.drain(&mut out);
            }
            out.append(&mut self.pending.lock());
            for (node, name) in out.drain(..) {
                touched(node, name.as_deref());
            }
        }
    }

    pub fn stop(&self) {
        self.stop.store(true, Relaxed);
    }

    /// Directories watched, for statistics.
    pub fn watched(&self) -> u64 {
        self.inner.lock().by_wd.len() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::Fingerprint;
    use crate::table::ObjState;
    use std::time::Instant;

    fn object(ino: u64) -> Arc<Object> {
        let state = ObjState {
            id: ino,
            born: Fingerprint::default(),
            fp: Fingerprint::default(),
            checked: Some(Instant::now()),
            gen: 0,
            dir_chunks: 0,
            watch: None,
            settled_by: 0,
        };
        Arc::new(Object::detached(1, ino, state))
    }

    /// A watcher with one watched directory (object 1); its watch.
    fn watched() -> (Arc<Watcher>, tempfile::TempDir, Arc<Object>, i32) {
        let dir = tempfile::tempdir().unwrap();
        let fd = std::fs::File::open(dir.path()).unwrap();
        let w = Watcher::new(std::os::fd::AsFd::as_fd(&fd)).expect("inotify on a local directory");
        let d = object(1);
        let (wd, _) = w.watch_dir(std::os::fd::AsFd::as_fd(&fd), &d, 7).expect("a watch");
        (w, dir, d, wd)
    }

    fn marked(w: &Watcher, o: &Object) -> bool {
        w.valid(o.state.lock().watch)
    }

    /// A mark does not keep its object; marks of objects dropped are swept
    /// out as new ones are made, so they stay within twice the live ones.
    #[test]
    fn marks_neither_hold_their_objects_nor_outlive_them_for_long() {
        let (w, _dir, d, _) = watched();
        let kept = object(2);
        assert!(w.mark(w.before(&d).unwrap(), Some(OsStr::new("kept")), &kept));
        let weak = Arc::downgrade(&kept);
        for i in 0..5000u64 {
            let o = object(10 + i);
            assert!(w.mark(w.before(&d).unwrap(), Some(OsStr::new(&format!("f{i}"))), &o));
        }
        let left: usize = w.inner.lock().by_wd.values().map(|d| d.children.len()).sum();
        assert!(left <= 2 * 1024 + 1, "{left} marks kept for 1 object alive");
        assert!(w.vouches_for(&d, OsStr::new("kept"), &kept), "the live object's mark was swept");
        drop(kept);
        assert_eq!(weak.strong_count(), 0, "the mark kept its object alive");
    }

    #[test]
    fn an_event_between_the_check_and_the_mark_refuses_the_mark() {
        let (w, _dir, d, wd) = watched();
        let f = object(2);
        let before = w.before(&d).unwrap();
        // The check of `f` began; an event for another name came meanwhile.
        assert_eq!(w.event(wd, libc::IN_MODIFY, OsStr::new("other")), Some(7));
        assert!(!w.mark(before, Some(OsStr::new("f")), &f), "a mark resting on a stale check");
        assert!(!marked(&w, &f));
        let before = w.before(&d).unwrap();
        assert!(w.mark(before, Some(OsStr::new("f")), &f));
        assert!(marked(&w, &f));
    }

    #[test]
    fn an_event_for_a_name_ends_its_mark_and_its_window_and_leaves_the_rest() {
        let (w, _dir, d, wd) = watched();
        let (f, g) = (object(2), object(3));
        for (name, o) in [("f", &f), ("g", &g)] {
            assert!(w.mark(w.before(&d).unwrap(), Some(OsStr::new(name)), o));
        }
        assert!(w.mark(w.before(&d).unwrap(), None, &d));
        w.event(wd, libc::IN_MODIFY, OsStr::new("f"));
        assert!(!marked(&w, &f) && f.state.lock().checked.is_none(), "f's mark and window end");
        assert!(marked(&w, &g), "another name's mark stays");
        assert!(marked(&w, &d), "a write to a file leaves its directory's entries be");
        w.event(wd, libc::IN_CREATE, OsStr::new("new"));
        assert!(!marked(&w, &d) && d.state.lock().checked.is_none(), "a new entry ends the directory's");
        assert!(marked(&w, &g));
    }

    /// A mark vouches for the name it was made under, not for the object
    /// wherever it is named: two hard links share an object, and a node of
    /// the other name may lead elsewhere now; another file marked under the
    /// name ends the old object's vouching there.
    #[test]
    fn a_mark_vouches_only_for_the_name_it_was_checked_under() {
        let (w, _dir, d, _) = watched();
        let (o, other) = (object(2), object(3));
        assert!(w.mark(w.before(&d).unwrap(), Some(OsStr::new("a")), &o));
        assert!(w.vouches_for(&d, OsStr::new("a"), &o));
        assert!(marked(&w, &o), "the object's own mark stands");
        assert!(!w.vouches_for(&d, OsStr::new("b"), &o), "vouched for under a name it was not checked under");
        assert!(w.mark(w.before(&d).unwrap(), Some(OsStr::new("a")), &other));
        assert!(!w.vouches_for(&d, OsStr::new("a"), &o), "the name leads to another file now");
        assert!(!marked(&w, &o), "the replaced object's mark stays");
        assert!(w.vouches_for(&d, OsStr::new("a"), &other));
        let elsewhere = object(4);
        assert!(
            !w.vouches_for(&elsewhere, OsStr::new("a"), &other),
            "vouched for in a directory not watched"
        );
    }

    #[test]
    fn an_overflow_ends_every_mark_and_a_watch_that_goes_ends_its_own() {
        let (w, _dir, d, wd) = watched();
        let f = object(2);
        assert!(w.mark(w.before(&d).unwrap(), Some(OsStr::new("f")), &f));
        w.event(-1, libc::IN_Q_OVERFLOW, OsStr::new(""));
        assert!(!marked(&w, &f), "events were lost: the mark cannot stand");
        assert!(w.mark(w.before(&d).unwrap(), Some(OsStr::new("f")), &f), "marked again in the new epoch");
        w.event(wd, libc::IN_IGNORED, OsStr::new(""));
        assert!(!marked(&w, &f), "the watch went away");
        assert!(w.before(&d).is_none(), "and is forgotten");
    }
}
