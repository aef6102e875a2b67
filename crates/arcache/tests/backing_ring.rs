//! Backing-store reads through the IO ring, through the real binary: with
//! `--direct` and `backing_ring_reads=1`, 4K reads that miss RAM are
//! answered from the ring thread with the file's bytes, and
//! `backing_ring_reads=0` sends them to the worker threads again.

mod common;

use common::*;

const SIZE: usize = 24 << 20;

/// 4K reads at scattered offsets (no sequential stream for zfetch to
/// prefetch), checking every byte.
fn read_scattered(s: &Serve, data: &[u8], n: usize, seed: usize) {
    let mut c = nbd::Client::connect(&s.target(), "").unwrap();
    let mut buf = vec![0u8; 4096];
    for i in 0..n {
        let off = ((i + seed) * 7919 * 4096) % SIZE;
        c.read(off as u64, &mut buf).unwrap();
        assert!(buf[..] == data[off..off + buf.len()], "wrong bytes at {off}");
    }
}

fn ring_reads(s: &Serve) -> u64 {
    s.stat()["backing_ring_reads"].as_u64().expect("backing_ring_reads in stat")
}

#[test]
fn cold_reads_of_a_direct_backing_go_through_the_ring_and_can_be_turned_off() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("backing.img");
    let data = random_file(&img, SIZE, 21);
    let args =
        ["--export", img.to_str().unwrap(), "--direct", "--arc-max", "4M", "--set", "backing_ring_reads=1"];
    let s = Serve::start(dir, &args);
    read_scattered(&s, &data, 2000, 0);
    let ring = ring_reads(&s);
    assert!(ring > 1000, "cold 4K reads went through the ring: {ring}; {}", s.stat());
    assert!(s.ctl(&["set", "backing_ring_reads=0"]).status.success());
    read_scattered(&s, &data, 500, 3);
    assert_eq!(ring_reads(&s), ring, "backing_ring_reads=0: no read through the ring");
}
