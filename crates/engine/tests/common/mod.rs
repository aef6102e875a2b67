//! What the ring-read tests share: a read as the NBD server does it, and
//! the race of a writer against readers whose ring reads it overtakes.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use arcache_engine::{ReadDone, ReadEnd, Volume};
use blockdev::DevResult;
use rand::{Rng, SeedableRng};

/// A read the way the NBD server does it: through the ring when the
/// volume takes it, else (or when the ring hands it back) blocking.
pub fn try_read(vol: &Volume, offset: u64, len: usize) -> DevResult<Vec<u8>> {
    let (tx, rx) = mpsc::channel();
    let done: ReadDone = Box::new(move |end, _| tx.send(end).expect("reader waits"));
    match vol.read_async(offset, len, done, std::convert::identity, &mut arcache_engine::Batch::new()) {
        Ok(()) => match rx.recv_timeout(Duration::from_secs(10)).expect("the ring answers") {
            ReadEnd::Done(b) => b,
            ReadEnd::Blocking(work) => work(),
            ReadEnd::Declined => panic!("the volume declined a read it had started"),
        },
        Err(_) => {
            let mut b = vec![0u8; len];
            vol.read(offset, &mut b).map(|()| b)
        }
    }
}

/// A record's bytes at version `v`: every 8 bytes say (record, version).
pub fn versioned(rec: u64, v: u64, len: usize) -> Vec<u8> {
    let word = (rec << 32 | v).to_le_bytes();
    word.iter().copied().cycle().take(len).collect()
}

/// One writer keeps overwriting `records` records of `rs` bytes that four
/// readers read 4K of through the ring for `secs` seconds, so ring reads
/// are often in flight across a write to their record. A read must never
/// return a version older than one acknowledged before it began (a ring
/// read that completed after an overwrite and put its old bytes into the
/// ARC would be caught by the next read), nor a torn one.
pub fn overtaken_reads(vol: &Volume, rs: u64, records: u64, secs: u64) {
    let acked: Vec<AtomicU64> = (0..records).map(|_| AtomicU64::new(0)).collect();
    for rec in 0..records {
        vol.write(rec * rs, &versioned(rec, 0, rs as usize), false).unwrap();
    }
    let until = Instant::now() + Duration::from_secs(secs);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut rng = rand::rngs::StdRng::seed_from_u64(7);
            while Instant::now() < until {
                let rec = rng.gen_range(0..records);
                let v = acked[rec as usize].load(Relaxed) + 1;
                vol.write(rec * rs, &versioned(rec, v, rs as usize), false).unwrap();
                acked[rec as usize].store(v, Relaxed);
                std::thread::sleep(Duration::from_micros(200));
            }
        });
        for t in 0..4u64 {
            let acked = &acked;
            s.spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(100 + t);
                while Instant::now() < until {
                    let rec = rng.gen_range(0..records);
                    let at = rng.gen_range(0..rs / 4096) * 4096;
                    let before = acked[rec as usize].load(Relaxed);
                    let b = try_read(vol, rec * rs + at, 4096).unwrap();
                    let word = u64::from_le_bytes(b[..8].try_into().unwrap());
                    let (got_rec, v) = (word >> 32, word & 0xffff_ffff);
                    assert_eq!(got_rec, rec, "another record's bytes");
                    assert!(
                        v >= before,
                        "record {rec}: version {v} read after version {before} was acknowledged"
                    );
                    assert!(b == versioned(rec, v, 4096), "record {rec}: torn read");
                }
            });
        }
    });
}
