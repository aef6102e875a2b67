//! The locks the cache and L2 code take. Normally parking_lot's; with the
//! `shuttle` feature, shuttle's behind the same API, so a shuttle test
//! explores the thread interleavings of the real code rather than of a
//! copy of it. Only a shuttle test may run code built with the feature.

#[cfg(not(feature = "shuttle"))]
pub use parking_lot::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
/// Thread-locals too: shuttle runs its threads on one OS thread, where a
/// std thread-local would be shared by all of them.
#[cfg(not(feature = "shuttle"))]
pub use std::thread_local;

#[cfg(feature = "shuttle")]
mod checked;
#[cfg(feature = "shuttle")]
pub use checked::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};
#[cfg(feature = "shuttle")]
pub use shuttle::thread_local;
