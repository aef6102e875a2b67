//! Where the trace tests find their traces: the small ones shipped in the
//! repository's `traces/`, and the full set for the extended checks.
#![allow(dead_code)]

use std::path::PathBuf;

/// Names the directory of the full trace set (the layout of `traces/`,
/// with every trace of traces/README.md's "extended checks").
pub const EXTENDED_VAR: &str = "ARCACHE_TRACES";

/// The repository's `traces/`.
pub fn shipped_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../traces")
}

pub fn shipped(rel: &str) -> PathBuf {
    shipped_dir().join(rel)
}

/// The full trace set. The extended checks are `#[ignore]`d and run only
/// on request, so a missing directory is a failure: passing without the
/// traces would claim a check that never ran.
pub fn extended_dir() -> PathBuf {
    let dir = std::env::var_os(EXTENDED_VAR).unwrap_or_else(|| {
        panic!("{EXTENDED_VAR} is not set: the extended checks need the full trace set (traces/README.md)")
    });
    let dir = PathBuf::from(dir);
    let refs = dir.join("reference_hit_ratios.json");
    assert!(refs.is_file(), "{} is missing: {EXTENDED_VAR} must name the full trace set", refs.display());
    dir
}

pub fn extended(rel: &str) -> PathBuf {
    let path = extended_dir().join(rel);
    assert!(path.is_file(), "{} is missing: {EXTENDED_VAR} must name the full trace set", path.display());
    path
}
