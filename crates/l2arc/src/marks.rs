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
        let tmp = self.dir.join(temp_name(&a));
        write_durably(&tmp, &a.encode_mark(), true)?;
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
    /// may have gone on as if marked). A missing directory has none; one
    /// that cannot be read is an error: the start must not restore a log a
    /// mark there may refuse.
    pub(crate) fn list(&self) -> Result<Vec<(Abandoned, PathBuf)>, String> {
        let unreadable =
            |e: io::Error| format!("reading the abandoned-log marks in {}: {e}", self.dir.display());
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(unreadable(e)),
        };
        let mut out = Vec::new();
        for entry in entries {
            let entry = entry.map_err(unreadable)?;
            let name = entry.file_name();
            let path = entry.path();
            if let Some(a) = name.to_str().and_then(temp_of) {
                match temp_state(&path, a) {
                    Temp::Whole => out.push((a, path)),
                    Temp::Unreadable(e) => {
                        warn!(
                            "temporary abandoned-log mark {} cannot be read ({e}); it refuses its log",
                            path.display()
                        );
                        out.push((a, path));
                    }
                    Temp::Partial => {}
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
            out.push((a, path));
        }
        out.sort_by_key(|(a, _)| (a.uuid, a.incarnation));
        Ok(out)
    }
}

/// Removes the marks of `marked` (what [`MarkDir::list`] found) that can
/// never match again: their device is present with a durable header of
/// another incarnation (incarnations are random and new at every reset, so
/// an old one never returns). Marks of absent devices stay.
pub(crate) fn remove_superseded(marked: &[(Abandoned, PathBuf)], present: &[Abandoned]) {
    for (a, path) in marked {
        if present.iter().any(|p| p.uuid == a.uuid && p.incarnation != a.incarnation) {
            if let Err(e) = fs::remove_file(path) {
                warn!("removing the spent abandoned-log mark {}: {e}", path.display());
            }
        }
    }
}

impl MarkDir {
    /// Removes the partial temporary files left while marking one of the
    /// `present` devices: cut short by a crash before they were durable,
    /// so before their writer went on, or by a failed write, which was
    /// logged. Only the server holding a device (it
    /// is opened exclusively) writes that device's marks, so such a file
    /// is nobody else's write in progress, though servers may share the
    /// directory (unless two devices share a uuid: docs/persistence.md,
    /// Limits). Whole ones are marks ([`MarkDir::list`]).
    pub(crate) fn remove_partial_temps(&self, present: &[Abandoned]) {
        let Ok(entries) = fs::read_dir(&self.dir) else { return };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(a) = name.to_str().and_then(temp_of) else { continue };
            let path = entry.path();
            if present.iter().any(|p| p.uuid == a.uuid) && matches!(temp_state(&path, a), Temp::Partial) {
                if let Err(e) = fs::remove_file(&path) {
                    warn!("removing the partial {}: {e}", path.display());
                }
            }
        }
    }
}

fn temp_name(a: &Abandoned) -> String {
    format!("{}.tmp", a.mark_name())
}

/// The log a temporary mark file's name is for, if it is one's name.
fn temp_of(name: &str) -> Option<Abandoned> {
    name.strip_suffix(".tmp").and_then(Abandoned::from_mark_name)
}

/// What a temporary mark file holds.
enum Temp {
    /// The whole mark of the log its name gives.
    Whole,
    /// Read, but not that mark: its write was cut short.
    Partial,
    /// Not read: it may be whole, so it counts as a mark and stays.
    Unreadable(io::Error),
}

fn temp_state(path: &Path, a: Abandoned) -> Temp {
    match fs::read(path) {
        Ok(b) if Abandoned::decode_mark(&b).ok() == Some(a) => Temp::Whole,
        Ok(_) => Temp::Partial,
        Err(e) => Temp::Unreadable(e),
    }
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
