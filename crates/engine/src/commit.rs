//! Group commit: callers that need "everything before me is durable" share
//! the runs of a commit step instead of each doing it.
//!
//! Runs are numbered in the order they start. A caller needs a run that
//! started after it arrived (that run collected its changes) and every run
//! before that one finished too (they collected changes acknowledged before
//! it arrived). Up to `max` runs (the caller's choice; 1 is strictly one at
//! a time) may be in flight, counted from the oldest unfinished one, so a
//! slow run holds back all but `max - 1` runs after it. With more than one,
//! the next batch is on its way to the device while the previous one is
//! still there; with one, a FLUSH waits on average for half a device write
//! it is not part of and then for its own.

use arcache_sync::{Condvar, Mutex};
use std::collections::BTreeSet;

/// Failed run numbers kept; older ones are summarised by `failed_floor`.
const FAILED_KEPT: usize = 256;

#[derive(Default)]
struct Runs {
    started: u64,
    running: BTreeSet<u64>,
    failed: Vec<u64>,
    /// Every failed run not in `failed` is at or below this.
    failed_floor: u64,
}

impl Runs {
    /// Every run up to this number has finished.
    fn done_through(&self) -> u64 {
        self.running.first().map_or(self.started, |&r| r - 1)
    }

    /// True if a run in `from..=to` failed (or may have: see `failed_floor`).
    fn failed_within(&self, from: u64, to: u64) -> bool {
        (self.failed_floor >= from && self.failed_floor > 0)
            || self.failed.iter().any(|&f| f >= from && f <= to)
    }

    fn note_failed(&mut self, n: u64) {
        self.failed.push(n);
        if self.failed.len() > FAILED_KEPT {
            let oldest = self.failed.remove(0);
            self.failed_floor = self.failed_floor.max(oldest);
        }
    }
}

pub(crate) struct CommitStep {
    runs: Mutex<Runs>,
    cv: Condvar,
}

impl CommitStep {
    pub(crate) fn new() -> CommitStep {
        CommitStep { runs: Mutex::new(Runs::default()), cv: Condvar::new() }
    }

    /// Runs are numbered from 1 without gaps, and `work` is told its run's
    /// number, so work that must happen in run order (placing log chunks)
    /// can take turns.
    ///
    /// Waits until a run that started after this call, and every run
    /// before it, has finished, running one here when the step has room and
    /// none has started since this call arrived; true if none of the runs
    /// that could have held this caller's changes failed.
    ///
    /// A failed run hands its changes back to be collected again; a run
    /// that was in flight when it failed may have missed them. So every
    /// failed run from the oldest one in flight at arrival up to the
    /// caller's own counts against the caller (older ones had handed back
    /// before the caller's run collected).
    pub(crate) fn run(&self, max: usize, work: &dyn Fn(u64) -> bool) -> bool {
        let mut r = self.runs.lock();
        let ticket = r.started + 1;
        let oldest = r.running.first().copied().unwrap_or(ticket);
        loop {
            if r.done_through() >= ticket {
                return !r.failed_within(oldest, ticket);
            }
            if r.started < ticket && r.started - r.done_through() < max.max(1) as u64 {
                r.started += 1;
                let number = r.started;
                r.running.insert(number);
                drop(r);
                let ok = work(number);
                r = self.runs.lock();
                r.running.remove(&number);
                if !ok {
                    r.note_failed(number);
                }
                self.cv.notify_all();
                continue;
            }
            self.cv.wait(&mut r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering::SeqCst};
    use std::sync::Arc;

    #[test]
    fn a_lone_caller_runs_once_and_succeeds() {
        let step = CommitStep::new();
        let n = AtomicU64::new(0);
        assert!(step.run(2, &|_| {
            n.fetch_add(1, SeqCst);
            true
        }));
        assert_eq!(n.load(SeqCst), 1);
    }

    #[test]
    fn a_failed_run_fails_its_caller_but_not_a_later_one() {
        let step = CommitStep::new();
        assert!(!step.run(2, &|_| false));
        assert!(step.run(2, &|_| true));
    }

    #[test]
    fn callers_return_only_after_every_earlier_run_finished() {
        // Each run records the highest run number it saw finished before it
        // started; a caller's return must come after its run and all before.
        let step = Arc::new(CommitStep::new());
        let finished = Arc::new(AtomicU64::new(0));
        let started = Arc::new(AtomicU64::new(0));
        let mut threads = Vec::new();
        for _ in 0..4 {
            let (step, finished, started) = (Arc::clone(&step), Arc::clone(&finished), Arc::clone(&started));
            threads.push(std::thread::spawn(move || {
                for _ in 0..200 {
                    let arrived_after = started.load(SeqCst);
                    assert!(step.run(2, &|_| {
                        started.fetch_add(1, SeqCst);
                        std::thread::yield_now();
                        finished.fetch_add(1, SeqCst);
                        true
                    }));
                    // A run that started after arrival has finished.
                    assert!(finished.load(SeqCst) > arrived_after);
                }
            }));
        }
        for t in threads {
            t.join().expect("caller thread");
        }
    }

    #[test]
    fn a_run_in_flight_at_arrival_that_fails_counts_against_the_caller() {
        let step = Arc::new(CommitStep::new());
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let (in_tx, in_rx) = std::sync::mpsc::channel::<()>();
        let go_rx = Mutex::new(go_rx);
        let slow = {
            let step = Arc::clone(&step);
            std::thread::spawn(move || {
                step.run(2, &|_| {
                    in_tx.send(()).ok();
                    go_rx.lock().recv().ok();
                    false
                })
            })
        };
        in_rx.recv().expect("first run started");
        let caller = {
            let step = Arc::clone(&step);
            std::thread::spawn(move || step.run(2, &|_| true))
        };
        std::thread::sleep(std::time::Duration::from_millis(50));
        go_tx.send(()).expect("release the first run");
        assert!(!slow.join().expect("slow caller"));
        assert!(
            !caller.join().expect("second caller"),
            "its run may have missed what the failed one handed back"
        );
    }
}
