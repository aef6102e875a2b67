//! The write path's tunables, counters and the view `arcache stat` shows.

use std::sync::atomic::AtomicU64;

/// The write tunables, with OpenZFS's names.
#[derive(Debug)]
pub struct WriteTunables {
    pub txg_timeout_secs: AtomicU64,
    pub dirty_data_max: AtomicU64,
    pub dirty_data_sync_percent: AtomicU64,
    pub delay_min_dirty_percent: AtomicU64,
    pub delay_scale_ns: AtomicU64,
    /// Parallel backing writes while a txg syncs.
    pub sync_writers: AtomicU64,
    /// Intent-log commit writes in flight at once (1..=3: a commit takes at
    /// most a quarter of the log, so three in flight stay within it).
    pub log_writes_in_flight: AtomicU64,
}

impl Default for WriteTunables {
    fn default() -> Self {
        WriteTunables {
            txg_timeout_secs: AtomicU64::new(5),
            dirty_data_max: AtomicU64::new(1 << 30),
            dirty_data_sync_percent: AtomicU64::new(20),
            delay_min_dirty_percent: AtomicU64::new(60),
            delay_scale_ns: AtomicU64::new(500_000),
            sync_writers: AtomicU64::new(32),
            log_writes_in_flight: AtomicU64::new(1),
        }
    }
}

/// Counters for `arcache stat`; names in docs/tunables-and-stats.md.
#[derive(Debug, Default)]
pub struct WriteStats {
    pub txg_syncs: AtomicU64,
    pub txg_sync_bytes: AtomicU64,
    pub txg_sync_errors: AtomicU64,
    pub txg_last_sync_ms: AtomicU64,
    pub zil_commit_count: AtomicU64,
    pub zil_commit_writer_count: AtomicU64,
    pub zil_itx_count: AtomicU64,
    pub zil_log_bytes: AtomicU64,
    pub zil_log_errors: AtomicU64,
    pub zil_log_write_ns: AtomicU64,
    pub zil_txg_fallbacks: AtomicU64,
    pub zil_replay_records: AtomicU64,
    pub zil_replay_bytes: AtomicU64,
    pub throttle_delays: AtomicU64,
    pub throttle_delay_ns: AtomicU64,
    pub throttle_waits: AtomicU64,
    pub written_bytes: AtomicU64,
}

/// A point-in-time view of the write path for `arcache stat --json`.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct WriteView {
    pub dirty_bytes: u64,
    pub dirty_max: u64,
    pub txg_open: u64,
    pub txg_syncing: u64,
    pub txg_synced: u64,
    pub txg_age_ms: u64,
    pub txg_syncs: u64,
    pub txg_sync_bytes: u64,
    pub txg_sync_errors: u64,
    pub txg_last_sync_ms: u64,
    pub zil_present: u64,
    pub zil_degraded: u64,
    pub zil_commit_count: u64,
    pub zil_commit_writer_count: u64,
    pub zil_itx_count: u64,
    pub zil_log_bytes: u64,
    pub zil_log_errors: u64,
    /// Mean time of one log commit's write and flush, in microseconds.
    pub zil_commit_us: u64,
    pub zil_txg_fallbacks: u64,
    pub zil_log_used: u64,
    pub zil_log_capacity: u64,
    pub zil_replay_records: u64,
    pub zil_replay_bytes: u64,
    pub throttle_delays: u64,
    pub throttle_delay_ms: u64,
    pub throttle_waits: u64,
    pub write_bytes: u64,
}
