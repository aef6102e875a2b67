use std::io;

/// Why a device operation failed. Each maps to the errno a client should see.
#[derive(Debug, thiserror::Error)]
pub enum DevError {
    #[error("{op} of {len} bytes at offset {offset} on {dev}: {source}")]
    Io { op: &'static str, dev: String, offset: u64, len: u64, source: io::Error },
    #[error("range {offset}+{len} lies beyond the device end ({size} bytes)")]
    OutOfRange { offset: u64, len: u64, size: u64 },
    #[error("device is read-only")]
    ReadOnly,
    #[error("injected fault: {op} at offset {offset}")]
    Injected { op: &'static str, offset: u64 },
    #[error("operation not supported by {0}")]
    Unsupported(String),
    #[error("{dev} is in use{}; a device serves one server at a time", by(.holder))]
    InUse { dev: String, holder: Option<String> },
    #[error("remote export: {0}")]
    Remote(String, i32),
    /// The store changed underneath (`BlockDev::changed`): what it now
    /// holds is not what the cache holds.
    #[error("{0}")]
    Changed(String),
}

impl DevError {
    /// The errno a protocol layer should report for this failure.
    pub fn errno(&self) -> i32 {
        match self {
            DevError::Io { source, .. } => match source.raw_os_error() {
                Some(libc::ENOSPC) => libc::ENOSPC,
                Some(libc::EPERM) | Some(libc::EACCES) | Some(libc::EROFS) => libc::EPERM,
                _ => libc::EIO,
            },
            DevError::OutOfRange { .. } => libc::EINVAL,
            DevError::ReadOnly => libc::EPERM,
            DevError::Injected { .. } => libc::EIO,
            DevError::Unsupported(_) => libc::ENOTSUP,
            DevError::InUse { .. } => libc::EBUSY,
            DevError::Remote(_, errno) => *errno,
            DevError::Changed(_) => libc::EIO,
        }
    }
}

fn by(holder: &Option<String>) -> String {
    holder.as_ref().map_or_else(String::new, |h| format!(" by {h}"))
}

pub type DevResult<T> = Result<T, DevError>;
