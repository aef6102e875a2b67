//! Sizes as users write them: `4096`, `16K`, `1.5G`, `512MiB`.

use anyhow::{bail, Context, Result};

pub fn parse_size(s: &str) -> Result<u64> {
    let t = s.trim();
    let digits_end = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(digits_end);
    let num: f64 = num
        .parse()
        .with_context(|| format!("bad size {s:?}: expected a number with an optional K/M/G/T suffix"))?;
    let mult: u64 = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KB" | "KIB" => 1 << 10,
        "M" | "MB" | "MIB" => 1 << 20,
        "G" | "GB" | "GIB" => 1 << 30,
        "T" | "TB" | "TIB" => 1 << 40,
        other => bail!("bad size {s:?}: unknown unit {other:?} (use K, M, G or T)"),
    };
    let v = num * mult as f64;
    if !v.is_finite() || v < 0.0 || v > u64::MAX as f64 {
        bail!("bad size {s:?}: out of range");
    }
    Ok(v.round() as u64)
}

/// Formats bytes the way arcstat does: 1.5G, 16K, 512.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["", "K", "M", "G", "T"];
    let mut v = bytes as f64;
    let mut i = 0;
    while v >= 1024.0 && i < UNITS.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{bytes}")
    } else if v >= 100.0 {
        format!("{v:.0}{}", UNITS[i])
    } else {
        format!("{v:.1}{}", UNITS[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("16K").unwrap(), 16384);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("2MiB").unwrap(), 2 << 20);
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("").is_err());
        assert_eq!(human(16384), "16.0K");
        assert_eq!(human(1), "1");
    }
}
