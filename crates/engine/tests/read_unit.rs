//! A store that is costly per request (an object store: one GET each)
//! says so with `BlockDev::read_unit`. A sequential stream over it is read
//! in whole units, by its prefetches and by its own misses, whether one
//! reader walks it or many requests are in flight at once (as nbdcopy
//! keeps them); random reads are not widened; every byte is the store's.

use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use arcache_engine::{Cache, CacheConfig, Volume, VolumeConfig};
use blockdev::{BlockDev, DevResult, MemDev};
use rand::{Rng, SeedableRng};

const DEV: u64 = 64 << 20;
const RS: u64 = 128 << 10;
// Not a power of two: prefetches that end on powers of two by themselves
// (zfetch's jobs of 64 records) do not pass for reads in units.
const UNIT: u64 = 3 << 20;

/// A memory store that asks for reads of `unit` bytes, takes a round
/// trip's time for every read (what makes a store costly per request),
/// and logs every read it gets.
struct UnitDev {
    inner: MemDev,
    unit: Option<u64>,
    reads: Mutex<Vec<Range<u64>>>,
}

impl BlockDev for UnitDev {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> DevResult<()> {
        self.reads.lock().unwrap().push(offset..offset + buf.len() as u64);
        std::thread::sleep(std::time::Duration::from_millis(2));
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> DevResult<()> {
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> DevResult<()> {
        Ok(())
    }
    fn describe(&self) -> String {
        "unit".into()
    }
    fn read_unit(&self) -> Option<u64> {
        self.unit
    }
}

fn setup(unit: Option<u64>) -> (Vec<u8>, Arc<UnitDev>, Arc<Volume>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let data: Vec<u8> = (0..DEV).map(|_| rng.gen()).collect();
    let inner = MemDev::new(DEV);
    inner.write_at(&data, 0).unwrap();
    let dev = Arc::new(UnitDev { inner, unit, reads: Mutex::new(Vec::new()) });
    // Everything fits: a record read twice would be the read path's doing.
    let arc_max = 4 * DEV;
    let cache =
        Cache::new(CacheConfig { arc_min: arc_max / 2, arc_max, min_prefetch_ms: 0, compress: false });
    let cfg = VolumeConfig { name: "t".into(), recordsize: RS, read_only: true };
    let vol = Volume::new(0, cfg, Arc::clone(&dev) as Arc<dyn BlockDev>, cache);
    (data, dev, vol)
}

/// Reads the whole volume in 256K requests from `threads` threads taking
/// the next request in turn, each checked against `data`.
fn stream(vol: &Arc<Volume>, data: &[u8], threads: usize) {
    let next = AtomicU64::new(0);
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| {
                let mut buf = vec![0u8; 256 << 10];
                loop {
                    let at = next.fetch_add(buf.len() as u64, Relaxed);
                    if at >= DEV {
                        return;
                    }
                    vol.read(at, &mut buf).unwrap();
                    assert!(buf == data[at as usize..at as usize + buf.len()], "read at {at}");
                }
            });
        }
    });
}

/// Waits for the prefetch jobs a stream left queued, so every read they
/// make is counted before the log is looked at.
fn settle(dev: &UnitDev) -> Vec<Range<u64>> {
    let mut last = usize::MAX;
    loop {
        std::thread::sleep(std::time::Duration::from_millis(200));
        let n = dev.reads.lock().unwrap().len();
        if n == last {
            return dev.reads.lock().unwrap().clone();
        }
        last = n;
    }
}

/// Every byte read once, at most about one read per unit after the
/// stream's first reads, and three quarters of the bytes or more in reads
/// that end on a unit. The first reads are those made before the stream
/// is known to be one: a few reads in order, and with many in flight,
/// ending out of order, a few rounds of them (measured: up to 38 reads of
/// 16 in flight, 9.5 of the 64 MiB).
fn read_in_units(reads: &[Range<u64>], in_flight: u64) -> Result<(), String> {
    let bytes: u64 = reads.iter().map(|r| r.end - r.start).sum();
    if bytes != DEV {
        return Err(format!("{bytes} bytes read for {DEV}: {reads:?}"));
    }
    let startup = 4 + 4 * in_flight;
    let units = DEV.div_ceil(UNIT);
    let n = reads.len() as u64;
    if n > units + 2 + startup {
        return Err(format!("{n} reads for {units} units: {reads:?}"));
    }
    let in_units: u64 =
        reads.iter().filter(|r| r.end % UNIT == 0 || r.end == DEV).map(|r| r.end - r.start).sum();
    if in_units * 4 < DEV * 3 {
        return Err(format!("{in_units} bytes in reads that end on a unit: {reads:?}"));
    }
    Ok(())
}

/// Streams the volume over a store whose unit is `unit` from `threads`
/// readers; what `read_in_units` says of the store's reads.
fn streamed(unit: Option<u64>, threads: u64) -> Result<(), String> {
    let (data, dev, vol) = setup(unit);
    stream(&vol, &data, threads as usize);
    read_in_units(&settle(&dev), threads)
}

#[test]
fn one_reader_streams_a_costly_store_in_whole_units() {
    streamed(Some(UNIT), 1).unwrap();
}

#[test]
fn many_requests_in_flight_stream_a_costly_store_in_whole_units() {
    streamed(Some(UNIT), 16).unwrap();
}

#[test]
fn backing_read_units_off_reads_a_costly_store_as_any_other() {
    let (data, dev, vol) = setup(Some(UNIT));
    vol.set_read_units(false);
    stream(&vol, &data, 16);
    assert!(read_in_units(&settle(&dev), 16).is_err());
}

#[test]
fn without_a_read_unit_the_same_stream_is_not_read_in_units() {
    // The measure the tests above rely on tells the two apart: without the
    // store's word, zfetch's prefetches and the stream's misses end where
    // they happen to.
    assert!(streamed(None, 16).is_err());
}

#[test]
fn random_reads_on_a_costly_store_are_not_widened() {
    // 4K records, so random reads are spread over 16,384 of them, as on a
    // store of real size they are spread over far more.
    const RS: u64 = 4096;
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let data: Vec<u8> = (0..DEV).map(|_| rng.gen()).collect();
    let inner = MemDev::new(DEV);
    inner.write_at(&data, 0).unwrap();
    let dev = Arc::new(UnitDev { inner, unit: Some(UNIT), reads: Mutex::new(Vec::new()) });
    let cache =
        Cache::new(CacheConfig { arc_min: DEV, arc_max: 2 * DEV, min_prefetch_ms: 0, compress: false });
    let cfg = VolumeConfig { name: "t".into(), recordsize: RS, read_only: true };
    let vol = Volume::new(0, cfg, Arc::clone(&dev) as Arc<dyn BlockDev>, cache);
    let mut buf = vec![0u8; 4096];
    for _ in 0..2000 {
        let at = rng.gen_range(0..DEV / 4096) * 4096;
        vol.read(at, &mut buf).unwrap();
        assert!(buf == data[at as usize..at as usize + 4096], "read at {at}");
    }
    let reads = settle(&dev);
    // zfetch may take a few records next to each other for a stream now
    // and then (as on any store); never a unit.
    let wide: Vec<_> = reads.iter().filter(|r| r.end - r.start > 16 * RS).collect();
    assert!(wide.is_empty(), "random reads widened: {wide:?}");
    assert!(reads.len() > 1000, "{} reads: the test did not miss", reads.len());
}

/// A stream's miss reads on to the end of its unit only what must come
/// from the backing store: records on L2 are left to their own requests
/// (so a stream over L2 is read by many threads, not one per unit), and
/// nothing past the request is copied into the request's buffer.
#[test]
fn a_streams_miss_reads_ahead_only_what_is_not_on_l2() {
    use arcache_engine::{Feed, FeedTunables};
    use arcache_l2::{L2Arc, L2Device, HEADER_RESERVED};
    const RS: u64 = 16 << 10;
    const RECORDS: u64 = 64;
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let data: Vec<u8> = (0..RS * RECORDS).map(|_| rng.gen()).collect();
    let inner = MemDev::new(RS * RECORDS);
    inner.write_at(&data, 0).unwrap();
    let dev = Arc::new(UnitDev { inner, unit: Some(16 * RS), reads: Mutex::new(Vec::new()) });
    let l2mem = Arc::new(MemDev::new(HEADER_RESERVED + (8 << 20)));
    let l2 = L2Arc::new(vec![L2Device::new("l2".into(), l2mem as Arc<dyn BlockDev>).unwrap()]).unwrap();
    let cache = Cache::with_l2(
        CacheConfig { arc_min: 1 << 20, arc_max: 2 << 20, min_prefetch_ms: 0, compress: false },
        Some(Arc::new(l2)),
    );
    let tun = Arc::new(FeedTunables::default());
    tun.dwpd_limit.store(0, Relaxed);
    let feed = Feed::new(Arc::clone(&cache), tun, Arc::new(AtomicU64::new(2 << 20))).unwrap();
    let cfg = VolumeConfig { name: "t".into(), recordsize: RS, read_only: true };
    let vol = Volume::new(0, cfg, Arc::clone(&dev) as Arc<dyn BlockDev>, Arc::clone(&cache));
    // Records 9..12 on L2 and out of RAM; 0..8 in RAM as prefetches
    // (NBD_CMD_CACHE: neither zfetch nor the request log sees them).
    vol.prefetch(9 * RS, 3 * RS).unwrap();
    feed.cycle_once();
    assert!((9..12).all(|r| cache.l2().unwrap().contains(r)), "records fed to L2");
    cache.set_limits(RS, RS);
    cache.set_limits(1 << 20, 2 << 20);
    vol.prefetch(0, 8 * RS).unwrap();
    dev.reads.lock().unwrap().clear();
    // Three requests in a row (records 5, 6 and 7, in RAM), then record
    // 8: a stream, so its miss reads on to the end of the unit (record 16),
    // 9..12 left on L2. Read whole, so no half of an L2 copy serves them.
    let mut buf = vec![0u8; RS as usize];
    for r in 5..8 {
        vol.read(r * RS, &mut buf).unwrap();
    }
    vol.read(8 * RS, &mut buf).unwrap();
    assert!(buf[..] == data[(8 * RS) as usize..(9 * RS) as usize]);
    // zfetch's prefetch of the stream runs beside the read and may take
    // 12..16 (and on) first, or 9..12 from L2: whoever reads a record of
    // the unit, it is read once, and nothing on L2 comes from the backing
    // store.
    let times_read = |r: u64| dev.reads.lock().unwrap().iter().filter(|x| x.contains(&(r * RS))).count();
    assert_eq!((9..12).map(times_read).sum::<usize>(), 0, "a record on L2 read from the backing store");
    for r in [8, 12, 13, 14, 15] {
        assert_eq!(times_read(r), 1, "record {r}: {:?}", dev.reads.lock().unwrap());
    }
    assert_eq!(cache.count_cached(&(12..16).collect::<Vec<_>>()), 4, "read ahead into RAM");
    for r in 9..16 {
        vol.read(r * RS, &mut buf).unwrap();
        assert!(buf[..] == data[(r * RS) as usize..((r + 1) * RS) as usize], "record {r}");
    }
    // The stream goes on past the unit (zfetch reads ahead); within it,
    // nothing more from the backing store.
    assert_eq!((9..12).map(times_read).sum::<usize>(), 0, "records on L2 read from L2");
    assert!([8, 12, 13, 14, 15].into_iter().all(|r| times_read(r) == 1), "read once");
}
