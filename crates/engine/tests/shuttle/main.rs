//! Model-checked thread interleavings (shuttle) of the real engine: built
//! with `--features shuttle`, every lock, condition variable and thread of
//! the ARC wrapper, the record locks, the write-back (dirty set, throttle,
//! log committer, txg syncer, the commit thread) and the L2 index is
//! shuttle's, and shuttle's schedulers try thousands of orders of the
//! threads of each test. Run with
//! `cargo test -p arcache-engine --features shuttle --release --test shuttle`.
//!
//! Every device read, write or flush is a point where shuttle may switch
//! threads, as a real one is; the IO itself is atomic here (torn device
//! reads are covered by checksums and by the fault tests).
//!
//! Each test counts, in its own schedules, those where its race happened
//! and asserts there were some: a test cannot pass by never racing.
#![cfg(feature = "shuttle")]

mod arc_l2;
mod common;
mod writeback;
