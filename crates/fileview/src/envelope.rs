//! The envelope every view record carries, in RAM and on L2
//! (`docs/fileview.md`, section 5): which file version, kind and index the
//! payload belongs to. Object numbers are hashes and may collide; a record
//! whose envelope names another version is a miss, never another file's
//! bytes.

use arc_policy::key::view::Kind;
use arcache_engine::Record;

use crate::records::Fingerprint;

const MAGIC: [u8; 4] = *b"AVR1";
const VERSION: u8 = 1;
const FLAG_LZ4: u16 = 1;
pub const HEADER_LEN: usize = 64;

/// The version of a source file a record belongs to: the file and the
/// fingerprint its object number was made from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Version {
    pub dev: u64,
    pub born: Fingerprint,
}

impl Version {
    /// The object number of this version (36 bits of a hash).
    pub fn number(&self) -> u64 {
        let mut b = [0u8; 48];
        self.write_identity(&mut b);
        xxhash_rust::xxh3::xxh3_64(&b) & arc_policy::key::view::MAX_OBJECT
    }

    /// dev, ino, size, mtime, ctime: bytes 8..56 of the envelope.
    fn write_identity(&self, b: &mut [u8]) {
        let f = &self.born;
        b[0..8].copy_from_slice(&self.dev.to_le_bytes());
        b[8..16].copy_from_slice(&f.ino.to_le_bytes());
        b[16..24].copy_from_slice(&f.size.to_le_bytes());
        b[24..32].copy_from_slice(&f.mtime.0.to_le_bytes());
        b[32..36].copy_from_slice(&f.mtime.1.to_le_bytes());
        b[36..40].copy_from_slice(&f.ctime.1.to_le_bytes());
        b[40..48].copy_from_slice(&f.ctime.0.to_le_bytes());
    }
}

/// A view record of `payload`, compressed when `compress` and it pays (the
/// ARC's rule), kept uncompressed at the record level so its L2 copy
/// decodes without knowing its size.
pub fn seal(kind: Kind, v: &Version, index: u64, payload: &[u8], compress: bool) -> Record {
    let packed = compress.then(|| Record::new(payload, true)).filter(|r| r.is_compressed());
    let (flags, body) = match &packed {
        Some(r) => (FLAG_LZ4, r.stored()),
        None => (0, payload),
    };
    let mut b = Vec::with_capacity(HEADER_LEN + body.len());
    b.extend_from_slice(&MAGIC);
    b.push(VERSION);
    b.push(kind as u8);
    b.extend_from_slice(&flags.to_le_bytes());
    let mut id = [0u8; 48];
    v.write_identity(&mut id);
    b.extend_from_slice(&id);
    b.extend_from_slice(&(index as u32).to_le_bytes());
    b.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    b.extend_from_slice(body);
    Record::raw(b)
}

/// The payload of `bytes` if its envelope names `kind`, `v` and `index`.
pub fn open(bytes: &[u8], kind: Kind, v: &Version, index: u64) -> Option<Vec<u8>> {
    let h = bytes.get(..HEADER_LEN)?;
    let mut id = [0u8; 48];
    v.write_identity(&mut id);
    let u32_at = |at: usize| u32::from_le_bytes([h[at], h[at + 1], h[at + 2], h[at + 3]]);
    if h[0..4] != MAGIC
        || h[4] != VERSION
        || h[5] != kind as u8
        || h[8..56] != id
        || u64::from(u32_at(56)) != index
    {
        return None;
    }
    let flags = u16::from_le_bytes([h[6], h[7]]);
    let len = u32_at(60);
    let body = &bytes[HEADER_LEN..];
    if flags & FLAG_LZ4 != 0 {
        let r = Record::from_stored(body.into(), len, true).ok()?;
        r.to_vec().ok()
    } else if flags == 0 && body.len() == len as usize {
        Some(body.to_vec())
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn version(ino: u64, ctime_ns: u32) -> Version {
        Version { dev: 7, born: Fingerprint { size: 10, mtime: (5, 6), ctime: (8, ctime_ns), ino } }
    }

    #[test]
    fn a_record_opens_only_as_the_version_kind_and_index_it_was_sealed_for() {
        let v = version(3, 1);
        let payload: Vec<u8> = (0..5000u32).map(|i| (i % 7) as u8).collect();
        for compress in [false, true] {
            let r = seal(Kind::Data, &v, 9, &payload, compress);
            let bytes = r.to_vec().unwrap();
            assert_eq!(bytes.len() < payload.len(), compress, "compressed only when asked");
            assert_eq!(open(&bytes, Kind::Data, &v, 9).as_deref(), Some(&payload[..]));
            assert_eq!(open(&bytes, Kind::Data, &version(3, 2), 9), None, "another ctime");
            assert_eq!(open(&bytes, Kind::Data, &version(4, 1), 9), None, "another inode");
            assert_eq!(open(&bytes, Kind::Data, &v, 8), None, "another record");
            assert_eq!(open(&bytes, Kind::Attr, &v, 9), None, "another kind");
            assert_eq!(open(&bytes[..bytes.len() - 1], Kind::Data, &v, 9), None, "cut short");
        }
    }

    #[test]
    fn numbers_differ_by_version_and_fit_the_key() {
        let (a, b) = (version(3, 1), version(3, 2));
        assert_ne!(a.number(), b.number());
        assert_eq!(a.number(), version(3, 1).number(), "the same in every run");
        assert!(a.number() <= arc_policy::key::view::MAX_OBJECT);
    }
}
