//! Live sizing: a spatially hashed sample (SHARDS) of the records clients
//! read, kept as a window of the most recent sampled accesses, from which
//! an LRU miss-ratio curve of the live workload and the size of its active
//! data set are estimated on demand. Costs one hash per record read and a
//! short lock for one in `1 / SAMPLE_EVERY` of them.

use std::collections::{HashSet, VecDeque};

use arc_policy::mrc::lru_mrc;
use arc_policy::replay::BlockAccess;
use arcache_sync::Mutex;

/// One record in this many is sampled.
pub const SAMPLE_EVERY: u64 = 64;
/// Sampled accesses kept: with one in 64 sampled, the last ~16 M reads.
const WINDOW: usize = 1 << 18;

pub struct Sampler {
    window: Mutex<VecDeque<u64>>,
}

/// What the sample says about the live workload.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct SizingView {
    pub sample_rate: f64,
    /// Record reads the window stands for.
    pub window_reads: u64,
    /// Distinct records read in the window (the active data set).
    pub active_records: u64,
    /// Estimated LRU hit ratio for each size, in records.
    pub curve: Vec<(u64, f64)>,
}

fn spread(key: u64) -> u64 {
    let mut x = key ^ 0x6A09_E667_F3BC_C909;
    x = (x ^ (x >> 33)).wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    x = (x ^ (x >> 33)).wrapping_mul(0xC4CE_B9FE_1A85_EC53);
    x ^ (x >> 33)
}

impl Default for Sampler {
    fn default() -> Self {
        Sampler { window: Mutex::new(VecDeque::with_capacity(1024)) }
    }
}

impl Sampler {
    /// Notes a demand read of record `key`.
    pub fn observe(&self, key: u64) {
        if !spread(key).is_multiple_of(SAMPLE_EVERY) {
            return;
        }
        let mut w = self.window.lock();
        if w.len() == WINDOW {
            w.pop_front();
        }
        w.push_back(key);
    }

    /// The estimate for caches of `sizes` records.
    pub fn view(&self, sizes: &[u64]) -> SizingView {
        let keys: Vec<u64> = self.window.lock().iter().copied().collect();
        let accesses: Vec<BlockAccess> =
            keys.iter().enumerate().map(|(i, &key)| BlockAccess { key, now_ns: i as u64 }).collect();
        let scaled: Vec<u64> = sizes.iter().map(|s| (s / SAMPLE_EVERY).max(1)).collect();
        let curve = lru_mrc(&accesses, &scaled);
        let active = keys.iter().collect::<HashSet<_>>().len() as u64 * SAMPLE_EVERY;
        SizingView {
            sample_rate: 1.0 / SAMPLE_EVERY as f64,
            window_reads: keys.len() as u64 * SAMPLE_EVERY,
            active_records: active,
            curve: sizes.iter().zip(curve).map(|(&s, p)| (s, p.hit_ratio)).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sample_sees_the_working_set_and_its_curve() {
        let s = Sampler::default();
        // 20,000 records read round-robin ten times: LRU hits only when the
        // cache holds all of them.
        for _ in 0..10 {
            for k in 0..20_000u64 {
                s.observe(k);
            }
        }
        let v = s.view(&[10_000, 40_000]);
        let rel = v.active_records as f64 / 20_000.0;
        assert!((0.8..1.2).contains(&rel), "active set estimate {}", v.active_records);
        assert!(v.curve[0].1 < 0.05 && v.curve[1].1 > 0.8, "{:?}", v.curve);
    }
}
