//! The writer's lease: taken with a create-only PUT (or over a released
//! one, conditional on its ETag), renewed conditionally, released at a
//! clean stop. A held lease is never taken over automatically.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use object_store::aws::AmazonS3;
use object_store::path::Path;
use object_store::{Attributes, ObjectStoreExt};
use parking_lot::Mutex;
use tracing::warn;

use crate::chunked::{block, key, now_ms};
use crate::format::Lease;
use crate::location::S3Location;
use crate::object::retry_budget;
use crate::retry::with_retries;

const RENEW_PERIOD: Duration = Duration::from_secs(10);

/// Renewal periods without a renewal after which the writer stops writing
/// to the bucket (docs/s3-backing.md, "Self-fence": half the six periods
/// `break-lease` waits before it takes a lease for dead), until a renewal
/// succeeds again.
const SELF_FENCE_PERIODS: u32 = 3;

pub struct LeaseKeeper {
    store: Arc<AmazonS3>,
    path: Path,
    location: S3Location,
    /// The lease as we last wrote it, and the ETag that write got.
    mine: Arc<Mutex<(Lease, Option<String>)>>,
    /// When a write of the lease last succeeded (this host's monotonic
    /// clock: the self-fence must not trust wall clocks).
    written_at: Arc<Mutex<Instant>>,
    period: Duration,
    stop: Arc<AtomicBool>,
    renewer: Option<JoinHandle<()>>,
    /// Released or abandoned: nothing left for the drop to do.
    settled: bool,
}

/// Writes `lease`: create-only with no ETag, else if the lease there
/// still has `etag`.
fn put(
    store: &AmazonS3,
    path: &Path,
    lease: &Lease,
    etag: Option<&str>,
) -> object_store::Result<Option<String>> {
    crate::cond::put_conditional(store, path, lease.encode().into(), &Attributes::new(), etag)
        .map(|r| r.e_tag)
}

/// A conditional PUT of our own lease (renewal or release), sent again on
/// transient errors; a 412 is checked against the lease there now, which
/// is still ours if a PUT of ours landed and only its answer was lost
/// (docs/s3-backing.md, section 7). `Ok(None)`: someone else's now.
fn put_ours(
    store: &AmazonS3,
    path: &Path,
    location: &S3Location,
    lease: &Lease,
    etag: Option<String>,
) -> object_store::Result<Option<(Lease, Option<String>)>> {
    let budget = retry_budget(location);
    match with_retries(budget, path, || put(store, path, lease, etag.as_deref())) {
        Ok(e) => Ok(Some((lease.clone(), e))),
        Err(object_store::Error::Precondition { .. }) => {
            let (bytes, now) = with_retries(budget, path, || {
                block(async {
                    let got = store.get(path).await?;
                    let etag = got.meta.e_tag.clone();
                    Ok((got.bytes().await?, etag))
                })
            })?;
            match Lease::decode(&bytes) {
                Ok(there) if there.token == lease.token => {
                    warn!("{location}: a lease write of ours landed but its answer was lost; going on");
                    Ok(Some((there, now)))
                }
                _ => Ok(None),
            }
        }
        Err(e) => Err(e),
    }
}

impl LeaseKeeper {
    pub fn acquire(
        store: Arc<AmazonS3>,
        location: &S3Location,
        disk_uuid: [u8; 16],
        fenced: Arc<AtomicBool>,
    ) -> Result<LeaseKeeper, String> {
        let path = key(location, "arcache-lease");
        let period = location.lease_renew.unwrap_or(RENEW_PERIOD);
        let now = now_ms();
        let lease = Lease {
            held: true,
            disk_uuid,
            token: rand::random(),
            pid: std::process::id(),
            renew_period_ms: period.as_millis() as u32,
            proc_start: now / 1000,
            acquired_ms: now,
            renewed_ms: now,
            renewals: 0,
            generation: 0,
            host: blockdev::owner::hostname(),
        };
        let etag = match put(&store, &path, &lease, None) {
            Ok(e) => e,
            Err(object_store::Error::AlreadyExists { .. })
            | Err(object_store::Error::Precondition { .. }) => {
                Self::take_existing(&store, &path, location, &lease)?
            }
            Err(e) => return Err(format!("{location}: taking the lease: {e}")),
        };
        let mine = Arc::new(Mutex::new((lease, etag)));
        let written_at = Arc::new(Mutex::new(Instant::now()));
        let stop = Arc::new(AtomicBool::new(false));
        let keep = Renewing {
            store: Arc::clone(&store),
            path: path.clone(),
            mine: Arc::clone(&mine),
            written_at: Arc::clone(&written_at),
            stop: Arc::clone(&stop),
            fenced,
            location: location.clone(),
            period,
        };
        // Made before its thread: if that cannot start, the keeper's drop
        // gives back the lease taken and never used.
        let mut keeper = LeaseKeeper {
            store,
            path,
            location: location.clone(),
            mine,
            written_at,
            period,
            stop,
            renewer: None,
            settled: false,
        };
        let renewer = std::thread::Builder::new()
            .name("s3-lease".into())
            .spawn(move || keep.run())
            .map_err(|e| format!("starting the lease thread: {e}"))?;
        keeper.renewer = Some(renewer);
        Ok(keeper)
    }

    /// The lease object exists: ours (a retried PUT), released (taken
    /// over conditionally), or held by another (refused, with who).
    fn take_existing(
        store: &AmazonS3,
        path: &Path,
        location: &S3Location,
        ours: &Lease,
    ) -> Result<Option<String>, String> {
        let got = block(store.get(path)).map_err(|e| format!("{location}: reading the lease: {e}"))?;
        let etag = got.meta.e_tag.clone();
        let modified = got.meta.last_modified;
        let bytes = block(got.bytes()).map_err(|e| format!("{location}: reading the lease: {e}"))?;
        let theirs = Lease::decode(&bytes).map_err(|e| format!("{location}arcache-lease: {e}"))?;
        if theirs.token == ours.token {
            return Ok(etag);
        }
        if theirs.held {
            return Err(format!(
                "{location} is held by host {} pid {} (last renewed at {modified}); a disk has one writer at a time; \
                 serve it read-only, or if that server is gone, `arcache s3 break-lease {location}`",
                theirs.host, theirs.pid
            ));
        }
        // No ETag to match: create-only, which a lease there refuses.
        match put(store, path, ours, etag.as_deref()) {
            Ok(e) => Ok(e),
            Err(object_store::Error::Precondition { .. }) => {
                Err(format!("{location}: another server took the lease just now"))
            }
            Err(e) => Err(format!("{location}: taking the lease: {e}")),
        }
    }

    /// Marks the lease released (at a clean stop), conditional on it being
    /// still ours.
    pub fn release(mut self) {
        self.stop_renewing();
        self.write_released();
        self.settled = true;
    }

    /// Stops renewing and leaves the lease held, as a crash would: what a
    /// writer could not write to the bucket is still in its log, and no
    /// other writer may start on the disk until `break-lease`.
    pub fn abandon(mut self) {
        self.stop_renewing();
        self.settled = true;
    }

    fn stop_renewing(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.renewer.take() {
            t.thread().unpark();
            let _ = t.join();
        }
    }

    fn write_released(&self) {
        let (mut lease, etag) = self.mine.lock().clone();
        lease.held = false;
        let mut put = put_ours(&self.store, &self.path, &self.location, &lease, etag);
        // A renewal of ours had landed unseen: release over it.
        if let Ok(Some((there, etag))) = &put {
            if there.held {
                put = put_ours(&self.store, &self.path, &self.location, &lease, etag.clone());
            }
        }
        match put {
            Ok(Some(_)) => {}
            Ok(None) => warn!("{}: releasing the lease: someone else holds it now", self.location),
            Err(e) => warn!("{}: releasing the lease: {e}", self.location),
        }
    }
}

/// A keeper dropped while its disk is being opened gives the lease back:
/// nothing was written under it. An open disk decides for itself
/// (`S3ChunkDev`'s drop abandons it).
impl Drop for LeaseKeeper {
    fn drop(&mut self) {
        if !self.settled {
            self.stop_renewing();
            self.write_released();
        }
    }
}

/// What the lease thread holds.
struct Renewing {
    store: Arc<AmazonS3>,
    path: Path,
    mine: Arc<Mutex<(Lease, Option<String>)>>,
    written_at: Arc<Mutex<Instant>>,
    stop: Arc<AtomicBool>,
    fenced: Arc<AtomicBool>,
    location: S3Location,
    period: Duration,
}

impl Renewing {
    fn run(&self) {
        let location = &self.location;
        let mut waiting = false;
        while !self.stop.load(Ordering::Acquire) {
            std::thread::park_timeout(self.period);
            if self.stop.load(Ordering::Acquire) {
                return;
            }
            let (mut lease, etag) = self.mine.lock().clone();
            lease.renewed_ms = now_ms();
            lease.renewals += 1;
            match put_ours(&self.store, &self.path, location, &lease, etag) {
                Ok(Some(now)) => {
                    *self.mine.lock() = now;
                    *self.written_at.lock() = Instant::now();
                    if std::mem::take(&mut waiting) {
                        warn!("{location}: the lease is renewed again; writes to the bucket go on");
                    }
                }
                Ok(None) => {
                    warn!(
                        "{location}: the lease was broken by someone else; no more writes go to the bucket"
                    );
                    self.fenced.store(true, Ordering::Release);
                    return;
                }
                // Retried already inside the client; try again next period.
                Err(e) => {
                    let since = self.written_at.lock().elapsed();
                    warn!(
                        "{location}: renewing the lease: {e} ({} s since the last renewal)",
                        since.as_secs()
                    );
                    if since > self.period * SELF_FENCE_PERIODS && !waiting {
                        waiting = true;
                        warn!(
                            "{location}: no renewal for {} s: writes to the bucket wait (their data stays dirty) until one succeeds",
                            since.as_secs()
                        );
                    }
                }
            }
        }
    }
}

impl LeaseKeeper {
    /// The token this writer's lease carries (its head objects carry it too).
    pub fn token(&self) -> [u8; 16] {
        self.mine.lock().0.token
    }

    /// How long since the lease was last written, once that is past the
    /// self-fence bound: the writer must not write to the bucket then, as
    /// `break-lease` may soon take the lease for dead.
    pub fn unrenewed_for(&self) -> Option<Duration> {
        let since = self.written_at.lock().elapsed();
        (since > self.period * SELF_FENCE_PERIODS).then_some(since)
    }
}
