//! The locks, condition variables, threads and handoff atomics the cache, write-back and L2
//! code take. Normally parking_lot's locks and std's threads; with the
//! `shuttle` feature, shuttle's behind the same API, so a shuttle test
//! explores the thread interleavings of the real code rather than of a
//! copy of it. Only a shuttle test may run code built with the feature.

#[cfg(not(feature = "shuttle"))]
pub use parking_lot::{
    Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard, WaitTimeoutResult,
};
/// Thread-locals too: shuttle runs its threads on one OS thread, where a
/// std thread-local would be shared by all of them.
#[cfg(not(feature = "shuttle"))]
pub use std::thread_local;

/// Threads (spawn, scoped threads, sleep): a thread shuttle did not start
/// could not take its locks.
#[cfg(not(feature = "shuttle"))]
pub mod thread {
    pub use std::thread::*;
}

#[cfg(feature = "shuttle")]
mod checked;
#[cfg(feature = "shuttle")]
pub use checked::{Condvar, Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard, WaitTimeoutResult};
#[cfg(feature = "shuttle")]
pub use shuttle::thread_local;

#[cfg(feature = "shuttle")]
pub mod thread {
    pub use shuttle::thread::*;
}

/// Atomics for the flags and counts that threads hand each other without a
/// lock (a sleeping thread's "wake me" flag, a page's "logged", a stripe's
/// write count that a ring read compares): shuttle's are points where
/// another thread may run, so it explores the orders around them. Plain
/// statistics counters and tunables (a value an operator sets and the code
/// reads afresh, where no order between threads matters) stay std's: as
/// shuttle's they would only add scheduling points that make the races
/// the tests look for rarer. So does an atomic touched only by threads
/// shuttle does not run (the L2 rebuild's, on `std::thread::scope`).
#[cfg(not(feature = "shuttle"))]
pub mod atomic {
    pub use std::sync::atomic::*;
}

#[cfg(feature = "shuttle")]
pub mod atomic {
    pub use shuttle::sync::atomic::*;
}
