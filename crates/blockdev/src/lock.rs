//! Holding a device for one server at a time. Two servers writing one L2
//! device, intent log or backing store corrupt it silently, so a device is
//! locked before the first byte is written to it: an advisory `flock` on the
//! open file (released by the kernel when the process dies, so a crash never
//! leaves a stale lock), and `O_EXCL` on block devices, which also keeps out
//! mounts and other exclusive openers such as mdadm or bcache.

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::os::unix::io::AsRawFd;
use std::path::Path;

use crate::{DevError, DevResult};

/// How a server holds a device it opens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum DevLock {
    /// No lock: tools that only inspect, and tests of the device itself.
    #[default]
    None,
    /// Readers may share it; no one may hold it for writing.
    Shared,
    /// No one else may hold it at all.
    Exclusive,
}

/// Takes `mode` on `file` without waiting: a second server is refused at
/// once, never queued behind the first.
pub(crate) fn take(file: &File, path: &Path, mode: DevLock) -> DevResult<()> {
    let op = match mode {
        DevLock::None => return Ok(()),
        DevLock::Shared => libc::LOCK_SH,
        DevLock::Exclusive => libc::LOCK_EX,
    };
    // SAFETY: flock on a descriptor we own; no memory is passed.
    if unsafe { libc::flock(file.as_raw_fd(), op | libc::LOCK_NB) } == 0 {
        return Ok(());
    }
    let err = io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
        return Err(in_use(path, holder_of(file)));
    }
    Err(DevError::Io { op: "lock", dev: path.display().to_string(), offset: 0, len: 0, source: err })
}

pub(crate) fn in_use(path: &Path, holder: Option<String>) -> DevError {
    DevError::InUse { dev: path.display().to_string(), holder }
}

/// Who holds a lock on the file `file` is open on, as "pid N (name)", from
/// /proc/locks (flock locks name the process that took them).
pub(crate) fn holder_of(file: &File) -> Option<String> {
    let meta = file.metadata().ok()?;
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    let me = std::process::id();
    let holders = lock_holders(&locks, meta.dev(), meta.ino());
    match holders.iter().find(|&&p| p != me) {
        Some(&pid) => Some(describe_pid(pid)),
        // One server naming the same device twice (as L2 and as log, say).
        None if !holders.is_empty() => Some("this server (it is named twice in its settings)".into()),
        None => None,
    }
}

/// Who holds a lock on `path` right now, if anyone (for dumps: a header
/// saying "in use" means little unless someone still holds the device).
pub fn current_holder(path: &Path) -> Option<String> {
    holder_of(&File::open(path).ok()?)
}

/// The pids in /proc/locks text holding a lock on inode `ino` of device
/// `dev` (st_dev as the kernel encodes it).
pub fn lock_holders(locks: &str, dev: u64, ino: u64) -> Vec<u32> {
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let want = format!("{major:02x}:{minor:02x}:{ino}");
    locks
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // "1: FLOCK ADVISORY WRITE 1556 fe:00:5316612 0 EOF"; a blocked
            // waiter's line carries "->" after the number and is skipped.
            if fields.get(1) == Some(&"->") {
                return None;
            }
            let at = fields.iter().position(|f| *f == want)?;
            fields.get(at.checked_sub(1)?)?.parse().ok()
        })
        .collect()
}

fn describe_pid(pid: u32) -> String {
    match std::fs::read_to_string(format!("/proc/{pid}/comm")) {
        Ok(name) => format!("pid {pid} ({})", name.trim()),
        Err(_) => format!("pid {pid}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_holders_from_proc_locks() {
        let text = "1: FLOCK  ADVISORY  WRITE 1556 fe:00:5316612 0 EOF\n\
                    2: FLOCK  ADVISORY  READ 77 fe:00:10133507 0 EOF\n\
                    2: -> FLOCK  ADVISORY  WRITE 99 fe:00:10133507 0 EOF\n";
        let dev = libc::makedev(0xfe, 0);
        assert_eq!(lock_holders(text, dev, 5316612), vec![1556]);
        assert_eq!(lock_holders(text, dev, 10133507), vec![77]);
        assert!(lock_holders(text, dev, 1).is_empty());
    }

    #[test]
    fn a_second_exclusive_lock_is_refused_and_names_the_holder_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("dev");
        std::fs::write(&p, [0u8; 4096]).unwrap();
        let a = File::options().read(true).write(true).open(&p).unwrap();
        let b = File::options().read(true).write(true).open(&p).unwrap();
        take(&a, &p, DevLock::Exclusive).unwrap();
        let err = take(&b, &p, DevLock::Shared).unwrap_err().to_string();
        assert!(err.contains(&p.display().to_string()), "{err}");
        assert!(err.contains("in use"), "{err}");
        drop(a);
        take(&b, &p, DevLock::Exclusive).unwrap();
    }

    #[test]
    fn readers_share() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("dev");
        std::fs::write(&p, [0u8; 4096]).unwrap();
        let a = File::open(&p).unwrap();
        let b = File::open(&p).unwrap();
        take(&a, &p, DevLock::Shared).unwrap();
        take(&b, &p, DevLock::Shared).unwrap();
        let c = File::open(&p).unwrap();
        assert!(take(&c, &p, DevLock::Exclusive).is_err());
    }
}
