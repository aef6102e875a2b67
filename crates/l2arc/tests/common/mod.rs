//! What the tests of reads into the engine's buffers share: a buffer
//! source that hands out buffers of old bytes, as the engine's buffers of
//! evicted records are.

use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::Mutex;

use arcache_l2::BufSource;

/// Hands out buffers of old bytes and remembers where each one lies, and
/// counts the copies asked of it apart. A copy goes into a buffer it hands
/// out (the trait's own `copy_of`), so `handed` names every buffer a record
/// was read or copied into.
#[derive(Default)]
pub struct OldBuffers {
    pub handed: Mutex<Vec<usize>>,
    pub copies: AtomicUsize,
}

impl BufSource for OldBuffers {
    fn uninit(&self, len: usize) -> Box<[MaybeUninit<u8>]> {
        let mut b = Box::new_uninit_slice(len);
        b.fill(MaybeUninit::new(0xee));
        self.handed.lock().unwrap().push(b.as_ptr() as usize);
        b
    }

    fn copy_of(&self, data: &[u8]) -> Box<[u8]> {
        self.copies.fetch_add(1, Relaxed);
        Uncounted(self).copy_of(data)
    }
}

/// The same buffers without the count: its `copy_of` is the trait's own.
struct Uncounted<'a>(&'a OldBuffers);

impl BufSource for Uncounted<'_> {
    fn uninit(&self, len: usize) -> Box<[MaybeUninit<u8>]> {
        self.0.uninit(len)
    }
}
