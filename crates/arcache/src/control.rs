//! The control socket: one JSON request per line, one JSON answer per line.
//! `arcache stat/get/set` are its clients.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use nbd::Listeners;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tracing::warn;

#[derive(Debug, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    Stat,
    Get {
        name: String,
    },
    GetAll,
    Set {
        name: String,
        value: String,
    },
    /// Sync a transaction group now and wait for it.
    Flush,
}

#[derive(Debug, Serialize, Deserialize)]
pub struct Response {
    pub ok: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What answers control requests; implemented by the running server.
pub trait Handler: Send + Sync {
    fn handle(&self, req: Request) -> Result<Value>;
}

/// Binds the control socket with mode 0600 and serves it in the background
/// until `stop.close_all()`: then the accepting thread ends, and so do the
/// sessions once their request in hand is answered, letting the handler go.
pub fn serve(path: &Path, handler: Arc<dyn Handler>, stop: &Arc<Listeners>) -> Result<PathBuf> {
    let listener = bind_private(path)?;
    stop.keep(listener.try_clone().with_context(|| format!("keeping {}", path.display()))?.into());
    let stop = Arc::clone(stop);
    std::thread::Builder::new().name("control".into()).spawn(move || {
        for stream in listener.incoming() {
            if stop.closed() {
                break;
            }
            match stream.and_then(|s| Ok((s.try_clone()?, s))) {
                Ok((dup, s)) => {
                    let slot = stop.keep_session(dup.into());
                    let h = Arc::clone(&handler);
                    let spawned =
                        std::thread::Builder::new().name("control-session".into()).spawn(move || {
                            if let Err(e) = session(s, h.as_ref()) {
                                warn!("control connection: {e:#}");
                            }
                            drop(slot);
                        });
                    if let Err(e) = spawned {
                        warn!("control connection: no thread for it: {e}");
                    }
                }
                Err(e) => warn!("control accept: {e}"),
            }
        }
    })?;
    Ok(path.to_path_buf())
}

/// Binds a unix socket only its owner may use, replacing a stale one left
/// by a dead process but never one a live server still answers on.
pub fn bind_private(path: &Path) -> Result<UnixListener> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    if path.exists() {
        if UnixStream::connect(path).is_ok() {
            bail!("{} is in use by a running server", path.display());
        }
        std::fs::remove_file(path).with_context(|| format!("removing stale socket {}", path.display()))?;
    }
    // Create it private from the start: no window where others could connect.
    // SAFETY: umask only changes this process's file creation mask.
    let old = unsafe { libc::umask(0o077) };
    let bound = UnixListener::bind(path);
    // SAFETY: as above, restoring the previous mask.
    unsafe { libc::umask(old) };
    let listener = bound.with_context(|| format!("binding {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(listener)
}

/// Opens a socket from [`bind_private`] to group `gid` too (mode 0660).
pub fn share_with_group(path: &Path, gid: libc::gid_t) -> Result<()> {
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())?;
    // SAFETY: a valid NUL-terminated path; uid -1 leaves the owner as is.
    if unsafe { libc::chown(c_path.as_ptr(), u32::MAX, gid) } != 0 {
        let e = std::io::Error::last_os_error();
        bail!("giving {} to group {gid}: {e}", path.display());
    }
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))?;
    Ok(())
}

/// A group's id, by name or as a number.
pub fn group_id(group: &str) -> Result<libc::gid_t> {
    if let Ok(gid) = group.parse() {
        return Ok(gid);
    }
    let name = std::ffi::CString::new(group)?;
    // SAFETY: getgrnam reads a NUL-terminated name; the record it returns
    // is read at once, before any other call could reuse it.
    let entry = unsafe { libc::getgrnam(name.as_ptr()) };
    if entry.is_null() {
        bail!("no group named {group:?}");
    }
    // SAFETY: non-null, so it points at a valid group record.
    Ok(unsafe { (*entry).gr_gid })
}

fn session(stream: UnixStream, handler: &dyn Handler) -> Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(60)))?;
    let mut w = stream.try_clone()?;
    let rd = BufReader::new(stream);
    for line in rd.lines() {
        let line = line?;
        if line.len() > 1 << 16 {
            bail!("request too long");
        }
        let resp = match serde_json::from_str::<Request>(&line) {
            Ok(req) => match handler.handle(req) {
                Ok(v) => Response { ok: true, result: Some(v), error: None },
                Err(e) => Response { ok: false, result: None, error: Some(format!("{e:#}")) },
            },
            Err(e) => Response { ok: false, result: None, error: Some(format!("bad request: {e}")) },
        };
        let mut text = serde_json::to_string(&resp)?;
        text.push('\n');
        w.write_all(text.as_bytes())?;
    }
    Ok(())
}

/// Sends one request to a running server and returns its result.
pub fn call(path: &Path, req: &Request) -> Result<Value> {
    let stream = UnixStream::connect(path).with_context(|| {
        format!(
            "cannot reach the control socket {} (is `arcache serve` running? pass --control PATH)",
            path.display()
        )
    })?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut w = stream.try_clone()?;
    let mut text = serde_json::to_string(req)?;
    text.push('\n');
    w.write_all(text.as_bytes())?;
    let mut line = String::new();
    BufReader::new(stream).read_line(&mut line)?;
    let resp: Response = serde_json::from_str(&line).context("bad answer from the server")?;
    if resp.ok {
        Ok(resp.result.unwrap_or(Value::Null))
    } else {
        Err(anyhow!(resp.error.unwrap_or_else(|| "unknown error".into())))
    }
}
