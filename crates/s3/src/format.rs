//! The manifest and lease objects of a chunked disk, byte by byte as
//! docs/s3-backing.md gives them (little-endian, xxh3-64 checksummed).

use blockdev::owner::truncate_utf8;
use xxhash_rust::xxh3::xxh3_64_with_seed;

pub const MANIFEST_LEN: usize = 128;
pub const LEASE_LEN: usize = 256;
const MANIFEST_MAGIC: &[u8; 8] = b"ARCS3MAN";
const LEASE_MAGIC: &[u8; 8] = b"ARCS3LSE";
const MANIFEST_SEED: u64 = 0x0041_5243_5333_4d4e;
const LEASE_SEED: u64 = 0x0041_5243_5333_4c53;
const HEAD_MAGIC: &[u8; 8] = b"ARCS3HED";
const HEAD_SEED: u64 = 0x0041_5243_5333_4844;
/// The head's fixed part: magic to flags.
const HEAD_FIXED: usize = 72;
/// The largest head a writer writes and a reader takes.
pub const HEAD_MAX: usize = 65536;
const VERSION: u32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Manifest {
    pub disk_uuid: [u8; 16],
    pub size: u64,
    pub chunk_size: u64,
    pub created: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub held: bool,
    pub disk_uuid: [u8; 16],
    pub token: [u8; 16],
    pub pid: u32,
    pub renew_period_ms: u32,
    pub proc_start: u64,
    pub acquired_ms: u64,
    pub renewed_ms: u64,
    pub renewals: u64,
    pub generation: u64,
    pub host: String,
}

/// What one generation did to one chunk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChunkChange {
    /// Written whole; the ETag the PUT returned.
    Written(String),
    Deleted,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadEntry {
    pub generation: u64,
    pub chunk: u64,
    pub change: ChunkChange,
}

/// The head object (`PREFIX/arcache-head`): the writer's last committed
/// generation and the chunks the last few generations changed, for
/// read-only servers to follow (docs/s3-backing.md, "Generations and the
/// head object").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    pub disk_uuid: [u8; 16],
    pub token: [u8; 16],
    pub generation: u64,
    /// The oldest generation whose changes `entries` lists.
    pub oldest: u64,
    /// Some generation in `oldest..=generation` changed more than the
    /// list holds: a reader that needs it lists the chunks again.
    pub overflow: bool,
    pub entries: Vec<HeadEntry>,
}

/// One entry's bytes: generation, chunk, kind, ETag length, ETag.
pub fn head_entry_len(e: &HeadEntry) -> usize {
    18 + match &e.change {
        ChunkChange::Written(etag) => etag.len(),
        ChunkChange::Deleted => 0,
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn arr16(b: &[u8], at: usize) -> [u8; 16] {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[at..at + 16]);
    a
}

/// Checks length, magic, version and checksum common to both objects.
fn check(b: &[u8], len: usize, magic: &[u8; 8], seed: u64, what: &str) -> Result<(), String> {
    if b.len() != len {
        return Err(format!("{what} is {} bytes, not {len}", b.len()));
    }
    if &b[..8] != magic {
        return Err(format!("{what} has no {} magic", String::from_utf8_lossy(magic)));
    }
    if u32_at(b, 8) != VERSION || u32_at(b, 12) as usize != len {
        return Err(format!("{what} is version {}, this build reads {VERSION}", u32_at(b, 8)));
    }
    if xxh3_64_with_seed(&b[..len - 8], seed) != u64_at(b, len - 8) {
        return Err(format!("{what} fails its checksum"));
    }
    Ok(())
}

/// Makes `b` (resized to the manifest's length) carry the manifest's
/// magic, version, length and checksum: for fuzzing past those checks.
pub fn seal_manifest(b: &mut Vec<u8>) {
    seal_as(b, MANIFEST_LEN, MANIFEST_MAGIC, MANIFEST_SEED);
}

/// [`seal_manifest`] for the lease.
pub fn seal_lease(b: &mut Vec<u8>) {
    seal_as(b, LEASE_LEN, LEASE_MAGIC, LEASE_SEED);
}

fn seal_as(b: &mut Vec<u8>, len: usize, magic: &[u8; 8], seed: u64) {
    b.resize(len, 0);
    b[..8].copy_from_slice(magic);
    b[8..12].copy_from_slice(&VERSION.to_le_bytes());
    b[12..16].copy_from_slice(&(len as u32).to_le_bytes());
    seal(b, seed);
}

fn seal(b: &mut [u8], seed: u64) {
    let n = b.len();
    let sum = xxh3_64_with_seed(&b[..n - 8], seed);
    b[n - 8..].copy_from_slice(&sum.to_le_bytes());
}

impl Manifest {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; MANIFEST_LEN];
        b[..8].copy_from_slice(MANIFEST_MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(MANIFEST_LEN as u32).to_le_bytes());
        b[16..32].copy_from_slice(&self.disk_uuid);
        b[32..40].copy_from_slice(&self.size.to_le_bytes());
        b[40..48].copy_from_slice(&self.chunk_size.to_le_bytes());
        b[48..56].copy_from_slice(&self.created.to_le_bytes());
        seal(&mut b, MANIFEST_SEED);
        b
    }

    pub fn decode(b: &[u8]) -> Result<Manifest, String> {
        check(b, MANIFEST_LEN, MANIFEST_MAGIC, MANIFEST_SEED, "the manifest")?;
        let m = Manifest {
            disk_uuid: arr16(b, 16),
            size: u64_at(b, 32),
            chunk_size: u64_at(b, 40),
            created: u64_at(b, 48),
        };
        if !m.chunk_size.is_power_of_two() || !(64 << 10..=64 << 20).contains(&m.chunk_size) || m.size == 0 {
            return Err(format!(
                "the manifest's chunk size {} or size {} is out of range",
                m.chunk_size, m.size
            ));
        }
        Ok(m)
    }
}

impl Lease {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; LEASE_LEN];
        b[..8].copy_from_slice(LEASE_MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(LEASE_LEN as u32).to_le_bytes());
        b[16..20].copy_from_slice(&(if self.held { 1u32 } else { 2 }).to_le_bytes());
        b[20..36].copy_from_slice(&self.disk_uuid);
        b[36..52].copy_from_slice(&self.token);
        b[52..56].copy_from_slice(&self.pid.to_le_bytes());
        b[56..60].copy_from_slice(&self.renew_period_ms.to_le_bytes());
        b[64..72].copy_from_slice(&self.proc_start.to_le_bytes());
        b[72..80].copy_from_slice(&self.acquired_ms.to_le_bytes());
        b[80..88].copy_from_slice(&self.renewed_ms.to_le_bytes());
        b[88..96].copy_from_slice(&self.renewals.to_le_bytes());
        b[96..104].copy_from_slice(&self.generation.to_le_bytes());
        let host = truncate_utf8(&self.host, 64);
        b[104] = host.len() as u8;
        b[112..112 + host.len()].copy_from_slice(host.as_bytes());
        seal(&mut b, LEASE_SEED);
        b
    }

    pub fn decode(b: &[u8]) -> Result<Lease, String> {
        check(b, LEASE_LEN, LEASE_MAGIC, LEASE_SEED, "the lease")?;
        let state = u32_at(b, 16);
        if state != 1 && state != 2 {
            return Err(format!("the lease has state {state}"));
        }
        let host_len = usize::from(b[104]);
        // A writer always writes UTF-8 of at most 64 bytes; anything else is
        // not a lease this format makes (a lossy reading would not round-trip).
        let host =
            b.get(112..112 + host_len).filter(|_| host_len <= 64).and_then(|h| std::str::from_utf8(h).ok());
        let Some(host) = host else {
            return Err("the lease's host name is not UTF-8 of at most 64 bytes".into());
        };
        Ok(Lease {
            held: state == 1,
            disk_uuid: arr16(b, 20),
            token: arr16(b, 36),
            pid: u32_at(b, 52),
            renew_period_ms: u32_at(b, 56),
            proc_start: u64_at(b, 64),
            acquired_ms: u64_at(b, 72),
            renewed_ms: u64_at(b, 80),
            renewals: u64_at(b, 88),
            generation: u64_at(b, 96),
            host: host.to_string(),
        })
    }
}

impl Head {
    /// The encoded length: fixed part, entries, checksum.
    pub fn encoded_len(&self) -> usize {
        HEAD_FIXED + self.entries.iter().map(head_entry_len).sum::<usize>() + 8
    }

    /// The head's bytes; an error if it would exceed [`HEAD_MAX`] or an
    /// ETag is longer than 255 bytes (the writer drops entries first).
    pub fn encode(&self) -> Result<Vec<u8>, String> {
        let len = self.encoded_len();
        if len > HEAD_MAX {
            return Err(format!("a head of {len} bytes exceeds {HEAD_MAX}"));
        }
        let mut b = Vec::with_capacity(len);
        b.extend_from_slice(HEAD_MAGIC);
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.extend_from_slice(&(len as u32).to_le_bytes());
        b.extend_from_slice(&self.disk_uuid);
        b.extend_from_slice(&self.token);
        b.extend_from_slice(&self.generation.to_le_bytes());
        b.extend_from_slice(&self.oldest.to_le_bytes());
        b.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        b.extend_from_slice(&u32::from(self.overflow).to_le_bytes());
        for e in &self.entries {
            b.extend_from_slice(&e.generation.to_le_bytes());
            b.extend_from_slice(&e.chunk.to_le_bytes());
            let etag = match &e.change {
                ChunkChange::Written(etag) => {
                    b.push(1);
                    etag.as_str()
                }
                ChunkChange::Deleted => {
                    b.push(2);
                    ""
                }
            };
            let n = u8::try_from(etag.len()).map_err(|_| format!("an ETag of {} bytes", etag.len()))?;
            b.push(n);
            b.extend_from_slice(etag.as_bytes());
        }
        b.extend_from_slice(&[0; 8]);
        seal(&mut b, HEAD_SEED);
        Ok(b)
    }

    pub fn decode(b: &[u8]) -> Result<Head, String> {
        if b.len() < HEAD_FIXED + 8 || b.len() > HEAD_MAX {
            return Err(format!("the head is {} bytes, not {} to {HEAD_MAX}", b.len(), HEAD_FIXED + 8));
        }
        check(b, b.len(), HEAD_MAGIC, HEAD_SEED, "the head")?;
        let count = u32_at(b, 64) as usize;
        let flags = u32_at(b, 68);
        if flags > 1 {
            return Err(format!("the head has unknown flags {flags:#x}"));
        }
        let (generation, oldest) = (u64_at(b, 48), u64_at(b, 56));
        if oldest > generation.saturating_add(1) {
            return Err(format!(
                "the head lists generations from {oldest}, past its generation {generation}"
            ));
        }
        let body = &b[HEAD_FIXED..b.len() - 8];
        let mut at = 0usize;
        let mut entries = Vec::with_capacity(count.min(body.len() / 18));
        for _ in 0..count {
            let fixed = body.get(at..at + 18).ok_or("the head's entries run past its end")?;
            let etag_len = usize::from(fixed[17]);
            let etag = body.get(at + 18..at + 18 + etag_len).ok_or("the head's entries run past its end")?;
            let entry_gen = u64_at(fixed, 0);
            if entry_gen < oldest || entry_gen > generation {
                return Err(format!(
                    "a head entry of generation {entry_gen} outside {oldest}..={generation}"
                ));
            }
            let change = match (fixed[16], etag_len) {
                (1, 1..) => ChunkChange::Written(
                    std::str::from_utf8(etag).map_err(|_| "a head entry's ETag is not UTF-8")?.to_string(),
                ),
                (2, 0) => ChunkChange::Deleted,
                (kind, n) => return Err(format!("a head entry of kind {kind} with an ETag of {n} bytes")),
            };
            entries.push(HeadEntry { generation: entry_gen, chunk: u64_at(fixed, 8), change });
            at += 18 + etag_len;
        }
        if at != body.len() {
            return Err("the head has bytes after its entries".into());
        }
        Ok(Head {
            disk_uuid: arr16(b, 16),
            token: arr16(b, 32),
            generation,
            oldest,
            overflow: flags == 1,
            entries,
        })
    }
}

/// Makes `b` carry the head's magic, version, its own length and checksum
/// (for fuzzing past those checks); `b` is padded to the fixed part.
pub fn seal_head(b: &mut Vec<u8>) {
    if b.len() < HEAD_FIXED + 8 {
        b.resize(HEAD_FIXED + 8, 0);
    }
    b.truncate(HEAD_MAX);
    let len = b.len();
    seal_as(b, len, HEAD_MAGIC, HEAD_SEED);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_objects_round_trip_and_refuse_damage() {
        let m = Manifest { disk_uuid: [7; 16], size: 1 << 30, chunk_size: 4 << 20, created: 1_700_000_000 };
        let b = m.encode();
        assert_eq!(b.len(), MANIFEST_LEN);
        assert_eq!(Manifest::decode(&b), Ok(m));
        let l = Lease {
            held: true,
            disk_uuid: [7; 16],
            token: [9; 16],
            pid: 4242,
            renew_period_ms: 10_000,
            proc_start: 1,
            acquired_ms: 2,
            renewed_ms: 3,
            renewals: 4,
            generation: 5,
            host: "nas2".into(),
        };
        let lb = l.encode();
        assert_eq!(Lease::decode(&lb), Ok(l));
        for i in [0, 9, 40, 100, 127] {
            let mut bad = b.clone();
            bad[i] ^= 1;
            assert!(Manifest::decode(&bad).is_err(), "byte {i} flipped");
        }
        assert!(Manifest::decode(&lb).is_err() && Lease::decode(&b).is_err() && Lease::decode(&[]).is_err());
        // The fuzzer's first finding: a host name that is not UTF-8.
        let mut odd = lb.clone();
        odd[112] = 0xFF;
        let mut odd = odd[..248].to_vec();
        seal_lease(&mut odd);
        assert!(Lease::decode(&odd).is_err_and(|e| e.contains("UTF-8")));
        let mut junk = vec![0xAB; 10];
        seal_lease(&mut junk);
        assert!(
            Lease::decode(&junk).is_err_and(|e| e.contains("state")),
            "sealed junk gets past the checksum"
        );
    }

    #[test]
    fn a_head_round_trips_and_refuses_damage() {
        let h = Head {
            disk_uuid: [7; 16],
            token: [9; 16],
            generation: 12,
            oldest: 11,
            overflow: true,
            entries: vec![
                HeadEntry { generation: 11, chunk: 3, change: ChunkChange::Written("\"abc\"".into()) },
                HeadEntry { generation: 12, chunk: 1 << 40, change: ChunkChange::Deleted },
            ],
        };
        let b = h.encode().unwrap();
        assert_eq!(b.len(), h.encoded_len());
        assert_eq!(Head::decode(&b), Ok(h.clone()));
        for i in [0, 9, 13, 50, 70, 80, b.len() - 1] {
            let mut bad = b.clone();
            bad[i] ^= 1;
            assert!(Head::decode(&bad).is_err(), "byte {i} flipped");
        }
        // Entries outside the generations the head says it lists.
        let mut odd = h.clone();
        odd.entries[0].generation = 10;
        assert!(Head::decode(&odd.encode().unwrap()).is_err_and(|e| e.contains("outside")));
        let mut big = h.clone();
        big.entries = (0..4000)
            .map(|i| HeadEntry { generation: 12, chunk: i, change: ChunkChange::Written("x".repeat(20)) })
            .collect();
        assert!(big.encode().is_err_and(|e| e.contains("exceeds")));
        let empty = Head { entries: Vec::new(), oldest: 13, ..h };
        assert_eq!(Head::decode(&empty.encode().unwrap()), Ok(empty));
    }

    /// The fuzz target's seeds are real encodings (fuzz/corpus/s3_formats).
    #[test]
    fn fuzz_seeds_decode() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../fuzz/corpus/s3_formats");
        let (m, l) = (
            std::fs::read(format!("{dir}/manifest")).unwrap(),
            std::fs::read(format!("{dir}/lease")).unwrap(),
        );
        assert!(Manifest::decode(&m).is_ok() && Lease::decode(&l).is_ok());
        let h = std::fs::read(format!("{dir}/head")).unwrap();
        assert!(Head::decode(&h).is_ok_and(|h| h.entries.len() == 2));
    }
}
