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
    /// The last generation we know the bucket's head has.
    generation: u64,
    /// The head's ETag as our last write of it left it.
    etag: Option<String>,
    oldest: u64,
    history: Vec<HeadEntry>,
    /// Changes not yet in a head we know landed, in the order made.
    pending: Vec<(u64, ChunkChange)>,
    /// Generation numbers up to this one were sent in PUTs whose outcome
    /// is unknown: never sent again with other contents.
    used: u64,
    /// Some change may be missing from `pending` (a chunk PUT or DELETE
    /// whose answer was lost, a writer before us that stopped between its
    /// PUTs and its head): the next head lists nothing older than itself,
    /// so every reader lists the chunks instead.
    relist: bool,
    /// Counts changes of unknown outcome, so a head sent before one is not
    /// taken for covering it.
    unknowns: u64,
}

/// What one publication sends.
struct Attempt {
    head: Head,
    bytes: Vec<u8>,
    /// How many of `pending` it lists.
    taken: usize,
    /// `unknowns` when it was made.
    unknowns: u64,
}

pub(crate) struct HeadWriter {
    path: Path,
    disk_uuid: [u8; 16],
    state: Mutex<Published>,
    /// One publication at a time; `state` stays free for `note` meanwhile.
    publishing: Mutex<()>,
}

impl HeadWriter {
    /// Takes up the generations where the head in the bucket left them
    /// (from 0 without one). The first head it publishes makes every
    /// reader list the chunks: a writer before it may have stopped between
    /// chunk PUTs and the head that would have named them.
    pub(crate) fn load(
        store: &AmazonS3,
        location: &S3Location,
        disk_uuid: [u8; 16],
        budget: Duration,
    ) -> Result<HeadWriter, String> {
        let path = head_key(location);
        let fetched = fetch(store, &path, None, budget).map_err(|e| format!("{path}: {e}"))?;
        let (generation, etag) = match fetched {
            // Numbering starts again below a head that leaves it no room
            // (readers seeing a generation go back list the chunks).
            Fetched::Found(etag, head) => (head.map_or(0, |h| h.generation).min(u64::MAX >> 1), etag),
            Fetched::Missing | Fetched::Unchanged => (0, None),
        };
        let state = Published {
            generation,
            etag,
            oldest: generation.saturating_add(1),
            history: Vec::new(),
            pending: Vec::new(),
            used: generation,
            relist: true,
            unknowns: 0,
        };
        Ok(HeadWriter { path, disk_uuid, state: Mutex::new(state), publishing: Mutex::new(()) })
    }

    pub(crate) fn note(&self, chunk: u64, change: ChunkChange) {
        self.state.lock().pending.push((chunk, change));
    }

    /// A change of unknown outcome happened: the next head makes readers
    /// list the chunks.
    pub(crate) fn note_unknown(&self) {
        let mut st = self.state.lock();
        st.relist = true;
        st.unknowns += 1;
    }

    pub(crate) fn has_news(&self) -> bool {
        let st = self.state.lock();
        !st.pending.is_empty() || st.relist
    }

    /// Writes the next generation's head if anything changed since the
    /// last one landed, conditional on the head being the one we know. A
    /// head of ours found there instead (a PUT whose answer was lost) is
    /// taken as the base and the head is written again over it, under a
    /// generation number never sent before, so a reader never takes a head
    /// for one with other contents.
    pub(crate) fn publish(
        &self,
        store: &AmazonS3,
        token: [u8; 16],
        budget: Duration,
        may_write: &dyn Fn() -> Result<(), String>,
    ) -> Result<(), PublishError> {
        let _one = self.publishing.lock();
        for _ in 0..3 {
            // Checked before every PUT: a publication can outlast the
            // self-fence bound.
            may_write().map_err(PublishError::Failed)?;
            let (attempt, known) = {
                let mut st = self.state.lock();
                if st.pending.is_empty() && !st.relist {
                    return Ok(());
                }
                let a = self.attempt(&mut st, token);
                (a, st.etag.clone())
            };
            let generation = attempt.head.generation;
            let put = with_retries(budget, &self.path, || {
                let body = attempt.bytes.clone().into();
                crate::cond::put_conditional(store, &self.path, body, &Attributes::new(), known.as_deref())
            });
            let etag = match put {
                Ok(r) => r.e_tag,
                Err(object_store::Error::Precondition { .. })
                | Err(object_store::Error::AlreadyExists { .. }) => {
                    let there = match fetch(store, &self.path, None, budget) {
                        Ok(Fetched::Found(etag, Ok(h))) if h.token == token => (etag, h.generation),
                        Ok(_) => return Err(PublishError::Taken),
                        Err(e) => return Err(PublishError::Failed(format!("{}: {e}", self.path))),
                    };
                    let mut st = self.state.lock();
                    match there {
                        // This very PUT landed; its answer was lost.
                        (etag, g) if g == generation => etag,
                        // An earlier PUT of ours whose outcome we did not
                        // know: write ours again over it.
                        (etag, g) if g > st.generation && g < generation => {
                            tracing::info!("{}: an earlier head write of ours had landed", self.path);
                            st.etag = etag;
                            continue;
                        }
                        _ => return Err(PublishError::Taken),
                    }
                }
                Err(e) => return Err(PublishError::Failed(format!("{}: {e}", self.path))),
            };
            let mut st = self.state.lock();
            st.pending.drain(..attempt.taken);
            st.generation = generation;
            st.etag = etag;
            st.oldest = attempt.head.oldest;
            st.history = attempt.head.entries;
            // A change of unknown outcome made while this head was on its
            // way is not covered by it.
            st.relist = st.unknowns != attempt.unknowns;
            return Ok(());
        }
        Err(PublishError::Failed(format!("{}: our own earlier writes kept landing", self.path)))
    }

    /// The head of the next unused generation: the history and every
    /// pending change, as many of the last generations as fit in
    /// [`HEAD_MAX`] (oldest dropped first). One that does not fit alone,
    /// or names an ETag too long to encode, or follows a change of unknown
    /// outcome, is not listed: the head lists from the next generation on,
    /// so a reader that needs it lists the disk instead.
    fn attempt(&self, st: &mut Published, token: [u8; 16]) -> Attempt {
        let generation = st.used.max(st.generation).saturating_add(1);
        st.used = generation;
        let taken = st.pending.len();
        let mut entries = st.history.clone();
        entries.extend(st.pending.iter().map(|(chunk, change)| HeadEntry {
            generation,
            chunk: *chunk,
            change: change.clone(),
        }));
        let mut head = Head {
            disk_uuid: self.disk_uuid,
            token,
            generation,
            oldest: st.oldest,
            overflow: false,
            entries: Vec::new(),
        };
        if st.relist {
            entries.clear();
            head.oldest = generation.saturating_add(1);
        }
        loop {
            head.entries = entries.clone();
            if let Ok(bytes) = head.encode() {
                return Attempt { head, bytes, taken, unknowns: st.unknowns };
            }
            let first = entries.first().map_or(generation, |e| e.generation);
            if first >= generation {
                entries.clear();
                head.oldest = generation.saturating_add(1);
                continue;
            }
            entries.retain(|e| e.generation > first);
            head.oldest = first + 1;
        }
    }
}
