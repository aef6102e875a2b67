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
    /// The file's birth time (statx `btime`), where SOURCE keeps one; not
    /// stored in the record. With `(dev, ino)` it says which file this is:
    /// a freed inode number is soon given to another file, a birth time
    /// is not.
    pub born: Option<(i64, u32)>,
}

pub const ATTR_LEN: usize = 104;

/// A `SystemTime` as seconds and nanoseconds since the epoch.
fn unix_time(t: std::time::SystemTime) -> Option<(i64, u32)> {
    let d = t.duration_since(std::time::UNIX_EPOCH).ok()?;
    Some((i64::try_from(d.as_secs()).ok()?, d.subsec_nanos()))
}

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
            born: m.created().ok().and_then(unix_time),
        }
    }

    /// From `statx`'s answer (the metadata prefetch's, which has no
    /// `std::fs::Metadata`).
    pub fn from_statx(st: &libc::statx) -> Attr {
        let t = |t: libc::statx_timestamp| (t.tv_sec, t.tv_nsec);
        Attr {
            mode: u32::from(st.stx_mode),
            nlink: st.stx_nlink,
            uid: st.stx_uid,
            gid: st.stx_gid,
            rdev: libc::makedev(st.stx_rdev_major, st.stx_rdev_minor),
            size: st.stx_size,
            blocks: st.stx_blocks,
            blksize: st.stx_blksize,
            atime: t(st.stx_atime),
            mtime: t(st.stx_mtime),
            ctime: t(st.stx_ctime),
            ino: st.stx_ino,
            dev: libc::makedev(st.stx_dev_major, st.stx_dev_minor),
            born: (st.stx_mask & libc::STATX_BTIME != 0).then(|| t(st.stx_btime)),
        }
    }

    /// Whether `self` and `other` can be the same file: the same inode,
    /// and no birth times that differ (where either is unknown, the inode
    /// alone decides, as before birth times were kept).
    pub fn same_file(&self, dev: u64, ino: u64, born: Option<(i64, u32)>) -> bool {
        self.dev == dev && self.ino == ino && !matches!((self.born, born), (Some(a), Some(b)) if a != b)
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
            born: None,
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

    /// `lstat_at` (statx) and `from_metadata` (std's fstat) agree, the
    /// birth time included where the file system keeps one.
    #[test]
    fn statx_and_std_give_the_same_attributes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("f"), b"x").unwrap();
        let d = std::fs::File::open(dir.path()).unwrap();
        use std::os::fd::AsFd;
        let by_statx = crate::sys::lstat_at(d.as_fd(), std::ffi::OsStr::new("f")).unwrap();
        let by_std = Attr::from_metadata(&std::fs::symlink_metadata(dir.path().join("f")).unwrap());
        assert_eq!(by_statx, by_std);
        assert!(by_statx.same_file(by_std.dev, by_std.ino, by_std.born));
    }

    #[test]
    fn attributes_round_trip() {
        let m = std::fs::symlink_metadata("/").unwrap();
        // The birth time is the object's, not the record's.
        let a = Attr { born: None, ..Attr::from_metadata(&m) };
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
