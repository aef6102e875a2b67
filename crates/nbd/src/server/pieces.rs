//! A read's reply made of bytes the export already holds (the records of
//! its cache), written to the socket from where they lie. A large read
//! answered from a buffer costs a zeroed allocation and a copy of every
//! byte before the socket copies them once more; at hundreds of MB/s on
//! two cores those copies are a share of the CPU the client waits for.

use std::ops::Range;
use std::sync::Arc;

/// Bytes shared with their owner, who must not change them while a piece
/// is alive (a cache replaces a record rather than writing into one that
/// someone else holds).
pub type SharedBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// A range of shared bytes, in the order the reply carries them.
#[derive(Clone)]
pub struct Piece {
    bytes: SharedBytes,
    range: Range<usize>,
}

impl Piece {
    /// `range` of `bytes`; `None` if it lies outside them.
    pub fn new(bytes: SharedBytes, range: Range<usize>) -> Option<Piece> {
        let len = (*bytes).as_ref().len();
        (range.start <= range.end && range.end <= len).then_some(Piece { bytes, range })
    }

    /// All of `bytes`.
    pub fn whole(bytes: SharedBytes) -> Piece {
        let range = 0..(*bytes).as_ref().len();
        Piece { bytes, range }
    }

    /// A piece that owns its bytes (a record that had to be decompressed).
    pub fn owned(bytes: Vec<u8>) -> Piece {
        Piece::whole(Arc::new(bytes))
    }

    pub fn as_slice(&self) -> &[u8] {
        &(*self.bytes).as_ref()[self.range.clone()]
    }

    pub fn len(&self) -> usize {
        self.range.len()
    }

    pub fn is_empty(&self) -> bool {
        self.range.is_empty()
    }
}

impl std::fmt::Debug for Piece {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Piece").field("range", &self.range).finish()
    }
}

/// A reply's payload as a worker hands it to the writer.
pub(super) enum Payload {
    Bytes(Vec<u8>),
    Pieces(Vec<Piece>),
}

impl Payload {
    pub(super) fn empty() -> Payload {
        Payload::Bytes(Vec::new())
    }

    pub(super) fn slices(&self) -> Vec<&[u8]> {
        match self {
            Payload::Bytes(b) => vec![b.as_slice()],
            Payload::Pieces(p) => p.iter().map(Piece::as_slice).collect(),
        }
    }

    pub(super) fn bytes(&self) -> &[u8] {
        match self {
            Payload::Bytes(b) => b,
            Payload::Pieces(_) => &[],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_piece_outside_its_bytes_is_refused() {
        let bytes: SharedBytes = Arc::new(vec![1u8, 2, 3, 4]);
        assert_eq!(Piece::new(Arc::clone(&bytes), 1..3).map(|p| p.as_slice().to_vec()), Some(vec![2, 3]));
        assert!(Piece::new(Arc::clone(&bytes), 2..5).is_none());
        #[allow(clippy::reversed_empty_ranges)]
        let backwards = 3..2;
        assert!(Piece::new(bytes, backwards).is_none());
    }
}
