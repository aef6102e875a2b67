//! shuttle's locks with parking_lot's signatures: no poisoning (a panic in
//! a shuttle test fails the test anyway), `try_lock` as an `Option`, and
//! condition variables that wait on a `&mut` guard.

use std::ops::{Deref, DerefMut};
use std::sync::PoisonError;
use std::time::Duration;

use shuttle::rand::Rng;
use shuttle::sync as s;

pub type RwLockReadGuard<'a, T> = s::RwLockReadGuard<'a, T>;
pub type RwLockWriteGuard<'a, T> = s::RwLockWriteGuard<'a, T>;

/// shuttle's guard, held in an `Option` only so that [`Condvar::wait`]
/// can hand it to shuttle by value and put it back, as parking_lot's
/// `&mut` signature requires.
pub struct MutexGuard<'a, T: ?Sized>(Option<s::MutexGuard<'a, T>>);

const TAKEN: &str = "a guard is empty only inside Condvar::wait";

impl<T: ?Sized> Deref for MutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.0.as_ref().expect(TAKEN)
    }
}

impl<T: ?Sized> DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.0.as_mut().expect(TAKEN)
    }
}

pub struct Mutex<T: ?Sized>(s::Mutex<T>);

impl<T> Mutex<T> {
    pub fn new(value: T) -> Self {
        Mutex(s::Mutex::new(value))
    }

    pub fn into_inner(self) -> T {
        self.0.into_inner().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: ?Sized> Mutex<T> {
    pub fn lock(&self) -> MutexGuard<'_, T> {
        MutexGuard(Some(self.0.lock().unwrap_or_else(PoisonError::into_inner)))
    }

    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        self.0.try_lock().ok().map(|g| MutexGuard(Some(g)))
    }

    pub fn get_mut(&mut self) -> &mut T {
        self.0.get_mut().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: Default> Default for Mutex<T> {
    fn default() -> Self {
        Mutex::new(T::default())
    }
}

pub struct RwLock<T: ?Sized>(s::RwLock<T>);

impl<T> RwLock<T> {
    pub fn new(value: T) -> Self {
        RwLock(s::RwLock::new(value))
    }
}

impl<T: ?Sized> RwLock<T> {
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }
}

impl<T: Default> Default for RwLock<T> {
    fn default() -> Self {
        RwLock::new(T::default())
    }
}

pub struct WaitTimeoutResult(bool);

impl WaitTimeoutResult {
    pub fn timed_out(&self) -> bool {
        self.0
    }
}

#[derive(Default)]
pub struct Condvar(s::Condvar);

impl Condvar {
    pub fn new() -> Self {
        Condvar(s::Condvar::new())
    }

    pub fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
        let g = guard.0.take().expect(TAKEN);
        guard.0 = Some(self.0.wait(g).unwrap_or_else(PoisonError::into_inner));
    }

    /// shuttle has no clock and its timed waits never time out, yet the
    /// code relies on timeouts firing (a txg ageing, a throttled writer
    /// looking again). A timed wait may end at any moment, so the schedule
    /// chooses: time out at once, or wait for a notification.
    pub fn wait_for<T>(&self, guard: &mut MutexGuard<'_, T>, _timeout: Duration) -> WaitTimeoutResult {
        if shuttle::rand::thread_rng().gen::<bool>() {
            return WaitTimeoutResult(true);
        }
        self.wait(guard);
        WaitTimeoutResult(false)
    }

    pub fn notify_one(&self) {
        self.0.notify_one();
    }

    pub fn notify_all(&self) {
        self.0.notify_all();
    }
}
