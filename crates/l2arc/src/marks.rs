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
    /// another writer, durably, under the same lock) is left as it is.
    pub(crate) fn record(&self, a: Abandoned) -> io::Result<PathBuf> {
        let _writing = self.writing.lock();
        let path = self.dir.join(a.mark_name());
        if path.exists() {
            return Ok(path);
        }
        fs::create_dir_all(&self.dir)?;
        let tmp = self.dir.join(format!("{}.tmp", a.mark_name()));
        let mut f = fs::File::create(&tmp)?;
        f.write_all(&a.encode_mark())?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, &path)?;
        fs::File::open(&self.dir)?.sync_all()?;
        Ok(path)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.dir
    }

    /// Checks now, not when a device fails and its log must be marked, that
    /// a mark can be written here: the directory made, a file written,
    /// made durable and removed.
    pub(crate) fn probe(&self) -> io::Result<()> {
        fs::create_dir_all(&self.dir)?;
        let probe = self.dir.join(format!(".probe-{}", std::process::id()));
        let written = fs::File::create(&probe).and_then(|mut f| {
            f.write_all(b"probe")?;
            f.sync_all()
        });
        let removed = fs::remove_file(&probe);
        written.and(removed)
    }

    /// Every mark found, by its name (a damaged file still refuses the log
    /// its name gives, with a warning). A missing directory has none; one
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
            let Some(a) = name.to_str().and_then(Abandoned::from_mark_name) else { continue };
            let path = entry.path();
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
    /// Removes the temporary files a crash left while marking one of the
    /// `present` devices. Only the server holding a device (it is opened
    /// exclusively) writes that device's marks, so such a file is nobody
    /// else's write in progress, though servers may share the directory.
    pub(crate) fn remove_leftover_temps(&self, present: &[Abandoned]) {
        let Ok(entries) = fs::read_dir(&self.dir) else { return };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let Some(a) =
                name.to_str().and_then(|n| n.strip_suffix(".tmp")).and_then(Abandoned::from_mark_name)
            else {
                continue;
            };
            if present.iter().any(|p| p.uuid == a.uuid) {
                if let Err(e) = fs::remove_file(entry.path()) {
                    warn!("removing the leftover {}: {e}", entry.path().display());
                }
            }
        }
    }
}
