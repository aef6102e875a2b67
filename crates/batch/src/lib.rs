//! Completion batches.
//!
//! A thread that finishes many requests at once (a commit answering a
//! burst of FLUSHes, an io_uring pass finishing a batch of reads) gives
//! every completion the same [`Batch`]. What a completion would do at once
//! and could do once for all of them, such as writing its reply to a
//! socket, it leaves in a part of the batch instead, and the thread flushes
//! the batch when the pass is over: one system call per connection instead
//! of one per reply.
//!
//! The batch knows nothing of what its parts hold, so the layer that
//! completes (storage) need not know the layer that answers (the protocol),
//! and no thread-local state is shared between them.

use std::any::{Any, TypeId};

/// Work left in a [`Batch`] by its completions, done at [`Batch::flush`].
pub trait Deferred: Any + Send {
    /// Does what was left; the part stays in the batch for later use.
    fn flush(&mut self);
}

struct Part {
    kind: TypeId,
    value: Box<dyn Any + Send>,
    flush: fn(&mut (dyn Any + Send)),
}

/// The parts of one pass's completions, at most one of each type, flushed
/// in the order they were first used. Dropping a batch flushes it, so a
/// completion that panics cannot strand what earlier ones left.
#[derive(Default)]
pub struct Batch {
    parts: Vec<Part>,
}

impl Batch {
    pub fn new() -> Batch {
        Batch::default()
    }

    /// The part of type `T`, made on first use.
    pub fn part<T: Deferred + Default>(&mut self) -> &mut T {
        let kind = TypeId::of::<T>();
        let at = match self.parts.iter().position(|p| p.kind == kind) {
            Some(at) => at,
            None => {
                self.parts.push(Part { kind, value: Box::new(T::default()), flush: flush_as::<T> });
                self.parts.len() - 1
            }
        };
        match self.parts[at].value.downcast_mut::<T>() {
            Some(part) => part,
            // The type id was checked above; a mismatch is impossible.
            None => unreachable!("a batch part of another type under this type's id"),
        }
    }

    /// Does everything the completions left so far.
    pub fn flush(&mut self) {
        for p in &mut self.parts {
            (p.flush)(p.value.as_mut());
        }
    }
}

fn flush_as<T: Deferred>(value: &mut (dyn Any + Send)) {
    if let Some(part) = value.downcast_mut::<T>() {
        part.flush();
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        self.flush();
    }
}

/// How a read handed to another thread ends. The storage layer and the
/// protocol pass this same type, each with its own error: the engine's
/// device errors become the protocol's with [`ReadEnd::map_err`] where a
/// read crosses from one to the other.
pub enum ReadEnd<E> {
    /// The bytes asked for, or the error that answers the read.
    Done(Result<Vec<u8>, E>),
    /// Not finished without blocking: run this on a thread that may block.
    Blocking(Box<dyn FnOnce() -> Result<Vec<u8>, E> + Send>),
    /// Not started: the reader declined it, and the caller reads it the
    /// blocking way through its own path (the protocol's: an export's
    /// blocking calls on a worker).
    Declined,
}

impl<E: 'static> ReadEnd<E> {
    /// The same end with its error, now or later, turned by `f`.
    pub fn map_err<F: 'static>(self, f: fn(E) -> F) -> ReadEnd<F> {
        match self {
            ReadEnd::Done(res) => ReadEnd::Done(res.map_err(f)),
            ReadEnd::Blocking(work) => ReadEnd::Blocking(Box::new(move || work().map_err(f))),
            ReadEnd::Declined => ReadEnd::Declined,
        }
    }
}

/// Called once with the end of a read started without blocking, on any
/// thread, with the batch of the completions that ran together (the
/// caller's for a read that ends before the call starting it returns).
pub type ReadDone<E> = Box<dyn FnOnce(ReadEnd<E>, &mut Batch) + Send>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::sync::Arc;

    #[derive(Default)]
    struct Lines {
        pending: Vec<String>,
        sent: Arc<AtomicUsize>,
    }

    impl Deferred for Lines {
        fn flush(&mut self) {
            if !self.pending.is_empty() {
                self.sent.fetch_add(1, SeqCst);
                self.pending.clear();
            }
        }
    }

    #[test]
    fn completions_share_one_part_and_it_is_flushed_once() {
        let sent = Arc::new(AtomicUsize::new(0));
        let mut batch = Batch::new();
        batch.part::<Lines>().sent = Arc::clone(&sent);
        for i in 0..10 {
            batch.part::<Lines>().pending.push(format!("reply {i}"));
        }
        assert_eq!(sent.load(SeqCst), 0, "nothing goes out before the flush");
        batch.flush();
        assert_eq!(sent.load(SeqCst), 1);
        batch.part::<Lines>().pending.push("late".into());
        drop(batch);
        assert_eq!(sent.load(SeqCst), 2, "dropping a batch flushes what is left");
    }
}
