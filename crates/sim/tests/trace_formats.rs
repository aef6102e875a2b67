//! The ARC paper's `.lis` (zstd) and libCacheSim's oracleGeneral binary.

use std::path::PathBuf;

use arc_policy::by_name;
use arcache_sim::{expand, read_trace, replay};

fn shared(p: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/traces").join(p)
}

#[test]
fn lis_reproduces_the_arc_paper_oltp_counts() {
    let reqs = read_trace(&shared("arc_paper/OLTP.lis.zst")).unwrap();
    let acc = expand(&reqs, 512, false);
    assert_eq!(acc.len(), 914_145, "the paper's Table III request count");
    // shared/traces/REFERENCE.md: OLTP c=1000, LRU 32.83 % / ARC 38.95 % (356,015 hits).
    let lru = replay(by_name("lru", 1000).unwrap().as_mut(), 1000, &acc);
    let arc = replay(by_name("arc-paper", 1000).unwrap().as_mut(), 1000, &acc);
    assert_eq!((lru.hits, arc.hits), (300_122, 356_015));
}

#[test]
fn oracle_general_reads_every_record_and_round_trips() {
    let reqs = read_trace(&shared("cloudphysics_io/cloudPhysicsIO.oracleGeneral.bin")).unwrap();
    assert_eq!(reqs.len(), 113_872, "one record per I/O of the trace");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.oracleGeneral.bin");
    let mut bytes = Vec::new();
    for (t, id) in [(1u32, 7u64), (2, 9), (2, 7)] {
        bytes.extend_from_slice(&t.to_le_bytes());
        bytes.extend_from_slice(&id.to_le_bytes());
        bytes.extend_from_slice(&1u32.to_le_bytes());
        bytes.extend_from_slice(&(-1i64).to_le_bytes());
    }
    std::fs::write(&path, &bytes).unwrap();
    let keys: Vec<u64> = expand(&read_trace(&path).unwrap(), 4096, false).iter().map(|a| a.key).collect();
    assert_eq!(keys, vec![7, 9, 7]);
    // A torn last record is an error, not a silently shorter trace.
    std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
    assert!(read_trace(&path).is_err());
}
