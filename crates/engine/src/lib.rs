//! The cache engine: exports cut into records that share one ARC in RAM, in
//! front of block devices. Mechanism only; the policy lives in `arc-policy`
//! and the protocol in `nbd`.

mod cache;
mod commit;
mod committer;
mod dirty;
mod extents;
mod feed;
mod fill_bufs;
mod prefetch;
mod record;
mod record_bufs;
mod replay;
mod sizing;
mod stats;
mod volume;
mod writeback;
mod zfetch;

pub use arcache_batch::Batch;
pub use cache::{Cache, CacheConfig, FeedRules, ScanMarks, ViewL2, MAX_EXPORTS, RECORD_OVERHEAD};
pub use committer::CommitDone;
pub use feed::{Feed, FeedStats, FeedTunables, NOPREFETCH_AUTO};
pub use record::Record;
pub use replay::replay_log;
pub use sizing::{SizingView, SAMPLE_EVERY};
pub use stats::{ArcStats, L2DeviceStats};
pub use volume::{Held, ReadDone, ReadEnd, SyncMode, Volume, VolumeConfig, VolumeCounts};
pub use writeback::{Backing, WriteBack, WriteStats, WriteTunables, WriteView};
pub use zfetch::{Zfetch, ZfetchStats, ZfetchTunables};
