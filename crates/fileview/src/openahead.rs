//! Open-ahead: an open of a file warms SOURCE's inodes of the other
//! entries of its directory, side by side, in the background.
//!
//! An open that is not deferred (`deferred.rs`: no inotify, or a file
//! not vouched for) goes to SOURCE for the descriptor it binds, and a tool that reads a directory's files (`rsync`, `cp -r`,
//! `tar`) opens them one at a time: on a source whose own caches are cold,
//! each open then waits for one inode read, a seek on a disk. When the
//! view's records are fresh nothing else asks SOURCE about those files
//! first (the listing's metadata prefetch skips fresh entries), so a warm
//! view copied a directory of the seed-001 tree slower than one just
//! restarted, whose prefetch had read the inodes 8 at once
//! (bench/results/fileview-rsync-in.md). Warming them here makes the opens
//! find them cached, as readahead does for data.

use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rustc_hash::FxHashMap;

/// How long after warming a directory another open in it does not warm it
/// again: a copy opens its files within this, and a directory whose files
/// are opened now and then is not read whole every time.
const WINDOW: Duration = Duration::from_secs(5);

/// Directories warmed lately.
#[derive(Default)]
pub(crate) struct OpenAhead {
    last: Mutex<FxHashMap<u64, Instant>>,
}

impl OpenAhead {
    /// Whether an open in directory node `dir` should warm it now; if so,
    /// it counts as warmed from now.
    pub(crate) fn due(&self, dir: u64) -> bool {
        let now = Instant::now();
        let mut last = self.last.lock();
        if last.get(&dir).is_some_and(|t| now.duration_since(*t) < WINDOW) {
            return false;
        }
        // Forget the long past, so the map stays as small as what is
        // being opened now.
        if last.len() >= 4096 {
            last.retain(|_, t| now.duration_since(*t) < WINDOW);
        }
        last.insert(dir, now);
        true
    }
}

/// `lstat`s each of `names` under the directory `dir` (a descriptor of it
/// in SOURCE), `threads` at once; the results are not needed, only that
/// SOURCE has read the inodes. Returns how many were asked.
pub(crate) fn warm(dir: OwnedFd, names: &[Vec<u8>], threads: usize) -> u64 {
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads.min(names.len()) {
            s.spawn(|| {
                while let Some(name) = names.get(next.fetch_add(1, Relaxed)) {
                    let _ = crate::sys::lstat_at(dir.as_fd(), OsStr::from_bytes(name));
                    done.fetch_add(1, Relaxed);
                }
            });
        }
    });
    done.load(Relaxed) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_is_warmed_once_per_window() {
        let oa = OpenAhead::default();
        assert!(oa.due(7));
        assert!(!oa.due(7), "warmed again within the window");
        assert!(oa.due(8), "another directory is its own");
    }

    #[test]
    fn warm_asks_every_name_once() {
        let dir = tempfile::tempdir().unwrap();
        let names: Vec<Vec<u8>> = (0..50).map(|i| format!("f{i}").into_bytes()).collect();
        for n in names.iter().take(30) {
            std::fs::write(dir.path().join(OsStr::from_bytes(n)), b"x").unwrap();
        }
        let fd = OwnedFd::from(std::fs::File::open(dir.path()).unwrap());
        // Missing names are asked too (and fail): 50, not 30.
        assert_eq!(warm(fd, &names, 8), 50);
    }
}
