//! Records read from SOURCE with `O_DIRECT`: one request of the whole
//! record to the disk, as ZFS reads a record, instead of the page-by-page
//! reads a buffered `pread` becomes when SOURCE's read-ahead is small or
//! off; and no second copy of the data in SOURCE's page cache beside the
//! ARC's. Where SOURCE refuses `O_DIRECT` (tmpfs, some FUSE and network
//! file systems) the buffered descriptor is used.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};

/// The alignment `O_DIRECT` wants of offsets, lengths and buffers (the
/// largest logical block size in use, 4K, covers 512-byte devices too).
pub const ALIGN: usize = 4096;

/// A second descriptor of the file `file` is open on, with `O_DIRECT`:
/// reopened through `/proc/self/fd`, so it is that very file whatever its
/// name leads to now. `None` where SOURCE refuses it.
pub fn reopen_direct(file: &File) -> Option<File> {
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECT | libc::O_CLOEXEC)
        .open(format!("/proc/self/fd/{}", file.as_raw_fd()))
        .ok()
}

/// Reads up to `len` bytes at `offset` (both multiples of [`ALIGN`])
/// through a direct descriptor; fewer only at the end of the file.
pub fn read_direct(file: &File, offset: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut raw = vec![0u8; len + ALIGN];
    let skew = raw.as_ptr().align_offset(ALIGN);
    let buf = &mut raw[skew..skew + len];
    let mut got = 0;
    while got < len {
        match file.read_at(&mut buf[got..], offset + got as u64) {
            Ok(0) => break,
            Ok(n) => {
                got += n;
                // A short read that ends off the alignment is the end of
                // the file (and a read from there would be refused).
                if got % ALIGN != 0 {
                    break;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(buf[..got].to_vec())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn direct_reads_of_whole_and_tail_records_equal_the_file() {
        // Beside the test binary: a disk file system, where tmpfs (often
        // /tmp) would refuse O_DIRECT.
        let exe = std::env::current_exe().unwrap();
        let dir = tempfile::tempdir_in(exe.parent().unwrap()).unwrap();
        let path = dir.path().join("f");
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        File::create(&path).unwrap().write_all(&data).unwrap();
        let f = File::open(&path).unwrap();
        let Some(d) = reopen_direct(&f) else {
            let ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
            assert!(!ci, "the build directory's file system refuses O_DIRECT: nothing checked");
            eprintln!("SKIPPED: the build directory's file system refuses O_DIRECT");
            return;
        };
        let rs = 128 << 10;
        for (i, chunk) in data.chunks(rs).enumerate() {
            assert_eq!(read_direct(&d, (i * rs) as u64, rs).unwrap(), chunk);
        }
        assert!(read_direct(&d, 3 * rs as u64, rs).unwrap().is_empty(), "past the end");
    }
}
