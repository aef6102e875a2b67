//! The NBD protocol: a fixed-newstyle server with out-of-order replies and a
//! small client. It knows nothing about caching: exports come through the
//! [`Export`] trait.

pub mod client;
pub mod conn;

pub mod proto;
pub mod server;
mod stream;
pub mod tls;
pub mod uri;

pub use arcache_batch::Batch;
pub use client::{Client, ClientError};
pub use conn::Conn;
pub use server::listeners::Listeners;
pub use server::{
    Completion, Errno, Export, ExportInfo, ExportSet, Extent, NbdResult, Piece, ReadCompletion, ReadEnd,
    Server, ServerConfig, SharedBytes, ThreadIo, ThreadIoStart,
};
pub use tls::{TlsPolicy, TlsSetupError};
pub use uri::{NbdUri, Target};
