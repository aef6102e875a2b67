//! The `zil_decode` fuzz target's seed corpus (fuzz/corpus/zil_decode):
//! real encodings of a header and of chunks holding every kind of entry,
//! so the fuzzer starts from inputs that reach the entry parser. The test
//! checks that every committed seed decodes past its checksums;
//! `ARCACHE_WRITE_FUZZ_SEEDS=1` rewrites them from the encoders first.

use std::path::PathBuf;

use blockdev::owner::{Owner, OwnerState};
use zil::format::{decode_chunk_body, decode_chunk_header, encode_chunk, log_seed, Entry, Header, LogExport};

/// The harness's seed, sequence number and position (fuzz/fuzz_targets/zil_decode.rs).
const SEED: (u128, u64) = (1, 2);
const SEQ: u64 = 1;
const LPOS: u64 = 0;
/// First input byte: which fields the harness forces before sealing (none).
const MODE: u8 = 0;

fn corpus() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/zil_decode")
}

fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let seed = log_seed(SEED.0, SEED.1);
    let header = Header {
        uuid: 1,
        incarnation: 2,
        header_seq: 5,
        capacity: 64 << 20,
        tail_lpos: 8192,
        tail_seq: 1,
        exports: vec![
            LogExport { id: 1, name: "vm".into(), identity: 0xfeed, size: 1 << 30 },
            LogExport { id: 2, name: "media".into(), identity: 0xbeef, size: 1 << 34 },
        ],
        owner: Owner { state: OwnerState::InUse, pid: 4242, since: 1_800_000_000, host: "nas".into() },
    };
    let entries = vec![
        Entry::Page { export: 1, page: 3, mask: 0b1000_0001, data: vec![0xab; 2 * 512] },
        Entry::Page { export: 2, page: 77, mask: 0xff, data: (0..4096).map(|i| (i % 251) as u8).collect() },
        Entry::Zero { export: 1, offset: 1 << 20, len: 65536 },
        Entry::Trim { export: 2, offset: 8192, len: 4096 },
    ];
    vec![
        ("header", header.encode().expect("header encodes")),
        ("chunk", encode_chunk(seed, SEQ, LPOS, 9, &entries)),
        ("chunk-one-page", encode_chunk(seed, SEQ, LPOS, 9, &entries[..1])),
    ]
}

#[test]
fn every_seed_decodes_past_its_checksums() {
    let dir = corpus();
    if std::env::var_os("ARCACHE_WRITE_FUZZ_SEEDS").is_some() {
        std::fs::create_dir_all(&dir).unwrap();
        for (name, bytes) in seeds() {
            std::fs::write(dir.join(name), [&[MODE][..], &bytes].concat()).unwrap();
        }
    }
    let seed = log_seed(SEED.0, SEED.1);
    let (mut headers, mut chunks) = (0, 0);
    for file in std::fs::read_dir(&dir).expect("fuzz/corpus/zil_decode") {
        let bytes = std::fs::read(file.unwrap().path()).unwrap();
        let body = &bytes[1..];
        if Header::decode(body).is_ok() {
            headers += 1;
            continue;
        }
        decode_chunk_header(body, seed, SEQ, LPOS).expect("a seed that is not a header is a chunk");
        let entries = decode_chunk_body(body, seed).expect("its body decodes");
        assert!(!entries.is_empty());
        chunks += 1;
    }
    assert!(headers >= 1 && chunks >= 2, "seeds: {headers} headers, {chunks} chunks");
}
