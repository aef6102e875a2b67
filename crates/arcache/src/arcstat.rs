//! arcstat-style columns over `stat` samples: field names and meanings of
//! OpenZFS's arcstat where they exist. Counters are shown per second over
//! the interval (or since start for a single sample); sizes as they are.

use serde_json::Value;

use crate::size::human;

/// How a field is computed from two samples.
enum Calc {
    /// Change of the sum of these counters, per second.
    Rate(&'static [&'static str]),
    /// The first set's change as a percentage of the second set's change.
    Pct(&'static [&'static str], &'static [&'static str]),
    /// A size, shown in human units.
    Size(&'static str),
    /// The sample's wall-clock time.
    Time,
}

pub struct Field {
    pub name: &'static str,
    width: usize,
    calc: Calc,
    pub description: &'static str,
}

const READS: &[&str] = &["hits", "iohits", "misses"];
const DREADS: &[&str] = &["demand_data_hits", "demand_data_iohits", "demand_data_misses"];
const PREADS: &[&str] = &["prefetch_data_hits", "prefetch_data_iohits", "prefetch_data_misses"];
const L2READS: &[&str] = &["l2_hits", "l2_misses"];
const ZTOTAL: &[&str] = &["zfetch_hits", "zfetch_future", "zfetch_stride", "zfetch_past", "zfetch_misses"];

pub const FIELDS: &[Field] = &[
    Field { name: "time", width: 8, calc: Calc::Time, description: "Time of the sample" },
    Field { name: "read", width: 6, calc: Calc::Rate(READS), description: "Record reads per second" },
    Field {
        name: "hits",
        width: 6,
        calc: Calc::Rate(&["hits", "iohits"]),
        description: "Reads served from RAM per second",
    },
    Field {
        name: "miss",
        width: 6,
        calc: Calc::Rate(&["misses"]),
        description: "Reads not in RAM per second",
    },
    Field {
        name: "hit%",
        width: 4,
        calc: Calc::Pct(&["hits", "iohits"], READS),
        description: "RAM hit percentage",
    },
    Field {
        name: "miss%",
        width: 5,
        calc: Calc::Pct(&["misses"], READS),
        description: "RAM miss percentage",
    },
    Field { name: "dread", width: 6, calc: Calc::Rate(DREADS), description: "Demand reads per second" },
    Field {
        name: "dhit%",
        width: 5,
        calc: Calc::Pct(&["demand_data_hits", "demand_data_iohits"], DREADS),
        description: "Demand hit percentage",
    },
    Field { name: "pread", width: 6, calc: Calc::Rate(PREADS), description: "Prefetch reads per second" },
    Field {
        name: "phit%",
        width: 5,
        calc: Calc::Pct(&["prefetch_data_hits", "prefetch_data_iohits"], PREADS),
        description: "Prefetch hit percentage",
    },
    Field { name: "arcsz", width: 5, calc: Calc::Size("size"), description: "ARC size" },
    Field { name: "size", width: 5, calc: Calc::Size("size"), description: "ARC size (alias of arcsz)" },
    Field { name: "c", width: 5, calc: Calc::Size("c"), description: "ARC target size" },
    Field { name: "mfu", width: 5, calc: Calc::Size("mfu_size"), description: "MFU list size" },
    Field { name: "mru", width: 5, calc: Calc::Size("mru_size"), description: "MRU list size" },
    Field { name: "mfug", width: 5, calc: Calc::Size("mfu_ghost_size"), description: "MFU ghost list size" },
    Field { name: "mrug", width: 5, calc: Calc::Size("mru_ghost_size"), description: "MRU ghost list size" },
    Field {
        name: "eskip",
        width: 5,
        calc: Calc::Rate(&["evict_skip"]),
        description: "Evictions skipped per second",
    },
    Field { name: "l2read", width: 6, calc: Calc::Rate(L2READS), description: "L2 lookups per second" },
    Field { name: "l2hits", width: 6, calc: Calc::Rate(&["l2_hits"]), description: "L2 hits per second" },
    Field { name: "l2miss", width: 6, calc: Calc::Rate(&["l2_misses"]), description: "L2 misses per second" },
    Field {
        name: "l2hit%",
        width: 6,
        calc: Calc::Pct(&["l2_hits"], L2READS),
        description: "L2 hit percentage",
    },
    Field {
        name: "l2miss%",
        width: 7,
        calc: Calc::Pct(&["l2_misses"], L2READS),
        description: "L2 miss percentage",
    },
    Field { name: "l2size", width: 6, calc: Calc::Size("l2_size"), description: "Logical bytes on L2" },
    Field { name: "l2asize", width: 7, calc: Calc::Size("l2_asize"), description: "Bytes L2 copies occupy" },
    Field {
        name: "l2bytes",
        width: 7,
        calc: Calc::Rate(&["l2_read_bytes"]),
        description: "Bytes read from L2 per second",
    },
    Field {
        name: "l2wbytes",
        width: 8,
        calc: Calc::Rate(&["l2_write_bytes"]),
        description: "Bytes written to L2 per second",
    },
    Field {
        name: "ztotal",
        width: 6,
        calc: Calc::Rate(ZTOTAL),
        description: "zfetch stream lookups per second",
    },
    Field {
        name: "zhits",
        width: 5,
        calc: Calc::Rate(&["zfetch_hits"]),
        description: "zfetch stream hits per second",
    },
    Field {
        name: "zissued",
        width: 7,
        calc: Calc::Rate(&["zfetch_io_issued"]),
        description: "Prefetch reads started per second",
    },
];

pub const DEFAULT_FIELDS: &[&str] =
    &["time", "read", "hit%", "miss%", "dhit%", "phit%", "arcsz", "c", "mfu", "mru"];
pub const L2_FIELDS: &[&str] = &["l2read", "l2hit%", "l2size", "l2asize", "l2bytes"];

pub fn find(name: &str) -> Option<&'static Field> {
    FIELDS.iter().find(|f| f.name == name)
}

fn sum(v: &Value, keys: &[&str]) -> f64 {
    keys.iter().map(|k| v.get(*k).and_then(Value::as_u64).unwrap_or(0) as f64).sum()
}

/// Formats a count the way arcstat does: 1234 -> 1.2K.
fn count(v: f64) -> String {
    if v < 1000.0 {
        format!("{v:.0}")
    } else {
        human(v as u64)
    }
}

impl Field {
    /// The value of this field between samples `prev` (None: since start)
    /// and `now`, taken `secs` apart.
    pub fn value(&self, prev: Option<&Value>, now: &Value, secs: f64, clock: &str) -> String {
        let delta = |keys: &[&str]| sum(now, keys) - prev.map_or(0.0, |p| sum(p, keys));
        match &self.calc {
            Calc::Time => clock.to_string(),
            Calc::Size(k) => human(now.get(*k).and_then(Value::as_u64).unwrap_or(0)),
            Calc::Rate(keys) => count(delta(keys) / secs.max(1e-9)),
            Calc::Pct(part, all) => {
                let total = delta(all);
                if total <= 0.0 {
                    "0".into()
                } else {
                    format!("{:.0}", 100.0 * delta(part) / total)
                }
            }
        }
    }

    pub fn width(&self) -> usize {
        self.width.max(self.name.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rates_percentages_and_sizes() {
        let a = json!({"hits": 10, "iohits": 0, "misses": 10, "size": 1024});
        let b = json!({"hits": 40, "iohits": 0, "misses": 20, "size": 2048});
        assert_eq!(find("read").unwrap().value(Some(&a), &b, 2.0, ""), "20");
        assert_eq!(find("hit%").unwrap().value(Some(&a), &b, 2.0, ""), "75");
        assert_eq!(find("arcsz").unwrap().value(Some(&a), &b, 2.0, ""), "2.0K");
        assert_eq!(find("hit%").unwrap().value(None, &a, 1.0, ""), "50");
        assert_eq!(find("l2hit%").unwrap().value(Some(&a), &b, 1.0, ""), "0", "no L2 reads: 0, not NaN");
        assert!(find("bogus").is_none());
        for f in DEFAULT_FIELDS.iter().chain(L2_FIELDS) {
            assert!(find(f).is_some(), "{f}");
        }
    }
}
