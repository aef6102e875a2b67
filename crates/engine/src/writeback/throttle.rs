//! The write throttle: as OpenZFS's, it slows writers down as dirty data
//! grows past a level and makes them wait at the limit, so dirty RAM stays
//! bounded whatever the backing stores' speed.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use super::dirty_set::DirtySet;
use super::stats::{WriteStats, WriteTunables};
use crate::dirty::PAGE;

pub(super) struct Throttle {
    tunables: Arc<WriteTunables>,
    stats: Arc<WriteStats>,
}

impl Throttle {
    pub(super) fn new(tunables: Arc<WriteTunables>, stats: Arc<WriteStats>) -> Self {
        Throttle { tunables, stats }
    }

    /// Dirty data above which writes are delayed, and the hard limit.
    fn levels(&self) -> (u64, u64) {
        let t = &self.tunables;
        let max = t.dirty_data_max.load(Relaxed).max(PAGE * 64);
        (max * t.delay_min_dirty_percent.load(Relaxed).min(100) / 100, max)
    }

    /// True when a write now would be delayed or made to wait.
    pub(super) fn would_throttle(&self, dirty: &DirtySet) -> bool {
        dirty.bytes() > self.levels().0
    }

    /// Delays a writer in proportion to how close dirty data is to the
    /// limit, or makes it wait for a sync at the limit. Never fails.
    pub(super) fn throttle(&self, dirty: &DirtySet) {
        let mut waited = false;
        loop {
            let (min, max) = self.levels();
            let bytes = dirty.bytes();
            if bytes >= max {
                if !waited {
                    self.stats.throttle_waits.fetch_add(1, Relaxed);
                    waited = true;
                }
                dirty.wait_for_room(max, Duration::from_millis(50));
                continue;
            }
            if bytes <= min {
                return;
            }
            let scale = self.tunables.delay_scale_ns.load(Relaxed) as u128;
            let ns = (scale * u128::from(bytes - min) / u128::from(max - bytes)).min(100_000_000) as u64;
            if ns > 0 {
                self.stats.throttle_delays.fetch_add(1, Relaxed);
                self.stats.throttle_delay_ns.fetch_add(ns, Relaxed);
                arcache_sync::thread::sleep(Duration::from_nanos(ns));
            }
            return;
        }
    }
}
