//! `arcache mount` through the real binary and a real FUSE mount
//! (`docs/fileview.md`): the view equals SOURCE, a second pass is served
//! from the ARC, changes made in SOURCE are seen within the revalidate
//! window, every change made through the view is in SOURCE at once,
//! `--read-only`, and how the mount ends (SIGTERM, `fusermount3 -u`,
//! kill -9: never a dangling mount).

mod common;

use std::collections::BTreeMap;
use std::ffi::CString;
use std::fs;
use std::io::{ErrorKind, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{failpoints_armed, skip_or_fail, BIN};

/// Every test ends within this, hung FUSE or not: the watchdog kills the
/// server, which turns any request still waiting into ENOTCONN.
const TEST_LIMIT: Duration = Duration::from_secs(120);

fn fuse_available() -> bool {
    if !Path::new("/dev/fuse").exists() {
        skip_or_fail("no /dev/fuse");
        return false;
    }
    if Command::new("fusermount3").arg("-V").output().is_err() {
        skip_or_fail("no fusermount3 (Debian: fuse3)");
        return false;
    }
    true
}

fn is_mounted(path: &Path) -> bool {
    let want = path.to_string_lossy().replace(' ', "\\040");
    fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .any(|l| l.split(' ').nth(4) == Some(want.as_str()))
}

/// Waits (at most 10 s) for `path` to be a bare directory again.
fn wait_unmounted(path: &Path, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while is_mounted(path) {
        assert!(Instant::now() < deadline, "{what}: still mounted after 10 s");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn fusermount_u(path: &Path) {
    let _ = Command::new("fusermount3").args(["-u", "-z"]).arg(path).stderr(Stdio::null()).status();
}

/// The kernel's dentries and inodes are the machine's, not a mount's:
/// a test that drops them (`drop_caches`) makes every running view forget
/// its nodes, and a view that forgot a node looks it up again and can see
/// SOURCE's changes before its window ends (a control case of the inotify
/// test failed so whenever it ran beside one). Every view holds this lock
/// shared for its life; a test that drops the caches holds it alone. A
/// file lock, so that test processes (nextest runs each test in its own)
/// and test threads alike wait for each other.
struct KernelCaches {
    _held: fs::File,
}

impl KernelCaches {
    fn shared() -> KernelCaches {
        KernelCaches::take(libc::LOCK_SH)
    }

    fn alone() -> KernelCaches {
        KernelCaches::take(libc::LOCK_EX)
    }

    fn take(how: i32) -> KernelCaches {
        use std::os::fd::AsRawFd;
        let path = std::env::temp_dir().join("arcache-tests-kernel-caches.lock");
        let file = fs::OpenOptions::new().create(true).append(true).open(&path).expect("open the lock file");
        // SAFETY: flock on a descriptor this function owns.
        while unsafe { libc::flock(file.as_raw_fd(), how) } != 0 {
            let e = std::io::Error::last_os_error();
            assert_eq!(e.kind(), ErrorKind::Interrupted, "flock {}: {e}", path.display());
        }
        KernelCaches { _held: file }
    }
}

/// A running `arcache mount` of `dir/src` at `dir/mnt`, unmounted and
/// killed on drop whatever happened.
struct View {
    child: Option<Child>,
    src: PathBuf,
    mnt: PathBuf,
    control: PathBuf,
    done: Arc<AtomicBool>,
    _dir: Arc<tempfile::TempDir>,
    // Dropped after the unmount (fields drop after `Drop::drop`).
    _caches: KernelCaches,
}

impl View {
    fn start(dir: &Arc<tempfile::TempDir>, args: &[&str]) -> View {
        View::start_with_env(dir, args, &[])
    }

    /// For a test that drops the kernel's caches: no other view runs
    /// meanwhile.
    fn start_alone(dir: &Arc<tempfile::TempDir>, args: &[&str]) -> View {
        View::start_locked(dir, args, &[], KernelCaches::alone())
    }

    fn start_with_env(dir: &Arc<tempfile::TempDir>, args: &[&str], env: &[(&str, &str)]) -> View {
        View::start_locked(dir, args, env, KernelCaches::shared())
    }

    fn start_locked(
        dir: &Arc<tempfile::TempDir>,
        args: &[&str],
        env: &[(&str, &str)],
        caches: KernelCaches,
    ) -> View {
        let src = dir.path().join("src");
        let mnt = dir.path().join("mnt");
        let control = dir.path().join("control.sock");
        fs::create_dir_all(&src).unwrap();
        fs::create_dir_all(&mnt).unwrap();
        let child = Command::new(BIN)
            .arg("mount")
            .arg(&src)
            .arg(&mnt)
            .arg("--control")
            .arg(&control)
            .arg("--state-dir")
            .arg(dir.path().join("state"))
            .args(["--arc-max", "64M"])
            .args(args)
            .envs(env.iter().copied())
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn arcache mount");
        let done = Arc::new(AtomicBool::new(false));
        {
            let (done, pid, mnt) = (Arc::clone(&done), child.id() as i32, mnt.clone());
            std::thread::spawn(move || {
                let until = Instant::now() + TEST_LIMIT;
                while Instant::now() < until {
                    if done.load(Ordering::Relaxed) {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                eprintln!("watchdog: killing arcache mount after {TEST_LIMIT:?}");
                // SAFETY: a signal to the test's own child.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                fusermount_u(&mnt);
            });
        }
        let mut v =
            View { child: Some(child), src, mnt, control, done, _dir: Arc::clone(dir), _caches: caches };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !(is_mounted(&v.mnt) && v.control.exists()) {
            if let Some(st) = v.child.as_mut().unwrap().try_wait().unwrap() {
                let out = v.child.take().unwrap().wait_with_output().unwrap();
                panic!("arcache mount exited ({st}): {}", String::from_utf8_lossy(&out.stderr));
            }
            assert!(Instant::now() < deadline, "arcache mount did not come up in 20 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        // The view's counters join the server's just after the mount.
        while v.stat().get("fileview_source_stats").is_none() {
            assert!(Instant::now() < deadline, "the view's counters did not show in 20 s");
            std::thread::sleep(Duration::from_millis(20));
        }
        v
    }

    fn stat(&self) -> serde_json::Value {
        let out = Command::new(BIN)
            .args(["stat", "--json", "--control"])
            .arg(&self.control)
            .output()
            .expect("run arcache stat");
        assert!(out.status.success(), "stat failed: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("stat --json prints JSON")
    }

    fn signal(&self, sig: i32) {
        let pid = self.child.as_ref().expect("running").id() as i32;
        // SAFETY: a signal to the test's own child.
        unsafe { libc::kill(pid, sig) };
    }

    /// Waits for the server to exit; its status and stderr.
    fn wait(&mut self) -> (std::process::ExitStatus, String) {
        let out = common::wait_timeout(self.child.take().expect("running"), Duration::from_secs(30));
        (out.status, String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

impl Drop for View {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        fusermount_u(&self.mnt);
        self.done.store(true, Ordering::Relaxed);
    }
}

fn new_dir() -> Arc<tempfile::TempDir> {
    Arc::new(tempfile::tempdir().unwrap())
}

fn n(v: &serde_json::Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("stat has no {k}"))
}

/// Every counter in `keys` is the same in `after` as in `before`: SOURCE
/// was not asked again `when`.
fn assert_no_rise(before: &serde_json::Value, after: &serde_json::Value, keys: &[&str], when: &str) {
    for k in keys {
        assert_eq!(n(after, k) - n(before, k), 0, "{k} rose {when}: SOURCE was asked again");
    }
}

fn set_xattr(p: &Path, name: &str, value: &[u8]) -> std::io::Result<()> {
    let cp = CString::new(p.as_os_str().as_bytes()).unwrap();
    let cn = CString::new(name).unwrap();
    // SAFETY: valid C strings and a buffer of value.len() bytes.
    let r = unsafe { libc::lsetxattr(cp.as_ptr(), cn.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    if r < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// The `user.` xattrs of `p` (others, like security.*, depend on the host).
fn user_xattrs(p: &Path) -> BTreeMap<String, Vec<u8>> {
    let cp = CString::new(p.as_os_str().as_bytes()).unwrap();
    let mut names = vec![0u8; 4096];
    // SAFETY: valid C string and buffer.
    let len = unsafe { libc::llistxattr(cp.as_ptr(), names.as_mut_ptr().cast(), names.len()) };
    assert!(len >= 0, "listxattr {}: {}", p.display(), std::io::Error::last_os_error());
    names.truncate(len as usize);
    let mut out = BTreeMap::new();
    for name in names.split(|&c| c == 0).filter(|n| n.starts_with(b"user.")) {
        let cn = CString::new(name).unwrap();
        let mut v = vec![0u8; 65536];
        // SAFETY: as above.
        let l = unsafe { libc::lgetxattr(cp.as_ptr(), cn.as_ptr(), v.as_mut_ptr().cast(), v.len()) };
        assert!(l >= 0, "getxattr: {}", std::io::Error::last_os_error());
        v.truncate(l as usize);
        out.insert(String::from_utf8_lossy(name).into_owned(), v);
    }
    out
}

/// A small tree: nested directories, files from empty to a few records,
/// symlinks (one dangling), xattrs, a hard link.
fn make_tree(src: &Path) {
    let mut seed = 1u64;
    for d in ["a", "a/b", "a/b/c", "empty", "many"] {
        fs::create_dir_all(src.join(d)).unwrap();
    }
    for (i, size) in [0usize, 1, 4095, 4096, 50_000, 131_072, 131_073, 300_000].iter().enumerate() {
        seed += 1;
        common::random_file(&src.join(format!("a/f{i}")), *size, seed);
    }
    for i in 0..300 {
        fs::write(src.join(format!("many/file-{i:04}.png")), format!("small file {i}\n").repeat(i % 7 + 1))
            .unwrap();
    }
    common::random_file(&src.join("a/b/c/deep"), 70_000, 99);
    std::os::unix::fs::symlink("f4", src.join("a/to-f4")).unwrap();
    std::os::unix::fs::symlink("../nowhere", src.join("a/dangling")).unwrap();
    fs::hard_link(src.join("a/f2"), src.join("a/b/f2-link")).unwrap();
    set_xattr(&src.join("a/f1"), "user.colour", b"blue").unwrap();
    set_xattr(&src.join("a/f1"), "user.empty", b"").unwrap();
    set_xattr(&src.join("a/b"), "user.dir", &[0, 1, 2, 255]).unwrap();
    fs::set_permissions(src.join("a/f3"), fs::Permissions::from_mode(0o640)).unwrap();
}

/// Walks `view` and `src` side by side: the same names, types, modes,
/// sizes, owners, link counts, mtimes, bytes, link targets and xattrs.
fn compare_trees(view: &Path, src: &Path) -> usize {
    let mut seen = 0;
    let list = |p: &Path| -> Vec<String> {
        let mut v: Vec<String> =
            fs::read_dir(p).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    };
    let (names, want) = (list(view), list(src));
    assert_eq!(names, want, "listing of {}", view.display());
    for name in names {
        let (v, s) = (view.join(&name), src.join(&name));
        let (vm, sm) = (fs::symlink_metadata(&v).unwrap(), fs::symlink_metadata(&s).unwrap());
        let what = v.display().to_string();
        assert_eq!(vm.mode(), sm.mode(), "{what}: mode");
        assert_eq!(vm.size(), sm.size(), "{what}: size");
        assert_eq!((vm.uid(), vm.gid()), (sm.uid(), sm.gid()), "{what}: owner");
        assert_eq!(vm.nlink(), sm.nlink(), "{what}: nlink");
        assert_eq!((vm.mtime(), vm.mtime_nsec()), (sm.mtime(), sm.mtime_nsec()), "{what}: mtime");
        assert_eq!(user_xattrs(&v), user_xattrs(&s), "{what}: xattrs");
        if sm.file_type().is_symlink() {
            assert_eq!(fs::read_link(&v).unwrap(), fs::read_link(&s).unwrap(), "{what}: target");
        } else if sm.is_dir() {
            seen += compare_trees(&v, &s);
        } else {
            assert!(fs::read(&v).unwrap() == fs::read(&s).unwrap(), "{what}: contents differ");
        }
        seen += 1;
    }
    seen
}

#[test]
fn the_view_equals_source_and_a_second_pass_is_served_from_the_arc() {
    if !fuse_available() {
        return;
    }
    let dir = new_dir();
    make_tree(&dir.path().join("src"));
    // A window longer than the test: the second pass must not need SOURCE.
    // Without keep_cache, so the second pass reaches the view's ARC rather
    // than stopping at the kernel's page cache.
    let v = View::start(&dir, &["--revalidate", "60", "--no-keep-cache"]);
    let seen = compare_trees(&v.mnt, &v.src);
    assert!(seen > 300, "walked {seen} entries");
    let first = v.stat();
    assert!(n(&first, "demand_metadata_misses") > 0 && n(&first, "demand_data_misses") > 0);
    assert!(n(&first, "arc_meta_used") > 0 && n(&first, "metadata_size") > 0);
    assert!(n(&first, "fileview_source_reads") > 0);
    // Records are read with O_DIRECT where SOURCE's file system takes it.
    let probe =
        fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(v.src.join("a/f4")).is_ok();
    if probe {
        assert_eq!(n(&first, "fileview_source_direct_reads"), n(&first, "fileview_source_reads"));
    } else {
        assert_eq!(n(&first, "fileview_source_direct_reads"), 0);
    }

    compare_trees(&v.mnt, &v.src);
    let second = v.stat();
    let rise = |k: &str| n(&second, k) - n(&first, k);
    assert!(rise("demand_metadata_hits") > 300, "metadata hits rose by {}", rise("demand_metadata_hits"));
    assert!(rise("demand_data_hits") > 10, "data hits rose by {}", rise("demand_data_hits"));
    let source_calls = [
        "fileview_source_reads",
        "fileview_source_stats",
        "fileview_source_readdirs",
        "fileview_source_readlinks",
        "fileview_source_xattr_reads",
        "backing_reads",
        "demand_data_misses",
    ];
    assert_no_rise(&first, &second, &source_calls, "on the second pass");
    assert!(n(&second, "arc_meta_max") >= n(&second, "arc_meta_used"));

    // The control socket takes get, set and summary as serve's does.
    let ctl = |args: &[&str]| {
        let out = Command::new(BIN).args(args).arg("--control").arg(&v.control).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    ctl(&["set", "zfs_arc_max=48M"]);
    assert!(ctl(&["get", "zfs_arc_max"]).contains("48"), "set did not take");
    assert_eq!(n(&v.stat(), "c_max"), 48 << 20);
    // Metadata's share of the ARC, and how strongly metadata ghost hits
    // move it (OpenZFS 2.2's names).
    let meta = n(&v.stat(), "meta");
    assert!(meta > 0 && meta <= 1 << 32, "meta {meta}");
    ctl(&["set", "zfs_arc_meta_balance=1000"]);
    assert!(ctl(&["get", "zfs_arc_meta_balance"]).contains("1000"), "set did not take");
    assert!(!ctl(&["summary"]).is_empty());
}

/// The table of source files is charged to the ARC (`dnode_size`) and
/// kept within `arc_dnode_limit` once the kernel lets go of its nodes; a
/// file whose object was dropped is found again with its cached listing
/// and data, by the same record numbers, and reads right.
#[test]
fn the_table_of_source_files_stays_within_its_limit_and_what_it_dropped_still_hits() {
    if !fuse_available() {
        return;
    }
    let dir = new_dir();
    let src = dir.path().join("src");
    make_tree(&src);
    for d in 0..10 {
        let sub = src.join(format!("more/d{d}"));
        fs::create_dir_all(&sub).unwrap();
        for i in 0..200 {
            fs::write(sub.join(format!("f{i}")), format!("{d}/{i}\n").repeat(i % 5 + 1)).unwrap();
        }
    }
    let limit = 64u64 << 10;
    let v =
        View::start_alone(&dir, &["--revalidate", "600", "--set", &format!("zfs_arc_dnode_limit={limit}")]);
    let files = compare_trees(&v.mnt, &v.src) as u64;
    let walked = v.stat();
    assert_eq!(n(&walked, "arc_dnode_limit"), limit);
    assert!(n(&walked, "fileview_objects") >= files, "the kernel held every node, yet objects went");
    assert!(n(&walked, "dnode_size") > limit, "the tables were not charged: {}", n(&walked, "dnode_size"));
    assert!(n(&walked, "size") >= n(&walked, "dnode_size"));
    if fs::write("/proc/sys/vm/drop_caches", "2").is_err() {
        skip_or_fail("cannot write /proc/sys/vm/drop_caches (needs root)");
        return;
    }
    // The kernel's forgets come in batches after drop_caches returns (and
    // later still while other tests keep the machine busy). An object
    // takes well over 100 bytes.
    let until = Instant::now() + Duration::from_secs(20);
    let mut forgot = v.stat();
    while n(&forgot, "fileview_objects") * 100 > limit && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
        forgot = v.stat();
    }
    assert!(
        n(&forgot, "fileview_nodes") + 1000 <= n(&walked, "fileview_nodes"),
        "the kernel did not forget the nodes ({} -> {}): the test did not reach its case",
        n(&walked, "fileview_nodes"),
        n(&forgot, "fileview_nodes")
    );
    let objects = n(&forgot, "fileview_objects");
    assert!(
        objects * 100 <= limit,
        "{objects} objects kept within {limit} bytes, {} nodes held",
        n(&forgot, "fileview_nodes")
    );
    assert!(n(&forgot, "fileview_objects_trimmed") + objects >= files, "objects went without being counted");
    compare_trees(&v.mnt, &v.src);
    let again = v.stat();
    // Found again by a stat of SOURCE each, every listing and every byte
    // came from the ARC: the records outlived their objects.
    assert!(n(&again, "fileview_source_stats") > n(&forgot, "fileview_source_stats"));
    assert_no_rise(&forgot, &again, &["fileview_source_readdirs", "fileview_source_reads"], "after the trim");
}

#[test]
fn nodes_the_kernel_forgot_are_found_again_without_asking_source() {
    if !fuse_available() {
        return;
    }
    let dir = new_dir();
    make_tree(&dir.path().join("src"));
    let v = View::start_alone(&dir, &["--revalidate", "600"]);
    compare_trees(&v.mnt, &v.src);
    let before = v.stat();
    // The kernel drops its dentries and inodes and tells the view to
    // forget the nodes (what `echo 3 > drop_caches` before a benchmark
    // pass does, and memory pressure on a file server). The objects and
    // records stay: a lookup finds a name's object through the parent's
    // cached listing, not by asking SOURCE again.
    if fs::write("/proc/sys/vm/drop_caches", "2").is_err() {
        skip_or_fail("cannot write /proc/sys/vm/drop_caches (needs root)");
        return;
    }
    let forgot = v.stat();
    assert!(
        n(&forgot, "fileview_nodes") + 100 < n(&before, "fileview_nodes"),
        "the kernel did not forget the nodes ({} -> {}): the test did not reach its case",
        n(&before, "fileview_nodes"),
        n(&forgot, "fileview_nodes")
    );
    compare_trees(&v.mnt, &v.src);
    let after = v.stat();
    // Listings came with their entries' attributes (readdirplus in every
    // reply, not only a listing's first): the walk's lstats needed no
    // lookup per name (`many` alone has 300).
    let lookups = n(&after, "fileview_lookups") - n(&forgot, "fileview_lookups");
    assert!(lookups < 50, "{lookups} lookups on a walk after the kernel forgot its dentries");
    let source_calls = [
        "fileview_source_stats",
        "fileview_source_readdirs",
        "fileview_source_reads",
        "fileview_revalidations",
    ];
    assert_no_rise(&forgot, &after, &source_calls, "after the kernel forgot its nodes");
    assert!(n(&after, "demand_metadata_hits") - n(&forgot, "demand_metadata_hits") > 300);
}

#[test]
fn with_inotify_a_warm_pass_past_the_window_asks_source_nothing() {
    if !fuse_available() {
        return;
    }
    let dir = new_dir();
    make_tree(&dir.path().join("src"));
    // The default window (1 s): without inotify every use after it would
    // be an lstat of SOURCE.
    let v = View::start(&dir, &[]);
    compare_trees(&v.mnt, &v.src);
    std::thread::sleep(Duration::from_millis(1500));
    let before = v.stat();
    assert!(
        n(&before, "fileview_watched_dirs") >= 5,
        "directories watched: {}",
        n(&before, "fileview_watched_dirs")
    );
    compare_trees(&v.mnt, &v.src);
    let after = v.stat();
    let rise = |k: &str| n(&after, k) - n(&before, k);
    // Hard links (a/f2, a/b/f2-link) are never vouched for by a watch.
    assert!(rise("fileview_source_stats") <= 4, "source stats rose by {}", rise("fileview_source_stats"));
    assert_eq!(rise("fileview_revalidations"), rise("fileview_source_stats"));
    assert_eq!(rise("fileview_source_reads"), 0);
}

#[test]
fn a_change_that_sends_no_event_is_seen_within_watch_max() {
    if !fuse_available() {
        return;
    }
    let dir = new_dir();
    let src = dir.path().join("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("f"), vec![b'a'; 4096]).unwrap();
    let v = View::start(&dir, &["--revalidate", "0.2", "--watch-max", "1.5"]);
    let mtime = |p: &Path| {
        let m = fs::metadata(p).unwrap();
        (m.mtime(), m.mtime_nsec())
    };
    // Listed (the root watched), then checked past the window, so the
    // file's check rests on its directory's watch.
    assert_eq!(fs::read_dir(&v.mnt).unwrap().count(), 1);
    std::thread::sleep(Duration::from_millis(300));
    let old = mtime(&v.mnt.join("f"));
    // A write through a shared mapping: the file's mtime moves, and
    // inotify sends no event for it.
    std::thread::sleep(Duration::from_millis(20));
    let f = fs::OpenOptions::new().read(true).write(true).open(src.join("f")).unwrap();
    // SAFETY: a fresh shared mapping of a 4096-byte file, written once and unmapped.
    unsafe {
        use std::os::fd::AsRawFd;
        let p = libc::mmap(
            std::ptr::null_mut(),
            4096,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED);
        *(p as *mut u8) = b'b';
        libc::msync(p, 4096, libc::MS_SYNC);
        libc::munmap(p, 4096);
    }
    let written = Instant::now();
    let new = mtime(&src.join("f"));
    assert_ne!(new, old, "the mapped write did not move mtime: the test cannot tell");
    // Past the 0.2 s window the watch still vouches (no event came)...
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(mtime(&v.mnt.join("f")), old, "rechecked within --watch-max: the watch did not vouch");
    // ...but no longer than --watch-max.
    while mtime(&v.mnt.join("f")) != new {
        assert!(
            written.elapsed() < Duration::from_secs(4),
            "a change with no event unseen after --watch-max"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn with_inotify_changes_in_source_are_seen_at_once_and_without_it_only_after_the_window() {
    if !fuse_available() {
        return;
    }
    for inotify in [true, false] {
        let dir = new_dir();
        let src = dir.path().join("src");
        fs::create_dir_all(src.join("d")).unwrap();
        let old = common::random_file(&src.join("d/same-size"), 200_000, 1);
        fs::write(src.join("d/grows"), b"first line\n").unwrap();
        fs::write(src.join("d/goes"), b"going").unwrap();
        fs::write(src.join("d/replaced"), b"old file").unwrap();
        let args: &[&str] =
            if inotify { &["--revalidate", "600"] } else { &["--revalidate", "600", "--watch-max", "0"] };
        let v = View::start(&dir, args);
        let m = v.mnt.join("d");
        assert!(fs::read(m.join("same-size")).unwrap() == old);
        assert_eq!(fs::read(m.join("grows")).unwrap(), b"first line\n");
        assert_eq!(fs::read(m.join("goes")).unwrap(), b"going");
        assert_eq!(fs::read(m.join("replaced")).unwrap(), b"old file");
        assert!(!m.join("new").exists());
        let names = || {
            let mut v: Vec<String> = fs::read_dir(&m)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            v.sort();
            v.join(" ")
        };
        // Listed, so lookups are answered from the view's cached listing.
        assert_eq!(names(), "goes grows replaced same-size");

        let new = {
            let mut b = old.clone();
            for x in b.iter_mut().step_by(1000) {
                *x = x.wrapping_add(1);
            }
            b
        };
        fs::OpenOptions::new().write(true).open(src.join("d/same-size")).unwrap().write_all(&new).unwrap();
        fs::OpenOptions::new()
            .append(true)
            .open(src.join("d/grows"))
            .unwrap()
            .write_all(b"second\n")
            .unwrap();
        fs::remove_file(src.join("d/goes")).unwrap();
        fs::write(src.join("d/new"), b"created").unwrap();
        fs::write(src.join("d/replacement"), b"new file").unwrap();
        fs::rename(src.join("d/replacement"), src.join("d/replaced")).unwrap();
        // The events are read within a poll period; a little for it.
        std::thread::sleep(Duration::from_millis(400));
        let seen = [
            // Attributes, names and the listing come from caches (the
            // kernel's, the view's) for the window: only an event makes
            // these seen before it ends.
            fs::metadata(m.join("grows")).unwrap().len() == 18,
            !m.join("goes").exists(),
            names() == "grows new replaced same-size",
            // An open asks SOURCE (close-to-open), so what is opened is seen
            // either way: a changed file, one whose size the kernel holds
            // wrong (a new node), one replaced under its name (ESTALE and a
            // new lookup, the parent's listing dropped).
            fs::read(m.join("same-size")).unwrap() == new,
            fs::read(m.join("grows")).unwrap() == b"first line\nsecond\n",
            // A name the cached listing lacks: hidden without an event.
            fs::read(m.join("new")).ok().as_deref() == Some(&b"created"[..]),
            fs::read(m.join("replaced")).unwrap() == b"new file",
        ];
        if inotify {
            assert_eq!(seen, [true; 7], "changes not seen at once with inotify (a 600 s window)");
            assert!(n(&v.stat(), "fileview_inotify_events") >= 5);
        } else {
            // The control: the same changes inside a 600 s window without
            // inotify stay unseen, so the case above is inotify's doing.
            assert_eq!(
                seen,
                [false, false, false, true, true, false, true],
                "without inotify the window hides attributes and names, not what an open reads"
            );
            assert_eq!(n(&v.stat(), "fileview_watched_dirs"), 0);
        }
    }
}

#[test]
fn a_listing_prefetches_its_entries_attributes_once_and_lookups_then_hit() {
    if !fuse_available() {
        return;
    }
    let dir = new_dir();
    make_tree(&dir.path().join("src"));
    let v = View::start(&dir, &["--revalidate", "600"]);
    let before = v.stat();
    let names: Vec<_> = fs::read_dir(v.mnt.join("many")).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names.len(), 300);
    for name in &names {
        let (vm, sm) = (
            fs::symlink_metadata(v.mnt.join("many").join(name)).unwrap(),
            fs::symlink_metadata(v.src.join("many").join(name)).unwrap(),
        );
        assert_eq!((vm.size(), vm.mtime(), vm.mtime_nsec()), (sm.size(), sm.mtime(), sm.mtime_nsec()));
    }
    let after = v.stat();
    let rise = |k: &str| n(&after, k) - n(&before, k);
    assert!(rise("prefetch_metadata_misses") >= 300, "prefetched {}", rise("prefetch_metadata_misses"));
    // Each entry asked of SOURCE once (the prefetch's), not again by the
    // lookups that followed (a few for the directories on the way).
    assert!(
        rise("fileview_source_stats") <= 300 + 5,
        "source stats rose by {}",
        rise("fileview_source_stats")
    );
    // A second listing, the attributes fresh: nothing to read.
    let hits = n(&after, "prefetch_metadata_hits");
    let src = v.src.join("many");
    fs::write(src.join("one-more"), b"x").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(fs::read_dir(v.mnt.join("many")).unwrap().count(), 301);
    let last = v.stat();
    assert!(n(&last, "prefetch_metadata_hits") >= hits + 300, "a fresh entry was read again");
    assert!(n(&last, "prefetch_metadata_misses") - n(&after, "prefetch_metadata_misses") <= 2);
}

/// fsx (the File System eXerciser, fsx-rs from crates.io, which `.ci/run`
/// installs): a third-party random sequence of writes, truncates, reads and
/// mmap reads and writes on one file, every read checked against its own
/// model of the file.
fn fsx_bin() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("ARCACHE_FSX") {
        return Some(PathBuf::from(p));
    }
    let found = Command::new("fsx").arg("--version").output().is_ok_and(|o| o.status.success());
    found.then(|| PathBuf::from("fsx"))
}

#[test]
fn fsx_through_the_view_finds_every_byte_it_wrote() {
    if !fuse_available() {
        return;
    }
    let Some(fsx) = fsx_bin() else {
        skip_or_fail("no fsx (cargo install fsx; .ci/run does)");
        return;
    };
    // The default view, and one that checks SOURCE at every use with 4K
    // records (every record boundary in play) and no inotify.
    for (i, args) in
        [&[][..], &["--revalidate", "0", "--recordsize", "4K", "--watch-max", "0"][..]].iter().enumerate()
    {
        let dir = new_dir();
        let v = View::start(&dir, args);
        let child = Command::new(&fsx)
            .args(["-N", "4000", "-S", &format!("{}", 22 + i), "-P"])
            .arg(dir.path())
            .arg(v.mnt.join("fsx-file"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run fsx");
        let out = common::wait_timeout(child, Duration::from_secs(90));
        assert!(
            out.status.success(),
            "fsx {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        // What fsx left is SOURCE's file, byte for byte.
        assert!(fs::read(v.mnt.join("fsx-file")).unwrap() == fs::read(v.src.join("fsx-file")).unwrap());
        assert!(n(&v.stat(), "fileview_source_writes") > 100, "fsx wrote through the view");
    }
}

/// What the model test writes as version `ver` of `name`: the tag repeated,
/// so a read shows which version it is and whether it is all of one.
fn versioned(name: &str, ver: u64) -> Vec<u8> {
    format!("{name}@{ver}|").repeat(500 + (ver as usize * 37) % 3000).into_bytes()
}

/// A read of `name` through the view is a whole version of it: never
/// records of two versions, never bytes no version had.
fn check_whole_version(name: &str, got: &[u8]) {
    let tag_end = got.iter().position(|&b| b == b'|').unwrap_or_else(|| {
        panic!("{name}: a read with no tag: {} bytes, starting {:?}", got.len(), &got[..got.len().min(16)])
    });
    let tag = std::str::from_utf8(&got[..tag_end]).expect("a tag in UTF-8");
    let ver: u64 = tag
        .strip_prefix(&format!("{name}@"))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("{name}: a read of another file ({tag:?}, {} bytes)", got.len()));
    let want = versioned(name, ver);
    assert!(
        got == want,
        "{name}: a read mixed versions or lengths (starts as version {ver}; {} bytes read, the version has {}; \
         a prefix of it: {}; first difference at {:?})",
        got.len(),
        want.len(),
        want.starts_with(got),
        got.iter().zip(&want).position(|(a, b)| a != b)
    );
}

/// The view against SOURCE as a model, both changed at once: a writer
/// through the view and one on SOURCE replace files (write and rename, so
/// each name always holds one whole version on SOURCE) and unlink them,
/// while readers read through the view. Every read must be one whole
/// version; once both stop, within the window the view equals SOURCE.
#[test]
fn the_view_and_source_changed_at_once_agree_and_no_read_mixes_versions() {
    if !fuse_available() {
        return;
    }
    for args in [&["--recordsize", "4K"][..], &["--recordsize", "4K", "--watch-max", "0"][..]] {
        let dir = new_dir();
        let src = dir.path().join("src");
        let names: Vec<String> = (0..3).flat_map(|d| (0..5).map(move |f| format!("d{d}/f{f}"))).collect();
        for d in 0..3 {
            fs::create_dir_all(src.join(format!("d{d}"))).unwrap();
        }
        for name in &names {
            fs::write(src.join(name), versioned(name, 0)).unwrap();
        }
        let v = View::start(&dir, args);
        let next = Arc::new(std::sync::atomic::AtomicU64::new(1));
        let stop = Arc::new(AtomicBool::new(false));
        let writer = |root: PathBuf, seed: u64, side: &'static str| {
            let (names, next, stop) = (names.clone(), Arc::clone(&next), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut x = seed;
                let mut step = || arc_policy::xorshift(&mut x);
                let mut done = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let name = &names[(step() % names.len() as u64) as usize];
                    let path = root.join(name);
                    if step() % 8 == 0 {
                        let _ = fs::remove_file(&path);
                    } else {
                        let ver = next.fetch_add(1, Ordering::Relaxed);
                        let tmp = root.join(format!("{}.{side}.tmp", name.replace('/', "-")));
                        fs::write(&tmp, versioned(name, ver)).unwrap();
                        fs::rename(&tmp, &path).unwrap();
                    }
                    done += 1;
                }
                done
            })
        };
        let writers =
            [writer(v.mnt.clone(), 0x9e37_79b9, "view"), writer(src.clone(), 0x1234_5678, "source")];
        let readers: Vec<_> = (0..2)
            .map(|r| {
                let (names, stop, mnt) = (names.clone(), Arc::clone(&stop), v.mnt.clone());
                std::thread::spawn(move || {
                    let (mut whole, mut i) = (0u64, r);
                    while !stop.load(Ordering::Relaxed) {
                        i += 1;
                        let name = &names[i % names.len()];
                        match fs::read(mnt.join(name)) {
                            Ok(got) => {
                                check_whole_version(name, &got);
                                whole += 1;
                            }
                            // Unlinked meanwhile, or (a lazily opened
                            // handle) replaced before a record was read.
                            Err(e)
                                if e.kind() == ErrorKind::NotFound
                                    || e.raw_os_error() == Some(libc::ESTALE) => {}
                            Err(e) => panic!("reading {name} through the view: {e}"),
                        }
                    }
                    whole
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs(4));
        stop.store(true, Ordering::Relaxed);
        let wrote: Vec<u64> = writers.into_iter().map(|w| w.join().unwrap()).collect();
        let read: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
        assert!(
            wrote.iter().all(|&w| w > 20) && read > 50,
            "{args:?}: too little done: {wrote:?} writes, {read} reads"
        );
        // The case under test was reached: the view found files replaced
        // behind it (a node retired, or a version dropped) while serving.
        let seen = n(&v.stat(), "fileview_changes_seen");
        assert!(
            seen > 10,
            "{args:?}: the view met only {seen} changes made behind it: the race was not reached"
        );
        // Past the window (1 s) and the kernel's lifetimes: the same files.
        std::thread::sleep(Duration::from_millis(1500));
        for name in &names {
            let (got, want) = (fs::read(v.mnt.join(name)).ok(), fs::read(src.join(name)).ok());
            assert!(got == want, "{args:?}: {name} differs from SOURCE after both stopped");
        }
        compare_trees(&v.mnt, &v.src);
    }
}

/// Reads `p` until it equals `want` or `limit` passes; how long that took.
fn until_equal(p: &Path, want: &[u8], limit: Duration) -> Duration {
    let start = Instant::now();
    loop {
        match fs::read(p) {
            Ok(got) if got == want => return start.elapsed(),
            _ if start.elapsed() > limit => {
                panic!("{} did not show the change within {limit:?}", p.display())
            }
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

#[test]
fn changes_made_in_source_are_seen_within_the_window_and_old_data_never_after() {
    if !fuse_available() {
        return;
    }
    let dir = new_dir();
    let src = dir.path().join("src");
    fs::create_dir_all(src.join("d")).unwrap();
    let old = common::random_file(&src.join("same-size"), 200_000, 1);
    fs::write(src.join("grows"), b"first line\n").unwrap();
    fs::write(src.join("d/moves"), b"moving").unwrap();
    fs::write(src.join("goes"), b"going").unwrap();
    let v = View::start(&dir, &["--revalidate", "1"]);
    let m = &v.mnt;
    // Cache everything.
    assert!(fs::read(m.join("same-size")).unwrap() == old);
    assert_eq!(fs::read(m.join("grows")).unwrap(), b"first line\n");
    assert_eq!(fs::read(m.join("d/moves")).unwrap(), b"moving");
    assert_eq!(fs::read(m.join("goes")).unwrap(), b"going");
    assert!(fs::read(m.join("same-size")).unwrap() == old);

    // Rewritten in place, same size: only mtime and ctime tell.
    let new = {
        let mut b = old.clone();
        for x in b.iter_mut().step_by(1000) {
            *x = x.wrapping_add(1);
        }
        b
    };
    let mut f = fs::OpenOptions::new().write(true).open(src.join("same-size")).unwrap();
    f.write_all(&new).unwrap();
    drop(f);
    let mut g = fs::OpenOptions::new().append(true).open(src.join("grows")).unwrap();
    g.write_all(b"second line\n").unwrap();
    drop(g);
    fs::rename(src.join("d/moves"), src.join("moved")).unwrap();
    fs::remove_file(src.join("goes")).unwrap();
    let changed = Instant::now();

    let window = Duration::from_millis(1000);
    // Seen within the window (and a little for the kernel's own TTL).
    until_equal(&m.join("same-size"), &new, window + Duration::from_millis(600));
    until_equal(&m.join("grows"), b"first line\nsecond line\n", window + Duration::from_millis(600));
    until_equal(&m.join("moved"), b"moving", window + Duration::from_millis(600));
    let deadline = changed + window + Duration::from_millis(600);
    loop {
        let gone = (fs::symlink_metadata(m.join("d/moves")), fs::symlink_metadata(m.join("goes")));
        if matches!(&gone, (Err(a), Err(b)) if a.kind() == ErrorKind::NotFound && b.kind() == ErrorKind::NotFound)
        {
            break;
        }
        assert!(Instant::now() < deadline, "a renamed or removed name still shows: {gone:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
    // After the window old data is never served again, on any read.
    std::thread::sleep(
        (changed + window + Duration::from_millis(300)).saturating_duration_since(Instant::now()),
    );
    for _ in 0..20 {
        assert!(fs::read(m.join("same-size")).unwrap() == new, "old data served after the window");
        assert_eq!(fs::read(m.join("grows")).unwrap(), b"first line\nsecond line\n");
        let listing: Vec<_> = fs::read_dir(m).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert!(!listing.iter().any(|n| n == "goes"), "a removed file is still listed");
    }
    let s = v.stat();
    assert!(n(&s, "fileview_changes_seen") >= 2, "changes seen: {}", n(&s, "fileview_changes_seen"));
}

#[test]
fn every_change_through_the_view_is_in_source_at_once() {
    if !fuse_available() {
        return;
    }
    let dir = new_dir();
    let v = View::start(&dir, &["--revalidate", "60"]);
    let (m, s) = (&v.mnt, &v.src);
    // create + write
    fs::write(m.join("new"), b"hello").unwrap();
    assert_eq!(fs::read(s.join("new")).unwrap(), b"hello");
    assert_eq!(fs::read(m.join("new")).unwrap(), b"hello");
    // a write over cached records, and an append
    let big = common::random_file(&s.join("big"), 300_000, 7);
    assert!(fs::read(m.join("big")).unwrap() == big);
    {
        use std::os::unix::fs::FileExt;
        let f = fs::OpenOptions::new().write(true).open(m.join("big")).unwrap();
        f.write_all_at(b"PATCHED", 140_000).unwrap();
        let mut a = fs::OpenOptions::new().append(true).open(m.join("big")).unwrap();
        a.write_all(b"TAIL").unwrap();
    }
    let mut want = big.clone();
    want[140_000..140_007].copy_from_slice(b"PATCHED");
    want.extend_from_slice(b"TAIL");
    assert!(fs::read(s.join("big")).unwrap() == want, "SOURCE lacks the writes");
    assert!(fs::read(m.join("big")).unwrap() == want, "the view serves old records after a write");
    // truncate (shrink and grow), chmod, utimes
    fs::OpenOptions::new().write(true).open(m.join("big")).unwrap().set_len(1000).unwrap();
    assert_eq!(fs::metadata(s.join("big")).unwrap().len(), 1000);
    fs::OpenOptions::new().write(true).open(m.join("big")).unwrap().set_len(200_000).unwrap();
    let after = fs::read(m.join("big")).unwrap();
    assert!(
        after[..1000] == want[..1000] && after[1000..].iter().all(|&b| b == 0),
        "truncate left old bytes"
    );
    assert!(fs::read(s.join("big")).unwrap() == after);
    fs::set_permissions(m.join("new"), fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(fs::metadata(s.join("new")).unwrap().mode() & 0o7777, 0o600);
    assert_eq!(fs::metadata(m.join("new")).unwrap().mode() & 0o7777, 0o600);
    let t = std::time::UNIX_EPOCH + Duration::from_secs(1_500_000_000);
    fs::File::options().write(true).open(m.join("new")).unwrap().set_modified(t).unwrap();
    assert_eq!(fs::metadata(s.join("new")).unwrap().mtime(), 1_500_000_000);
    assert_eq!(fs::metadata(m.join("new")).unwrap().mtime(), 1_500_000_000);
    // mkdir, rename into it, a renamed directory keeps its contents
    fs::create_dir(m.join("dir")).unwrap();
    assert!(s.join("dir").is_dir());
    fs::rename(m.join("new"), m.join("dir/renamed")).unwrap();
    assert!(!s.join("new").exists() && s.join("dir/renamed").exists());
    fs::rename(m.join("dir"), m.join("dir2")).unwrap();
    assert_eq!(fs::read(m.join("dir2/renamed")).unwrap(), b"hello");
    assert_eq!(fs::read(s.join("dir2/renamed")).unwrap(), b"hello");
    // link, symlink
    fs::hard_link(m.join("dir2/renamed"), m.join("linked")).unwrap();
    assert_eq!(
        fs::metadata(s.join("linked")).unwrap().ino(),
        fs::metadata(s.join("dir2/renamed")).unwrap().ino()
    );
    assert_eq!(fs::metadata(m.join("linked")).unwrap().nlink(), 2);
    std::os::unix::fs::symlink("dir2/renamed", m.join("sym")).unwrap();
    assert_eq!(fs::read_link(s.join("sym")).unwrap(), Path::new("dir2/renamed"));
    assert_eq!(fs::read(m.join("sym")).unwrap(), b"hello");
    // xattrs
    set_xattr(&m.join("linked"), "user.k", b"v").unwrap();
    assert_eq!(user_xattrs(&s.join("linked")).get("user.k").map(Vec::as_slice), Some(&b"v"[..]));
    assert_eq!(user_xattrs(&m.join("linked")).get("user.k").map(Vec::as_slice), Some(&b"v"[..]));
    let cp = CString::new(m.join("linked").as_os_str().as_bytes()).unwrap();
    // SAFETY: valid C strings.
    assert_eq!(unsafe { libc::lremovexattr(cp.as_ptr(), c"user.k".as_ptr()) }, 0);
    assert!(user_xattrs(&s.join("linked")).is_empty() && user_xattrs(&m.join("linked")).is_empty());
    // fsync
    let f = fs::OpenOptions::new().write(true).open(m.join("linked")).unwrap();
    f.sync_all().unwrap();
    f.sync_data().unwrap();
    drop(f);
    // unlink, rmdir
    fs::remove_file(m.join("sym")).unwrap();
    fs::remove_file(m.join("linked")).unwrap();
    fs::remove_file(m.join("dir2/renamed")).unwrap();
    fs::remove_dir(m.join("dir2")).unwrap();
    for gone in ["sym", "linked", "dir2"] {
        assert!(fs::symlink_metadata(s.join(gone)).is_err(), "{gone} still in SOURCE");
        assert!(fs::symlink_metadata(m.join(gone)).is_err(), "{gone} still in the view");
    }
    let mut names: Vec<_> = fs::read_dir(m).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    assert_eq!(names, vec!["big"]);
    assert!(n(&v.stat(), "fileview_source_writes") > 10);
}

#[test]
fn read_only_refuses_writes() {
    read_only_view_refuses_writes(&["--read-only"]);
}

#[test]
fn read_only_in_the_config_file_refuses_writes() {
    let dir = new_dir();
    let config = dir.path().join("arcache.toml");
    fs::write(&config, "read_only = true\nrecordsize = \"64K\"\n").unwrap();
    read_only_view_refuses_writes(&["--config", config.to_str().unwrap()]);
}

fn read_only_view_refuses_writes(args: &[&str]) {
    if !fuse_available() {
        return;
    }
    let dir = new_dir();
    fs::create_dir_all(dir.path().join("src")).unwrap();
    fs::write(dir.path().join("src/f"), b"keep").unwrap();
    let v = View::start(&dir, args);
    let m = &v.mnt;
    assert_eq!(fs::read(m.join("f")).unwrap(), b"keep");
    let erofs = |r: std::io::Result<()>, what: &str| {
        let e = r.expect_err(what);
        assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{what}: {e}");
    };
    erofs(fs::write(m.join("new"), b"x"), "create");
    erofs(fs::write(m.join("f"), b"x"), "overwrite");
    erofs(fs::create_dir(m.join("d")), "mkdir");
    erofs(fs::remove_file(m.join("f")), "unlink");
    erofs(fs::rename(m.join("f"), m.join("g")), "rename");
    erofs(set_xattr(&m.join("f"), "user.k", b"v"), "setxattr");
    assert_eq!(fs::read(dir.path().join("src/f")).unwrap(), b"keep");
    assert_eq!(fs::read_dir(dir.path().join("src")).unwrap().count(), 1);
}

#[test]
fn sigterm_unmounts_and_an_outside_unmount_stops_the_server() {
    if !fuse_available() {
        return;
    }
    let dir = new_dir();
    let mut v = View::start(&dir, &[]);
    fs::write(v.mnt.join("f"), b"x").unwrap();
    v.signal(libc::SIGTERM);
    let (status, err) = v.wait();
    assert!(status.success(), "exit {status}: {err}");
    assert!(!is_mounted(&v.mnt), "SIGTERM left the mount");
    assert!(!v.control.exists(), "the control socket was left behind");

    let mut v = View::start(&dir, &[]);
    let out = Command::new("fusermount3").arg("-u").arg(&v.mnt).output().unwrap();
    assert!(out.status.success(), "fusermount3 -u: {}", String::from_utf8_lossy(&out.stderr));
    let (status, err) = v.wait();
    assert!(status.success(), "exit {status} after fusermount3 -u: {err}");
    assert!(!is_mounted(&v.mnt));
}

#[test]
fn a_source_that_vanishes_gives_errors_not_hangs_or_old_data_and_the_view_still_stops() {
    if !fuse_available() {
        return;
    }
    for watch in ["60", "0"] {
        let dir = new_dir();
        make_tree(&dir.path().join("src"));
        let mut v = View::start(&dir, &["--watch-max", watch]);
        compare_trees(&v.mnt, &v.src);
        // The whole tree goes (an unmounted share, a removed export).
        fs::remove_dir_all(&v.src).unwrap();
        let gone = Instant::now();
        // Past the window every name fails, whatever was cached; no call
        // hangs (each is bounded by the test's watchdog).
        std::thread::sleep(Duration::from_millis(1500));
        for p in ["a/f4", "a/b/c/deep", "many/file-0001.png", "a/to-f4"] {
            let r = fs::read(v.mnt.join(p));
            assert!(r.is_err(), "--watch-max {watch}: {p} still read after SOURCE vanished");
            assert!(fs::symlink_metadata(v.mnt.join(p)).is_err(), "--watch-max {watch}: {p} still listed");
        }
        let left: Vec<_> =
            fs::read_dir(&v.mnt).map(|d| d.filter_map(Result::ok).collect()).unwrap_or_default();
        assert!(left.is_empty(), "--watch-max {watch}: the root still lists {}", left.len());
        assert!(gone.elapsed() < Duration::from_secs(20), "answers took {:?}", gone.elapsed());
        // Writes fail too, and nothing is made outside SOURCE.
        assert!(fs::write(v.mnt.join("new"), b"x").is_err());
        assert!(!dir.path().join("src").exists());
        v.signal(libc::SIGTERM);
        let (status, err) = v.wait();
        assert!(status.success(), "--watch-max {watch}: exit {status}: {err}");
        assert!(!is_mounted(&v.mnt));
    }
}

#[test]
fn kill_9_leaves_no_dangling_mount() {
    if !fuse_available() {
        return;
    }
    let dir = new_dir();
    let mut v = View::start(&dir, &[]);
    fs::write(v.mnt.join("f"), b"written before the kill").unwrap();
    v.signal(libc::SIGKILL);
    let (status, _) = v.wait();
    assert!(!status.success());
    // The watcher the server left behind unmounts the dead view.
    wait_unmounted(&v.mnt, "the mount of a killed server");
    // A fusermount3 -u now (what an admin would run) does no harm.
    fusermount_u(&v.mnt);
    assert!(fs::read_dir(&v.mnt).unwrap().next().is_none(), "the mount point is not the bare directory");
    // Nothing written through the view was lost: it was in SOURCE first.
    assert_eq!(fs::read(v.src.join("f")).unwrap(), b"written before the kill");
    // And the mount point takes a new view at once, which the old
    // watcher does not take down.
    let v2 = View::start(&dir, &[]);
    std::thread::sleep(Duration::from_millis(300));
    assert!(is_mounted(&v2.mnt));
    assert_eq!(fs::read(v2.mnt.join("f")).unwrap(), b"written before the kill");
}

/// Readers and a writer on one file through the view: the last version is
/// what stays. The race the per-object generation closes (a miss's pread
/// seeing old bytes, the write dropping the record, the miss then caching
/// them) is a pread long: this test does not reliably reach it (with the
/// check removed it still passed 5 runs out of 5), so it checks the
/// concurrent path as a whole, not that check.
#[test]
fn reads_racing_writes_through_the_view_never_leave_old_records_behind() {
    if !fuse_available() {
        return;
    }
    let dir = new_dir();
    fs::create_dir_all(dir.path().join("src")).unwrap();
    const SIZE: usize = 512 << 10;
    fs::write(dir.path().join("src/f"), vec![0u8; SIZE]).unwrap();
    // A long window: only the view's own bookkeeping keeps reads right.
    let v = View::start(&dir, &["--revalidate", "60"]);
    let path = v.mnt.join("f");
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..3)
        .map(|i| {
            let (path, stop) = (path.clone(), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut reads = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let data = fs::read(&path).unwrap();
                    assert_eq!(data.len(), SIZE, "reader {i}");
                    assert!(data.iter().all(|&b| b <= 40), "reader {i} saw a byte no version wrote");
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    for version in 1..=40u8 {
        // One record at a time, so readers see records of several versions.
        let f = fs::OpenOptions::new().write(true).open(&path).unwrap();
        for rec in 0..4 {
            use std::os::unix::fs::FileExt;
            f.write_all_at(&vec![version; 128 << 10], rec * (128 << 10)).unwrap();
        }
    }
    stop.store(true, Ordering::Relaxed);
    let reads: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    assert!(reads > 0);
    for _ in 0..5 {
        let data = fs::read(&path).unwrap();
        assert!(data.iter().all(|&b| b == 40), "an old version's record is still served");
    }
    assert!(fs::read(v.src.join("f")).unwrap().iter().all(|&b| b == 40));
}

/// The mode bits of `p` (not following a symlink).
fn mode_of(p: &Path) -> u32 {
    fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
}

#[test]
fn symlinks_swapped_into_source_never_lead_the_view_outside() {
    if !fuse_available() {
        return;
    }
    let dir = new_dir();
    let src = dir.path().join("src");
    let out = dir.path().join("outside");
    fs::create_dir_all(src.join("d")).unwrap();
    fs::create_dir_all(&out).unwrap();
    fs::write(src.join("f"), b"inside").unwrap();
    fs::write(src.join("d/shadow"), b"inside shadow").unwrap();
    fs::write(out.join("victim"), b"outside").unwrap();
    fs::write(out.join("shadow"), b"outside shadow").unwrap();
    fs::set_permissions(out.join("victim"), fs::Permissions::from_mode(0o644)).unwrap();
    fs::set_permissions(out.join("shadow"), fs::Permissions::from_mode(0o644)).unwrap();
    // A long window: the view and the kernel keep the names they saw.
    // No inotify, which would show the new links at once: the kernel then
    // follows `planted` (an absolute link) on the client side, outside the
    // view, as it would on any file system; what this tests is the view
    // itself acting on names that are links by now.
    let v = View::start(&dir, &["--revalidate", "30", "--watch-max", "0"]);
    let m = &v.mnt;
    assert_eq!(fs::read(m.join("f")).unwrap(), b"inside");
    assert_eq!(fs::read(m.join("d/shadow")).unwrap(), b"inside shadow");
    let listed: Vec<_> = fs::read_dir(m).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(listed.len(), 2, "{listed:?}");

    // A writer of SOURCE swaps names for links to the outside.
    fs::remove_file(src.join("f")).unwrap();
    std::os::unix::fs::symlink(out.join("victim"), src.join("f")).unwrap();
    std::os::unix::fs::symlink(out.join("planted"), src.join("planted")).unwrap();
    fs::rename(src.join("d"), src.join("d.old")).unwrap();
    std::os::unix::fs::symlink(&out, src.join("d")).unwrap();

    // Through the view, within the window: what the link leads to is
    // never opened, created, truncated, chmodded or unlinked. `planted`
    // first: once the view finds `f` replaced, it drops the root's cached
    // listing, the kernel then sees `planted` as the link it is and follows
    // it itself, outside the view, as on any file system.
    assert!(fs::write(m.join("planted"), b"created through a link").is_err(), "created through planted");
    let w = fs::OpenOptions::new().write(true).truncate(true).open(m.join("f"));
    assert!(w.and_then(|mut f| f.write_all(b"written through a link")).is_err(), "wrote through f");
    // Not following the last name: once the view answers ESTALE for the
    // old `f`, the kernel looks it up again and a following chmod would
    // then follow the link itself, on the client side.
    let c = CString::new(m.join("f").as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid C string; the result is not needed (EOPNOTSUPP on a link).
    unsafe { libc::fchmodat(libc::AT_FDCWD, c.as_ptr(), 0o600, libc::AT_SYMLINK_NOFOLLOW) };
    assert!(fs::remove_file(m.join("d/shadow")).is_err(), "unlinked through the swapped directory");
    let _ = fs::set_permissions(m.join("d/shadow"), fs::Permissions::from_mode(0o600));
    assert!(fs::write(m.join("d/shadow"), b"written through d").is_err(), "wrote through d");

    assert_eq!(fs::read(out.join("victim")).unwrap(), b"outside");
    assert_eq!(mode_of(&out.join("victim")), 0o644);
    assert!(fs::symlink_metadata(out.join("planted")).is_err(), "a file was created outside SOURCE");
    assert_eq!(fs::read(out.join("shadow")).unwrap(), b"outside shadow");
    assert_eq!(mode_of(&out.join("shadow")), 0o644);
    let mut outside: Vec<_> = fs::read_dir(&out).unwrap().map(|e| e.unwrap().file_name()).collect();
    outside.sort();
    assert_eq!(outside, ["shadow", "victim"]);
    // The links themselves are untouched as well.
    assert_eq!(fs::read_link(src.join("f")).unwrap(), out.join("victim"));
    assert_eq!(fs::read(src.join("d.old/shadow")).unwrap(), b"inside shadow");
}

/// `len` bytes at `offset` of `f`, read with O_DIRECT (past the kernel's
/// page cache, which the node's handles share).
fn read_direct(f: &fs::File, offset: u64, len: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; len];
    let mut got = 0;
    while got < len {
        let n = f.read_at(&mut buf[got..], offset + got as u64).expect("O_DIRECT read");
        if n == 0 {
            break;
        }
        got += n;
    }
    buf.truncate(got);
    buf
}

/// SOURCE holding `f` and `new`, random files of the same size: only the
/// inode (and times) tell them apart.
fn same_size_pair(dir: &tempfile::TempDir) -> (PathBuf, Vec<u8>, Vec<u8>) {
    let src = dir.path().join("src");
    fs::create_dir_all(&src).unwrap();
    let old = common::random_file(&src.join("f"), 300_000, 1);
    let new = common::random_file(&src.join("new"), 300_000, 2);
    (src, old, new)
}

fn open_direct(p: &Path) -> fs::File {
    fs::OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(p).unwrap()
}

/// A read through `h` of a record the view has not cached (at 200,704):
/// the bytes of `old`, the file `h` opened, or ESTALE; never another file's.
fn assert_reads_old_or_estale(h: &fs::File, old: &[u8], what: &str) {
    use std::os::unix::fs::FileExt;
    let mut buf = vec![0u8; 4096];
    match h.read_at(&mut buf, 200_704) {
        Ok(got) => {
            assert!(buf[..got] == old[200_704..200_704 + got], "{what}: the old handle read other bytes")
        }
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{what}: {e}"),
    }
}

#[test]
fn a_file_replaced_in_source_is_read_as_the_new_file_and_an_old_handle_as_the_old() {
    if !fuse_available() {
        return;
    }
    let dir = new_dir();
    let (src, old, new) = same_size_pair(&dir);
    let v = View::start(&dir, &["--revalidate", "30"]);
    let m = &v.mnt;
    let old_handle = open_direct(&m.join("f"));
    // The first record read through the old handle, the whole file by name.
    assert!(read_direct(&old_handle, 0, 4096) == old[..4096]);
    assert!(fs::read(m.join("f")).unwrap() == old);

    fs::rename(src.join("new"), src.join("f")).unwrap();
    // Within the window: an open of the name reads the file it opened.
    assert!(fs::read(m.join("f")).unwrap() == new, "an open of f after mv read the old file's records");
    let new_handle = open_direct(&m.join("f"));
    assert!(read_direct(&new_handle, 0, new.len()) == new);
    // The handle opened before still reads the old file, every record.
    assert!(read_direct(&old_handle, 0, old.len()) == old, "the old handle got other bytes");
}

/// A revalidation whose `lstat` was taken before a write through the view
/// and settles after the write's own must not put the old size back: the
/// writer would see its append missing for a window. A fail point holds a
/// getattr's revalidation 150 ms between its `lstat` and its settling;
/// each round a prober's `fstat` starts one (the file past its window),
/// the write is made once the server has counted it (so inside that gap),
/// and the writer then looks at the size within the window. The test also
/// asserts the view found each late stat (`fileview_stale_stats`).
#[test]
fn a_stat_taken_before_a_write_and_settled_after_it_never_hides_the_write() {
    if !fuse_available() || !failpoints_armed() {
        return;
    }
    let dir = new_dir();
    fs::create_dir_all(dir.path().join("src")).unwrap();
    fs::write(dir.path().join("src/log"), b"").unwrap();
    let v = View::start_with_env(
        &dir,
        &["--revalidate", "0.3", "--watch-max", "0"],
        &[("FAILPOINTS", "view.getattr.settle=sleep(150)")],
    );
    let path = v.mnt.join("log");
    let mut f = fs::OpenOptions::new().append(true).open(&path).unwrap();
    let reader = fs::File::open(&path).unwrap();
    let mut short = Vec::new();
    let rounds = 8;
    for i in 1..=rounds {
        std::thread::sleep(Duration::from_millis(350));
        let before = n(&v.stat(), "fileview_revalidations");
        let prober = {
            let r = reader.try_clone().unwrap();
            std::thread::spawn(move || r.metadata().map(|m| m.len()))
        };
        let deadline = Instant::now() + Duration::from_secs(2);
        while n(&v.stat(), "fileview_revalidations") == before && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        f.write_all(b"x").unwrap();
        prober.join().unwrap().unwrap();
        for _ in 0..5 {
            let len = f.metadata().unwrap().len();
            if len < i {
                short.push((i, len));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let st = v.stat();
    assert!(short.is_empty(), "the file looked shorter than written (written, seen): {short:?}");
    assert!(
        n(&st, "fileview_stale_stats") >= rounds,
        "fewer late stats than rounds ({rounds}): the race was not reached; {st}"
    );
}

/// An open in a listed directory has SOURCE `lstat` the directory's
/// entries in the background (open-ahead), once per directory for a while;
/// `--no-open-ahead` turns it off.
#[test]
fn an_open_warms_its_directorys_entries_on_source_once() {
    if !fuse_available() {
        return;
    }
    // Opens answered from the cache (deferred) need no warming: each is
    // opened on SOURCE by itself, in the background.
    for (args, on) in
        [(&["--no-deferred-open"][..], true), (&["--no-deferred-open", "--no-open-ahead"][..], false)]
    {
        let dir = new_dir();
        let d = dir.path().join("src/d");
        fs::create_dir_all(&d).unwrap();
        for i in 0..40 {
            fs::write(d.join(format!("f{i:02}")), format!("file {i}")).unwrap();
        }
        let v = View::start(&dir, args);
        let listed = fs::read_dir(v.mnt.join("d")).unwrap().count();
        assert_eq!(listed, 40);
        for i in 0..10 {
            assert_eq!(fs::read_to_string(v.mnt.join(format!("d/f{i:02}"))).unwrap(), format!("file {i}"));
        }
        let want = if on { 40 } else { 0 };
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut st = v.stat();
        while n(&st, "fileview_open_ahead_stats") < want && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
            st = v.stat();
        }
        // Ten opens within the window: one warming of the directory.
        assert_eq!(n(&st, "fileview_open_aheads"), u64::from(on), "{args:?}: {st}");
        assert_eq!(n(&st, "fileview_open_ahead_stats"), want, "{args:?}: {st}");
    }
}

/// A read-only open of a file inotify vouches for is answered from the
/// cache, its SOURCE file opened after the reply by a binder thread;
/// `--no-deferred-open` opens it first.
#[test]
fn a_read_only_open_of_a_vouched_file_is_answered_before_source_opens_it() {
    if !fuse_available() {
        return;
    }
    for (args, deferred) in [(&[][..], true), (&["--no-deferred-open"][..], false)] {
        let dir = new_dir();
        fs::create_dir_all(dir.path().join("src")).unwrap();
        let want = common::random_file(&dir.path().join("src/f"), 200_000, 7);
        let v = View::start(&dir, args);
        for _ in 0..5 {
            assert!(fs::read(v.mnt.join("f")).unwrap() == want, "{args:?}: other bytes");
        }
        // Held open while the binders work: a handle released before a
        // binder reaches it is not bound (nothing to bind), so with the
        // reads' handles alone the count depended on scheduling (CI saw
        // none under load). Its file is cached, so no request binds it first.
        let held = fs::File::open(v.mnt.join("f")).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut st = v.stat();
        while deferred && n(&st, "fileview_deferred_binds") == 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
            st = v.stat();
        }
        drop(held);
        // The lookup before the first open vouched for the file already.
        let opens = if deferred { 6 } else { 0 };
        assert_eq!(n(&st, "fileview_deferred_opens"), opens, "{args:?}: {st}");
        assert_eq!(n(&st, "fileview_deferred_binds") > 0, deferred, "{args:?}: {st}");
        assert_eq!(n(&st, "fileview_deferred_stale"), 0, "{args:?}: {st}");
    }
}

/// A binder thread installs a descriptor only for the very file and
/// version a deferred open was answered for: the fail point holds it
/// 300 ms, the file is replaced meanwhile, and it must install nothing
/// (the handle's read then finds the other file itself).
#[test]
fn a_binder_never_binds_a_deferred_open_to_a_file_replaced_meanwhile() {
    if !fuse_available() || !failpoints_armed() {
        return;
    }
    let dir = new_dir();
    let (src, old, _new) = same_size_pair(&dir);
    let v = View::start_with_env(&dir, &[], &[("FAILPOINTS", "view.deferred.bind=sleep(300)")]);
    let open = || open_direct(&v.mnt.join("f"));
    assert!(read_direct(&open(), 0, 4096) == old[..4096]);
    std::thread::sleep(Duration::from_millis(400));
    let before = v.stat();
    let h = open();
    fs::rename(src.join("new"), src.join("f")).unwrap();
    std::thread::sleep(Duration::from_millis(600));
    let after = v.stat();
    // The race was reached: the open was deferred and the binder woke after the rename.
    assert_eq!(n(&after, "fileview_deferred_opens"), n(&before, "fileview_deferred_opens") + 1);
    assert_eq!(
        n(&after, "fileview_deferred_binds"),
        n(&before, "fileview_deferred_binds"),
        "bound to the new file"
    );
    assert_reads_old_or_estale(&h, &old, "after the binder");
}

/// A deferred open whose file is replaced on SOURCE before it is opened
/// there never reads the new file's bytes as the old one's: a record not
/// cached is ESTALE (the old file cannot be reached any more). The fail
/// point holds the binder threads, so the read is what opens the file.
/// The kernel may learn of the replacement first (inotify has it drop the
/// node's attributes, and its own check gets ESTALE before any read), so
/// a new server is tried until the view's binding met the other file.
#[test]
fn a_deferred_open_of_a_file_replaced_meanwhile_never_reads_the_new_files_bytes() {
    if !fuse_available() || !failpoints_armed() {
        return;
    }
    let mut reached = false;
    for attempt in 0..10 {
        let dir = new_dir();
        let (src, old, new) = same_size_pair(&dir);
        let v = View::start_with_env(&dir, &[], &[("FAILPOINTS", "view.deferred.bind=sleep(1000)")]);
        let open = || open_direct(&v.mnt.join("f"));
        // Only the first record cached.
        assert!(read_direct(&open(), 0, 4096) == old[..4096]);
        let before = n(&v.stat(), "fileview_deferred_opens");
        let h = open();
        assert_eq!(n(&v.stat(), "fileview_deferred_opens"), before + 1, "the open was not deferred");
        fs::rename(src.join("new"), src.join("f")).unwrap();
        assert_reads_old_or_estale(&h, &old, &format!("attempt {attempt}"));
        // A new open of the name reads the new file.
        assert!(read_direct(&open(), 0, new.len()) == new, "{attempt}");
        if n(&v.stat(), "fileview_deferred_stale") == 1 {
            reached = true;
            break;
        }
    }
    // The race was reached: a read opened the file and found another.
    assert!(reached, "in 10 servers the binding never met the replaced file");
}

#[test]
fn a_change_in_source_just_before_the_views_own_change_is_not_taken_for_the_views() {
    if !fuse_available() {
        return;
    }
    let dir = new_dir();
    let src = dir.path().join("src");
    fs::create_dir_all(&src).unwrap();
    fs::write(src.join("x"), b"old x").unwrap();
    fs::write(src.join("r"), b"old r").unwrap();
    let v = View::start(&dir, &["--revalidate", "30"]);
    let m = &v.mnt;
    assert_eq!(fs::read(m.join("x")).unwrap(), b"old x");
    assert_eq!(fs::read(m.join("r")).unwrap(), b"old r");

    // Rewritten in SOURCE with a new size, then changed through the view
    // within the window.
    fs::write(src.join("x"), b"new x, longer than before").unwrap();
    fs::write(src.join("r"), b"new r, longer than before").unwrap();
    set_xattr(&m.join("x"), "user.k", b"v").unwrap();
    fs::rename(m.join("r"), m.join("r2")).unwrap();

    assert_eq!(fs::read(m.join("x")).unwrap(), b"new x, longer than before");
    assert_eq!(fs::read(m.join("r2")).unwrap(), b"new r, longer than before");
    assert_eq!(user_xattrs(&m.join("x")).get("user.k").map(Vec::as_slice), Some(&b"v"[..]));
}

#[test]
fn a_new_file_reusing_a_freed_inode_number_never_shows_the_old_files_records() {
    if !fuse_available() {
        return;
    }
    let dir = new_dir();
    let v = View::start(&dir, &["--revalidate", "30"]);
    let (src, m) = (&v.src, &v.mnt);
    let mut reused = 0;
    for i in 0..20 {
        let (a, b) = (format!("a{i}"), format!("b{i}"));
        std::os::unix::fs::symlink(format!("old target {i}"), src.join(&a)).unwrap();
        let ino = fs::symlink_metadata(src.join(&a)).unwrap().ino();
        assert_eq!(fs::read_link(m.join(&a)).unwrap(), Path::new(&format!("old target {i}")));
        fs::remove_file(m.join(&a)).unwrap();
        std::os::unix::fs::symlink(format!("new target {i}"), m.join(&b)).unwrap();
        if fs::symlink_metadata(src.join(&b)).unwrap().ino() == ino {
            reused += 1;
        }
        assert_eq!(fs::read_link(m.join(&b)).unwrap(), Path::new(&format!("new target {i}")), "round {i}");
    }
    // ext4 and xfs give the freed number to the next new file of the
    // directory's group; a file system that does not shows nothing here.
    if reused == 0 {
        skip_or_fail("SOURCE's file system reused no inode number: the case was not reached");
    }
}

#[test]
fn a_file_unlinked_while_open_is_still_answered_through_its_handle() {
    if !fuse_available() {
        return;
    }
    let dir = new_dir();
    let v = View::start(&dir, &["--revalidate", "30"]);
    let m = &v.mnt;
    let mut f =
        fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(m.join("f")).unwrap();
    f.write_all(b"still here").unwrap();
    fs::remove_file(m.join("f")).unwrap();
    let meta = f.metadata().expect("fstat of an open, unlinked file");
    assert_eq!((meta.len(), meta.nlink()), (10, 0));
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; 10];
    f.read_exact_at(&mut buf, 0).unwrap();
    assert_eq!(&buf, b"still here");
}

#[test]
fn a_mountpoint_inside_source_is_refused() {
    if !fuse_available() {
        return;
    }
    let dir = new_dir();
    let src = dir.path().join("src");
    fs::create_dir_all(src.join("mnt")).unwrap();
    let child = Command::new(BIN)
        .arg("mount")
        .arg(&src)
        .arg(src.join("mnt"))
        .arg("--control")
        .arg(dir.path().join("control.sock"))
        .arg("--state-dir")
        .arg(dir.path().join("state"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A view that took the mount point would run on: killed, then unmounted.
    let out = std::panic::catch_unwind(|| common::wait_timeout(child, Duration::from_secs(20)));
    fusermount_u(&src.join("mnt"));
    let out = out.expect("arcache mount did not refuse a MOUNTPOINT inside SOURCE");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("inside SOURCE"), "{err}");
    assert!(!is_mounted(&src.join("mnt")));
}

/// What `rm -rf` (fts) does on a large directory: reads a batch of
/// entries, unlinks them, reads on. Offsets stay those of the listing the
/// directory handle started with, so no entry is skipped.
#[test]
fn entries_unlinked_while_a_directory_is_read_are_never_skipped() {
    if !fuse_available() {
        return;
    }
    let dir = new_dir();
    let v = View::start(&dir, &["--revalidate", "30"]);
    // Names long enough that one getdents buffer (32 KiB in glibc) holds
    // about 150 of them: 3000 need many batches.
    let big = v.src.join("big");
    fs::create_dir(&big).unwrap();
    let name = |i: usize| format!("{i:05}-{}", "x".repeat(200));
    for i in 0..3000 {
        fs::write(big.join(name(i)), b"").unwrap();
    }
    let through = v.mnt.join("big");
    let cp = CString::new(through.as_os_str().as_bytes()).unwrap();
    let mut seen = BTreeMap::<Vec<u8>, usize>::new();
    // SAFETY: a valid C string; the DIR* is used only until closedir, and
    // each dirent only before the next readdir.
    unsafe {
        let d = libc::opendir(cp.as_ptr());
        assert!(!d.is_null(), "opendir: {}", std::io::Error::last_os_error());
        loop {
            let e = libc::readdir(d);
            if e.is_null() {
                break;
            }
            let n = std::ffi::CStr::from_ptr((*e).d_name.as_ptr()).to_bytes().to_vec();
            if n == b"." || n == b".." {
                continue;
            }
            let p = through.join(std::ffi::OsStr::from_bytes(&n));
            fs::remove_file(&p).unwrap_or_else(|e| panic!("unlink {}: {e}", p.display()));
            *seen.entry(n).or_default() += 1;
        }
        libc::closedir(d);
    }
    let twice: Vec<_> =
        seen.iter().filter(|(_, &c)| c > 1).map(|(n, _)| String::from_utf8_lossy(n)).collect();
    assert!(twice.is_empty(), "returned more than once: {twice:?}");
    assert_eq!(seen.len(), 3000, "entries returned once each");
    assert_eq!(fs::read_dir(&big).unwrap().count(), 0, "SOURCE's directory is empty");
    fs::remove_dir(&through).expect("rmdir of the emptied directory");
    assert!(!big.exists());

    // The real rm -rf through the view, on a second directory.
    fs::create_dir(&big).unwrap();
    for i in 0..3000 {
        fs::write(big.join(name(i)), b"").unwrap();
    }
    let out = Command::new("rm").arg("-rf").arg(&through).output().expect("run rm");
    assert!(out.status.success(), "rm -rf: {}", String::from_utf8_lossy(&out.stderr));
    assert!(!through.exists() && !big.exists(), "rm -rf left the directory behind");
}

/// A small L2 file in `dir` that keeps a log (rebuilt at start) and is fed
/// everything at once, then `extra`.
fn persistent_l2_args(dir: &tempfile::TempDir, extra: &[&str]) -> Vec<String> {
    let l2 = format!("{}:64M", dir.path().join("l2.img").display());
    let sets = [
        "l2arc_rebuild_blocks_min_l2size=0",
        "l2arc_headroom=0",
        "l2arc_write_max=64M",
        "l2arc_noprefetch=0",
    ];
    let mut args = vec!["--l2".to_string(), l2];
    for set in sets {
        args.extend(["--set".to_string(), set.to_string()]);
    }
    args.extend(extra.iter().map(|a| a.to_string()));
    args
}

/// Waits until the L2 holds what the feed will put there (its size still
/// for a second and for three feed cycles, nothing left to commit to its
/// log); the size. The cycles count because a second alone passed with the
/// feed starved of CPU under a parallel test run, and a record fed after
/// it was read from SOURCE after the kill that followed.
fn wait_for_l2(v: &View) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = (u64::MAX, Instant::now(), 0);
    loop {
        let s = v.stat();
        let size = n(&s, "l2_size");
        let cycles = n(&s, "l2_feed_cycles");
        if size != last.0 {
            last = (size, Instant::now(), cycles);
        } else if size > 0
            && n(&s, "l2_log_uncommitted_bytes") == 0
            && last.1.elapsed() > Duration::from_secs(1)
            && cycles >= last.2 + 3
        {
            return size;
        }
        assert!(Instant::now() < deadline, "the L2 feed did not settle in 60 s (l2_size {size})");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn wait_for_rebuild(v: &View) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = v.stat();
        if n(&s, "l2_rebuild_running") == 0 {
            return s;
        }
        assert!(Instant::now() < deadline, "the L2 rebuild did not end in 30 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Issue 22: metadata and data survive a restart (a clean stop, then a
/// kill -9) through the persistent L2: listings and file data of what did
/// not change come from L2, and what changed while the server was down is
/// read from SOURCE, never from L2.
#[test]
fn after_a_restart_listings_and_data_come_from_l2_and_what_changed_meanwhile_from_source() {
    if !fuse_available() {
        return;
    }
    let dir = new_dir();
    make_tree(&dir.path().join("src"));
    let args = persistent_l2_args(&dir, &[]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut v = View::start(&dir, &args);
    let walked = compare_trees(&v.mnt, &v.src);
    assert!(wait_for_l2(&v) > 300 * 64, "the view's records went to L2");
    v.signal(libc::SIGTERM);
    assert!(v.wait().0.success());
    // Changed while the server was down: the same size with other bytes,
    // an append, and a new entry in a directory.
    let f4 = v.src.join("a/f4");
    let mut bytes = fs::read(&f4).unwrap();
    bytes.iter_mut().take(100).for_each(|b| *b = !*b);
    std::thread::sleep(Duration::from_millis(20));
    fs::write(&f4, &bytes).unwrap();
    fs::write(v.src.join("many/file-0001.png"), b"rewritten while down, longer than before\n").unwrap();
    fs::write(v.src.join("many/new-while-down"), b"new\n").unwrap();
    drop(v);

    // Each round starts after the previous one's stop: the first after the
    // SIGTERM above, the second after a kill -9 once the feed had settled
    // (warm again), the third after a kill -9 in the middle of changes
    // made through the view (whatever the L2 kept, nothing old is shown).
    let rounds = [("after a clean stop", true), ("after kill -9", true), ("after kill -9 mid-change", false)];
    for (i, (round, warm)) in rounds.into_iter().enumerate() {
        let mut v = View::start(&dir, &args);
        let before = wait_for_rebuild(&v);
        assert!(
            n(&before, "l2_rebuild_bufs") > 300,
            "{round}: restored {} records",
            n(&before, "l2_rebuild_bufs")
        );
        // A change through the view to a directory whose listing is on L2
        // and not yet read in this run: the restored listing must not
        // come back (it lacks the new entry).
        fs::write(v.mnt.join(format!("a/b/c/made-{i}")), b"made through the view\n").unwrap();
        let seen = compare_trees(&v.mnt, &v.src);
        assert!(seen >= walked, "{round}: walked {seen}");
        assert_eq!(fs::read(v.mnt.join("a/f4")).unwrap(), bytes, "{round}: a/f4 as changed while down");
        let after = v.stat();
        let rise = |k: &str| n(&after, k) - n(&before, k);
        if warm {
            // Only `many` (in the first round) and `a/b/c` changed their
            // entries; every other listing came from L2.
            let readdirs = rise("fileview_source_readdirs");
            assert!(readdirs <= 2, "{round}: {readdirs} listings read from SOURCE");
            // Only the changed and the new files' records were read from SOURCE.
            let reads = rise("fileview_source_reads");
            assert!(reads <= 4, "{round}: {reads} records read from SOURCE");
            assert!(rise("l2_hits") > 300, "{round}: l2_hits rose by {}", rise("l2_hits"));
        }
        // Every file was checked against SOURCE before its records were used.
        assert!(rise("fileview_source_stats") >= 300, "{round}: {} stats", rise("fileview_source_stats"));
        if i == 0 {
            // A clean stop already tested; this round ends in a kill -9
            // with the L2 settled.
            wait_for_l2(&v);
        } else {
            // Rewritten through the view, same size, then killed at once:
            // whatever of it the L2 holds, the next round must read the
            // file as SOURCE has it.
            let mut again = bytes.clone();
            again.iter_mut().take(10).for_each(|b| *b = b.wrapping_add(1));
            fs::write(v.mnt.join("a/f4"), &again).unwrap();
            bytes = again;
        }
        v.signal(libc::SIGKILL);
        v.wait();
        wait_unmounted(&v.mnt, round);
    }
}

/// Issue 22's kernel-side caching: an unchanged file is read again from
/// the kernel's page cache (`keep_cache`), without a request to the view;
/// a file changed on SOURCE is never read from the kernel's old pages;
/// `--no-keep-cache` has every open drop them.
#[test]
fn an_unchanged_file_is_read_again_from_the_kernels_cache_and_a_changed_one_never_is() {
    if !fuse_available() {
        return;
    }
    for keep in [true, false] {
        let dir = new_dir();
        let src = dir.path().join("src");
        fs::create_dir_all(&src).unwrap();
        common::random_file(&src.join("k"), 300_000, 5);
        // A window longer than the test and no inotify: only the open's
        // own check of SOURCE can see the change below (the kernel asks
        // for no attributes within the window, so it cannot drop its
        // pages on seeing a new mtime).
        let mut args = vec!["--revalidate", "60", "--watch-max", "0"];
        if !keep {
            args.push("--no-keep-cache");
        }
        let v = View::start(&dir, &args);
        let want = fs::read(src.join("k")).unwrap();
        assert!(fs::read(v.mnt.join("k")).unwrap() == want);
        let before = v.stat();
        assert!(fs::read(v.mnt.join("k")).unwrap() == want);
        let after = v.stat();
        let asked = |s: &serde_json::Value| n(s, "demand_data_hits") + n(s, "demand_data_misses");
        let rise = asked(&after) - asked(&before);
        let kept = n(&after, "fileview_kept_caches") - n(&before, "fileview_kept_caches");
        if keep {
            assert_eq!((rise, kept), (0, 1), "keep_cache: the second read asked the view for {rise} records");
        } else {
            assert!(rise >= 3 && kept == 0, "--no-keep-cache: the second read asked for {rise} records");
        }
        // Rewritten on SOURCE with the same size: the kernel's pages go.
        let mut new = want.clone();
        new.iter_mut().step_by(1000).for_each(|b| *b = !*b);
        fs::write(src.join("k"), &new).unwrap();
        assert!(fs::read(v.mnt.join("k")).unwrap() == new, "keep {keep}: old bytes after a change");
    }
}

/// `--secondarycache metadata`: the view's listings go to L2 and come back
/// after a restart, its file data does not (read from SOURCE again).
#[test]
fn with_secondarycache_metadata_only_listings_come_back_from_l2() {
    if !fuse_available() {
        return;
    }
    let dir = new_dir();
    make_tree(&dir.path().join("src"));
    let args = persistent_l2_args(&dir, &["--secondarycache", "metadata"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut v = View::start(&dir, &args);
    compare_trees(&v.mnt, &v.src);
    wait_for_l2(&v);
    v.signal(libc::SIGTERM);
    assert!(v.wait().0.success());
    drop(v);
    let v = View::start(&dir, &args);
    let before = wait_for_rebuild(&v);
    compare_trees(&v.mnt, &v.src);
    let after = v.stat();
    let rise = |k: &str| n(&after, k) - n(&before, k);
    assert_eq!(rise("fileview_source_readdirs"), 0, "listings came from L2");
    // make_tree's data: 300 small files and 9 larger ones, every record
    // read from SOURCE again.
    assert!(
        rise("fileview_source_reads") >= 300,
        "{} records read from SOURCE",
        rise("fileview_source_reads")
    );
}
