//! The L2 device header and log block decoders: never a panic.
#![no_main]

use arcache_l2::format::{Header, LogBlock, LogPtr};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = Header::decode(data);
    let word =
        |i: usize| data.get(i..i + 8).map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])));
    let expect =
        LogPtr { lpos: word(0) % (1 << 30), seq: word(8), asize: data.len() as u32, cksum: word(16) };
    let _ = LogBlock::decode(data, &expect, word(24));
});
