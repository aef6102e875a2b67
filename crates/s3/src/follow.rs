//! A read-only server of a chunked disk following its writer
//! (docs/s3-backing.md, "Read-only servers of a chunked disk"): it polls
//! the head object, and for every chunk a new generation changed it
//! updates its chunk map first and then tells the cache to drop what it
//! holds of the chunk, so reads see each chunk as of the last head applied.
//! A ranged GET refused because the writer rewrote the chunk since (412)
//! takes the chunk's new ETag at once and leaves the dropping to the
//! poller: the read holds the cache's locks of part of the chunk.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Once};
use std::time::Duration;

use blockdev::{ChangeWatcher, DevError, DevResult};
use object_store::aws::AmazonS3;
use object_store::path::Path;
use object_store::{GetOptions, ObjectStore};
use parking_lot::{Condvar, Mutex};
use tracing::{info, warn};

use crate::chunked::{bare_etag, block, chunk_key, list_chunks};
use crate::format::{ChunkChange, Manifest};
use crate::head::{fetch, head_key, Fetched};
use crate::location::S3Location;
use crate::retry::with_retries;

/// How often a reader asks whether the head changed (`head_poll_ms=`).
pub(crate) const DEFAULT_POLL: Duration = Duration::from_millis(1000);

/// The head as this reader last applied it: its generation (None: it did
/// not decode, so the next one is applied by listing) and its ETag.
struct Seen {
    generation: Option<u64>,
    etag: Option<String>,
}

pub(crate) struct Follow {
    store: Arc<AmazonS3>,
    location: S3Location,
    manifest: Manifest,
    head_path: Path,
    map: Arc<Mutex<HashMap<u64, String>>>,
    watcher: Mutex<Option<Arc<dyn ChangeWatcher>>>,
    first: Once,
    seen: Mutex<Seen>,
    /// Chunks a refused read took the new ETag of, whose cached records
    /// the poller drops next.
    adopted: Mutex<Vec<u64>>,
    woken: Mutex<bool>,
    wake: Condvar,
    every: Duration,
    stop: AtomicBool,
    /// The head names another disk: the prefix was made again.
    recreated: AtomicBool,
    /// The poller died (a panic): the export must fail rather than go on
    /// serving a disk it no longer follows.
    broken: AtomicBool,
    /// Held through each round, so `stop` can wait for the one under way.
    round: Mutex<()>,
    /// The poller's thread: a `stop` from it (the last reference to the
    /// device dropped there) must not wait for its own round.
    poller: std::sync::OnceLock<std::thread::ThreadId>,
    /// Serializes deciding a chunk's ETag (see `decide`).
    deciding: Mutex<()>,
    /// Chunks taken into the map whose cached records are still being
    /// dropped (changed under `deciding`).
    dropping: std::sync::atomic::AtomicU64,
    budget: Duration,
}

/// Chunk `index` as stored with ETag `now`, or not stored (None).
fn set_chunk(map: &mut HashMap<u64, String>, index: u64, now: Option<String>) {
    match now {
        Some(etag) => map.insert(index, etag),
        None => map.remove(&index),
    };
}

fn eio(what: String) -> DevError {
    DevError::Remote(what, libc::EIO)
}

impl Follow {
    /// Reads the head as it is now; call before listing the chunks, so a
    /// generation committed in between is applied again (a no-op).
    pub(crate) fn open(
        store: Arc<AmazonS3>,
        location: &S3Location,
        manifest: Manifest,
        map: Arc<Mutex<HashMap<u64, String>>>,
        every: Duration,
        budget: Duration,
    ) -> Result<Arc<Follow>, String> {
        let head_path = head_key(location);
        let seen = match fetch(&store, &head_path, None, budget).map_err(|e| format!("{head_path}: {e}"))? {
            Fetched::Found(etag, Ok(h)) if h.disk_uuid == manifest.disk_uuid => {
                Seen { generation: Some(h.generation), etag }
            }
            Fetched::Found(etag, _) => Seen { generation: None, etag },
            Fetched::Missing | Fetched::Unchanged => Seen { generation: Some(0), etag: None },
        };
        Ok(Arc::new(Follow {
            store,
            location: location.clone(),
            manifest,
            head_path,
            map,
            watcher: Mutex::new(None),
            first: Once::new(),
            seen: Mutex::new(seen),
            adopted: Mutex::new(Vec::new()),
            woken: Mutex::new(false),
            wake: Condvar::new(),
            every,
            stop: AtomicBool::new(false),
            recreated: AtomicBool::new(false),
            broken: AtomicBool::new(false),
            round: Mutex::new(()),
            poller: std::sync::OnceLock::new(),
            deciding: Mutex::new(()),
            dropping: std::sync::atomic::AtomicU64::new(0),
            budget,
        }))
    }

    pub(crate) fn start(self: &Arc<Follow>) -> Result<(), String> {
        let me = Arc::clone(self);
        std::thread::Builder::new()
            .name("s3-follow".into())
            .spawn(move || me.run())
            .map(|_| ())
            .map_err(|e| format!("{}: starting the head poller: {e}", self.location))
    }

    pub(crate) fn set_watcher(&self, watcher: Arc<dyn ChangeWatcher>) {
        *self.watcher.lock() = Some(watcher);
        self.poke();
    }

    /// No round applies a change after this returns (the one under way is
    /// waited for), and a refused read that starts after it fails instead
    /// of taking a new ETag (one already under way still takes it, and is
    /// left on the list of chunks to drop, so the store then counts as
    /// unsettled): for a server that stops, before its caches are closed.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.poke();
        if self.poller.get() != Some(&std::thread::current().id()) {
            let _round = self.round.lock();
        }
        *self.watcher.lock() = None;
    }

    /// Whether every change taken into the map was also dropped from the
    /// cache, and the poller lives: what the cache holds is then the disk
    /// as the map says.
    fn settled(&self) -> bool {
        self.adopted.lock().is_empty()
            && self.dropping.load(Ordering::Acquire) == 0
            && self.failure().is_none()
    }

    /// `hash` of the map if the cache holds the disk as the map says
    /// ([`Follow::settled`]), checked and hashed in one step: a refused
    /// read on a prefetch thread may take a new ETag at any time.
    pub(crate) fn settled_hash(&self, hash: impl FnOnce(&HashMap<u64, String>) -> u64) -> Option<u64> {
        let _deciding = self.deciding.lock();
        self.settled().then(|| hash(&self.map.lock()))
    }

    /// Why the export must fail every read, if it must.
    pub(crate) fn failure(&self) -> Option<&'static str> {
        if self.recreated.load(Ordering::Acquire) {
            Some("the disk was made again under its prefix; restart the server to serve it")
        } else if self.broken.load(Ordering::Acquire) {
            Some("following the writer's generations failed (see the log); restart the server")
        } else {
            None
        }
    }

    fn poke(&self) {
        *self.woken.lock() = true;
        self.wake.notify_one();
    }

    fn run(&self) {
        let _ = self.poller.set(std::thread::current().id());
        loop {
            {
                let mut woken = self.woken.lock();
                if !*woken {
                    self.wake.wait_for(&mut woken, self.every);
                }
                *woken = false;
            }
            let _round = self.round.lock();
            if self.stop.load(Ordering::Acquire) || self.failure().is_some() {
                return;
            }
            if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.poll())).is_err() {
                self.broken.store(true, Ordering::Release);
                warn!("{}: following the writer failed; this export now answers EIO", self.location);
                return;
            }
        }
    }

    /// One round: drops what refused reads adopted, then applies the head
    /// if it changed. Nothing is applied until the cache watches: until
    /// then, nothing of a change could be dropped.
    fn poll(&self) {
        let Some(watcher) = self.watcher.lock().clone() else { return };
        // A poller that falls behind (`return`: the chunks refused reads
        // took stay undropped), for the test of a reader's stop then.
        fail::fail_point!("s3.follow.drop_adopted", |_| {});
        let adopted: Vec<u64> = self.adopted.lock().clone();
        for &index in &adopted {
            let (offset, len) = self.chunk_range(index);
            watcher.changed(offset, len);
        }
        // Off the list only once dropped, so `settled` never sees a chunk
        // taken but not yet dropped as done; one taken again meanwhile was
        // appended and stays.
        self.adopted.lock().drain(..adopted.len());
        let known = self.seen.lock().etag.clone();
        let fetched = match fetch(&self.store, &self.head_path, known.as_deref(), self.budget) {
            Ok(f) => f,
            Err(e) => {
                warn!("{}: asking for the head: {e}; asked again in {:?}", self.location, self.every);
                return;
            }
        };
        let (etag, head) = match fetched {
            Fetched::Unchanged | Fetched::Missing => return,
            Fetched::Found(etag, head) => (etag, head),
        };
        let from = self.seen.lock().generation;
        let changes = match &head {
            Ok(h) if h.disk_uuid != self.manifest.disk_uuid => {
                self.recreated.store(true, Ordering::Release);
                warn!(
                    "{}: the head names another disk (the prefix was made again); this export now answers EIO until the server is restarted",
                    self.location
                );
                return;
            }
            Ok(h) => match from {
                Some(r) if !h.overflow && h.generation >= r && r.saturating_add(1) >= h.oldest => {
                    let mut out = BTreeMap::new();
                    for e in h.entries.iter().filter(|e| e.generation > r) {
                        let now = match &e.change {
                            ChunkChange::Written(etag) => Some(etag.clone()),
                            ChunkChange::Deleted => None,
                        };
                        out.insert(e.chunk, now);
                    }
                    Some(out)
                }
                _ => None,
            },
            Err(why) => {
                warn!("{}: the head does not decode ({why}); listing the chunks instead", self.location);
                None
            }
        };
        let changes = match changes {
            Some(c) => c,
            None => match self.relist() {
                Ok(c) => c,
                Err(e) => {
                    warn!("{}: listing the chunks: {e}; tried again in {:?}", self.location, self.every);
                    return;
                }
            },
        };
        let (applied, complete) = self.apply(&watcher, changes);
        let generation = head.as_ref().ok().map(|h| h.generation);
        if applied > 0 {
            info!(
                "{}: generation {} applied: {applied} chunks changed",
                self.location,
                generation.map_or("?".to_string(), |g| g.to_string())
            );
        }
        if complete {
            *self.seen.lock() = Seen { generation, etag };
        }
    }

    /// Every chunk whose ETag differs from the map's, by a full listing.
    fn relist(&self) -> Result<BTreeMap<u64, Option<String>>, String> {
        let listed: HashMap<u64, String> = list_chunks(&self.store, &self.location)?
            .into_iter()
            .filter_map(|(index, meta)| meta.e_tag.map(|e| (index, e)))
            .collect();
        let map = self.map.lock();
        let mut out = BTreeMap::new();
        for (index, etag) in &listed {
            if map.get(index).map(|e| bare_etag(e)) != Some(bare_etag(etag)) {
                out.insert(*index, Some(etag.clone()));
            }
        }
        for index in map.keys().filter(|i| !listed.contains_key(i)) {
            out.insert(*index, None);
        }
        Ok(out)
    }

    /// The map first, then the cache: a fill that starts after the map
    /// changed reads the new ETag, one that started before is dropped by
    /// `changed` (it waits for the fill's locks). An absence is checked
    /// with a HEAD first: a refused read may have taken a newer ETag than
    /// the head or listing names, and an absent chunk reads as zeros with
    /// no GET that could refuse. The applied count, and whether every
    /// change could be decided (if not, the round is tried again; what it
    /// applied is then applied again as a no-op).
    fn apply(
        &self,
        watcher: &Arc<dyn ChangeWatcher>,
        changes: BTreeMap<u64, Option<String>>,
    ) -> (usize, bool) {
        // A poller dying on a change (`panic`), for the test that the
        // export then fails rather than serve a disk it no longer follows.
        fail::fail_point!("s3.follow.apply", |_| (0, false));
        let (mut applied, mut complete) = (0, true);
        let chunks = self.manifest.size.div_ceil(self.manifest.chunk_size);
        for (index, listed) in changes {
            if index >= chunks {
                warn!("{}: the head names chunk {index}, past the disk's end; ignored", self.location);
                continue;
            }
            match self.decide(watcher, index, listed) {
                Ok(false) => {}
                Ok(true) => {
                    // A round held between taking a change and dropping
                    // the chunk's records (`sleep(MS)`), for the test of a
                    // stop then.
                    fail::fail_point!("s3.follow.before_drop");
                    let (offset, len) = self.chunk_range(index);
                    watcher.changed(offset, len);
                    self.dropping.fetch_sub(1, Ordering::AcqRel);
                    applied += 1;
                }
                Err(e) => {
                    warn!("{}: {e}; asked again in {:?}", self.location, self.every);
                    complete = false;
                }
            }
        }
        (applied, complete)
    }

    /// Takes `listed` (or, for an absence, what the bucket holds now) into
    /// the map if it differs; true if it did. Under `deciding`, which a
    /// refused read's adoption takes too, so neither undoes a newer ETag
    /// the other just took.
    fn decide(
        &self,
        watcher: &Arc<dyn ChangeWatcher>,
        index: u64,
        listed: Option<String>,
    ) -> DevResult<bool> {
        loop {
            let deciding = self.deciding.lock();
            let now = match &listed {
                Some(etag) => Some(etag.clone()),
                None => self.stored_etag(index)?,
            };
            // Rare (a write that landed after the head or listing was
            // made), and what makes a reader's view differ from the head's.
            let present_though_absent = listed.is_none() && now.is_some();
            let mut map = self.map.lock();
            if map.get(&index).map(|e| bare_etag(e)) == now.as_deref().map(bare_etag) {
                drop(map);
                if present_though_absent {
                    self.say_present(index);
                }
                return Ok(false);
            }
            if !self.first.is_completed() {
                // Not under the locks: it writes the L2's headers.
                drop(map);
                drop(deciding);
                self.first.call_once(|| watcher.before_first_change());
                continue;
            }
            set_chunk(&mut map, index, now);
            self.dropping.fetch_add(1, Ordering::AcqRel);
            // Logged with the map free: every read of a chunk takes it.
            drop(map);
            if present_though_absent {
                self.say_present(index);
            }
            return Ok(true);
        }
    }

    fn say_present(&self, index: u64) {
        info!(
            "{}: chunk {index} is absent from the head or listing, but the bucket holds it (written since): taken as the bucket has it",
            self.location
        );
    }

    /// Chunk `index`'s ETag as the bucket has it now; None: not stored.
    fn stored_etag(&self, index: u64) -> DevResult<Option<String>> {
        let path = chunk_key(&self.location, index);
        let opts = GetOptions { head: true, ..Default::default() };
        match with_retries(self.budget, &path, || block(self.store.get_opts(&path, opts.clone()))) {
            Ok(got) => match got.meta.e_tag {
                Some(etag) => Ok(Some(etag)),
                None => Err(eio(format!("{path}: the server gave no ETag"))),
            },
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(eio(format!("{path}: {e}"))),
        }
    }

    fn chunk_range(&self, index: u64) -> (u64, u64) {
        let c = self.manifest.chunk_size;
        let start = index * c;
        (start, c.min(self.manifest.size.saturating_sub(start)))
    }

    /// After a ranged GET of chunk `index` was refused (412, or the chunk
    /// is gone): the chunk's ETag now (None: not stored, zeros), taken
    /// into the map; its cached records are dropped by the next poll,
    /// which this wakes.
    pub(crate) fn adopt(&self, index: u64) -> DevResult<Option<String>> {
        let Some(watcher) = self.watcher.lock().clone() else {
            return Err(eio(format!("{}: chunk {index} changed underneath", self.location)));
        };
        // Before any byte of the new contents is read.
        self.first.call_once(|| watcher.before_first_change());
        let now = {
            let _deciding = self.deciding.lock();
            let now = self.stored_etag(index)?;
            set_chunk(&mut self.map.lock(), index, now.clone());
            self.adopted.lock().push(index);
            now
        };
        self.poke();
        Ok(now)
    }
}
