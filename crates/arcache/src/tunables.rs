//! Runtime tunables, named like OpenZFS's module parameters where one
//! exists. The same names work in the config file, with `--set` at start
//! and with `arcache set` at run time.

use anyhow::{bail, Result};
use serde::Serialize;

use crate::size::parse_size;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Unit {
    Bytes,
    Milliseconds,
}

/// Description of one tunable.
pub struct Spec {
    pub name: &'static str,
    pub unit: Unit,
    pub min: u64,
    pub max: u64,
    pub description: &'static str,
}

pub const SPECS: &[Spec] = &[
    Spec {
        name: "zfs_arc_max",
        unit: Unit::Bytes,
        min: 1 << 20,
        max: u64::MAX,
        description: "Largest size of the ARC in RAM (data plus record headers)",
    },
    Spec {
        name: "zfs_arc_min",
        unit: Unit::Bytes,
        min: 0,
        max: u64::MAX,
        description: "The ARC target never shrinks below this",
    },
    Spec {
        name: "zfs_arc_min_prefetch_ms",
        unit: Unit::Milliseconds,
        min: 0,
        max: 3_600_000,
        description: "Prefetched (NBD CACHE) records are not evicted younger than this",
    },
];

pub fn spec(name: &str) -> Result<&'static Spec> {
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
    let s = spec(name)?;
    let v = match s.unit {
        Unit::Bytes => parse_size(value)?,
        Unit::Milliseconds => {
            value.trim().parse::<u64>().map_err(|e| anyhow::anyhow!("bad value {value:?} for {name}: {e}"))?
        }
    };
    if v < s.min || v > s.max {
        bail!("{name} = {v} is out of range [{}, {}]", s.min, s.max);
    }
    Ok(v)
}

/// The values in force.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tunables {
    pub zfs_arc_max: u64,
    pub zfs_arc_min: u64,
    pub zfs_arc_min_prefetch_ms: u64,
}

impl Tunables {
    /// Defaults for this machine. A userspace cache shares RAM with the page
    /// cache and applications and has no shrinker yet, so it takes a quarter
    /// of RAM rather than OpenZFS's 5/8.
    pub fn defaults() -> Tunables {
        let ram = physical_ram();
        let max = (ram / 4).max(64 << 20);
        Tunables {
            zfs_arc_max: max,
            zfs_arc_min: (ram / 32).max(32 << 20).min(max / 2),
            zfs_arc_min_prefetch_ms: 1000,
        }
    }

    pub fn get(&self, name: &str) -> Result<u64> {
        Ok(match spec(name)?.name {
            "zfs_arc_max" => self.zfs_arc_max,
            "zfs_arc_min" => self.zfs_arc_min,
            "zfs_arc_min_prefetch_ms" => self.zfs_arc_min_prefetch_ms,
            other => bail!("tunable {other} has no storage"),
        })
    }

    /// Sets a value, checking it against the others. Lowering `zfs_arc_max`
    /// below `zfs_arc_min` pulls the minimum down to half the new maximum,
    /// since the minimum is usually a machine-derived default; raising the
    /// minimum above the maximum is an error.
    pub fn set(&mut self, name: &str, value: u64) -> Result<()> {
        let mut next = *self;
        match spec(name)?.name {
            "zfs_arc_max" => {
                next.zfs_arc_max = value;
                if next.zfs_arc_min > value {
                    next.zfs_arc_min = value / 2;
                }
            }
            "zfs_arc_min" => next.zfs_arc_min = value,
            "zfs_arc_min_prefetch_ms" => next.zfs_arc_min_prefetch_ms = value,
            other => bail!("tunable {other} has no storage"),
        }
        if next.zfs_arc_min > next.zfs_arc_max {
            bail!("zfs_arc_min ({}) would exceed zfs_arc_max ({})", next.zfs_arc_min, next.zfs_arc_max);
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
        let mut t = Tunables::defaults();
        t.set("zfs_arc_max", 64 << 20).unwrap();
        assert!(t.zfs_arc_min <= 32 << 20, "the minimum follows a lower maximum");
        assert!(t.set("zfs_arc_min", 128 << 20).is_err());
        assert_eq!(t.get("zfs_arc_max").unwrap(), 64 << 20);
    }
}
