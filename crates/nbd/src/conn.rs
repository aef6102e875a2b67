//! One byte stream type for unix and TCP sockets.

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::uri::Target;

pub enum Conn {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Conn {
    pub fn connect(target: &Target) -> io::Result<Conn> {
        Conn::connect_within(target, None)
    }

    /// Connects, giving up on a TCP address that does not accept within
    /// `limit` (a unix socket connects at once or fails).
    pub fn connect_within(target: &Target, limit: Option<std::time::Duration>) -> io::Result<Conn> {
        match target {
            Target::Unix(p) => UnixStream::connect(p).map(Conn::Unix),
            Target::Tcp { host, port } => {
                let s = match limit {
                    None => TcpStream::connect((host.as_str(), *port))?,
                    Some(limit) => tcp_connect_within(host, *port, limit)?,
                };
                s.set_nodelay(true)?;
                Ok(Conn::Tcp(s))
            }
        }
    }

    pub fn try_clone(&self) -> io::Result<Conn> {
        match self {
            Conn::Unix(s) => s.try_clone().map(Conn::Unix),
            Conn::Tcp(s) => s.try_clone().map(Conn::Tcp),
        }
    }

    pub fn shutdown(&self) {
        let _ = match self {
            Conn::Unix(s) => s.shutdown(Shutdown::Both),
            Conn::Tcp(s) => s.shutdown(Shutdown::Both),
        };
    }

    /// Ends the receiving side only, so replies still in flight can go out.
    pub fn shutdown_read(&self) {
        let _ = match self {
            Conn::Unix(s) => s.shutdown(Shutdown::Read),
            Conn::Tcp(s) => s.shutdown(Shutdown::Read),
        };
    }

    pub fn peer(&self) -> String {
        match self {
            Conn::Unix(_) => "unix".to_string(),
            Conn::Tcp(s) => s.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "tcp".into()),
        }
    }

    pub fn set_read_timeout(&self, t: Option<std::time::Duration>) -> io::Result<()> {
        match self {
            Conn::Unix(s) => s.set_read_timeout(t),
            Conn::Tcp(s) => s.set_read_timeout(t),
        }
    }

    pub fn set_write_timeout(&self, t: Option<std::time::Duration>) -> io::Result<()> {
        match self {
            Conn::Unix(s) => s.set_write_timeout(t),
            Conn::Tcp(s) => s.set_write_timeout(t),
        }
    }
}

fn tcp_connect_within(host: &str, port: u16, limit: std::time::Duration) -> io::Result<TcpStream> {
    use std::net::ToSocketAddrs;
    let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{host} has no address"));
    for addr in (host, port).to_socket_addrs()? {
        match TcpStream::connect_timeout(&addr, limit) {
            Ok(s) => return Ok(s),
            Err(e) => last = e,
        }
    }
    Err(last)
}

impl std::os::fd::AsRawFd for Conn {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        match self {
            Conn::Unix(s) => s.as_raw_fd(),
            Conn::Tcp(s) => s.as_raw_fd(),
        }
    }
}

impl Read for Conn {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Conn::Unix(s) => s.read(buf),
            Conn::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Conn {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Conn::Unix(s) => s.write(buf),
            Conn::Tcp(s) => s.write(buf),
        }
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Conn::Unix(s) => s.write_vectored(bufs),
            Conn::Tcp(s) => s.write_vectored(bufs),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Sends this process sent again after they were interrupted
/// (`nbd_sends_interrupted`): what tells a test it reached the case.
pub static SENDS_INTERRUPTED: AtomicU64 = AtomicU64::new(0);

/// Writes all of `parts` with as few system calls as the kernel allows.
///
/// A send interrupted before it wrote anything is sent again. Interrupted
/// sends came only with the connection threads' own io_uring rings on (a
/// completion's task work can interrupt the owner's blocking system
/// calls, by all signs), and giving up there dropped the connection (fio
/// at queue depth 64 on L2 hits: libnbd saw the socket closed
/// mid-stream).
pub fn write_all_vectored(w: &mut impl Write, parts: &[&[u8]]) -> io::Result<()> {
    let mut idx = 0;
    let mut off = 0;
    while idx < parts.len() {
        let mut slices: Vec<io::IoSlice<'_>> = Vec::with_capacity(parts.len() - idx);
        slices.push(io::IoSlice::new(&parts[idx][off..]));
        for p in &parts[idx + 1..] {
            slices.push(io::IoSlice::new(p));
        }
        let mut n = match w.write_vectored(&slices) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                SENDS_INTERRUPTED.fetch_add(1, Relaxed);
                continue;
            }
            r => r?,
        };
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        while idx < parts.len() && n >= parts[idx].len() - off {
            n -= parts[idx].len() - off;
            idx += 1;
            off = 0;
        }
        off += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Takes at most `step` bytes a call, and is interrupted before every
    /// other call, as a socket is on a thread whose io_uring completions
    /// keep arriving.
    struct Interrupted {
        got: Vec<u8>,
        step: usize,
        calls: usize,
        interrupted: usize,
    }

    impl Write for Interrupted {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.write_vectored(&[io::IoSlice::new(buf)])
        }
        fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
            self.calls += 1;
            if self.calls % 2 == 1 {
                self.interrupted += 1;
                return Err(io::ErrorKind::Interrupted.into());
            }
            let mut room = self.step;
            for b in bufs {
                let n = b.len().min(room);
                self.got.extend_from_slice(&b[..n]);
                room -= n;
                if room == 0 {
                    break;
                }
            }
            Ok(self.step - room)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn an_interrupted_send_is_sent_again_and_every_byte_arrives_in_order() {
        let header: Vec<u8> = (0..16).collect();
        let payload: Vec<u8> = (0..4096u32).map(|i| (i * 7 % 251) as u8).collect();
        let tail = [0xabu8; 5];
        let mut w = Interrupted { got: Vec::new(), step: 1000, calls: 0, interrupted: 0 };
        write_all_vectored(&mut w, &[&header, &payload, &tail]).expect("interruptions are not errors");
        let want: Vec<u8> = [&header[..], &payload[..], &tail[..]].concat();
        assert!(w.got == want, "bytes lost, repeated or out of order");
        assert!(w.interrupted >= 5, "the writer was interrupted only {} times", w.interrupted);
    }
}
