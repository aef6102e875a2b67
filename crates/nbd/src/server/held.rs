//! Replies held back in a completion batch and then written with one
//! system call per connection. The connection thread keeps a batch while
//! more requests are already buffered; an export's completing thread (a
//! commit answering FLUSHes, a ring finishing reads) hands one batch to
//! every completion of a pass. Either way the client is woken once per
//! burst instead of once per reply.

use std::sync::Arc;

use arcache_batch::{Batch, Deferred};

use super::{ConnShared, Slot};

/// Replies larger than this are sent at once even while replies are held:
/// copying them would cost more than the system call saved.
pub(super) const HOLD_MAX_REPLY: usize = 8 << 10;
/// Held replies are sent once they add up to this much.
const HOLD_MAX_BYTES: usize = 256 << 10;

/// Replies held in a batch, by connection, and the budget slots to give
/// back once they are out.
#[derive(Default)]
pub(super) struct Held {
    replies: Vec<(Arc<ConnShared>, Vec<u8>)>,
    bytes: usize,
    slots: Vec<Slot>,
}

impl Deferred for Held {
    fn flush(&mut self) {
        let held = std::mem::take(self);
        for (conn, bytes) in &held.replies {
            conn.send_now(&[bytes]);
        }
        // The budget is given back only once the replies are really sent.
        drop(held.slots);
    }
}

/// Keeps a small reply in `out`; false if it must be sent now.
pub(super) fn hold_reply(out: &mut Batch, conn: &Arc<ConnShared>, parts: &[&[u8]]) -> bool {
    let len: usize = parts.iter().map(|p| p.len()).sum();
    if len > HOLD_MAX_REPLY {
        return false;
    }
    let held = out.part::<Held>();
    let at = match held.replies.iter().position(|(c, _)| Arc::ptr_eq(c, conn)) {
        Some(at) => at,
        None => {
            held.replies.push((Arc::clone(conn), Vec::new()));
            held.replies.len() - 1
        }
    };
    for p in parts {
        held.replies[at].1.extend_from_slice(p);
    }
    held.bytes += len;
    if held.bytes >= HOLD_MAX_BYTES {
        held.flush();
    }
    true
}

/// Gives `slot` back once `out`'s replies are sent.
pub(super) fn hold_slot(out: &mut Batch, slot: Slot) {
    out.part::<Held>().slots.push(slot);
}
