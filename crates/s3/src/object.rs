//! One S3 object, read-only, pinned to the ETag it had when opened.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use blockdev::{BlockDev, DevError, DevResult};
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path;
use object_store::{BackoffConfig, GetOptions, GetRange, ObjectStore, ObjectStoreExt, RetryConfig};
use tracing::{debug, warn};

use crate::credentials::Credentials;
use crate::location::S3Location;
use crate::retry::{explain, with_retries, DEFAULT_RETRY_TIMEOUT};
use crate::runtime::runtime;

/// What a sequential stream reads of an object in one ranged GET: every
/// GET costs a round trip and the server's setup, so a stream's client
/// reads sent one GET each reached a quarter of one streaming GET's rate
/// (`rclone cat`, bench/results/s3.md).
pub const READ_UNIT: u64 = 8 << 20;

pub struct S3ObjectDev {
    store: Arc<AmazonS3>,
    location: S3Location,
    path: Path,
    size: u64,
    etag: String,
    /// Set once a read or the recheck found the object changed: every
    /// later read fails, so no mix of old and new bytes is ever put
    /// together, and the export serves no cached record of the old one.
    changed: Arc<AtomicBool>,
}

/// How long one request of `location` keeps being retried (5xx,
/// throttling, resets) before it fails that client request.
pub(crate) fn retry_budget(location: &S3Location) -> Duration {
    location.retry_timeout.unwrap_or(DEFAULT_RETRY_TIMEOUT)
}

pub(crate) fn client(location: &S3Location, creds: &Credentials) -> Result<AmazonS3, String> {
    let retry = RetryConfig {
        backoff: BackoffConfig {
            init_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_secs(5),
            base: 2.0,
        },
        max_retries: 10,
        retry_timeout: retry_budget(location),
    };
    let mut b = AmazonS3Builder::new()
        .with_bucket_name(&location.bucket)
        .with_region(&creds.region)
        .with_access_key_id(&creds.access_key_id)
        .with_secret_access_key(&creds.secret_access_key)
        .with_retry(retry);
    if let Some(t) = &creds.session_token {
        b = b.with_token(t);
    }
    if let Some(ep) = &creds.endpoint {
        // A custom endpoint (MinIO, Ceph RGW, moto) is addressed path-style.
        b = b
            .with_endpoint(ep)
            .with_allow_http(ep.starts_with("http://"))
            .with_virtual_hosted_style_request(false);
    }
    b.build().map_err(|e| format!("{location}: {e}"))
}

/// How often an object is asked whether it changed, when every read hits
/// the cache (docs/s3-backing.md, section 4; `recheck=SECS`).
const DEFAULT_RECHECK: Duration = Duration::from_secs(10);

/// Asks S3 every `every` whether the object still has its ETag, so a
/// change is found even while every read hits the cache; stops once the
/// device is gone or the change is found.
struct Recheck {
    store: Arc<AmazonS3>,
    path: Path,
    location: S3Location,
    etag: String,
    changed: Arc<AtomicBool>,
    every: Duration,
}

impl Recheck {
    fn run(&self) {
        let Ok(rt) = runtime() else { return };
        loop {
            std::thread::sleep(self.every);
            // The device holds the other reference; alone, it is gone.
            if Arc::strong_count(&self.changed) == 1 || self.changed.load(Ordering::Acquire) {
                return;
            }
            let now = match rt.block_on(self.store.head(&self.path)) {
                Ok(meta) => meta.e_tag,
                Err(object_store::Error::NotFound { .. }) => None,
                // Unreachable now: asked again next time.
                Err(_) => continue,
            };
            if now.as_deref().map(|e| e.trim_matches('"')) == Some(self.etag.trim_matches('"')) {
                continue;
            }
            self.changed.store(true, Ordering::Release);
            warn!(
                "{} changed underneath (ETag {} is now {}); its export now answers EIO, cached data included, until the server is restarted",
                self.location,
                self.etag,
                now.as_deref().unwrap_or("gone")
            );
            return;
        }
    }
}

fn remote(what: String) -> DevError {
    DevError::Remote(what, libc::EIO)
}

impl S3ObjectDev {
    /// Opens `location` (an object, not a prefix) and pins its ETag.
    /// Fails at once, with the server's reason, on a missing bucket or
    /// object, wrong credentials or no access.
    pub fn open(location: &S3Location, creds: &Credentials) -> Result<S3ObjectDev, String> {
        if location.is_prefix() || location.size.is_some() {
            return Err(format!("{location}: a prefix or size= names a chunked disk, not one object"));
        }
        let store = Arc::new(client(location, creds)?);
        let path = Path::from(location.key.as_str());
        let rt = runtime().map_err(|e| format!("starting the S3 runtime: {e}"))?;
        let meta = rt.block_on(store.head(&path)).map_err(|e| {
            // A HEAD answer has no body, so no S3 error code: a one-byte GET
            // asks again for the reason (NoSuchBucket or NoSuchKey,
            // InvalidAccessKeyId, SignatureDoesNotMatch, AccessDenied).
            let opts = GetOptions { range: Some(GetRange::Bounded(0..1)), ..Default::default() };
            let e = match rt.block_on(store.get_opts(&path, opts)) {
                Err(again) => again,
                Ok(_) => e,
            };
            let why = match crate::retry::s3_code(&e).as_deref() {
                Some("NoSuchKey") => {
                    format!("no object {} in bucket {} (NoSuchKey): {e}", location.key, location.bucket)
                }
                _ => explain(&e, &location.bucket, &creds.source),
            };
            format!("{location}: {why}")
        })?;
        let etag = meta
            .e_tag
            .ok_or_else(|| format!("{location}: the server gave no ETag, so a change could not be seen"))?;
        if meta.size == 0 {
            return Err(format!("{location} is empty (size 0)"));
        }
        let changed = Arc::new(AtomicBool::new(false));
        let every = location.recheck.unwrap_or(DEFAULT_RECHECK);
        if !every.is_zero() {
            let watch = Recheck {
                store: Arc::clone(&store),
                path: path.clone(),
                location: location.clone(),
                etag: etag.clone(),
                changed: Arc::clone(&changed),
                every,
            };
            std::thread::Builder::new()
                .name("s3-recheck".into())
                .spawn(move || watch.run())
                .map_err(|e| format!("{location}: starting the recheck thread: {e}"))?;
        }
        Ok(S3ObjectDev { store, location: location.clone(), path, size: meta.size, etag, changed })
    }

    pub fn etag(&self) -> &str {
        &self.etag
    }

    fn changed_text(&self) -> String {
        format!(
            "{} changed underneath (ETag was {}); restart the server to serve the new version",
            self.location, self.etag
        )
    }

    fn changed_error(&self) -> DevError {
        DevError::Changed(self.changed_text())
    }
}

impl BlockDev for S3ObjectDev {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> DevResult<()> {
        // SAFETY: the GET only writes bytes into `buf` (initialised over
        // initialised), never reads or de-initialises them.
        let view = unsafe { &mut *(buf as *mut [u8] as *mut [std::mem::MaybeUninit<u8>]) };
        self.read_scattered(&mut [view], offset)
    }

    /// Yes: a GET's body goes straight into the records' buffers. The
    /// engine hands it evicted records' buffers: buffers made new for each
    /// 8 MiB GET cost more than the copy this saves, the allocator faulting
    /// in pages it had just given back (bench/results/ab-seq-scatter.md).
    fn scatters_reads(&self) -> bool {
        true
    }

    /// One ranged GET whose body goes straight into `bufs`.
    fn read_scattered(&self, bufs: &mut [&mut [std::mem::MaybeUninit<u8>]], offset: u64) -> DevResult<()> {
        let len: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        if offset.checked_add(len).is_none_or(|end| end > self.size) {
            return Err(DevError::OutOfRange { offset, len, size: self.size });
        }
        if len == 0 {
            return Ok(());
        }
        if self.changed.load(Ordering::Acquire) {
            return Err(self.changed_error());
        }
        let opts = GetOptions {
            if_match: Some(self.etag.clone()),
            range: Some(GetRange::Bounded(offset..offset + len)),
            ..Default::default()
        };
        runtime().map_err(|e| remote(format!("S3 runtime: {e}")))?;
        // Each GET is billed and costs the store CPU: this shows how a
        // workload's reads became requests (RUST_LOG=arcache_s3=debug).
        debug!(offset, len, by = std::thread::current().name().unwrap_or("?"), "ranged GET");
        let what = format!("{}: read of {len} bytes at {offset}", self.location);
        let got = with_retries(retry_budget(&self.location), &what, || {
            crate::body::get_scattered(&self.store, &self.path, opts.clone(), bufs)
        });
        match got {
            Ok(n) if n as u64 == len => Ok(()),
            Ok(n) => Err(remote(format!(
                "{}: asked {len} bytes at {offset}, got {n} (object shorter than when opened?)",
                self.location
            ))),
            Err(object_store::Error::Precondition { .. }) | Err(object_store::Error::NotFound { .. }) => {
                if !self.changed.swap(true, Ordering::AcqRel) {
                    warn!(
                        "{} changed or vanished underneath; its export now fails every read",
                        self.location
                    );
                }
                Err(self.changed_error())
            }
            Err(e) => Err(remote(format!("{what}: {e}"))),
        }
    }

    fn write_at(&self, _buf: &[u8], _offset: u64) -> DevResult<()> {
        Err(DevError::ReadOnly)
    }

    fn flush(&self) -> DevResult<()> {
        Ok(())
    }

    fn describe(&self) -> String {
        self.location.to_string()
    }

    /// The version is part of what this store is: a persistent L2 filled
    /// from the old object is never taken for the new one.
    fn identity(&self) -> String {
        format!("{}@{}", self.location, self.etag)
    }

    fn is_read_only(&self) -> bool {
        true
    }

    fn changed(&self) -> Option<String> {
        self.changed.load(Ordering::Acquire).then(|| self.changed_text())
    }

    fn read_unit(&self) -> Option<u64> {
        Some(READ_UNIT)
    }
}
