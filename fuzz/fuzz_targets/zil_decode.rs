//! The intent log's decoders: never a panic, and what decodes re-encodes to
//! the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use zil::format::{decode_chunk_body, decode_chunk_header, encode_chunk, log_seed, Header};

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = Header::decode(data) {
        if let Ok(again) = h.encode() {
            assert_eq!(Header::decode(&again).ok(), Some(h));
        }
    }
    let seed = log_seed(1, 2);
    let _ = decode_chunk_header(data, seed, 1, 0);
    if let Ok(entries) = decode_chunk_body(data, seed) {
        // A body that decodes is re-encoded with the same entries.
        let chunk = encode_chunk(seed, 1, 0, 1, &entries);
        assert_eq!(decode_chunk_body(&chunk, seed).ok(), Some(entries));
    }
});
