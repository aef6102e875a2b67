//! The intent log's replay at start: above both the write-back (whose log
//! it reads) and the volumes (through whose write-through path it writes).

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Instant;

use blockdev::DevResult;
use tracing::info;
use zil::{Entry, LogError, LogExport, ReplayStats};

use crate::dirty::{self, PAGE};
use crate::volume::Volume;
use crate::writeback::WriteBack;

/// Applies the intent log found at start to the backing stores through
/// the write-through path (which drops L2 copies durably first), flushes
/// them and empties the log. `vols` pairs each export as the log names
/// it now with its volume; a log naming another export is refused.
pub fn replay_log(wb: &WriteBack, vols: &[(LogExport, Arc<Volume>)]) -> Result<ReplayStats, LogError> {
    let Some(log) = wb.intent_log() else { return Ok(ReplayStats::default()) };
    if !log.needs_replay() {
        return Ok(ReplayStats::default());
    }
    let find = |x: &LogExport| {
        vols.iter()
            .find(|(e, _)| e.name == x.name && e.identity == x.identity && e.size == x.size)
            .map(|(_, v)| v)
    };
    let started = Instant::now();
    let stats = log.replay(&|x| find(x).is_some(), &mut |x, entry| {
        let vol = find(x).ok_or("export vanished")?;
        apply_entry(vol, entry).map_err(|e| format!("replaying into export {:?}: {e}", x.name))
    })?;
    for (_, v) in vols {
        if !v.read_only() {
            v.flush_backing().map_err(|e| LogError::Io(v.name().to_string(), e))?;
        }
    }
    log.reset()?;
    wb.stats.zil_replay_records.fetch_add(stats.pages + stats.discards, Relaxed);
    wb.stats.zil_replay_bytes.fetch_add(stats.bytes, Relaxed);
    if stats.chunks > 0 {
        info!(
            "intent log replayed: {} chunks, {} pages ({:.1} MiB), {} trims/zeroings in {:.2} s",
            stats.chunks,
            stats.pages,
            stats.bytes as f64 / (1 << 20) as f64,
            stats.discards,
            started.elapsed().as_secs_f64()
        );
    }
    Ok(stats)
}

/// One replayed log entry, written through to the backing store.
fn apply_entry(vol: &Volume, entry: &Entry) -> DevResult<()> {
    match entry {
        Entry::Page { page, mask, data, .. } => {
            let mut packed = data.chunks(dirty::SECTOR as usize);
            let mut run: Option<(u64, Vec<u8>)> = None;
            for s in dirty::sectors(*mask) {
                let at = page * PAGE + s as u64 * dirty::SECTOR;
                let bytes = packed.next().unwrap_or(&[]);
                match &mut run {
                    Some((start, buf)) if *start + buf.len() as u64 == at => buf.extend_from_slice(bytes),
                    _ => {
                        if let Some((start, buf)) = run.take() {
                            write_clipped(vol, start, &buf)?;
                        }
                        run = Some((at, bytes.to_vec()));
                    }
                }
            }
            match run {
                Some((start, buf)) => write_clipped(vol, start, &buf),
                None => Ok(()),
            }
        }
        Entry::Zero { offset, len, .. } => vol.write_zeroes_through(*offset, *len),
        Entry::Trim { offset, len, .. } => vol.trim_through(*offset, *len),
    }
}

/// The last page of an export may reach past its end.
fn write_clipped(vol: &Volume, start: u64, buf: &[u8]) -> DevResult<()> {
    let n = vol.size().saturating_sub(start).min(buf.len() as u64) as usize;
    if n == 0 {
        return Ok(());
    }
    vol.write_through(start, &buf[..n], false)
}
