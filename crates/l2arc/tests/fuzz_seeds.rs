//! The `l2_decode` fuzz target's seed corpus (fuzz/corpus/l2_decode): real
//! encodings of a header, of log blocks, plain and LZ4, and of an
//! abandoned-log mark, so the fuzzer starts from inputs that reach the
//! entry parser, the decompressor and the mark's field checks.
//! The test checks that every committed seed decodes past its checksum;
//! `ARCACHE_WRITE_FUZZ_SEEDS=1` rewrites them from the encoders first.

use std::path::PathBuf;

use arcache_l2::format::{
    log_seed, Abandoned, Entry, EntryKind, ExportId, Header, LogBlock, LogPtr, EF_COMPRESSED, EF_MFU, EF_RAW,
    FLAG_PERSISTENT,
};
use blockdev::owner::{Owner, OwnerState};

/// The harness's seed (fuzz/fuzz_targets/l2_decode.rs).
const SEED: (u128, u64) = (7, 3);
/// First input byte: which fields the harness forces before sealing (none).
const MODE: u8 = 0;

fn corpus() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/l2_decode")
}

fn header() -> Header {
    let export = |tag: u16, name: &str| ExportId {
        kind: 0,
        tag,
        recordsize: 16384,
        size: 1 << 34,
        identity: 0xfeed + u64::from(tag),
        contents: 0xbeef + u64::from(tag),
        name: name.into(),
    };
    Header {
        flags: FLAG_PERSISTENT,
        uuid: 7,
        incarnation: 3,
        header_seq: 12,
        device_size: 1 << 30,
        start: 1 << 20,
        capacity: (1 << 30) - (1 << 20),
        hand_lpos: 5 << 20,
        evict_lpos: 69 << 20,
        next_seq: 12,
        horizon_seq: 3,
        newest: [
            LogPtr { lpos: 4 << 20, seq: 11, asize: 8192, cksum: 99 },
            LogPtr { lpos: 3 << 20, seq: 10, asize: 4096, cksum: 98 },
        ],
        lb_count: 9,
        lb_asize: 9 * 4096,
        last_tag: 2,
        exports: vec![export(1, "vm"), export(2, "media")],
        owner: Owner { state: OwnerState::Closed, pid: 4242, since: 1_800_000_000, host: "nas".into() },
        abandoned: vec![Abandoned { uuid: 11, incarnation: 5 }],
    }
}

/// `n` entries whose fields repeat enough for LZ4 to pay off when `n` is large.
fn block(n: u64) -> LogBlock {
    LogBlock {
        seq: 11,
        lpos: 4 << 20,
        payload_start: 1 << 20,
        prev: LogPtr { lpos: 3 << 20, seq: 10, asize: 4096, cksum: 98 },
        compressed: false,
        entries: (0..n)
            .map(|i| Entry {
                kind: if i % 7 == 6 { EntryKind::Invalidate } else { EntryKind::Cached },
                flags: if i % 2 == 0 { EF_RAW } else { EF_COMPRESSED | EF_MFU },
                lshift: 2,
                tag: 1 + (i % 2) as u16,
                blob_sectors: 32,
                record: 1000 + i,
                lpos_or_count: if i % 7 == 6 { 4 } else { (1 << 20) + i * 16384 },
                cksum: 0x5151_0000 + i,
            })
            .collect(),
    }
}

fn seeds() -> Vec<(&'static str, Vec<u8>)> {
    let seed = log_seed(SEED.0, SEED.1);
    vec![
        ("header", header().encode().expect("header encodes")),
        ("block-plain", block(5).encode(seed).0),
        ("block-lz4", block(400).encode(seed).0),
        (
            "abandoned-mark",
            Abandoned { uuid: 0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10, incarnation: 42 }
                .encode_mark()
                .to_vec(),
        ),
    ]
}

#[test]
fn every_seed_decodes_past_its_checksum() {
    let dir = corpus();
    if std::env::var_os("ARCACHE_WRITE_FUZZ_SEEDS").is_some() {
        std::fs::create_dir_all(&dir).unwrap();
        for (name, bytes) in seeds() {
            std::fs::write(dir.join(name), [&[MODE][..], &bytes].concat()).unwrap();
        }
    }
    let seed = log_seed(SEED.0, SEED.1);
    let (mut headers, mut plain, mut lz4, mut marks) = (0, 0, 0, 0);
    for file in std::fs::read_dir(&dir).expect("fuzz/corpus/l2_decode") {
        let bytes = std::fs::read(file.unwrap().path()).unwrap();
        let body = &bytes[1..];
        if Header::decode(body).is_ok() {
            headers += 1;
            continue;
        }
        if Abandoned::decode_mark(body).is_ok() {
            marks += 1;
            continue;
        }
        let ptr = LogPtr {
            lpos: 0,
            seq: 0,
            asize: body.len() as u32,
            cksum: u64::from_le_bytes(body[120..128].try_into().unwrap()),
        };
        let b = LogBlock::decode(body, &ptr, seed).expect("a seed that is not a header is a log block");
        assert!(!b.entries.is_empty());
        let mut resealed = body.to_vec();
        LogBlock::seal(&mut resealed, seed);
        assert_eq!(resealed, body, "sealing a valid block must not change it");
        if b.compressed {
            lz4 += 1
        } else {
            plain += 1
        }
    }
    assert!(
        headers >= 1 && plain >= 1 && lz4 >= 1 && marks >= 1,
        "seeds: {headers} headers, {plain} plain, {lz4} LZ4 blocks, {marks} abandoned-log marks"
    );
}
