//! A read given a buffer of its own ([`Op::into`]) lands in it and hands
//! it back whole; a buffer that does not fit the read (another length, a
//! read not wanted whole) is left aside and the read lands in the ring's,
//! as without one. (One off a page boundary is left aside too; this
//! allocator places none so.)

use std::io::Write;
use std::mem::MaybeUninit;
use std::os::fd::AsRawFd;
use std::sync::mpsc;
use std::time::Duration;

use blockdev::uring::{Finish, Landed, Op, Uring};

/// Places buffers of whole pages on page boundaries, as the server's
/// allocator does.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// What a read handed on: the bytes, and where they lay when they were
/// handed back whole (`None`: lent from the ring's buffer).
type Got = (Vec<u8>, Option<usize>);

fn read(
    ring: &Uring,
    fd: i32,
    at: u64,
    need: usize,
    skip: usize,
    into: Option<Box<[MaybeUninit<u8>]>>,
) -> Got {
    let (tx, rx) = mpsc::channel();
    let finish: Finish = Box::new(move |r, _| {
        let got = match r.expect("the read succeeds") {
            Landed::Lent(b) => (b.to_vec(), None),
            Landed::Own(b) => (b.to_vec(), Some(b.as_ptr() as usize)),
        };
        tx.send(got).unwrap();
    });
    let len = need - skip;
    assert!(ring.submit(Op { fd, at, need, skip, len, finish, into }).is_ok());
    rx.recv_timeout(Duration::from_secs(10)).expect("answered")
}

fn old_bytes(len: usize) -> Box<[MaybeUninit<u8>]> {
    let mut b = Box::new_uninit_slice(len);
    b.fill(MaybeUninit::new(0xee));
    b
}

#[test]
fn a_given_buffer_that_fits_is_read_into_and_handed_back_and_one_that_does_not_is_left_aside() {
    let mut f = tempfile::tempfile().unwrap();
    let data: Vec<u8> = (0..1 << 20).map(|i: u32| (i * 7 + i / 4096) as u8).collect();
    f.write_all(&data).unwrap();
    let fd = f.as_raw_fd();
    let ring = Uring::start("given").unwrap();
    let want = |at: usize, len: usize| data[at..at + len].to_vec();

    let given = old_bytes(16384);
    let at = given.as_ptr() as usize;
    assert!(at.is_multiple_of(4096), "the allocator placed a 16 KiB buffer off a page boundary");
    assert_eq!(read(&ring, fd, 65536, 16384, 0, Some(given)), (want(65536, 16384), Some(at)));

    // Not the read's length, or a read not wanted whole: the ring's buffer.
    assert_eq!(read(&ring, fd, 8192, 16384, 0, Some(old_bytes(8192))), (want(8192, 16384), None));
    assert_eq!(
        read(&ring, fd, 8192, 16384, 512, Some(old_bytes(16384))),
        (want(8192 + 512, 16384 - 512), None)
    );
}
