//! `s3://BUCKET/KEY` and `s3://BUCKET/PREFIX/?size=SIZE`.

use std::time::Duration;

use thiserror::Error;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Location {
    pub bucket: String,
    /// The object's key, or a chunked disk's prefix (ending in `/`).
    pub key: String,
    /// The query's `size=`, as written (a chunked disk's size).
    pub size: Option<String>,
    /// The query's `chunk=`, as written (a chunked disk's chunk size,
    /// fixed when the disk is made).
    pub chunk: Option<String>,
    /// The query's `retry_timeout=SECS`: how long one request is retried
    /// (5xx, SlowDown, resets) before it fails; `None` for the default.
    pub retry_timeout: Option<Duration>,
    /// The query's `lease_renew=SECS`: how often a writer renews its lease
    /// (it stops writing after three periods without a renewal); `None`
    /// for the default, 10 s.
    pub lease_renew: Option<Duration>,
    /// The query's `recheck=SECS`: how often an object is asked whether it
    /// changed (0: never); `None` for the default, 10 s.
    pub recheck: Option<Duration>,
    /// The query's `head_poll_ms=MS`: how often a read-only server of a
    /// chunked disk asks whether the writer committed a new generation
    /// (0: never; it then serves the disk as of its start); `None` for the
    /// default, 1 s.
    pub head_poll: Option<Duration>,
}

#[derive(Debug, Error, PartialEq, Eq)]
#[error("{uri}: {why} (expected s3://BUCKET/KEY[?recheck=SECS] or s3://BUCKET/PREFIX/?size=SIZE[&chunk=SIZE][&lease_renew=SECS][&head_poll_ms=MS], either with &retry_timeout=SECS)")]
pub struct LocationError {
    uri: String,
    why: &'static str,
}

impl S3Location {
    pub fn parse(uri: &str) -> Result<S3Location, LocationError> {
        let bad = |why| LocationError { uri: uri.to_string(), why };
        let rest = uri.strip_prefix("s3://").ok_or_else(|| bad("not an s3:// URI"))?;
        let (path, query) = match rest.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (rest, None),
        };
        let (bucket, key) = path.split_once('/').ok_or_else(|| bad("no key after the bucket"))?;
        // S3's own rule: 3 to 63 characters of lower-case letters, digits,
        // dots and dashes.
        let bucket_ok = (3..=63).contains(&bucket.len())
            && bucket.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-');
        if !bucket_ok {
            return Err(bad("a bucket name is 3 to 63 lower-case letters, digits, dots or dashes"));
        }
        if key.is_empty() {
            return Err(bad("no key after the bucket"));
        }
        let mut size = None;
        let mut chunk = None;
        let mut retry_timeout = None;
        let mut lease_renew = None;
        let mut recheck = None;
        let mut head_poll = None;
        for pair in query.into_iter().flat_map(|q| q.split('&')).filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("size", v)) if !v.is_empty() => size = Some(v.to_string()),
                Some(("chunk", v)) if !v.is_empty() => chunk = Some(v.to_string()),
                Some(("retry_timeout", v)) => match v.parse::<u64>() {
                    Ok(secs @ 1..=3600) => retry_timeout = Some(Duration::from_secs(secs)),
                    _ => return Err(bad("retry_timeout is whole seconds, 1 to 3600")),
                },
                Some(("recheck", v)) => match v.parse::<u64>() {
                    Ok(secs @ 0..=3600) => recheck = Some(Duration::from_secs(secs)),
                    _ => return Err(bad("recheck is whole seconds, 0 (never) to 3600")),
                },
                Some(("head_poll_ms", v)) => match v.parse::<u64>() {
                    Ok(ms @ 0..=3_600_000) => head_poll = Some(Duration::from_millis(ms)),
                    _ => return Err(bad("head_poll_ms is whole milliseconds, 0 (never) to 3600000")),
                },
                Some(("lease_renew", v)) => match v.parse::<u64>() {
                    Ok(secs @ 1..=60) => lease_renew = Some(Duration::from_secs(secs)),
                    _ => return Err(bad("lease_renew is whole seconds, 1 to 60")),
                },
                _ => {
                    return Err(bad(
                        "the only query keys are size=SIZE, chunk=SIZE, retry_timeout=SECS, lease_renew=SECS, head_poll_ms=MS and recheck=SECS",
                    ))
                }
            }
        }
        if (chunk.is_some() || lease_renew.is_some() || head_poll.is_some()) && !key.ends_with('/') {
            return Err(bad(
                "chunk=, lease_renew= and head_poll_ms= are for a chunked disk (a prefix ending in /), not one object",
            ));
        }
        if recheck.is_some() && key.ends_with('/') {
            return Err(bad("recheck= is for one object, not a chunked disk"));
        }
        Ok(S3Location {
            bucket: bucket.to_string(),
            key: key.to_string(),
            size,
            chunk,
            retry_timeout,
            lease_renew,
            recheck,
            head_poll,
        })
    }

    /// True for a chunked disk's prefix (`.../`), false for one object.
    pub fn is_prefix(&self) -> bool {
        self.key.ends_with('/')
    }
}

impl std::fmt::Display for S3Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "s3://{}/{}", self.bucket, self.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_and_prefixes_parse() {
        let o = S3Location::parse("s3://games/library/disk.img").unwrap();
        assert_eq!((o.bucket.as_str(), o.key.as_str(), o.size.clone()), ("games", "library/disk.img", None));
        assert!(!o.is_prefix());
        let p = S3Location::parse("s3://vms/disk1/?size=10G").unwrap();
        assert_eq!((p.key.as_str(), p.size.as_deref()), ("disk1/", Some("10G")));
        assert!(p.is_prefix());
        assert_eq!(p.to_string(), "s3://vms/disk1/");
        assert_eq!(p.retry_timeout, None);
        let r = S3Location::parse("s3://vms/disk1/?size=10G&retry_timeout=3").unwrap();
        assert_eq!((r.size.as_deref(), r.retry_timeout), (Some("10G"), Some(Duration::from_secs(3))));
        let c = S3Location::parse("s3://vms/disk1/?size=10G&chunk=256K").unwrap();
        assert_eq!((c.size.as_deref(), c.chunk.as_deref()), (Some("10G"), Some("256K")));
        assert_eq!((p.chunk.clone(), p.lease_renew), (None, None));
        let h = S3Location::parse("s3://vms/disk1/?head_poll_ms=250").unwrap();
        assert_eq!(h.head_poll, Some(Duration::from_millis(250)));
        let l = S3Location::parse("s3://vms/disk1/?lease_renew=2").unwrap();
        assert_eq!(l.lease_renew, Some(Duration::from_secs(2)));
        let o = S3Location::parse("s3://games/disk.img?retry_timeout=60").unwrap();
        assert_eq!((o.key.as_str(), o.retry_timeout), ("disk.img", Some(Duration::from_secs(60))));
    }

    #[test]
    fn bad_uris_say_what_is_wrong() {
        for (uri, why) in [
            ("nbd://x", "not an s3:// URI"),
            ("s3://bucket", "no key"),
            ("s3://bucket/", "no key"),
            ("s3://B_ad/key", "bucket name"),
            ("s3://ab/key", "bucket name"),
            ("s3://bucket/key?color=red", "only query key"),
            ("s3://bucket/key?size=", "only query key"),
            ("s3://bucket/key?chunk=", "only query key"),
            ("s3://bucket/key.img?chunk=1M", "are for a chunked disk"),
            ("s3://bucket/key.img?lease_renew=2", "are for a chunked disk"),
            ("s3://bucket/d/?lease_renew=0", "lease_renew is whole seconds"),
            ("s3://bucket/d/?lease_renew=61", "lease_renew is whole seconds"),
            ("s3://bucket/d/?recheck=5", "recheck= is for one object"),
            ("s3://bucket/k?head_poll_ms=5", "are for a chunked disk"),
            ("s3://bucket/d/?head_poll_ms=1s", "head_poll_ms is whole milliseconds"),
            ("s3://bucket/k?recheck=x", "recheck is whole seconds"),
            ("s3://bucket/key?retry_timeout=0", "retry_timeout"),
            ("s3://bucket/key?retry_timeout=2s", "retry_timeout"),
        ] {
            let e = S3Location::parse(uri).unwrap_err().to_string();
            assert!(e.contains(why) && e.contains(uri), "{uri}: {e}");
        }
    }
}
