//! The head object of a chunked disk (`PREFIX/arcache-head`,
//! docs/s3-backing.md, "Generations and the head object"): the writer
//! publishes, at each flush that follows changes, the generation it
//! committed and the chunks the last few generations changed, so read-only
//! servers learn what changed without listing the disk.

use object_store::aws::AmazonS3;
use object_store::path::Path;
use object_store::{Attributes, GetOptions, ObjectStore};
use parking_lot::Mutex;
use std::time::Duration;

use crate::chunked::{block, key};
use crate::format::{ChunkChange, Head, HeadEntry, HEAD_MAX};
use crate::location::S3Location;
use crate::retry::with_retries;

pub(crate) fn head_key(location: &S3Location) -> Path {
    key(location, "arcache-head")
}

/// What a GET of the head found.
pub(crate) enum Fetched {
    /// It still has the ETag asked about (304).
    Unchanged,
    Missing,
    /// Its ETag, and the head or why it is not one.
    Found(Option<String>, Result<Head, String>),
}

/// GETs the head, or only asks whether it still has `known` (its ETag).
pub(crate) fn fetch(
    store: &AmazonS3,
    path: &Path,
    known: Option<&str>,
    budget: Duration,
) -> object_store::Result<Fetched> {
    let opts = GetOptions { if_none_match: known.map(str::to_string), ..Default::default() };
    let got = with_retries(budget, path, || {
        block(async {
            let got = store.get_opts(path, opts.clone()).await?;
            let etag = got.meta.e_tag.clone();
            // A head is at most 64 KiB: a larger object is not read.
            if got.meta.size > HEAD_MAX as u64 {
                return Ok((etag, Err(format!("the head is {} bytes, more than {HEAD_MAX}", got.meta.size))));
            }
            let bytes = got.bytes().await?;
            Ok((etag, Head::decode(&bytes)))
        })
    });
    match got {
        Ok((etag, head)) => Ok(Fetched::Found(etag, head)),
        Err(object_store::Error::NotModified { .. }) => Ok(Fetched::Unchanged),
        Err(object_store::Error::NotFound { .. }) => Ok(Fetched::Missing),
        Err(e) => Err(e),
    }
}

/// Why a head could not be published.
pub(crate) enum PublishError {
    /// Someone else wrote the head: this writer must stop writing.
    Taken,
    Failed(String),
}

struct Published {
    generation: u64,
    /// The head's ETag as our last write of it left it.
    etag: Option<String>,
    oldest: u64,
    history: Vec<HeadEntry>,
    /// Changes since the last head, in the order they were made.
    pending: Vec<(u64, ChunkChange)>,
}

pub(crate) struct HeadWriter {
    path: Path,
    disk_uuid: [u8; 16],
    state: Mutex<Published>,
}

impl HeadWriter {
    /// Takes up the generations where the head in the bucket left them
    /// (from 0 without one); a head that does not decode, or of another
    /// disk, is written over and lists nothing older than our first.
    pub(crate) fn load(
        store: &AmazonS3,
        location: &S3Location,
        disk_uuid: [u8; 16],
        budget: Duration,
    ) -> Result<HeadWriter, String> {
        let path = head_key(location);
        let fetched = fetch(store, &path, None, budget).map_err(|e| format!("{path}: {e}"))?;
        let state = match fetched {
            Fetched::Found(etag, Ok(h)) if h.disk_uuid == disk_uuid => Published {
                generation: h.generation,
                etag,
                oldest: h.oldest,
                history: h.entries,
                pending: Vec::new(),
            },
            Fetched::Found(etag, head) => {
                let generation = head.map_or(0, |h| h.generation);
                Published {
                    generation,
                    etag,
                    oldest: generation + 1,
                    history: Vec::new(),
                    pending: Vec::new(),
                }
            }
            Fetched::Missing | Fetched::Unchanged => {
                Published { generation: 0, etag: None, oldest: 1, history: Vec::new(), pending: Vec::new() }
            }
        };
        Ok(HeadWriter { path, disk_uuid, state: Mutex::new(state) })
    }

    pub(crate) fn note(&self, chunk: u64, change: ChunkChange) {
        self.state.lock().pending.push((chunk, change));
    }

    /// Writes the next generation's head if anything changed since the
    /// last, conditional on the head being the one we wrote last. A head
    /// whose answer was lost is recognised by our token and generation.
    pub(crate) fn publish(
        &self,
        store: &AmazonS3,
        token: [u8; 16],
        budget: Duration,
    ) -> Result<(), PublishError> {
        let mut st = self.state.lock();
        if st.pending.is_empty() {
            return Ok(());
        }
        let generation = st.generation + 1;
        let mut entries = st.history.clone();
        entries.extend(st.pending.iter().map(|(chunk, change)| HeadEntry {
            generation,
            chunk: *chunk,
            change: change.clone(),
        }));
        let (head, bytes) = self.fitted(token, generation, st.oldest, entries);
        let put = with_retries(budget, &self.path, || {
            crate::cond::put_conditional(
                store,
                &self.path,
                bytes.clone().into(),
                &Attributes::new(),
                st.etag.as_deref(),
            )
        });
        let etag = match put {
            Ok(r) => r.e_tag,
            Err(object_store::Error::Precondition { .. })
            | Err(object_store::Error::AlreadyExists { .. }) => {
                match fetch(store, &self.path, None, budget) {
                    Ok(Fetched::Found(etag, Ok(there)))
                        if there.token == token && there.generation == generation =>
                    {
                        tracing::info!("{}: a head write of ours landed but its answer was lost", self.path);
                        etag
                    }
                    Ok(_) => return Err(PublishError::Taken),
                    Err(e) => return Err(PublishError::Failed(format!("{}: {e}", self.path))),
                }
            }
            Err(e) => return Err(PublishError::Failed(format!("{}: {e}", self.path))),
        };
        *st = Published { generation, etag, oldest: head.oldest, history: head.entries, pending: Vec::new() };
        Ok(())
    }

    /// The head for `generation` with as many of the last generations'
    /// changes as fit in [`HEAD_MAX`], oldest dropped first; a generation
    /// that does not fit alone (or names an ETag too long to encode) is
    /// not listed, and the head lists from the next one, so a reader that
    /// needs it lists the disk instead.
    fn fitted(
        &self,
        token: [u8; 16],
        generation: u64,
        oldest: u64,
        mut entries: Vec<HeadEntry>,
    ) -> (Head, Vec<u8>) {
        let mut head = Head {
            disk_uuid: self.disk_uuid,
            token,
            generation,
            oldest,
            overflow: false,
            entries: Vec::new(),
        };
        loop {
            head.entries = entries.clone();
            if let Ok(bytes) = head.encode() {
                return (head, bytes);
            }
            let first = entries.first().map_or(generation, |e| e.generation);
            if first >= generation {
                head.oldest = generation + 1;
                head.entries.clear();
                let bytes = head.encode().unwrap_or_default();
                return (head, bytes);
            }
            entries.retain(|e| e.generation > first);
            head.oldest = first + 1;
        }
    }
}
