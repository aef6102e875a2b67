//! The byte layout of the view's metadata records (`docs/fileview.md`,
//! section 3): what is kept in the ARC for a file's attributes, a chunk of
//! a directory listing and a file's extended attributes. Little-endian.

use std::fs::Metadata;
use std::os::unix::fs::MetadataExt;

/// A file's attributes as `lstat` gives them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attr {
    pub mode: u32,
    pub nlink: u32,
    pub uid: u32,
    pub gid: u32,
    pub rdev: u64,
    pub size: u64,
    pub blocks: u64,
    pub blksize: u32,
    pub atime: (i64, u32),
    pub mtime: (i64, u32),
    pub ctime: (i64, u32),
    pub ino: u64,
    /// Not stored in the record: the object is found by it before.
    pub dev: u64,
}

pub const ATTR_LEN: usize = 104;

/// What revalidation compares: a file whose fingerprint changed is another
/// version, whose cached records are dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fingerprint {
    pub size: u64,
    pub mtime: (i64, u32),
    pub ctime: (i64, u32),
    pub ino: u64,
}

impl Attr {
    pub fn from_metadata(m: &Metadata) -> Attr {
        Attr {
            mode: m.mode(),
            nlink: m.nlink() as u32,
            uid: m.uid(),
            gid: m.gid(),
            rdev: m.rdev(),
            size: m.size(),
            blocks: m.blocks(),
            blksize: m.blksize() as u32,
            atime: (m.atime(), m.atime_nsec() as u32),
            mtime: (m.mtime(), m.mtime_nsec() as u32),
            ctime: (m.ctime(), m.ctime_nsec() as u32),
            ino: m.ino(),
            dev: m.dev(),
        }
    }

    /// From `fstatat`'s answer (the metadata prefetch's, which has no
    /// `std::fs::Metadata`).
    pub fn from_stat(st: &libc::stat) -> Attr {
        #[allow(clippy::unnecessary_cast)]
        Attr {
            mode: st.st_mode as u32,
            nlink: st.st_nlink as u32,
            uid: st.st_uid,
            gid: st.st_gid,
            rdev: st.st_rdev as u64,
            size: st.st_size as u64,
            blocks: st.st_blocks as u64,
            blksize: st.st_blksize as u32,
            atime: (st.st_atime as i64, st.st_atime_nsec as u32),
            mtime: (st.st_mtime as i64, st.st_mtime_nsec as u32),
            ctime: (st.st_ctime as i64, st.st_ctime_nsec as u32),
            ino: st.st_ino as u64,
            dev: st.st_dev as u64,
        }
    }

    pub fn fingerprint(&self) -> Fingerprint {
        Fingerprint { size: self.size, mtime: self.mtime, ctime: self.ctime, ino: self.ino }
    }

    pub fn is_dir(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFDIR
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(ATTR_LEN);
        for v in [self.mode, self.nlink, self.uid, self.gid] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        for v in [self.rdev, self.size, self.blocks] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&self.blksize.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        for (sec, nsec) in [self.atime, self.mtime, self.ctime] {
            b.extend_from_slice(&sec.to_le_bytes());
            b.extend_from_slice(&nsec.to_le_bytes());
            b.extend_from_slice(&0u32.to_le_bytes());
        }
        b.extend_from_slice(&self.ino.to_le_bytes());
        debug_assert_eq!(b.len(), ATTR_LEN);
        b
    }

    pub fn decode(b: &[u8], dev: u64) -> Option<Attr> {
        if b.len() != ATTR_LEN {
            return None;
        }
        let mut r = Reader(b);
        let (mode, nlink, uid, gid) = (r.u32()?, r.u32()?, r.u32()?, r.u32()?);
        let (rdev, size, blocks) = (r.u64()?, r.u64()?, r.u64()?);
        let blksize = r.u32()?;
        r.u32()?;
        let mut times = [(0i64, 0u32); 3];
        for t in &mut times {
            *t = (r.u64()? as i64, r.u32()?);
            r.u32()?;
        }
        let ino = r.u64()?;
        Some(Attr {
            mode,
            nlink,
            uid,
            gid,
            rdev,
            size,
            blocks,
            blksize,
            atime: times[0],
            mtime: times[1],
            ctime: times[2],
            ino,
            dev,
        })
    }
}

/// One entry of a directory listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DirEntry {
    pub ino: u64,
    /// The `DT_*` value.
    pub dtype: u8,
    pub name: Vec<u8>,
}

/// A listing chunk's largest size: a huge directory is many records.
pub const CHUNK_BYTES: usize = 16 << 10;

/// Cuts a listing into chunk records: `u32 total`, `u32 here`, then per
/// entry `u64 ino`, `u8 type`, `u16 name_len`, the name.
pub fn encode_listing(entries: &[DirEntry]) -> Vec<Vec<u8>> {
    let total = entries.len() as u32;
    let mut chunks = Vec::new();
    let mut cur: Vec<u8> = Vec::new();
    let mut here = 0u32;
    let start = |c: &mut Vec<u8>| {
        c.clear();
        c.extend_from_slice(&total.to_le_bytes());
        c.extend_from_slice(&0u32.to_le_bytes());
    };
    start(&mut cur);
    for e in entries {
        let len = 11 + e.name.len();
        if here > 0 && cur.len() + len > CHUNK_BYTES {
            cur[4..8].copy_from_slice(&here.to_le_bytes());
            chunks.push(std::mem::take(&mut cur));
            start(&mut cur);
            here = 0;
        }
        cur.extend_from_slice(&e.ino.to_le_bytes());
        cur.push(e.dtype);
        cur.extend_from_slice(&(e.name.len() as u16).to_le_bytes());
        cur.extend_from_slice(&e.name);
        here += 1;
    }
    cur[4..8].copy_from_slice(&here.to_le_bytes());
    chunks.push(cur);
    chunks
}

/// Appends the entries of one chunk to `out`; the listing's total.
pub fn decode_chunk(b: &[u8], out: &mut Vec<DirEntry>) -> Option<u32> {
    let mut r = Reader(b);
    let total = r.u32()?;
    let here = r.u32()?;
    for _ in 0..here {
        let ino = r.u64()?;
        let dtype = r.u8()?;
        let len = r.u16()? as usize;
        out.push(DirEntry { ino, dtype, name: r.bytes(len)?.to_vec() });
    }
    Some(total)
}

/// All of a file's extended attributes: `u32 count`, then per attribute
/// `u16 name_len`, the name, `u32 value_len`, the value.
pub fn encode_xattrs(list: &[(Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&(list.len() as u32).to_le_bytes());
    for (name, value) in list {
        b.extend_from_slice(&(name.len() as u16).to_le_bytes());
        b.extend_from_slice(name);
        b.extend_from_slice(&(value.len() as u32).to_le_bytes());
        b.extend_from_slice(value);
    }
    b
}

pub fn decode_xattrs(b: &[u8]) -> Option<Vec<(Vec<u8>, Vec<u8>)>> {
    let mut r = Reader(b);
    let n = r.u32()?;
    let mut out = Vec::with_capacity(n.min(1024) as usize);
    for _ in 0..n {
        let nl = r.u16()? as usize;
        let name = r.bytes(nl)?.to_vec();
        let vl = r.u32()? as usize;
        out.push((name, r.bytes(vl)?.to_vec()));
    }
    Some(out)
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.bytes(1)?[0])
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.bytes(2)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.bytes(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.bytes(8)?.try_into().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attributes_round_trip() {
        let m = std::fs::symlink_metadata("/").unwrap();
        let a = Attr::from_metadata(&m);
        assert_eq!(Attr::decode(&a.encode(), a.dev), Some(a));
        assert_eq!(Attr::decode(&a.encode()[1..], a.dev), None);
    }

    #[test]
    fn a_long_listing_is_cut_into_chunks_that_decode_back() {
        let entries: Vec<DirEntry> = (0..5000u64)
            .map(|i| DirEntry {
                ino: i * 7,
                dtype: (i % 12) as u8,
                name: format!("file-{i:06}.png").into_bytes(),
            })
            .collect();
        let chunks = encode_listing(&entries);
        assert!(chunks.len() > 1 && chunks.iter().all(|c| c.len() <= CHUNK_BYTES));
        let mut back = Vec::new();
        for c in &chunks {
            assert_eq!(decode_chunk(c, &mut back), Some(5000));
        }
        assert_eq!(back, entries);
        let empty = encode_listing(&[]);
        assert_eq!(empty.len(), 1);
        let mut none = Vec::new();
        assert_eq!(decode_chunk(&empty[0], &mut none), Some(0));
        assert!(none.is_empty());
    }

    #[test]
    fn xattrs_round_trip_and_truncation_is_refused() {
        let list = vec![(b"user.a".to_vec(), b"1".to_vec()), (b"user.empty".to_vec(), Vec::new())];
        let b = encode_xattrs(&list);
        assert_eq!(decode_xattrs(&b), Some(list));
        assert_eq!(decode_xattrs(&b[..b.len() - 1]), None);
    }
}
