//! The view's table of FUSE nodes and source objects (`docs/fileview.md`,
//! section 2). Nodes are what the kernel holds (a parent and a name, so a
//! renamed directory moves everything under it); objects are source files
//! by `(st_dev, st_ino)`, each naming the record set of the version cached.

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use crate::records::Fingerprint;
use crate::watch::Mark;

pub const ROOT: u64 = 1;

/// What the table holds, for statistics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TableSizes {
    pub nodes: u64,
    pub objects: u64,
    pub trimmed: u64,
    pub bytes: u64,
}

/// What the cache knows of one source file.
#[derive(Debug)]
pub struct ObjState {
    /// The object number its records are keyed by: the hash of `born`
    /// (and the file's dev and inode), a new one per version.
    pub id: u64,
    /// The fingerprint the number was made from: what SOURCE showed when
    /// the view took this version. Changes made through the view keep it
    /// (their records are brought up to date), changes made elsewhere
    /// replace it.
    pub born: Fingerprint,
    /// What SOURCE showed at the last check.
    pub fp: Fingerprint,
    /// When it was last compared with SOURCE (`None`: must be now).
    pub checked: Option<Instant>,
    /// Bumped by every change to its records, so a read of SOURCE that
    /// started before a change does not insert what it read.
    pub gen: u64,
    /// Chunks of the cached listing (directories), 0 if none.
    pub dir_chunks: u64,
    /// An inotify watch vouching that SOURCE has not changed it since
    /// `checked` (`watch.rs`); cleared by its events.
    pub watch: Option<Mark>,
    /// The ticket of the stat in force (`View::ticket`): an older one
    /// settling late is not put in force.
    pub settled_by: u64,
}

#[derive(Debug)]
pub struct Object {
    pub dev: u64,
    pub ino: u64,
    /// The file's birth time where SOURCE keeps one (`Attr::born`): a file
    /// that reuses the inode number is another object.
    pub born: Option<(i64, u32)>,
    pub state: Mutex<ObjState>,
    /// Told apart from a later object of the same inode in the trim's queue.
    serial: u64,
    /// Found again since the trim's hand last passed it (second chance).
    used: AtomicBool,
}

impl Object {
    /// An object outside any table, for tests.
    #[cfg(test)]
    pub fn detached(dev: u64, ino: u64, state: ObjState) -> Object {
        Object {
            dev,
            ino,
            born: None,
            state: Mutex::new(state),
            serial: u64::MAX,
            used: AtomicBool::new(false),
        }
    }

    /// Whether the file `a` describes is this object's.
    pub fn is(&self, a: &crate::records::Attr) -> bool {
        a.same_file(self.dev, self.ino, self.born)
    }

    /// Whether `a` is this object's file beyond doubt: the same inode and a
    /// birth time known on both sides and equal (a number alone may have
    /// gone to another file while nothing held the inode).
    pub fn is_known(&self, a: &crate::records::Attr) -> bool {
        self.born.is_some() && a.born == self.born && self.is(a)
    }
}

#[derive(Debug)]
struct Node {
    parent: u64,
    /// Empty once unlinked or replaced: the node then has no path.
    name: OsString,
    obj: Option<Arc<Object>>,
    /// When SOURCE last showed `obj` under this name.
    checked: Option<Instant>,
    nlookup: u64,
    /// The size the kernel was last told for the node (it reads no
    /// further): an open that finds another size gets a new node.
    shown_size: Option<u64>,
    /// The version of the file when the kernel last opened the node: its
    /// page cache of the node holds no other (`keep_cache`).
    opened: Option<Fingerprint>,
}

#[derive(Default)]
struct Inner {
    nodes: FxHashMap<u64, Node>,
    names: FxHashMap<(u64, OsString), u64>,
    objects: FxHashMap<(u64, u64), Arc<Object>>,
    next_node: u64,
    /// Objects in the order the trim's hand meets them, by key and serial
    /// (an entry whose object left the table is skipped).
    clock: VecDeque<((u64, u64), u64)>,
    next_serial: u64,
    /// Bytes of names held: in nodes and in `names`' keys.
    name_bytes: u64,
    /// Objects dropped to stay within the budget.
    trimmed: u64,
    /// Objects made and nodes forgotten since the last trim: a trim waits
    /// for a thirty-second of the table's objects, so a table whose objects
    /// are all held (the kernel holding every node) is not scanned whole at
    /// each new object.
    since_trim: u64,
    /// Steps of the trim's hand, for tests.
    #[cfg(test)]
    hand_moves: u64,
}

/// Where the table's RAM is charged and how much of it objects may hold
/// (the ARC's `dnode_size` and `arc_dnode_limit`).
pub trait Budget: Send + Sync {
    /// Bytes the object table may hold before objects nothing holds go.
    fn limit(&self) -> u64;
    /// The tables now hold `bytes`.
    fn charge(&self, bytes: u64);
}

/// No limit and no charge: for tests of the table alone.
#[cfg(test)]
pub struct Unbounded;

#[cfg(test)]
impl Budget for Unbounded {
    fn limit(&self) -> u64 {
        u64::MAX
    }
    fn charge(&self, _bytes: u64) {}
}

impl Budget for arcache_engine::Cache {
    fn limit(&self) -> u64 {
        self.dnode_limit()
    }
    fn charge(&self, bytes: u64) {
        self.set_dnode_size(bytes);
    }
}

/// RAM per node beyond its name: the node, its slot in `nodes` and in
/// `names`, with the maps' spare room (hashbrown keeps them at most 7/8
/// full, and a control byte per slot).
const NODE_BYTES: u64 =
    (std::mem::size_of::<(u64, Node)>() + std::mem::size_of::<((u64, OsString), u64)>()) as u64 * 8 / 7 + 2;

/// RAM per object: the object with its reference counts, its slot in
/// `objects`, its place in the trim's queue and an inotify mark of it
/// (`watch.rs`; the mark's name is not counted).
const OBJECT_BYTES: u64 = (std::mem::size_of::<Object>() + 16) as u64
    + (std::mem::size_of::<((u64, u64), Arc<Object>)>() as u64 * 8 / 7 + 1)
    + std::mem::size_of::<((u64, u64), u64)>() as u64
    + (std::mem::size_of::<(OsString, std::sync::Weak<Object>)>() as u64 * 8 / 7 + 1);

impl Inner {
    fn bytes(&self) -> u64 {
        self.nodes.len() as u64 * NODE_BYTES + self.name_bytes + self.object_bytes()
    }

    fn object_bytes(&self) -> u64 {
        self.objects.len() as u64 * OBJECT_BYTES
    }

    /// Drops objects nothing but the table holds (no node, handle, watch
    /// or request), skipping those found again since the hand last passed,
    /// until they fit in `limit`. A dropped object's records stay in the
    /// ARC under its number: the file found again gets an object of the
    /// same number once SOURCE is asked (as after a restart).
    fn trim(&mut self, limit: u64) {
        self.since_trim = 0;
        let mut turns = 2 * self.clock.len();
        while self.object_bytes() > limit && turns > 0 {
            turns -= 1;
            #[cfg(test)]
            {
                self.hand_moves += 1;
            }
            let Some((key, serial)) = self.clock.pop_front() else { break };
            let Some(obj) = self.objects.get(&key) else { continue };
            if obj.serial != serial {
                continue;
            }
            if Arc::strong_count(obj) > 1 || obj.used.swap(false, Relaxed) {
                self.clock.push_back((key, serial));
                continue;
            }
            self.objects.remove(&key);
            self.trimmed += 1;
        }
        // Entries of objects gone otherwise (unlinked, replaced).
        if self.clock.len() > 2 * self.objects.len() + 64 {
            let objects = &self.objects;
            self.clock.retain(|(key, serial)| objects.get(key).is_some_and(|o| o.serial == *serial));
        }
    }

    /// One object made or node forgotten: trims if over `limit` and due.
    fn maybe_trim(&mut self, limit: u64) {
        self.since_trim += 1;
        if self.object_bytes() > limit && self.since_trim >= self.objects.len() as u64 / 32 {
            // A sixteenth below the limit, so a table that can be trimmed
            // is not trimmed again for that many objects.
            self.trim(limit - limit / 16);
        }
    }

    fn found(o: &Arc<Object>) -> Arc<Object> {
        // Read first: most objects found are marked already, and a store
        // would dirty the object's cache line for every lookup.
        if !o.used.load(Relaxed) {
            o.used.store(true, Relaxed);
        }
        Arc::clone(o)
    }
}

pub struct Table {
    inner: Mutex<Inner>,
    budget: Arc<dyn Budget>,
}

impl Table {
    /// A table with no limit.
    #[cfg(test)]
    pub fn new() -> Table {
        Self::with_budget(Arc::new(Unbounded))
    }

    /// A table charged to `budget` and trimmed to its limit.
    pub fn with_budget(budget: Arc<dyn Budget>) -> Table {
        let mut inner = Inner { next_node: ROOT + 1, ..Default::default() };
        inner.nodes.insert(
            ROOT,
            Node {
                parent: ROOT,
                name: OsString::new(),
                obj: None,
                checked: None,
                nlookup: 1,
                shown_size: None,
                opened: None,
            },
        );
        let t = Table { inner: Mutex::new(inner), budget };
        t.unlock_and_charge(t.inner.lock());
        t
    }

    /// Tells the budget what the tables hold now, as the caller's change
    /// left them; after letting go of the table's lock, since the budget
    /// may take the ARC's.
    fn unlock_and_charge(&self, inner: parking_lot::MutexGuard<'_, Inner>) {
        let bytes = inner.bytes();
        drop(inner);
        self.budget.charge(bytes);
    }

    /// The path of `node` relative to SOURCE (empty for SOURCE itself);
    /// `None` if it has none now. Only ever opened beneath SOURCE without
    /// following symlinks (`sys::open_beneath`).
    pub fn path(&self, node: u64) -> Option<PathBuf> {
        let inner = self.inner.lock();
        let mut parts: Vec<&OsStr> = Vec::new();
        let mut at = node;
        while at != ROOT {
            let n = inner.nodes.get(&at)?;
            if n.name.is_empty() {
                return None;
            }
            parts.push(&n.name);
            at = n.parent;
        }
        let mut p = PathBuf::new();
        for part in parts.iter().rev() {
            p.push(part);
        }
        Some(p)
    }

    pub fn object(&self, node: u64) -> Option<Arc<Object>> {
        self.inner.lock().nodes.get(&node)?.obj.clone()
    }

    #[cfg(test)]
    pub fn exists(&self, node: u64) -> bool {
        self.inner.lock().nodes.contains_key(&node)
    }

    /// The node for `name` under `parent`, made if there is none yet, with
    /// one reference taken for the reply the caller is about to give: the
    /// kernel's `forget` of the node can then never drop it between here
    /// and the reply (it did, and the kernel was answered ENOENT for a node
    /// it had just been given). A caller that does not hand the node out
    /// gives the reference back with `forget(node, 1)`.
    pub fn child(&self, parent: u64, name: &OsStr) -> u64 {
        let mut inner = self.inner.lock();
        let key = (parent, name.to_os_string());
        if let Some(&n) = inner.names.get(&key) {
            if let Some(node) = inner.nodes.get_mut(&n) {
                node.nlookup += 1;
            }
            return n;
        }
        let id = inner.next_node;
        inner.next_node += 1;
        inner.nodes.insert(
            id,
            Node {
                parent,
                name: name.to_os_string(),
                obj: None,
                checked: None,
                nlookup: 1,
                shown_size: None,
                opened: None,
            },
        );
        inner.name_bytes += 2 * name.len() as u64;
        inner.names.insert(key, id);
        self.unlock_and_charge(inner);
        id
    }

    /// The node's parent and name, if it has a name.
    pub fn parent_and_name(&self, node: u64) -> Option<(u64, OsString)> {
        let inner = self.inner.lock();
        let n = inner.nodes.get(&node)?;
        (!n.name.is_empty()).then(|| (n.parent, n.name.clone()))
    }

    /// The kernel is told `size` for the node (a reply with attributes).
    pub fn showed(&self, node: u64, size: u64) {
        if let Some(n) = self.inner.lock().nodes.get_mut(&node) {
            n.shown_size = Some(size);
        }
    }

    /// Records that the kernel opens the node as the version `fp`; whether
    /// it opened it last as the same version (its cached pages, if any,
    /// are then this version's).
    /// `None`: the kernel's pages of the node are of no known version (an
    /// open that failed or truncated), so the next open drops them.
    pub fn opened_as(&self, node: u64, fp: Option<Fingerprint>) -> bool {
        let mut inner = self.inner.lock();
        let Some(n) = inner.nodes.get_mut(&node) else { return false };
        let before = std::mem::replace(&mut n.opened, fp);
        fp.is_some() && before == fp
    }

    pub fn shown_size(&self, node: u64) -> Option<u64> {
        self.inner.lock().nodes.get(&node)?.shown_size
    }

    /// When SOURCE last showed the node's object under its name.
    pub fn checked(&self, node: u64) -> Option<Instant> {
        self.inner.lock().nodes.get(&node)?.checked
    }

    /// The node already named `name` under `parent`.
    pub fn find(&self, parent: u64, name: &OsStr) -> Option<u64> {
        self.inner.lock().names.get(&(parent, name.to_os_string())).copied()
    }

    /// The object the table has for `(dev, ino)`, if any.
    pub fn known_object(&self, dev: u64, ino: u64) -> Option<Arc<Object>> {
        self.inner.lock().objects.get(&(dev, ino)).map(Inner::found)
    }

    /// The object of the file `a` describes, made with `fresh` if new,
    /// bound to no node (the metadata prefetch's: a lookup adopts it
    /// later). An object of `(dev, ino)` born at another time was another
    /// file's: the table's is then a new one (nodes and open handles keep
    /// the old, whose checks now find another file under their names).
    pub fn object_for(&self, a: &crate::records::Attr, fresh: impl FnOnce() -> ObjState) -> Arc<Object> {
        let mut inner = self.inner.lock();
        if let Some(o) = inner.objects.get(&(a.dev, a.ino)) {
            if o.is(a) {
                return Inner::found(o);
            }
        }
        let serial = inner.next_serial;
        inner.next_serial += 1;
        let obj = Arc::new(Object {
            dev: a.dev,
            ino: a.ino,
            born: a.born,
            state: Mutex::new(fresh()),
            serial,
            used: AtomicBool::new(false),
        });
        inner.objects.insert((a.dev, a.ino), Arc::clone(&obj));
        inner.clock.push_back(((a.dev, a.ino), serial));
        inner.maybe_trim(self.budget.limit());
        self.unlock_and_charge(inner);
        obj
    }

    /// The object of the file `a` describes, as `object_for`; bound to `node`.
    pub fn bind(&self, node: u64, a: &crate::records::Attr, fresh: impl FnOnce() -> ObjState) -> Arc<Object> {
        let obj = self.object_for(a, fresh);
        let mut inner = self.inner.lock();
        if let Some(n) = inner.nodes.get_mut(&node) {
            n.obj = Some(Arc::clone(&obj));
            n.checked = Some(Instant::now());
        }
        obj
    }

    /// Binds a node that has no object yet to the object of `(dev, ino)`
    /// if the table has one: a fresh listing of its parent says the name
    /// leads to that inode, so the kernel, having forgotten the node (its
    /// caches dropped), finds the object again without a trip to SOURCE.
    /// The node's own check is left unset: only the listing vouches.
    pub fn adopt(&self, node: u64, dev: u64, ino: u64) {
        let mut inner = self.inner.lock();
        let Some(obj) = inner.objects.get(&(dev, ino)).map(Inner::found) else { return };
        if let Some(n) = inner.nodes.get_mut(&node) {
            if n.obj.is_none() {
                n.obj = Some(obj);
            }
        }
    }

    /// The file `(dev, ino)` has no link left in SOURCE: its object is
    /// forgotten, so a new file that reuses the inode number starts with a
    /// new one (nodes and open handles keep theirs). The object, if any.
    pub fn forget_object(&self, dev: u64, ino: u64) -> Option<Arc<Object>> {
        let mut inner = self.inner.lock();
        let gone = inner.objects.remove(&(dev, ino));
        self.unlock_and_charge(inner);
        gone
    }

    /// The kernel gave back `count` references (or a caller of `child`
    /// the one it did not hand out); the node goes at zero.
    pub fn forget(&self, node: u64, count: u64) {
        let mut inner = self.inner.lock();
        let Some(n) = inner.nodes.get_mut(&node) else { return };
        n.nlookup = n.nlookup.saturating_sub(count);
        if n.nlookup == 0 && node != ROOT {
            Self::remove(&mut inner, node);
            // The objects the kernel's nodes held may go now: a table that
            // grew past its budget while the kernel held everything comes
            // back within it as the kernel lets go.
            inner.maybe_trim(self.budget.limit());
            self.unlock_and_charge(inner);
        }
    }

    fn remove(inner: &mut Inner, node: u64) {
        if let Some(n) = inner.nodes.remove(&node) {
            inner.name_bytes -= n.name.len() as u64;
            let key = (n.parent, n.name);
            if inner.names.get(&key) == Some(&node) {
                inner.name_bytes -= key.1.len() as u64;
                inner.names.remove(&key);
            }
        }
    }

    /// The node's name leads to another file now: it keeps what the kernel
    /// holds but has no path any more, and the next `child` of the name
    /// makes a new node.
    pub fn unname_node(&self, node: u64) {
        Self::take_name(&mut self.inner.lock(), node);
    }

    fn take_name(inner: &mut Inner, node: u64) {
        let Some(n) = inner.nodes.get_mut(&node) else { return };
        let key = (n.parent, std::mem::take(&mut n.name));
        inner.name_bytes -= key.1.len() as u64;
        if inner.names.get(&key) == Some(&node) {
            inner.name_bytes -= key.1.len() as u64;
            inner.names.remove(&key);
        }
    }

    /// `name` under `parent` is gone from SOURCE: its node keeps what the
    /// kernel holds but has no path any more.
    pub fn unname(&self, parent: u64, name: &OsStr) {
        let mut inner = self.inner.lock();
        if let Some(node) = inner.names.get(&(parent, name.to_os_string())).copied() {
            Self::take_name(&mut inner, node);
        }
    }

    /// SOURCE renamed `parent/name` to `newparent/newname`; with `exchange`
    /// the two swapped.
    pub fn rename(&self, parent: u64, name: &OsStr, newparent: u64, newname: &OsStr, exchange: bool) {
        let mut inner = self.inner.lock();
        let from = inner.names.remove(&(parent, name.to_os_string()));
        let to = inner.names.remove(&(newparent, newname.to_os_string()));
        if let Some(f) = from {
            inner.name_bytes -= name.len() as u64;
            Self::rename_node(&mut inner, f, newparent, newname);
        }
        if let Some(t) = to {
            inner.name_bytes -= newname.len() as u64;
            if exchange {
                Self::rename_node(&mut inner, t, parent, name);
            } else {
                Self::take_name(&mut inner, t);
            }
        }
    }

    /// Gives `node` the name `name` under `parent`, in the node and in
    /// `names`.
    fn rename_node(inner: &mut Inner, node: u64, parent: u64, name: &OsStr) {
        if let Some(n) = inner.nodes.get_mut(&node) {
            let old = std::mem::replace(&mut n.name, name.to_os_string());
            n.parent = parent;
            inner.name_bytes = inner.name_bytes - old.len() as u64 + name.len() as u64;
        }
        inner.name_bytes += name.len() as u64;
        inner.names.insert((parent, name.to_os_string()), node);
    }

    /// Nodes and objects held, and objects trimmed so far, for statistics.
    pub fn sizes(&self) -> TableSizes {
        let inner = self.inner.lock();
        TableSizes {
            nodes: inner.nodes.len() as u64,
            objects: inner.objects.len() as u64,
            trimmed: inner.trimmed,
            bytes: inner.bytes(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_renamed_directory_moves_what_is_under_it() {
        let t = Table::new();
        let d = t.child(ROOT, OsStr::new("a"));
        let f = t.child(d, OsStr::new("f"));
        assert_eq!(t.path(f), Some(PathBuf::from("a/f")));
        t.rename(ROOT, OsStr::new("a"), ROOT, OsStr::new("b"), false);
        assert_eq!(t.path(f), Some(PathBuf::from("b/f")));
        assert_eq!(t.find(ROOT, OsStr::new("b")), Some(d));
        assert_eq!(t.find(ROOT, OsStr::new("a")), None);
    }

    #[test]
    fn a_replaced_target_loses_its_path_and_an_exchange_swaps() {
        let t = Table::new();
        let x = t.child(ROOT, OsStr::new("x"));
        let y = t.child(ROOT, OsStr::new("y"));
        t.rename(ROOT, OsStr::new("x"), ROOT, OsStr::new("y"), true);
        assert_eq!(t.path(x), Some(PathBuf::from("y")));
        assert_eq!(t.path(y), Some(PathBuf::from("x")));
        t.rename(ROOT, OsStr::new("x"), ROOT, OsStr::new("y"), false);
        assert_eq!(t.path(y), Some(PathBuf::from("y")));
        assert_eq!(t.path(x), None);
    }

    fn file(dev: u64, ino: u64, born: Option<(i64, u32)>) -> crate::records::Attr {
        let mut a =
            crate::records::Attr::decode(&[0; crate::records::ATTR_LEN], dev).expect("a zeroed record");
        a.ino = ino;
        a.born = born;
        a
    }

    fn blank() -> ObjState {
        let fp = Fingerprint::default();
        ObjState { id: 7, born: fp, fp, checked: None, gen: 0, dir_chunks: 0, watch: None, settled_by: 0 }
    }

    /// An inode number freed and given to a file born later is another
    /// object; the old one stays with the nodes that hold it.
    #[test]
    fn a_reused_inode_number_born_later_is_another_object() {
        let t = Table::new();
        let x = t.child(ROOT, OsStr::new("x"));
        let old = t.bind(x, &file(1, 42, Some((100, 5))), blank);
        let same = t.object_for(&file(1, 42, Some((100, 5))), blank);
        assert!(Arc::ptr_eq(&old, &same), "the same file found again");
        let unknown = t.object_for(&file(1, 42, None), blank);
        assert!(Arc::ptr_eq(&old, &unknown), "no birth time: the inode alone decides");
        let new = t.object_for(&file(1, 42, Some((100, 6))), blank);
        assert!(!Arc::ptr_eq(&old, &new), "another file under a reused number");
        assert!(t.known_object(1, 42).is_some_and(|o| Arc::ptr_eq(&o, &new)));
        assert!(t.object(x).is_some_and(|o| Arc::ptr_eq(&o, &old)), "the node keeps its file");
        assert!(!old.is(&file(1, 42, Some((100, 6)))) && old.is(&file(1, 42, None)));
    }

    #[test]
    fn a_new_node_adopts_a_known_object_but_keeps_one_it_has() {
        let t = Table::new();
        let x = t.child(ROOT, OsStr::new("x"));
        let obj = t.bind(x, &file(1, 42, None), blank);
        t.forget(x, 1);
        assert!(!t.exists(x));
        let y = t.child(ROOT, OsStr::new("x"));
        t.adopt(y, 1, 43);
        assert!(t.object(y).is_none(), "no object of that inode");
        t.adopt(y, 1, 42);
        assert!(t.object(y).is_some_and(|o| Arc::ptr_eq(&o, &obj)));
        assert_eq!(t.checked(y), None, "only the listing vouches for the name");
        let other = t.bind(t.child(ROOT, OsStr::new("z")), &file(1, 44, None), blank);
        t.adopt(y, 1, 44);
        assert!(t.object(y).is_some_and(|o| !Arc::ptr_eq(&o, &other)), "a bound node keeps its object");
    }

    #[test]
    fn a_node_being_handed_out_outlives_a_forget_of_the_earlier_references() {
        let t = Table::new();
        let x = t.child(ROOT, OsStr::new("x"));
        // A second lookup finds the node while the kernel forgets the
        // reference the first reply gave.
        let again = t.child(ROOT, OsStr::new("x"));
        t.forget(x, 1);
        assert_eq!(again, x);
        assert!(t.exists(x), "the node was dropped before the second reply handed it out");
        assert_eq!(t.path(x), Some(PathBuf::from("x")));
    }

    /// A budget of `objects` objects that remembers what it was charged.
    struct Counted {
        objects: u64,
        charged: std::sync::atomic::AtomicU64,
    }

    impl Budget for Counted {
        fn limit(&self) -> u64 {
            self.objects * OBJECT_BYTES
        }
        fn charge(&self, bytes: u64) {
            self.charged.store(bytes, Relaxed);
        }
    }

    fn counted(objects: u64) -> (Arc<Counted>, Table) {
        let b = Arc::new(Counted { objects, charged: Default::default() });
        let t = Table::with_budget(Arc::clone(&b) as Arc<dyn Budget>);
        (b, t)
    }

    /// Past its budget the table drops objects nothing else holds, found
    /// least recently; those a node holds, or found again since the hand
    /// passed, stay. A dropped file found again is a new object.
    #[test]
    fn objects_past_the_budget_go_unless_held_or_found_again() {
        let (b, t) = counted(100);
        let held = t.bind(t.child(ROOT, OsStr::new("held")), &file(1, 1, None), blank);
        let kept = t.object_for(&file(1, 2, None), blank);
        drop(kept);
        let first = t.object_for(&file(1, 3, None), blank);
        let first_ptr = Arc::as_ptr(&first);
        drop(first);
        for ino in 4..100 {
            t.object_for(&file(1, ino, None), blank);
        }
        assert_eq!(t.sizes().trimmed, 0, "within the budget");
        // Found again: a second chance.
        assert!(t.known_object(1, 2).is_some());
        for ino in 100..110 {
            t.object_for(&file(1, ino, None), blank);
        }
        let s = t.sizes();
        assert!(s.objects <= 100, "{} objects kept of a budget of 100", s.objects);
        assert!(s.trimmed >= 10, "{} trimmed", s.trimmed);
        assert!(t.known_object(1, 1).is_some_and(|o| Arc::ptr_eq(&o, &held)), "a node's object went");
        assert!(t.known_object(1, 2).is_some(), "an object found again went before older ones");
        assert!(t.known_object(1, 3).is_none(), "the oldest object nothing held stayed");
        let again = t.object_for(&file(1, 3, None), blank);
        assert_ne!(Arc::as_ptr(&again), first_ptr);
        assert_eq!(b.charged.load(Relaxed), t.sizes().bytes, "the budget was not told the last size");
    }

    /// Objects nothing holds all held: the trim gives up rather than spin,
    /// and the table goes past its budget.
    #[test]
    fn a_budget_smaller_than_what_is_held_is_exceeded_not_looped_on() {
        let (_, t) = counted(4);
        let held: Vec<_> = (0..10).map(|i| t.object_for(&file(1, i, None), blank)).collect();
        assert_eq!(t.sizes().objects, 10);
        assert_eq!(t.sizes().trimmed, 0);
        drop(held);
        t.object_for(&file(1, 10, None), blank);
        assert!(t.sizes().objects <= 4);
    }

    /// Objects the kernel's nodes held go as the kernel forgets the nodes.
    #[test]
    fn objects_go_as_the_kernel_forgets_the_nodes_that_held_them() {
        let (_, t) = counted(4);
        let nodes: Vec<u64> = (0..10)
            .map(|i| {
                let n = t.child(ROOT, OsStr::new(&format!("f{i}")));
                t.bind(n, &file(1, i, None), blank);
                n
            })
            .collect();
        assert_eq!((t.sizes().objects, t.sizes().trimmed), (10, 0), "objects held by nodes went");
        for n in nodes {
            t.forget(n, 1);
        }
        assert!(t.sizes().objects <= 4, "{} objects after the kernel forgot", t.sizes().objects);
    }

    /// A table whose objects are all held is not scanned whole for each new
    /// object: the hand moves a bounded number of steps per object.
    #[test]
    fn a_table_of_held_objects_is_not_scanned_at_each_new_one() {
        let (_, t) = counted(10);
        let held: Vec<_> = (0..20_000).map(|i| t.object_for(&file(1, i, None), blank)).collect();
        let moves = t.inner.lock().hand_moves;
        assert!(moves < 20_000 * 100, "{moves} steps of the hand for 20,000 objects");
        assert_eq!(t.sizes().objects, 20_000);
        drop(held);
        for i in 20_000..21_000 {
            t.object_for(&file(1, i, None), blank);
        }
        assert!(t.sizes().objects <= 20, "{} objects once nothing held them", t.sizes().objects);
    }

    /// The bytes charged for names follow every change of the tables.
    #[test]
    fn name_bytes_follow_lookups_renames_and_forgets() {
        let t = Table::new();
        let recount = |t: &Table| {
            let inner = t.inner.lock();
            let in_nodes: usize = inner.nodes.values().map(|n| n.name.len()).sum();
            let in_names: usize = inner.names.keys().map(|k| k.1.len()).sum();
            assert_eq!(inner.name_bytes, (in_nodes + in_names) as u64);
        };
        let d = t.child(ROOT, OsStr::new("dir"));
        let a = t.child(d, OsStr::new("a-long-name"));
        let b = t.child(d, OsStr::new("b"));
        recount(&t);
        t.rename(d, OsStr::new("a-long-name"), ROOT, OsStr::new("moved"), false);
        recount(&t);
        t.rename(ROOT, OsStr::new("moved"), d, OsStr::new("b"), true);
        recount(&t);
        t.rename(d, OsStr::new("b"), ROOT, OsStr::new("moved"), false);
        recount(&t);
        t.rename(ROOT, OsStr::new("moved"), ROOT, OsStr::new("moved"), false);
        recount(&t);
        t.unname(d, OsStr::new("a-long-name"));
        t.unname_node(a);
        recount(&t);
        for n in [a, b, d] {
            t.forget(n, 1);
        }
        recount(&t);
        assert_eq!(t.inner.lock().name_bytes, 0);
        assert_eq!(t.sizes().bytes, NODE_BYTES, "the root alone");
    }

    #[test]
    fn nodes_go_when_the_kernel_forgets_them() {
        let t = Table::new();
        let x = t.child(ROOT, OsStr::new("x"));
        assert_eq!(t.child(ROOT, OsStr::new("x")), x);
        t.forget(x, 1);
        assert!(t.exists(x));
        t.forget(x, 1);
        assert!(!t.exists(x));
        assert_ne!(t.child(ROOT, OsStr::new("x")), x, "node ids are never reused");
    }
}
