//! The intent log's decoders: never a panic, and what decodes re-encodes to
//! the same bytes.
//!
//! Bytes are decoded as they come (the checksum checks themselves), then
//! sealed with the checksums they would carry, so the fuzzer reaches the
//! header fields and the chunk's entry parser behind the checksums. The
//! first input byte steers the second pass: bit 0 forces the header's
//! magic and version, bit 1 the chunk's magic, sequence and position,
//! bit 2 makes the chunk's length field its real length.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zil::format::{
    decode_chunk_body, decode_chunk_header, encode_chunk, log_seed, seal_chunk, FormatError, Header,
    CHUNK_HEADER, CHUNK_MAGIC, HEADER_MAGIC, HEADER_SIZE, VERSION,
};

const SEQ: u64 = 1;
const LPOS: u64 = 0;

fn put(b: &mut [u8], at: usize, v: &[u8]) {
    if let Some(dst) = b.get_mut(at..at + v.len()) {
        dst.copy_from_slice(v);
    }
}

fn check_header(bytes: &[u8], sealed: bool) {
    match Header::decode(bytes) {
        Ok(h) => {
            if let Ok(again) = h.encode() {
                assert_eq!(Header::decode(&again).ok(), Some(h));
            }
        }
        Err(FormatError::Checksum) if sealed => panic!("a sealed header failed its checksum"),
        Err(_) => {}
    }
}

fn check_chunk(bytes: &[u8], seed: u64, sealed: bool) {
    match decode_chunk_header(bytes, seed, SEQ, LPOS) {
        Err(FormatError::Checksum) if sealed => panic!("a sealed chunk header failed its checksum"),
        _ => {}
    }
    match decode_chunk_body(bytes, seed) {
        Ok(entries) => {
            // A body that decodes is re-encoded with the same entries.
            let chunk = encode_chunk(seed, SEQ, LPOS, 1, &entries);
            assert_eq!(decode_chunk_body(&chunk, seed).ok(), Some(entries));
        }
        Err(FormatError::Checksum) if sealed => panic!("a sealed chunk body failed its checksum"),
        Err(_) => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let seed = log_seed(1, 2);
    check_header(rest, false);
    check_chunk(rest, seed, false);

    let mut h = rest.to_vec();
    if mode & 1 != 0 {
        put(&mut h, 0, HEADER_MAGIC);
        put(&mut h, 8, &VERSION.to_le_bytes());
    }
    Header::seal(&mut h);
    check_header(&h, h.len() >= HEADER_SIZE);

    let mut c = rest.to_vec();
    if mode & 2 != 0 {
        put(&mut c, 0, CHUNK_MAGIC);
        put(&mut c, 8, &SEQ.to_le_bytes());
        put(&mut c, 16, &LPOS.to_le_bytes());
    }
    if mode & 4 != 0 {
        let len = c.len() as u32;
        put(&mut c, 24, &len.to_le_bytes());
    }
    seal_chunk(&mut c, seed);
    check_chunk(&c, seed, c.len() >= CHUNK_HEADER);
});
