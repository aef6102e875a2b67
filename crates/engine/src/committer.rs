//! FLUSHes answered without a thread waiting for each one.
//!
//! A FLUSH handed to a worker thread costs two wake-ups of its own: the
//! worker's, and its wake-up again when the commit that covers it is done.
//! With a FLUSH after every write that is most of the CPU a small machine
//! spends. Here the connection's reader queues a completion instead; one
//! committer thread takes everything queued, runs one commit (which
//! collects every change acknowledged before those FLUSHes arrived), and
//! calls the completions with one completion batch, flushed after the
//! last, so their replies go out together. A burst of FLUSHes costs one
//! wake-up.

use std::sync::Arc;

use arcache_batch::Batch;
use arcache_sync::{Condvar, Mutex};
use blockdev::DevResult;
use tracing::warn;

/// Called once the commit covering a FLUSH is done, from the committer,
/// with the batch shared by that commit's completions.
pub type CommitDone = Box<dyn FnOnce(&DevResult<()>, &mut Batch) + Send>;

/// Runs one commit for the committer thread.
pub(crate) type CommitFn = Box<dyn Fn() -> DevResult<()> + Send>;

#[derive(Default)]
struct Queue {
    waiting: Vec<CommitDone>,
    started: bool,
    stop: bool,
}

#[derive(Default)]
pub(crate) struct Committer {
    queue: Arc<(Mutex<Queue>, Condvar)>,
}

impl Committer {
    /// Queues `done` behind the next commit, starting the committer thread
    /// on first use with the commit `start` gives. Gives `done` back if no
    /// thread can be started.
    pub(crate) fn submit(
        &self,
        start: impl FnOnce() -> CommitFn,
        done: CommitDone,
    ) -> Result<(), CommitDone> {
        let (lock, cv) = &*self.queue;
        let mut q = lock.lock();
        if q.stop {
            return Err(done);
        }
        if !q.started {
            let queue = Arc::clone(&self.queue);
            let commit = start();
            let spawned = arcache_sync::thread::Builder::new()
                .name("zil-commit".into())
                .spawn(move || run(&queue, &commit));
            if let Err(e) = spawned {
                warn!("cannot start the commit thread ({e}); FLUSHes wait on worker threads");
                return Err(done);
            }
            q.started = true;
        }
        q.waiting.push(done);
        cv.notify_one();
        Ok(())
    }

    /// Lets the thread end once nothing is queued; later FLUSHes are given
    /// back to their callers.
    pub(crate) fn stop(&self) {
        let (lock, cv) = &*self.queue;
        lock.lock().stop = true;
        cv.notify_all();
    }
}

fn run(queue: &(Mutex<Queue>, Condvar), commit: &CommitFn) {
    let (lock, cv) = queue;
    loop {
        let waiting = {
            let mut q = lock.lock();
            while q.waiting.is_empty() {
                if q.stop {
                    return;
                }
                cv.wait(&mut q);
            }
            std::mem::take(&mut q.waiting)
        };
        let res = commit();
        let mut out = Batch::new();
        for done in waiting {
            done(&res, &mut out);
        }
        out.flush();
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// Counts the flushes of the batch its completions leave replies in.
    #[derive(Default)]
    struct Replies {
        held: usize,
        flushed: Option<std::sync::mpsc::Sender<usize>>,
    }

    impl arcache_batch::Deferred for Replies {
        fn flush(&mut self) {
            if self.held > 0 {
                if let Some(tx) = &self.flushed {
                    let _ = tx.send(std::mem::take(&mut self.held));
                }
            }
        }
    }

    fn no_op() -> CommitFn {
        Box::new(|| Ok(()))
    }

    #[test]
    fn one_commits_completions_share_a_batch_flushed_after_the_last() {
        let committer = Committer::default();
        let (tx, rx) = std::sync::mpsc::channel();
        // Hold the commit thread in the first completion until all the
        // others are queued, so they wait for one commit together.
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let (in_tx, in_rx) = std::sync::mpsc::channel::<()>();
        let first: CommitDone = Box::new(move |_, _| {
            let _ = in_tx.send(());
            let _ = go_rx.recv_timeout(Duration::from_secs(10));
        });
        assert!(committer.submit(no_op, first).is_ok());
        in_rx.recv_timeout(Duration::from_secs(10)).expect("the first commit is done");
        for _ in 0..5 {
            let tx = tx.clone();
            let done: CommitDone = Box::new(move |_, out| {
                let replies = out.part::<Replies>();
                replies.held += 1;
                replies.flushed = Some(tx);
            });
            assert!(committer.submit(no_op, done).is_ok());
        }
        go_tx.send(()).expect("the commit thread waits");
        let held = rx.recv_timeout(Duration::from_secs(10)).expect("the batch was flushed");
        assert_eq!(held, 5, "the five FLUSHes queued behind one commit were flushed together");
        committer.stop();
        assert!(committer.submit(no_op, Box::new(|_, _| {})).is_err(), "given back after stop");
    }
}
