//! A small blocking NBD client: fixed newstyle, OPT_GO, simple replies, one
//! request at a time per connection, optionally over TLS (STARTTLS). Used
//! to put arcache in front of a remote export, by the demo and by tests.

use std::io::{self, BufReader, Read, Write};

use crate::conn::{write_all_vectored, Conn};
use crate::proto::*;
use crate::uri::{NbdUri, Target};

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("NBD connection: {0}")]
    Io(#[from] io::Error),
    #[error("NBD handshake: {0}")]
    Handshake(String),
    #[error("server answered {op} with errno {errno}")]
    Request { op: &'static str, errno: u32 },
    #[error("NBD TLS: {0}")]
    Tls(String),
    #[error(
        "no answer within {0:?}: the server accepted the connection but did not finish the NBD handshake"
    )]
    TimedOut(std::time::Duration),
}

impl ClientError {
    /// The errno to report upward: the server's own, or EIO for a broken link.
    pub fn errno(&self) -> i32 {
        match self {
            ClientError::Request { errno, .. } => *errno as i32,
            _ => libc::EIO,
        }
    }
}

pub type ClientResult<T> = Result<T, ClientError>;

/// The connection, plain or TLS; one request at a time uses it both ways.
enum Stream {
    Plain(Conn),
    Tls(Box<rustls::StreamOwned<rustls::ClientConnection, Conn>>),
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(c) => c.read(buf),
            Stream::Tls(t) => t.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(c) => c.write(buf),
            Stream::Tls(t) => t.write(buf),
        }
    }
    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Plain(c) => c.write_vectored(bufs),
            Stream::Tls(t) => t.write_vectored(bufs),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(c) => c.flush(),
            Stream::Tls(t) => t.flush(),
        }
    }
}

fn is_timeout(e: &io::Error) -> bool {
    matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut)
}

impl Stream {
    /// The socket under TLS or not (socket options apply to both).
    fn conn(&self) -> &Conn {
        match self {
            Stream::Plain(c) => c,
            Stream::Tls(t) => &t.sock,
        }
    }

    fn shutdown(&mut self) {
        match self {
            Stream::Plain(c) => c.shutdown(),
            Stream::Tls(t) => {
                t.conn.send_close_notify();
                let _ = t.flush();
                t.sock.shutdown();
            }
        }
    }
}

pub struct Client {
    io: BufReader<Stream>,
    size: u64,
    flags: u16,
    next_handle: u64,
    /// The context id of `base:allocation`, on a connection opened for
    /// block status (structured replies negotiated).
    status_context: Option<u32>,
}

fn bad_reply(msg: String) -> ClientError {
    ClientError::Io(io::Error::new(io::ErrorKind::InvalidData, msg))
}

fn handshake_err(msg: impl Into<String>) -> ClientError {
    ClientError::Handshake(msg.into())
}

impl Client {
    /// Connects and selects `export` with OPT_GO.
    pub fn connect(target: &Target, export: &str) -> ClientResult<Client> {
        let mut c = Client::greeted(target)?;
        c.go(export)?;
        Ok(c)
    }

    /// Connects to what `uri` names, negotiating TLS for `nbds` URIs.
    pub fn connect_uri(uri: &NbdUri) -> ClientResult<Client> {
        Client::connect_uri_within(uri, None)
    }

    /// As [`Client::connect_uri`], failing with [`ClientError::TimedOut`]
    /// when connecting and the handshake take longer than `limit`: a server
    /// that accepts and never answers must not hang its caller for ever.
    pub fn connect_uri_within(uri: &NbdUri, limit: Option<std::time::Duration>) -> ClientResult<Client> {
        let timed_out = |e: ClientError| match &e {
            ClientError::Io(io) if is_timeout(io) => limit.map_or(e, ClientError::TimedOut),
            _ => e,
        };
        let c = Client::negotiate(uri, limit, false).map_err(timed_out)?;
        // Requests have no time limit here; the caller decides for them.
        c.io.get_ref().conn().set_read_timeout(None)?;
        c.io.get_ref().conn().set_write_timeout(None)?;
        Ok(c)
    }

    /// A connection for [`Client::block_status`] only: structured replies
    /// and `base:allocation` negotiated (an error if the server offers
    /// them not). Other requests are not to be sent on it.
    pub fn connect_for_block_status(
        uri: &NbdUri,
        limit: Option<std::time::Duration>,
    ) -> ClientResult<Client> {
        let c = Client::negotiate(uri, limit, true)?;
        c.io.get_ref().conn().set_read_timeout(None)?;
        c.io.get_ref().conn().set_write_timeout(None)?;
        Ok(c)
    }

    fn negotiate(uri: &NbdUri, limit: Option<std::time::Duration>, for_status: bool) -> ClientResult<Client> {
        let conn = Conn::connect_within(&uri.target, limit)?;
        conn.set_read_timeout(limit)?;
        conn.set_write_timeout(limit)?;
        let mut c = Client::greeted_on(conn)?;
        if let Some(tls) = &uri.tls {
            let config = crate::tls::client_config(tls).map_err(|e| ClientError::Tls(e.to_string()))?;
            let name = tls.hostname.clone().unwrap_or_else(|| match &uri.target {
                Target::Tcp { host, .. } => host.clone(),
                Target::Unix(_) => "localhost".to_string(),
            });
            c.start_tls(config, name)?;
        }
        if for_status {
            c.status_context = Some(c.select_base_allocation(&uri.export)?);
        }
        c.go(&uri.export)?;
        Ok(c)
    }

    /// A connection that has finished the greeting and may send options.
    fn greeted(target: &Target) -> ClientResult<Client> {
        Client::greeted_on(Conn::connect(target)?)
    }

    fn greeted_on(conn: Conn) -> ClientResult<Client> {
        let mut c = Client {
            io: BufReader::new(Stream::Plain(conn)),
            size: 0,
            flags: 0,
            next_handle: 1,
            status_context: None,
        };
        c.greet()?;
        Ok(c)
    }

    /// NBD_OPT_STARTTLS, then the TLS handshake; options go on inside it.
    fn start_tls(&mut self, config: std::sync::Arc<rustls::ClientConfig>, name: String) -> ClientResult<()> {
        self.send_option(OPT_STARTTLS, &[])?;
        let (kind, msg) = self.option_reply(OPT_STARTTLS)?;
        if kind != REP_ACK {
            return Err(ClientError::Tls(format!(
                "the server refused STARTTLS ({kind:#x}): {}",
                String::from_utf8_lossy(&msg)
            )));
        }
        if !self.io.buffer().is_empty() {
            return Err(ClientError::Tls("the server sent data before the TLS handshake".into()));
        }
        let Stream::Plain(conn) = self.io.get_ref() else {
            return Err(ClientError::Tls("TLS is already on".into()));
        };
        let mut sock = conn.try_clone()?;
        let server = rustls::pki_types::ServerName::try_from(name.clone())
            .map_err(|_| ClientError::Tls(format!("{name:?} is not a valid TLS server name")))?;
        let mut tls =
            rustls::ClientConnection::new(config, server).map_err(|e| ClientError::Tls(e.to_string()))?;
        while tls.is_handshaking() {
            tls.complete_io(&mut sock).map_err(|e| {
                if is_timeout(&e) {
                    ClientError::Io(e)
                } else {
                    ClientError::Tls(format!("handshake with {name}: {e}"))
                }
            })?;
        }
        self.io = BufReader::new(Stream::Tls(Box::new(rustls::StreamOwned::new(tls, sock))));
        Ok(())
    }

    /// Lists the server's exports with OPT_LIST, then aborts.
    pub fn list(target: &Target) -> ClientResult<Vec<String>> {
        let mut c = Client::greeted(target)?;
        c.send_option(OPT_LIST, &[])?;
        let mut names = Vec::new();
        loop {
            let (kind, data) = c.option_reply(OPT_LIST)?;
            match kind {
                REP_ACK => break,
                REP_SERVER if data.len() >= 4 => {
                    let n = u32::from_be_bytes([data[0], data[1], data[2], data[3]]) as usize;
                    let name = data.get(4..4 + n).ok_or_else(|| handshake_err("short LIST reply"))?;
                    names.push(String::from_utf8_lossy(name).into_owned());
                }
                other => return Err(handshake_err(format!("LIST answered {other:#x}"))),
            }
        }
        let _ = c.send_option(OPT_ABORT, &[]);
        Ok(names)
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    pub fn transmission_flags(&self) -> u16 {
        self.flags
    }

    pub fn read_only(&self) -> bool {
        self.flags & TFLAG_READ_ONLY != 0
    }

    pub fn can_multi_conn(&self) -> bool {
        self.flags & TFLAG_CAN_MULTI_CONN != 0
    }

    fn greet(&mut self) -> ClientResult<()> {
        let mut b = [0u8; 18];
        self.io.read_exact(&mut b)?;
        if b[0..8] != NBDMAGIC.to_be_bytes() || b[8..16] != IHAVEOPT.to_be_bytes() {
            return Err(handshake_err("not a fixed-newstyle NBD server"));
        }
        let hs = u16::from_be_bytes([b[16], b[17]]);
        if hs & FLAG_FIXED_NEWSTYLE == 0 {
            return Err(handshake_err("server lacks fixed newstyle"));
        }
        let mut cf = FLAG_C_FIXED_NEWSTYLE;
        if hs & FLAG_NO_ZEROES != 0 {
            cf |= FLAG_C_NO_ZEROES;
        }
        self.io.get_mut().write_all(&cf.to_be_bytes())?;
        Ok(())
    }

    /// Negotiates structured replies and selects `base:allocation` for
    /// `export`; returns its context id.
    fn select_base_allocation(&mut self, export: &str) -> ClientResult<u32> {
        self.send_option(OPT_STRUCTURED_REPLY, &[])?;
        if self.option_reply(OPT_STRUCTURED_REPLY)?.0 != REP_ACK {
            return Err(handshake_err("the server has no structured replies"));
        }
        let mut d = Vec::new();
        d.extend_from_slice(&(export.len() as u32).to_be_bytes());
        d.extend_from_slice(export.as_bytes());
        d.extend_from_slice(&1u32.to_be_bytes());
        d.extend_from_slice(&(META_BASE_ALLOCATION.len() as u32).to_be_bytes());
        d.extend_from_slice(META_BASE_ALLOCATION.as_bytes());
        self.send_option(OPT_SET_META_CONTEXT, &d)?;
        let mut id = None;
        loop {
            match self.option_reply(OPT_SET_META_CONTEXT)? {
                (REP_META_CONTEXT, data)
                    if data.len() >= 4 && &data[4..] == META_BASE_ALLOCATION.as_bytes() =>
                {
                    id = Some(u32::from_be_bytes([data[0], data[1], data[2], data[3]]));
                }
                (REP_META_CONTEXT, _) => {}
                (REP_ACK, _) => break,
                (err, _) => return Err(handshake_err(format!("SET_META_CONTEXT refused ({err:#x})"))),
            }
        }
        id.ok_or_else(|| handshake_err("the server does not offer base:allocation"))
    }

    /// The `base:allocation` extents of `[offset, offset+len)` as
    /// (length, flags) from `offset`, as the server gave them; on a
    /// connection from [`Client::connect_for_block_status`].
    pub fn block_status(&mut self, offset: u64, len: u32) -> ClientResult<Vec<(u32, u32)>> {
        let Some(ctx) = self.status_context else {
            return Err(handshake_err("block status asked on a connection not opened for it"));
        };
        let handle = self.request(CMD_BLOCK_STATUS, 0, offset, len, &[])?;
        let mut extents = Vec::new();
        loop {
            let (flags, kind, payload) = self.structured_chunk(handle)?;
            match kind {
                REPLY_TYPE_BLOCK_STATUS if payload.len() >= 4 && (payload.len() - 4) % 8 == 0 => {
                    if u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) == ctx {
                        extents.extend(payload[4..].chunks_exact(8).map(|d| {
                            (
                                u32::from_be_bytes([d[0], d[1], d[2], d[3]]),
                                u32::from_be_bytes([d[4], d[5], d[6], d[7]]),
                            )
                        }));
                    }
                }
                REPLY_TYPE_NONE => {}
                k if k & 0x8000 != 0 && payload.len() >= 4 => {
                    let errno = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]);
                    return Err(ClientError::Request { op: "block status", errno });
                }
                other => return Err(bad_reply(format!("unexpected block status chunk type {other}"))),
            }
            if flags & REPLY_FLAG_DONE != 0 {
                return Ok(extents);
            }
        }
    }

    /// One structured reply chunk for `handle`: (flags, type, payload). A
    /// simple reply (servers may send one for an error) comes back as an
    /// error chunk.
    fn structured_chunk(&mut self, handle: u64) -> ClientResult<(u16, u16, Vec<u8>)> {
        let mut magic = [0u8; 4];
        self.io.read_exact(&mut magic)?;
        if magic == SIMPLE_REPLY_MAGIC.to_be_bytes() {
            let mut rest = [0u8; 12];
            self.io.read_exact(&mut rest)?;
            let errno = u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]);
            return Ok((REPLY_FLAG_DONE, REPLY_TYPE_ERROR, errno.to_be_bytes().to_vec()));
        }
        if magic != STRUCTURED_REPLY_MAGIC.to_be_bytes() {
            return Err(bad_reply("bad reply magic".into()));
        }
        let mut h = [0u8; 16];
        self.io.read_exact(&mut h)?;
        let flags = u16::from_be_bytes([h[0], h[1]]);
        let kind = u16::from_be_bytes([h[2], h[3]]);
        let got = u64::from_be_bytes(h[4..12].try_into().map_err(|_| bad_reply("short reply".into()))?);
        let len = u32::from_be_bytes([h[12], h[13], h[14], h[15]]);
        if got != handle {
            return Err(bad_reply("reply for another request".into()));
        }
        // A block status answer for one request: a few MiB at the very most.
        if len > 16 << 20 {
            return Err(bad_reply(format!("a {len}-byte reply chunk")));
        }
        let mut payload = vec![0u8; len as usize];
        self.io.read_exact(&mut payload)?;
        Ok((flags, kind, payload))
    }

    fn send_option(&mut self, opt: u32, data: &[u8]) -> ClientResult<()> {
        let mut h = [0u8; 16];
        h[0..8].copy_from_slice(&IHAVEOPT.to_be_bytes());
        h[8..12].copy_from_slice(&opt.to_be_bytes());
        h[12..16].copy_from_slice(&(data.len() as u32).to_be_bytes());
        write_all_vectored(self.io.get_mut(), &[&h, data])?;
        Ok(())
    }

    fn option_reply(&mut self, opt: u32) -> ClientResult<(u32, Vec<u8>)> {
        let mut h = [0u8; 20];
        self.io.read_exact(&mut h)?;
        if h[0..8] != OPTION_REPLY_MAGIC.to_be_bytes() {
            return Err(handshake_err("bad option reply magic"));
        }
        let got_opt = u32::from_be_bytes([h[8], h[9], h[10], h[11]]);
        if got_opt != opt {
            return Err(handshake_err(format!("reply for option {got_opt}, asked {opt}")));
        }
        let kind = u32::from_be_bytes([h[12], h[13], h[14], h[15]]);
        let len = u32::from_be_bytes([h[16], h[17], h[18], h[19]]);
        if len > 64 << 10 {
            return Err(handshake_err("oversized option reply"));
        }
        let mut data = vec![0u8; len as usize];
        self.io.read_exact(&mut data)?;
        Ok((kind, data))
    }

    fn go(&mut self, export: &str) -> ClientResult<()> {
        let mut d = Vec::new();
        d.extend_from_slice(&(export.len() as u32).to_be_bytes());
        d.extend_from_slice(export.as_bytes());
        d.extend_from_slice(&0u16.to_be_bytes());
        self.send_option(OPT_GO, &d)?;
        let mut got_export = false;
        loop {
            let (kind, data) = self.option_reply(OPT_GO)?;
            match kind {
                REP_ACK if got_export => return Ok(()),
                REP_ACK => return Err(handshake_err("GO acknowledged without export info")),
                REP_INFO if data.len() >= 12 && data[0..2] == INFO_EXPORT.to_be_bytes() => {
                    self.size =
                        u64::from_be_bytes(data[2..10].try_into().map_err(|_| handshake_err("short info"))?);
                    self.flags = u16::from_be_bytes([data[10], data[11]]);
                    got_export = true;
                }
                REP_INFO => {}
                REP_ERR_TLS_REQD => {
                    return Err(handshake_err("the server requires TLS: use an nbds:// or nbds+unix:// URI"))
                }
                err if err & REP_FLAG_ERROR != 0 => {
                    return Err(handshake_err(format!(
                        "export {export:?} refused ({err:#x}): {}",
                        String::from_utf8_lossy(&data)
                    )))
                }
                other => return Err(handshake_err(format!("unexpected GO reply {other:#x}"))),
            }
        }
    }

    fn request(
        &mut self,
        kind: u16,
        flags: u16,
        offset: u64,
        length: u32,
        payload: &[u8],
    ) -> ClientResult<u64> {
        let handle = self.next_handle;
        self.next_handle += 1;
        let req = Request { flags, kind, handle, offset, length };
        write_all_vectored(self.io.get_mut(), &[&req.encode(), payload])?;
        Ok(handle)
    }

    fn reply(&mut self, op: &'static str, handle: u64) -> ClientResult<()> {
        let mut h = [0u8; 16];
        self.io.read_exact(&mut h)?;
        if h[0..4] != SIMPLE_REPLY_MAGIC.to_be_bytes() {
            return Err(ClientError::Io(io::Error::new(io::ErrorKind::InvalidData, "bad reply magic")));
        }
        let got = u64::from_be_bytes(h[8..16].try_into().map_err(|_| handshake_err("short reply"))?);
        if got != handle {
            return Err(ClientError::Io(io::Error::new(
                io::ErrorKind::InvalidData,
                "reply for another request",
            )));
        }
        match u32::from_be_bytes([h[4], h[5], h[6], h[7]]) {
            0 => Ok(()),
            errno => Err(ClientError::Request { op, errno }),
        }
    }

    pub fn read(&mut self, offset: u64, buf: &mut [u8]) -> ClientResult<()> {
        let h = self.request(CMD_READ, 0, offset, buf.len() as u32, &[])?;
        self.reply("read", h)?;
        self.io.read_exact(buf)?;
        Ok(())
    }

    pub fn write(&mut self, offset: u64, data: &[u8], fua: bool) -> ClientResult<()> {
        let flags = if fua { CMD_FLAG_FUA } else { 0 };
        let h = self.request(CMD_WRITE, flags, offset, data.len() as u32, data)?;
        self.reply("write", h)
    }

    /// Sends a write and does not wait for its answer (for tests that kill
    /// the server with a request in flight).
    pub fn send_write(&mut self, offset: u64, data: &[u8]) -> ClientResult<()> {
        self.request(CMD_WRITE, 0, offset, data.len() as u32, data).map(|_| ())
    }

    /// Sends a read and does not wait for its answer (for tests of
    /// clients that pipeline requests and never read the replies).
    pub fn send_read(&mut self, offset: u64, len: u32) -> ClientResult<()> {
        self.request(CMD_READ, 0, offset, len, &[]).map(|_| ())
    }

    pub fn flush(&mut self) -> ClientResult<()> {
        let h = self.request(CMD_FLUSH, 0, 0, 0, &[])?;
        self.reply("flush", h)
    }

    pub fn trim(&mut self, offset: u64, len: u32) -> ClientResult<()> {
        let h = self.request(CMD_TRIM, 0, offset, len, &[])?;
        self.reply("trim", h)
    }

    pub fn write_zeroes(&mut self, offset: u64, len: u32) -> ClientResult<()> {
        let h = self.request(CMD_WRITE_ZEROES, 0, offset, len, &[])?;
        self.reply("write_zeroes", h)
    }

    pub fn cache(&mut self, offset: u64, len: u32) -> ClientResult<()> {
        let h = self.request(CMD_CACHE, 0, offset, len, &[])?;
        self.reply("cache", h)
    }

    /// Sends NBD_CMD_DISC and closes.
    pub fn disconnect(mut self) -> ClientResult<()> {
        self.request(CMD_DISC, 0, 0, 0, &[])?;
        self.io.get_mut().flush()?;
        self.io.get_mut().shutdown();
        Ok(())
    }
}
