//! The locks, condition variables and threads the cache, write-back and L2
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
