//! Encoding and decoding of the on-disk structures of docs/format.md.
//! Decoders take untrusted bytes: they check lengths and checksums and
//! return errors, never panic.

use blockdev::le::{get_u16, get_u32, get_u64, put_u16, put_u32, put_u64};
use blockdev::owner::Owner;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed, Xxh3};

/// 2: a RAW blob of an even number of sectors has one 32-bit checksum per
/// half (see docs/format.md), so half of it can be read and verified alone.
pub const VERSION: u32 = 2;
pub const HEADER_MAGIC: u64 = u64::from_le_bytes(*b"ACRL2HDR");
pub const LOG_MAGIC: u64 = u64::from_le_bytes(*b"ACLOGBLK");
pub const HEADER_SIZE: usize = 4096;
/// Offsets of the two header copies.
pub const HEADER_OFFSETS: [u64; 2] = [0, 4096];
const HEADER_SEED: u64 = 0x41524341434845;
pub const MAX_EXPORTS: usize = 32;
const EXPORT_ENTRY: usize = 96;
const EXPORTS_AT: usize = 192;
const NAME_LEN: usize = 64;
/// The abandoned-logs block (docs/format.md).
const ABANDONED_AT: usize = 3416;
const ABANDONED_ENTRY: usize = 24;
pub const MAX_ABANDONED: usize = 16;

pub const LOG_HEADER: usize = 128;
pub const ENTRY_SIZE: usize = 32;
pub const MAX_ENTRIES: usize = 1024;
pub const MAX_LOG_ASIZE: u32 = 65536;
pub const PAGE: usize = 4096;
const LOG_CKSUM_AT: usize = 120;

pub const FLAG_PERSISTENT: u32 = 1;
pub const FLAG_FIRST_PASS: u32 = 2;

const SEED_MIX: u64 = 0x9E37_79B9_7F4A_7C15;

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FormatError {
    Short,
    Magic,
    Version(u32),
    Checksum,
    Corrupt(&'static str),
}

impl std::fmt::Display for FormatError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FormatError::Short => write!(f, "too short"),
            FormatError::Magic => write!(f, "bad magic"),
            FormatError::Version(v) => write!(f, "unsupported version {v}"),
            FormatError::Checksum => write!(f, "checksum mismatch"),
            FormatError::Corrupt(what) => write!(f, "corrupt: {what}"),
        }
    }
}

/// The seed of a payload checksum: binds a blob to its export and record.
pub fn payload_seed(identity: u64, record: u64) -> u64 {
    identity ^ record.wrapping_mul(SEED_MIX)
}

/// Whether a stored blob is checked half by half: RAW (the record's bytes,
/// unframed) and an even number of sectors, so each half starts on a sector.
pub fn split_blob(raw: bool, blob_len: u64) -> bool {
    raw && blob_len > 0 && blob_len.is_multiple_of(1024)
}

/// The 64-bit checksum of a stored blob under `seed`. A split blob's value
/// is two 32-bit halves, [`half_checksum`] of its first and second half.
pub fn blob_checksum(blob: &[u8], raw: bool, seed: u64) -> u64 {
    if !split_blob(raw, blob.len() as u64) {
        return xxh3_64_with_seed(blob, seed);
    }
    let (a, b) = blob.split_at(blob.len() / 2);
    u64::from(half_checksum(a, seed, 0)) | (u64::from(half_checksum(b, seed, 1)) << 32)
}

/// The 32-bit checksum of half `which` (0 or 1) of a split blob. Each half
/// has its own seed, so the halves of one record never stand in for each
/// other.
pub fn half_checksum(half: &[u8], seed: u64, which: u64) -> u32 {
    xxh3_64_with_seed(half, seed ^ (which + 1).wrapping_mul(SEED_MIX).rotate_left(17)) as u32
}

/// The seed of log block checksums of one incarnation of one device.
pub fn log_seed(uuid: u128, incarnation: u64) -> u64 {
    let mut b = [0u8; 24];
    b[..16].copy_from_slice(&uuid.to_le_bytes());
    b[16..].copy_from_slice(&incarnation.to_le_bytes());
    xxh3_64(&b)
}

/// Where a log block is and how to check it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogPtr {
    pub lpos: u64,
    pub seq: u64,
    pub asize: u32,
    pub cksum: u64,
}

impl LogPtr {
    pub fn is_none(&self) -> bool {
        self.asize == 0
    }
    fn read(b: &[u8], at: usize) -> LogPtr {
        LogPtr {
            lpos: get_u64(b, at),
            seq: get_u64(b, at + 8),
            asize: get_u32(b, at + 16),
            cksum: get_u64(b, at + 24),
        }
    }
    fn write(&self, b: &mut [u8], at: usize) {
        put_u64(b, at, self.lpos);
        put_u64(b, at + 8, self.seq);
        put_u32(b, at + 16, self.asize);
        put_u32(b, at + 20, 0);
        put_u64(b, at + 24, self.cksum);
    }
}

/// An export table entry of an NBD export's backing store.
pub const EXPORT_VOLUME: u16 = 0;
/// An export table entry of a file view: its entries carry whole view keys.
pub const EXPORT_VIEW: u16 = 1;

/// The identity of a backing store, as recorded in a device header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportId {
    pub tag: u16,
    /// [`EXPORT_VOLUME`] or [`EXPORT_VIEW`].
    pub kind: u16,
    pub recordsize: u32,
    pub size: u64,
    /// The seed of the records' checksums: fixed for the tag's life.
    pub identity: u64,
    /// What the store held when last bound (docs/format.md): restored only
    /// if the store holds the same at the next start.
    pub contents: u64,
    pub name: String,
}

impl ExportId {
    pub fn records(&self) -> u64 {
        if self.recordsize == 0 {
            return 0;
        }
        self.size.div_ceil(u64::from(self.recordsize))
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub flags: u32,
    pub uuid: u128,
    pub incarnation: u64,
    pub header_seq: u64,
    pub device_size: u64,
    pub start: u64,
    pub capacity: u64,
    pub hand_lpos: u64,
    pub evict_lpos: u64,
    pub next_seq: u64,
    pub horizon_seq: u64,
    pub newest: [LogPtr; 2],
    pub lb_count: u64,
    pub lb_asize: u64,
    /// The largest export tag ever given in this incarnation.
    pub last_tag: u16,
    pub exports: Vec<ExportId>,
    /// Who wrote this header, and whether they had closed the device.
    pub owner: Owner,
    /// Other devices' logs never to be restored, oldest first.
    pub abandoned: Vec<Abandoned>,
}

/// The log of one incarnation of a device taken out of service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Abandoned {
    pub uuid: u128,
    pub incarnation: u64,
}

impl Abandoned {
    pub fn of(h: &Header) -> Abandoned {
        Abandoned { uuid: h.uuid, incarnation: h.incarnation }
    }

    /// Adds `a` to `list` unless there, dropping the oldest beyond
    /// [`MAX_ABANDONED`]; true if it was added.
    pub fn add(list: &mut Vec<Abandoned>, a: Abandoned) -> bool {
        if list.contains(&a) {
            return false;
        }
        list.push(a);
        if list.len() > MAX_ABANDONED {
            list.remove(0);
        }
        true
    }
}

/// The magic of an abandoned-log mark file (docs/format.md,
/// "Abandoned-log marks").
pub const MARK_MAGIC: u64 = u64::from_le_bytes(*b"ACL2ABND");
/// Bytes of a mark file.
pub const MARK_SIZE: usize = 48;
const MARK_VERSION: u32 = 1;
/// Bytes of a mark its checksum covers: all before the checksum itself.
const MARK_SUMMED: usize = MARK_SIZE - 8;

impl Abandoned {
    /// The mark file's contents for this log.
    pub fn encode_mark(&self) -> [u8; MARK_SIZE] {
        let mut b = [0u8; MARK_SIZE];
        put_u64(&mut b, 0, MARK_MAGIC);
        put_u32(&mut b, 8, MARK_VERSION);
        b[16..32].copy_from_slice(&self.uuid.to_le_bytes());
        put_u64(&mut b, 32, self.incarnation);
        Abandoned::seal_mark(&mut b);
        b
    }

    /// Writes a mark's checksum over its first 40 bytes (tests and fuzzing
    /// reach the field checks this way); shorter input is left alone.
    pub fn seal_mark(b: &mut [u8]) {
        if b.len() >= MARK_SIZE {
            let sum = xxh3_64(&b[..MARK_SUMMED]);
            put_u64(b, MARK_SUMMED, sum);
        }
    }

    /// Reads a mark file's contents.
    pub fn decode_mark(b: &[u8]) -> Result<Abandoned, FormatError> {
        if b.len() != MARK_SIZE {
            return Err(FormatError::Corrupt("mark size"));
        }
        if get_u64(b, MARK_SUMMED) != xxh3_64(&b[..MARK_SUMMED]) {
            return Err(FormatError::Checksum);
        }
        if get_u64(b, 0) != MARK_MAGIC {
            return Err(FormatError::Corrupt("mark magic"));
        }
        if get_u32(b, 8) != MARK_VERSION {
            return Err(FormatError::Corrupt("mark version"));
        }
        if get_u32(b, 12) != 0 {
            return Err(FormatError::Corrupt("mark reserved bytes"));
        }
        let mut id = [0u8; 16];
        id.copy_from_slice(&b[16..32]);
        Ok(Abandoned { uuid: u128::from_le_bytes(id), incarnation: get_u64(b, 32) })
    }

    /// The mark file's name for this log.
    pub fn mark_name(&self) -> String {
        format!("{:032x}-{:016x}.abandoned", self.uuid, self.incarnation)
    }

    /// The log a mark file's name refuses, if it is a mark's name.
    pub fn from_mark_name(name: &str) -> Option<Abandoned> {
        let stem = name.strip_suffix(".abandoned")?;
        let (uuid, inc) = stem.split_once('-')?;
        let hex =
            |s: &str, n: usize| s.len() == n && s.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
        if !hex(uuid, 32) || !hex(inc, 16) {
            return None;
        }
        Some(Abandoned {
            uuid: u128::from_str_radix(uuid, 16).ok()?,
            incarnation: u64::from_str_radix(inc, 16).ok()?,
        })
    }
}

impl Header {
    pub fn persistent(&self) -> bool {
        self.flags & FLAG_PERSISTENT != 0
    }

    pub fn encode(&self) -> Result<Vec<u8>, FormatError> {
        if self.exports.len() > MAX_EXPORTS {
            return Err(FormatError::Corrupt("too many exports"));
        }
        if self.abandoned.len() > MAX_ABANDONED {
            return Err(FormatError::Corrupt("too many abandoned logs"));
        }
        let mut b = vec![0u8; HEADER_SIZE];
        put_u64(&mut b, 0, HEADER_MAGIC);
        put_u32(&mut b, 8, VERSION);
        put_u32(&mut b, 12, self.flags);
        b[16..32].copy_from_slice(&self.uuid.to_le_bytes());
        put_u64(&mut b, 32, self.incarnation);
        put_u64(&mut b, 40, self.header_seq);
        put_u64(&mut b, 48, self.device_size);
        put_u64(&mut b, 56, self.start);
        put_u64(&mut b, 64, self.capacity);
        put_u64(&mut b, 72, self.hand_lpos);
        put_u64(&mut b, 80, self.evict_lpos);
        put_u64(&mut b, 88, self.next_seq);
        put_u64(&mut b, 96, self.horizon_seq);
        self.newest[0].write(&mut b, 104);
        self.newest[1].write(&mut b, 136);
        put_u64(&mut b, 168, self.lb_count);
        put_u64(&mut b, 176, self.lb_asize);
        put_u32(&mut b, 184, self.exports.len() as u32);
        put_u32(&mut b, 188, u32::from(self.last_tag));
        for (i, e) in self.exports.iter().enumerate() {
            let at = EXPORTS_AT + i * EXPORT_ENTRY;
            put_u16(&mut b, at, e.tag);
            put_u16(&mut b, at + 2, e.kind);
            put_u32(&mut b, at + 4, e.recordsize);
            put_u64(&mut b, at + 8, e.size);
            put_u64(&mut b, at + 16, e.identity);
            put_u64(&mut b, at + 24, e.contents);
            let name = truncate_utf8(&e.name, NAME_LEN);
            b[at + 32..at + 32 + name.len()].copy_from_slice(name.as_bytes());
        }
        self.owner.write(&mut b);
        put_u32(&mut b, ABANDONED_AT, self.abandoned.len() as u32);
        for (i, a) in self.abandoned.iter().enumerate() {
            let at = ABANDONED_AT + 8 + i * ABANDONED_ENTRY;
            b[at..at + 16].copy_from_slice(&a.uuid.to_le_bytes());
            put_u64(&mut b, at + 16, a.incarnation);
        }
        Self::seal(&mut b);
        Ok(b)
    }

    /// Writes the checksum that the first [`HEADER_SIZE`] bytes of `b`
    /// carry when sealed; lets the fuzzer and hand-made test headers reach
    /// the checks behind it. `b` shorter than a header is left alone.
    pub fn seal(b: &mut [u8]) {
        if b.len() < HEADER_SIZE {
            return;
        }
        let sum = xxh3_64_with_seed(&b[..HEADER_SIZE - 8], HEADER_SEED);
        put_u64(b, HEADER_SIZE - 8, sum);
    }

    pub fn decode(b: &[u8]) -> Result<Header, FormatError> {
        if b.len() < HEADER_SIZE {
            return Err(FormatError::Short);
        }
        if get_u64(b, 0) != HEADER_MAGIC {
            return Err(FormatError::Magic);
        }
        if xxh3_64_with_seed(&b[..HEADER_SIZE - 8], HEADER_SEED) != get_u64(b, HEADER_SIZE - 8) {
            return Err(FormatError::Checksum);
        }
        let version = get_u32(b, 8);
        if version != VERSION {
            return Err(FormatError::Version(version));
        }
        let n = get_u32(b, 184) as usize;
        if n > MAX_EXPORTS {
            return Err(FormatError::Corrupt("export count"));
        }
        let abandoned_count = get_u32(b, ABANDONED_AT) as usize;
        if abandoned_count > MAX_ABANDONED {
            return Err(FormatError::Corrupt("abandoned log count"));
        }
        let abandoned = (0..abandoned_count)
            .map(|i| {
                let at = ABANDONED_AT + 8 + i * ABANDONED_ENTRY;
                let mut id = [0u8; 16];
                id.copy_from_slice(&b[at..at + 16]);
                Abandoned { uuid: u128::from_le_bytes(id), incarnation: get_u64(b, at + 16) }
            })
            .collect();
        let mut uuid = [0u8; 16];
        uuid.copy_from_slice(&b[16..32]);
        let exports = (0..n)
            .map(|i| {
                let at = EXPORTS_AT + i * EXPORT_ENTRY;
                let raw = &b[at + 32..at + 32 + NAME_LEN];
                let len = raw.iter().position(|&c| c == 0).unwrap_or(NAME_LEN);
                ExportId {
                    tag: get_u16(b, at),
                    kind: get_u16(b, at + 2),
                    recordsize: get_u32(b, at + 4),
                    size: get_u64(b, at + 8),
                    identity: get_u64(b, at + 16),
                    // Reserved (0) before stores could follow their
                    // contents: those entries were bound to the identity.
                    contents: match get_u64(b, at + 24) {
                        0 => get_u64(b, at + 16),
                        c => c,
                    },
                    name: String::from_utf8_lossy(&raw[..len]).into_owned(),
                }
            })
            .collect();
        Ok(Header {
            flags: get_u32(b, 12),
            uuid: u128::from_le_bytes(uuid),
            incarnation: get_u64(b, 32),
            header_seq: get_u64(b, 40),
            device_size: get_u64(b, 48),
            start: get_u64(b, 56),
            capacity: get_u64(b, 64),
            hand_lpos: get_u64(b, 72),
            evict_lpos: get_u64(b, 80),
            next_seq: get_u64(b, 88),
            horizon_seq: get_u64(b, 96),
            newest: [LogPtr::read(b, 104), LogPtr::read(b, 136)],
            lb_count: get_u64(b, 168),
            lb_asize: get_u64(b, 176),
            last_tag: get_u32(b, 188).min(u32::from(u16::MAX)) as u16,
            exports,
            owner: Owner::read(b),
            abandoned,
        })
    }
}

/// An export's name as its table entry keeps it: cut to the entry's 64
/// bytes (at a character boundary). Names are matched in this form, or an
/// export with a longer name (a file view of a deep path) would find its
/// entry under another name at every start and never be restored.
pub fn table_name(name: &str) -> &str {
    truncate_utf8(name, NAME_LEN)
}

fn truncate_utf8(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    Cached,
    Invalidate,
}

pub const EF_RAW: u8 = 1;
pub const EF_COMPRESSED: u8 = 2;
pub const EF_PREFETCH: u8 = 4;
pub const EF_MFU: u8 = 8;

/// One log entry: a record copy on the device, or a range of records whose
/// older entries are dead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    pub kind: EntryKind,
    pub flags: u8,
    pub lshift: u8,
    pub tag: u16,
    pub blob_sectors: u16,
    pub record: u64,
    /// CACHED: lpos of the blob; INVALIDATE: number of records.
    pub lpos_or_count: u64,
    pub cksum: u64,
}

impl Entry {
    fn write(&self, b: &mut [u8]) {
        b[0] = match self.kind {
            EntryKind::Cached => 1,
            EntryKind::Invalidate => 2,
        };
        b[1] = self.flags;
        b[2] = self.lshift;
        b[3] = 0;
        put_u16(b, 4, self.tag);
        put_u16(b, 6, self.blob_sectors);
        put_u64(b, 8, self.record);
        put_u64(b, 16, self.lpos_or_count);
        put_u64(b, 24, self.cksum);
    }
    fn read(b: &[u8]) -> Result<Entry, FormatError> {
        let kind = match b[0] {
            1 => EntryKind::Cached,
            2 => EntryKind::Invalidate,
            _ => return Err(FormatError::Corrupt("entry kind")),
        };
        Ok(Entry {
            kind,
            flags: b[1],
            lshift: b[2],
            tag: get_u16(b, 4),
            blob_sectors: get_u16(b, 6),
            record: get_u64(b, 8),
            lpos_or_count: get_u64(b, 16),
            cksum: get_u64(b, 24),
        })
    }
}

/// The checksum of a log block's bytes, its own checksum field read as
/// zero; hashed in pieces so checking a block needs no copy of it.
fn block_checksum(b: &[u8], seed: u64) -> u64 {
    let mut h = Xxh3::with_seed(seed);
    h.update(&b[..LOG_CKSUM_AT]);
    h.update(&[0u8; 8]);
    h.update(&b[LOG_CKSUM_AT + 8..]);
    h.digest()
}

/// A decoded log block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogBlock {
    pub seq: u64,
    pub lpos: u64,
    pub payload_start: u64,
    pub prev: LogPtr,
    pub compressed: bool,
    pub entries: Vec<Entry>,
}

impl LogBlock {
    /// Encodes the block, padded to whole pages; returns the bytes and the
    /// pointer that names it.
    pub fn encode(&self, seed: u64) -> (Vec<u8>, LogPtr) {
        assert!(self.entries.len() <= MAX_ENTRIES);
        let mut raw = vec![0u8; self.entries.len() * ENTRY_SIZE];
        for (e, chunk) in self.entries.iter().zip(raw.chunks_mut(ENTRY_SIZE)) {
            e.write(chunk);
        }
        let plain_pages = (LOG_HEADER + raw.len()).div_ceil(PAGE);
        let packed = lz4_flex::block::compress(&raw);
        let use_lz4 = (LOG_HEADER + packed.len()).div_ceil(PAGE) < plain_pages;
        let body: &[u8] = if use_lz4 { &packed } else { &raw };
        let asize = (LOG_HEADER + body.len()).div_ceil(PAGE) * PAGE;
        let mut b = vec![0u8; asize];
        put_u64(&mut b, 0, LOG_MAGIC);
        put_u32(&mut b, 8, VERSION);
        put_u32(&mut b, 12, u32::from(use_lz4));
        put_u64(&mut b, 16, self.seq);
        put_u64(&mut b, 24, self.lpos);
        put_u64(&mut b, 32, self.payload_start);
        put_u32(&mut b, 40, self.entries.len() as u32);
        put_u32(&mut b, 44, body.len() as u32);
        put_u32(&mut b, 48, raw.len() as u32);
        self.prev.write(&mut b, 56);
        b[LOG_HEADER..LOG_HEADER + body.len()].copy_from_slice(body);
        let sum = Self::seal(&mut b, seed);
        let ptr = LogPtr { lpos: self.lpos, seq: self.seq, asize: asize as u32, cksum: sum };
        (b, ptr)
    }

    /// Writes the checksum a block of these bytes carries under `seed` and
    /// returns it (0 for bytes too short to be a block); lets the fuzzer and
    /// hand-made test blocks reach the checks behind it.
    pub fn seal(b: &mut [u8], seed: u64) -> u64 {
        if b.len() < LOG_HEADER {
            return 0;
        }
        let sum = block_checksum(b, seed);
        put_u64(b, LOG_CKSUM_AT, sum);
        sum
    }

    /// Checks `b` against the pointer that led to it and decodes it.
    pub fn decode(b: &[u8], expect: &LogPtr, seed: u64) -> Result<LogBlock, FormatError> {
        if b.len() < LOG_HEADER || b.len() != expect.asize as usize {
            return Err(FormatError::Short);
        }
        let stored = get_u64(b, LOG_CKSUM_AT);
        if stored != expect.cksum || block_checksum(b, seed) != stored {
            return Err(FormatError::Checksum);
        }
        Self::decode_unchecked(b)
    }

    /// Decodes bytes whose checksum was checked (or, in tests, that lie).
    fn decode_unchecked(b: &[u8]) -> Result<LogBlock, FormatError> {
        if b.len() < LOG_HEADER {
            return Err(FormatError::Short);
        }
        if get_u64(b, 0) != LOG_MAGIC {
            return Err(FormatError::Magic);
        }
        let version = get_u32(b, 8);
        if version != VERSION {
            return Err(FormatError::Version(version));
        }
        let count = get_u32(b, 40) as usize;
        let body_len = get_u32(b, 44) as usize;
        let raw_len = get_u32(b, 48) as usize;
        if count > MAX_ENTRIES || raw_len != count * ENTRY_SIZE || LOG_HEADER + body_len > b.len() {
            return Err(FormatError::Corrupt("log block sizes"));
        }
        let body = &b[LOG_HEADER..LOG_HEADER + body_len];
        let compressed = get_u32(b, 12) & 1 != 0;
        let raw: std::borrow::Cow<[u8]> = if compressed {
            let mut out = vec![0u8; raw_len];
            match lz4_flex::block::decompress_into(body, &mut out) {
                Ok(n) if n == raw_len => out.into(),
                _ => return Err(FormatError::Corrupt("log block body does not decompress")),
            }
        } else if body_len == raw_len {
            body.into()
        } else {
            return Err(FormatError::Corrupt("log block body length"));
        };
        let entries = raw.chunks(ENTRY_SIZE).map(Entry::read).collect::<Result<Vec<_>, _>>()?;
        Ok(LogBlock {
            seq: get_u64(b, 16),
            lpos: get_u64(b, 24),
            payload_start: get_u64(b, 32),
            prev: LogPtr::read(b, 56),
            compressed,
            entries,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_checksum_is_two_halves_that_cannot_stand_in_for_each_other() {
        let blob: Vec<u8> = (0..16384u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let seed = payload_seed(42, 7);
        let c = blob_checksum(&blob, true, seed);
        let (a, b) = blob.split_at(8192);
        assert_eq!(c as u32, half_checksum(a, seed, 0));
        assert_eq!((c >> 32) as u32, half_checksum(b, seed, 1));
        // Swapped halves, another record's seed, or a framed blob all differ.
        let swapped = [b, a].concat();
        assert_ne!(blob_checksum(&swapped, true, seed), c);
        assert_ne!(half_checksum(a, seed, 1), c as u32);
        assert_ne!(blob_checksum(&blob, true, payload_seed(42, 8)), c);
        assert_eq!(blob_checksum(&blob, false, seed), xxh3_64_with_seed(&blob, seed));
        // An odd number of sectors is never split.
        assert!(split_blob(true, 1024) && !split_blob(true, 1536) && !split_blob(false, 16384));
    }

    fn header() -> Header {
        Header {
            flags: FLAG_PERSISTENT,
            uuid: 0x1234_5678_9abc_def0_1122_3344_5566_7788,
            incarnation: 42,
            header_seq: 7,
            device_size: 1 << 30,
            start: 1 << 20,
            capacity: (1 << 30) - (1 << 20),
            hand_lpos: 5 << 20,
            evict_lpos: 69 << 20,
            next_seq: 12,
            horizon_seq: 3,
            newest: [
                LogPtr { lpos: 4 << 20, seq: 11, asize: 8192, cksum: 99 },
                LogPtr { lpos: 3 << 20, seq: 10, asize: 4096, cksum: 98 },
            ],
            lb_count: 9,
            lb_asize: 9 * 4096,
            last_tag: 1,
            exports: vec![ExportId {
                kind: EXPORT_VOLUME,
                tag: 1,
                recordsize: 131072,
                size: 1 << 40,
                identity: 0xfeed,
                contents: 0xbeef,
                name: "disk0".into(),
            }],
            owner: Owner {
                state: blockdev::owner::OwnerState::InUse,
                pid: 77,
                since: 1_800_000_000,
                host: "nas".into(),
            },
            abandoned: vec![
                Abandoned { uuid: 0xaaaa_0000_0000_0001, incarnation: 9 },
                Abandoned { uuid: u128::MAX - 3, incarnation: u64::MAX },
            ],
        }
    }

    #[test]
    fn the_abandoned_logs_block_holds_sixteen_and_refuses_more() {
        let mut h = header();
        h.abandoned = (0..MAX_ABANDONED as u64)
            .map(|i| Abandoned { uuid: u128::from(i) << 70, incarnation: i })
            .collect();
        let b = h.encode().unwrap();
        assert_eq!(Header::decode(&b).unwrap(), h);
        // The block ends where the reserved bytes begin.
        assert!(b[ABANDONED_AT + 8 + MAX_ABANDONED * ABANDONED_ENTRY..HEADER_SIZE - 8]
            .iter()
            .all(|&x| x == 0));
        let mut bad = b.clone();
        put_u32(&mut bad, ABANDONED_AT, MAX_ABANDONED as u32 + 1);
        Header::seal(&mut bad);
        assert_eq!(Header::decode(&bad), Err(FormatError::Corrupt("abandoned log count")));
        h.abandoned.push(Abandoned { uuid: 1, incarnation: 1 });
        assert!(h.encode().is_err());
    }

    #[test]
    fn an_export_entry_written_before_the_contents_field_reads_as_bound_to_its_identity() {
        let h = header();
        let mut b = h.encode().unwrap();
        assert_eq!(get_u64(&b, EXPORTS_AT + 24), 0xbeef, "contents not at offset 24");
        assert_eq!(Header::decode(&b).unwrap().exports[0].contents, 0xbeef);
        put_u64(&mut b, EXPORTS_AT + 24, 0);
        Header::seal(&mut b);
        let old = Header::decode(&b).unwrap();
        assert_eq!(old.exports[0].contents, 0xfeed);
        assert_eq!(old.exports[0].identity, 0xfeed);
    }

    #[test]
    fn adding_an_abandoned_log_keeps_the_newest_sixteen_once_each() {
        let mut list = Vec::new();
        for i in 0..20u64 {
            assert!(Abandoned::add(&mut list, Abandoned { uuid: 7, incarnation: i }));
        }
        assert!(!Abandoned::add(&mut list, Abandoned { uuid: 7, incarnation: 19 }), "added twice");
        assert_eq!(list.len(), MAX_ABANDONED);
        assert_eq!(list[0].incarnation, 4, "not the oldest dropped");
    }

    #[test]
    fn a_mark_round_trips_and_refuses_damage() {
        let a = Abandoned { uuid: 0x0123_4567_89ab_cdef_0011_2233_4455_6677, incarnation: 42 };
        let b = a.encode_mark();
        assert_eq!(Abandoned::decode_mark(&b), Ok(a));
        let mut bad = b;
        bad[20] ^= 1;
        assert_eq!(Abandoned::decode_mark(&bad), Err(FormatError::Checksum));
        assert!(Abandoned::decode_mark(&b[..47]).is_err());
        let mut reserved = b;
        reserved[13] = 1;
        Abandoned::seal_mark(&mut reserved);
        assert_eq!(Abandoned::decode_mark(&reserved), Err(FormatError::Corrupt("mark reserved bytes")));
        let name = a.mark_name();
        assert_eq!(name, "0123456789abcdef0011223344556677-000000000000002a.abandoned");
        assert_eq!(Abandoned::from_mark_name(&name), Some(a));
        for other in
            ["x.abandoned", "0123-2a.abandoned", &name.to_uppercase(), &name.replace(".abandoned", ".tmp")]
        {
            assert_eq!(Abandoned::from_mark_name(other), None, "{other}");
        }
    }

    #[test]
    fn a_header_from_before_the_block_reads_as_none_abandoned() {
        let mut h = header();
        h.abandoned.clear();
        let b = h.encode().unwrap();
        assert!(b[ABANDONED_AT..ABANDONED_AT + 392].iter().all(|&x| x == 0));
        assert!(Header::decode(&b).unwrap().abandoned.is_empty());
    }

    #[test]
    fn header_round_trips_and_detects_damage() {
        let h = header();
        let b = h.encode().unwrap();
        assert_eq!(b.len(), HEADER_SIZE);
        assert_eq!(Header::decode(&b).unwrap(), h);
        for at in [0usize, 9, 50, 200, 4000, 4090] {
            let mut bad = b.clone();
            bad[at] ^= 0x10;
            assert!(Header::decode(&bad).is_err(), "flip at {at} accepted");
        }
        assert_eq!(Header::decode(&b[..100]), Err(FormatError::Short));
    }

    fn block(n: usize) -> LogBlock {
        LogBlock {
            seq: 5,
            lpos: 1 << 24,
            payload_start: 1 << 20,
            prev: LogPtr { lpos: 1 << 22, seq: 3, asize: 4096, cksum: 1 },
            compressed: false,
            entries: (0..n as u64)
                .map(|i| Entry {
                    kind: if i % 10 == 9 { EntryKind::Invalidate } else { EntryKind::Cached },
                    flags: EF_RAW,
                    lshift: 0,
                    tag: 1,
                    blob_sectors: 8,
                    record: i,
                    lpos_or_count: (1 << 20) + i * 4096,
                    cksum: i.wrapping_mul(0x1234_5678_9abc),
                })
                .collect(),
        }
    }

    #[test]
    fn log_block_round_trips_compressed_and_bound_to_its_seed() {
        let blk = block(MAX_ENTRIES);
        let seed = log_seed(7, 8);
        let (bytes, ptr) = blk.encode(seed);
        assert!(bytes.len() < LOG_HEADER + MAX_ENTRIES * ENTRY_SIZE, "LZ4 should shrink sequential entries");
        let back = LogBlock::decode(&bytes, &ptr, seed).unwrap();
        assert!(back.compressed);
        assert_eq!(back.entries, blk.entries);
        assert_eq!(LogBlock::decode(&bytes, &ptr, log_seed(7, 9)), Err(FormatError::Checksum));
        let mut bad = bytes.clone();
        bad[LOG_HEADER + 3] ^= 1;
        assert_eq!(LogBlock::decode(&bad, &ptr, seed), Err(FormatError::Checksum));
    }

    #[test]
    fn empty_and_small_blocks_take_one_page() {
        let seed = log_seed(1, 1);
        for n in [0, 1, 100] {
            let (bytes, ptr) = block(n).encode(seed);
            assert_eq!(bytes.len(), PAGE);
            assert_eq!(LogBlock::decode(&bytes, &ptr, seed).unwrap().entries.len(), n);
        }
    }

    #[test]
    fn decoders_survive_garbage() {
        let seed = log_seed(1, 1);
        let (mut bytes, _) = block(50).encode(seed);
        // Lie about sizes with a matching checksum: must be an error, not a panic.
        put_u32(&mut bytes, 44, 1 << 30);
        assert!(LogBlock::decode_unchecked(&bytes).is_err());
        put_u32(&mut bytes, 44, 100);
        put_u32(&mut bytes, 12, 1);
        assert!(LogBlock::decode_unchecked(&bytes).is_err());
        assert!(Header::decode(&[0u8; 4096]).is_err());
    }
}
