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

/// Atomics for the flags that threads hand each other without a lock
/// (a sleeping thread's "wake me" flag): shuttle's are points where
/// another thread may run, so it explores the orders around them. Plain
/// counters stay std's.
#[cfg(not(feature = "shuttle"))]
pub mod atomic {
    pub use std::sync::atomic::*;
}

#[cfg(feature = "shuttle")]
pub mod atomic {
    pub use shuttle::sync::atomic::*;
}
