use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use crate::lock::{self, DevLock};
use crate::{check_range, write_zeroes_by_writing, Alloc, BlockDev, DevError, DevResult};

/// O_DIRECT needs buffers, offsets and lengths aligned to the logical block
/// size; 4 KiB satisfies every device we meet.
pub(crate) const DIRECT_ALIGN: usize = 4096;

#[derive(Debug, Clone, Copy, Default)]
pub struct FileDevOptions {
    /// Bypass the kernel page cache for aligned IO (O_DIRECT).
    pub direct: bool,
    pub read_only: bool,
    /// Create a regular file of this size if the path does not exist.
    pub create_size: Option<u64>,
    /// Aligned writes are durable when they return (O_DSYNC on the O_DIRECT
    /// descriptor): one request instead of a write and a flush, for logs.
    pub sync_writes: bool,
    /// How the device is held against other servers, taken before anything
    /// is written (see `lock.rs`).
    pub lock: DevLock,
}

/// A regular file or a block device.
pub struct FileDev {
    path: PathBuf,
    buffered: File,
    /// A second descriptor with O_DIRECT, used for aligned requests only;
    /// unaligned ones go through `buffered` (the kernel keeps both coherent).
    direct: Option<File>,
    size: u64,
    is_block: bool,
    read_only: bool,
    /// With `sync_writes`: set when a write went through the buffered
    /// descriptor, which only a flush makes durable. Handed from writers to
    /// whichever thread flushes: arcache-sync's, so shuttle sees it.
    buffered_dirty: arcache_sync::atomic::AtomicBool,
    sync_writes: bool,
    /// Cleared when the file system refused a hole punch or zero range:
    /// zeroing is no longer offered as fast.
    fast_zero_works: std::sync::atomic::AtomicBool,
}

fn io_err(op: &'static str, dev: &Path, offset: u64, len: u64, source: io::Error) -> DevError {
    DevError::Io { op, dev: dev.display().to_string(), offset, len, source }
}

fn block_device_size(f: &File) -> io::Result<u64> {
    const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which is valid.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), BLKGETSIZE64, &mut size as *mut u64) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(size)
}

fn fallocate(f: &File, mode: libc::c_int, offset: u64, len: u64) -> io::Result<()> {
    // SAFETY: plain syscall on an owned descriptor.
    let rc = unsafe { libc::fallocate(f.as_raw_fd(), mode, offset as libc::off_t, len as libc::off_t) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn range_ioctl(f: &File, request: libc::c_ulong, offset: u64, len: u64) -> io::Result<()> {
    let range: [u64; 2] = [offset, len];
    // SAFETY: BLKDISCARD/BLKZEROOUT read two u64 through the pointer.
    let rc = unsafe { libc::ioctl(f.as_raw_fd(), request, range.as_ptr()) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Most extents one answer lists; a client asks again for the rest.
const MAX_EXTENTS: usize = 1024;

/// Data and holes of a regular file over `[start, end)` by SEEK_DATA and
/// SEEK_HOLE. A file system without them reports all data.
fn extents_by_seek(f: &File, start: u64, end: u64) -> io::Result<Vec<(u64, Alloc)>> {
    let seek = |whence: libc::c_int, at: u64| -> io::Result<Option<u64>> {
        // SAFETY: lseek on an owned descriptor; the offset is only read back.
        // pread/pwrite elsewhere do not use the file position.
        let r = unsafe { libc::lseek(f.as_raw_fd(), at as libc::off_t, whence) };
        if r >= 0 {
            return Ok(Some(r as u64));
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            // ENXIO: no data (SEEK_DATA) past `at`; the rest is a hole.
            Some(libc::ENXIO) => Ok(None),
            _ => Err(e),
        }
    };
    let mut out: Vec<(u64, Alloc)> = Vec::new();
    let mut at = start;
    while at < end && out.len() < MAX_EXTENTS {
        let data = match seek(libc::SEEK_DATA, at) {
            Ok(d) => d.unwrap_or(end).min(end),
            Err(e) if unsupported(&e) => return Ok(vec![(end - start, Alloc::Data)]),
            Err(e) => return Err(e),
        };
        if data > at {
            out.push((data - at, Alloc::Hole));
            at = data;
            continue;
        }
        let hole = seek(libc::SEEK_HOLE, at)?.unwrap_or(end).min(end);
        out.push((hole.max(at + 1) - at, Alloc::Data));
        at = hole.max(at + 1);
    }
    Ok(out)
}

fn unsupported(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP) | Some(libc::ENOTTY) | Some(libc::EINVAL))
}

fn aligned(offset: u64, len: usize) -> bool {
    offset.is_multiple_of(DIRECT_ALIGN as u64) && len.is_multiple_of(DIRECT_ALIGN) && len > 0
}

/// A zeroed buffer of `len` bytes whose start is aligned for O_DIRECT, so
/// a device can write it without another copy.
pub struct AlignedBuf {
    raw: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    pub fn new(len: usize) -> Self {
        let raw = vec![0u8; len + DIRECT_ALIGN];
        let start = raw.as_ptr().align_offset(DIRECT_ALIGN);
        AlignedBuf { raw, start, len }
    }
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.raw[self.start..self.start + self.len]
    }
    pub fn as_slice(&self) -> &[u8] {
        &self.raw[self.start..self.start + self.len]
    }
    pub fn capacity(&self) -> usize {
        self.len
    }
    /// Makes the buffer `len` bytes long if its allocation holds that many,
    /// so a caller can reuse one buffer for writes of varying sizes instead
    /// of faulting in fresh pages each time. The bytes are left as they were.
    pub fn reuse_as(&mut self, len: usize) -> bool {
        let fits = self.start + len <= self.raw.len();
        if fits {
            self.len = len;
        }
        fits
    }
}

/// Opens an existing file or block device and takes `opts.lock` on it.
fn open_locked(path: &Path, opts: &FileDevOptions) -> DevResult<File> {
    let err = |source| io_err("open", path, 0, 0, source);
    let is_block = std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device());
    let exclusive_block = is_block && opts.lock == DevLock::Exclusive;
    let mut o = OpenOptions::new();
    o.read(true).write(!opts.read_only);
    if exclusive_block {
        // On a block device O_EXCL (without O_CREAT) claims it: refused
        // while it is mounted or claimed by another program.
        o.custom_flags(libc::O_EXCL);
    }
    let f = match o.open(path) {
        Ok(f) => f,
        Err(e) if exclusive_block && e.raw_os_error() == Some(libc::EBUSY) => {
            let holder = File::open(path).ok().and_then(|f| lock::holder_of(&f));
            let holder = holder.unwrap_or_else(|| "another program (mounted, or claimed exclusively)".into());
            return Err(lock::in_use(path, Some(holder)));
        }
        Err(e) => return Err(err(e)),
    };
    lock::take(&f, path, opts.lock)?;
    Ok(f)
}

fn is_aligned_ptr(p: *const u8) -> bool {
    (p as usize).is_multiple_of(DIRECT_ALIGN)
}

/// How many of `parts`, from the first, lie back to back with every
/// buffer, offset and length aligned for O_DIRECT (0 when the first is
/// not): the parts one `pwritev` can take.
fn direct_run(parts: &[(u64, &[u8])]) -> usize {
    let fits = |(offset, d): &(u64, &[u8])| aligned(*offset, d.len()) && is_aligned_ptr(d.as_ptr());
    let mut n = 0;
    let mut end = parts.first().map_or(0, |p| p.0);
    for p in parts {
        if p.0 != end || !fits(p) {
            break;
        }
        end += p.1.len() as u64;
        n += 1;
    }
    n
}

impl FileDev {
    /// Marks the page cache as holding changes a flush must sync, once a
    /// buffered change has been made (failed ones too: part of it may have
    /// landed). Marking it before the change would let a flush running
    /// meanwhile clear the mark and sync too early, and the next flush
    /// would then skip the sync the change needs.
    fn dirtied<T>(&self, res: T) -> T {
        self.buffered_dirty.store(true, arcache_sync::atomic::Ordering::Release);
        res
    }

    pub fn open(path: &Path, opts: FileDevOptions) -> DevResult<FileDev> {
        let err = |source| io_err("open", path, 0, 0, source);
        let buffered = match (opts.create_size, path.exists()) {
            (Some(size), false) => {
                let f = OpenOptions::new().read(true).write(true).create_new(true).open(path).map_err(err)?;
                lock::take(&f, path, opts.lock)?;
                f.set_len(size).map_err(err)?;
                f
            }
            _ => open_locked(path, &opts)?,
        };
        let meta = buffered.metadata().map_err(err)?;
        let is_block = meta.file_type().is_block_device();
        let size = if is_block { block_device_size(&buffered).map_err(err)? } else { meta.len() };
        let direct = if opts.direct {
            let flags = libc::O_DIRECT | if opts.sync_writes { libc::O_DSYNC } else { 0 };
            match OpenOptions::new().read(true).write(!opts.read_only).custom_flags(flags).open(path) {
                Ok(f) => Some(f),
                // Filesystems such as tmpfs refuse O_DIRECT; serve buffered
                // rather than not at all, and say so through `is_direct`.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => None,
                Err(e) => return Err(err(e)),
            }
        } else {
            None
        };
        Ok(FileDev {
            path: path.to_path_buf(),
            buffered,
            sync_writes: opts.sync_writes && direct.is_some(),
            fast_zero_works: std::sync::atomic::AtomicBool::new(true),
            direct,
            size,
            is_block,
            read_only: opts.read_only,
            buffered_dirty: arcache_sync::atomic::AtomicBool::new(false),
        })
    }

    /// True if aligned IO bypasses the page cache.
    pub fn is_direct(&self) -> bool {
        self.direct.is_some()
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn direct_for(&self, offset: u64, len: usize) -> Option<&File> {
        self.direct.as_ref().filter(|_| aligned(offset, len))
    }
}

impl BlockDev for FileDev {
    fn size(&self) -> u64 {
        self.size
    }

    fn direct_read_fd(&self) -> Option<std::os::fd::RawFd> {
        self.direct.as_ref().map(|f| f.as_raw_fd())
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> DevResult<()> {
        check_range(self.size, offset, buf.len() as u64)?;
        let len = buf.len() as u64;
        let err = |e| io_err("read", &self.path, offset, len, e);
        match self.direct_for(offset, buf.len()) {
            Some(f) if is_aligned_ptr(buf.as_ptr()) => f.read_exact_at(buf, offset).map_err(err),
            Some(f) => {
                let mut bounce = AlignedBuf::new(buf.len());
                f.read_exact_at(bounce.as_mut_slice(), offset).map_err(err)?;
                buf.copy_from_slice(bounce.as_slice());
                Ok(())
            }
            None => self.buffered.read_exact_at(buf, offset).map_err(err),
        }
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> DevResult<()> {
        if self.read_only {
            return Err(DevError::ReadOnly);
        }
        check_range(self.size, offset, buf.len() as u64)?;
        let err = |e| io_err("write", &self.path, offset, buf.len() as u64, e);
        match self.direct_for(offset, buf.len()) {
            Some(f) if is_aligned_ptr(buf.as_ptr()) => f.write_all_at(buf, offset).map_err(err),
            Some(f) => {
                let mut bounce = AlignedBuf::new(buf.len());
                bounce.as_mut_slice().copy_from_slice(buf);
                f.write_all_at(bounce.as_slice(), offset).map_err(err)
            }
            None => self.dirtied(self.buffered.write_all_at(buf, offset).map_err(err)),
        }
    }

    fn scatters_reads(&self) -> bool {
        true
    }

    /// One `preadv`, through the O_DIRECT descriptor when every buffer,
    /// the offset and the lengths are aligned for it.
    fn read_scattered(&self, bufs: &mut [&mut [std::mem::MaybeUninit<u8>]], offset: u64) -> DevResult<()> {
        let len: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        check_range(self.size, offset, len)?;
        let fits = bufs.iter().all(|b| aligned(0, b.len()) && is_aligned_ptr(b.as_ptr() as *const u8));
        let f = match self.direct_for(offset, len as usize) {
            Some(f) if fits => f,
            _ => &self.buffered,
        };
        crate::vectored::preadv_all(f.as_raw_fd(), bufs, offset)
            .map_err(|e| io_err("read", &self.path, offset, len, e))
    }

    /// Runs of parts that lie back to back and are aligned for O_DIRECT go
    /// in one `pwritev` each, without the copy into one buffer a caller
    /// would otherwise make; the rest as single writes.
    fn write_parts(&self, parts: &[(u64, &[u8])]) -> DevResult<()> {
        if self.read_only {
            return Err(DevError::ReadOnly);
        }
        let mut i = 0;
        while i < parts.len() {
            let run = direct_run(&parts[i..]);
            match (self.direct.as_ref(), run) {
                (Some(f), 2..) => {
                    let offset = parts[i].0;
                    let len: u64 = parts[i..i + run].iter().map(|(_, d)| d.len() as u64).sum();
                    check_range(self.size, offset, len)?;
                    let slices: Vec<&[u8]> = parts[i..i + run].iter().map(|&(_, d)| d).collect();
                    crate::vectored::pwritev_all(f.as_raw_fd(), &slices, offset)
                        .map_err(|e| io_err("write", &self.path, offset, len, e))?;
                }
                // No O_DIRECT descriptor (a file system that refuses it),
                // or a run of one: every part of the run on its own.
                _ => {
                    for &(offset, data) in &parts[i..i + run.max(1)] {
                        self.write_at(data, offset)?;
                    }
                }
            }
            i += run.max(1);
        }
        Ok(())
    }

    fn flush(&self) -> DevResult<()> {
        if self.read_only {
            return Ok(());
        }
        if self.sync_writes && !self.buffered_dirty.swap(false, arcache_sync::atomic::Ordering::AcqRel) {
            // Every write since the last flush was synchronous already.
            return Ok(());
        }
        self.buffered.sync_data().map_err(|e| io_err("flush", &self.path, 0, 0, e))
    }

    fn trim(&self, offset: u64, len: u64) -> DevResult<()> {
        if self.read_only {
            return Err(DevError::ReadOnly);
        }
        check_range(self.size, offset, len)?;
        let res = self.dirtied(if self.is_block {
            const BLKDISCARD: libc::c_ulong = 0x1277;
            range_ioctl(&self.buffered, BLKDISCARD, offset, len)
        } else {
            fallocate(&self.buffered, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, offset, len)
        });
        match res {
            // Trim is advice: a device that cannot discard keeps its bytes.
            Err(e) if unsupported(&e) => Ok(()),
            other => other.map_err(|e| io_err("trim", &self.path, offset, len, e)),
        }
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> DevResult<()> {
        if self.read_only {
            return Err(DevError::ReadOnly);
        }
        check_range(self.size, offset, len)?;
        let res = self.dirtied(if self.is_block {
            const BLKZEROOUT: libc::c_ulong = 0x127f;
            range_ioctl(&self.buffered, BLKZEROOUT, offset, len)
        } else {
            fallocate(&self.buffered, libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE, offset, len)
        });
        match res {
            Ok(()) => Ok(()),
            Err(e) if unsupported(&e) => write_zeroes_by_writing(self, offset, len),
            Err(e) => Err(io_err("write_zeroes", &self.path, offset, len, e)),
        }
    }

    fn zeroes_fast(&self) -> bool {
        // A block device may zero by writing (BLKZEROOUT falls back to it),
        // and there is no cheap way to know in advance: never promised.
        !self.is_block && !self.read_only && self.fast_zero_works.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn zero_fast(&self, offset: u64, len: u64, keep_allocated: bool) -> DevResult<()> {
        if !self.zeroes_fast() {
            return Err(DevError::Unsupported(format!("fast zeroing on {}", self.path.display())));
        }
        check_range(self.size, offset, len)?;
        let mode = if keep_allocated { libc::FALLOC_FL_ZERO_RANGE } else { libc::FALLOC_FL_PUNCH_HOLE };
        match self.dirtied(fallocate(&self.buffered, mode | libc::FALLOC_FL_KEEP_SIZE, offset, len)) {
            Ok(()) => Ok(()),
            Err(e) if unsupported(&e) => {
                // The caller has already dropped cached and dirty bytes of
                // the range on our word: zero it the slow way so nothing old
                // shows, and stop offering fast zeroing.
                self.fast_zero_works.store(false, std::sync::atomic::Ordering::Relaxed);
                write_zeroes_by_writing(self, offset, len)
            }
            Err(e) => Err(io_err("zero_fast", &self.path, offset, len, e)),
        }
    }

    fn allocation(&self, offset: u64, len: u64) -> DevResult<Vec<(u64, Alloc)>> {
        check_range(self.size, offset, len)?;
        if self.is_block || len == 0 {
            return Ok(vec![(len, Alloc::Data)]);
        }
        extents_by_seek(&self.buffered, offset, offset + len)
            .map_err(|e| io_err("seek", &self.path, offset, len, e))
    }

    fn describe(&self) -> String {
        self.path.display().to_string()
    }

    /// Device and inode numbers, plus the birth time where the filesystem
    /// keeps one: a file deleted and created again often gets the same
    /// inode number back, never the same birth time.
    fn identity(&self) -> String {
        use std::os::unix::fs::MetadataExt;
        match self.buffered.metadata() {
            Ok(m) => {
                format!("file:{}:{}:{}", m.dev(), m.ino(), birth_time(&self.buffered).unwrap_or_default())
            }
            Err(_) => format!("path:{}", self.path.display()),
        }
    }

    fn is_read_only(&self) -> bool {
        self.read_only
    }
}

/// The file's birth time as `seconds.nanoseconds`, if the filesystem has one.
fn birth_time(file: &File) -> Option<String> {
    use std::os::fd::AsRawFd;
    // SAFETY: statx only writes into the zeroed struct we pass; the empty
    // path with AT_EMPTY_PATH names the open descriptor itself.
    let mut sx: libc::statx = unsafe { std::mem::zeroed() };
    let rc = unsafe {
        libc::statx(file.as_raw_fd(), c"".as_ptr(), libc::AT_EMPTY_PATH, libc::STATX_BTIME, &mut sx)
    };
    (rc == 0 && sx.stx_mask & libc::STATX_BTIME != 0)
        .then(|| format!("{}.{:09}", sx.stx_btime.tv_sec, sx.stx_btime.tv_nsec))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(direct: bool) {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("dev.img");
        let dev =
            FileDev::open(&p, FileDevOptions { direct, create_size: Some(1 << 20), ..Default::default() })
                .unwrap();
        assert_eq!(dev.size(), 1 << 20);
        let data: Vec<u8> = (0..8192u32).map(|i| (i * 7) as u8).collect();
        dev.write_at(&data, 4096).unwrap();
        dev.write_at(b"odd", 5).unwrap();
        let mut back = vec![0; 8192];
        dev.read_at(&mut back, 4096).unwrap();
        assert_eq!(back, data);
        let mut small = [0u8; 3];
        dev.read_at(&mut small, 5).unwrap();
        assert_eq!(&small, b"odd");
        dev.write_zeroes(4096, 4096).unwrap();
        dev.read_at(&mut back, 4096).unwrap();
        assert!(back[..4096].iter().all(|&b| b == 0));
        assert_eq!(&back[4096..], &data[4096..]);
        dev.flush().unwrap();
        let past = dev.read_at(&mut back, (1 << 20) - 100).unwrap_err();
        assert_eq!(past.errno(), libc::EINVAL);
    }

    #[test]
    fn buffered_roundtrip() {
        roundtrip(false);
    }

    /// A 1 MiB file in `dir`, opened with O_DIRECT or without.
    fn mib_file(dir: &tempfile::TempDir, direct: bool) -> FileDev {
        let opts = FileDevOptions { direct, create_size: Some(1 << 20), ..Default::default() };
        FileDev::open(&dir.path().join("dev.img"), opts).unwrap()
    }

    #[test]
    fn aligned_parts_back_to_back_go_in_one_write_and_the_rest_one_by_one() {
        let parts = [
            (8192u64, AlignedBuf::new(4096)),
            (12288, AlignedBuf::new(8192)),
            (20480, AlignedBuf::new(4096)),
            (40960, AlignedBuf::new(4096)),
        ];
        let mut parts = parts;
        for (i, (_, b)) in parts.iter_mut().enumerate() {
            b.as_mut_slice().fill(i as u8 + 1);
        }
        let views: Vec<(u64, &[u8])> = parts.iter().map(|(o, b)| (*o, b.as_slice())).collect();
        assert_eq!(direct_run(&views), 3, "the fourth part is not back to back");
        assert_eq!(direct_run(&views[3..]), 1);
        let odd = [9u8; 4096];
        let unaligned = (45056u64, &odd[1..]);
        assert_eq!(direct_run(&[unaligned]), 0, "an unaligned buffer");

        for direct in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let dev = mib_file(&dir, direct);
            assert_eq!(dev.is_direct(), direct);
            check_parts_land(&dev, &views, unaligned);
        }
    }

    /// Writes `views` and `unaligned` with one `write_parts` and checks
    /// every byte of the file.
    fn check_parts_land(dev: &FileDev, views: &[(u64, &[u8])], unaligned: (u64, &[u8])) {
        let mut all = views.to_vec();
        all.push(unaligned);
        dev.write_parts(&all).unwrap();
        let mut back = vec![0u8; 1 << 20];
        dev.read_at(&mut back, 0).unwrap();
        let mut want = vec![0u8; 1 << 20];
        for &(o, d) in &all {
            want[o as usize..o as usize + d.len()].copy_from_slice(d);
        }
        assert!(back == want, "the parts did not land at their offsets");
        assert_eq!(dev.write_parts(&[(1 << 20, views[0].1), views[1]]).unwrap_err().errno(), libc::EINVAL);
    }

    /// One read fills many buffers back to back, through O_DIRECT when all
    /// is aligned and buffered when not, and refuses a range past the end.
    #[test]
    fn a_scattered_read_fills_the_buffers_back_to_back() {
        let dir = tempfile::tempdir().unwrap();
        let dev = mib_file(&dir, true);
        let data: Vec<u8> = (0..(1u32 << 20)).map(|i| (i % 253) as u8).collect();
        dev.write_at(&data, 0).unwrap();
        assert!(dev.scatters_reads());
        let check = |offset: usize, lens: &[usize], aligned_bufs: bool| {
            let mut held: Vec<AlignedBuf> = lens.iter().map(|&l| AlignedBuf::new(l + 1)).collect();
            let mut views: Vec<&mut [std::mem::MaybeUninit<u8>]> = held
                .iter_mut()
                .zip(lens)
                .map(|(b, &l)| {
                    let s = &mut b.as_mut_slice()[usize::from(!aligned_bufs)..][..l];
                    // SAFETY: initialised bytes seen as maybe-uninitialised.
                    unsafe { &mut *(s as *mut [u8] as *mut [std::mem::MaybeUninit<u8>]) }
                })
                .collect();
            dev.read_scattered(&mut views, offset as u64).unwrap();
            let mut at = offset;
            for (b, &l) in held.iter().zip(lens) {
                let got = &b.as_slice()[usize::from(!aligned_bufs)..][..l];
                assert!(got == &data[at..at + l], "{l} bytes at {at} (aligned buffers: {aligned_bufs})");
                at += l;
            }
        };
        check(8192, &[4096, 16384, 4096], true);
        check(8192, &[4096, 16384, 4096], false);
        check(100, &[7, 5000, 1], false);
        let mut past = [std::mem::MaybeUninit::new(0u8); 16];
        assert_eq!(dev.read_scattered(&mut [&mut past], (1 << 20) - 8).unwrap_err().errno(), libc::EINVAL);
    }

    #[test]
    fn direct_roundtrip_or_unsupported_fs() {
        // tmpfs refuses O_DIRECT; that is the filesystem, not us.
        let dir = tempfile::tempdir().unwrap();
        let probe = dir.path().join("probe");
        std::fs::write(&probe, [0u8; 4096]).unwrap();
        if OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(&probe).is_ok() {
            roundtrip(true);
        }
    }

    #[test]
    fn read_only_refuses_writes() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("ro.img");
        std::fs::write(&p, vec![1u8; 4096]).unwrap();
        let dev = FileDev::open(&p, FileDevOptions { read_only: true, ..Default::default() }).unwrap();
        assert_eq!(dev.write_at(&[0], 0).unwrap_err().errno(), libc::EPERM);
    }
}
