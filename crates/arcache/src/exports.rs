//! The glue between the engine's volumes and the NBD protocol.

use std::collections::BTreeMap;
use std::sync::Arc;

use arcache_engine::{Batch, CommitDone, Held, Volume};
use blockdev::{Alloc, DevError};
use nbd::proto::{STATE_HOLE, STATE_ZERO};
use nbd::{Completion, Errno, Export, ExportInfo, ExportSet, Extent, NbdResult, Piece, ReadCompletion};

use crate::recorder::Recorder;
use tracing::warn;

pub struct NbdExport {
    vol: Arc<Volume>,
    description: String,
    recorder: Option<Arc<Recorder>>,
}

impl NbdExport {
    pub fn new(vol: Arc<Volume>, description: String, recorder: Option<Arc<Recorder>>) -> Self {
        NbdExport { vol, description, recorder }
    }

    fn note(&self, write: bool, offset: u64, len: usize) {
        if let Some(r) = &self.recorder {
            r.record(self.vol.id(), write, offset, len as u64);
        }
    }
}

/// A held record as the reply carries it: an uncompressed record's stored
/// bytes are exactly its bytes.
fn piece(held: Held) -> Piece {
    match held {
        Held::Record(rec) => Piece::whole(rec),
        Held::Bytes(b) => Piece::owned(b),
    }
}

fn read_errno(e: DevError) -> Errno {
    errno("read", &e)
}

fn errno(op: &str, e: &DevError) -> Errno {
    let n = e.errno();
    if n == libc::EIO || n == libc::ENOSPC {
        warn!("{op}: {e}");
    }
    Errno(n)
}

impl Export for NbdExport {
    fn info(&self) -> ExportInfo {
        ExportInfo {
            size: self.vol.size(),
            read_only: self.vol.read_only(),
            // Every connection goes through the same volume and device, and a
            // device flush covers all writes completed before it.
            multi_conn: self.vol.device().flush_covers_all_handles(),
            rotational: false,
            description: self.description.clone(),
            min_block: 1,
            preferred_block: self.vol.recordsize() as u32,
        }
    }

    fn try_read_now(&self, offset: u64, buf: &mut [u8]) -> Option<NbdResult> {
        let done = self.vol.try_read_cached(offset, buf);
        if done {
            self.note(false, offset, buf.len());
        }
        done.then_some(Ok(()))
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> NbdResult {
        self.note(false, offset, buf.len());
        self.vol.read(offset, buf).map_err(|e| errno("read", &e))
    }

    fn try_read_pieces_now(&self, offset: u64, len: u32) -> Option<Result<Vec<Piece>, Errno>> {
        let held = self.vol.try_read_cached_held(offset, len as usize)?;
        self.note(false, offset, len as usize);
        Some(Ok(held.into_iter().map(piece).collect()))
    }

    fn read_pieces(&self, offset: u64, len: u32) -> Option<Result<Vec<Piece>, Errno>> {
        let held = self.vol.read_held(offset, len as usize).transpose()?;
        // Recorded whether it failed or not, as `read` records a read.
        self.note(false, offset, len as usize);
        Some(held.map(|h| h.into_iter().map(piece).collect()).map_err(|e| errno("read", &e)))
    }

    fn read_async(
        &self,
        offset: u64,
        len: u32,
        done: ReadCompletion,
        out: &mut Batch,
    ) -> Result<(), ReadCompletion> {
        // Given back, the server reads through `read`, which notes it.
        self.vol.read_async(offset, len as usize, done, read_errno, out)?;
        self.note(false, offset, len as usize);
        Ok(())
    }

    fn try_write_now(&self, offset: u64, data: &[u8], fua: bool) -> Option<NbdResult> {
        let res = self.vol.try_write_now(offset, data, fua)?;
        self.note(true, offset, data.len());
        Some(res.map_err(|e| errno("write", &e)))
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> NbdResult {
        self.note(true, offset, data.len());
        self.vol.write(offset, data, fua).map_err(|e| errno("write", &e))
    }

    fn flush(&self) -> NbdResult {
        self.vol.flush().map_err(|e| errno("flush", &e))
    }

    fn flush_async(&self, done: Completion, out: &mut Batch) -> Result<(), Completion> {
        if !self.vol.flushes_async() {
            return Err(done);
        }
        let answer: CommitDone =
            Box::new(move |res, out| done(res.as_ref().map_err(|e| errno("flush", e)).copied(), out));
        if let Err(answer) = self.vol.flush_async(answer, out) {
            // No commit thread (it could not start, or the server is
            // stopping): answer here, waiting.
            answer(&self.vol.flush(), out);
        }
        Ok(())
    }

    fn trim(&self, offset: u64, len: u64, fua: bool) -> NbdResult {
        self.vol.trim(offset, len, fua).map_err(|e| errno("trim", &e))
    }

    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> NbdResult {
        self.vol.write_zeroes(offset, len, fua).map_err(|e| errno("write_zeroes", &e))
    }

    fn write_zeroes_fast(&self, offset: u64, len: u64, fua: bool, no_hole: bool) -> NbdResult {
        match self.vol.write_zeroes_fast(offset, len, fua, no_hole) {
            // Expected and frequent (clients probe with it): not worth a warning.
            Err(DevError::Unsupported(_)) => Err(Errno(libc::ENOTSUP)),
            other => other.map_err(|e| errno("write_zeroes", &e)),
        }
    }

    fn cache(&self, offset: u64, len: u64) -> NbdResult {
        self.vol.prefetch(offset, len).map_err(|e| errno("cache", &e))
    }

    fn block_status(&self, offset: u64, len: u32) -> Result<Vec<Extent>, Errno> {
        let map = self.vol.allocation(offset, u64::from(len)).map_err(|e| errno("block status", &e))?;
        Ok(map
            .into_iter()
            .map(|(len, kind)| Extent {
                len: len.min(u64::from(u32::MAX)) as u32,
                flags: match kind {
                    Alloc::Data => 0,
                    Alloc::Hole => STATE_HOLE | STATE_ZERO,
                    Alloc::Zero => STATE_ZERO,
                },
            })
            .collect())
    }
}

#[derive(Default)]
pub struct ExportTable {
    by_name: BTreeMap<String, Arc<NbdExport>>,
}

impl ExportTable {
    pub fn insert(&mut self, e: NbdExport) {
        self.by_name.insert(e.vol.name().to_string(), Arc::new(e));
    }
}

impl ExportSet for ExportTable {
    fn list(&self) -> Vec<(String, String)> {
        self.by_name.iter().map(|(n, e)| (n.clone(), e.description.clone())).collect()
    }

    fn open(&self, name: &str) -> Option<Arc<dyn Export>> {
        self.by_name.get(name).map(|e| Arc::clone(e) as Arc<dyn Export>)
    }
}
