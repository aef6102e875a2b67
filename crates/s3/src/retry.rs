//! Retries beyond object_store's own, and what an error means to a human.
//!
//! object_store retries 5xx (SlowDown included), 429 and transport errors
//! with backoff and jitter, but not a transport error of a request that is
//! not idempotent once it may have been sent: a conditional PUT whose
//! connection was reset fails at once. Ours are safe to send again, because
//! each chunk PUT carries a write id and a 412 is checked against it
//! (`chunked.rs`), and each lease PUT carries our token; so
//! [`with_retries`] sends them again, with backoff and jitter, until the
//! request's retry budget (`retry_timeout`) is spent.

use std::time::{Duration, Instant};

use tracing::info;

/// How long one request keeps being retried (5xx, SlowDown, resets)
/// before it fails that client request, unless the export's
/// `retry_timeout=SECS` says otherwise.
pub(crate) const DEFAULT_RETRY_TIMEOUT: Duration = Duration::from_secs(30);

const INIT_BACKOFF: Duration = Duration::from_millis(50);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// An error left after object_store's retries that may still pass: a 5xx
/// it gave up on, or a transport error it would not retry. 403, 404, 412,
/// 304 and 409 have their own variants and are answers, not faults.
pub(crate) fn transient(e: &object_store::Error) -> bool {
    matches!(e, object_store::Error::Generic { .. })
}

/// Runs `op` until it succeeds, fails with an error that is not
/// [`transient`], or `budget` (from the first try) is spent.
pub(crate) fn with_retries<T>(
    budget: Duration,
    what: &dyn std::fmt::Display,
    mut op: impl FnMut() -> object_store::Result<T>,
) -> object_store::Result<T> {
    let deadline = Instant::now() + budget;
    let mut backoff = INIT_BACKOFF;
    let mut tries = 0u32;
    loop {
        let e = match op() {
            Err(e) if transient(&e) => e,
            done => return done,
        };
        tries += 1;
        // Full jitter over the upper half: never zero, never in step with
        // another thread's retries.
        let sleep = backoff.mul_f64(0.5 + rand::random::<f64>() / 2.0);
        if Instant::now() + sleep >= deadline {
            return Err(e);
        }
        info!("{what}: {e}; retry {tries} in {} ms", sleep.as_millis());
        std::thread::sleep(sleep);
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

/// The S3 error code in an error's text (`<Code>NoSuchBucket</Code>`), if
/// the server sent one.
pub(crate) fn s3_code(e: &object_store::Error) -> Option<String> {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        text.push_str(&s.to_string());
        source = s.source();
    }
    let start = text.find("<Code>")? + "<Code>".len();
    let len = text[start..].find("</Code>")?;
    Some(text[start..start + len].to_string())
}

/// Says what an error at start means: the bucket missing, the key id
/// unknown, the secret wrong, or access denied, with the S3 error code.
/// `creds_source` says where the credentials came from.
pub(crate) fn explain(e: &object_store::Error, bucket: &str, creds_source: &str) -> String {
    let code = s3_code(e);
    let why = match code.as_deref() {
        Some("NoSuchBucket") => format!("the bucket {bucket} does not exist (NoSuchBucket)"),
        Some("InvalidAccessKeyId") => format!(
            "wrong credentials: the server does not know the access key id (InvalidAccessKeyId; credentials from {creds_source})"
        ),
        Some("SignatureDoesNotMatch") => format!(
            "wrong credentials: the secret access key does not match the key id (SignatureDoesNotMatch; credentials from {creds_source})"
        ),
        Some("AccessDenied") => format!(
            "access denied (403 AccessDenied): these credentials (from {creds_source}) may not use bucket {bucket}"
        ),
        Some(c) if matches!(e, object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. }) => {
            format!("access denied (403 {c}; credentials from {creds_source})")
        }
        _ => match e {
            object_store::Error::PermissionDenied { .. } | object_store::Error::Unauthenticated { .. } => {
                format!("access denied (403; credentials from {creds_source})")
            }
            _ => return e.to_string(),
        },
    };
    format!("{why}: {e}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: &str) -> object_store::Error {
        let body = format!("<?xml version=\"1.0\"?><Error><Code>{code}</Code><Message>m</Message></Error>");
        object_store::Error::PermissionDenied { path: "k".into(), source: body.into() }
    }

    #[test]
    fn start_errors_name_the_cause() {
        assert_eq!(s3_code(&status("SlowDown")).as_deref(), Some("SlowDown"));
        let e = explain(&status("NoSuchBucket"), "vms", "env");
        assert!(e.starts_with("the bucket vms does not exist"), "{e}");
        let e = explain(&status("InvalidAccessKeyId"), "vms", "AWS_ACCESS_KEY_ID");
        assert!(e.contains("wrong credentials") && e.contains("AWS_ACCESS_KEY_ID"), "{e}");
        assert!(explain(&status("SignatureDoesNotMatch"), "vms", "x").contains("secret access key"));
        assert!(explain(&status("AccessDenied"), "vms", "x").contains("access denied"));
    }

    #[test]
    fn only_transient_errors_are_retried_and_only_within_the_budget() {
        let mut n = 0;
        let r: object_store::Result<()> = with_retries(Duration::from_millis(300), &"t", || {
            n += 1;
            Err(object_store::Error::Generic { store: "S3", source: "reset".into() })
        });
        assert!(r.is_err() && n > 1, "{n}");
        let mut n = 0;
        let r: object_store::Result<()> = with_retries(Duration::from_secs(5), &"t", || {
            n += 1;
            Err(object_store::Error::Precondition { path: "k".into(), source: "412".into() })
        });
        assert!(r.is_err() && n == 1);
    }
}
