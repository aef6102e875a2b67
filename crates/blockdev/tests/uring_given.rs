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

use blockdev::uring::{Finish, Landed, Op, ReadError, Uring};

/// Places buffers of whole pages on page boundaries, as the server's
/// allocator does.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// What a read handed on: the bytes, and where they lay when they were
/// handed back whole (`None`: lent from the ring's buffer).
type Got = (Vec<u8>, Option<usize>);

/// The read's bytes, or its error as text.
fn try_read(
    ring: &Uring,
    fd: i32,
    at: u64,
    need: usize,
    skip: usize,
    into: Option<Box<[MaybeUninit<u8>]>>,
) -> Result<Got, String> {
    let (tx, rx) = mpsc::channel();
    let finish: Finish = Box::new(move |r, _| {
        let got = match r {
            Ok(Landed::Lent(b)) => Ok((b.to_vec(), None)),
            Ok(Landed::Own(b)) => Ok((b.to_vec(), Some(b.as_ptr() as usize))),
            Err(ReadError::Device(e)) => Err(format!("device: {e}")),
            Err(ReadError::RingFailed) => Err("ring failed".to_string()),
        };
        tx.send(got).unwrap();
    });
    let len = need - skip;
    if ring.submit(Op { fd, at, need, skip, len, finish, into }).is_err() {
        return Err("refused".to_string());
    }
    rx.recv_timeout(Duration::from_secs(10)).expect("answered")
}

fn old_bytes(len: usize) -> Box<[MaybeUninit<u8>]> {
    let mut b = Box::new_uninit_slice(len);
    b.fill(MaybeUninit::new(0xee));
    b
}

/// A file of 1 MiB of patterned bytes (kept open by the returned handle),
/// and a ring to read it with.
fn file_and_ring(name: &str) -> (std::fs::File, Vec<u8>, Uring) {
    let mut f = tempfile::tempfile().unwrap();
    let data: Vec<u8> = (0..1 << 20).map(|i: u32| (i * 7 + i / 4096) as u8).collect();
    f.write_all(&data).unwrap();
    (f, data, Uring::start(name).unwrap())
}

#[test]
fn a_given_buffer_that_fits_is_read_into_and_handed_back_and_one_that_does_not_is_left_aside() {
    let (f, data, ring) = file_and_ring("given");
    let fd = f.as_raw_fd();
    let want = |at: usize, len: usize| data[at..at + len].to_vec();

    let given = old_bytes(16384);
    let at = given.as_ptr() as usize;
    assert!(at.is_multiple_of(4096), "the allocator placed a 16 KiB buffer off a page boundary");
    assert_eq!(try_read(&ring, fd, 65536, 16384, 0, Some(given)), Ok((want(65536, 16384), Some(at))));

    // Not the read's length, or a read not wanted whole: the ring's buffer.
    assert_eq!(try_read(&ring, fd, 8192, 16384, 0, Some(old_bytes(8192))), Ok((want(8192, 16384), None)));
    assert_eq!(
        try_read(&ring, fd, 8192, 16384, 512, Some(old_bytes(16384))),
        Ok((want(8192 + 512, 16384 - 512), None))
    );
}

/// A read given a buffer that fails (short, refused by the kernel, or on a
/// ring that failed) is an error, never bytes: the buffer holds whatever
/// it held before, which must not be taken for the data. The ring goes on
/// reading into given buffers after the errors.
#[test]
fn a_read_into_a_given_buffer_that_fails_is_an_error_not_the_buffers_old_bytes() {
    let (f, data, ring) = file_and_ring("given-errors");
    let fd = f.as_raw_fd();

    // Buffers on page boundaries (else they would be left aside, and the
    // reads below would not test a given buffer).
    let aligned = || {
        let b = old_bytes(16384);
        assert!((b.as_ptr() as usize).is_multiple_of(4096), "a 16 KiB buffer off a page boundary");
        Some(b)
    };
    // 4 KiB left before the file's end: a short read.
    let short = try_read(&ring, fd, (1 << 20) - 4096, 16384, 0, aligned());
    assert!(short.as_ref().is_err_and(|e| e.contains("short read")), "{short:?}");
    // A file descriptor the kernel refuses.
    let bad = try_read(&ring, -1, 0, 16384, 0, aligned());
    assert!(bad.as_ref().is_err_and(|e| e.starts_with("device")), "{bad:?}");

    let given = old_bytes(16384);
    let at = given.as_ptr() as usize;
    let want = data[4096..4096 + 16384].to_vec();
    assert_eq!(try_read(&ring, fd, 4096, 16384, 0, Some(given)), Ok((want, Some(at))));

    // Reads submitted around the ring's failure: each is answered, with
    // the file's bytes (it finished first) or as failed by the ring. (On a
    // file in the page cache few if any are still at the kernel when the
    // ring fails; `fail_all` leaks those buffers, the kernel may still
    // write to them.)
    let (tx, rx) = mpsc::channel();
    for i in 0..32u64 {
        let (tx, refused_tx) = (tx.clone(), tx.clone());
        let finish: Finish = Box::new(move |r, _| {
            let got = match r {
                Ok(l) => Ok(l.bytes().to_vec()),
                Err(ReadError::RingFailed) => Err(()),
                Err(ReadError::Device(e)) => panic!("the device did not fail: {e}"),
            };
            tx.send((i, got)).unwrap();
        });
        let op = Op { fd, at: i * 16384, need: 16384, skip: 0, len: 16384, finish, into: aligned() };
        if i == 8 {
            ring.inject_failure();
        }
        if ring.submit(op).is_err() {
            refused_tx.send((i, Err(()))).unwrap();
        }
    }
    drop(tx);
    let ends: Vec<_> = (0..32).map_while(|_| rx.recv_timeout(Duration::from_secs(10)).ok()).collect();
    assert_eq!(ends.len(), 32, "every read is answered");
    for (i, got) in ends {
        if let Ok(bytes) = got {
            let at = i as usize * 16384;
            assert!(bytes == data[at..at + 16384], "read {i} handed on bytes that are not the file's");
        }
    }
    let t0 = std::time::Instant::now();
    while ring.is_alive() {
        assert!(t0.elapsed() < Duration::from_secs(10), "the injected failure did not fail the ring");
        std::thread::sleep(Duration::from_millis(1));
    }
    let refused = try_read(&ring, fd, 0, 16384, 0, Some(old_bytes(16384)));
    assert_eq!(refused, Err("refused".to_string()));
}
