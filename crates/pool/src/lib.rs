//! A queue of jobs for a pool of worker threads. Idle workers sleep on a
//! condition variable: no spinning, which on a small machine would steal the
//! very CPU the busy threads need.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

pub type Job = Box<dyn FnOnce() + Send>;

struct Queue {
    jobs: VecDeque<Job>,
    /// Every handle is gone: workers run what is queued, then end.
    closed: bool,
}

struct Inner {
    queue: Mutex<Queue>,
    ready: Condvar,
}

/// Closes the queue when the last [`JobQueue`] handle goes. Workers hold
/// `Inner` alone, so they never keep it open: a pool started for each
/// cache used to leave its threads asleep forever once the cache was
/// dropped (8 a cache; a property test of a few thousand caches ran out of
/// threads).
struct Owner {
    inner: Arc<Inner>,
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.inner.queue.lock().closed = true;
        self.inner.ready.notify_all();
    }
}

/// The sending side of a pool whose threads live as long as some handle
/// does, and end once the jobs queued by then have run.
#[derive(Clone)]
pub struct JobQueue {
    owner: Arc<Owner>,
}

impl JobQueue {
    /// Starts `workers` threads named `name-N`.
    ///
    /// Panics if no thread can be started; the handle is made first, so
    /// the workers started before a failed spawn end with it.
    pub fn start(name: &str, workers: usize) -> JobQueue {
        let inner = Arc::new(Inner {
            queue: Mutex::new(Queue { jobs: VecDeque::new(), closed: false }),
            ready: Condvar::new(),
        });
        let queue = JobQueue { owner: Arc::new(Owner { inner: Arc::clone(&inner) }) };
        for i in 0..workers.max(1) {
            let inner = Arc::clone(&inner);
            std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || work(&inner))
                .expect("spawn worker thread");
        }
        queue
    }

    pub fn push(&self, job: Job) {
        let inner = &self.owner.inner;
        inner.queue.lock().jobs.push_back(job);
        inner.ready.notify_one();
    }

    /// Pushes unless `limit` jobs are already waiting; returns the job back
    /// when the queue is full.
    pub fn try_push(&self, job: Job, limit: usize) -> Result<(), Job> {
        let inner = &self.owner.inner;
        let mut q = inner.queue.lock();
        if q.jobs.len() >= limit {
            return Err(job);
        }
        q.jobs.push_back(job);
        drop(q);
        inner.ready.notify_one();
        Ok(())
    }
}

/// A worker: runs jobs until the queue is closed and empty.
fn work(inner: &Inner) {
    loop {
        let job = {
            let mut q = inner.queue.lock();
            loop {
                if let Some(j) = q.jobs.pop_front() {
                    break j;
                }
                if q.closed {
                    return;
                }
                inner.ready.wait(&mut q);
            }
        };
        // A job that panics must not take its worker with it: the pool
        // would shrink for good.
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    /// Whether `done` holds within 10 s (asked every 5 ms).
    fn within_10s(mut done: impl FnMut() -> bool) -> bool {
        let until = Instant::now() + Duration::from_secs(10);
        while !done() {
            if Instant::now() > until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }

    /// Waits up to 10 s for every worker of the pool behind `inner` to end.
    fn workers_end(inner: std::sync::Weak<Inner>) -> bool {
        within_10s(|| inner.strong_count() == 0)
    }

    /// A job that waits for `release` (at most 10 s), holding its worker.
    fn blocker(q: &JobQueue) -> std::sync::mpsc::Sender<()> {
        let (release, wait) = std::sync::mpsc::channel::<()>();
        q.push(Box::new(move || {
            let _ = wait.recv_timeout(Duration::from_secs(10));
        }));
        release
    }

    /// Pushes a job that counts itself in `ran`.
    fn counted(q: &JobQueue, ran: &Arc<AtomicUsize>) {
        let ran = Arc::clone(ran);
        q.push(Box::new(move || {
            ran.fetch_add(1, Ordering::SeqCst);
        }));
    }

    /// Waits up to 10 s for `ran` to reach `n`.
    fn reaches(ran: &AtomicUsize, n: usize) -> bool {
        within_10s(|| ran.load(Ordering::SeqCst) >= n)
    }

    #[test]
    fn workers_end_once_every_handle_is_gone_and_queued_jobs_still_run() {
        let q = JobQueue::start("test-pool", 1);
        let inner = Arc::downgrade(&q.owner.inner);
        let ran = Arc::new(AtomicUsize::new(0));
        // While a handle is left, the pool serves it, after what was queued.
        let copy = q.clone();
        drop(q);
        counted(&copy, &ran);
        assert!(reaches(&ran, 1), "a pool with a handle left ran no job");
        // The one worker held busy, so these are queued when the last
        // handle goes: they still run, then the worker ends.
        let release = blocker(&copy);
        for _ in 0..20 {
            counted(&copy, &ran);
        }
        drop(copy);
        assert_eq!(ran.load(Ordering::SeqCst), 1, "the worker was held busy");
        // Fails only if the blocker was dropped unrun: the count says so.
        let _ = release.send(());
        assert!(workers_end(inner), "the workers did not end");
        assert_eq!(ran.load(Ordering::SeqCst), 21, "jobs queued before the last handle went ran");
    }

    #[test]
    fn a_job_may_drop_the_last_handle() {
        let q = JobQueue::start("test-last", 2);
        let inner = Arc::downgrade(&q.owner.inner);
        let (done, got) = std::sync::mpsc::channel();
        let last = q.clone();
        q.push(Box::new(move || {
            drop(last);
            done.send(()).unwrap();
        }));
        drop(q);
        got.recv_timeout(Duration::from_secs(10)).expect("the job ran");
        assert!(workers_end(inner), "the workers did not end");
    }

    #[test]
    fn a_panicking_job_leaves_its_worker_running() {
        let q = JobQueue::start("test-panic", 1);
        q.push(Box::new(|| panic!("a job's own panic")));
        let (done, got) = std::sync::mpsc::channel();
        q.push(Box::new(move || done.send(()).unwrap()));
        got.recv_timeout(Duration::from_secs(10)).expect("the one worker ran the next job");
    }
}
