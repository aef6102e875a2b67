//! The RAM index of records on L2 devices: an open-addressing hash table of
//! 24-byte slots (key, checksum, packed location) with linear probing.
//!
//! OpenZFS spends 96 bytes per L2-only block; our budget is 48 including the
//! table's slack. A general-purpose map doubles its capacity and so sits
//! anywhere between half and seven-eighths full; this one grows by a quarter
//! and shrinks when it falls below 60 % full, so a slot costs between
//! 24/0.85 and 24/0.6 bytes: 28 to 40 bytes per record.

/// No engine key reaches this value (export ids stay below 0xFFFF).
const EMPTY: u64 = u64::MAX;
const MAX_LOAD: f64 = 0.85;
const MIN_LOAD: f64 = 0.6;
const MIN_CAPACITY: usize = 64;

/// Where a record lives on L2 and how to check it, packed into 16 bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct L2Ptr {
    /// Checksum of the stored blob, seeded with the key.
    pub cksum: u64,
    bits: u64,
}

// Layout of `bits`: daddr in 512-byte sectors (40 bits, 512 TiB), blob size in
// sectors (12 bits, up to 2048 = 1 MiB + framing rounded), device (4 bits),
// then flags.
const DADDR_BITS: u32 = 40;
const PSIZE_SHIFT: u32 = 40;
const DEV_SHIFT: u32 = 52;
const FLAG_RAW: u64 = 1 << 56;
const FLAG_COMPRESSED: u64 = 1 << 57;
const FLAG_PREFETCH: u64 = 1 << 58;
const FLAG_MFU: u64 = 1 << 59;
/// log2(logical size) - 12, for `l2_size` accounting without more RAM.
const LSHIFT_SHIFT: u32 = 60;
pub const MAX_DEVICES: usize = 16;
pub const SECTOR: u64 = 512;
/// The largest blob one entry can describe.
pub const MAX_BLOB: u64 = 4095 * SECTOR;

/// Flags remembered with an L2 copy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlobFlags {
    /// The blob is the record's bytes exactly, without a length frame.
    pub raw: bool,
    pub compressed: bool,
    pub prefetch: bool,
    pub mfu: bool,
    /// The record's logical size is `1 << (12 + lshift)` (4K..1M, 0..=8);
    /// a short last record of an export is counted at full size.
    pub lshift: u8,
}

impl L2Ptr {
    /// `daddr` and `blob_len` must be multiples of [`SECTOR`].
    pub fn new(dev: usize, daddr: u64, blob_len: u64, flags: BlobFlags, cksum: u64) -> L2Ptr {
        assert!(dev < MAX_DEVICES && daddr.is_multiple_of(SECTOR) && blob_len.is_multiple_of(SECTOR));
        assert!(blob_len > 0 && blob_len <= MAX_BLOB && daddr / SECTOR < 1 << DADDR_BITS);
        let mut bits = (daddr / SECTOR) | ((blob_len / SECTOR) << PSIZE_SHIFT) | ((dev as u64) << DEV_SHIFT);
        if flags.compressed {
            bits |= FLAG_COMPRESSED;
        }
        if flags.raw {
            bits |= FLAG_RAW;
        }
        if flags.prefetch {
            bits |= FLAG_PREFETCH;
        }
        if flags.mfu {
            bits |= FLAG_MFU;
        }
        bits |= u64::from(flags.lshift.min(15)) << LSHIFT_SHIFT;
        L2Ptr { cksum, bits }
    }

    pub fn daddr(&self) -> u64 {
        (self.bits & ((1 << DADDR_BITS) - 1)) * SECTOR
    }
    pub fn blob_len(&self) -> u64 {
        ((self.bits >> PSIZE_SHIFT) & 0xfff) * SECTOR
    }
    pub fn dev(&self) -> usize {
        ((self.bits >> DEV_SHIFT) & 0xf) as usize
    }
    pub fn flags(&self) -> BlobFlags {
        BlobFlags {
            raw: self.bits & FLAG_RAW != 0,
            compressed: self.bits & FLAG_COMPRESSED != 0,
            prefetch: self.bits & FLAG_PREFETCH != 0,
            mfu: self.bits & FLAG_MFU != 0,
            lshift: (self.bits >> LSHIFT_SHIFT) as u8,
        }
    }

    /// Whether the copy is checked half by half, so either half can be read
    /// alone (docs/format.md).
    pub fn split(&self) -> bool {
        crate::format::split_blob(self.flags().raw, self.blob_len())
    }

    /// Logical bytes this entry stands for.
    pub fn lsize(&self) -> u64 {
        1 << (12 + (self.bits >> LSHIFT_SHIFT))
    }
}

#[derive(Clone, Copy)]
struct Slot {
    key: u64,
    ptr: L2Ptr,
}

const EMPTY_SLOT: Slot = Slot { key: EMPTY, ptr: L2Ptr { cksum: 0, bits: 0 } };

pub struct L2Index {
    slots: Vec<Slot>,
    len: usize,
}

impl Default for L2Index {
    fn default() -> Self {
        Self::new()
    }
}

impl L2Index {
    pub fn new() -> Self {
        L2Index { slots: vec![EMPTY_SLOT; MIN_CAPACITY], len: 0 }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// RAM held by the table itself.
    pub fn allocated_bytes(&self) -> u64 {
        (self.slots.capacity() * std::mem::size_of::<Slot>()) as u64
    }

    fn home(&self, key: u64) -> usize {
        let h = key.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (key >> 29);
        let h = h.wrapping_mul(0xBF58_476D_1CE4_E5B9);
        ((h as u128 * self.slots.len() as u128) >> 64) as usize
    }

    fn find(&self, key: u64) -> Option<usize> {
        let cap = self.slots.len();
        let mut i = self.home(key);
        loop {
            let k = self.slots[i].key;
            if k == key {
                return Some(i);
            }
            if k == EMPTY {
                return None;
            }
            i = if i + 1 == cap { 0 } else { i + 1 };
        }
    }

    pub fn get(&self, key: u64) -> Option<L2Ptr> {
        self.find(key).map(|i| self.slots[i].ptr)
    }

    /// Inserts or replaces; returns the previous location.
    pub fn insert(&mut self, key: u64, ptr: L2Ptr) -> Option<L2Ptr> {
        assert_ne!(key, EMPTY, "reserved key");
        if (self.len + 1) as f64 > self.slots.len() as f64 * MAX_LOAD {
            self.resize(((self.slots.len() as f64 * 1.25) as usize).max(MIN_CAPACITY));
        }
        let cap = self.slots.len();
        let mut i = self.home(key);
        loop {
            let k = self.slots[i].key;
            if k == key {
                return Some(std::mem::replace(&mut self.slots[i].ptr, ptr));
            }
            if k == EMPTY {
                self.slots[i] = Slot { key, ptr };
                self.len += 1;
                return None;
            }
            i = if i + 1 == cap { 0 } else { i + 1 };
        }
    }

    /// Removes `key`, shifting later members of its probe run back so that
    /// no tombstones are needed.
    pub fn remove(&mut self, key: u64) -> Option<L2Ptr> {
        let mut hole = self.find(key)?;
        let old = self.slots[hole].ptr;
        let cap = self.slots.len();
        let mut k = if hole + 1 == cap { 0 } else { hole + 1 };
        while self.slots[k].key != EMPTY {
            let home = self.home(self.slots[k].key);
            // The entry at k may fill the hole if its home is not in (hole, k].
            let movable = if hole <= k { home <= hole || home > k } else { home <= hole && home > k };
            if movable {
                self.slots[hole] = self.slots[k];
                hole = k;
            }
            k = if k + 1 == cap { 0 } else { k + 1 };
        }
        self.slots[hole] = EMPTY_SLOT;
        self.len -= 1;
        if self.slots.len() > MIN_CAPACITY && (self.len as f64) < self.slots.len() as f64 * MIN_LOAD {
            self.resize(((self.len as f64 / 0.75) as usize).max(MIN_CAPACITY));
        }
        Some(old)
    }

    /// Makes room for `additional` more records in one step, for a caller
    /// that knows roughly how many are coming (a rebuild): growing a quarter
    /// at a time would rehash the table dozens of times on the way.
    pub fn reserve(&mut self, additional: usize) {
        let want = ((self.len + additional) as f64 / MAX_LOAD).ceil() as usize + 1;
        if want > self.slots.len() {
            self.resize(want);
        }
    }

    /// Gives back what a generous [`L2Index::reserve`] left unused, so the
    /// table is back within its bytes-per-record budget.
    pub fn shrink_to_budget(&mut self) {
        if self.slots.len() > MIN_CAPACITY && (self.len as f64) < self.slots.len() as f64 * MIN_LOAD {
            self.resize(((self.len as f64 / 0.75) as usize).max(MIN_CAPACITY));
        }
    }

    fn resize(&mut self, capacity: usize) {
        let old = std::mem::take(&mut self.slots);
        let mut slots = Vec::with_capacity(capacity);
        slots.resize(capacity, EMPTY_SLOT);
        self.slots = slots;
        self.len = 0;
        for s in old.into_iter().filter(|s| s.key != EMPTY) {
            self.insert(s.key, s.ptr);
        }
    }

    /// Every (key, location); for tests and dumps.
    pub fn iter(&self) -> impl Iterator<Item = (u64, L2Ptr)> + '_ {
        self.slots.iter().filter(|s| s.key != EMPTY).map(|s| (s.key, s.ptr))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_24_bytes() {
        assert_eq!(std::mem::size_of::<Slot>(), 24);
    }

    #[test]
    fn pointer_fields_roundtrip() {
        let f = BlobFlags { raw: true, compressed: true, prefetch: false, mfu: true, lshift: 2 };
        let p = L2Ptr::new(15, (1 << 40) * 512 - 512, MAX_BLOB, f, 77);
        assert_eq!(p.dev(), 15);
        assert_eq!(p.daddr(), (1 << 40) * 512 - 512);
        assert_eq!(p.blob_len(), MAX_BLOB);
        assert_eq!(p.flags(), f);
        assert_eq!(p.cksum, 77);
        assert_eq!(p.lsize(), 16384);
    }

    #[test]
    fn reserve_then_shrink_keeps_every_entry_and_the_budget() {
        let mut ix = L2Index::new();
        let p = L2Ptr::new(0, 0, 512, BlobFlags::default(), 1);
        ix.reserve(400_000);
        let cap = ix.slots.len();
        for k in 0..100_000u64 {
            ix.insert(k * 31, p);
        }
        assert_eq!(ix.slots.len(), cap, "no resize within the reservation");
        ix.shrink_to_budget();
        let per = ix.allocated_bytes() as f64 / ix.len() as f64;
        assert!(per <= 40.5, "{per} bytes per entry after the shrink");
        assert!((0..100_000u64).all(|k| ix.get(k * 31) == Some(p)));
        assert_eq!(ix.len(), 100_000);
    }

    #[test]
    fn bytes_per_entry_stay_in_budget_at_scale() {
        let mut ix = L2Index::new();
        let p = L2Ptr::new(0, 0, 512, BlobFlags::default(), 1);
        for k in 0..1_000_000u64 {
            ix.insert(k * 7919, p);
            if k % 50_000 == 0 && k > 0 {
                let per = ix.allocated_bytes() as f64 / ix.len() as f64;
                assert!(per <= 40.5, "{per} bytes per entry at {k}");
            }
        }
        for k in 0..600_000u64 {
            ix.remove(k * 7919);
        }
        let per = ix.allocated_bytes() as f64 / ix.len() as f64;
        assert!(per <= 40.5, "{per} bytes per entry after removals");
    }
}
