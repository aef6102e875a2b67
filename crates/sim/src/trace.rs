//! Readers for block traces. Today: the common CSV form of `shared/traces`
//! (`timestamp_us,op,offset_bytes,length_bytes[,dev]`), plain or gzipped.

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

/// Reads a whole trace; `.gz` files are decompressed on the fly.
pub fn read_trace(path: &Path) -> Result<Vec<TraceRequest>, TraceError> {
    let shown = path.display().to_string();
    let io_err = |source| TraceError::Io { path: shown.clone(), source };
    let file = File::open(path).map_err(io_err)?;
    let reader: Box<dyn Read> = if path.extension().is_some_and(|e| e == "gz") {
        Box::new(MultiGzDecoder::new(file))
    } else {
        Box::new(file)
    };
    parse_csv(BufReader::with_capacity(1 << 20, reader), &shown)
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
