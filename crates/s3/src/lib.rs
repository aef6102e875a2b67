//! S3-compatible object storage as a block device: one object served
//! read-only (`s3://BUCKET/KEY`), through ranged GETs pinned to the ETag
//! the object had when it was opened, and a writable disk of chunk
//! objects under a prefix (`s3://BUCKET/PREFIX/?size=SIZE`) with one
//! writer at a time (docs/s3-backing.md).
//!
//! The client is `object_store` (docs/s3-backing.md, section 2): it signs,
//! retries 5xx, throttling and connection errors with backoff and jitter,
//! and types the conditional requests. Its futures run on one small tokio
//! runtime of this crate; the engine's threads call the synchronous
//! `BlockDev` methods, which block on them.

mod body;
mod chunked;
mod cond;
mod credentials;
mod follow;
pub mod format;
mod head;
mod inspect;
mod lease;
mod location;
mod object;
mod retry;
mod runtime;

pub use chunked::{break_lease, S3ChunkDev, DEFAULT_CHUNK};
pub use credentials::{Credentials, S3Settings};
pub use inspect::{create, show, DiskInfo};
pub use location::S3Location;
pub use object::S3ObjectDev;

/// True if `text` names an S3 backing store.
pub fn is_s3_uri(text: &str) -> bool {
    text.starts_with("s3://")
}
