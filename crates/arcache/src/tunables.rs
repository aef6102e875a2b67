//! Runtime tunables, named like OpenZFS's module parameters where one
//! exists. The same names work in the config file, with `--set` at start
//! and with `arcache set` at run time. Every value is a u64; booleans are
//! 0/1 and `l2arc_noprefetch` also takes `auto` (stored as 2).

use std::collections::BTreeMap;

use anyhow::{bail, Result};
use arcache_engine::SyncMode;
use serde::Serialize;

use crate::size::parse_size;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Unit {
    Bytes,
    Milliseconds,
    Seconds,
    Count,
    Bool,
    Percent,
    /// 0, 1 or auto.
    Auto,
    /// standard (0), always (1) or disabled (2): the ZFS `sync` property.
    Sync,
}

/// Description of one tunable.
pub struct Spec {
    pub name: &'static str,
    pub unit: Unit,
    pub min: u64,
    pub max: u64,
    pub description: &'static str,
}

const fn spec(name: &'static str, unit: Unit, min: u64, max: u64, description: &'static str) -> Spec {
    Spec { name, unit, min, max, description }
}

pub const AUTO: u64 = 2;

pub const SPECS: &[Spec] = &[
    spec("zfs_arc_max", Unit::Bytes, 1 << 20, u64::MAX, "Largest size of the ARC in RAM (data plus record headers)"),
    spec("zfs_arc_min", Unit::Bytes, 0, u64::MAX, "The ARC target never shrinks below this"),
    spec(
        "zfs_arc_min_prefetch_ms",
        Unit::Milliseconds,
        0,
        3_600_000,
        "Prefetched records are not evicted younger than this",
    ),
    spec(
        "zfs_arc_meta_balance",
        Unit::Count,
        1,
        1_000_000,
        "How much more a metadata ghost hit than a data one moves metadata's share of the ARC (100: the same)",
    ),
    spec(
        "zfs_arc_dnode_limit",
        Unit::Bytes,
        0,
        u64::MAX,
        "Most RAM for the file view's table of source files before the least used are dropped (0: zfs_arc_dnode_limit_percent of zfs_arc_max)",
    ),
    spec(
        "zfs_arc_dnode_limit_percent",
        Unit::Percent,
        0,
        100,
        "The file view's table of source files as a share of zfs_arc_max, when zfs_arc_dnode_limit is 0",
    ),
    spec("zfs_compressed_arc_enabled", Unit::Bool, 0, 1, "Keep records LZ4-compressed in RAM and on L2 when it saves space"),
    spec(
        "l2arc_write_max",
        Unit::Bytes,
        0,
        64 << 30,
        "Most bytes per second the feed writes to one L2 device (0: no fixed rate, as fast as the device absorbs)",
    ),
    spec("l2arc_write_boost", Unit::Bytes, 0, 64 << 30, "Extra bytes per second until a device has been filled once"),
    spec("l2arc_headroom", Unit::Count, 0, 1024, "Scan depth from the ARC tails, in multiples of the write budget (0: unlimited)"),
    spec("l2arc_feed_secs", Unit::Seconds, 1, 3600, "Pause between feed cycles"),
    spec("l2arc_feed_min_ms", Unit::Milliseconds, 10, 60_000, "Shorter pause when the last cycle used most of its budget"),
    spec("l2arc_feed_again", Unit::Bool, 0, 1, "Allow the shorter pause"),
    spec("l2arc_noprefetch", Unit::Auto, 0, 2, "Keep prefetched records off L2: 1 yes, 0 no, auto: only when L2 is slower than the backing store"),
    spec("l2arc_mfuonly", Unit::Bool, 0, 1, "Feed only re-used records (MFU)"),
    spec(
        "l2arc_partial_reads",
        Unit::Bool,
        0,
        1,
        "Serve a small read of an L2-only record from half its L2 copy, caching the record in RAM only when it is read again soon",
    ),
    spec(
        "l2arc_ring_reads",
        Unit::Bool,
        0,
        1,
        "Queue small L2 reads through io_uring and answer them from one ring thread instead of worker threads",
    ),
    spec(
        "backing_ring_reads",
        Unit::Bool,
        0,
        1,
        "Queue a read within one record that misses RAM and L2 to io_uring when its backing store is opened O_DIRECT (--direct), answered from the ring thread (0: on a worker thread, as without io_uring)",
    ),
    spec(
        "backing_read_units",
        Unit::Bool,
        0,
        1,
        "Read a sequential stream over a backing store that is costly per request (S3: 8M of an object, a chunk of a chunked disk) in whole units of that size (0: in the records the client asks and zfetch's prefetches)",
    ),
    spec("l2arc_trim_ahead", Unit::Percent, 0, 100, "Trim this share of the device ahead of the write hand (0: off)"),
    spec("l2arc_dwpd_limit", Unit::Count, 0, 10_000, "Wear bound in 1/100 drive writes per day once a device has wrapped (0: off)"),
    spec("l2arc_meta_percent", Unit::Percent, 1, 100, "Most RAM for L2 headers, as a share of the ARC target"),
    spec("l2arc_rebuild_enabled", Unit::Bool, 0, 1, "Restore the L2 contents from the devices' logs at start (read at start)"),
    spec(
        "l2arc_rebuild_blocks_min_l2size",
        Unit::Bytes,
        0,
        u64::MAX,
        "L2 devices smaller than this keep no persistent log (read at start)",
    ),
    spec("zfs_prefetch_disable", Unit::Bool, 0, 1, "Turn off zfetch, the sequential-stream prefetcher"),
    spec("zfetch_max_distance", Unit::Bytes, 0, 1 << 30, "Farthest a stream prefetches ahead of its reader"),
    spec("zfetch_min_distance", Unit::Bytes, 0, 1 << 30, "A stream's window doubles per hit up to this, then grows only when late"),
    spec("zfetch_max_streams", Unit::Count, 1, 256, "Streams tracked per export"),
    spec(
        "sync",
        Unit::Sync,
        0,
        2,
        "When writes are durable, for every export: standard (on FLUSH/FUA), always (every write), disabled (never; unsafe)",
    ),
    spec("zfs_txg_timeout", Unit::Seconds, 1, 3600, "Longest a transaction group stays open before its dirty data is written"),
    spec("zfs_dirty_data_max", Unit::Bytes, 1 << 20, u64::MAX, "Most dirty (unsynced) data in RAM; writers wait at this level"),
    spec("zfs_dirty_data_sync_percent", Unit::Percent, 1, 100, "Start syncing a txg early when its dirty data passes this share of zfs_dirty_data_max"),
    spec("zfs_delay_min_dirty_percent", Unit::Percent, 0, 100, "Writes are delayed above this share of zfs_dirty_data_max"),
    spec("zfs_delay_scale", Unit::Count, 0, 1_000_000_000, "Write delay scale in nanoseconds (delay = scale x (dirty - min) / (max - dirty))"),
    spec("zfs_vdev_async_write_max_active", Unit::Count, 1, 64, "Parallel backing-store writes while a txg syncs"),
    spec("zfs_vdev_sync_write_max_active", Unit::Count, 1, 3, "Intent-log commit writes in flight at once"),
    spec(
        "nbd_connect_timeout",
        Unit::Seconds,
        0,
        3600,
        "Seconds an NBD backing store or log may take to accept a connection and answer each step of the handshake before start-up fails (0: no limit)",
    ),
];

pub fn spec_of(name: &str) -> Result<&'static Spec> {
    match SPECS.iter().find(|s| s.name == name) {
        Some(s) => Ok(s),
        None => {
            let known: Vec<&str> = SPECS.iter().map(|s| s.name).collect();
            bail!("unknown tunable {name:?}; known tunables: {}", known.join(", "))
        }
    }
}

/// Parses and range-checks a value for `name`.
pub fn parse_value(name: &str, value: &str) -> Result<u64> {
    let s = spec_of(name)?;
    let text = value.trim();
    let v = match s.unit {
        Unit::Bytes => parse_size(text)?,
        Unit::Auto if text.eq_ignore_ascii_case("auto") => AUTO,
        Unit::Sync => match SyncMode::ALL.iter().position(|m| text.eq_ignore_ascii_case(m.name())) {
            Some(i) => i as u64,
            None => bail!("bad value {value:?} for {name}: use standard, always or disabled"),
        },
        Unit::Bool | Unit::Auto => match text.to_ascii_lowercase().as_str() {
            "0" | "off" | "false" | "no" => 0,
            "1" | "on" | "true" | "yes" => 1,
            _ => bail!(
                "bad value {value:?} for {name}: use 0 or 1{}",
                if s.unit == Unit::Auto { " or auto" } else { "" }
            ),
        },
        _ => text.parse::<u64>().map_err(|e| anyhow::anyhow!("bad value {value:?} for {name}: {e}"))?,
    };
    if v < s.min || v > s.max {
        bail!("{name} = {v} is out of range [{}, {}]", s.min, s.max);
    }
    Ok(v)
}

/// A value as users write it.
pub fn format_value(name: &str, v: u64) -> String {
    match spec_of(name).map(|s| s.unit) {
        Ok(Unit::Auto) if v == AUTO => "auto".into(),
        Ok(Unit::Sync) => SyncMode::from_index(v).name().into(),
        _ => v.to_string(),
    }
}

/// The values in force.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tunables {
    values: BTreeMap<&'static str, u64>,
}

impl Tunables {
    /// Defaults for this machine. A userspace cache shares RAM with the page
    /// cache and applications and has no shrinker yet, so it takes a quarter
    /// of RAM rather than OpenZFS's 5/8.
    pub fn defaults() -> Tunables {
        let ram = physical_ram();
        let max = (ram / 4).max(64 << 20);
        let values = SPECS
            .iter()
            .map(|s| {
                let v = match s.name {
                    "zfs_arc_max" => max,
                    "zfs_arc_min" => (ram / 32).max(32 << 20).min(max / 2),
                    "zfs_arc_min_prefetch_ms" => 1000,
                    "zfs_arc_meta_balance" => arc_policy::META_BALANCE_DEFAULT,
                    "zfs_arc_dnode_limit" => 0,
                    // OpenZFS's default.
                    "zfs_arc_dnode_limit_percent" => 10,
                    "zfs_compressed_arc_enabled" => 1,
                    "l2arc_write_max" | "l2arc_write_boost" => 0,
                    "l2arc_headroom" => 8,
                    "l2arc_feed_secs" => 1,
                    "l2arc_feed_min_ms" => 200,
                    "l2arc_feed_again"
                    | "l2arc_partial_reads"
                    | "l2arc_ring_reads"
                    | "backing_ring_reads"
                    | "backing_read_units" => 1,
                    "l2arc_noprefetch" => AUTO,
                    "l2arc_mfuonly" | "l2arc_trim_ahead" => 0,
                    "l2arc_dwpd_limit" => 100,
                    "l2arc_meta_percent" => 33,
                    "l2arc_rebuild_enabled" => 1,
                    "l2arc_rebuild_blocks_min_l2size" => 1 << 30,
                    "zfs_prefetch_disable" => 0,
                    "zfetch_max_distance" => 64 << 20,
                    "zfetch_min_distance" => 4 << 20,
                    "zfetch_max_streams" => 8,
                    "sync" => 0,
                    "zfs_txg_timeout" => 5,
                    // OpenZFS: a tenth of RAM, at most 4 GiB.
                    "zfs_dirty_data_max" => (ram / 10).clamp(64 << 20, 4 << 30),
                    "zfs_dirty_data_sync_percent" => 20,
                    "zfs_delay_min_dirty_percent" => 60,
                    "zfs_delay_scale" => 500_000,
                    // OpenZFS: 10 per vdev; one backing store here stands for a whole pool.
                    "zfs_vdev_async_write_max_active" => 32,
                    // OpenZFS: 10; one here, measured (docs/intent-log.md).
                    "zfs_vdev_sync_write_max_active" => 1,
                    // Long enough for a loaded server across a WAN, short
                    // enough that a hung one is reported, not waited for.
                    "nbd_connect_timeout" => 10,
                    other => unreachable!("no default for {other}"),
                };
                (s.name, v)
            })
            .collect();
        Tunables { values }
    }

    pub fn get(&self, name: &str) -> Result<u64> {
        Ok(self.values[spec_of(name)?.name])
    }

    /// The value of a tunable known to exist.
    pub fn value(&self, name: &'static str) -> u64 {
        self.values.get(name).copied().unwrap_or_else(|| panic!("tunable {name} is in SPECS"))
    }

    /// Sets a value, checking it against the others. Lowering `zfs_arc_max`
    /// below `zfs_arc_min` pulls the minimum down to half the new maximum,
    /// since the minimum is usually a machine-derived default; raising the
    /// minimum above the maximum is an error.
    pub fn set(&mut self, name: &str, value: u64) -> Result<()> {
        let key = spec_of(name)?.name;
        let mut next = self.clone();
        next.values.insert(key, value);
        if key == "zfs_arc_max" && next.value("zfs_arc_min") > value {
            next.values.insert("zfs_arc_min", value / 2);
        }
        if next.value("zfs_arc_min") > next.value("zfs_arc_max") {
            bail!(
                "zfs_arc_min ({}) would exceed zfs_arc_max ({})",
                next.value("zfs_arc_min"),
                next.value("zfs_arc_max")
            );
        }
        *self = next;
        Ok(())
    }
}

fn physical_ram() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let (pages, page) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    if pages > 0 && page > 0 {
        pages as u64 * page as u64
    } else {
        4 << 30
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_validate() {
        assert_eq!(parse_value("zfs_arc_max", "2G").unwrap(), 2 << 30);
        assert!(parse_value("zfs_arc_max", "1K").unwrap_err().to_string().contains("out of range"));
        assert!(parse_value("l2arc_nope", "1").unwrap_err().to_string().contains("unknown tunable"));
        assert_eq!(parse_value("l2arc_noprefetch", "auto").unwrap(), AUTO);
        assert_eq!(parse_value("l2arc_mfuonly", "on").unwrap(), 1);
        assert!(parse_value("l2arc_mfuonly", "auto").is_err());
        assert_eq!(format_value("l2arc_noprefetch", AUTO), "auto");
        let mut t = Tunables::defaults();
        t.set("zfs_arc_max", 64 << 20).unwrap();
        assert!(t.value("zfs_arc_min") <= 32 << 20, "the minimum follows a lower maximum");
        assert!(t.set("zfs_arc_min", 128 << 20).is_err());
        assert_eq!(t.get("zfs_arc_max").unwrap(), 64 << 20);
    }

    #[test]
    fn every_spec_has_a_default_within_its_range() {
        let d = Tunables::defaults();
        for s in SPECS {
            let v = d.value(s.name);
            assert!(v >= s.min && v <= s.max, "{} default {v}", s.name);
        }
    }
}
