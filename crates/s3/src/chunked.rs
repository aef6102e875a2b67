//! A writable disk stored as fixed-size chunk objects under a prefix
//! (docs/s3-backing.md, section 5): a manifest made on first start, one
//! writer at a time by a lease taken with a create-only PUT, chunks that
//! were never written (or were trimmed whole) stored as nothing at all.
//!
//! Every chunk PUT is conditional on the ETag this writer last saw for it
//! (or on its absence), so a writer whose lease was broken cannot
//! overwrite what another wrote; a refused PUT fences the device.
//!
//! A PUT whose answer was lost (a reset after the server acted on it) may
//! have landed: each chunk PUT carries a write id of this device in its
//! metadata (`x-amz-meta-arcache-write`), and a 412 on a chunk with a PUT
//! of ours of unknown outcome is checked with a HEAD: if the chunk holds
//! our write, its ETag is taken and nothing is fenced (docs/s3-backing.md,
//! section 7). So such PUTs are safe to send again, and are.

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use blockdev::{Alloc, BlockDev, DevError, DevResult};
use bytes::Bytes;
use futures::StreamExt;
use object_store::aws::AmazonS3;
use object_store::path::Path;
use object_store::{
    Attribute, Attributes, GetOptions, GetRange, ObjectMeta, ObjectStore, ObjectStoreExt, PutMode, PutOptions,
};
use parking_lot::Mutex;
use tracing::{info, warn};

use crate::credentials::Credentials;
use crate::follow::{Follow, DEFAULT_POLL};
use crate::format::{ChunkChange, Lease, Manifest};
use crate::head::{HeadWriter, PublishError};
use crate::lease::LeaseKeeper;
use crate::location::S3Location;
use crate::object::{client, retry_budget};
use crate::retry::{explain, with_retries};
use crate::runtime::runtime;

pub const DEFAULT_CHUNK: u64 = 4 << 20;

/// The chunk sizes `chunk=` may ask for (docs/s3-backing.md, section 5;
/// the manifest's decoder takes the same).
const CHUNK_RANGE: std::ops::RangeInclusive<u64> = (64 << 10)..=(64 << 20);
const LOCK_STRIPES: usize = 64;

/// Bytes for a range within one chunk.
type ChunkPart<'a> = (Range<u64>, &'a [u8]);
/// The user metadata key of a chunk's write id (`x-amz-meta-arcache-write`).
const WRITE_ID: &str = "arcache-write";

pub struct S3ChunkDev {
    store: Arc<AmazonS3>,
    location: S3Location,
    manifest: Manifest,
    /// Chunk index to the ETag of its object; absent chunks read as zeros.
    map: Arc<Mutex<HashMap<u64, String>>>,
    /// A writer's generations, published in the head at each flush.
    head: Option<HeadWriter>,
    /// A reader's following of the writer's generations (none with
    /// `head_poll_ms=0`: the disk as of its start).
    follow: Option<Arc<Follow>>,
    /// Read-modify-writes of one chunk go one at a time.
    stripes: Vec<Mutex<()>>,
    fenced: Arc<AtomicBool>,
    writable: bool,
    /// Ours until [`BlockDev::release`] gives it back (a drop leaves it held).
    lease: Mutex<Option<LeaseKeeper>>,
    /// Random at open; with `write_seq`, makes each PUT's write id.
    writer_id: u128,
    write_seq: AtomicU64,
    /// Per chunk, the write ids of our PUTs in flight or whose answer was
    /// lost: a 412 on that chunk may be our own write having landed.
    unsure: Mutex<HashMap<u64, Vec<String>>>,
    /// How long one request is retried (`retry_timeout=SECS`).
    budget: Duration,
}

pub(crate) fn block<T>(
    fut: impl std::future::Future<Output = object_store::Result<T>>,
) -> object_store::Result<T> {
    match runtime() {
        Ok(rt) => rt.block_on(fut),
        Err(e) => Err(object_store::Error::Generic { store: "S3", source: Box::new(e) }),
    }
}

pub(crate) fn key(location: &S3Location, name: &str) -> Path {
    Path::from(format!("{}{name}", location.key))
}

pub(crate) fn chunk_key(location: &S3Location, index: u64) -> Path {
    key(location, &format!("c/{index:016x}"))
}

/// The chunks stored and their ETags, in one hash: two disks (or one disk
/// at two times) with the same hash hold the same bytes.
fn contents_hash(map: &HashMap<u64, String>) -> u64 {
    let mut chunks: Vec<(&u64, &String)> = map.iter().collect();
    chunks.sort_unstable();
    // Streamed, the same hash as of the whole text at once: a disk of a
    // million chunks is not written out as 50 MB first.
    let mut hash = xxhash_rust::xxh3::Xxh3::new();
    for (index, etag) in chunks {
        hash.update(format!("{index:x}:{}\n", bare_etag(etag)).as_bytes());
    }
    hash.digest()
}

/// An ETag without the quotes or the weak marker a server may put around
/// it in one answer (a PUT's) and not in another (a LIST's): a writer's
/// hash at its stop and the next start's must agree.
pub(crate) fn bare_etag(etag: &str) -> &str {
    etag.trim_start_matches("W/").trim_matches('"')
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

fn eio(what: String) -> DevError {
    DevError::Remote(what, libc::EIO)
}

/// The manifest: made create-only on first start, read on later ones;
/// true with it when this call made it. `asked_chunk` is `chunk=`: the
/// chunk size of a new disk (else [`DEFAULT_CHUNK`]), and for an existing
/// one, what it must have.
pub(crate) fn manifest(
    store: &AmazonS3,
    location: &S3Location,
    size: Option<u64>,
    asked_chunk: Option<u64>,
    source: &str,
) -> Result<(Manifest, bool), String> {
    let chunk = asked_chunk.unwrap_or(DEFAULT_CHUNK);
    let path = key(location, "arcache-manifest");
    let existing = match block(store.get(&path)) {
        Ok(r) => Some(block(r.bytes()).map_err(|e| format!("{location}: reading the manifest: {e}"))?),
        Err(e @ object_store::Error::NotFound { .. })
            if crate::retry::s3_code(&e).as_deref() == Some("NoSuchBucket") =>
        {
            return Err(format!("{location}: {}", explain(&e, &location.bucket, source)));
        }
        Err(object_store::Error::NotFound { .. }) => None,
        Err(e) => {
            return Err(format!(
                "{location}: reading the manifest: {}",
                explain(&e, &location.bucket, source)
            ))
        }
    };
    let (m, made) = match existing {
        Some(b) => (Manifest::decode(&b).map_err(|e| format!("{location}arcache-manifest: {e}"))?, false),
        None => {
            let size = size
                .ok_or_else(|| format!("{location} has no disk yet; give its size: {location}?size=SIZE"))?;
            let m = Manifest { disk_uuid: rand::random(), size, chunk_size: chunk, created: now_ms() / 1000 };
            let opts = PutOptions { mode: PutMode::Create, ..Default::default() };
            match block(store.put_opts(&path, m.encode().into(), opts)) {
                Ok(_) => {
                    info!("{location}: made a disk of {size} bytes in chunks of {chunk}");
                    (m, true)
                }
                // Another server made it first, or our retried PUT did.
                Err(object_store::Error::AlreadyExists { .. })
                | Err(object_store::Error::Precondition { .. }) => {
                    return manifest(store, location, Some(size), asked_chunk, source);
                }
                Err(e) => {
                    return Err(format!(
                        "{location}: writing the manifest: {}",
                        explain(&e, &location.bucket, source)
                    ))
                }
            }
        }
    };
    if let Some(s) = size.filter(|&s| s != m.size) {
        return Err(format!("{location} is {} bytes, not {s} as size= says", m.size));
    }
    if let Some(c) = asked_chunk.filter(|&c| c != m.chunk_size) {
        return Err(format!("{location} is in chunks of {} bytes, not {c} as chunk= says", m.chunk_size));
    }
    Ok((m, made))
}

/// The chunk objects under `location`'s prefix, with their indexes;
/// objects there that are not named as chunks are skipped, and said so.
pub(crate) fn list_chunks(store: &AmazonS3, location: &S3Location) -> Result<Vec<(u64, ObjectMeta)>, String> {
    let prefix = key(location, "c/");
    let listed: Vec<_> = block(async { Ok(store.list(Some(&prefix)).collect::<Vec<_>>().await) })
        .map_err(|e| format!("{location}: listing chunks: {e}"))?;
    let mut chunks = Vec::with_capacity(listed.len());
    for meta in listed {
        let meta = meta.map_err(|e| format!("{location}: listing chunks: {e}"))?;
        match u64::from_str_radix(meta.location.filename().unwrap_or_default(), 16) {
            Ok(index) => chunks.push((index, meta)),
            Err(_) => warn!("{location}: ignoring {} (not a chunk of this disk)", meta.location),
        }
    }
    Ok(chunks)
}

/// A disk's size and chunk size as `size=` and `chunk=` may give them.
pub(crate) fn check_geometry(
    location: &S3Location,
    size: Option<u64>,
    chunk: Option<u64>,
) -> Result<(), String> {
    if size.is_some_and(|s| s == 0 || s % 512 != 0) {
        return Err(format!("{location}: size must be a non-zero multiple of 512"));
    }
    if let Some(c) = chunk.filter(|&c| !CHUNK_RANGE.contains(&c) || !c.is_power_of_two()) {
        return Err(format!("{location}: chunk={c} is not a power of two from 64K to 64M"));
    }
    Ok(())
}

impl S3ChunkDev {
    /// Opens (or, with `size`, makes) the disk under `location`'s prefix;
    /// `writable` takes its lease first.
    pub fn open(
        location: &S3Location,
        creds: &Credentials,
        size: Option<u64>,
        chunk: Option<u64>,
        writable: bool,
    ) -> Result<S3ChunkDev, String> {
        check_geometry(location, size, chunk)?;
        let store = Arc::new(client(location, creds)?);
        let (manifest, _) = manifest(&store, location, size, chunk, &creds.source)?;
        let fenced = Arc::new(AtomicBool::new(false));
        let lease = if writable {
            Some(LeaseKeeper::acquire(Arc::clone(&store), location, manifest.disk_uuid, Arc::clone(&fenced))?)
        } else {
            None
        };
        let budget = retry_budget(location);
        let head = match &lease {
            Some(_) => match HeadWriter::load(&store, location, manifest.disk_uuid, budget) {
                Ok(h) => Some(h),
                Err(e) => {
                    if let Some(l) = lease {
                        l.release();
                    }
                    return Err(e);
                }
            },
            None => None,
        };
        let lease = Mutex::new(lease);
        let map = Arc::new(Mutex::new(HashMap::new()));
        let poll = location.head_poll.unwrap_or(DEFAULT_POLL);
        // The head before the listing: a generation committed in between
        // is then applied once more, which changes nothing.
        let follow = match writable || poll.is_zero() {
            true => None,
            false => {
                Some(Follow::open(Arc::clone(&store), location, manifest, Arc::clone(&map), poll, budget)?)
            }
        };
        let mut listed = HashMap::new();
        for (index, meta) in list_chunks(&store, location)? {
            let Some(etag) = meta.e_tag else {
                warn!("{location}: ignoring {} (the server gave no ETag)", meta.location);
                continue;
            };
            listed.insert(index, etag);
        }
        info!("{location}: {} bytes, {} chunks stored", manifest.size, listed.len());
        *map.lock() = listed;
        if let Some(f) = &follow {
            f.start()?;
        }
        let dev = S3ChunkDev {
            store,
            location: location.clone(),
            manifest,
            map,
            head,
            follow,
            stripes: (0..LOCK_STRIPES).map(|_| Mutex::new(())).collect(),
            fenced,
            writable,
            lease,
            writer_id: rand::random(),
            write_seq: AtomicU64::new(0),
            unsure: Mutex::new(HashMap::new()),
            budget,
        };
        // A writer's first head makes readers list the chunks (a writer
        // before may have stopped between its PUTs and its head).
        if writable {
            if let Err(e) = dev.publish_head() {
                // Nothing was written under the lease yet.
                let _ = BlockDev::release(&dev);
                return Err(format!("{location}: {e}"));
            }
        }
        Ok(dev)
    }

    fn chunk_len(&self, index: u64) -> u64 {
        let c = self.manifest.chunk_size;
        c.min(self.manifest.size - index * c)
    }

    /// Chunks touched by `[offset, offset+len)`: index and the range inside it.
    fn pieces(&self, offset: u64, len: u64) -> impl Iterator<Item = (u64, Range<u64>)> + '_ {
        let c = self.manifest.chunk_size;
        let end = offset + len;
        (offset / c..end.div_ceil(c)).map(move |i| {
            let start = offset.max(i * c) - i * c;
            let stop = end.min(i * c + self.chunk_len(i)) - i * c;
            (i, start..stop)
        })
    }

    fn check_range(&self, offset: u64, len: u64) -> DevResult<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.manifest.size => Ok(()),
            _ => Err(DevError::OutOfRange { offset, len, size: self.manifest.size }),
        }
    }

    fn check_writable(&self) -> DevResult<()> {
        if !self.writable {
            return Err(DevError::ReadOnly);
        }
        if self.fenced.load(Ordering::Acquire) {
            return Err(eio(format!("{}: the lease was lost; no write reaches the bucket", self.location)));
        }
        match &*self.lease.lock() {
            None => Err(eio(format!("{}: the lease was lost; no write reaches the bucket", self.location))),
            Some(l) => match l.unrenewed_for() {
                Some(since) => Err(eio(format!(
                    "{}: the lease was not renewed for {} s; writes wait until it is",
                    self.location,
                    since.as_secs()
                ))),
                None => Ok(()),
            },
        }
    }

    fn fence(&self, why: String) -> DevError {
        if !self.fenced.swap(true, Ordering::AcqRel) {
            warn!("{}: {why}; fenced: no more writes go to the bucket", self.location);
        }
        eio(format!("{}: {why}", self.location))
    }

    fn get_chunk(&self, index: u64, range: Range<u64>, etag: &str) -> DevResult<Vec<u8>> {
        let mut out = vec![0u8; (range.end - range.start) as usize];
        self.get_chunk_into(index, range, etag, &mut out)?;
        Ok(out)
    }

    /// Bytes `range` of chunk `index` (as of `etag`) into `out`, which is
    /// as long as the range.
    fn get_chunk_into(&self, index: u64, range: Range<u64>, etag: &str, out: &mut [u8]) -> DevResult<()> {
        let path = chunk_key(&self.location, index);
        let mut etag = etag.to_string();
        // Once more after taking the ETag of a write of ours found landed.
        for _ in 0..3 {
            let opts = GetOptions {
                if_match: Some(etag.clone()),
                range: Some(GetRange::Bounded(range.clone())),
                ..Default::default()
            };
            let got = with_retries(self.budget, &path, || {
                crate::body::get_into(&self.store, &path, opts.clone(), out)
            });
            match got {
                Ok(n) if n == out.len() => return Ok(()),
                Ok(n) => return Err(eio(format!("{path}: asked {} bytes, got {n}", out.len()))),
                Err(object_store::Error::Precondition { .. }) | Err(object_store::Error::NotFound { .. })
                    if self.follow.is_some() =>
                {
                    // The writer changed the chunk since this reader last
                    // applied its head.
                    match self.follow.as_ref().map(|f| f.adopt(index)).transpose()?.flatten() {
                        Some(now) => etag = now,
                        None => {
                            out.fill(0);
                            return Ok(());
                        }
                    }
                }
                Err(object_store::Error::Precondition { .. }) => match self.landed(index)? {
                    Some((_, now)) if now != etag => etag = now,
                    _ => return Err(self.fence(format!("chunk {index} changed underneath"))),
                },
                Err(object_store::Error::NotFound { .. }) => {
                    return Err(self.fence(format!("chunk {index} changed underneath")))
                }
                Err(e) => return Err(eio(format!("{path}: {e}"))),
            }
        }
        Err(self.fence(format!("chunk {index} keeps changing underneath")))
    }

    /// A change for the next generation's head.
    fn note(&self, index: u64, change: ChunkChange) {
        if let Some(h) = &self.head {
            h.note(index, change);
        }
    }

    fn note_unknown(&self) {
        if let Some(h) = &self.head {
            h.note_unknown();
        }
    }

    /// Publishes the head if anything changed since the last one landed.
    /// A head that cannot be written now is tried again at the next flush
    /// (readers lag meanwhile; the data is in the bucket); one someone else
    /// wrote fences this writer.
    fn publish_head(&self) -> DevResult<()> {
        let Some(head) = self.head.as_ref().filter(|h| h.has_news()) else { return Ok(()) };
        self.check_writable()?;
        let token = self.lease.lock().as_ref().map(|l| l.token());
        let Some(token) = token else {
            return Err(eio(format!("{}: the lease was given back", self.location)));
        };
        let may_write = || self.check_writable().map_err(|e| e.to_string());
        match head.publish(&self.store, token, self.budget, &may_write) {
            Ok(()) => Ok(()),
            Err(PublishError::Taken) => Err(self.fence("the head was written by someone else".into())),
            Err(PublishError::Failed(why)) => {
                warn!(
                    "{}: writing the head: {why}; read-only servers see this generation once a later flush writes it",
                    self.location
                );
                Ok(())
            }
        }
    }

    fn next_write_id(&self) -> String {
        format!("{:032x}-{}", self.writer_id, self.write_seq.fetch_add(1, Ordering::Relaxed))
    }

    /// After a 412 on chunk `index`: if the chunk now holds a write of ours
    /// whose answer we never had (in flight, or its answer lost), takes its
    /// ETag into the map and returns its write id and ETag; None if the
    /// chunk holds someone else's write.
    fn landed(&self, index: u64) -> DevResult<Option<(String, String)>> {
        let ids = self.unsure.lock().get(&index).cloned().unwrap_or_default();
        if ids.is_empty() {
            return Ok(None);
        }
        let path = chunk_key(&self.location, index);
        let opts = GetOptions { head: true, ..Default::default() };
        let got = match with_retries(self.budget, &path, || block(self.store.get_opts(&path, opts.clone()))) {
            Ok(g) => g,
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            // Unknown yet: not a reason to fence.
            Err(e) => return Err(eio(format!("{path}: checking whose write it holds: {e}"))),
        };
        let id = got.attributes.get(&Attribute::Metadata(WRITE_ID.into())).map(|v| v.to_string());
        match (id, got.meta.e_tag) {
            (Some(id), Some(etag)) if ids.contains(&id) => {
                info!("{path}: a write of ours whose answer was lost had landed; taking its ETag");
                self.map.lock().insert(index, etag.clone());
                self.note(index, ChunkChange::Written(etag.clone()));
                Ok(Some((id, etag)))
            }
            _ => Ok(None),
        }
    }

    /// Replaces chunk `index` whole with `data`, conditional on what this
    /// writer last saw of it.
    fn put_chunk(&self, index: u64, data: Vec<u8>) -> DevResult<()> {
        // Checked at every PUT, not only when a txg begins: a txg can
        // outlast the self-fence bound.
        self.check_writable()?;
        let path = chunk_key(&self.location, index);
        let data = Bytes::from(data);
        let id = self.next_write_id();
        let mut attributes = Attributes::new();
        attributes.insert(Attribute::Metadata(WRITE_ID.into()), id.clone().into());
        self.unsure.lock().entry(index).or_default().push(id.clone());
        // Once more after taking the ETag of an earlier write of ours.
        for _ in 0..3 {
            let seen = self.map.lock().get(&index).cloned();
            let put = with_retries(self.budget, &path, || {
                crate::cond::put_conditional(
                    &self.store,
                    &path,
                    data.clone().into(),
                    &attributes,
                    seen.as_deref(),
                )
            });
            match put {
                Ok(r) => {
                    let etag = r.e_tag.ok_or_else(|| eio(format!("{path}: the server gave no ETag")))?;
                    self.map.lock().insert(index, etag.clone());
                    self.note(index, ChunkChange::Written(etag));
                    // Every earlier write of ours to it is settled now.
                    self.unsure.lock().remove(&index);
                    return Ok(());
                }
                Err(object_store::Error::Precondition { .. })
                | Err(object_store::Error::AlreadyExists { .. }) => match self.landed(index)? {
                    // This very PUT landed; its answer was lost.
                    Some((landed, _)) if landed == id => {
                        self.unsure.lock().remove(&index);
                        return Ok(());
                    }
                    // An earlier one did: its ETag is in the map; put over it.
                    Some(_) => {}
                    None => return Err(self.fence(format!("chunk {index} was written by someone else"))),
                },
                // The outcome is unknown: the id stays unsure, and the
                // next head cannot say what the chunk holds.
                Err(e) => {
                    self.note_unknown();
                    return Err(eio(format!("{path}: {e}")));
                }
            }
        }
        Err(self.fence(format!("chunk {index} keeps changing underneath")))
    }

    fn delete_chunk(&self, index: u64) -> DevResult<()> {
        self.check_writable()?;
        let path = chunk_key(&self.location, index);
        match with_retries(self.budget, &path, || block(self.store.delete(&path))) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {
                self.map.lock().remove(&index);
                self.note(index, ChunkChange::Deleted);
                Ok(())
            }
            Err(e) => {
                self.note_unknown();
                Err(eio(format!("{path}: {e}")))
            }
        }
    }

    /// Writes several parts of chunk `index` (ranges within the chunk,
    /// not overlapping) with one PUT: the chunk is read first only when the
    /// parts leave some of it uncovered and it exists.
    fn patch_many(&self, index: u64, parts: &[ChunkPart<'_>]) -> DevResult<()> {
        let _g = self.stripes[index as usize % LOCK_STRIPES].lock();
        let len = self.chunk_len(index);
        let covered: u64 = parts.iter().map(|(r, _)| r.end - r.start).sum();
        let mut whole = match self.map.lock().get(&index).cloned() {
            Some(e) if covered < len => self.get_chunk(index, 0..len, &e)?,
            _ => vec![0u8; len as usize],
        };
        for (r, data) in parts {
            whole[r.start as usize..r.end as usize].copy_from_slice(data);
        }
        self.put_chunk(index, whole)
    }

    /// Zeros `range` of chunk `index`: a whole chunk is deleted, part of
    /// one is read, zeroed and put back under the chunk's lock.
    fn zero(&self, index: u64, range: Range<u64>) -> DevResult<()> {
        let _g = self.stripes[index as usize % LOCK_STRIPES].lock();
        let len = self.chunk_len(index);
        if range.start == 0 && range.end == len {
            return self.delete_chunk(index);
        }
        // Zeros into part of a chunk: one never written is zeros already.
        let Some(e) = self.map.lock().get(&index).cloned() else { return Ok(()) };
        let mut whole = self.get_chunk(index, 0..len, &e)?;
        whole[range.start as usize..range.end as usize].fill(0);
        self.put_chunk(index, whole)
    }
}

impl BlockDev for S3ChunkDev {
    fn size(&self) -> u64 {
        self.manifest.size
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> DevResult<()> {
        self.check_range(offset, buf.len() as u64)?;
        let mut at = 0usize;
        for (index, range) in self.pieces(offset, buf.len() as u64) {
            let n = (range.end - range.start) as usize;
            let seen = self.map.lock().get(&index).cloned();
            match seen {
                None => buf[at..at + n].fill(0),
                Some(e) => self.get_chunk_into(index, range, &e, &mut buf[at..at + n])?,
            }
            at += n;
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> DevResult<()> {
        self.check_range(offset, buf.len() as u64)?;
        self.write_parts(&[(offset, buf)])
    }

    fn write_unit(&self) -> Option<u64> {
        Some(self.manifest.chunk_size)
    }

    /// A stream reads whole chunks: one GET each instead of one per
    /// client request.
    fn read_unit(&self) -> Option<u64> {
        Some(self.manifest.chunk_size)
    }

    /// Each chunk the parts touch is written once (see `patch_many`).
    fn write_parts(&self, parts: &[(u64, &[u8])]) -> DevResult<()> {
        self.check_writable()?;
        let mut by_chunk: std::collections::BTreeMap<u64, Vec<ChunkPart<'_>>> = Default::default();
        for &(offset, data) in parts {
            self.check_range(offset, data.len() as u64)?;
            let mut at = 0usize;
            for (index, range) in self.pieces(offset, data.len() as u64) {
                let n = (range.end - range.start) as usize;
                by_chunk.entry(index).or_default().push((range, &data[at..at + n]));
                at += n;
            }
        }
        by_chunk.iter().try_for_each(|(&index, parts)| self.patch_many(index, parts))
    }

    /// Every write is a finished PUT: nothing is held back but the head,
    /// which commits the generation those PUTs make for read-only servers.
    fn flush(&self) -> DevResult<()> {
        if !self.writable {
            return Ok(());
        }
        if self.fenced.load(Ordering::Acquire) {
            return Err(eio(format!("{}: the lease was lost", self.location)));
        }
        self.publish_head()
    }

    /// Whole chunks are deleted; parts of chunks are left as they are
    /// (TRIM leaves contents unspecified).
    fn trim(&self, offset: u64, len: u64) -> DevResult<()> {
        self.check_range(offset, len)?;
        self.check_writable()?;
        for (index, range) in self.pieces(offset, len) {
            if range.start == 0 && range.end == self.chunk_len(index) {
                self.zero(index, range)?;
            }
        }
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> DevResult<()> {
        self.check_range(offset, len)?;
        self.check_writable()?;
        for (index, range) in self.pieces(offset, len) {
            self.zero(index, range)?;
        }
        Ok(())
    }

    fn allocation(&self, offset: u64, len: u64) -> DevResult<Vec<(u64, Alloc)>> {
        self.check_range(offset, len)?;
        let map = self.map.lock();
        let mut out: Vec<(u64, Alloc)> = Vec::new();
        for (index, range) in self.pieces(offset, len) {
            let kind = if map.contains_key(&index) { Alloc::Data } else { Alloc::Hole };
            let n = range.end - range.start;
            match out.last_mut() {
                Some((l, k)) if *k == kind => *l += n,
                _ => out.push((n, kind)),
            }
        }
        Ok(out)
    }

    fn describe(&self) -> String {
        self.location.to_string()
    }

    /// The disk: the same disk to the intent log whatever its chunks hold
    /// (a writer's log is replayed on the disk its own txgs changed).
    fn identity(&self) -> String {
        let u: String = self.manifest.disk_uuid.iter().map(|b| format!("{b:02x}")).collect();
        format!("{}#{u}", self.location)
    }

    /// The disk and its chunks' ETags: the lease lets a disk move between
    /// servers, so another server may have changed it while this one was
    /// stopped, and a persistent L2 filled before must then not be
    /// restored. A writer's follows its own PUTs and DELETEs (what a later
    /// open finds if nobody else writes); a reader's follows the writer's
    /// generations as it applies them. While a chunk a refused read took
    /// is not yet dropped from the cache (or the poller died), the cache
    /// may hold two versions of it: then a value no disk has.
    fn contents_identity(&self) -> String {
        let hash = match &self.follow {
            Some(f) => f.settled_hash(contents_hash),
            None => Some(contents_hash(&self.map.lock())),
        };
        match hash {
            Some(h) => format!("{}#{h:016x}", self.identity()),
            None => format!("{}#unsettled-{:032x}", self.identity(), rand::random::<u128>()),
        }
    }

    fn is_read_only(&self) -> bool {
        !self.writable
    }

    fn changed(&self) -> Option<String> {
        let why = self.follow.as_ref()?.failure()?;
        Some(format!("{}: {why}", self.location))
    }

    fn watch_changes(&self, watcher: Arc<dyn blockdev::ChangeWatcher>) {
        if let Some(f) = &self.follow {
            f.set_watcher(watcher);
        }
    }

    fn stop_watching(&self) {
        if let Some(f) = &self.follow {
            f.stop();
        }
    }

    /// Marks the lease released in the bucket: the next writer need not
    /// wait for it to expire or break it. Only this disk's own: another
    /// server in the same process keeps its disks' leases.
    fn release(&self) -> DevResult<()> {
        if let Some(l) = self.lease.lock().take() {
            l.release();
        }
        Ok(())
    }
}

/// What `arcache s3 break-lease` does: a held lease renewed less than
/// six of its renewal periods ago (a minute by default) is left alone
/// unless `force`; else it is marked released,
/// conditional on being the copy just read.
pub fn break_lease(location: &S3Location, creds: &Credentials, force: bool) -> Result<String, String> {
    let store = client(location, creds)?;
    let path = key(location, "arcache-lease");
    let got = match block(store.get(&path)) {
        Ok(g) => g,
        Err(object_store::Error::NotFound { .. }) => return Ok(format!("{location} has no lease")),
        Err(e) => return Err(format!("{location}: reading the lease: {e}")),
    };
    let etag = got.meta.e_tag.clone();
    let modified = got.meta.last_modified;
    let bytes = block(got.bytes()).map_err(|e| format!("{location}: reading the lease: {e}"))?;
    let mut lease = Lease::decode(&bytes).map_err(|e| format!("{location}arcache-lease: {e}"))?;
    let holder = format!("host {} pid {}", lease.host, lease.pid);
    if !lease.held {
        return Ok(format!("{location}: the lease is not held (last holder {holder})"));
    }
    let age = SystemTime::now().duration_since(modified.into()).unwrap_or_default();
    // Six of its periods: a holder that cannot renew stopped writing after
    // three (its self-fence), so by then it writes no more.
    let alive_within = Duration::from_millis(6 * u64::from(lease.renew_period_ms));
    if age < alive_within && !force {
        return Err(format!(
            "{location} is held by {holder}, renewed {} s ago: it looks alive; stop that server, or pass --force",
            age.as_secs()
        ));
    }
    lease.held = false;
    let put = crate::cond::put_conditional(
        &store,
        &path,
        lease.encode().into(),
        &Attributes::new(),
        etag.as_deref(),
    );
    match put {
        Ok(_) => Ok(format!("{location}: broke the lease of {holder}")),
        Err(object_store::Error::Precondition { .. }) => {
            Err(format!("{location}: the holder renewed just now; it is alive"))
        }
        Err(e) => Err(format!("{location}: writing the lease: {e}")),
    }
}

/// A writer dropped without [`BlockDev::release`] (a stop that could not
/// write everything, a crash of the embedder) leaves its lease held: its
/// log has what the bucket lacks, and no other writer may start before
/// `break-lease`.
impl Drop for S3ChunkDev {
    fn drop(&mut self) {
        if let Some(f) = &self.follow {
            f.stop();
        }
        if let Some(l) = self.lease.get_mut().take() {
            l.abandon();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server may quote an ETag in a PUT's answer and not in a LIST's:
    /// a writer's hash at its stop and the next start's must agree.
    #[test]
    fn the_contents_hash_ignores_how_an_etag_is_quoted() {
        let hash = |etag: &str| contents_hash(&HashMap::from([(3, etag.to_string())]));
        assert_eq!(hash("abc"), hash("\"abc\""));
        assert_eq!(hash("abc"), hash("W/\"abc\""));
        assert_ne!(hash("abc"), hash("abd"));
    }
}
