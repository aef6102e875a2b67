//! Another NBD server's export as a [`BlockDev`]: a pool of client
//! connections (one when the server does not allow several), and a
//! connection of its own for block status. Kept out of `blockdev`, which
//! knows local devices only, so storage crates do not pull in the NBD
//! protocol and TLS.

use parking_lot::Mutex;

use nbd::{Client, ClientError, NbdUri};

use blockdev::{check_range, Alloc, BlockDev, DevError, DevResult};

/// Connections kept open to a remote server that allows several.
const MAX_CONNECTIONS: usize = 32;

/// An export of another NBD server, used as a backing store.
pub struct NbdDev {
    uri: NbdUri,
    size: u64,
    read_only: bool,
    /// Without the server's CAN_MULTI_CONN, one connection only, so that a
    /// FLUSH covers every write we made.
    max_connections: usize,
    idle: Mutex<Vec<Client>>,
    open: Mutex<usize>,
    /// Bound on connecting and the handshake, for every connection opened.
    connect_limit: Option<std::time::Duration>,
    /// A connection of its own for block status (it needs structured
    /// replies, which the data connections do without).
    status: Mutex<StatusConn>,
}

enum StatusConn {
    NotYet,
    Open(Client),
    /// The server offers no `base:allocation`: everything is data.
    Unsupported,
}

fn remote_err(uri: &NbdUri, e: ClientError) -> DevError {
    let errno = e.errno();
    DevError::Remote(format!("{uri}: {e}"), errno)
}

impl NbdDev {
    pub fn connect(uri: NbdUri) -> DevResult<NbdDev> {
        NbdDev::connect_within(uri, None)
    }

    /// Connects, giving up when connecting and the NBD handshake take longer
    /// than `limit`; later connections of the pool get the same bound.
    pub fn connect_within(uri: NbdUri, limit: Option<std::time::Duration>) -> DevResult<NbdDev> {
        let first = Client::connect_uri_within(&uri, limit).map_err(|e| remote_err(&uri, e))?;
        let max_connections = if first.can_multi_conn() { MAX_CONNECTIONS } else { 1 };
        Ok(NbdDev {
            size: first.size(),
            read_only: first.read_only(),
            max_connections,
            idle: Mutex::new(vec![first]),
            open: Mutex::new(1),
            connect_limit: limit,
            status: Mutex::new(StatusConn::NotYet),
            uri,
        })
    }

    /// Runs `op` on an idle connection, opening one if allowed and needed.
    /// A connection that failed at the transport level is dropped and the
    /// operation tried once more on a fresh one.
    fn with_client<T>(&self, mut op: impl FnMut(&mut Client) -> Result<T, ClientError>) -> DevResult<T> {
        for attempt in 0..2 {
            let mut client = self.checkout()?;
            match op(&mut client) {
                Ok(v) => {
                    self.idle.lock().push(client);
                    return Ok(v);
                }
                Err(e @ ClientError::Request { .. }) => {
                    self.idle.lock().push(client);
                    return Err(remote_err(&self.uri, e));
                }
                Err(e) => {
                    *self.open.lock() -= 1;
                    if attempt == 1 {
                        return Err(remote_err(&self.uri, e));
                    }
                }
            }
        }
        unreachable!("the loop returns on its second attempt")
    }

    fn checkout(&self) -> DevResult<Client> {
        loop {
            if let Some(c) = self.idle.lock().pop() {
                return Ok(c);
            }
            {
                let mut open = self.open.lock();
                if *open < self.max_connections {
                    *open += 1;
                    drop(open);
                    return Client::connect_uri_within(&self.uri, self.connect_limit).map_err(|e| {
                        *self.open.lock() -= 1;
                        remote_err(&self.uri, e)
                    });
                }
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }
}

/// NBD requests carry a 32-bit length; larger ranges are split.
const MAX_CHUNK: u64 = 16 << 20;

impl BlockDev for NbdDev {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> DevResult<()> {
        check_range(self.size, offset, buf.len() as u64)?;
        for (i, chunk) in buf.chunks_mut(MAX_CHUNK as usize).enumerate() {
            let off = offset + i as u64 * MAX_CHUNK;
            self.with_client(|c| c.read(off, chunk))?;
        }
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> DevResult<()> {
        if self.read_only {
            return Err(DevError::ReadOnly);
        }
        check_range(self.size, offset, buf.len() as u64)?;
        for (i, chunk) in buf.chunks(MAX_CHUNK as usize).enumerate() {
            let off = offset + i as u64 * MAX_CHUNK;
            self.with_client(|c| c.write(off, chunk, false))?;
        }
        Ok(())
    }

    fn flush(&self) -> DevResult<()> {
        if self.read_only {
            return Ok(());
        }
        self.with_client(|c| c.flush())
    }

    fn trim(&self, offset: u64, len: u64) -> DevResult<()> {
        check_range(self.size, offset, len)?;
        self.split(offset, len, |c, o, l| c.trim(o, l))
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> DevResult<()> {
        check_range(self.size, offset, len)?;
        self.split(offset, len, |c, o, l| c.write_zeroes(o, l))
    }

    /// The remote server's own `base:allocation` map, when it has one.
    fn allocation(&self, offset: u64, len: u64) -> DevResult<Vec<(u64, Alloc)>> {
        check_range(self.size, offset, len)?;
        let all_data = Ok(vec![(len, Alloc::Data)]);
        let mut status = self.status.lock();
        if let StatusConn::NotYet = *status {
            *status = match Client::connect_for_block_status(&self.uri, self.connect_limit) {
                Ok(c) => StatusConn::Open(c),
                Err(e) => {
                    tracing::debug!("{}: no block status: {e}", self.uri);
                    StatusConn::Unsupported
                }
            };
        }
        let StatusConn::Open(client) = &mut *status else {
            return all_data;
        };
        match client.block_status(offset, len.min(MAX_CHUNK) as u32) {
            Ok(extents) => Ok(extents
                .into_iter()
                .map(|(l, flags)| {
                    let kind = match (flags & 1 != 0, flags & 2 != 0) {
                        (true, true) => Alloc::Hole,
                        (false, true) => Alloc::Zero,
                        _ => Alloc::Data,
                    };
                    (u64::from(l), kind)
                })
                .collect()),
            Err(e @ ClientError::Request { .. }) => Err(remote_err(&self.uri, e)),
            Err(e) => {
                // The link broke: try a fresh connection next time.
                *status = StatusConn::NotYet;
                Err(remote_err(&self.uri, e))
            }
        }
    }

    fn describe(&self) -> String {
        self.uri.to_string()
    }

    fn is_read_only(&self) -> bool {
        self.read_only
    }
}

impl NbdDev {
    fn split(
        &self,
        offset: u64,
        len: u64,
        op: impl Fn(&mut Client, u64, u32) -> Result<(), ClientError>,
    ) -> DevResult<()> {
        let mut done = 0;
        while done < len {
            let n = (len - done).min(MAX_CHUNK);
            self.with_client(|c| op(c, offset + done, n as u32))?;
            done += n;
        }
        Ok(())
    }
}
