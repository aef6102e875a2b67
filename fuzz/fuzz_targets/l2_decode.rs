//! The L2 device header, log block and abandoned-log mark decoders: never
//! a panic, and what decodes re-encodes to the same contents.
//!
//! Bytes are decoded twice: as they come (the checksum checks themselves),
//! then sealed with the checksum they would carry, so the fuzzer reaches
//! the field checks, the entry parser and the LZ4 path behind the checksum
//! (it cannot make bytes equal to an xxh3 of themselves). The first input
//! byte steers the second pass: bit 0 forces the header's magic and
//! version, bit 1 the log block's, bit 2 makes the block's entry count and
//! body lengths agree, bit 3 forces the mark's magic and version, so most
//! inputs get past those checks too.
#![no_main]

use arcache_l2::format::{
    log_seed, Abandoned, FormatError, Header, LogBlock, LogPtr, ENTRY_SIZE, HEADER_MAGIC, HEADER_SIZE, LOG_HEADER,
    LOG_MAGIC, MARK_MAGIC, MARK_SIZE, MAX_ENTRIES, VERSION,
};
use libfuzzer_sys::fuzz_target;

fn word(b: &[u8], at: usize) -> u64 {
    b.get(at..at + 8).map_or(0, |w| u64::from_le_bytes(w.try_into().unwrap_or([0; 8])))
}

fn put(b: &mut [u8], at: usize, v: &[u8]) {
    if let Some(dst) = b.get_mut(at..at + v.len()) {
        dst.copy_from_slice(v);
    }
}

fn check_header(bytes: &[u8], sealed: bool) {
    match Header::decode(bytes) {
        Ok(h) => {
            let again = h.encode().expect("a decoded header encodes");
            let back = Header::decode(&again).expect("an encoded header decodes");
            assert_eq!(back.encode().ok(), Some(again), "header encoding is not stable");
        }
        Err(FormatError::Checksum) if sealed => panic!("a sealed header failed its checksum"),
        Err(_) => {}
    }
}

fn check_block(bytes: &[u8], seed: u64, sealed: bool) {
    let ptr = LogPtr {
        lpos: word(bytes, 24),
        seq: word(bytes, 16),
        asize: bytes.len() as u32,
        cksum: word(bytes, 120),
    };
    match LogBlock::decode(bytes, &ptr, seed) {
        Ok(block) if block.entries.len() <= MAX_ENTRIES => {
            let (again, ptr2) = block.encode(seed);
            let back = LogBlock::decode(&again, &ptr2, seed).expect("an encoded block decodes");
            assert_eq!(back.entries, block.entries);
            assert_eq!(
                (back.seq, back.lpos, back.payload_start, back.prev),
                (block.seq, block.lpos, block.payload_start, block.prev)
            );
        }
        Ok(_) => panic!("a block decoded with more than MAX_ENTRIES entries"),
        Err(FormatError::Checksum) if sealed => panic!("a sealed block failed its checksum"),
        Err(_) => {}
    }
}

/// An abandoned-log mark: its contents as they come and sealed with their
/// checksum (with `forced`, after the magic and version are made right, so
/// most inputs reach the later checks), and its file name; what decodes
/// re-encodes the same.
fn check_mark(bytes: &[u8], forced: bool) {
    if let Ok(a) = Abandoned::decode_mark(bytes) {
        assert_eq!(a.encode_mark().as_slice(), bytes, "a decoded mark re-encodes differently");
    }
    if bytes.len() == MARK_SIZE {
        let mut m = bytes.to_vec();
        if forced {
            put(&mut m, 0, &MARK_MAGIC.to_le_bytes());
            put(&mut m, 8, &1u32.to_le_bytes());
        }
        Abandoned::seal_mark(&mut m);
        if let Ok(a) = Abandoned::decode_mark(&m) {
            assert_eq!(a.encode_mark().as_slice(), m.as_slice(), "a sealed mark re-encodes differently");
        }
    }
    if let Some(a) = std::str::from_utf8(bytes).ok().and_then(Abandoned::from_mark_name) {
        assert_eq!(a.mark_name(), std::str::from_utf8(bytes).unwrap_or(""), "a mark name does not round-trip");
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else { return };
    let seed = log_seed(7, 3);
    check_header(rest, false);
    check_block(rest, seed, false);

    let mut h = rest.to_vec();
    if mode & 1 != 0 {
        put(&mut h, 0, &HEADER_MAGIC.to_le_bytes());
        put(&mut h, 8, &VERSION.to_le_bytes());
    }
    Header::seal(&mut h);
    check_header(&h, h.len() >= HEADER_SIZE);

    let mut b = rest.to_vec();
    if mode & 2 != 0 {
        put(&mut b, 0, &LOG_MAGIC.to_le_bytes());
        put(&mut b, 8, &VERSION.to_le_bytes());
    }
    if mode & 4 != 0 && b.len() >= LOG_HEADER {
        let count = (word(&b, 40) as u32 as usize) % (MAX_ENTRIES + 1);
        let raw = (count * ENTRY_SIZE) as u32;
        let compressed = word(&b, 8) >> 32 & 1 != 0;
        let room = (b.len() - LOG_HEADER) as u32;
        let body = if compressed { (word(&b, 44) as u32) % (room + 1) } else { raw.min(room) };
        put(&mut b, 40, &(count as u32).to_le_bytes());
        put(&mut b, 44, &body.to_le_bytes());
        put(&mut b, 48, &raw.to_le_bytes());
    }
    LogBlock::seal(&mut b, seed);
    check_block(&b, seed, b.len() >= LOG_HEADER);
    check_mark(rest, mode & 8 != 0);

});
