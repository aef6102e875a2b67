//! Whole vectored reads and writes at an offset (`preadv`/`pwritev`), so a
//! caller holding many buffers (an L2 batch of records, a run of records
//! read back) moves them with one request instead of copying them into one
//! buffer first.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::RawFd;

/// Buffers one call takes at most (Linux's `IOV_MAX`).
const IOV_MAX: usize = 1024;

/// Writes `parts` back to back from `offset`, all of them, resuming after
/// short writes.
pub fn pwritev_all(fd: RawFd, parts: &[&[u8]], offset: u64) -> io::Result<()> {
    let iov =
        parts.iter().map(|p| libc::iovec { iov_base: p.as_ptr() as *mut _, iov_len: p.len() }).collect();
    // SAFETY: every iovec points into a slice of `parts`, borrowed for this
    // call, and the kernel only reads them.
    let call = |v: &[libc::iovec], n, at| unsafe { libc::pwritev(fd, v.as_ptr(), n, at) };
    whole(iov, offset, call, io::ErrorKind::WriteZero)
}

/// Fills `bufs` back to back from `offset`, all of them, resuming after
/// short reads; the end of the file before they are full is an error
/// (`UnexpectedEof`). Buffers may be uninitialised: the kernel only writes
/// them, and on success every byte has been written.
pub fn preadv_all(fd: RawFd, bufs: &mut [&mut [MaybeUninit<u8>]], offset: u64) -> io::Result<()> {
    let iov = bufs
        .iter_mut()
        .map(|b| libc::iovec { iov_base: b.as_mut_ptr() as *mut _, iov_len: b.len() })
        .collect();
    // SAFETY: every iovec points into a buffer of `bufs`, borrowed mutably
    // for this call; the kernel writes at most its length.
    let call = |v: &[libc::iovec], n, at| unsafe { libc::preadv(fd, v.as_ptr(), n, at) };
    whole(iov, offset, call, io::ErrorKind::UnexpectedEof)
}

/// Calls `call` (a `preadv` or `pwritev` of up to `IOV_MAX` iovecs at an
/// offset) until every byte of `iov` has moved; a call that moves nothing
/// is `at_end`.
fn whole(
    mut iov: Vec<libc::iovec>,
    offset: u64,
    call: impl Fn(&[libc::iovec], i32, libc::off_t) -> isize,
    at_end: io::ErrorKind,
) -> io::Result<()> {
    let mut done = 0usize;
    let mut at = offset;
    loop {
        // Empty buffers move nothing: past them first, so a call is only
        // made for bytes that must move (and all empty is done).
        done = advance(&mut iov, done, 0);
        if done == iov.len() {
            break;
        }
        let n = (iov.len() - done).min(IOV_MAX);
        let moved = call(&iov[done..], n as i32, at as libc::off_t);
        if moved < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if moved == 0 {
            return Err(io::Error::new(at_end, "no bytes moved before the end"));
        }
        at += moved as u64;
        done = advance(&mut iov, done, moved as usize);
    }
    Ok(())
}

/// Moves past `n` bytes from iovec `done` on; returns the first iovec with
/// bytes left (trimmed to them).
fn advance(iov: &mut [libc::iovec], mut done: usize, mut n: usize) -> usize {
    while done < iov.len() && n >= iov[done].iov_len {
        n -= iov[done].iov_len;
        done += 1;
    }
    if n > 0 {
        let v = &mut iov[done];
        // SAFETY: `n` is less than this iovec's length, so the new base
        // stays inside its buffer.
        v.iov_base = unsafe { (v.iov_base as *mut u8).add(n) } as *mut _;
        v.iov_len -= n;
    }
    done
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    fn iov(lens: &[usize]) -> Vec<libc::iovec> {
        lens.iter().map(|&l| libc::iovec { iov_base: std::ptr::null_mut(), iov_len: l }).collect()
    }

    #[test]
    fn advancing_skips_whole_buffers_and_trims_a_partial_one() {
        let mut v = iov(&[4, 8, 16]);
        assert_eq!(advance(&mut v, 0, 4), 1);
        assert_eq!(v[1].iov_len, 8);
        assert_eq!(advance(&mut v, 1, 10), 2);
        assert_eq!(v[2].iov_len, 14);
        assert_eq!(v[2].iov_base as usize, 2);
        assert_eq!(advance(&mut v, 2, 14), 3);
    }

    #[test]
    fn more_buffers_than_one_call_takes_go_back_to_back_both_ways() {
        let file = tempfile::tempfile().expect("a temp file");
        let parts: Vec<Vec<u8>> = (0..IOV_MAX + 7).map(|i| vec![(i % 251) as u8; 1 + i % 5]).collect();
        let slices: Vec<&[u8]> = parts.iter().map(|p| p.as_slice()).collect();
        pwritev_all(file.as_raw_fd(), &slices, 3).expect("written");
        let whole: Vec<u8> = parts.concat();
        let mut back = vec![0u8; whole.len() + 3];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut back, 0).expect("read back");
        assert_eq!(&back[3..], &whole[..]);

        let mut bufs: Vec<Vec<MaybeUninit<u8>>> =
            parts.iter().map(|p| vec![MaybeUninit::new(0xee); p.len()]).collect();
        let mut views: Vec<&mut [MaybeUninit<u8>]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
        preadv_all(file.as_raw_fd(), &mut views, 3).expect("read");
        for (b, p) in bufs.iter().zip(&parts) {
            // SAFETY: preadv_all succeeded, so every byte was written.
            let got: Vec<u8> = b.iter().map(|x| unsafe { x.assume_init() }).collect();
            assert_eq!(&got, p);
        }
        let mut past = vec![MaybeUninit::new(0u8); 8];
        let mut one = [past.as_mut_slice()];
        let e = preadv_all(file.as_raw_fd(), &mut one, whole.len() as u64).expect_err("past the end");
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }
}
