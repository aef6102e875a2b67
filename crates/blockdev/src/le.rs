//! Little-endian integers at byte offsets of an on-disk structure, for the
//! formats kept on devices (L2 headers and log blocks, the intent log).
//! Offsets come from the format's own checked layout; out of range panics.

pub fn get_u16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

pub fn get_u32(b: &[u8], at: usize) -> u32 {
    let mut x = [0u8; 4];
    x.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(x)
}

pub fn get_u64(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

pub fn put_u16(b: &mut [u8], at: usize, v: u16) {
    put_bytes(b, at, &v.to_le_bytes());
}

pub fn put_u32(b: &mut [u8], at: usize, v: u32) {
    put_bytes(b, at, &v.to_le_bytes());
}

pub fn put_u64(b: &mut [u8], at: usize, v: u64) {
    put_bytes(b, at, &v.to_le_bytes());
}

pub fn put_bytes(b: &mut [u8], at: usize, v: &[u8]) {
    b[at..at + v.len()].copy_from_slice(v);
}
