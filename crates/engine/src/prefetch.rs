//! A small pool of threads that run prefetch reads, so a demand read never
//! waits for the prefetch it triggered. Bounded: when too many prefetches
//! are waiting, new ones are dropped (they are only hints).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use arcache_pool::JobQueue;

/// Prefetch reads under way at once, at most.
pub(crate) const PREFETCH_THREADS: usize = 8;

pub struct Prefetcher {
    queue: JobQueue,
    limit: usize,
}

impl Prefetcher {
    pub fn new(threads: usize, queue: usize) -> Prefetcher {
        Prefetcher { queue: JobQueue::start("prefetch", threads), limit: queue }
    }

    /// Queues `job`; false if the queue is full and the hint was dropped.
    pub fn submit(&self, job: impl FnOnce() + Send + 'static, io_active: &Arc<AtomicU64>) -> bool {
        let active = Arc::clone(io_active);
        active.fetch_add(1, Relaxed);
        let wrapped = Box::new(move || {
            job();
            active.fetch_sub(1, Relaxed);
        });
        match self.queue.try_push(wrapped, self.limit) {
            Ok(()) => true,
            Err(_) => {
                io_active.fetch_sub(1, Relaxed);
                false
            }
        }
    }
}
