//! Who last had a device open, and whether they closed it cleanly: a small
//! block both on-disk headers (L2 device, intent log) carry at the same
//! offset (docs/format.md, docs/intent-log.md). It answers "which host and
//! process wrote this last, and did it stop or die?" for `l2 dump` and
//! `log dump`, and for the warning a server logs when it opens a device
//! that was not closed.

use crate::le::{get_u32, get_u64, put_bytes};

/// Where the block sits in a 4 KiB header, past both export tables.
pub const OWNER_AT: usize = 3328;
/// Bytes the block takes.
pub const OWNER_LEN: usize = 88;
const HOST_AT: usize = 24;
const HOST_MAX: usize = 64;

/// What the last owner was doing with the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OwnerState {
    /// Written by a version that did not record owners (zero bytes).
    Unknown,
    /// Open: a server had it and had not closed it when this was written.
    InUse,
    /// Closed cleanly: everything was made durable before the server stopped.
    Closed,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner {
    pub state: OwnerState,
    pub pid: u32,
    /// Seconds since the Unix epoch when the state was recorded.
    pub since: u64,
    pub host: String,
}

impl Default for Owner {
    fn default() -> Self {
        Owner { state: OwnerState::Unknown, pid: 0, since: 0, host: String::new() }
    }
}

impl Owner {
    /// This process on this host, now.
    pub fn this_process(state: OwnerState) -> Owner {
        let since =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        Owner { state, pid: std::process::id(), since, host: hostname() }
    }

    /// Writes the block into `header` at [`OWNER_AT`].
    pub fn write(&self, header: &mut [u8]) {
        let b = &mut header[OWNER_AT..OWNER_AT + OWNER_LEN];
        b.fill(0);
        let state: u32 = match self.state {
            OwnerState::Unknown => 0,
            OwnerState::InUse => 1,
            OwnerState::Closed => 2,
        };
        put_bytes(b, 0, &state.to_le_bytes());
        put_bytes(b, 4, &self.pid.to_le_bytes());
        put_bytes(b, 8, &self.since.to_le_bytes());
        let host = truncate_utf8(&self.host, HOST_MAX);
        b[16] = host.len() as u8;
        put_bytes(b, HOST_AT, host.as_bytes());
    }

    /// Reads the block from a header whose checksum was verified; never
    /// fails (an unknown state or a bad name reads as unknown).
    pub fn read(header: &[u8]) -> Owner {
        let Some(b) = header.get(OWNER_AT..OWNER_AT + OWNER_LEN) else {
            return Owner::default();
        };
        let state = match get_u32(b, 0) {
            1 => OwnerState::InUse,
            2 => OwnerState::Closed,
            _ => OwnerState::Unknown,
        };
        let len = usize::from(b[16]).min(HOST_MAX);
        let host = host_name(&b[HOST_AT..HOST_AT + len]);
        Owner { state, pid: get_u32(b, 4), since: get_u64(b, 8), host }
    }

    /// One line for dumps and logs.
    pub fn describe(&self) -> String {
        match self.state {
            OwnerState::Unknown => "unknown (written before owners were recorded)".into(),
            OwnerState::InUse => format!(
                "host {} pid {}, opened {}, not closed (still in use, or it crashed or was killed)",
                self.host,
                self.pid,
                utc(self.since)
            ),
            OwnerState::Closed => {
                format!("host {} pid {}, closed cleanly {}", self.host, self.pid, utc(self.since))
            }
        }
    }
}

/// `secs` since the epoch as a UTC date and time (days to a civil date as
/// in Hinnant's `civil_from_days`), without a date crate for one line.
fn utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// This host's name, as the owner blocks and the S3 lease record it.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into our buffer.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if rc != 0 {
        return String::new();
    }
    let len = buf.iter().position(|&c| c == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..len]).into_owned()
}

/// A stored host name; bytes that are not UTF-8 read as one `?` each, so
/// the name keeps its length and a header rewritten from what was read is
/// the header that was read (a lossy U+FFFD is three bytes and would be cut).
fn host_name(raw: &[u8]) -> String {
    match std::str::from_utf8(raw) {
        Ok(s) => s.to_string(),
        Err(_) => raw.iter().map(|&c| if c.is_ascii() { c as char } else { '?' }).collect(),
    }
}

/// The longest prefix of `s` of at most `max` bytes that ends on a
/// character boundary.
pub fn truncate_utf8(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_reads_zeroes_as_unknown() {
        let mut h = vec![0u8; 4096];
        assert_eq!(Owner::read(&h), Owner::default());
        let o = Owner { state: OwnerState::Closed, pid: 4242, since: 1_700_000_000, host: "nas-ü".into() };
        o.write(&mut h);
        assert_eq!(Owner::read(&h), o);
        let me = Owner::this_process(OwnerState::InUse);
        me.write(&mut h);
        assert_eq!(Owner::read(&h), me);
        assert_eq!(me.pid, std::process::id());
    }

    /// Found by fuzz target zil_decode: a host name that is not UTF-8 read
    /// as U+FFFD (3 bytes per bad byte) did not survive a rewrite.
    #[test]
    fn a_host_name_that_is_not_utf8_survives_a_rewrite() {
        let mut h = vec![0u8; 4096];
        h[OWNER_AT + 16] = HOST_MAX as u8;
        h[OWNER_AT + HOST_AT..OWNER_AT + HOST_AT + HOST_MAX].fill(0xab);
        let read = Owner::read(&h);
        assert_eq!(read.host, "?".repeat(HOST_MAX));
        let mut again = vec![0u8; 4096];
        read.write(&mut again);
        assert_eq!(Owner::read(&again), read);
    }

    #[test]
    fn dates_are_utc() {
        assert_eq!(utc(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(utc(951_782_400), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc(1_795_579_288), "2026-11-25 04:01:28 UTC");
    }

    #[test]
    fn long_host_names_are_cut_at_a_char_boundary() {
        let mut h = vec![0u8; 4096];
        let o = Owner { state: OwnerState::InUse, pid: 1, since: 2, host: "é".repeat(40) };
        o.write(&mut h);
        let back = Owner::read(&h);
        assert_eq!(back.host, "é".repeat(32));
        assert!(h[OWNER_AT + OWNER_LEN..].iter().all(|&c| c == 0));
    }
}
