//! The L2ARC: records evicted from RAM kept on fast devices (SSD files or
//! block devices) written as rotary logs, found through a compact index, and
//! verified by checksum on every read.

pub mod index;
