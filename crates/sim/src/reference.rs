//! The trace suite's reference points (`reference_hit_ratios.json` of a
//! trace directory, as traces/README.md describes it): for each trace, its
//! file and the cache sizes of its `4k` mode (or another mode's).

use std::io;
use std::path::{Path, PathBuf};

/// One trace of the suite and its `4k` reference sizes, in blocks.
#[derive(Debug, Clone)]
pub struct ReferenceTrace {
    pub name: String,
    pub path: PathBuf,
    pub sizes: Vec<u64>,
}

/// Every trace `dir`'s `reference_hit_ratios.json` lists, whether its file
/// is in `dir` or not (the repository ships some of them).
pub fn reference_traces(dir: &Path) -> io::Result<Vec<ReferenceTrace>> {
    reference_traces_in(dir, "4k")
}

/// The traces of `dir`'s reference file that have `mode` (`4k`, or `4k-r`:
/// reads alone), each with that mode's sizes: a trace without `4k` is an
/// error, one without another mode is left out.
pub fn reference_traces_in(dir: &Path, mode: &str) -> io::Result<Vec<ReferenceTrace>> {
    let text = std::fs::read_to_string(dir.join("reference_hit_ratios.json"))?;
    let bad =
        |what: &str| io::Error::new(io::ErrorKind::InvalidData, format!("reference_hit_ratios.json: {what}"));
    let refs: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(&e.to_string()))?;
    let traces = refs["traces"].as_object().ok_or_else(|| bad("no traces"))?;
    let mut out = Vec::new();
    for (name, t) in traces {
        let csv = t["csv"].as_str().ok_or_else(|| bad(&format!("{name} has no csv")))?;
        let Some(sizes) = t["modes"][mode]["sizes_blocks"].as_array() else {
            if mode == "4k" {
                return Err(bad(&format!("{name} has no 4k sizes")));
            }
            continue;
        };
        out.push(ReferenceTrace {
            name: name.clone(),
            path: dir.join(csv),
            sizes: sizes.iter().filter_map(|v| v.as_u64()).collect(),
        });
    }
    Ok(out)
}
