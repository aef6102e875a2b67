//! A device that remembers what a power cut would leave: the contents as of
//! the last flush, plus the writes since, any subset of which may or may
//! not have reached the medium.

use parking_lot::Mutex;

use crate::{check_range, BlockDev, DevResult, MemDev};

/// Writes go to the live contents and are also queued; `flush` makes the
/// queue durable. [`CrashDev::image`] builds what the device could hold
/// after a power cut now.
pub struct CrashDev {
    live: MemDev,
    state: Mutex<State>,
}

struct State {
    durable: Vec<u8>,
    pending: Vec<(u64, Vec<u8>)>,
}

impl CrashDev {
    pub fn new(size: u64) -> CrashDev {
        CrashDev {
            live: MemDev::new(size),
            state: Mutex::new(State { durable: vec![0; size as usize], pending: Vec::new() }),
        }
    }

    /// A device whose durable contents are `bytes` (a power-cut image).
    pub fn from_bytes(bytes: Vec<u8>) -> CrashDev {
        CrashDev {
            live: MemDev::from_bytes(bytes.clone()),
            state: Mutex::new(State { durable: bytes, pending: Vec::new() }),
        }
    }

    /// Writes not yet flushed.
    pub fn pending(&self) -> usize {
        self.state.lock().pending.len()
    }

    /// The contents after a power cut: everything flushed, plus the
    /// unflushed writes for which `keep(i)` says yes (in issue order, so a
    /// later kept write lands over an earlier one).
    pub fn image(&self, keep: impl FnMut(usize) -> bool) -> MemDev {
        MemDev::from_bytes(self.image_bytes(keep))
    }

    pub fn image_bytes(&self, mut keep: impl FnMut(usize) -> bool) -> Vec<u8> {
        let st = self.state.lock();
        let mut bytes = st.durable.clone();
        for (i, (off, data)) in st.pending.iter().enumerate() {
            if keep(i) {
                bytes[*off as usize..*off as usize + data.len()].copy_from_slice(data);
            }
        }
        bytes
    }
}

impl BlockDev for CrashDev {
    fn size(&self) -> u64 {
        self.live.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> DevResult<()> {
        self.live.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> DevResult<()> {
        check_range(self.size(), offset, buf.len() as u64)?;
        let mut st = self.state.lock();
        self.live.write_at(buf, offset)?;
        st.pending.push((offset, buf.to_vec()));
        Ok(())
    }
    fn flush(&self) -> DevResult<()> {
        let mut st = self.state.lock();
        let pending = std::mem::take(&mut st.pending);
        for (off, data) in pending {
            st.durable[off as usize..off as usize + data.len()].copy_from_slice(&data);
        }
        Ok(())
    }
    fn trim(&self, offset: u64, len: u64) -> DevResult<()> {
        // Trimmed contents are unspecified; keeping them is one valid outcome.
        check_range(self.size(), offset, len)
    }
    fn describe(&self) -> String {
        format!("crash({})", self.live.describe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_keeps_flushed_and_chosen_writes() {
        let d = CrashDev::new(4096);
        d.write_at(&[1; 512], 0).unwrap();
        d.flush().unwrap();
        d.write_at(&[2; 512], 512).unwrap();
        d.write_at(&[3; 512], 1024).unwrap();
        let mut buf = [0u8; 1536];
        d.image(|_| false).read_at(&mut buf, 0).unwrap();
        assert_eq!((buf[0], buf[512], buf[1024]), (1, 0, 0));
        d.image(|i| i == 1).read_at(&mut buf, 0).unwrap();
        assert_eq!((buf[0], buf[512], buf[1024]), (1, 0, 3));
        d.live.read_at(&mut buf, 0).unwrap();
        assert_eq!((buf[0], buf[512], buf[1024]), (1, 2, 3));
    }
}
