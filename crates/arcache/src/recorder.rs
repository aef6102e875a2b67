//! `arcache serve --record-trace FILE[:MAXSIZE]`: every read and write the
//! server answers, as the CSV form `arcache sim` reads
//! (`timestamp_us,op,offset_bytes,length_bytes,dev`, dev = export number),
//! so a user can size a cache from their own workload.
//!
//! Low overhead: requests go through a bounded queue to a writer thread; a
//! full queue or a full disk drops records (counted) rather than slowing or
//! stopping the server. The file stops growing at MAXSIZE (default 1 GiB).

use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::mpsc::{sync_channel, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result};
use tracing::{info, warn};

/// Default bound of a recorded trace.
pub const DEFAULT_MAX: u64 = 1 << 30;

enum Msg {
    Rec(Rec),
    /// Write out what is buffered, then answer.
    Flush(SyncSender<()>),
}

#[derive(Debug, Clone, Copy)]
struct Rec {
    us: u64,
    write: bool,
    dev: u16,
    offset: u64,
    len: u64,
}

/// Counters for `arcache stat`.
#[derive(Debug, Default)]
pub struct RecorderStats {
    pub recorded: AtomicU64,
    pub dropped: AtomicU64,
    pub bytes: AtomicU64,
    pub full: AtomicBool,
}

pub struct Recorder {
    tx: SyncSender<Msg>,
    epoch: Instant,
    pub stats: Arc<RecorderStats>,
}

impl Recorder {
    /// Creates (truncates) `path` and starts the writer thread.
    pub fn start(path: PathBuf, max_bytes: u64) -> Result<Arc<Recorder>> {
        let file =
            std::fs::File::create(&path).with_context(|| format!("creating trace {}", path.display()))?;
        let (tx, rx) = sync_channel::<Msg>(1 << 16);
        let stats = Arc::new(RecorderStats::default());
        let st = Arc::clone(&stats);
        let shown = path.display().to_string();
        std::thread::Builder::new().name("trace-recorder".into()).spawn(move || {
            let mut out = BufWriter::with_capacity(1 << 20, file);
            let mut line = String::with_capacity(64);
            let header = "timestamp_us,op,offset_bytes,length_bytes,dev\n";
            let mut written = header.len() as u64;
            let mut healthy = out.write_all(header.as_bytes()).is_ok();
            loop {
                let r = match rx.recv_timeout(std::time::Duration::from_millis(500)) {
                    Ok(Msg::Rec(r)) => r,
                    Ok(Msg::Flush(ack)) => {
                        let _ = out.flush();
                        let _ = ack.send(());
                        continue;
                    }
                    Err(RecvTimeoutError::Timeout) => {
                        // Quiet: put what is buffered on disk.
                        let _ = out.flush();
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => break,
                };
                line.clear();
                use std::fmt::Write as _;
                let _ = writeln!(
                    line,
                    "{},{},{},{},{}",
                    r.us,
                    if r.write { 'W' } else { 'R' },
                    r.offset,
                    r.len,
                    r.dev
                );
                if !healthy || written + line.len() as u64 > max_bytes {
                    st.full.store(true, Relaxed);
                    st.dropped.fetch_add(1, Relaxed);
                    continue;
                }
                if let Err(e) = out.write_all(line.as_bytes()) {
                    warn!("trace {}: {e}; recording stops, serving goes on", path.display());
                    healthy = false;
                    continue;
                }
                written += line.len() as u64;
                st.recorded.fetch_add(1, Relaxed);
                st.bytes.store(written, Relaxed);
            }
            if let Err(e) = out.flush() {
                warn!("trace {}: {e}", path.display());
            }
        })?;
        info!("recording requests to {shown} (at most {max_bytes} bytes)");
        Ok(Arc::new(Recorder { tx, epoch: Instant::now(), stats }))
    }

    pub fn record(&self, dev: u16, write: bool, offset: u64, len: u64) {
        let r = Rec { us: self.epoch.elapsed().as_micros() as u64, write, dev, offset, len };
        match self.tx.try_send(Msg::Rec(r)) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                self.stats.dropped.fetch_add(1, Relaxed);
            }
        }
    }

    /// Writes out every record queued so far (at stop).
    pub fn flush(&self) {
        let (ack, done) = sync_channel(1);
        if self.tx.send(Msg::Flush(ack)).is_ok() {
            let _ = done.recv_timeout(std::time::Duration::from_secs(10));
        }
    }
}

/// `FILE[:MAXSIZE]`.
pub fn parse(spec: &str) -> Result<(PathBuf, u64)> {
    if let Some((p, size)) = spec.rsplit_once(':') {
        if let Ok(bytes) = crate::size::parse_size(size) {
            return Ok((PathBuf::from(p), bytes));
        }
    }
    Ok((PathBuf::from(spec), DEFAULT_MAX))
}
