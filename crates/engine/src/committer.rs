//! FLUSHes answered without a thread waiting for each one.
//!
//! A FLUSH handed to a worker thread costs two wake-ups of its own: the
//! worker's, and its wake-up again when the commit that covers it is done.
//! With a FLUSH after every write that is most of the CPU a small machine
//! spends. Here the connection's reader queues a completion instead; one
//! committer thread takes everything queued, runs one commit (which
//! collects every change acknowledged before those FLUSHes arrived), and
//! calls the completions, which send the replies. A burst of FLUSHes costs
//! one wake-up.

use std::sync::{Arc, Weak};

use blockdev::DevResult;
use parking_lot::{Condvar, Mutex};
use tracing::warn;

use crate::writeback::WriteBack;

/// Called once the commit covering a FLUSH is done, from the committer.
pub type CommitDone = Box<dyn FnOnce(&DevResult<()>) + Send>;

/// Runs the closure it is given, which calls one commit's completions; the
/// protocol side can then send their replies together
/// (`nbd::answer_together`).
pub type AnswerTogether = fn(&mut dyn FnMut());

#[derive(Default)]
struct Queue {
    waiting: Vec<CommitDone>,
    started: bool,
    stop: bool,
    answer_together: Option<AnswerTogether>,
}

#[derive(Default)]
pub(crate) struct Committer {
    queue: Arc<(Mutex<Queue>, Condvar)>,
}

impl Committer {
    /// Queues `done` behind the next commit, starting the committer thread
    /// on first use. Gives `done` back if no thread can be started.
    pub(crate) fn submit(&self, wb: &Arc<WriteBack>, done: CommitDone) -> Result<(), CommitDone> {
        let (lock, cv) = &*self.queue;
        let mut q = lock.lock();
        if q.stop {
            return Err(done);
        }
        if !q.started {
            let queue = Arc::clone(&self.queue);
            let wb = Arc::downgrade(wb);
            let spawned =
                std::thread::Builder::new().name("zil-commit".into()).spawn(move || run(&queue, &wb));
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

    pub(crate) fn answer_together_with(&self, f: AnswerTogether) {
        self.queue.0.lock().answer_together = Some(f);
    }

    /// Lets the thread end once nothing is queued; later FLUSHes are given
    /// back to their callers.
    pub(crate) fn stop(&self) {
        let (lock, cv) = &*self.queue;
        lock.lock().stop = true;
        cv.notify_all();
    }
}

fn run(queue: &(Mutex<Queue>, Condvar), wb: &Weak<WriteBack>) {
    let (lock, cv) = queue;
    loop {
        let (mut batch, together) = {
            let mut q = lock.lock();
            while q.waiting.is_empty() {
                if q.stop {
                    return;
                }
                cv.wait(&mut q);
            }
            (std::mem::take(&mut q.waiting), q.answer_together)
        };
        let res = match wb.upgrade() {
            Some(wb) => wb.commit_uncounted(),
            None => Err(blockdev::DevError::Io {
                op: "flush",
                dev: "write-back".into(),
                offset: 0,
                len: 0,
                source: std::io::Error::other("the write-back is gone"),
            }),
        };
        let mut answer = || {
            for done in batch.drain(..) {
                done(&res);
            }
        };
        match together {
            Some(together) => together(&mut answer),
            None => answer(),
        }
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
    use crate::WriteTunables;
    use std::time::Duration;

    #[test]
    fn queued_flushes_are_answered_and_after_stop_given_back() {
        let wb = WriteBack::new(None, None, Arc::new(WriteTunables::default()));
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..10 {
            let tx = tx.clone();
            let done: CommitDone = Box::new(move |r| {
                let _ = tx.send(r.is_ok());
            });
            assert!(wb.commit_async(done).is_ok());
        }
        for _ in 0..10 {
            assert_eq!(rx.recv_timeout(Duration::from_secs(10)), Ok(true));
        }
        assert_eq!(wb.view().zil_commit_count, 10, "each FLUSH counted once");
        wb.shutdown().expect("shutdown");
        assert!(wb.commit_async(Box::new(|_| {})).is_err(), "given back after stop");
    }

    static HOOK_ENTERED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

    fn counting_hook(answer: &mut dyn FnMut()) {
        HOOK_ENTERED.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        answer();
    }

    #[test]
    fn completions_run_inside_the_answer_hook() {
        let wb = WriteBack::new(None, None, Arc::new(WriteTunables::default()));
        wb.answer_together_with(counting_hook);
        let (tx, rx) = std::sync::mpsc::channel();
        let done: CommitDone = Box::new(move |_| {
            let _ = tx.send(HOOK_ENTERED.load(std::sync::atomic::Ordering::SeqCst));
        });
        assert!(wb.commit_async(done).is_ok());
        let entered = rx.recv_timeout(Duration::from_secs(10)).expect("answered");
        assert!(entered >= 1, "the completion ran inside the hook");
        wb.shutdown().expect("shutdown");
    }
}
