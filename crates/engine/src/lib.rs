//! The cache engine: exports cut into records that share one ARC in RAM, in
//! front of block devices. Mechanism only; the policy lives in `arc-policy`
//! and the protocol in `nbd`.

mod cache;
mod stats;
mod volume;

pub use cache::{Cache, CacheConfig, RECORD_OVERHEAD};
pub use stats::ArcStats;
pub use volume::{Volume, VolumeConfig};
