use std::ops::Range;

use parking_lot::Mutex;
use rand::{rngs::StdRng, Rng, SeedableRng};

use crate::{BlockDev, DevError, DevResult};

/// Which faults a [`FaultyDev`] injects; changeable while it is in use.
#[derive(Debug, Clone, Default)]
pub struct FaultPlan {
    /// Reads touching any of these byte ranges fail.
    pub fail_reads: Vec<Range<u64>>,
    /// Writes (and zeroing) touching any of these byte ranges fail.
    pub fail_writes: Vec<Range<u64>>,
    pub fail_flush: bool,
    /// Every trim fails.
    pub fail_trims: bool,
    /// Probability that a read returns with one bit flipped.
    pub flip_bit_probability: f64,
}

/// Injects IO errors and silent corruption into the device below it.
pub struct FaultyDev<D> {
    inner: D,
    plan: Mutex<FaultPlan>,
    rng: Mutex<StdRng>,
}

fn touches(ranges: &[Range<u64>], offset: u64, len: u64) -> bool {
    let end = offset.saturating_add(len.max(1));
    ranges.iter().any(|r| r.start < end && offset < r.end)
}

impl<D: BlockDev> FaultyDev<D> {
    pub fn new(inner: D, seed: u64) -> Self {
        FaultyDev {
            inner,
            plan: Mutex::new(FaultPlan::default()),
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
        }
    }

    pub fn set_plan(&self, plan: FaultPlan) {
        *self.plan.lock() = plan;
    }

    pub fn plan(&self) -> FaultPlan {
        self.plan.lock().clone()
    }
}

impl<D: BlockDev> BlockDev for FaultyDev<D> {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> DevResult<()> {
        let plan = self.plan.lock().clone();
        if touches(&plan.fail_reads, offset, buf.len() as u64) {
            return Err(DevError::Injected { op: "read", offset });
        }
        self.inner.read_at(buf, offset)?;
        if plan.flip_bit_probability > 0.0 && !buf.is_empty() {
            let mut rng = self.rng.lock();
            if rng.gen_bool(plan.flip_bit_probability.min(1.0)) {
                let i = rng.gen_range(0..buf.len());
                buf[i] ^= 1 << rng.gen_range(0..8);
            }
        }
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> DevResult<()> {
        if touches(&self.plan.lock().fail_writes, offset, buf.len() as u64) {
            return Err(DevError::Injected { op: "write", offset });
        }
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> DevResult<()> {
        if self.plan.lock().fail_flush {
            return Err(DevError::Injected { op: "flush", offset: 0 });
        }
        self.inner.flush()
    }
    fn trim(&self, offset: u64, len: u64) -> DevResult<()> {
        if self.plan.lock().fail_trims {
            return Err(DevError::Injected { op: "trim", offset });
        }
        self.inner.trim(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> DevResult<()> {
        if touches(&self.plan.lock().fail_writes, offset, len) {
            return Err(DevError::Injected { op: "write_zeroes", offset });
        }
        self.inner.write_zeroes(offset, len)
    }
    fn describe(&self) -> String {
        format!("faulty({})", self.inner.describe())
    }
    fn is_read_only(&self) -> bool {
        self.inner.is_read_only()
    }
    fn flush_covers_all_handles(&self) -> bool {
        self.inner.flush_covers_all_handles()
    }
    crate::forward_store_hints!();
}
