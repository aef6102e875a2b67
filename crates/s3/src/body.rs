//! A ranged GET whose body is written straight into the caller's buffer as
//! it arrives, by a task on the S3 runtime.
//!
//! Gathering the body first (`GetResult::bytes`) cost a fresh allocation
//! of the whole body, whose pages fault in one by one, and a second copy:
//! for a stream's large reads that was the read path's largest cost (perf:
//! page faults under memmove, a quarter of the server's time). Polling the
//! body from the engine thread that waits for it (`block_on`) cost a
//! wake-up of that thread for every frame the connection task hands over:
//! about one context switch per 16 KiB, 110,000 for a 2 GiB object (perf
//! stat on bench/s3.sh's cold sequential pass); run on the runtime, the
//! frames go from the connection task to the reader on the same IO thread
//! and the engine thread is woken once, at the end.

use std::mem::MaybeUninit;
use std::sync::Arc;

use futures::StreamExt;
use object_store::aws::AmazonS3;
use object_store::path::Path;
use object_store::{GetOptions, GetResult, ObjectStore};

use crate::runtime::runtime;

/// GETs `path` with `opts` and copies its body into `out` from its start;
/// returns the body's length, which may differ from `out`'s (bytes past
/// `out` are counted, not kept), so the caller can refuse a short or long
/// answer. Blocks until the GET is over: call from outside the runtime.
pub(crate) fn get_into(
    store: &Arc<AmazonS3>,
    path: &Path,
    opts: GetOptions,
    out: &mut [u8],
) -> object_store::Result<usize> {
    // SAFETY: the body is only ever written into `out` (initialised
    // bytes over initialised bytes), never read from it or de-initialised.
    let view = unsafe { &mut *(out as *mut [u8] as *mut [MaybeUninit<u8>]) };
    get_scattered(store, path, opts, &mut [view])
}

/// [`get_into`] with the body spread over `outs`, back to back (a
/// buffer per record: no copy out of one buffer afterwards). Bytes of
/// `outs` past the body's end are left as they were: the caller refuses
/// a body shorter than asked.
pub(crate) fn get_scattered(
    store: &Arc<AmazonS3>,
    path: &Path,
    opts: GetOptions,
    outs: &mut [&mut [MaybeUninit<u8>]],
) -> object_store::Result<usize> {
    let rt = runtime().map_err(|e| object_store::Error::Generic { store: "S3", source: Box::new(e) })?;
    if tokio::runtime::Handle::try_current().is_ok() {
        // block_on would panic after the task had been given `outs`.
        return Err(object_store::Error::NotSupported {
            source: "a blocking GET from inside a tokio runtime".into(),
        });
    }
    let targets: Vec<Target> =
        outs.iter_mut().map(|o| Target { at: o.as_mut_ptr() as *mut u8, len: o.len() }).collect();
    let (store, path) = (Arc::clone(store), path.clone());
    let task = rt.spawn(async move {
        let targets = targets;
        let got = store.get_opts(&path, opts).await?;
        // SAFETY: each target is one of `outs`, which the caller cannot
        // touch or free until this function returns, and it returns only
        // once this task has ended (block_on below waits for its end
        // whatever its outcome: result, error or panic; were the wait to
        // unwind, the process aborts). The runtime is a static one that is
        // never shut down, so the task is never dropped unfinished while
        // `outs` are gone.
        let mut outs: Vec<&mut [MaybeUninit<u8>]> = targets
            .iter()
            .map(|t| unsafe { std::slice::from_raw_parts_mut(t.at as *mut MaybeUninit<u8>, t.len) })
            .collect();
        read_into(got, &mut outs).await
    });
    match wait_or_abort(rt, task) {
        Ok(result) => result,
        Err(source) => Err(object_store::Error::JoinError { source }),
    }
}

/// Waits for `task` to end, whatever its outcome. Should the wait unwind
/// instead of returning (tokio failing to park a thread being torn down),
/// a task writing into a caller's buffer would live on and write into it
/// after its owner freed it: the process ends rather.
fn wait_or_abort<T>(
    rt: &tokio::runtime::Runtime,
    task: tokio::task::JoinHandle<T>,
) -> Result<T, tokio::task::JoinError> {
    let guard = AbortOnUnwind;
    let joined = rt.block_on(task);
    std::mem::forget(guard);
    joined
}

/// Aborts the process if dropped while unwinding.
struct AbortOnUnwind;

impl Drop for AbortOnUnwind {
    fn drop(&mut self) {
        if std::thread::panicking() {
            std::process::abort();
        }
    }
}

/// The caller's buffer, handed to the task that fills it.
struct Target {
    at: *mut u8,
    len: usize,
}

// SAFETY: the buffer is written by one task at a time while its owner
// waits (see `get_into`).
unsafe impl Send for Target {}

/// Copies the body into `outs`, back to back, as its frames arrive;
/// returns its length.
async fn read_into(got: GetResult, outs: &mut [&mut [MaybeUninit<u8>]]) -> object_store::Result<usize> {
    let mut body = got.into_stream();
    let mut spread = Spread { outs, i: 0, at: 0, total: 0 };
    while let Some(part) = body.next().await {
        spread.put(&part?);
    }
    Ok(spread.total)
}

/// Where the next byte of a body goes: buffer `i` of `outs`, at `at`.
struct Spread<'a, 'b> {
    outs: &'a mut [&'b mut [MaybeUninit<u8>]],
    i: usize,
    at: usize,
    /// Bytes seen, those past the last buffer included.
    total: usize,
}

impl Spread<'_, '_> {
    fn put(&mut self, frame: &[u8]) {
        self.total += frame.len();
        let mut rest = frame;
        while !rest.is_empty() && self.i < self.outs.len() {
            let out = &mut self.outs[self.i];
            let n = rest.len().min(out.len() - self.at);
            // SAFETY: `n` bytes fit both `rest` and this buffer past `at`;
            // a frame of the body and a caller's buffer never overlap.
            unsafe {
                std::ptr::copy_nonoverlapping(rest.as_ptr(), out[self.at..].as_mut_ptr() as *mut u8, n)
            };
            rest = &rest[n..];
            self.at += n;
            if self.at == out.len() {
                self.i += 1;
                self.at = 0;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::mem::MaybeUninit;

    /// Frames of any size land back to back across the buffers, empty
    /// buffers are passed over, and bytes past the last are counted only.
    #[test]
    fn a_body_is_spread_over_the_buffers_in_order() {
        let body: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
        let lens = [7usize, 0, 300, 1, 500];
        let mut bufs: Vec<Vec<MaybeUninit<u8>>> =
            lens.iter().map(|&l| vec![MaybeUninit::new(0xee); l]).collect();
        let mut outs: Vec<&mut [MaybeUninit<u8>]> = bufs.iter_mut().map(|b| b.as_mut_slice()).collect();
        let mut spread = super::Spread { outs: &mut outs, i: 0, at: 0, total: 0 };
        for frame in body.chunks(13) {
            spread.put(frame);
        }
        assert_eq!(spread.total, 1000);
        // SAFETY: every buffer was initialised when made.
        let got: Vec<u8> = bufs.iter().flatten().map(|x| unsafe { x.assume_init() }).collect();
        assert_eq!(got, body[..808]);
    }

    use std::os::unix::process::ExitStatusExt;

    const CHILD: &str = "ARCACHE_TEST_UNWIND_CHILD";

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_time()
            .build()
            .expect("a runtime")
    }

    /// The wait's one job, checked in a child process (the abort would end
    /// the test runner): a wait that unwinds (here `block_on` called from
    /// inside another runtime's task, which panics) ends the process, so the task can
    /// never write into a buffer its owner has freed.
    #[test]
    fn a_wait_that_unwinds_ends_the_process() {
        if std::env::var_os(CHILD).is_some() {
            let rt = runtime();
            let task = rt.spawn(async { tokio::time::sleep(std::time::Duration::from_secs(5)).await });
            let outer = tokio::runtime::Builder::new_current_thread().build().expect("a runtime");
            outer.block_on(async {
                eprintln!("the child waits from inside the runtime");
                let _ = super::wait_or_abort(&rt, task);
            });
            return;
        }
        let me = std::env::current_exe().expect("the test binary");
        let child = std::process::Command::new(me)
            .args(["--exact", "body::tests::a_wait_that_unwinds_ends_the_process", "--nocapture"])
            .env(CHILD, "1")
            .output()
            .expect("the child runs");
        let stderr = String::from_utf8_lossy(&child.stderr);
        assert!(
            stderr.contains("the child waits from inside the runtime"),
            "the child did not get there: {stderr}"
        );
        assert_eq!(child.status.signal(), Some(libc::SIGABRT), "{:?}: {stderr}", child.status);
    }

    #[test]
    fn a_wait_that_returns_gives_the_tasks_outcome() {
        let rt = runtime();
        assert_eq!(super::wait_or_abort(&rt, rt.spawn(async { 7 })).expect("joined"), 7);
        let failed = super::wait_or_abort(&rt, rt.spawn(async { panic!("a task's own panic") }));
        assert!(
            failed.expect_err("the task panicked").is_panic(),
            "a task's panic is its outcome, not the wait's"
        );
    }
}
