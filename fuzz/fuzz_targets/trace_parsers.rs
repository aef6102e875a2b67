//! The trace readers (CSV, the ARC paper's .lis, libCacheSim's
//! oracleGeneral): errors, never a panic; what they accept expands safely.
#![no_main]

use arcache_sim::{expand, parse_csv, parse_lis, parse_oracle_general};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    for reqs in [parse_csv(data, "fuzz"), parse_lis(data, "fuzz"), parse_oracle_general(data, "fuzz")]
        .into_iter()
        .flatten()
    {
        // Expanding a huge request would only be slow; bound it.
        if reqs.iter().all(|r| r.len / 4096 < 1 << 16) {
            let _ = expand(&reqs, 4096, false);
        }
    }
});
