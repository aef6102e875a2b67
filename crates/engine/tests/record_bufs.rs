//! Reads from the backing store go into buffers of records the ARC evicted
//! (at most a quarter of the ARC's size kept), on both fill paths: a store
//! that reads straight into the records' buffers and one read through a
//! block buffer and copied. A reused buffer holds another record's bytes
//! until the read overwrites them: every byte read must be the store's.

use std::sync::Arc;

use arcache_engine::{Cache, CacheConfig, Volume, VolumeConfig};
use blockdev::{BlockDev, CountingDev, MemDev};
use rand::{Rng, SeedableRng};

const DEV: u64 = 48 << 20;
const RS: u64 = 16 << 10;
const ARC_MAX: u64 = 8 << 20;

fn volume(scatters: bool) -> (Vec<u8>, Arc<Volume>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let data: Vec<u8> = (0..DEV).map(|_| rng.gen()).collect();
    volume_of(data, scatters, false)
}

fn volume_of(data: Vec<u8>, scatters: bool, compress: bool) -> (Vec<u8>, Arc<Volume>) {
    let mem = MemDev::new(DEV);
    mem.write_at(&data, 0).unwrap();
    assert!(mem.scatters_reads());
    // The counting decorator does not pass scattered reads on: each read
    // goes through the engine's block buffer, and records are copied.
    let dev: Arc<dyn BlockDev> = if scatters { Arc::new(mem) } else { Arc::new(CountingDev::new(mem)) };
    assert_eq!(dev.scatters_reads(), scatters);
    let cache =
        Cache::new(CacheConfig { arc_min: ARC_MAX / 2, arc_max: ARC_MAX, min_prefetch_ms: 0, compress });
    let cfg = VolumeConfig { name: "t".into(), recordsize: RS, read_only: true };
    (data, Volume::new(0, cfg, dev, cache))
}

/// Two passes over the volume, six times the ARC: sequential in 128K
/// reads, then random 4K reads; every byte checked.
fn read_all(vol: &Volume, data: &[u8]) {
    let mut buf = vec![0u8; 128 << 10];
    for at in (0..DEV).step_by(buf.len()) {
        vol.read(at, &mut buf).unwrap();
        assert!(buf == data[at as usize..at as usize + buf.len()], "sequential read at {at}");
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let mut small = vec![0u8; 4096];
    for _ in 0..4096 {
        let at = rng.gen_range(0..DEV / 4096) * 4096;
        vol.read(at, &mut small).unwrap();
        assert!(small == data[at as usize..at as usize + 4096], "random read at {at}");
    }
}

fn check(scatters: bool) {
    let (data, vol) = volume(scatters);
    read_all(&vol, &data);
    let st = vol.cache().stats();
    let records_read = st.backing_read_bytes / RS;
    // Once the ARC is full, every record read makes room by evicting one
    // of its size; nearly all of those buffers come back.
    let after_full = records_read - ARC_MAX / RS;
    assert!(
        st.record_bufs_reused * 10 >= after_full * 8,
        "{} of {after_full} records read after the ARC filled went into kept buffers",
        st.record_bufs_reused
    );
    assert!(st.record_bufs_size <= ARC_MAX / 4, "{} bytes kept", st.record_bufs_size);
}

#[test]
fn records_read_into_a_buffer_each_reuse_evicted_records_buffers() {
    check(true);
}

#[test]
fn records_copied_from_a_block_buffer_reuse_evicted_records_buffers() {
    check(false);
}

/// Records that compress are kept compressed, so their evictions give no
/// buffer back; the buffer each was read into is given back instead, or
/// a compressible export's reads would each allocate a new one.
#[test]
fn a_record_kept_compressed_gives_back_the_buffer_it_was_read_into() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    // Every 4 KiB: 1 KiB of random bytes, then zeros.
    let data: Vec<u8> = (0..DEV).map(|i| if i % 4096 < 1024 { rng.gen() } else { 0 }).collect();
    let (data, vol) = volume_of(data, true, true);
    read_all(&vol, &data);
    let st = vol.cache().stats();
    let records_read = st.backing_read_bytes / RS;
    assert!(st.compressed_size * 2 < st.uncompressed_size, "records did not compress: {st:?}");
    assert!(
        st.record_bufs_reused * 10 >= records_read * 8,
        "{} of {records_read} records read went into kept buffers",
        st.record_bufs_reused
    );
    assert!(st.record_bufs_size <= ARC_MAX / 4, "{} bytes kept", st.record_bufs_size);
}
