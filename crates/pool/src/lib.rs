//! A queue of jobs for a pool of worker threads. Idle workers sleep on a
//! condition variable: no spinning, which on a small machine would steal the
//! very CPU the busy threads need.

use std::collections::VecDeque;
use std::sync::Arc;

use parking_lot::{Condvar, Mutex};

pub type Job = Box<dyn FnOnce() + Send>;

struct Inner {
    queue: Mutex<VecDeque<Job>>,
    ready: Condvar,
}

/// The sending side of a pool whose threads live as long as the process.
#[derive(Clone)]
pub struct JobQueue {
    inner: Arc<Inner>,
}

impl JobQueue {
    /// Starts `workers` threads named `name-N`.
    pub fn start(name: &str, workers: usize) -> JobQueue {
        let inner = Arc::new(Inner { queue: Mutex::new(VecDeque::new()), ready: Condvar::new() });
        for i in 0..workers.max(1) {
            let inner = Arc::clone(&inner);
            std::thread::Builder::new()
                .name(format!("{name}-{i}"))
                .spawn(move || loop {
                    let job = {
                        let mut q = inner.queue.lock();
                        loop {
                            if let Some(j) = q.pop_front() {
                                break j;
                            }
                            inner.ready.wait(&mut q);
                        }
                    };
                    // A job that panics must not take its worker with it:
                    // the pool would shrink for good.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                })
                .expect("spawn worker thread");
        }
        JobQueue { inner }
    }

    pub fn push(&self, job: Job) {
        self.inner.queue.lock().push_back(job);
        self.inner.ready.notify_one();
    }

    /// Pushes unless `limit` jobs are already waiting; returns the job back
    /// when the queue is full.
    pub fn try_push(&self, job: Job, limit: usize) -> Result<(), Job> {
        let mut q = self.inner.queue.lock();
        if q.len() >= limit {
            return Err(job);
        }
        q.push_back(job);
        drop(q);
        self.inner.ready.notify_one();
        Ok(())
    }
}
