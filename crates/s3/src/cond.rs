//! PUTs conditional on an object's ETag (`If-Match`) that work on servers
//! which compare that header in either of the two forms seen: the ETag
//! quoted, as every server returns it and as HTTP and AWS S3 have it, or
//! bare. Ceph RGW 16.2 (Debian 12's) answers 412 to a PUT with the quoted
//! form even when the ETag matches, so every rewrite of a chunk and every
//! lease renewal failed there: the writer fenced itself at its second txg
//! (found by bench/s3.sh, which moto's tests could not show).
//!
//! A 412 is first checked: if the object still has the ETag we named, the
//! server refused the form, not the object; the PUT is sent again in the
//! other form (still conditional, so a change in between is still caught),
//! and once that succeeds the process uses that form from then on.

use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use object_store::aws::AmazonS3;
use object_store::path::Path;
use object_store::{
    Attributes, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, PutResult, UpdateVersion,
};
use tracing::warn;

use crate::chunked::block;

/// True once a server of this process was seen to want the bare form.
static BARE: AtomicBool = AtomicBool::new(false);

fn form(etag: &str, bare: bool) -> String {
    let t = etag.trim_matches('"');
    if bare {
        t.to_string()
    } else {
        format!("\"{t}\"")
    }
}

fn send(
    store: &AmazonS3,
    path: &Path,
    payload: PutPayload,
    attributes: &Attributes,
    etag: String,
) -> object_store::Result<PutResult> {
    let mode = PutMode::Update(UpdateVersion { e_tag: Some(etag), version: None });
    let opts = PutOptions { mode, attributes: attributes.clone(), ..Default::default() };
    block(store.put_opts(path, payload, opts))
}

/// Whether `path` still has ETag `etag` (either form).
fn unchanged(store: &AmazonS3, path: &Path, etag: &str) -> bool {
    match block(store.head(path)) {
        Ok(meta) => meta.e_tag.as_deref().map(|e| e.trim_matches('"')) == Some(etag.trim_matches('"')),
        Err(_) => false,
    }
}

/// PUTs `payload` at `path` if the object there has ETag `etag`; a 412 is
/// an error only if the object changed (see the module's text).
pub(crate) fn put_if_match(
    store: &AmazonS3,
    path: &Path,
    payload: PutPayload,
    attributes: &Attributes,
    etag: &str,
) -> object_store::Result<PutResult> {
    let bare = BARE.load(Relaxed);
    match send(store, path, payload.clone(), attributes, form(etag, bare)) {
        Err(e @ object_store::Error::Precondition { .. }) => {
            if !unchanged(store, path, etag) {
                return Err(e);
            }
            let again = send(store, path, payload, attributes, form(etag, !bare));
            if again.is_ok() && BARE.swap(!bare, Relaxed) == bare {
                let how = if bare { "quoted" } else { "without its quotes" };
                warn!("{path}: this S3 server compares If-Match with the ETag {how}; conditional PUTs send it so");
            }
            again
        }
        other => other,
    }
}

/// `put_if_match`, or a create-only PUT when there is no ETag to match.
pub(crate) fn put_conditional(
    store: &AmazonS3,
    path: &Path,
    payload: PutPayload,
    attributes: &Attributes,
    etag: Option<&str>,
) -> object_store::Result<PutResult> {
    match etag {
        Some(e) => put_if_match(store, path, payload, attributes, e),
        None => {
            let opts =
                PutOptions { mode: PutMode::Create, attributes: attributes.clone(), ..Default::default() };
            block(store.put_opts(path, payload, opts))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::form;

    #[test]
    fn either_form_from_either_form() {
        for e in ["\"abc\"", "abc"] {
            assert_eq!(form(e, false), "\"abc\"");
            assert_eq!(form(e, true), "abc");
        }
    }
}
