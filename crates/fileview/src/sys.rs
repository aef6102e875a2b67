//! The system calls std does not wrap: the `*at` family relative to a
//! directory opened beneath SOURCE (`openat2` with `RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS`), xattrs, statvfs.
//!
//! Nothing here follows a symlink: a directory on the way is opened by
//! `openat2`, which refuses any symlink and any escape from SOURCE, and
//! the last name is used with a call that does not follow it.

use std::ffi::{CString, OsStr};
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

fn cstr(b: &[u8]) -> io::Result<CString> {
    CString::new(b).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

/// One name in a directory (never empty, never a path) as a C string.
fn entry_name(name: &OsStr) -> io::Result<CString> {
    let b = name.as_bytes();
    if b.is_empty() || b.contains(&b'/') {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
    }
    cstr(b)
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

fn check_fd(r: libc::c_long) -> io::Result<OwnedFd> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        // SAFETY: the call returned a new descriptor that nothing else owns.
        Ok(unsafe { OwnedFd::from_raw_fd(r as libc::c_int) })
    }
}

/// `struct open_how` of `linux/openat2.h` (libc's is non-exhaustive).
#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

/// Opens `rel` (relative; empty is `root` itself) beneath `root` without
/// following any symlink on the way or at the end, and never outside
/// `root` (`openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`).
pub fn open_beneath(root: BorrowedFd, rel: &Path, flags: i32) -> io::Result<OwnedFd> {
    let rel = if rel.as_os_str().is_empty() { Path::new(".") } else { rel };
    let cp = cpath(rel)?;
    let how = OpenHow {
        flags: (flags | libc::O_CLOEXEC | libc::O_NOFOLLOW) as u32 as u64,
        mode: 0,
        resolve: libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS,
    };
    // SAFETY: a valid C string and an open_how of the size given.
    check_fd(unsafe {
        libc::syscall(
            libc::SYS_openat2,
            root.as_raw_fd(),
            cp.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    })
}

/// A name in a directory of SOURCE: the directory opened (`O_PATH`) by
/// [`open_beneath`], and the last name, which no call here follows.
pub struct At {
    pub dir: OwnedFd,
    pub name: CString,
}

impl At {
    pub fn new(dir: OwnedFd, name: &OsStr) -> io::Result<At> {
        Ok(At { dir, name: entry_name(name)? })
    }

    fn fd(&self) -> libc::c_int {
        self.dir.as_raw_fd()
    }

    /// `openat` of the name with `O_NOFOLLOW` (and `O_CLOEXEC`): a symlink
    /// there is ELOOP, never its target.
    pub fn open(&self, flags: i32, mode: u32) -> io::Result<OwnedFd> {
        let flags = flags | libc::O_NOFOLLOW | libc::O_CLOEXEC;
        // SAFETY: a valid C string.
        check_fd(unsafe { libc::openat(self.fd(), self.name.as_ptr(), flags, mode) } as libc::c_long)
    }

    pub fn mkdir(&self, mode: u32) -> io::Result<()> {
        // SAFETY: a valid C string.
        check(unsafe { libc::mkdirat(self.fd(), self.name.as_ptr(), mode) })
    }

    pub fn mknod(&self, mode: u32, rdev: u64) -> io::Result<()> {
        // SAFETY: a valid C string.
        check(unsafe { libc::mknodat(self.fd(), self.name.as_ptr(), mode, rdev) })
    }

    pub fn symlink(&self, target: &Path) -> io::Result<()> {
        let t = cpath(target)?;
        // SAFETY: valid C strings.
        check(unsafe { libc::symlinkat(t.as_ptr(), self.fd(), self.name.as_ptr()) })
    }

    /// `unlinkat` (`rmdir` with `dir`).
    pub fn unlink(&self, dir: bool) -> io::Result<()> {
        let flags = if dir { libc::AT_REMOVEDIR } else { 0 };
        // SAFETY: a valid C string.
        check(unsafe { libc::unlinkat(self.fd(), self.name.as_ptr(), flags) })
    }

    /// A hard link `to` of this name (`linkat` without following).
    pub fn link(&self, to: &At) -> io::Result<()> {
        // SAFETY: valid C strings.
        check(unsafe { libc::linkat(self.fd(), self.name.as_ptr(), to.fd(), to.name.as_ptr(), 0) })
    }

    pub fn rename(&self, to: &At, flags: u32) -> io::Result<()> {
        // SAFETY: valid C strings.
        check(unsafe { libc::renameat2(self.fd(), self.name.as_ptr(), to.fd(), to.name.as_ptr(), flags) })
    }

    /// `fchownat(AT_SYMLINK_NOFOLLOW)`: a symlink's own owner.
    pub fn chown(&self, uid: Option<u32>, gid: Option<u32>) -> io::Result<()> {
        let (u, g) = (uid.unwrap_or(u32::MAX), gid.unwrap_or(u32::MAX));
        // SAFETY: a valid C string.
        check(unsafe { libc::fchownat(self.fd(), self.name.as_ptr(), u, g, libc::AT_SYMLINK_NOFOLLOW) })
    }

    /// `utimensat(AT_SYMLINK_NOFOLLOW)`: `None` leaves a time, `Some(None)`
    /// is now.
    pub fn utimens(&self, atime: SetTime, mtime: SetTime) -> io::Result<()> {
        let ts = |t: SetTime| match t {
            None => libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_OMIT },
            Some(None) => libc::timespec { tv_sec: 0, tv_nsec: libc::UTIME_NOW },
            Some(Some((s, ns))) => libc::timespec { tv_sec: s, tv_nsec: ns as _ },
        };
        let times = [ts(atime), ts(mtime)];
        // SAFETY: a valid C string and two timespecs.
        check(unsafe {
            libc::utimensat(self.fd(), self.name.as_ptr(), times.as_ptr(), libc::AT_SYMLINK_NOFOLLOW)
        })
    }
}

/// A time for `utimensat`: `None` leaves it, `Some(None)` is now.
pub type SetTime = Option<Option<(i64, u32)>>;

/// `/proc/self/fd/N`: the object `fd` holds, even an `O_PATH` descriptor
/// of a symlink, reached through the magic link without another lookup.
fn proc_path(fd: BorrowedFd) -> CString {
    CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).expect("no NUL in a number")
}

/// The target of the symlink `fd` holds (opened `O_PATH | O_NOFOLLOW`).
pub fn readlink(fd: BorrowedFd) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; 256];
    loop {
        // SAFETY: an empty C string and a buffer of buf.len() bytes.
        let n = unsafe { libc::readlinkat(fd.as_raw_fd(), c"".as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if (n as usize) < buf.len() {
            buf.truncate(n as usize);
            return Ok(buf);
        }
        buf.resize(buf.len() * 2, 0);
    }
}

/// chmod of what `fd` holds (an `O_PATH` descriptor): refused with
/// EOPNOTSUPP on a symlink, as `fchmodat(AT_SYMLINK_NOFOLLOW)` does.
pub fn chmod(fd: BorrowedFd, is_symlink: bool, mode: u32) -> io::Result<()> {
    if is_symlink {
        return Err(io::Error::from_raw_os_error(libc::EOPNOTSUPP));
    }
    let p = proc_path(fd);
    // SAFETY: a valid C string.
    check(unsafe { libc::chmod(p.as_ptr(), mode) })
}

/// Grows a buffer until a size-then-fill call fits.
fn sized(mut call: impl FnMut(*mut libc::c_void, usize) -> libc::ssize_t) -> io::Result<Vec<u8>> {
    loop {
        let n = call(std::ptr::null_mut(), 0);
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n == 0 {
            return Ok(Vec::new());
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

/// Every extended attribute of what `fd` holds (a symlink's own).
pub fn all_xattrs(fd: BorrowedFd) -> io::Result<Vec<(Vec<u8>, Vec<u8>)>> {
    let cp = proc_path(fd);
    // SAFETY: cp is a valid C string; the buffer pointer and length agree.
    let names = match sized(|b, n| unsafe { libc::listxattr(cp.as_ptr(), b.cast(), n) }) {
        Ok(n) => n,
        Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for name in names.split(|&c| c == 0).filter(|n| !n.is_empty()) {
        let cn = cstr(name)?;
        // SAFETY: as above.
        match sized(|b, n| unsafe { libc::getxattr(cp.as_ptr(), cn.as_ptr(), b, n) }) {
            Ok(v) => out.push((name.to_vec(), v)),
            // Removed between the two calls.
            Err(e) if e.raw_os_error() == Some(libc::ENODATA) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

pub fn set_xattr(fd: BorrowedFd, name: &OsStr, value: &[u8], flags: i32) -> io::Result<()> {
    let (cp, cn) = (proc_path(fd), cstr(name.as_bytes())?);
    // SAFETY: valid C strings and a buffer of value.len() bytes.
    check(unsafe { libc::setxattr(cp.as_ptr(), cn.as_ptr(), value.as_ptr().cast(), value.len(), flags) })
}

pub fn remove_xattr(fd: BorrowedFd, name: &OsStr) -> io::Result<()> {
    let (cp, cn) = (proc_path(fd), cstr(name.as_bytes())?);
    // SAFETY: valid C strings.
    check(unsafe { libc::removexattr(cp.as_ptr(), cn.as_ptr()) })
}

pub fn statvfs(fd: BorrowedFd) -> io::Result<libc::statvfs> {
    // SAFETY: an all-zero statvfs is a valid value to be overwritten.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: an open descriptor and a pointer to a statvfs.
    check(unsafe { libc::fstatvfs(fd.as_raw_fd(), &mut st) })?;
    Ok(st)
}

/// `statx(dir, name, AT_SYMLINK_NOFOLLOW)`: a name's own attributes (a
/// symlink's, never its target's), with its birth time where kept.
pub fn lstat_at(dir: BorrowedFd, name: &OsStr) -> io::Result<crate::records::Attr> {
    let c = entry_name(name)?;
    // SAFETY: statx fills the struct it is given.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    let mask = libc::STATX_BASIC_STATS | libc::STATX_BTIME;
    // SAFETY: a valid descriptor, C string and struct.
    check(unsafe { libc::statx(dir.as_raw_fd(), c.as_ptr(), libc::AT_SYMLINK_NOFOLLOW, mask, &mut st) })?;
    Ok(crate::records::Attr::from_statx(&st))
}
