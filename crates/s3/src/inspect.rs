//! What `arcache s3 show` prints and `arcache s3 create` does: a chunked
//! disk's manifest, lease and chunks read without serving it, and a disk
//! made without serving it (so read-only servers can start first).

use std::time::{Duration, SystemTime};

use object_store::ObjectStoreExt;

use crate::chunked::{block, key, list_chunks, manifest};
use crate::credentials::Credentials;
use crate::format::{Lease, Manifest};
use crate::head::{fetch, head_key, Fetched};
use crate::location::S3Location;
use crate::object::{client, retry_budget};

/// A chunked disk as the bucket holds it.
#[derive(Debug)]
pub struct DiskInfo {
    pub manifest: Manifest,
    /// The lease, and how long ago it was last written by S3's own clock
    /// (its Last-Modified against now); `None`: never taken.
    pub lease: Option<(Lease, Duration)>,
    pub chunks: u64,
    pub stored_bytes: u64,
    /// The head's last committed generation and how many chunk changes it
    /// lists; `None`: no head (nothing committed since heads were
    /// written), or one that does not decode (the error).
    pub head: Option<Result<(u64, usize), String>>,
}

/// Reads `location`'s manifest, lease and chunk list.
pub fn show(location: &S3Location, creds: &Credentials) -> Result<DiskInfo, String> {
    if !location.is_prefix() {
        return Err(format!("{location}: a chunked disk is s3://BUCKET/PREFIX/ (ending in /)"));
    }
    let store = client(location, creds)?;
    let path = key(location, "arcache-manifest");
    let bytes = match block(async { store.get(&path).await?.bytes().await }) {
        Ok(b) => b,
        Err(object_store::Error::NotFound { .. }) => {
            return Err(format!("{location} holds no disk (no manifest)"))
        }
        Err(e) => return Err(format!("{location}: reading the manifest: {e}")),
    };
    let manifest = Manifest::decode(&bytes).map_err(|e| format!("{location}arcache-manifest: {e}"))?;
    let path = key(location, "arcache-lease");
    let lease = match block(store.get(&path)) {
        Ok(got) => {
            let modified: SystemTime = got.meta.last_modified.into();
            let bytes = block(got.bytes()).map_err(|e| format!("{location}: reading the lease: {e}"))?;
            let lease = Lease::decode(&bytes).map_err(|e| format!("{location}arcache-lease: {e}"))?;
            Some((lease, SystemTime::now().duration_since(modified).unwrap_or_default()))
        }
        Err(object_store::Error::NotFound { .. }) => None,
        Err(e) => return Err(format!("{location}: reading the lease: {e}")),
    };
    let head = match fetch(&store, &head_key(location), None, retry_budget(location)) {
        Ok(Fetched::Found(_, Ok(h))) => Some(Ok((h.generation, h.entries.len()))),
        Ok(Fetched::Found(_, Err(e))) => Some(Err(e)),
        Ok(Fetched::Missing | Fetched::Unchanged) => None,
        Err(e) => return Err(format!("{location}: reading the head: {e}")),
    };
    let listed = list_chunks(&store, location)?;
    let stored_bytes = listed.iter().map(|(_, meta)| meta.size).sum();
    Ok(DiskInfo { manifest, lease, chunks: listed.len() as u64, stored_bytes, head })
}

/// Makes the disk `location` (its manifest) of `size` bytes in chunks of
/// `chunk` (default 4M), or finds it made with the same; false with it when
/// it was there already.
pub fn create(
    location: &S3Location,
    creds: &Credentials,
    size: u64,
    chunk: Option<u64>,
) -> Result<(Manifest, bool), String> {
    if !location.is_prefix() {
        return Err(format!("{location}: a chunked disk is s3://BUCKET/PREFIX/ (ending in /)"));
    }
    crate::chunked::check_geometry(location, Some(size), chunk)?;
    let store = client(location, creds)?;
    manifest(&store, location, Some(size), chunk, &creds.source)
}
