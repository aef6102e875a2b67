//! A Ceph RBD image as a block device: the backing store behind
//! `rbd:POOL/IMAGE[@SNAP][?conf=PATH&id=USER]` (docs/rbd-backing.md).
//!
//! The device is a small hand-written FFI over librbd's and librados's C
//! API, built with the `librbd` feature (it links both libraries); without
//! it this crate is the spec parser only, so `arcache` builds where Ceph's
//! libraries are not installed and says so when asked for an `rbd:` export.

mod spec;

#[cfg(feature = "librbd")]
mod dev;
#[cfg(feature = "librbd")]
mod ffi;

#[cfg(feature = "librbd")]
pub use dev::{OpenError, RbdDev, RbdOptions};
pub use spec::{is_rbd_uri, RbdSpec, SpecError, DEFAULT_ID};
