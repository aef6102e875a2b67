//! The intent log (`--log`): a rotary log of chunks on a fast device that
//! makes acknowledged writes durable before the transaction group that
//! writes them to the backing store has run, and gives them back after a
//! crash. The format is in `docs/intent-log.md`.

pub mod format;

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use blockdev::owner::{Owner, OwnerState};
use blockdev::{BlockDev, DevError};
use parking_lot::Mutex;
use tracing::info;

pub use format::{Entry, Header, LogExport, PAGE, SECTOR};
use format::{ALIGN, CHUNK_HEADER, DATA_START, HEADER_SIZE, MAX_CHUNK};

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("intent log device {0}: {1}")]
    Io(String, DevError),
    #[error("intent log device {0} is too small: at least 1 MiB is needed")]
    TooSmall(String),
    #[error("the intent log is full")]
    Full,
    #[error("intent log device {0}: {1}")]
    Refused(String, String),
}

/// A chunk still needed: until the txg it belongs to has synced.
#[derive(Debug, Clone, Copy)]
struct LiveChunk {
    lpos: u64,
    seq: u64,
    txg: u64,
}

struct State {
    hdr: Header,
    head_lpos: u64,
    next_seq: u64,
    live: VecDeque<LiveChunk>,
    /// The header found at open, while its chunks have not been replayed.
    to_replay: Option<Header>,
}

pub struct IntentLog {
    dev: Arc<dyn BlockDev>,
    name: String,
    exports: Vec<LogExport>,
    st: Mutex<State>,
}

/// Encoded chunks with their device offsets, not yet written.
pub struct PlacedChunks {
    chunks: Vec<(u64, Vec<u8>)>,
}

/// What a replay found and applied.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ReplayStats {
    pub chunks: u64,
    pub pages: u64,
    pub discards: u64,
    pub bytes: u64,
}

fn random_u128() -> u128 {
    use std::hash::{BuildHasher, Hasher};
    let mut out = 0u128;
    for i in 0..2u32 {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()),
        );
        h.write_u32(std::process::id() ^ i);
        out = (out << 64) | u128::from(h.finish());
    }
    out
}

impl IntentLog {
    /// Opens the log on `dev`, formatting it when it holds no valid header.
    /// A log that holds chunks must be replayed ([`IntentLog::replay`])
    /// before it takes new ones.
    pub fn open(dev: Arc<dyn BlockDev>, exports: Vec<LogExport>) -> Result<IntentLog, LogError> {
        let name = dev.describe();
        let capacity = dev.size().saturating_sub(DATA_START) / ALIGN * ALIGN;
        if capacity < (1 << 20) - DATA_START {
            return Err(LogError::TooSmall(name));
        }
        let found = read_header(dev.as_ref()).map_err(|e| LogError::Io(name.clone(), e))?;
        let fresh = Header {
            uuid: found.as_ref().map_or_else(random_u128, |h| h.uuid),
            // `reset` moves both on before anything is written.
            incarnation: found.as_ref().map_or(0, |h| h.incarnation),
            header_seq: found.as_ref().map_or(0, |h| h.header_seq),
            capacity,
            tail_lpos: 0,
            tail_seq: 1,
            exports: exports.clone(),
            owner: Owner::this_process(OwnerState::InUse),
        };
        let st = State { hdr: fresh, head_lpos: 0, next_seq: 1, live: VecDeque::new(), to_replay: found };
        let log = IntentLog { dev, name, exports, st: Mutex::new(st) };
        if log.st.lock().to_replay.is_none() {
            log.reset()?;
        }
        Ok(log)
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn needs_replay(&self) -> bool {
        self.st.lock().to_replay.is_some()
    }

    pub fn capacity(&self) -> u64 {
        self.st.lock().hdr.capacity
    }

    /// Bytes of chunks not yet released.
    pub fn used(&self) -> u64 {
        let st = self.st.lock();
        st.head_lpos - st.hdr.tail_lpos
    }

    fn io(&self, e: DevError) -> LogError {
        LogError::Io(self.name.clone(), e)
    }

    /// Applies every valid chunk in order through `apply`, which gets the
    /// export as the log knew it. Exports are checked before anything is
    /// applied: a log naming an export that `is_known` refuses is refused
    /// whole. Call [`IntentLog::reset`] after the backing stores are flushed.
    pub fn replay(
        &self,
        is_known: &dyn Fn(&LogExport) -> bool,
        apply: &mut dyn FnMut(&LogExport, &Entry) -> Result<(), String>,
    ) -> Result<ReplayStats, LogError> {
        let Some(old) = self.st.lock().to_replay.clone() else { return Ok(ReplayStats::default()) };
        if DATA_START + old.capacity > self.dev.size() {
            return Err(LogError::Refused(
                self.name.clone(),
                format!(
                    "the log was made for a data area of {} bytes and the device is smaller now",
                    old.capacity
                ),
            ));
        }
        let mut used: HashSet<u16> = HashSet::new();
        self.walk(&old, &mut |entries| {
            for e in entries {
                let ex =
                    old.exports.iter().find(|x| x.id == e.export()).ok_or("entry of an unknown export")?;
                let (off, len) = e.extent();
                if off.checked_add(len).is_none_or(|end| end > ex.size.next_multiple_of(PAGE as u64)) {
                    return Err(format!("entry past the end of export {:?}", ex.name));
                }
                used.insert(ex.id);
            }
            Ok(())
        })?;
        for ex in old.exports.iter().filter(|x| used.contains(&x.id)) {
            if !is_known(ex) {
                return Err(LogError::Refused(
                    self.name.clone(),
                    format!(
                        "it holds writes for export {:?} whose backing store is not served now or has changed; \
                         start with the same exports, or drop the log with `arcache log forget` \
                         (its writes are then lost)",
                        ex.name
                    ),
                ));
            }
        }
        let mut stats = ReplayStats::default();
        self.walk(&old, &mut |entries| {
            stats.chunks += 1;
            for e in entries {
                let ex =
                    old.exports.iter().find(|x| x.id == e.export()).ok_or("entry of an unknown export")?;
                apply(ex, e)?;
                match e {
                    Entry::Page { data, .. } => {
                        stats.pages += 1;
                        stats.bytes += data.len() as u64;
                    }
                    _ => stats.discards += 1,
                }
            }
            if stats.chunks % 256 == 0 {
                info!("intent log replay: {} chunks, {} pages applied so far", stats.chunks, stats.pages);
            }
            Ok(())
        })?;
        Ok(stats)
    }

    /// Calls `each` with the entries of every valid chunk from the tail on.
    fn walk(&self, h: &Header, each: &mut dyn FnMut(&[Entry]) -> Result<(), String>) -> Result<(), LogError> {
        let seed = format::log_seed(h.uuid, h.incarnation);
        let (mut lpos, mut seq) = (h.tail_lpos, h.tail_seq);
        let refused = |m: String| LogError::Refused(self.name.clone(), m);
        loop {
            let chunk = match self.read_chunk(h, seed, seq, lpos)? {
                Some(c) => Some((lpos, c)),
                None => {
                    // A chunk that did not fit before the end starts the next lap.
                    let next_lap = (lpos / h.capacity + 1) * h.capacity;
                    self.read_chunk(h, seed, seq, next_lap)?.map(|c| (next_lap, c))
                }
            };
            let Some((at, (len, entries))) = chunk else { return Ok(()) };
            each(&entries).map_err(refused)?;
            lpos = at + len;
            seq += 1;
        }
    }

    /// The chunk at `lpos` if it is the valid chunk `seq`: its length and entries.
    fn read_chunk(
        &self,
        h: &Header,
        seed: u64,
        seq: u64,
        lpos: u64,
    ) -> Result<Option<(u64, Vec<Entry>)>, LogError> {
        let off = lpos % h.capacity;
        if off + ALIGN > h.capacity {
            return Ok(None);
        }
        let mut head = vec![0u8; ALIGN as usize];
        self.dev.read_at(&mut head, DATA_START + off).map_err(|e| self.io(e))?;
        let Ok(info) = format::decode_chunk_header(&head[..CHUNK_HEADER], seed, seq, lpos) else {
            return Ok(None);
        };
        let len = u64::from(info.length);
        if off + len > h.capacity {
            return Ok(None);
        }
        let mut whole = vec![0u8; len as usize];
        whole[..ALIGN as usize].copy_from_slice(&head);
        if len > ALIGN {
            self.dev
                .read_at(&mut whole[ALIGN as usize..], DATA_START + off + ALIGN)
                .map_err(|e| self.io(e))?;
        }
        Ok(format::decode_chunk_body(&whole, seed).ok().map(|e| (len, e)))
    }

    /// Starts a new incarnation: an empty log that no older chunk can join.
    pub fn reset(&self) -> Result<(), LogError> {
        let mut st = self.st.lock();
        st.hdr.incarnation += 1;
        st.hdr.tail_lpos = 0;
        st.hdr.tail_seq = 1;
        st.hdr.exports = self.exports.clone();
        st.head_lpos = 0;
        st.next_seq = 1;
        st.live.clear();
        for _ in 0..2 {
            self.write_header(&mut st)?;
        }
        st.to_replay = None;
        Ok(())
    }

    fn write_header(&self, st: &mut State) -> Result<(), LogError> {
        st.hdr.header_seq += 1;
        let bytes = st.hdr.encode().map_err(|e| LogError::Refused(self.name.clone(), e.to_string()))?;
        let at = (st.hdr.header_seq % 2) * HEADER_SIZE as u64;
        self.dev.write_at(&bytes, at).map_err(|e| self.io(e))?;
        self.dev.flush().map_err(|e| self.io(e))
    }

    /// Records in the header that this server closed the log cleanly: the
    /// last write of a clean stop, after every txg it holds has synced.
    pub fn close(&self) -> Result<(), LogError> {
        let mut st = self.st.lock();
        st.hdr.owner = Owner::this_process(OwnerState::Closed);
        self.write_header(&mut st)
    }

    /// Bytes `entries` take as chunks, for a caller deciding whether to log
    /// or to sync a txg instead.
    pub fn encoded_len(entries: &[Entry]) -> u64 {
        let body: u64 = entries.iter().map(|e| e.encoded_len() as u64).sum();
        let chunks = body.div_ceil(MAX_CHUNK as u64).max(1);
        (body + chunks * (CHUNK_HEADER as u64 + ALIGN)).next_multiple_of(ALIGN)
    }

    /// Writes `entries` as chunks tagged with `txg` and flushes the device:
    /// when this returns Ok they survive any crash. `Full` changes nothing.
    pub fn append(&self, txg: u64, entries: &[Entry]) -> Result<(), LogError> {
        self.write(txg, entries)?;
        self.sync()
    }

    /// Makes every chunk written so far durable. Chunks are durable only
    /// after this; a commit writes and then syncs, and a sync covers every
    /// write completed before it began, so two commits can overlap.
    pub fn sync(&self) -> Result<(), LogError> {
        self.dev.flush().map_err(|e| self.io(e))
    }

    /// The first half of [`IntentLog::append`]: the chunks are written in
    /// log order, not yet durable.
    pub fn write(&self, txg: u64, entries: &[Entry]) -> Result<(), LogError> {
        let placed = self.place_chunks(txg, entries)?;
        self.write_placed(&placed)
    }

    /// Encodes `entries` as chunks and gives them their places and sequence
    /// numbers, in the order of calls; nothing is written yet. Chunks placed
    /// by earlier calls may be written after these ([`IntentLog::write_placed`]),
    /// so several commits' writes can be in flight at once: a replay stops
    /// at the first chunk that is not there, so a chunk is worth something
    /// only once every chunk placed before it has been written too, which
    /// is what a caller waits for before it calls anything durable.
    /// `Full` changes nothing.
    pub fn place_chunks(&self, txg: u64, entries: &[Entry]) -> Result<PlacedChunks, LogError> {
        let mut st = self.st.lock();
        if st.to_replay.is_some() {
            return Err(LogError::Refused(self.name.clone(), "replay it before logging".into()));
        }
        let groups = split(entries);
        let cap = st.hdr.capacity;
        let mut end = st.head_lpos;
        for g in &groups {
            end = place(end, chunk_len(g), cap) + chunk_len(g);
        }
        if end - st.hdr.tail_lpos > cap {
            return Err(LogError::Full);
        }
        let mut chunks = Vec::with_capacity(groups.len());
        for g in groups {
            let len = chunk_len(g);
            st.head_lpos = place(st.head_lpos, len, cap);
            let (lpos, seq) = (st.head_lpos, st.next_seq);
            let seed = format::log_seed(st.hdr.uuid, st.hdr.incarnation);
            let bytes = format::encode_chunk(seed, seq, lpos, txg, g);
            debug_assert_eq!(bytes.len() as u64, len);
            chunks.push((DATA_START + lpos % cap, bytes));
            st.live.push_back(LiveChunk { lpos, seq, txg });
            st.head_lpos += len;
            st.next_seq += 1;
        }
        Ok(PlacedChunks { chunks })
    }

    /// Writes chunks placed by [`IntentLog::place_chunks`].
    pub fn write_placed(&self, placed: &PlacedChunks) -> Result<(), LogError> {
        fail::fail_point!("log.write", |_| blockdev::injected("log.write", 0).map_err(|e| self.io(e)));
        for (at, bytes) in &placed.chunks {
            self.dev.write_at(bytes, *at).map_err(|e| self.io(e))?;
        }
        Ok(())
    }

    /// Frees the chunks of txgs up to `synced` (their data is on the
    /// backing store and flushed) and records the new tail.
    pub fn release(&self, synced: u64) -> Result<(), LogError> {
        let mut st = self.st.lock();
        let before = st.hdr.tail_lpos;
        while st.live.front().is_some_and(|c| c.txg <= synced) {
            st.live.pop_front();
        }
        let (tail, seq) = match st.live.front() {
            Some(c) => (c.lpos, c.seq),
            None => (st.head_lpos, st.next_seq),
        };
        if tail == before {
            return Ok(());
        }
        st.hdr.tail_lpos = tail;
        st.hdr.tail_seq = seq;
        self.write_header(&mut st)
    }
}

/// Splits entries into groups whose chunk body stays within [`MAX_CHUNK`].
fn split(entries: &[Entry]) -> Vec<&[Entry]> {
    let mut out = Vec::new();
    let (mut start, mut size) = (0, 0usize);
    for (i, e) in entries.iter().enumerate() {
        let n = e.encoded_len();
        if size + n > MAX_CHUNK && i > start {
            out.push(&entries[start..i]);
            (start, size) = (i, 0);
        }
        size += n;
    }
    if start < entries.len() || out.is_empty() {
        out.push(&entries[start..]);
    }
    out
}

/// Where a chunk of `len` bytes goes when the head is at `head`: there, or
/// at the next lap's start when it would not fit before the end.
fn place(head: u64, len: u64, cap: u64) -> u64 {
    if head % cap + len > cap {
        (head / cap + 1) * cap
    } else {
        head
    }
}

fn chunk_len(entries: &[Entry]) -> u64 {
    let body: usize = entries.iter().map(Entry::encoded_len).sum();
    ((CHUNK_HEADER + body) as u64).next_multiple_of(ALIGN)
}

/// The newer valid header copy, if any. Read errors are errors; damage is
/// "no header".
pub fn read_header(dev: &dyn BlockDev) -> Result<Option<Header>, DevError> {
    let mut best: Option<Header> = None;
    for copy in 0..2u64 {
        let mut b = vec![0u8; HEADER_SIZE];
        dev.read_at(&mut b, copy * HEADER_SIZE as u64)?;
        if let Ok(h) = Header::decode(&b) {
            if best.as_ref().is_none_or(|x| h.header_seq > x.header_seq) {
                best = Some(h);
            }
        }
    }
    Ok(best)
}

/// Makes the log on `dev` empty: its writes are dropped for good.
pub fn forget(dev: Arc<dyn BlockDev>) -> Result<(), LogError> {
    let name = dev.describe();
    let zero = vec![0u8; 2 * HEADER_SIZE];
    dev.write_at(&zero, 0).map_err(|e| LogError::Io(name.clone(), e))?;
    dev.flush().map_err(|e| LogError::Io(name, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_keeps_chunks_within_the_limit() {
        let page = Entry::Page { export: 0, page: 0, mask: 0xff, data: vec![0; 4096] };
        let many = vec![page; 3000];
        let groups = split(&many);
        assert_eq!(groups.iter().map(|g| g.len()).sum::<usize>(), 3000);
        assert!(groups.iter().all(|g| chunk_len(g) <= (MAX_CHUNK + CHUNK_HEADER) as u64));
        assert_eq!(split(&[]).len(), 1);
    }
}
