//! The system calls std does not wrap: xattrs, statvfs, mknod, utimensat,
//! renameat2.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn cstr(b: &[u8]) -> io::Result<CString> {
    CString::new(b).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

fn cpath(p: &Path) -> io::Result<CString> {
    cstr(p.as_os_str().as_bytes())
}

fn check(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Grows a buffer until a size-then-fill call fits.
fn sized(mut call: impl FnMut(*mut libc::c_void, usize) -> libc::ssize_t) -> io::Result<Vec<u8>> {
    loop {
        let n = call(std::ptr::null_mut(), 0);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut buf = vec![0u8; n as usize];
        let m = call(buf.as_mut_ptr().cast(), buf.len());
        if m >= 0 {
            buf.truncate(m as usize);
            return Ok(buf);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ERANGE) {
            return Err(e);
        }
    }
}

/// Every extended attribute of `p` (not following a symlink).
pub fn all_xattrs(p: &Path) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let cp = cpath(p)?;
    // SAFETY: cp is a valid C string; the buffer pointer and length agree.
    let names = match sized(|b, n| unsafe { libc::llistxattr(cp.as_ptr(), b.cast(), n) }) {
        Ok(n) => n,
        Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for name in names.split(|&c| c == 0).filter(|n| !n.is_empty()) {
        let cn = cstr(name)?;
        // SAFETY: as above.
        match sized(|b, n| unsafe { libc::lgetxattr(cp.as_ptr(), cn.as_ptr(), b, n) }) {
            Ok(v) => out.push((name.to_vec(), v)),
            // Removed between the two calls.
            Err(e) if e.raw_os_error() == Some(libc::ENODATA) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

pub fn set_xattr(p: &Path, name: &OsStr, value: &[u8], flags: i32) -> io::Result<()> {
    let (cp, cn) = (cpath(p)?, cstr(name.as_bytes())?);
    // SAFETY: valid C strings and a buffer of value.len() bytes.
    check(unsafe { libc::lsetxattr(cp.as_ptr(), cn.as_ptr(), value.as_ptr().cast(), value.len(), flags) })
}

pub fn remove_xattr(p: &Path, name: &OsStr) -> io::Result<()> {
    let (cp, cn) = (cpath(p)?, cstr(name.as_bytes())?);
    // SAFETY: valid C strings.
    check(unsafe { libc::lremovexattr(cp.as_ptr(), cn.as_ptr()) })
}

pub fn statvfs(p: &Path) -> io::Result<libc::statvfs> {
    let cp = cpath(p)?;
    // SAFETY: an all-zero statvfs is a valid value to be overwritten.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid C string and a pointer to a statvfs.
    check(unsafe { libc::statvfs(cp.as_ptr(), &mut st) })?;
    Ok(st)
}

pub fn mknod(p: &Path, mode: u32, rdev: u64) -> io::Result<()> {
    let cp = cpath(p)?;
    // SAFETY: valid C string.
    check(unsafe { libc::mknod(cp.as_ptr(), mode, rdev) })
}

/// A time for `utimensat`: `None` leaves it, `Some(None)` is now.
pub type SetTime = Option<Option<(i64, u32)>>;

pub fn utimens(p: &Path, atime: SetTime, mtime: SetTime) -> io::Result<()> {
    let ts = |t: SetTime| match t {
        None => libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT },
        Some(None) => libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_NOW },
        Some(Some((s, ns))) => libc::timespec { tv_sec: s, tv_nsec: ns as _ },
    };
    let times = [ts(atime), ts(mtime)];
    let cp = cpath(p)?;
    // SAFETY: valid C string and two timespecs.
    check(unsafe { libc::utimensat(libc::AT_FDCWD, cp.as_ptr(), times.as_ptr(), libc::AT_SYMLINK_NOFOLLOW) })
}

pub fn rename(from: &Path, to: &Path, flags: u32) -> io::Result<()> {
    let (a, b) = (cpath(from)?, cpath(to)?);
    // SAFETY: valid C strings.
    check(unsafe { libc::renameat2(libc::AT_FDCWD, a.as_ptr(), libc::AT_FDCWD, b.as_ptr(), flags) })
}
