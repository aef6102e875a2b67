//! The two halves of a server connection, plain or TLS, so the protocol
//! code reads and writes without caring which.

use std::io::{self, Read};

use crate::conn::{write_all_vectored, Conn};
use crate::tls::{TlsReader, TlsWriter};

pub enum Reader {
    Plain(Conn),
    Tls(TlsReader),
}

impl Reader {
    /// The socket underneath, for its options.
    pub fn socket(&self) -> &Conn {
        match self {
            Reader::Plain(c) => c,
            Reader::Tls(t) => t.socket(),
        }
    }
}

impl Read for Reader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Reader::Plain(c) => c.read(buf),
            Reader::Tls(t) => t.read(buf),
        }
    }
}

pub enum Writer {
    Plain(Conn),
    Tls(TlsWriter),
}

impl Writer {
    /// Sends every byte of `parts`, in order, as one message.
    pub fn send(&mut self, parts: &[&[u8]]) -> io::Result<()> {
        match self {
            Writer::Plain(c) => write_all_vectored(c, parts),
            Writer::Tls(t) => t.send(parts),
        }
    }

    /// Drops the connection, so the reader notices too.
    pub fn shutdown(&self) {
        match self {
            Writer::Plain(c) => c.shutdown(),
            Writer::Tls(t) => t.shutdown(),
        }
    }

    /// Ends the connection the polite way (a TLS close_notify first).
    pub fn close(&self) {
        match self {
            Writer::Plain(c) => c.shutdown(),
            Writer::Tls(t) => t.close(),
        }
    }
}
