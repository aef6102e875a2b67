//! Readers for block traces, chosen by file name, each plain, `.gz` or
//! `.zst`:
//! - the common CSV form of `shared/traces`
//!   (`timestamp_us,op,offset_bytes,length_bytes[,dev]`);
//! - the ARC paper's `.lis` (`start_block count ignored request_no`, 512-byte
//!   blocks, reads only; `--block-size 512` counts in the trace's own blocks);
//! - libCacheSim's `oracleGeneral` binary (`*.oracleGeneral*`: 24-byte
//!   records `u32 time_s, u64 obj_id, u32 obj_size, i64 next_access`), one
//!   4 KiB block per record, keyed by `obj_id`.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::Path;

use flate2::read::MultiGzDecoder;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TraceRequest {
    pub ts_us: u64,
    pub write: bool,
    pub offset: u64,
    pub len: u64,
    pub dev: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("cannot read trace {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path}:{line}: {msg}")]
    Parse { path: String, line: usize, msg: String },
}

/// Reads a whole trace, decompressing `.gz` and `.zst` on the fly.
pub fn read_trace(path: &Path) -> Result<Vec<TraceRequest>, TraceError> {
    let shown = path.display().to_string();
    let io_err = |source| TraceError::Io { path: shown.clone(), source };
    let file = File::open(path).map_err(io_err)?;
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let (reader, stem): (Box<dyn Read>, &str) = if let Some(stem) = name.strip_suffix(".gz") {
        (Box::new(MultiGzDecoder::new(file)), stem)
    } else if let Some(stem) = name.strip_suffix(".zst") {
        let d = ruzstd::decoding::StreamingDecoder::new(file)
            .map_err(|e| io_err(std::io::Error::new(std::io::ErrorKind::InvalidData, e.to_string())))?;
        (Box::new(d), stem)
    } else {
        (Box::new(file), name.as_str())
    };
    let buffered = BufReader::with_capacity(1 << 20, reader);
    if stem.ends_with(".lis") {
        parse_lis(buffered, &shown)
    } else if stem.contains(".oracleGeneral") {
        parse_oracle_general(buffered, &shown)
    } else {
        parse_csv(buffered, &shown)
    }
}

/// The ARC paper's `.lis`: `start count ignored request_no` per line.
pub fn parse_lis(reader: impl BufRead, name: &str) -> Result<Vec<TraceRequest>, TraceError> {
    let mut out = Vec::new();
    for (i, line) in reader.lines().enumerate() {
        let line = line.map_err(|source| TraceError::Io { path: name.to_string(), source })?;
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let err = |msg: String| TraceError::Parse { path: name.to_string(), line: i + 1, msg };
        let mut f = line.split_whitespace();
        let start = number(&mut f, "start block").map_err(err)?;
        let count = number(&mut f, "block count").map_err(err)?;
        let offset = start.checked_mul(512).ok_or_else(|| err("start block too large".into()))?;
        let len = count.checked_mul(512).filter(|l| offset.checked_add(*l).is_some());
        let len = len.ok_or_else(|| err("block count too large".into()))?;
        out.push(TraceRequest { ts_us: i as u64, write: false, offset, len, dev: 0 });
    }
    Ok(out)
}

/// libCacheSim's oracleGeneral binary: 24-byte little-endian records.
pub fn parse_oracle_general(mut reader: impl Read, name: &str) -> Result<Vec<TraceRequest>, TraceError> {
    let mut out = Vec::new();
    let mut rec = [0u8; 24];
    loop {
        match read_record(&mut reader, &mut rec) {
            Ok(true) => {}
            Ok(false) => return Ok(out),
            Err(source) => return Err(TraceError::Io { path: name.to_string(), source }),
        }
        let time = u32::from_le_bytes([rec[0], rec[1], rec[2], rec[3]]);
        let mut id = [0u8; 8];
        id.copy_from_slice(&rec[4..12]);
        let obj = u64::from_le_bytes(id);
        let Some(offset) = obj.checked_mul(4096).filter(|o| o.checked_add(4096).is_some()) else {
            return Err(TraceError::Parse {
                path: name.to_string(),
                line: out.len() + 1,
                msg: format!("object id {obj} too large"),
            });
        };
        out.push(TraceRequest {
            ts_us: u64::from(time) * 1_000_000,
            write: false,
            offset,
            len: 4096,
            dev: 0,
        });
    }
}

/// Fills `rec`; false at a clean end of input, an error for a torn record.
fn read_record(r: &mut impl Read, rec: &mut [u8; 24]) -> std::io::Result<bool> {
    let mut got = 0;
    while got < rec.len() {
        match r.read(&mut rec[got..]) {
            Ok(0) if got == 0 => return Ok(false),
            Ok(0) => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "trace ends inside a record",
                ))
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

/// Parses the CSV form; a first line that does not start with a digit is a header.
pub fn parse_csv(reader: impl BufRead, name: &str) -> Result<Vec<TraceRequest>, TraceError> {
    let mut out = Vec::new();
    for (i, line) in reader.lines().enumerate() {
        let line = line.map_err(|source| TraceError::Io { path: name.to_string(), source })?;
        let line = line.trim();
        if line.is_empty() || (i == 0 && !line.starts_with(|c: char| c.is_ascii_digit())) {
            continue;
        }
        out.push(parse_line(line).map_err(|msg| TraceError::Parse {
            path: name.to_string(),
            line: i + 1,
            msg,
        })?);
    }
    Ok(out)
}

fn field<'a>(f: &mut impl Iterator<Item = &'a str>, what: &str) -> Result<&'a str, String> {
    f.next().map(str::trim).ok_or_else(|| format!("missing {what}"))
}

fn number<'a>(f: &mut impl Iterator<Item = &'a str>, what: &str) -> Result<u64, String> {
    let s = field(f, what)?;
    s.parse::<u64>().map_err(|e| format!("bad {what} {s:?}: {e}"))
}

fn parse_line(line: &str) -> Result<TraceRequest, String> {
    let mut f = line.split(',');
    let ts_us = number(&mut f, "timestamp")?;
    let write = match field(&mut f, "op")? {
        "R" | "r" | "0" => false,
        "W" | "w" | "1" => true,
        other => return Err(format!("bad op {other:?} (want R or W)")),
    };
    let offset = number(&mut f, "offset")?;
    let len = number(&mut f, "length")?;
    // The volume column is optional; when present it must be a number.
    let mut rest = f.peekable();
    let dev = if rest.peek().is_some() { number(&mut rest, "dev")? } else { 0 };
    if offset.checked_add(len).is_none() {
        return Err("offset + length overflows".into());
    }
    Ok(TraceRequest { ts_us, write, offset, len, dev })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_header_rows_and_dev_column() {
        let text = "timestamp_us,op,offset_bytes,length_bytes,dev\n5,W,8192,4096,3\n6,R,0,512,1\n";
        let r = parse_csv(text.as_bytes(), "t").unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(r[0], TraceRequest { ts_us: 5, write: true, offset: 8192, len: 4096, dev: 3 });
        assert!(!r[1].write);
    }

    #[test]
    fn rejects_garbage_with_line_number() {
        let err = parse_csv("1,X,0,1\n".as_bytes(), "t").unwrap_err().to_string();
        assert!(err.contains("t:1") && err.contains("bad op"), "{err}");
        let err = parse_csv("1,R,zz,1\n".as_bytes(), "t").unwrap_err().to_string();
        assert!(err.contains("bad offset"), "{err}");
        let err = parse_csv("1,R,0,1,vol\n".as_bytes(), "t").unwrap_err().to_string();
        assert!(err.contains("bad dev"), "{err}");
    }
}
