//! Encoding and decoding of the log header and chunks, exactly as
//! `docs/intent-log.md` lays them out. Decoders trust nothing: every length
//! and position is checked before it is used.

use blockdev::le::{get_u16, get_u32, get_u64, put_bytes};
use blockdev::owner::Owner;
use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

pub const HEADER_SIZE: usize = 4096;
pub const DATA_START: u64 = 8192;
pub const ALIGN: u64 = 4096;
pub const PAGE: usize = 4096;
pub const SECTOR: usize = 512;
pub const CHUNK_HEADER: usize = 64;
pub const ENTRY_HEADER: usize = 24;
/// Largest chunk body; a bigger commit writes several chunks.
pub const MAX_CHUNK: usize = 4 << 20;
pub const MAX_EXPORTS: usize = 32;
const EXPORT_ENTRY: usize = 96;
const EXPORT_TABLE: usize = 128;
const NAME_MAX: usize = 64;
pub const HEADER_MAGIC: &[u8; 8] = b"ACZILHDR";
pub const CHUNK_MAGIC: &[u8; 8] = b"ACZILCHK";
const HEADER_SEED: u64 = 0x5A49_4C48_4452_0001;
pub const VERSION: u32 = 1;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FormatError {
    #[error("bad magic")]
    Magic,
    #[error("unsupported version {0}")]
    Version(u32),
    #[error("checksum mismatch")]
    Checksum,
    #[error("{0}")]
    Invalid(String),
}

fn invalid<T>(msg: impl Into<String>) -> Result<T, FormatError> {
    Err(FormatError::Invalid(msg.into()))
}

/// The seed of every chunk checksum of one incarnation of one log.
pub fn log_seed(uuid: u128, incarnation: u64) -> u64 {
    let mut b = [0u8; 24];
    b[..16].copy_from_slice(&uuid.to_le_bytes());
    b[16..].copy_from_slice(&incarnation.to_le_bytes());
    xxh3_64(&b)
}

/// An export whose writes the log may hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogExport {
    pub id: u16,
    pub name: String,
    pub identity: u64,
    pub size: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub uuid: u128,
    pub incarnation: u64,
    pub header_seq: u64,
    pub capacity: u64,
    pub tail_lpos: u64,
    pub tail_seq: u64,
    pub exports: Vec<LogExport>,
    /// Who wrote this header, and whether they had closed the log.
    pub owner: Owner,
}

impl Header {
    pub fn encode(&self) -> Result<Vec<u8>, FormatError> {
        if self.exports.len() > MAX_EXPORTS {
            return invalid(format!("at most {MAX_EXPORTS} exports can share an intent log"));
        }
        let mut b = vec![0u8; HEADER_SIZE];
        put_bytes(&mut b, 0, HEADER_MAGIC);
        put_bytes(&mut b, 8, &VERSION.to_le_bytes());
        put_bytes(&mut b, 12, &(self.exports.len() as u32).to_le_bytes());
        put_bytes(&mut b, 16, &self.uuid.to_le_bytes());
        put_bytes(&mut b, 32, &self.incarnation.to_le_bytes());
        put_bytes(&mut b, 40, &self.header_seq.to_le_bytes());
        put_bytes(&mut b, 48, &self.capacity.to_le_bytes());
        put_bytes(&mut b, 56, &self.tail_lpos.to_le_bytes());
        put_bytes(&mut b, 64, &self.tail_seq.to_le_bytes());
        for (i, e) in self.exports.iter().enumerate() {
            let o = EXPORT_TABLE + i * EXPORT_ENTRY;
            let name = e.name.as_bytes();
            if name.len() > NAME_MAX {
                return invalid(format!("export name {:?} is longer than {NAME_MAX} bytes", e.name));
            }
            put_bytes(&mut b, o, &e.id.to_le_bytes());
            b[o + 2] = name.len() as u8;
            put_bytes(&mut b, o + 8, &e.identity.to_le_bytes());
            put_bytes(&mut b, o + 16, &e.size.to_le_bytes());
            put_bytes(&mut b, o + 32, name);
        }
        self.owner.write(&mut b);
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
        put_bytes(b, HEADER_SIZE - 8, &sum.to_le_bytes());
    }

    pub fn decode(b: &[u8]) -> Result<Header, FormatError> {
        if b.len() < HEADER_SIZE {
            return invalid("short header");
        }
        if &b[..8] != HEADER_MAGIC {
            return Err(FormatError::Magic);
        }
        if xxh3_64_with_seed(&b[..HEADER_SIZE - 8], HEADER_SEED) != get_u64(b, HEADER_SIZE - 8) {
            return Err(FormatError::Checksum);
        }
        let version = get_u32(b, 8);
        if version != VERSION {
            return Err(FormatError::Version(version));
        }
        let n = get_u32(b, 12) as usize;
        if n > MAX_EXPORTS {
            return invalid(format!("{n} exports in the header"));
        }
        let mut exports = Vec::with_capacity(n);
        for i in 0..n {
            let o = EXPORT_TABLE + i * EXPORT_ENTRY;
            let len = b[o + 2] as usize;
            if len > NAME_MAX {
                return invalid("export name too long");
            }
            let name = std::str::from_utf8(&b[o + 32..o + 32 + len])
                .map_err(|_| FormatError::Invalid("export name is not UTF-8".into()))?;
            exports.push(LogExport {
                id: get_u16(b, o),
                name: name.to_string(),
                identity: get_u64(b, o + 8),
                size: get_u64(b, o + 16),
            });
        }
        let h = Header {
            uuid: u128::from_le_bytes(b[16..32].try_into().map_err(|_| FormatError::Invalid("uuid".into()))?),
            incarnation: get_u64(b, 32),
            header_seq: get_u64(b, 40),
            capacity: get_u64(b, 48),
            tail_lpos: get_u64(b, 56),
            tail_seq: get_u64(b, 64),
            exports,
            owner: Owner::read(b),
        };
        if h.capacity == 0 || !h.capacity.is_multiple_of(ALIGN) || !h.tail_lpos.is_multiple_of(ALIGN) {
            return invalid("geometry is not 4 KiB aligned");
        }
        Ok(h)
    }
}

/// One logged change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// The sectors of `mask` of 4 KiB page `page`, in ascending order.
    Page {
        export: u16,
        page: u64,
        mask: u8,
        data: Vec<u8>,
    },
    Zero {
        export: u16,
        offset: u64,
        len: u64,
    },
    Trim {
        export: u16,
        offset: u64,
        len: u64,
    },
}

impl Entry {
    pub fn encoded_len(&self) -> usize {
        match self {
            Entry::Page { mask, .. } => ENTRY_HEADER + mask.count_ones() as usize * SECTOR,
            _ => ENTRY_HEADER,
        }
    }

    pub fn export(&self) -> u16 {
        match self {
            Entry::Page { export, .. } | Entry::Zero { export, .. } | Entry::Trim { export, .. } => *export,
        }
    }

    /// The byte range of the export it changes.
    pub fn extent(&self) -> (u64, u64) {
        match self {
            Entry::Page { page, .. } => (page * PAGE as u64, PAGE as u64),
            Entry::Zero { offset, len, .. } | Entry::Trim { offset, len, .. } => (*offset, *len),
        }
    }

    fn encode_into(&self, out: &mut Vec<u8>) {
        let mut h = [0u8; ENTRY_HEADER];
        let (kind, mask, export, at, len) = match self {
            Entry::Page { export, page, mask, .. } => (1u8, *mask, *export, *page, 0),
            Entry::Zero { export, offset, len } => (2, 0, *export, *offset, *len),
            Entry::Trim { export, offset, len } => (3, 0, *export, *offset, *len),
        };
        h[0] = kind;
        h[1] = mask;
        put_bytes(&mut h, 2, &export.to_le_bytes());
        put_bytes(&mut h, 8, &at.to_le_bytes());
        put_bytes(&mut h, 16, &len.to_le_bytes());
        out.extend_from_slice(&h);
        if let Entry::Page { data, .. } = self {
            out.extend_from_slice(data);
        }
    }
}

/// What a chunk says about itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkInfo {
    pub seq: u64,
    pub lpos: u64,
    pub length: u32,
    pub txg: u64,
}

/// Chunk bytes, padded to 4 KiB. The caller keeps the body within
/// [`MAX_CHUNK`] and every page entry's data at `popcount(mask) × 512`.
pub fn encode_chunk(seed: u64, seq: u64, lpos: u64, txg: u64, entries: &[Entry]) -> Vec<u8> {
    let body: usize = entries.iter().map(Entry::encoded_len).sum();
    let length = (CHUNK_HEADER + body).div_ceil(ALIGN as usize) * ALIGN as usize;
    let mut b = Vec::with_capacity(length);
    b.resize(CHUNK_HEADER, 0);
    for e in entries {
        e.encode_into(&mut b);
    }
    b.resize(length, 0);
    put_bytes(&mut b, 0, CHUNK_MAGIC);
    put_bytes(&mut b, 8, &seq.to_le_bytes());
    put_bytes(&mut b, 16, &lpos.to_le_bytes());
    put_bytes(&mut b, 24, &(length as u32).to_le_bytes());
    put_bytes(&mut b, 28, &(entries.len() as u32).to_le_bytes());
    put_bytes(&mut b, 32, &txg.to_le_bytes());
    seal_chunk(&mut b, seed);
    b
}

/// Writes a chunk's two checksums (body, then the header that holds the
/// body's) under `seed`; lets the fuzzer and hand-made test chunks reach
/// the checks behind them. `b` shorter than a chunk header is left alone.
pub fn seal_chunk(b: &mut [u8], seed: u64) {
    if b.len() < CHUNK_HEADER {
        return;
    }
    let body_sum = xxh3_64_with_seed(&b[CHUNK_HEADER..], seed);
    put_bytes(b, 40, &body_sum.to_le_bytes());
    let head_sum = xxh3_64_with_seed(&b[..56], seed);
    put_bytes(b, 56, &head_sum.to_le_bytes());
}

/// Checks a chunk's header (the first 64 bytes) for the expected sequence
/// number and position; returns its length and txg.
pub fn decode_chunk_header(b: &[u8], seed: u64, seq: u64, lpos: u64) -> Result<ChunkInfo, FormatError> {
    if b.len() < CHUNK_HEADER {
        return invalid("short chunk header");
    }
    if &b[..8] != CHUNK_MAGIC {
        return Err(FormatError::Magic);
    }
    if xxh3_64_with_seed(&b[..56], seed) != get_u64(b, 56) {
        return Err(FormatError::Checksum);
    }
    let info =
        ChunkInfo { seq: get_u64(b, 8), lpos: get_u64(b, 16), length: get_u32(b, 24), txg: get_u64(b, 32) };
    if info.seq != seq || info.lpos != lpos {
        return invalid(format!("chunk {}@{} where {seq}@{lpos} was expected", info.seq, info.lpos));
    }
    let len = info.length as usize;
    if len < ALIGN as usize || !len.is_multiple_of(ALIGN as usize) || len > MAX_CHUNK + ALIGN as usize {
        return invalid(format!("chunk length {len}"));
    }
    Ok(info)
}

/// Checks the body checksum and decodes the entries of a whole chunk.
pub fn decode_chunk_body(b: &[u8], seed: u64) -> Result<Vec<Entry>, FormatError> {
    if b.len() < CHUNK_HEADER || b.len() != get_u32(b, 24) as usize {
        return invalid("chunk length does not match its header");
    }
    if xxh3_64_with_seed(&b[CHUNK_HEADER..], seed) != get_u64(b, 40) {
        return Err(FormatError::Checksum);
    }
    let count = get_u32(b, 28) as usize;
    let mut entries = Vec::with_capacity(count.min(b.len() / ENTRY_HEADER));
    let mut o = CHUNK_HEADER;
    for _ in 0..count {
        if o + ENTRY_HEADER > b.len() {
            return invalid("entry runs past the chunk");
        }
        let (kind, mask, export) = (b[o], b[o + 1], get_u16(b, o + 2));
        let (at, len) = (get_u64(b, o + 8), get_u64(b, o + 16));
        o += ENTRY_HEADER;
        let e = match kind {
            1 => {
                let n = mask.count_ones() as usize * SECTOR;
                if mask == 0 || len != 0 || o + n > b.len() || at > u64::MAX / PAGE as u64 {
                    return invalid("bad page entry");
                }
                let data = b[o..o + n].to_vec();
                o += n;
                Entry::Page { export, page: at, mask, data }
            }
            2 | 3 if at.checked_add(len).is_some() => {
                if kind == 2 {
                    Entry::Zero { export, offset: at, len }
                } else {
                    Entry::Trim { export, offset: at, len }
                }
            }
            _ => return invalid(format!("bad entry kind {kind}")),
        };
        entries.push(e);
    }
    Ok(entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<Entry> {
        vec![
            Entry::Trim { export: 1, offset: 8192, len: 1 << 20 },
            Entry::Zero { export: 0, offset: 0, len: 4096 },
            Entry::Page { export: 0, page: 7, mask: 0b1000_0001, data: vec![9u8; 1024] },
            Entry::Page { export: 1, page: 0, mask: 0xff, data: vec![1u8; 4096] },
        ]
    }

    #[test]
    fn chunk_roundtrip_and_rejections() {
        let seed = log_seed(42, 3);
        let b = encode_chunk(seed, 5, 8192, 11, &sample());
        assert_eq!(b.len() % 4096, 0);
        let info = decode_chunk_header(&b, seed, 5, 8192).unwrap();
        assert_eq!((info.length as usize, info.txg), (b.len(), 11));
        assert_eq!(decode_chunk_body(&b, seed).unwrap(), sample());
        assert!(decode_chunk_header(&b, seed, 6, 8192).is_err(), "wrong seq");
        assert!(decode_chunk_header(&b, seed, 5, 0).is_err(), "wrong position");
        assert_eq!(decode_chunk_header(&b, log_seed(42, 4), 5, 8192), Err(FormatError::Checksum));
        let mut bad = b.clone();
        bad[100] ^= 1;
        assert_eq!(decode_chunk_body(&bad, seed), Err(FormatError::Checksum));
    }

    #[test]
    fn header_roundtrip_and_damage() {
        let h = Header {
            uuid: 7 << 64 | 9,
            incarnation: 2,
            header_seq: 5,
            capacity: 1 << 20,
            tail_lpos: 4096,
            tail_seq: 3,
            exports: vec![LogExport { id: 0, name: "vm".into(), identity: 77, size: 1 << 30 }],
            owner: Owner {
                state: blockdev::owner::OwnerState::Closed,
                pid: 12,
                since: 1_800_000_000,
                host: "nas".into(),
            },
        };
        let b = h.encode().unwrap();
        assert_eq!(Header::decode(&b).unwrap(), h);
        let mut bad = b.clone();
        bad[60] ^= 4;
        assert_eq!(Header::decode(&bad), Err(FormatError::Checksum));
        assert_eq!(Header::decode(&[0u8; 4096]), Err(FormatError::Magic));
    }
}

#[cfg(test)]
mod seeds {
    /// Writes a valid chunk and header as fuzz seeds when asked
    /// (`ARCACHE_WRITE_FUZZ_SEEDS=DIR cargo test -p zil write_fuzz_seeds`).
    #[test]
    fn write_fuzz_seeds() {
        let Ok(dir) = std::env::var("ARCACHE_WRITE_FUZZ_SEEDS") else { return };
        let seed = super::log_seed(1, 2);
        let entries = vec![
            super::Entry::Zero { export: 0, offset: 0, len: 4096 },
            super::Entry::Page { export: 0, page: 3, mask: 0b11, data: vec![5; 1024] },
        ];
        std::fs::write(format!("{dir}/chunk"), super::encode_chunk(seed, 1, 0, 1, &entries)).unwrap();
        let h = super::Header {
            uuid: 1,
            incarnation: 2,
            header_seq: 1,
            capacity: 1 << 20,
            tail_lpos: 0,
            tail_seq: 1,
            exports: vec![super::LogExport { id: 0, name: "a".into(), identity: 1, size: 1 << 20 }],
            owner: Default::default(),
        };
        std::fs::write(format!("{dir}/header"), h.encode().unwrap()).unwrap();
    }
}
