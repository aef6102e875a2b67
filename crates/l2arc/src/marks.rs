//! Abandoned-log marks: files in the state directory that refuse a
//! device's log at the next start (docs/format.md, "Abandoned-log marks").
//! They cover what the other devices' headers cannot: a server with one L2
//! device, or a start without the devices that recorded the log.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use tracing::warn;

use crate::format::Abandoned;

/// The directory of the marks, `STATE_DIR/l2-abandoned`.
pub(crate) struct MarkDir {
    dir: PathBuf,
    /// Held while a mark is written: two writers retiring the same device
    /// at once must not share the temporary file, and the second must not
    /// go on before the first's mark is durable. A leaf lock.
    writing: parking_lot::Mutex<()>,
}

impl MarkDir {
    pub(crate) fn new(state_dir: &Path) -> MarkDir {
        MarkDir { dir: state_dir.join("l2-abandoned"), writing: parking_lot::Mutex::new(()) }
    }

    /// Writes the mark of `a` durably: a temporary file made durable, then
    /// renamed into place and the directory made durable, so a crash leaves
    /// either no mark or a whole one. A mark already there (written by
    /// another writer, durably, under the same lock) is left as it is. A
    /// temporary file left by a failed rename stays: whole, it still
    /// refuses the log at the next start ([`MarkDir::list`]).
    pub(crate) fn record(&self, a: Abandoned) -> io::Result<PathBuf> {
        let _writing = self.writing.lock();
        let path = self.dir.join(a.mark_name());
        if path.exists() {
            return Ok(path);
        }
        fs::create_dir_all(&self.dir)?;
        let tmp = self.dir.join(format!("{}.tmp", a.mark_name()));
        write_durably(&tmp, &a.encode_mark(), true)?;
        #[cfg(test)]
        tests::between_write_and_rename();
        rename_durably(&self.dir, &tmp, &path)?;
        Ok(path)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.dir
    }

    /// Checks now, not when a device fails and its log must be marked, that
    /// a mark can be written here, the way [`MarkDir::record`] writes one:
    /// the directory made, a new file written and made durable, renamed,
    /// the directory made durable; then the file is removed. Its name is
    /// random, so servers sharing the directory (in containers, with equal
    /// process ids) do not meet, and a new file is never an existing one
    /// or a link's target.
    pub(crate) fn probe(&self) -> io::Result<()> {
        fs::create_dir_all(&self.dir)?;
        let name = format!(".probe-{:016x}", crate::persist::random_u64());
        let (tmp, done) = (self.dir.join(format!("{name}.tmp")), self.dir.join(&name));
        let result =
            write_durably(&tmp, b"probe", false).and_then(|()| rename_durably(&self.dir, &tmp, &done));
        // Whichever name the file has by now.
        let _ = fs::remove_file(&tmp);
        let removed = fs::remove_file(&done);
        result.and(removed)
    }

    /// Every mark found, by its name (a damaged file still refuses the log
    /// its name gives, with a warning), and every whole temporary file (a
    /// mark whose rename failed or was cut short by a crash: its writer
    /// may have gone on as if marked); apart, the partial temporary files.
    /// A missing directory has none; one that cannot be read is an error:
    /// the start must not restore a log a mark there may refuse.
    pub(crate) fn list(&self) -> Result<Found, String> {
        let unreadable =
            |e: io::Error| format!("reading the abandoned-log marks in {}: {e}", self.dir.display());
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Found::default()),
            Err(e) => return Err(unreadable(e)),
        };
        let mut found = Found::default();
        for entry in entries {
            let entry = entry.map_err(unreadable)?;
            let name = entry.file_name();
            let path = entry.path();
            if let Some(a) = name.to_str().and_then(temp_of) {
                match fs::read(&path) {
                    Ok(b) if Abandoned::decode_mark(&b).ok() == Some(a) => found.marks.push((a, path)),
                    Ok(_) => found.partial.push((a, path)),
                    // It may be whole: it counts as a mark, and stays.
                    Err(e) => {
                        warn!(
                            "temporary abandoned-log mark {} cannot be read ({e}); it refuses its log",
                            path.display()
                        );
                        found.marks.push((a, path));
                    }
                }
                continue;
            }
            let Some(a) = name.to_str().and_then(Abandoned::from_mark_name) else { continue };
            match fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|b| Abandoned::decode_mark(&b).map_err(|e| e.to_string()))
            {
                Ok(held) if held == a => {}
                Ok(_) => warn!("abandoned-log mark {} holds another log than its name says", path.display()),
                Err(e) => warn!(
                    "abandoned-log mark {} is damaged ({e}); its name still refuses the log",
                    path.display()
                ),
            }
            found.marks.push((a, path));
        }
        found.marks.sort_by_key(|(a, _)| (a.uuid, a.incarnation));
        Ok(found)
    }
}

/// What [`MarkDir::list`] found: the logs marks refuse, by the files that
/// refuse them, and the partial temporary files, which refuse nothing.
#[derive(Default)]
pub(crate) struct Found {
    pub(crate) marks: Vec<(Abandoned, PathBuf)>,
    partial: Vec<(Abandoned, PathBuf)>,
}

impl Found {
    /// Removes what can never refuse a log again, once every `present`
    /// device's header is durable (a device that keeps no log too: its
    /// header is written anew at every start, with a new incarnation):
    /// - marks whose device is present with another incarnation
    ///   (incarnations are random and new at every reset, so an old one
    ///   never returns); marks of absent devices stay;
    /// - partial temporary files of a present device's uuid: cut short by
    ///   a crash before they were durable, so before their writer went on,
    ///   or by a failed write, which was logged. Only the server holding a
    ///   device (opened exclusively) writes its marks, so such a file is
    ///   nobody else's write in progress, though servers may share the
    ///   directory (unless two devices share a uuid: docs/persistence.md,
    ///   Limits).
    pub(crate) fn remove_spent(&self, present: &[Abandoned]) {
        let spent = self
            .marks
            .iter()
            .filter(|(a, _)| present.iter().any(|p| p.uuid == a.uuid && p.incarnation != a.incarnation));
        let partial = self.partial.iter().filter(|(a, _)| present.iter().any(|p| p.uuid == a.uuid));
        for (_, path) in spent.chain(partial) {
            if let Err(e) = fs::remove_file(path) {
                warn!("removing the spent abandoned-log file {}: {e}", path.display());
            }
        }
    }
}

/// The log a temporary mark file's name is for, if it is one's name.
fn temp_of(name: &str) -> Option<Abandoned> {
    name.strip_suffix(".tmp").and_then(Abandoned::from_mark_name)
}

/// Writes `bytes` to `path` and makes them durable; `replace`: over a
/// file there (a mark's own earlier temporary file), else only as a new
/// file.
fn write_durably(path: &Path, bytes: &[u8], replace: bool) -> io::Result<()> {
    let mut opts = fs::OpenOptions::new();
    opts.write(true);
    if replace {
        opts.create(true).truncate(true);
    } else {
        opts.create_new(true);
    }
    let mut f = opts.open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

/// Renames `from` to `to` in `dir` and makes the rename durable.
fn rename_durably(dir: &Path, from: &Path, to: &Path) -> io::Result<()> {
    fs::rename(from, to)?;
    fs::File::open(dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{mpsc, Arc};
    use std::time::{Duration, Instant};

    // Not a `fail_point!` as the crate's fault tests use: those are armed
    // for the whole process and exist only in `failpoints` builds, while
    // this must stop one of two writers, in every test build.
    thread_local! {
        /// Run by [`MarkDir::record`] on this thread between its temporary
        /// file's write and its rename.
        static HOOK: std::cell::RefCell<Option<Box<dyn FnMut()>>> = const { std::cell::RefCell::new(None) };
    }

    pub(super) fn between_write_and_rename() {
        HOOK.with(|h| {
            if let Some(f) = h.borrow_mut().as_mut() {
                f();
            }
        });
    }

    /// Two servers' threads retiring the same device at once write its mark
    /// once: the second waits while the first is between its temporary
    /// file's write and its rename (the test holds the first there until
    /// the second has entered `record`, and checks it had), then finds the
    /// mark and leaves it. Unserialised, the second would rewrite and
    /// rename the first's temporary file under it, and the first's rename
    /// would fail.
    #[test]
    fn two_writers_of_one_mark_write_it_once() {
        let state = tempfile::tempdir().unwrap();
        let marks = Arc::new(MarkDir::new(state.path()));
        let a = Abandoned { uuid: 0x1234, incarnation: 0x99 };
        let (entered_tx, entered_rx) = mpsc::channel::<Instant>();
        let (inside_tx, inside_rx) = mpsc::channel::<()>();
        let second = {
            let marks = Arc::clone(&marks);
            std::thread::spawn(move || {
                inside_rx.recv().unwrap();
                entered_tx.send(Instant::now()).unwrap();
                let r = marks.record(a);
                (r.map_err(|e| e.to_string()), Instant::now())
            })
        };
        let left = Arc::new(parking_lot::Mutex::new(None));
        let left_at = Arc::clone(&left);
        HOOK.with(|h| {
            *h.borrow_mut() = Some(Box::new(move || {
                inside_tx.send(()).unwrap();
                let entered = entered_rx.recv().unwrap();
                // Time for the second to reach the lock and wait on it.
                std::thread::sleep(Duration::from_millis(100));
                *left_at.lock() = Some((entered, Instant::now()));
            }));
        });
        let first = marks.record(a);
        HOOK.with(|h| h.borrow_mut().take());
        let (second, second_done) = second.join().unwrap();
        let (entered, first_left) = left.lock().take().expect("the first writer never reached its rename");
        assert!(entered < first_left, "the second writer did not enter while the first was writing: no race");
        let path = first.expect("the first writer failed");
        assert_eq!(second.expect("the second writer failed"), path);
        assert!(second_done >= first_left, "the second writer went on before the first's mark was durable");
        let names: Vec<_> = fs::read_dir(marks.path()).unwrap().flatten().map(|e| e.file_name()).collect();
        assert_eq!(names, vec![std::ffi::OsString::from(a.mark_name())], "one whole mark, no temporary file");
        assert_eq!(Abandoned::decode_mark(&fs::read(&path).unwrap()).unwrap(), a);
    }
}
