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
}

impl MarkDir {
    pub(crate) fn new(state_dir: &Path) -> MarkDir {
        MarkDir { dir: state_dir.join("l2-abandoned") }
    }

    /// Writes the mark of `a` durably: a temporary file made durable, then
    /// renamed into place and the directory made durable, so a crash leaves
    /// either no mark or a whole one.
    pub(crate) fn record(&self, a: Abandoned) -> io::Result<PathBuf> {
        fs::create_dir_all(&self.dir)?;
        let path = self.dir.join(a.mark_name());
        let tmp = self.dir.join(format!("{}.tmp", a.mark_name()));
        let mut f = fs::File::create(&tmp)?;
        f.write_all(&a.encode_mark())?;
        f.sync_all()?;
        drop(f);
        fs::rename(&tmp, &path)?;
        fs::File::open(&self.dir)?.sync_all()?;
        Ok(path)
    }

    /// Every mark found, by its name (a damaged file still refuses the log
    /// its name gives, with a warning). A missing directory has none.
    pub(crate) fn list(&self) -> Vec<(Abandoned, PathBuf)> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Vec::new(),
            Err(e) => {
                warn!("abandoned-log marks in {}: {e}", self.dir.display());
                return Vec::new();
            }
        };
        let mut out = Vec::new();
        for entry in entries.flatten() {
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
        out
    }

    /// Removes the marks that can never match again: their device is
    /// present with a durable header of another incarnation (incarnations
    /// are random and new at every reset, so an old one never returns).
    /// Marks of absent devices stay.
    pub(crate) fn remove_superseded(&self, present: &[Abandoned]) {
        for (a, path) in self.list() {
            if present.iter().any(|p| p.uuid == a.uuid && p.incarnation != a.incarnation) {
                if let Err(e) = fs::remove_file(&path) {
                    warn!("removing the spent abandoned-log mark {}: {e}", path.display());
                }
            }
        }
    }
}
