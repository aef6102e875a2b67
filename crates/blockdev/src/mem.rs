use parking_lot::RwLock;

use crate::{check_range, BlockDev, DevResult};

/// A device in RAM, for tests and simulations.
pub struct MemDev {
    data: RwLock<Vec<u8>>,
    read_unit: Option<u64>,
}

impl MemDev {
    pub fn new(size: u64) -> Self {
        MemDev { data: RwLock::new(vec![0; size as usize]), read_unit: None }
    }

    /// A device that, like an object store, asks to be read in `unit`
    /// bytes at a time ([`BlockDev::read_unit`]).
    pub fn with_read_unit(size: u64, unit: u64) -> Self {
        MemDev { read_unit: Some(unit), ..MemDev::new(size) }
    }

    pub fn from_bytes(bytes: Vec<u8>) -> Self {
        MemDev { data: RwLock::new(bytes), read_unit: None }
    }

    /// A copy of the whole contents.
    pub fn snapshot(&self) -> Vec<u8> {
        self.data.read().clone()
    }
}

impl BlockDev for MemDev {
    fn size(&self) -> u64 {
        self.data.read().len() as u64
    }

    fn read_unit(&self) -> Option<u64> {
        self.read_unit
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> DevResult<()> {
        let data = self.data.read();
        check_range(data.len() as u64, offset, buf.len() as u64)?;
        buf.copy_from_slice(&data[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }

    /// As a file or an object store does: one read for all the buffers,
    /// so the engine's tests go the way those stores' reads go.
    fn scatters_reads(&self) -> bool {
        true
    }

    fn read_scattered(&self, bufs: &mut [&mut [std::mem::MaybeUninit<u8>]], offset: u64) -> DevResult<()> {
        let data = self.data.read();
        let len: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        check_range(data.len() as u64, offset, len)?;
        let mut at = offset as usize;
        for b in bufs.iter_mut() {
            let src = &data[at..at + b.len()];
            // SAFETY: `src` and `b` have the same length and are distinct
            // allocations.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), b.as_mut_ptr() as *mut u8, b.len()) };
            at += b.len();
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> DevResult<()> {
        let mut data = self.data.write();
        check_range(data.len() as u64, offset, buf.len() as u64)?;
        data[offset as usize..offset as usize + buf.len()].copy_from_slice(buf);
        Ok(())
    }

    fn flush(&self) -> DevResult<()> {
        Ok(())
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> DevResult<()> {
        let mut data = self.data.write();
        check_range(data.len() as u64, offset, len)?;
        data[offset as usize..(offset + len) as usize].fill(0);
        Ok(())
    }

    fn describe(&self) -> String {
        format!("mem:{}", self.size())
    }
}
