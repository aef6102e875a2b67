//! One cached record: its bytes as stored (LZ4-compressed when that saves at
//! least an eighth, as OpenZFS requires) and its logical size. The same
//! stored bytes go to L2, so feeding never recompresses.

use std::sync::atomic::{AtomicU16, AtomicU32, Ordering::Relaxed};

/// The tag [`Record::set_fed`] keeps for L2 drop generation `generation`:
/// never 0, which means "never fed".
pub(crate) fn fed_tag(generation: u64) -> u16 {
    (generation % u64::from(u16::MAX)) as u16 + 1
}

#[derive(Debug)]
pub struct Record {
    /// Exactly the stored length: an `Arc<[u8]>` would put its counters in
    /// the same allocation, and 16 KiB + 16 bytes falls into a 20 KiB
    /// allocator size class, a quarter of the ARC wasted.
    stored: Box<[u8]>,
    lsize: u32,
    compressed: bool,
    /// The L2 drop generation (plus one, modulo 2^16) at which the feed
    /// last found this record on L2 or sent it there; 0: never, or its
    /// bytes changed since (see `L2Arc::drop_generation`). In the struct's
    /// padding, so it costs no memory. Wrapping can at worst make the feed
    /// pass over a record whose copy was lost, never serve anything wrong:
    /// reads look L2's index up themselves.
    fed: AtomicU16,
}

/// A decompression failure: the stored bytes are not a valid LZ4 block of
/// the expected size.
#[derive(Debug, thiserror::Error)]
#[error("record does not decompress to {lsize} bytes")]
pub struct Corrupt {
    pub lsize: u32,
}

/// Compresses the first eighth of the record (at least 2 KiB) as a probe:
/// incompressible data (media, encrypted or already compressed files) then
/// costs an eighth of a full attempt, which matters at hundreds of MB/s on
/// two cores.
fn probe_compresses(data: &[u8]) -> bool {
    let n = (data.len() / 8).max(2048).min(data.len());
    let probe = &data[..n];
    lz4_flex::block::compress(probe).len() < n - n / 16
}

/// Compression probes of one export's reads: after [`ProbeSkip::STREAK`]
/// records in a row that did not compress, only one in
/// [`ProbeSkip::EVERY`] is probed until one compresses again. A stream of
/// media or encrypted data then costs an eighth of the probes: probing
/// was about 4 % of the server's CPU on a cold sequential pass of random
/// bytes (perf), for nothing. Records not probed are kept raw,
/// which is always right; compressible data among incompressible data may
/// stay raw a while longer.
#[derive(Debug, Default)]
pub(crate) struct ProbeSkip {
    misses: AtomicU32,
    tick: AtomicU32,
}

impl ProbeSkip {
    pub(crate) const STREAK: u32 = 64;
    pub(crate) const EVERY: u32 = 16;

    /// Whether the next record is worth a probe.
    pub(crate) fn probe(&self) -> bool {
        self.misses.load(Relaxed) < Self::STREAK
            || self.tick.fetch_add(1, Relaxed).is_multiple_of(Self::EVERY)
    }

    /// What a probe found.
    pub(crate) fn note(&self, compressed: bool) {
        if compressed {
            self.misses.store(0, Relaxed);
        } else if self.misses.load(Relaxed) < Self::STREAK {
            self.misses.fetch_add(1, Relaxed);
        }
    }

    /// `data` compressed if `compress`, this export's probes say it is worth
    /// trying, and it pays; `None`: keep it as it is.
    pub(crate) fn compressed_of(&self, data: &[u8], compress: bool) -> Option<Record> {
        if !compress || !self.probe() {
            return None;
        }
        let rec = Record::compressed_of(data, true);
        self.note(rec.is_some());
        rec
    }
}

impl AsRef<[u8]> for Record {
    fn as_ref(&self) -> &[u8] {
        &self.stored
    }
}

impl Record {
    /// Whether the feed found this record on L2 (or sent it) at the drop
    /// generation `tag` stands for (see [`fed_tag`]).
    pub(crate) fn fed_at(&self, tag: u16) -> bool {
        self.fed.load(Relaxed) == tag
    }

    pub(crate) fn set_fed(&self, tag: u16) {
        self.fed.store(tag, Relaxed);
    }

    /// Keeps `data` as is, or compressed if `compress` and it pays.
    pub fn new(data: &[u8], compress: bool) -> Record {
        Record::compressed_of(data, compress).unwrap_or_else(|| Record::raw_boxed(data.into()))
    }

    /// `data` compressed, if `compress` and it pays; `None` when it is to
    /// be kept as it is.
    pub fn compressed_of(data: &[u8], compress: bool) -> Option<Record> {
        if !(compress && data.len() >= 1024 && probe_compresses(data)) {
            return None;
        }
        let c = lz4_flex::block::compress(data);
        (c.len() <= data.len() - data.len() / 8).then(|| Record {
            stored: c.into_boxed_slice(),
            lsize: data.len() as u32,
            compressed: true,
            fed: AtomicU16::new(0),
        })
    }

    /// Keeps `data` uncompressed, without copying it.
    pub fn raw(data: Vec<u8>) -> Record {
        Record::raw_boxed(data.into_boxed_slice())
    }

    /// Keeps `data` uncompressed, without copying it.
    pub fn raw_boxed(data: Box<[u8]>) -> Record {
        let lsize = data.len() as u32;
        Record { stored: data, lsize, compressed: false, fed: AtomicU16::new(0) }
    }

    /// Writes `bytes` over logical bytes `at..` of an uncompressed record;
    /// false (nothing changed) for a compressed one or a range outside it.
    pub fn patch(&mut self, at: usize, bytes: &[u8]) -> bool {
        if self.compressed {
            return false;
        }
        match at.checked_add(bytes.len()).and_then(|end| self.stored.get_mut(at..end)) {
            Some(dst) => {
                dst.copy_from_slice(bytes);
                // New bytes: the feed must send them again.
                self.fed.store(0, Relaxed);
                true
            }
            None => false,
        }
    }

    /// A record read back from L2, checked by decompressing it once.
    pub fn from_stored(stored: Box<[u8]>, lsize: u32, compressed: bool) -> Result<Record, Corrupt> {
        let r = Record { stored, lsize, compressed, fed: AtomicU16::new(0) };
        if compressed {
            r.decompress()?;
        } else if r.stored.len() != lsize as usize {
            return Err(Corrupt { lsize });
        }
        Ok(r)
    }

    pub fn lsize(&self) -> u64 {
        u64::from(self.lsize)
    }

    /// Bytes held in RAM (and written to L2).
    pub fn psize(&self) -> u64 {
        self.stored.len() as u64
    }

    /// The buffer of a record kept as it is, for reuse; `None` for a
    /// compressed one.
    pub(crate) fn into_raw_buf(self) -> Option<Box<[u8]>> {
        (!self.compressed).then_some(self.stored)
    }

    pub fn is_compressed(&self) -> bool {
        self.compressed
    }

    pub fn stored(&self) -> &[u8] {
        &self.stored
    }

    fn decompress(&self) -> Result<Vec<u8>, Corrupt> {
        let mut out = vec![0u8; self.lsize as usize];
        match lz4_flex::block::decompress_into(&self.stored, &mut out) {
            Ok(n) if n == out.len() => Ok(out),
            _ => Err(Corrupt { lsize: self.lsize }),
        }
    }

    /// Copies logical bytes `from..from+out.len()` into `out`.
    pub fn copy_to(&self, from: usize, out: &mut [u8]) -> Result<(), Corrupt> {
        if self.compressed {
            let all = self.decompress()?;
            out.copy_from_slice(&all[from..from + out.len()]);
        } else {
            out.copy_from_slice(&self.stored[from..from + out.len()]);
        }
        Ok(())
    }

    /// The logical contents.
    pub fn to_vec(&self) -> Result<Vec<u8>, Corrupt> {
        if self.compressed {
            self.decompress()
        } else {
            Ok(self.stored.to_vec())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_feeds_mark_costs_no_memory() {
        assert_eq!(std::mem::size_of::<Record>(), 24, "the fed tag must stay in the padding");
    }

    /// 16 KiB that do not compress.
    fn noise() -> Vec<u8> {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        (0..16384)
            .map(|_| {
                arc_policy::xorshift(&mut x);
                x as u8
            })
            .collect()
    }

    #[test]
    fn probes_thin_out_after_a_streak_of_misses_and_come_back_with_a_hit() {
        let skip = ProbeSkip::default();
        let noise = noise();
        let zeros = vec![0u8; 16384];
        for _ in 0..ProbeSkip::STREAK {
            assert!(skip.compressed_of(&noise, true).is_none());
        }
        let probed = (0..ProbeSkip::EVERY * 4).filter(|_| skip.probe()).count() as u32;
        assert_eq!(probed, 4, "one probe in EVERY after the streak");
        // Compressible data again: found within EVERY records, and from
        // then on every record is probed.
        let found = (0..ProbeSkip::EVERY).position(|_| skip.compressed_of(&zeros, true).is_some());
        assert!(found.is_some(), "a compressible record went unprobed for a whole round");
        assert!((0..ProbeSkip::EVERY * 2).all(|_| skip.compressed_of(&zeros, true).is_some()));
        assert!(skip.compressed_of(&zeros, false).is_none(), "compression off");
    }

    #[test]
    fn fed_tags_are_never_the_unfed_zero() {
        for g in [0, 1, u64::from(u16::MAX) - 1, u64::from(u16::MAX), u64::MAX] {
            assert_ne!(fed_tag(g), 0, "generation {g}");
        }
        assert_ne!(fed_tag(7), fed_tag(8));
    }

    #[test]
    fn compresses_only_when_it_pays() {
        let zeros = vec![0u8; 16384];
        let r = Record::new(&zeros, true);
        assert!(r.is_compressed() && r.psize() < 1024);
        let mut out = vec![1u8; 100];
        r.copy_to(500, &mut out).unwrap();
        assert!(out.iter().all(|&b| b == 0));
        let noise = noise();
        let r = Record::new(&noise, true);
        assert!(!r.is_compressed());
        assert_eq!(r.to_vec().unwrap(), noise);
        assert!(!Record::new(&zeros, false).is_compressed());
        // Compressible only after the probe's window: kept raw, by design.
        let mut tail_zeros = noise.clone();
        tail_zeros[8192..].fill(0);
        assert!(!Record::new(&tail_zeros, true).is_compressed());
        let mut head_zeros = noise;
        head_zeros[..8192].fill(0);
        assert!(Record::new(&head_zeros, true).is_compressed());
    }

    #[test]
    fn only_uncompressed_records_are_patched_in_place() {
        let mut r = Record::raw(vec![1u8; 8192]);
        assert!(r.patch(4096, &[9u8; 512]));
        let v = r.to_vec().unwrap();
        assert!(v[4096..4608].iter().all(|&b| b == 9) && v[4608] == 1 && v[4095] == 1);
        assert!(!r.patch(8000, &[0u8; 512]), "past the end");
        let mut c = Record::new(&[0u8; 8192], true);
        assert!(c.is_compressed() && !c.patch(0, &[1u8; 16]));
        assert!(c.to_vec().unwrap().iter().all(|&b| b == 0));
    }

    #[test]
    fn stored_bytes_that_do_not_decompress_are_refused() {
        assert!(Record::from_stored(vec![0xff; 40].into(), 16384, true).is_err());
        assert!(Record::from_stored(vec![0; 40].into(), 16384, false).is_err());
        let r = Record::new(&[7u8; 8192], true);
        let back = Record::from_stored(r.stored().into(), 8192, true).unwrap();
        assert_eq!(back.to_vec().unwrap(), vec![7u8; 8192]);
    }
}
