//! An RBD image as a [`BlockDev`], through librbd's blocking calls: librbd
//! takes concurrent calls on one image from many threads (qemu's use), so
//! the engine's worker pool gives the parallelism.

use std::ffi::{CStr, CString};
use std::io;
use std::ptr;

use std::time::Duration;

use blockdev::{check_range, BlockDev, DevError, DevResult};
use libc::{c_char, c_int};
use parking_lot::{Mutex, RwLock};
use thiserror::Error;
use tracing::{info, warn};

use crate::ffi;
use crate::spec::{RbdSpec, SpecError};

/// Requests are split at this many bytes (librbd's discard answers in an
/// `int`; a bound keeps every call's length well inside it).
const MAX_REQUEST: u64 = 64 << 20;

/// Why an image could not be opened.
#[derive(Debug, Error)]
pub enum OpenError {
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error("{spec}: {what}: {}", io::Error::from_raw_os_error(*.errno))]
    Ceph { spec: String, what: String, errno: i32 },
    #[error("{spec}: {why}")]
    Refused { spec: String, why: String },
}

/// How to open an image.
#[derive(Debug, Clone, Copy, Default)]
pub struct RbdOptions {
    /// Open read-only (also implied by a snapshot).
    pub read_only: bool,
    /// How long connecting to the monitors may take (`client_mount_timeout`),
    /// unless the conf file says otherwise.
    pub connect_timeout: Option<Duration>,
}

/// A connected cluster handle, shut down on drop.
struct Cluster(ffi::RadosT);

impl Drop for Cluster {
    fn drop(&mut self) {
        // SAFETY: the handle came from rados_create2, and every ioctx and
        // image made from it is gone (they are dropped before it).
        unsafe { ffi::rados_shutdown(self.0) }
    }
}

/// A pool's IO context, destroyed on drop.
struct Ioctx(ffi::RadosIoctxT);

impl Drop for Ioctx {
    fn drop(&mut self) {
        // SAFETY: the context came from rados_ioctx_create, and the image
        // opened in it is closed first.
        unsafe { ffi::rados_ioctx_destroy(self.0) }
    }
}

/// An open image, its exclusive lock released and the image closed on drop.
struct Image {
    handle: ffi::RbdImageT,
    locked: bool,
}

impl Drop for Image {
    fn drop(&mut self) {
        // SAFETY: the handle came from rbd_open(_read_only) and is closed
        // only here; no call on it can be running (drop has it alone).
        unsafe {
            if self.locked {
                let r = ffi::rbd_lock_release(self.handle);
                if r < 0 {
                    warn!("releasing an RBD image's exclusive lock: {}", io::Error::from_raw_os_error(-r));
                }
            }
            let r = ffi::rbd_close(self.handle);
            if r < 0 {
                warn!("closing an RBD image: {}", io::Error::from_raw_os_error(-r));
            }
        }
    }
}

/// What an open image holds in librbd and librados.
struct Handles {
    // Dropped in this order: the image, then its pool, then the cluster.
    image: Image,
    _io: Ioctx,
    _cluster: Cluster,
}

/// A Ceph RBD image (or one snapshot of it, read-only).
pub struct RbdDev {
    /// `None` once [`BlockDev::release`] closed the image.
    handles: RwLock<Option<Handles>>,
    spec: RbdSpec,
    size: u64,
    object_size: u64,
    read_only: bool,
    identity: String,
    /// The image's contents epoch at open (see [`CONTENTS_EPOCH`]); empty
    /// for a snapshot, which never changes.
    epoch_at_open: String,
    /// The epoch this open set before its first change, once it has: read
    /// without the lock by every later change...
    epoch_set: std::sync::OnceLock<String>,
    /// ...and taken by the first ones, so each waits until it is set.
    epoch_bumping: Mutex<()>,
}

/// The image metadata key every arcache writer sets to a new random value
/// before its first change after opening a live image: another server's
/// persistent L2, bound to the value it found at its own open, then knows
/// at its next start that the image changed meanwhile (the exclusive lock
/// lets an image move between servers). Writes by other clients (a VM,
/// `rbd import`) do not set it and are not detected.
const CONTENTS_EPOCH: &CStr = c"arcache.contents-epoch";

// SAFETY: librbd and librados handles may be used from any thread, and
// librbd serializes what it must inside (concurrent IO on one image from
// many threads is how qemu uses it). The raw pointers never leave this
// module; IO runs under the lock's read guard, and they are closed only
// under its write guard (`release`) or when the last owner drops them.
unsafe impl Send for Handles {}
// SAFETY: as for Send: every call made through `&Handles` is a librbd
// call on an image handle that is safe to share between threads.
unsafe impl Sync for Handles {}

fn cstring(spec: &RbdSpec, what: &str, s: &str) -> Result<CString, OpenError> {
    CString::new(s)
        .map_err(|_| OpenError::Refused { spec: spec.to_string(), why: format!("a NUL byte in {what}") })
}

impl RbdDev {
    /// Parses `text` and opens the image it names.
    pub fn open_spec(text: &str, opts: RbdOptions) -> Result<RbdDev, OpenError> {
        RbdDev::open(&RbdSpec::parse(text)?, opts)
    }

    /// Connects to the cluster as `client.ID` with the conf file (or where
    /// librados looks), opens the pool and the image: read-only for a
    /// snapshot or `opts.read_only`, else writable with its exclusive lock
    /// taken and kept (another writer is refused, naming the holder).
    pub fn open(spec: &RbdSpec, opts: RbdOptions) -> Result<RbdDev, OpenError> {
        let name = spec.to_string();
        let ceph = |what: String, r: c_int| OpenError::Ceph { spec: name.clone(), what, errno: -r };
        let client = cstring(spec, "the id", &format!("client.{}", spec.id))?;
        let cluster_name = cstring(spec, "the cluster name", "ceph")?;
        let mut handle: ffi::RadosT = ptr::null_mut();
        // SAFETY: both strings are NUL-terminated and outlive the call;
        // `handle` is written only on success.
        let r = unsafe { ffi::rados_create2(&mut handle, cluster_name.as_ptr(), client.as_ptr(), 0) };
        if r < 0 {
            return Err(ceph(format!("creating a cluster handle for client.{}", spec.id), r));
        }
        let cluster = Cluster(handle);
        // A dead cluster at start must be an error rather than a hang; set
        // before the conf file is read, so the file's own value wins. No
        // OSD op timeout: a peering or recovery stall then waits, as on a
        // disk (and as qemu and krbd do), rather than failing a write that
        // the OSD may still apply later.
        let mount = opts.connect_timeout.map_or(30, |d| d.as_secs().max(1));
        let key = "client_mount_timeout";
        let (k, v) = (cstring(spec, key, key)?, cstring(spec, key, &mount.to_string())?);
        // SAFETY: a live handle, not yet connected; NUL-terminated strings.
        let r = unsafe { ffi::rados_conf_set(cluster.0, k.as_ptr(), v.as_ptr()) };
        if r < 0 {
            return Err(ceph(format!("setting {key}"), r));
        }
        let conf =
            spec.conf.as_ref().map(|p| cstring(spec, "conf=", &p.display().to_string())).transpose()?;
        let conf_name = spec
            .conf
            .as_ref()
            .map_or("the default ceph.conf (CEPH_CONF, /etc/ceph/ceph.conf)".to_string(), |p| {
                p.display().to_string()
            });
        // SAFETY: a live handle; NULL asks librados to search its defaults.
        let r = unsafe {
            ffi::rados_conf_read_file(cluster.0, conf.as_ref().map_or(ptr::null(), |c| c.as_ptr()))
        };
        if r < 0 {
            return Err(ceph(format!("reading {conf_name}"), r));
        }
        // SAFETY: a live handle; NULL reads CEPH_ARGS.
        let r = unsafe { ffi::rados_conf_parse_env(cluster.0, ptr::null()) };
        if r < 0 {
            return Err(ceph("parsing CEPH_ARGS".to_string(), r));
        }
        // SAFETY: a live, configured handle; connects once.
        let r = unsafe { ffi::rados_connect(cluster.0) };
        if r < 0 {
            return Err(ceph(format!("connecting to the cluster of {conf_name} as client.{}", spec.id), r));
        }
        let pool = cstring(spec, "the pool", &spec.pool)?;
        let mut io: ffi::RadosIoctxT = ptr::null_mut();
        // SAFETY: a connected handle; `io` is written only on success.
        let r = unsafe { ffi::rados_ioctx_create(cluster.0, pool.as_ptr(), &mut io) };
        if r == -libc::ENOENT {
            return Err(OpenError::Refused { spec: name, why: format!("pool {} does not exist", spec.pool) });
        } else if r < 0 {
            return Err(ceph(format!("opening pool {}", spec.pool), r));
        }
        let io = Ioctx(io);
        let image_name = cstring(spec, "the image", &spec.image)?;
        let snap = spec.snap.as_deref().map(|s| cstring(spec, "the snapshot", s)).transpose()?;
        let read_only = opts.read_only || spec.is_snapshot();
        let mut img: ffi::RbdImageT = ptr::null_mut();
        let snap_ptr = snap.as_ref().map_or(ptr::null(), |s| s.as_ptr());
        // SAFETY: a live ioctx; NUL-terminated names (the snapshot's may be
        // NULL, the image head); `img` is written only on success.
        let r = unsafe {
            if read_only {
                ffi::rbd_open_read_only(io.0, image_name.as_ptr(), &mut img, snap_ptr)
            } else {
                ffi::rbd_open(io.0, image_name.as_ptr(), &mut img, snap_ptr)
            }
        };
        if r == -libc::ENOENT {
            let what = match &spec.snap {
                Some(s) => {
                    format!("image {} or its snapshot {s} does not exist in pool {}", spec.image, spec.pool)
                }
                None => format!("image {} does not exist in pool {}", spec.image, spec.pool),
            };
            return Err(OpenError::Refused { spec: name, why: what });
        } else if r < 0 {
            return Err(ceph(format!("opening image {} in pool {}", spec.image, spec.pool), r));
        }
        let mut image = Image { handle: img, locked: false };
        if !read_only {
            lock(&mut image, spec)?;
        }
        // SAFETY: RbdImageInfo is plain data for which zeroes are valid.
        let mut st: ffi::RbdImageInfo = unsafe { std::mem::zeroed() };
        // SAFETY: an open image; `st` is writable and its size is passed.
        let r = unsafe { ffi::rbd_stat(image.handle, &mut st, std::mem::size_of::<ffi::RbdImageInfo>()) };
        if r < 0 {
            return Err(ceph("reading the image's size".to_string(), r));
        }
        if st.size == 0 {
            return Err(OpenError::Refused { spec: name, why: "the image is empty (size 0)".to_string() });
        }
        let identity = identity(&cluster, &image, spec).map_err(|(what, r)| ceph(what, r))?;
        let epoch_at_open = if spec.is_snapshot() {
            String::new()
        } else {
            let epoch = contents_epoch(&image)
                .map_err(|r| ceph("reading the image's contents epoch".to_string(), r))?;
            if read_only {
                unrestorable_if_written(epoch, writers_of(&io, &image, &image_name), &name)
            } else {
                epoch
            }
        };
        if read_only && !spec.is_snapshot() {
            warn!("{name}: served read-only while other clients may change it; this cache would not see their writes (serve a snapshot, {name}@SNAP, to be sure)");
        }
        info!(
            "backing {name}: {} bytes, {} KiB objects, {}",
            st.size,
            st.obj_size >> 10,
            if read_only { "read-only" } else { "exclusive lock held" }
        );
        let handles = RwLock::new(Some(Handles { image, _io: io, _cluster: cluster }));
        Ok(RbdDev {
            handles,
            spec: spec.clone(),
            size: st.size,
            object_size: st.obj_size,
            read_only,
            identity,
            epoch_at_open,
            epoch_set: std::sync::OnceLock::new(),
            epoch_bumping: Mutex::new(()),
        })
    }

    /// Sets a new contents epoch once, before this open's first change
    /// reaches the image; a change that cannot set it fails (with librbd's
    /// error) rather than leave other servers' L2 copies looking current.
    fn before_change(&self, offset: u64, len: u64) -> DevResult<()> {
        if self.epoch_set.get().is_some() {
            return Ok(());
        }
        let _first = self.epoch_bumping.lock();
        if self.epoch_set.get().is_some() {
            return Ok(());
        }
        let op = "set the contents epoch";
        let epoch = format!("{:032x}", rand::random::<u128>());
        let value = CString::new(epoch.as_str())
            .map_err(|_| self.io_error(op, offset, len, -i64::from(libc::EINVAL)))?;
        self.with_image(op, offset, len, |image| {
            // SAFETY: an open, writable image (the read guard keeps it
            // open); NUL-terminated key and value.
            let r = unsafe { ffi::rbd_metadata_set(image, CONTENTS_EPOCH.as_ptr(), value.as_ptr()) };
            if r < 0 {
                return Err(self.io_error(op, offset, len, i64::from(r)));
            }
            Ok(())
        })?;
        let _ = self.epoch_set.set(epoch);
        Ok(())
    }

    /// The image's object size (librbd stripes it over objects this large).
    pub fn object_size(&self) -> u64 {
        self.object_size
    }

    fn io_error(&self, op: &'static str, offset: u64, len: u64, r: i64) -> DevError {
        let errno = i32::try_from(-r).unwrap_or(libc::EIO);
        DevError::Io {
            op,
            dev: self.spec.to_string(),
            offset,
            len,
            source: io::Error::from_raw_os_error(errno),
        }
    }

    fn writable(&self, offset: u64, len: u64) -> DevResult<()> {
        check_range(self.size, offset, len)?;
        if self.read_only {
            return Err(DevError::ReadOnly);
        }
        Ok(())
    }

    /// Runs `f` on the open image, or fails with EIO once
    /// [`BlockDev::release`] closed it.
    fn with_image<T>(
        &self,
        op: &'static str,
        offset: u64,
        len: u64,
        f: impl FnOnce(ffi::RbdImageT) -> DevResult<T>,
    ) -> DevResult<T> {
        let h = self.handles.read();
        match h.as_ref() {
            Some(h) => f(h.image.handle),
            None => Err(self.io_error(op, offset, len, -(libc::ESHUTDOWN as i64))),
        }
    }

    /// Runs `call(image, offset, len)` over `[offset, offset+len)` in pieces of at
    /// most [`MAX_REQUEST`] bytes; a negative answer is the error.
    fn in_pieces(
        &self,
        op: &'static str,
        offset: u64,
        len: u64,
        call: impl Fn(ffi::RbdImageT, u64, u64) -> i64,
    ) -> DevResult<()> {
        self.with_image(op, offset, len, |image| {
            let mut done = 0;
            while done < len {
                let n = (len - done).min(MAX_REQUEST);
                let r = call(image, offset + done, n);
                if r < 0 {
                    return Err(self.io_error(op, offset + done, n, r));
                }
                done += n;
            }
            Ok(())
        })
    }
}

/// Takes the image's exclusive lock for good: librbd would otherwise hand
/// it to any other client asking, and two caches writing one image would
/// each serve the other's stale data.
fn lock(image: &mut Image, spec: &RbdSpec) -> Result<(), OpenError> {
    // Asked first: rbd_lock_acquire requests the lock from its holder, and
    // a client with automatic exclusive locking (qemu, krbd) hands it over,
    // so a running VM would lose its writes to us instead of us being
    // refused.
    let held_by = lock_owners(image);
    if !held_by.is_empty() {
        return Err(held(spec, &held_by));
    }
    // SAFETY: an open, writable image.
    let r = unsafe { ffi::rbd_lock_acquire(image.handle, ffi::RBD_LOCK_MODE_EXCLUSIVE) };
    if r == 0 {
        image.locked = true;
        return Ok(());
    }
    let name = spec.to_string();
    if r == -libc::EINVAL {
        return Err(OpenError::Refused {
            spec: name,
            why: format!(
                "the image has no exclusive-lock feature, which a writer needs \
                 (rbd feature enable {}/{} exclusive-lock), or serve it --read-only",
                spec.pool, spec.image
            ),
        });
    }
    let owners = lock_owners(image);
    if r == -libc::EROFS || r == -libc::EBUSY || !owners.is_empty() {
        return Err(held(spec, &owners));
    }
    Err(OpenError::Ceph { spec: name, what: "taking the image's exclusive lock".to_string(), errno: -r })
}

fn held(spec: &RbdSpec, owners: &[String]) -> OpenError {
    OpenError::Refused {
        spec: spec.to_string(),
        why: format!(
            "the image's exclusive lock is held by {} (another writer; a crashed one's lock is freed by \
             `rbd lock rm {}/{} ID LOCKER` as `rbd lock ls` shows it, or once its watch times out)",
            if owners.is_empty() { "another client".to_string() } else { owners.join(", ") },
            spec.pool,
            spec.image
        ),
    }
}

/// The clients holding the image's lock, as librbd names them; none where
/// librbd cannot tell.
fn lock_owners(image: &Image) -> Vec<String> {
    asked_lock_owners(image).unwrap_or_default()
}

/// The clients holding the image's lock, or librbd's error (EINVAL on a
/// read-only handle); no owner at all reads as none.
fn asked_lock_owners(image: &Image) -> Result<Vec<String>, c_int> {
    let mut slots: [*mut c_char; 8] = [ptr::null_mut(); 8];
    let mut count: libc::size_t = slots.len();
    let mut mode: c_int = 0;
    // SAFETY: an open image; `slots` has room for `count` pointers, which
    // librbd fills and lowers `count` to the number written.
    let r = unsafe { ffi::rbd_lock_get_owners(image.handle, &mut mode, slots.as_mut_ptr(), &mut count) };
    if r == -libc::ENOENT {
        return Ok(Vec::new());
    }
    if r < 0 {
        return Err(r);
    }
    let count = count.min(slots.len());
    let owners = slots[..count]
        .iter()
        .filter(|p| !p.is_null())
        // SAFETY: each pointer librbd wrote is a NUL-terminated string it
        // owns until the cleanup call below.
        .map(|&p| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
        .collect();
    // SAFETY: frees exactly the `count` strings the call above made.
    unsafe { ffi::rbd_lock_get_owners_cleanup(slots.as_mut_ptr(), count) };
    Ok(owners)
}

/// Who holds a live image's lock, asked through a writable handle of its
/// own (which takes no lock and writes nothing), since librbd will not say
/// through a read-only one (`image`); librbd's error where that cannot be
/// opened (a client with read-only capabilities). An image without the
/// exclusive-lock feature has no lock and no arcache writer (one refuses
/// to write it): none.
fn writers_of(io: &Ioctx, image: &Image, image_name: &CStr) -> Result<Vec<String>, c_int> {
    let mut features = 0u64;
    // SAFETY: an open image; `features` is writable.
    let r = unsafe { ffi::rbd_get_features(image.handle, &mut features) };
    if r < 0 {
        return Err(r);
    }
    if features & ffi::RBD_FEATURE_EXCLUSIVE_LOCK == 0 {
        return Ok(Vec::new());
    }
    let mut img: ffi::RbdImageT = ptr::null_mut();
    // SAFETY: a live ioctx; a NUL-terminated name; NULL for the image head;
    // `img` is written only on success.
    let r = unsafe { ffi::rbd_open(io.0, image_name.as_ptr(), &mut img, ptr::null()) };
    if r < 0 {
        return Err(r);
    }
    // Closed when dropped; it holds no lock.
    let probe = Image { handle: img, locked: false };
    asked_lock_owners(&probe)
}

/// The value of [`CONTENTS_EPOCH`], empty where no arcache writer set one.
fn contents_epoch(image: &Image) -> Result<String, c_int> {
    let mut len: libc::size_t = 64;
    // Twice at most: a value set by hand may be longer than ours, and
    // ERANGE then says how long.
    for _ in 0..2 {
        let mut buf = vec![0 as c_char; len + 1];
        // SAFETY: an open image; a NUL-terminated key; `buf` is writable
        // for `len` bytes (one more stays NUL), and librbd updates `len`.
        let r = unsafe {
            ffi::rbd_metadata_get(image.handle, CONTENTS_EPOCH.as_ptr(), buf.as_mut_ptr(), &mut len)
        };
        match r {
            r if r == -libc::ENOENT => return Ok(String::new()),
            r if r == -libc::ERANGE => continue,
            r if r < 0 => return Err(r),
            // SAFETY: zeroed and longer than what librbd wrote, so it
            // holds a NUL-terminated string.
            _ => return Ok(unsafe { cstr(&buf) }),
        }
    }
    Err(-libc::ERANGE)
}

/// A read-only open's epoch, or one no later start can match when a writer
/// holds the image's lock now (or that cannot be known): that writer set
/// its epoch before this open read it, and what it writes while this server
/// fills its L2 renews nothing, so those records could not be told stale
/// later.
fn unrestorable_if_written(epoch: String, writers: Result<Vec<String>, c_int>, name: &str) -> String {
    let who = match writers {
        Ok(w) if w.is_empty() => return epoch,
        Ok(w) => format!("written by {} now", w.join(", ")),
        Err(r) => format!("cannot tell whether a writer holds it ({})", io::Error::from_raw_os_error(-r)),
    };
    warn!("{name}: {who}; this server's L2 records of it will not be restored after a restart");
    format!("{epoch}+unrestorable-{:032x}", rand::random::<u128>())
}

/// `rbd:<cluster fsid>/<pool>/<image id>[@<snap id>]`: a recreated image of
/// the same name, or a snapshot of it, is another store.
fn identity(cluster: &Cluster, image: &Image, spec: &RbdSpec) -> Result<String, (String, c_int)> {
    let mut fsid = [0 as c_char; 64];
    // SAFETY: a connected handle; the buffer's length is passed.
    let r = unsafe { ffi::rados_cluster_fsid(cluster.0, fsid.as_mut_ptr(), fsid.len()) };
    if r < 0 {
        return Err(("reading the cluster's fsid".to_string(), r));
    }
    let mut id = [0 as c_char; 128];
    // SAFETY: an open image; the buffer's length is passed.
    let r = unsafe { ffi::rbd_get_id(image.handle, id.as_mut_ptr(), id.len()) };
    if r < 0 {
        return Err(("reading the image's id".to_string(), r));
    }
    // SAFETY: both buffers were zeroed and are longer than what was written,
    // so each holds a NUL-terminated string.
    let (fsid, id) = unsafe { (cstr(&fsid), cstr(&id)) };
    let mut out = format!("rbd:{fsid}/{}/{id}", spec.pool);
    if let Some(snap) = &spec.snap {
        let name =
            CString::new(snap.as_str()).map_err(|_| ("the snapshot's name".to_string(), -libc::EINVAL))?;
        let mut snap_id = 0u64;
        // SAFETY: an open image; a NUL-terminated name; a writable u64.
        let r = unsafe { ffi::rbd_snap_get_id(image.handle, name.as_ptr(), &mut snap_id) };
        if r < 0 {
            return Err((format!("reading the id of snapshot {snap}"), r));
        }
        out.push_str(&format!("@{snap_id}"));
    }
    Ok(out)
}

/// # Safety
/// `buf` must hold a NUL byte.
unsafe fn cstr(buf: &[c_char]) -> String {
    // SAFETY: the caller promises a NUL inside `buf`.
    unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned()
}

impl BlockDev for RbdDev {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> DevResult<()> {
        check_range(self.size, offset, buf.len() as u64)?;
        self.with_image("read", offset, buf.len() as u64, |image| {
            for (i, piece) in buf.chunks_mut(MAX_REQUEST as usize).enumerate() {
                let at = offset + (i as u64) * MAX_REQUEST;
                // SAFETY: an open image (the read guard keeps it open);
                // `piece` is writable for its length.
                let r = unsafe { ffi::rbd_read2(image, at, piece.len(), piece.as_mut_ptr().cast(), 0) };
                // Within the image librbd reads all or fails; a short read
                // would mean the image shrank underneath.
                let r = if r >= 0 && r as usize != piece.len() { -(libc::EIO as isize) } else { r };
                if r < 0 {
                    return Err(self.io_error("read", at, piece.len() as u64, r as i64));
                }
            }
            Ok(())
        })
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> DevResult<()> {
        self.writable(offset, buf.len() as u64)?;
        self.before_change(offset, buf.len() as u64)?;
        self.with_image("write", offset, buf.len() as u64, |image| {
            for (i, piece) in buf.chunks(MAX_REQUEST as usize).enumerate() {
                let at = offset + (i as u64) * MAX_REQUEST;
                // SAFETY: an open image (the read guard keeps it open);
                // `piece` is readable for its length.
                let r = unsafe { ffi::rbd_write2(image, at, piece.len(), piece.as_ptr().cast(), 0) };
                let r = if r >= 0 && r as usize != piece.len() { -(libc::EIO as isize) } else { r };
                if r < 0 {
                    return Err(self.io_error("write", at, piece.len() as u64, r as i64));
                }
            }
            Ok(())
        })
    }

    fn flush(&self) -> DevResult<()> {
        if self.read_only {
            return Ok(());
        }
        self.with_image("flush", 0, 0, |image| {
            // SAFETY: an open image (the read guard keeps it open).
            let r = unsafe { ffi::rbd_flush(image) };
            if r < 0 {
                return Err(self.io_error("flush", 0, 0, r as i64));
            }
            Ok(())
        })
    }

    /// `rbd_discard`: whole objects are removed; librbd may leave the
    /// partial ones as they were (the range's contents become unspecified).
    fn trim(&self, offset: u64, len: u64) -> DevResult<()> {
        self.writable(offset, len)?;
        self.before_change(offset, len)?;
        self.in_pieces("trim", offset, len, |image, at, n| {
            // SAFETY: an open, writable image (the read guard keeps it
            // open); the range lies within it.
            i64::from(unsafe { ffi::rbd_discard(image, at, n) })
        })
    }

    /// `rbd_write_zeroes`: whole objects are removed, the rest zeroed in
    /// place; no zeroes cross the network.
    fn write_zeroes(&self, offset: u64, len: u64) -> DevResult<()> {
        self.zero_fast(offset, len, false)
    }

    fn zeroes_fast(&self) -> bool {
        !self.read_only
    }

    fn zero_fast(&self, offset: u64, len: u64, keep_allocated: bool) -> DevResult<()> {
        self.writable(offset, len)?;
        self.before_change(offset, len)?;
        // RBD_WRITE_ZEROES_FLAG_THICK_PROVISION: zeroes written, not holes.
        let flags: c_int = if keep_allocated { 1 } else { 0 };
        self.in_pieces("write_zeroes", offset, len, |image, at, n| {
            // SAFETY: an open, writable image (the read guard keeps it
            // open); the range lies within it.
            unsafe { ffi::rbd_write_zeroes(image, at, n as usize, flags, 0) as i64 }
        })
    }

    fn describe(&self) -> String {
        self.spec.to_string()
    }

    fn identity(&self) -> String {
        self.identity.clone()
    }

    /// With the contents epoch (see [`CONTENTS_EPOCH`]): the one found at
    /// open, or the one this open set before its first change (the lock
    /// lets no other arcache writer change the image meanwhile). The intent
    /// log keeps `identity`: this server's own changes set a new epoch, and
    /// its log must still be replayed on the image.
    fn contents_identity(&self) -> String {
        if self.spec.is_snapshot() {
            return self.identity.clone();
        }
        let epoch = self.epoch_set.get().unwrap_or(&self.epoch_at_open);
        format!("{}#epoch={epoch}", self.identity)
    }

    fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// One image handle serves every connection, and `rbd_flush` covers
    /// every write made through it.
    fn flush_covers_all_handles(&self) -> bool {
        true
    }

    /// Closes the image: its exclusive lock is released (the next writer
    /// takes it at once rather than when the cluster notices this one is
    /// gone, about 30 s on), the image closed, the cluster connection shut
    /// down. Only this image: another server in the same process keeps
    /// its own open.
    fn release(&self) -> DevResult<()> {
        self.handles.write().take();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read-only open keeps the epoch it read only when it knows that
    /// nobody holds the lock; a holder, or an answer it cannot get (a
    /// client whose capabilities forbid the writable probe gets EPERM),
    /// binds its records to a value no two starts share.
    #[test]
    fn a_reader_keeps_the_epoch_only_when_it_knows_nobody_writes() {
        assert_eq!(unrestorable_if_written("e1".into(), Ok(Vec::new()), "rbd/img"), "e1");
        let cases: [Result<Vec<String>, c_int>; 3] =
            [Ok(vec!["client.4100".into()]), Err(-libc::EPERM), Err(-libc::EINVAL)];
        for writers in cases {
            let first = unrestorable_if_written("e1".into(), writers.clone(), "rbd/img");
            let second = unrestorable_if_written("e1".into(), writers.clone(), "rbd/img");
            assert!(first.starts_with("e1+unrestorable-"), "{writers:?}: {first}");
            assert_ne!(first, second, "{writers:?}: two starts bound to the same value");
        }
    }
}
