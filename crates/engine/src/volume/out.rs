//! Where a read puts what it finds: a copy of its bytes in the reader's
//! buffer, or the records themselves, kept for a reply that writes them
//! from where they lie ([`Volume::read_held`]).
//!
//! A record is kept at the moment the read finds it (a hit, a copy read
//! from L2, a block read from the backing store), not looked up again once
//! the read is over: under a scan, the records a read brought in can be
//! evicted by other requests' before it could look for them, and each
//! would then be read a second time.

use std::ops::Range;

use blockdev::DevResult;

use super::Volume;
use crate::cache::RecordData;

/// One record of a read answered by [`Volume::read_held`], whole, in order.
#[derive(Debug)]
pub enum Held {
    /// The cached record, uncompressed: its stored bytes are the record's.
    /// A write replaces a record that someone holds rather than changing it
    /// (`Cache::patch_in_place`), so these bytes stay as they were read.
    Record(RecordData),
    /// Bytes of its own: a compressed record's plain bytes, or a record
    /// that no tier kept for the read (read again the copying way).
    Bytes(Vec<u8>),
}

impl Held {
    /// How a reply holds `data`: the record itself, or its plain bytes
    /// when it is compressed; `None` if those do not decompress.
    pub(crate) fn of(data: &RecordData) -> Option<Held> {
        if data.is_compressed() {
            data.to_vec().ok().map(Held::Bytes)
        } else {
            Some(Held::Record(RecordData::clone(data)))
        }
    }

    /// The record's bytes.
    pub fn as_slice(&self) -> &[u8] {
        match self {
            Held::Record(rec) => rec.stored(),
            Held::Bytes(b) => b,
        }
    }
}

pub(crate) enum Out<'a> {
    /// Bytes `offset..offset + len` of the volume, copied here.
    Copy(&'a mut [u8]),
    Keep(&'a mut Keep),
}

impl Out<'_> {
    /// The buffer of a copying read.
    pub(crate) fn buf(&mut self) -> Option<&mut [u8]> {
        match self {
            Out::Copy(buf) => Some(buf),
            Out::Keep(_) => None,
        }
    }

    /// The records a keeping read gathers.
    pub(crate) fn keep(&mut self) -> Option<&mut Keep> {
        match self {
            Out::Copy(_) => None,
            Out::Keep(keep) => Some(keep),
        }
    }
}

/// The records of a read of whole records `records`, as they are found.
pub(crate) struct Keep {
    records: Range<u64>,
    held: Vec<Option<Held>>,
}

impl Keep {
    pub(crate) fn new(records: Range<u64>) -> Keep {
        let held = (records.start..records.end).map(|_| None).collect();
        Keep { records, held }
    }

    /// Keeps record `r` (ignored outside the read: a record read ahead).
    /// A compressed record that does not decompress is left out: the
    /// copying read that [`Keep::finish`] falls back to reports it.
    pub(crate) fn keep(&mut self, r: u64, data: &RecordData) {
        if let Some(slot) = self.slot(r) {
            *slot = Held::of(data);
        }
    }

    /// Keeps a copy of record `r`'s plain bytes (ignored outside the read).
    pub(crate) fn keep_bytes(&mut self, r: u64, plain: &[u8]) {
        if let Some(slot) = self.slot(r) {
            *slot = Some(Held::Bytes(plain.to_vec()));
        }
    }

    fn slot(&mut self, r: u64) -> Option<&mut Option<Held>> {
        let i = r.checked_sub(self.records.start)?;
        self.held.get_mut(usize::try_from(i).ok()?)
    }

    /// The records in order; a record no tier kept is read the copying way.
    pub(crate) fn finish(self, vol: &Volume) -> DevResult<Vec<Held>> {
        let first = self.records.start;
        let mut out = Vec::with_capacity(self.held.len());
        for (r, held) in (first..).zip(self.held) {
            out.push(match held {
                Some(h) => h,
                None => Held::Bytes(vol.read_record_copy(r)?),
            });
        }
        Ok(out)
    }
}
