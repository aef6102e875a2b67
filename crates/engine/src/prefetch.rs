//! A small pool of threads that run prefetch reads, so a demand read never
//! waits for the prefetch it triggered. Bounded: when too many prefetches
//! are in flight, new ones are dropped (they are only hints).

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use crossbeam_channel::{bounded, Sender, TrySendError};

type Job = Box<dyn FnOnce() + Send>;

pub struct Prefetcher {
    tx: Sender<Job>,
}

impl Prefetcher {
    pub fn new(threads: usize, queue: usize) -> Prefetcher {
        let (tx, rx) = bounded::<Job>(queue);
        for i in 0..threads.max(1) {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("prefetch-{i}"))
                .spawn(move || {
                    for job in rx {
                        job();
                    }
                })
                .expect("spawn prefetch thread");
        }
        Prefetcher { tx }
    }

    /// Queues `job`; false if the queue is full and the hint was dropped.
    pub fn submit(&self, job: impl FnOnce() + Send + 'static, io_active: &Arc<AtomicU64>) -> bool {
        let active = Arc::clone(io_active);
        active.fetch_add(1, Relaxed);
        let wrapped: Job = Box::new(move || {
            job();
            active.fetch_sub(1, Relaxed);
        });
        match self.tx.try_send(wrapped) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) | Err(TrySendError::Disconnected(_)) => {
                io_active.fetch_sub(1, Relaxed);
                false
            }
        }
    }
}
