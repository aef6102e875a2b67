//! An NBD server: fixed-newstyle handshake, then many requests in flight per
//! connection with replies in completion order. What an export *is* comes
//! from the [`Export`] trait; nothing here knows about caching.

use std::collections::HashMap;
use std::io::{self, BufReader, Read};
use std::net::TcpListener;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::{Condvar, Mutex};
use tracing::{debug, warn};

use crate::conn::Conn;
use crate::proto::*;
use crate::stream::{Reader, Writer};
use crate::tls::{self, TlsPolicy};
use arcache_batch::Batch;
use arcache_pool::{Job, JobQueue};

mod held;
pub(crate) mod listeners;
mod pieces;
use held::{hold_reply, hold_slot};
use listeners::Listeners;
use pieces::Payload;
pub use pieces::{Piece, SharedBytes};

/// A host errno describing why a request failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Errno(pub i32);

pub type NbdResult = Result<(), Errno>;

/// Answers a request started with [`Export::flush_async`]; callable from
/// any thread, once. Its reply may wait in the batch until the caller
/// flushes it, so a thread completing many requests at once sends their
/// replies together.
pub type Completion = Box<dyn FnOnce(NbdResult, &mut Batch) + Send>;

/// Work a connection's own thread starts and finishes itself besides
/// reading its socket (arcache: reads queued to the thread's own IO ring,
/// whose completions the thread finishes while it waits for requests).
pub trait ThreadIo {
    /// Whether any of it is under way.
    fn busy(&self) -> bool;
    /// Finishes what is done until `fd` is readable, or, without `fd`,
    /// until at least one piece finished; the replies it made go through
    /// `out` and have been sent by the time it returns (a wait for the
    /// socket with replies held back would wait for ever).
    fn wait(&mut self, fd: Option<RawFd>, out: &mut Batch);
}

/// Gives a connection's thread its [`ThreadIo`], if it has one, as its
/// requests begin.
pub type ThreadIoStart = Arc<dyn Fn() -> Option<Box<dyn ThreadIo>> + Send + Sync>;

/// How a read started with [`Export::read_async`] ends: its bytes or
/// error, or work the server runs on a worker thread, answering with what
/// it returns.
pub type ReadEnd = arcache_batch::ReadEnd<Errno>;

/// Called exactly once with the end of a read started asynchronously, with
/// a batch as for [`Completion`].
pub type ReadCompletion = arcache_batch::ReadDone<Errno>;

/// A read's answer as the replies take it: the status, and the bytes
/// (none on error).
fn split(res: Result<Vec<u8>, Errno>) -> (NbdResult, Vec<u8>) {
    match res {
        Ok(buf) => (Ok(()), buf),
        Err(e) => (Err(e), Vec::new()),
    }
}

/// A READ on a worker, for an export that did not start it itself: from
/// the pieces the export holds if it can answer that way, else into a
/// buffer.
fn read_through(ex: &dyn Export, req: Request) -> (NbdResult, Payload) {
    match wants_pieces(&req).then(|| ex.read_pieces(req.offset, req.length)).flatten() {
        Some(res) => checked_pieces(res, req),
        None => {
            let mut buf = vec![0u8; req.length as usize];
            let res = ex.read(req.offset, &mut buf);
            (res, Payload::Bytes(buf))
        }
    }
}

/// Whether a read's reply is worth answering with pieces: a reply a batch
/// would hold is copied into it anyway, and one so small costs less to
/// copy than to hold.
fn wants_pieces(req: &Request) -> bool {
    req.length as usize > held::HOLD_MAX_REPLY
}

/// An export's pieces as a reply takes them: they must add up to the
/// request, or the reply would end short and the client would wait for
/// ever for the rest.
fn checked_pieces(res: Result<Vec<Piece>, Errno>, req: Request) -> (NbdResult, Payload) {
    match res {
        Ok(pieces) if pieces.iter().map(Piece::len).sum::<usize>() == req.length as usize => {
            (Ok(()), Payload::Pieces(pieces))
        }
        Ok(_) => {
            tracing::error!("read {req:?}: the export's pieces do not add up to the request; answered EIO");
            (Err(Errno(libc::EIO)), Payload::empty())
        }
        Err(e) => (Err(e), Payload::empty()),
    }
}

/// What a client learns about an export during the handshake.
#[derive(Debug, Clone)]
pub struct ExportInfo {
    pub size: u64,
    pub read_only: bool,
    /// Safe to advertise only if a FLUSH on one connection covers writes
    /// completed on every other connection.
    pub multi_conn: bool,
    pub rotational: bool,
    pub description: String,
    pub min_block: u32,
    pub preferred_block: u32,
}

/// One export as the protocol sees it. Every method may block except
/// [`Export::try_read_now`], which answers only when it can do so at once.
pub trait Export: Send + Sync {
    fn info(&self) -> ExportInfo;

    /// Serves a read without blocking on slow IO, or returns `None` so the
    /// server hands the request to a worker. Lets fast answers overtake slow
    /// ones queued before them.
    fn try_read_now(&self, _offset: u64, _buf: &mut [u8]) -> Option<NbdResult> {
        None
    }

    /// [`Export::try_read_now`] answered with pieces of bytes the export
    /// holds (see [`Export::read_pieces`]), tried first; `None`: the server
    /// goes on to `try_read_now`. Asked only of reads larger than 8 KiB (a
    /// smaller reply is copied into the connection's batch anyway).
    fn try_read_pieces_now(&self, _offset: u64, _len: u32) -> Option<Result<Vec<Piece>, Errno>> {
        None
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> NbdResult;

    /// Answers a read on a worker with pieces of bytes the export already
    /// holds, in order, `len` bytes in all, which the server writes to the
    /// socket from where they lie (see [`Piece`]); `None`: the server reads
    /// through [`Export::read`] instead. May block. Asked only of reads
    /// larger than 8 KiB, as [`Export::try_read_pieces_now`].
    fn read_pieces(&self, _offset: u64, _len: u32) -> Option<Result<Vec<Piece>, Errno>> {
        None
    }

    /// Starts a read whose device IO the export queues itself, calling
    /// `done` when it ends (on any thread), so no worker thread sleeps in
    /// the IO; gives `done` back when it cannot, and the server then calls
    /// [`Export::read`] on a worker. A read that ends before this returns
    /// calls `done` with `out`, the caller's batch.
    fn read_async(
        &self,
        _offset: u64,
        _len: u32,
        done: ReadCompletion,
        _out: &mut Batch,
    ) -> Result<(), ReadCompletion> {
        Err(done)
    }

    /// Serves a write without blocking, or returns `None` so the server
    /// hands it to a worker (as [`Export::try_read_now`] for reads).
    fn try_write_now(&self, _offset: u64, _data: &[u8], _fua: bool) -> Option<NbdResult> {
        None
    }

    fn write(&self, offset: u64, data: &[u8], fua: bool) -> NbdResult;
    fn flush(&self) -> NbdResult;

    /// Starts a FLUSH that is answered by calling `done` when it is
    /// complete, so no worker thread waits for it; gives `done` back when
    /// the export cannot, and the server then calls [`Export::flush`] on a
    /// worker. A FLUSH complete before this returns calls `done` with
    /// `out`, the caller's batch.
    fn flush_async(&self, done: Completion, _out: &mut Batch) -> Result<(), Completion> {
        Err(done)
    }

    fn trim(&self, offset: u64, len: u64, fua: bool) -> NbdResult;
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> NbdResult;

    /// WRITE_ZEROES with FAST_ZERO: zeroes the range only if that is
    /// quicker than writing zeroes (a hole punched, an extent recorded);
    /// otherwise fails with ENOTSUP at once, having changed nothing.
    /// `no_hole` (NO_HOLE): the range must stay allocated, so no hole.
    fn write_zeroes_fast(&self, _offset: u64, _len: u64, _fua: bool, _no_hole: bool) -> NbdResult {
        Err(Errno(libc::ENOTSUP))
    }

    /// Loads a range into whatever cache the export has (NBD_CMD_CACHE).
    fn cache(&self, offset: u64, len: u64) -> NbdResult;

    /// The `base:allocation` state of the range from `offset`: extents in
    /// order, the first starting at `offset`, each of nonzero length. They
    /// may cover less than `len` (at least one byte) or run past it. The
    /// default says "allocated, contents unknown" for all of it, which is
    /// always true.
    fn block_status(&self, _offset: u64, len: u32) -> Result<Vec<Extent>, Errno> {
        Ok(vec![Extent { len, flags: 0 }])
    }
}

/// One `base:allocation` descriptor: `len` bytes in the state `flags`
/// ([`STATE_HOLE`], [`STATE_ZERO`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extent {
    pub len: u32,
    pub flags: u32,
}

/// The set of exports a server offers.
pub trait ExportSet: Send + Sync {
    /// Names and descriptions, for NBD_OPT_LIST.
    fn list(&self) -> Vec<(String, String)>;
    fn open(&self, name: &str) -> Option<Arc<dyn Export>>;
}

#[derive(Debug, Clone, Copy)]
pub struct ServerConfig {
    /// Largest READ or WRITE payload accepted (also advertised).
    pub max_request: u32,
    /// Requests one connection may have in flight.
    pub max_in_flight: usize,
    /// Bytes of request and reply payloads one connection may hold at
    /// once; the reader stops taking requests beyond it, so one client
    /// cannot make the server allocate without bound. Never below
    /// `max_request` (a single largest request always gets in).
    pub max_conn_bytes: u64,
    /// Connections served at once; more are closed at accept.
    pub max_connections: usize,
    /// Worker threads shared by every connection for blocking requests.
    pub workers: usize,
    /// A client must finish the handshake within this time.
    pub handshake_timeout: Duration,
    /// A client that takes none of a reply's bytes for this long is cut
    /// off. Replies are written by threads that answer every connection
    /// (workers, the L2 read ring, the commit thread); without a bound, a
    /// client that stops reading would hold them and stall everyone.
    /// `None`: wait forever.
    pub reply_timeout: Option<Duration>,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            // nbdkit takes 64 MiB and real clients send that much (qemu-img
            // convert, nbdcopy with large requests); 32 MiB is only the
            // size every server must take.
            max_request: 64 << 20,
            max_in_flight: 64,
            max_conn_bytes: 64 << 20,
            max_connections: 128,
            workers: 32,
            handshake_timeout: Duration::from_secs(30),
            reply_timeout: Some(Duration::from_secs(60)),
        }
    }
}

/// Counters of the protocol layer.
#[derive(Debug, Default)]
pub struct ServerStats {
    pub connections: AtomicU64,
    pub active_connections: AtomicU64,
    pub requests: AtomicU64,
    pub request_errors: AtomicU64,
    pub protocol_errors: AtomicU64,
    pub immediate_reads: AtomicU64,
    pub immediate_writes: AtomicU64,
    /// Read replies written from the export's pieces (`Export::read_pieces`,
    /// `Export::try_read_pieces_now`) instead of a copy in a buffer.
    pub piece_replies: AtomicU64,
    /// TLS handshakes completed, and failed (bad or missing certificates,
    /// clients that do not trust ours, garbage).
    pub tls_sessions: AtomicU64,
    pub tls_handshake_errors: AtomicU64,
    /// Connections closed at accept because `max_connections` were open.
    pub refused_connections: AtomicU64,
    /// Times a connection's reader waited for its payload budget.
    pub budget_waits: AtomicU64,
}

impl ServerStats {
    fn count_pieces(&self, payload: &Payload) {
        if matches!(payload, Payload::Pieces(_)) {
            self.piece_replies.fetch_add(1, Relaxed);
        }
    }
}

pub struct Server {
    exports: Arc<dyn ExportSet>,
    cfg: ServerConfig,
    jobs: JobQueue,
    stats: ServerStats,
    stopping: AtomicBool,
    live: Mutex<HashMap<u64, Conn>>,
    live_changed: Condvar,
    tls: Option<TlsPolicy>,
    thread_io: std::sync::OnceLock<ThreadIoStart>,
    listeners: Listeners,
}

/// What the handshake settled for the transmission phase.
struct Session {
    export: Arc<dyn Export>,
    structured: bool,
    /// `base:allocation` was selected for the export chosen (its context
    /// id is [`META_ID`]): BLOCK_STATUS may be sent.
    block_status: bool,
    /// The transmission flags the client was given.
    flags: u16,
}

/// The context id given to `base:allocation` by SET_META_CONTEXT.
const META_ID: u32 = 1;

/// What options have settled so far in one haggling (started again
/// inside TLS, where nothing from before carries over).
#[derive(Default)]
struct Haggled {
    structured: bool,
    /// The export the last SET_META_CONTEXT named, and whether it
    /// selected `base:allocation`.
    meta: Option<(String, bool)>,
}

impl Haggled {
    fn session(&self, server: &Server, name: &str, export: Arc<dyn Export>) -> Session {
        let info = export.info();
        let block_status = self.meta.as_ref().is_some_and(|(n, on)| *on && n == name);
        Session {
            flags: server.transmission_flags(&info, self.structured),
            export,
            structured: self.structured,
            block_status,
        }
    }
}

/// Why a handshake ended without entering transmission.
enum Negotiated {
    Transmit(Session),
    /// The client asked for TLS and was told yes; haggling restarts inside it.
    StartTls,
    Done,
}

impl Server {
    pub fn new(exports: Arc<dyn ExportSet>, cfg: ServerConfig) -> Arc<Server> {
        Server::with_tls(exports, cfg, None)
    }

    /// A server that offers NBD STARTTLS (and may insist on it).
    pub fn with_tls(exports: Arc<dyn ExportSet>, cfg: ServerConfig, tls: Option<TlsPolicy>) -> Arc<Server> {
        Arc::new(Server {
            exports,
            cfg,
            jobs: JobQueue::start("nbd-worker", cfg.workers),
            stats: ServerStats::default(),
            stopping: AtomicBool::new(false),
            live: Mutex::new(HashMap::new()),
            live_changed: Condvar::new(),
            tls,
            thread_io: std::sync::OnceLock::new(),
            listeners: Listeners::default(),
        })
    }

    /// Gives every later connection's thread (of plain, not TLS,
    /// connections) the work `start` makes; set once, before listening.
    pub fn set_thread_io(&self, start: ThreadIoStart) {
        let _ = self.thread_io.set(start);
    }

    pub fn stats(&self) -> &ServerStats {
        &self.stats
    }

    /// Accepts connections on a unix socket in a background thread.
    pub fn listen_unix(self: &Arc<Self>, listener: UnixListener) {
        self.keep_listening(listener.try_clone().map(OwnedFd::from));
        self.accept_loop(std::iter::from_fn(move || Some(listener.accept().map(|(s, _)| Conn::Unix(s)))));
    }

    /// Accepts connections on a TCP socket in a background thread.
    pub fn listen_tcp(self: &Arc<Self>, listener: TcpListener) {
        self.keep_listening(listener.try_clone().map(OwnedFd::from));
        self.accept_loop(std::iter::from_fn(move || {
            Some(listener.accept().map(|(s, _)| {
                let _ = s.set_nodelay(true);
                Conn::Tcp(s)
            }))
        }));
    }

    fn keep_listening(&self, dup: io::Result<OwnedFd>) {
        match dup {
            Ok(fd) => self.listeners.keep(fd),
            Err(e) => {
                warn!("cannot keep the listening socket, so shutdown will not end its accepting thread: {e}")
            }
        }
    }

    fn accept_loop(self: &Arc<Self>, incoming: impl Iterator<Item = io::Result<Conn>> + Send + 'static) {
        let server = Arc::clone(self);
        // Named for whoever lists the process's threads.
        let spawned = std::thread::Builder::new().name("nbd-accept".into()).spawn(move || {
            for conn in incoming {
                if server.stopping.load(Relaxed) {
                    break;
                }
                match conn {
                    Ok(c) => server.spawn_connection(c),
                    Err(e) => warn!("accept: {e}"),
                }
            }
        });
        // As `std::thread::spawn` did: a server that cannot listen must not
        // seem to.
        spawned.expect("start the accepting thread");
    }

    fn spawn_connection(self: &Arc<Self>, conn: Conn) {
        if self.live.lock().len() >= self.cfg.max_connections {
            self.stats.refused_connections.fetch_add(1, Relaxed);
            warn!(
                "refusing a connection from {}: {} are open (max_connections)",
                conn.peer(),
                self.cfg.max_connections
            );
            conn.shutdown();
            return;
        }
        let server = Arc::clone(self);
        let spawned = std::thread::Builder::new().name("nbd-conn".into()).spawn(move || server.handle(conn));
        if let Err(e) = spawned {
            warn!("cannot start a connection thread: {e}");
        }
    }

    /// Serves one client until it disconnects; blocks the calling thread.
    pub fn handle(self: &Arc<Self>, conn: Conn) {
        let id = self.stats.connections.fetch_add(1, Relaxed);
        let peer = conn.peer();
        match conn.try_clone() {
            Ok(c) => {
                self.live.lock().insert(id, c);
            }
            Err(e) => {
                warn!("connection {id} from {peer}: {e}");
                return;
            }
        }
        self.stats.active_connections.fetch_add(1, Relaxed);
        debug!("connection {id} from {peer}");
        if self.stopping.load(Relaxed) {
            conn.shutdown();
        }
        if let Err(e) = self.session(conn) {
            self.stats.protocol_errors.fetch_add(1, Relaxed);
            debug!("connection {id} from {peer} ended: {e}");
        }
        self.live.lock().remove(&id);
        self.stats.active_connections.fetch_sub(1, Relaxed);
        self.live_changed.notify_all();
    }

    /// Stops accepting connections and reading new requests on every
    /// connection; requests already received are still answered. Returns
    /// once all connections are gone or `timeout` passes; returns true if
    /// they are all gone. The accepting threads end too, so when it returns
    /// true, dropping the caller's handle frees the server and its exports.
    pub fn shutdown(&self, timeout: Duration) -> bool {
        self.stopping.store(true, Relaxed);
        self.listeners.close_all();
        let mut live = self.live.lock();
        for c in live.values() {
            c.shutdown_read();
        }
        let deadline = std::time::Instant::now() + timeout;
        while !live.is_empty() {
            if self.live_changed.wait_until(&mut live, deadline).timed_out() {
                return live.is_empty();
            }
        }
        true
    }

    fn session(self: &Arc<Self>, conn: Conn) -> io::Result<()> {
        conn.set_read_timeout(Some(self.cfg.handshake_timeout))?;
        let mut wr = Writer::Plain(conn.try_clone()?);
        // The reader keeps `conn` itself: one descriptor fewer per client.
        let mut rd = BufReader::with_capacity(64 << 10, Reader::Plain(conn));
        let no_zeroes = greet(&mut rd, &mut wr)?;
        let mut secure = false;
        let session = loop {
            match self.haggle(&mut rd, &mut wr, no_zeroes, secure)? {
                Negotiated::Transmit(session) => break session,
                Negotiated::Done => {
                    wr.close();
                    return Ok(());
                }
                Negotiated::StartTls => {
                    let config = self.tls.as_ref().map(|t| Arc::clone(&t.config));
                    let config = config.ok_or_else(|| protocol_error("STARTTLS without TLS".into()))?;
                    let sock = rd.get_ref().socket().try_clone()?;
                    let (r, w) = tls::accept(sock, config).inspect_err(|e| {
                        self.stats.tls_handshake_errors.fetch_add(1, Relaxed);
                        debug!("TLS handshake failed: {e}");
                    })?;
                    self.stats.tls_sessions.fetch_add(1, Relaxed);
                    rd = BufReader::with_capacity(64 << 10, Reader::Tls(r));
                    wr = Writer::Tls(w);
                    secure = true;
                }
            }
        };
        rd.get_ref().socket().set_read_timeout(None)?;
        // One socket under both halves (and under TLS): this bounds every
        // reply write of the connection.
        rd.get_ref().socket().set_write_timeout(self.cfg.reply_timeout)?;
        self.transmission(rd, wr, session)
    }

    // ---------------------------------------------------------------- handshake

    /// Option haggling, from the start or again inside a fresh TLS session
    /// (where nothing negotiated before STARTTLS carries over).
    fn haggle(
        &self,
        rd: &mut BufReader<Reader>,
        w: &mut Writer,
        no_zeroes: bool,
        secure: bool,
    ) -> io::Result<Negotiated> {
        let tls_required = self.tls.as_ref().is_some_and(|t| t.required) && !secure;
        let mut st = Haggled::default();
        loop {
            let magic = read_u64(rd)?;
            if magic != IHAVEOPT {
                return Err(protocol_error(format!("bad option magic {magic:#x}")));
            }
            let opt = read_u32(rd)?;
            let len = read_u32(rd)?;
            // Options carry names and a few integers; anything huge is garbage.
            if len > 64 << 10 {
                return Err(protocol_error(format!("option {opt} with {len} bytes of data")));
            }
            let mut data = vec![0u8; len as usize];
            rd.read_exact(&mut data)?;
            if tls_required && !matches!(opt, OPT_STARTTLS | OPT_ABORT) {
                if opt == OPT_EXPORT_NAME {
                    // This option has no error reply: hanging up is the answer.
                    return Err(protocol_error("EXPORT_NAME before STARTTLS on a TLS-only server".into()));
                }
                option_error(w, opt, REP_ERR_TLS_REQD, "this server requires TLS: send STARTTLS first")?;
                continue;
            }
            match opt {
                OPT_EXPORT_NAME => {
                    let name = String::from_utf8_lossy(&data).into_owned();
                    let Some(export) = self.exports.open(&name) else {
                        warn!("client asked for unknown export {name:?}");
                        return Ok(Negotiated::Done);
                    };
                    let session = st.session(self, &name, export);
                    let mut reply = Vec::with_capacity(10 + 124);
                    reply.extend_from_slice(&session.export.info().size.to_be_bytes());
                    reply.extend_from_slice(&session.flags.to_be_bytes());
                    if !no_zeroes {
                        reply.extend_from_slice(&[0u8; 124]);
                    }
                    w.send(&[&reply])?;
                    return Ok(Negotiated::Transmit(session));
                }
                OPT_STARTTLS => {
                    if let Some(n) = self.start_tls(rd, w, &data, secure)? {
                        return Ok(n);
                    }
                }
                OPT_ABORT => {
                    let _ = option_reply(w, opt, REP_ACK, &[]);
                    return Ok(Negotiated::Done);
                }
                OPT_LIST => {
                    if !data.is_empty() {
                        option_error(w, opt, REP_ERR_INVALID, "LIST takes no data")?;
                        continue;
                    }
                    for (name, desc) in self.exports.list() {
                        let mut p = Vec::new();
                        p.extend_from_slice(&(name.len() as u32).to_be_bytes());
                        p.extend_from_slice(name.as_bytes());
                        p.extend_from_slice(desc.as_bytes());
                        option_reply(w, opt, REP_SERVER, &p)?;
                    }
                    option_reply(w, opt, REP_ACK, &[])?;
                }
                OPT_STRUCTURED_REPLY => {
                    if !data.is_empty() {
                        option_error(w, opt, REP_ERR_INVALID, "STRUCTURED_REPLY takes no data")?;
                    } else {
                        st.structured = true;
                        option_reply(w, opt, REP_ACK, &[])?;
                    }
                }
                OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => self.meta_context(w, opt, &data, &mut st)?,
                OPT_INFO | OPT_GO => {
                    if let Some(session) = self.info_or_go(w, opt, &data, &st)? {
                        return Ok(Negotiated::Transmit(session));
                    }
                }
                _ => option_error(w, opt, REP_ERR_UNSUP, "option not supported")?,
            }
        }
    }

    /// Answers STARTTLS; `Some` when the TLS handshake is to follow.
    fn start_tls(
        &self,
        rd: &BufReader<Reader>,
        w: &mut Writer,
        data: &[u8],
        secure: bool,
    ) -> io::Result<Option<Negotiated>> {
        let opt = OPT_STARTTLS;
        if !data.is_empty() {
            option_error(w, opt, REP_ERR_INVALID, "STARTTLS takes no data")?;
        } else if self.tls.is_none() {
            option_error(w, opt, REP_ERR_POLICY, "TLS is not configured on this server")?;
        } else if secure {
            option_error(w, opt, REP_ERR_INVALID, "TLS is already active")?;
        } else if !rd.buffer().is_empty() {
            // Bytes sent before our answer would be taken as if they came
            // through TLS: the classic STARTTLS injection. Refuse them.
            return Err(protocol_error("data pipelined after STARTTLS".into()));
        } else {
            option_reply(w, opt, REP_ACK, &[])?;
            return Ok(Some(Negotiated::StartTls));
        }
        Ok(None)
    }

    /// Answers LIST_META_CONTEXT and SET_META_CONTEXT. The one context is
    /// `base:allocation`; queries of other namespaces are ignored, as the
    /// protocol asks, and a SET replaces what an earlier one chose even
    /// when it fails.
    fn meta_context(&self, w: &mut Writer, opt: u32, data: &[u8], st: &mut Haggled) -> io::Result<()> {
        let set = opt == OPT_SET_META_CONTEXT;
        if set {
            st.meta = None;
        }
        if !st.structured {
            return option_error(w, opt, REP_ERR_INVALID, "negotiate structured replies first");
        }
        let Some((name, queries)) = parse_meta_request(data) else {
            return option_error(w, opt, REP_ERR_INVALID, "malformed meta context request");
        };
        if self.exports.open(&name).is_none() {
            return option_error(w, opt, REP_ERR_UNKNOWN, &format!("no export named {name:?}"));
        }
        let base = |q: &String| q == META_BASE_ALLOCATION || (!set && q == "base:");
        let chosen =
            if set { queries.iter().any(base) } else { queries.is_empty() || queries.iter().any(base) };
        if chosen {
            // LIST answers carry id 0 (reserved there); SET gives the real one.
            let id = if set { META_ID } else { 0 };
            let mut p = Vec::with_capacity(4 + META_BASE_ALLOCATION.len());
            p.extend_from_slice(&id.to_be_bytes());
            p.extend_from_slice(META_BASE_ALLOCATION.as_bytes());
            option_reply(w, opt, REP_META_CONTEXT, &p)?;
        }
        if set {
            st.meta = Some((name, chosen));
        }
        option_reply(w, opt, REP_ACK, &[])
    }

    /// Answers INFO or GO; returns the session when GO succeeded.
    fn info_or_go(&self, w: &mut Writer, opt: u32, data: &[u8], st: &Haggled) -> io::Result<Option<Session>> {
        let Some((name, requests)) = parse_info_request(data) else {
            option_error(w, opt, REP_ERR_INVALID, "malformed INFO/GO request")?;
            return Ok(None);
        };
        let Some(export) = self.exports.open(&name) else {
            option_error(w, opt, REP_ERR_UNKNOWN, &format!("no export named {name:?}"))?;
            return Ok(None);
        };
        let info = export.info();
        let mut p = Vec::with_capacity(12);
        p.extend_from_slice(&INFO_EXPORT.to_be_bytes());
        p.extend_from_slice(&info.size.to_be_bytes());
        p.extend_from_slice(&self.transmission_flags(&info, st.structured).to_be_bytes());
        option_reply(w, opt, REP_INFO, &p)?;
        for req in requests {
            let mut p = Vec::new();
            p.extend_from_slice(&req.to_be_bytes());
            match req {
                INFO_NAME => p.extend_from_slice(name.as_bytes()),
                INFO_DESCRIPTION => p.extend_from_slice(info.description.as_bytes()),
                INFO_BLOCK_SIZE => {
                    p.extend_from_slice(&info.min_block.max(1).to_be_bytes());
                    p.extend_from_slice(&info.preferred_block.max(512).to_be_bytes());
                    p.extend_from_slice(&self.cfg.max_request.to_be_bytes());
                }
                _ => continue,
            }
            option_reply(w, opt, REP_INFO, &p)?;
        }
        option_reply(w, opt, REP_ACK, &[])?;
        Ok((opt == OPT_GO).then(|| st.session(self, &name, export)))
    }

    fn transmission_flags(&self, info: &ExportInfo, structured: bool) -> u16 {
        let mut f = TFLAG_HAS_FLAGS | TFLAG_SEND_FLUSH | TFLAG_SEND_CACHE;
        if info.read_only {
            // Nothing to make durable: FUA is not offered, so a FUA flag is
            // refused like any flag not offered.
            f |= TFLAG_READ_ONLY;
        } else {
            f |= TFLAG_SEND_FUA | TFLAG_SEND_TRIM | TFLAG_SEND_WRITE_ZEROES | TFLAG_SEND_FAST_ZERO;
        }
        if structured {
            // A read is always answered with one data chunk: never fragmented.
            f |= TFLAG_SEND_DF;
        }
        if info.multi_conn {
            f |= TFLAG_CAN_MULTI_CONN;
        }
        if info.rotational {
            f |= TFLAG_ROTATIONAL;
        }
        f
    }

    // ---------------------------------------------------------------- transmission

    fn transmission(
        self: &Arc<Self>,
        mut rd: BufReader<Reader>,
        wr: Writer,
        session: Session,
    ) -> io::Result<()> {
        let info = session.export.info();
        let shared = Arc::new(ConnShared {
            writer: Mutex::new(wr),
            structured: session.structured,
            in_flight: Mutex::new(InFlight::default()),
            drained: Condvar::new(),
        });
        let result = self.request_loop(&mut rd, &shared, &session, &info);
        shared.wait_idle();
        shared.writer.lock().close();
        result
    }

    fn request_loop(
        self: &Arc<Self>,
        rd: &mut BufReader<Reader>,
        shared: &Arc<ConnShared>,
        session: &Session,
        info: &ExportInfo,
    ) -> io::Result<()> {
        let export = &session.export;
        let mut scratch: Vec<u8> = Vec::new();
        // Requests that arrived together are answered together: replies
        // made here wait until the reader has nothing more buffered, and go
        // out before it could block.
        let mut out = Batch::new();
        // Only a plain socket: TLS may hold decrypted bytes the socket's
        // readiness does not show. Dropped (and its work finished) when
        // this loop ends, before the connection waits for its workers.
        let fd = match rd.get_ref() {
            Reader::Plain(c) => Some(c.as_raw_fd()),
            Reader::Tls(_) => None,
        };
        let mut own = fd.and_then(|_| self.thread_io.get().and_then(|start| start()));
        loop {
            // Not only when nothing is buffered: with part of a header
            // buffered, the read below would block for the rest while the
            // thread's own reads went unanswered.
            if rd.buffer().len() < REQUEST_LEN {
                before_blocking_read(&mut out, &mut own, fd);
            }
            let mut hdr = [0u8; REQUEST_LEN];
            match rd.read_exact(&mut hdr) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
                Err(e) => return Err(e),
            }
            let Some(req) = Request::decode(&hdr) else {
                return Err(protocol_error("bad request magic; closing".into()));
            };
            self.stats.requests.fetch_add(1, Relaxed);
            if req.kind == CMD_DISC {
                return Ok(());
            }
            // Taken before the payload is read or a reply buffer allocated.
            let slot = self.admit(shared, &req, &mut out, &mut own);
            let payload = if req.kind == CMD_WRITE {
                match self.read_payload(rd, req.length, &mut out, &mut own, fd)? {
                    Some(p) => Some(p),
                    None => {
                        shared.reply_error(req, EINVAL, &self.stats, Some(&mut out));
                        continue;
                    }
                }
            } else {
                None
            };
            if let Err(errno) = self.validate(&req, info, session) {
                shared.reply_error(req, errno, &self.stats, Some(&mut out));
                continue;
            }
            if req.kind == CMD_READ {
                let now = wants_pieces(&req).then(|| export.try_read_pieces_now(req.offset, req.length));
                if let Some(res) = now.flatten() {
                    self.stats.immediate_reads.fetch_add(1, Relaxed);
                    let (res, payload) = checked_pieces(res, req);
                    self.stats.count_pieces(&payload);
                    shared.reply_read(req, res, &payload.slices(), &self.stats, Some(&mut out));
                    continue;
                }
                // Reads answered here reuse one buffer: a fresh large buffer
                // per request costs page faults on every reply.
                scratch.resize(req.length as usize, 0);
                if let Some(res) = export.try_read_now(req.offset, &mut scratch) {
                    self.stats.immediate_reads.fetch_add(1, Relaxed);
                    shared.reply_read(req, res, &[&scratch], &self.stats, Some(&mut out));
                    if scratch.capacity() > 4 << 20 {
                        // Do not keep a rare huge buffer for the connection's life.
                        scratch = Vec::new();
                    }
                    continue;
                }
                self.read_without_worker(slot, req, export, &mut out);
                continue;
            }
            if req.kind == CMD_FLUSH {
                self.flush_without_worker(slot, req, export, &mut out);
                continue;
            }
            let fua = req.flags & CMD_FLAG_FUA != 0;
            let (off, len) = (req.offset, u64::from(req.length));
            if let (CMD_WRITE, Some(p)) = (req.kind, payload.as_deref()) {
                if let Some(res) = export.try_write_now(off, p, fua) {
                    self.stats.immediate_writes.fetch_add(1, Relaxed);
                    shared.reply_status(req, res, &self.stats, Some(&mut out));
                    continue;
                }
            }
            let fast_zero = req.flags & CMD_FLAG_FAST_ZERO != 0;
            let no_hole = req.flags & CMD_FLAG_NO_HOLE != 0;
            self.dispatch(
                slot,
                req,
                move |ex| {
                    let res = match req.kind {
                        CMD_WRITE => ex.write(off, payload.as_deref().unwrap_or(&[]), fua),
                        CMD_FLUSH => ex.flush(),
                        CMD_TRIM => ex.trim(off, len, fua),
                        CMD_WRITE_ZEROES if fast_zero => ex.write_zeroes_fast(off, len, fua, no_hole),
                        CMD_WRITE_ZEROES => ex.write_zeroes(off, len, fua),
                        CMD_CACHE => ex.cache(off, len),
                        CMD_BLOCK_STATUS => {
                            return match ex.block_status(off, req.length) {
                                Ok(extents) => (Ok(()), Payload::Bytes(encode_extents(&extents, &req))),
                                Err(e) => (Err(e), Payload::empty()),
                            }
                        }
                        _ => Err(Errno(libc::EINVAL)),
                    };
                    (res, Payload::empty())
                },
                export,
            );
        }
    }

    /// A FLUSH answered by the export when its commit is done; on a worker
    /// only when the export cannot answer that way.
    fn flush_without_worker(
        self: &Arc<Self>,
        slot: Slot,
        req: Request,
        export: &Arc<dyn Export>,
        out: &mut Batch,
    ) {
        let server = Arc::clone(self);
        let done: Completion = Box::new(move |res, out| {
            slot.shared.reply_status(req, res, &server.stats, Some(&mut *out));
            // The budget is given back once the reply is really sent.
            hold_slot(out, slot);
        });
        if let Err(done) = export.flush_async(done, out) {
            let export = Arc::clone(export);
            self.jobs.push(Box::new(move || done(export.flush(), &mut Batch::new())));
        }
    }

    /// A READ the export answers when its queued IO completes; on a worker
    /// when it cannot start it that way or cannot finish without blocking.
    fn read_without_worker(
        self: &Arc<Self>,
        slot: Slot,
        req: Request,
        export: &Arc<dyn Export>,
        out: &mut Batch,
    ) {
        let (server, ex) = (Arc::clone(self), Arc::clone(export));
        let done: ReadCompletion = Box::new(move |end, out| match end {
            ReadEnd::Done(res) => {
                let (res, buf) = split(res);
                slot.shared.reply_read(req, res, &[&buf], &server.stats, Some(&mut *out));
                hold_slot(out, slot);
            }
            ReadEnd::Blocking(work) => server.dispatch(
                slot,
                req,
                move |_| {
                    let (res, buf) = split(work());
                    (res, Payload::Bytes(buf))
                },
                &ex,
            ),
            ReadEnd::Declined => server.dispatch(slot, req, move |ex| read_through(ex, req), &ex),
        });
        if let Err(done) = export.read_async(req.offset, req.length, done, out) {
            done(ReadEnd::Declined, out);
        }
    }

    /// Reads a WRITE payload; `None` if it was too large and was discarded.
    /// A payload arriving in pieces is read as they come, the thread's own
    /// reads finished and their replies sent between them, as before a
    /// request's header.
    fn read_payload(
        &self,
        rd: &mut BufReader<Reader>,
        len: u32,
        out: &mut Batch,
        own: &mut Option<Box<dyn ThreadIo>>,
        fd: Option<RawFd>,
    ) -> io::Result<Option<Vec<u8>>> {
        let keep = len <= self.cfg.max_request;
        // Too large a payload is skipped in bounded chunks so the stream
        // stays in step.
        let mut buf = vec![0u8; if keep { len as usize } else { 1 << 20 }];
        let mut left = len as usize;
        while left > 0 {
            if rd.buffer().is_empty() {
                before_blocking_read(out, own, fd);
            }
            let at = if keep { len as usize - left } else { 0 };
            let room = left.min(buf.len() - at);
            match rd.read(&mut buf[at..at + room]) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => left -= n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(keep.then_some(buf))
    }

    /// The checks the protocol asks of every request before it runs: an
    /// unknown command or a flag not offered for it is EINVAL, a change to a
    /// read-only export EPERM, a write or zeroing past the end ENOSPC, any
    /// other request past the end EINVAL, and so is a zero-length request
    /// (the protocol leaves it unspecified; EINVAL, as nbdkit answers, tells
    /// a buggy client more than a silent success).
    fn validate(&self, req: &Request, info: &ExportInfo, session: &Session) -> Result<(), u32> {
        let offered = |flag: u16, cmd_flag: u16| if session.flags & flag != 0 { cmd_flag } else { 0 };
        let valid_flags = offered(TFLAG_SEND_FUA, CMD_FLAG_FUA)
            | match req.kind {
                CMD_READ => offered(TFLAG_SEND_DF, CMD_FLAG_DF),
                CMD_WRITE_ZEROES => CMD_FLAG_NO_HOLE | offered(TFLAG_SEND_FAST_ZERO, CMD_FLAG_FAST_ZERO),
                CMD_BLOCK_STATUS => CMD_FLAG_REQ_ONE,
                CMD_WRITE | CMD_TRIM | CMD_CACHE | CMD_FLUSH => 0,
                _ => return Err(EINVAL),
            };
        if req.flags & !valid_flags != 0 {
            return Err(EINVAL);
        }
        let writes = matches!(req.kind, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
        if writes && info.read_only {
            return Err(EPERM);
        }
        if req.kind == CMD_BLOCK_STATUS && !session.block_status {
            return Err(EINVAL);
        }
        if req.kind == CMD_FLUSH {
            return Ok(());
        }
        if req.length == 0 {
            return Err(EINVAL);
        }
        if matches!(req.kind, CMD_READ | CMD_WRITE) && req.length > self.cfg.max_request {
            return Err(EINVAL);
        }
        match req.offset.checked_add(u64::from(req.length)) {
            Some(end) if end <= info.size => Ok(()),
            _ if matches!(req.kind, CMD_WRITE | CMD_WRITE_ZEROES) => Err(ENOSPC),
            _ => Err(EINVAL),
        }
    }

    /// Waits until the connection may hold `req`'s payload (its WRITE data
    /// or its READ reply) on top of what its requests in flight hold.
    fn admit(
        &self,
        shared: &Arc<ConnShared>,
        req: &Request,
        out: &mut Batch,
        own: &mut Option<Box<dyn ThreadIo>>,
    ) -> Slot {
        let bytes = match req.kind {
            CMD_READ | CMD_WRITE => u64::from(req.length.min(self.cfg.max_request)),
            _ => 0,
        };
        let max_bytes = self.cfg.max_conn_bytes.max(u64::from(self.cfg.max_request));
        let mut n = shared.in_flight.lock();
        let mut waited = false;
        while n.requests >= self.cfg.max_in_flight.max(1) || (n.bytes > 0 && n.bytes + bytes > max_bytes) {
            if !waited {
                // Counted as the wait begins, so a stuck connection shows.
                self.stats.budget_waits.fetch_add(1, Relaxed);
                waited = true;
                drop(n);
                out.flush();
                n = shared.in_flight.lock();
                continue;
            }
            // Requests this thread finishes itself give budget back only
            // when it finishes them.
            if let Some(own) = own.as_mut().filter(|o| o.busy()) {
                drop(n);
                own.wait(None, out);
                n = shared.in_flight.lock();
                continue;
            }
            shared.drained.wait(&mut n);
        }
        n.requests += 1;
        n.bytes += bytes;
        Slot { shared: Arc::clone(shared), bytes }
    }

    fn dispatch<F>(self: &Arc<Self>, slot: Slot, req: Request, work: F, export: &Arc<dyn Export>)
    where
        F: FnOnce(&dyn Export) -> (NbdResult, Payload) + Send + 'static,
    {
        let export = Arc::clone(export);
        let server = Arc::clone(self);
        let job: Job = Box::new(move || {
            let shared = &slot.shared;
            // A panic in the export (a bug) is that request's EIO: unanswered,
            // its client would wait for ever, and the worker would be gone.
            let ran = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(export.as_ref())));
            let (res, payload) = ran.unwrap_or_else(|_| {
                tracing::error!("request {req:?} panicked in the export; answered EIO");
                (Err(Errno(libc::EIO)), Payload::empty())
            });
            server.stats.count_pieces(&payload);
            match req.kind {
                CMD_READ => shared.reply_read(req, res, &payload.slices(), &server.stats, None),
                CMD_BLOCK_STATUS => shared.reply_block_status(req, res, payload.bytes(), &server.stats),
                _ => shared.reply_status(req, res, &server.stats, None),
            }
            // The reply is out: dropping `slot` gives its budget back.
            drop(slot);
        });
        self.jobs.push(job);
    }
}

/// Before a read of the socket that may block: sends the replies made so
/// far and, while the thread has reads of its own under way, finishes them
/// until the socket has bytes. Blocked in the read instead, the thread
/// would leave their replies unsent, and a client that waits for them
/// before it sends more would wait for ever.
fn before_blocking_read(out: &mut Batch, own: &mut Option<Box<dyn ThreadIo>>, fd: Option<RawFd>) {
    out.flush();
    if let Some(own) = own.as_mut().filter(|o| o.busy()) {
        own.wait(fd, out);
    }
}

/// State one connection's reader and its in-flight jobs share.
struct ConnShared {
    writer: Mutex<Writer>,
    structured: bool,
    in_flight: Mutex<InFlight>,
    drained: Condvar,
}

#[derive(Default)]
struct InFlight {
    requests: usize,
    bytes: u64,
}

/// One admitted request's share of its connection's budget, given back
/// when dropped.
struct Slot {
    shared: Arc<ConnShared>,
    bytes: u64,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut n = self.shared.in_flight.lock();
        n.requests -= 1;
        n.bytes -= self.bytes;
        drop(n);
        self.shared.drained.notify_all();
    }
}

impl ConnShared {
    fn wait_idle(&self) {
        let mut n = self.in_flight.lock();
        while n.requests > 0 {
            self.drained.wait(&mut n);
        }
    }

    /// Sends a reply, or leaves it in `out` to go with others.
    fn send(self: &Arc<Self>, parts: &[&[u8]], out: Option<&mut Batch>) {
        if !out.is_some_and(|out| hold_reply(out, self, parts)) {
            self.send_now(parts);
        }
    }

    /// A reply's header followed by its payload's parts, in one vectored
    /// write; a payload of one part (every reply but one of pieces) needs
    /// no list made for it.
    fn send_with_header(self: &Arc<Self>, h: &[u8], data: &[&[u8]], out: Option<&mut Batch>) {
        match data {
            [one] => self.send(&[h, one], out),
            _ => {
                let mut parts = Vec::with_capacity(data.len() + 1);
                parts.push(h);
                parts.extend_from_slice(data);
                self.send(&parts, out);
            }
        }
    }

    fn send_now(&self, parts: &[&[u8]]) {
        let mut w = self.writer.lock();
        if let Err(e) = w.send(parts) {
            // The client is gone; make the reader notice too.
            debug!("reply not delivered: {e}");
            w.shutdown();
        }
    }

    fn reply_read(
        self: &Arc<Self>,
        req: Request,
        res: NbdResult,
        data: &[&[u8]],
        stats: &ServerStats,
        out: Option<&mut Batch>,
    ) {
        let len: usize = data.iter().map(|d| d.len()).sum();
        match res {
            Err(Errno(e)) => self.reply_error(req, wire_errno(e), stats, out),
            Ok(()) if self.structured && len > 0 => {
                let mut h = [0u8; 28];
                h[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
                h[4..6].copy_from_slice(&REPLY_FLAG_DONE.to_be_bytes());
                h[6..8].copy_from_slice(&REPLY_TYPE_OFFSET_DATA.to_be_bytes());
                h[8..16].copy_from_slice(&req.handle.to_be_bytes());
                h[16..20].copy_from_slice(&(8 + len as u32).to_be_bytes());
                h[20..28].copy_from_slice(&req.offset.to_be_bytes());
                self.send_with_header(&h, data, out);
            }
            Ok(()) if self.structured => self.reply_status(req, Ok(()), stats, out),
            Ok(()) => {
                let h = simple_header(req.handle, 0);
                self.send_with_header(&h, data, out);
            }
        }
    }

    fn reply_status(
        self: &Arc<Self>,
        req: Request,
        res: NbdResult,
        stats: &ServerStats,
        out: Option<&mut Batch>,
    ) {
        match res {
            Err(Errno(e)) => self.reply_error(req, wire_errno(e), stats, out),
            Ok(()) if self.structured => {
                let h = structured_header(req.handle, REPLY_TYPE_NONE, 0);
                self.send(&[&h], out);
            }
            Ok(()) => self.send(&[&simple_header(req.handle, 0)], out),
        }
    }

    /// A BLOCK_STATUS answer: one chunk for the one context, `descriptors`
    /// as [`encode_extents`] made them.
    fn reply_block_status(
        self: &Arc<Self>,
        req: Request,
        res: NbdResult,
        descriptors: &[u8],
        stats: &ServerStats,
    ) {
        if let Err(Errno(e)) = res {
            return self.reply_error(req, wire_errno(e), stats, None);
        }
        let h = structured_header(req.handle, REPLY_TYPE_BLOCK_STATUS, 4 + descriptors.len() as u32);
        self.send(&[&h, &META_ID.to_be_bytes(), descriptors], None);
    }

    fn reply_error(self: &Arc<Self>, req: Request, errno: u32, stats: &ServerStats, out: Option<&mut Batch>) {
        stats.request_errors.fetch_add(1, Relaxed);
        if self.structured {
            let h = structured_header(req.handle, REPLY_TYPE_ERROR, 6);
            let mut p = [0u8; 6];
            p[0..4].copy_from_slice(&errno.to_be_bytes());
            self.send(&[&h, &p], out);
        } else {
            self.send(&[&simple_header(req.handle, errno)], out);
        }
    }
}

/// Descriptors as the protocol wants them, whatever the export gave:
/// nonzero lengths, none starting at or past the request's end (the last
/// may run past it), one no longer than the request for REQ_ONE, and at
/// least one ("allocated, unknown" for the whole request if the export
/// gave nothing usable).
fn encode_extents(extents: &[Extent], req: &Request) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 * extents.len().max(1));
    let mut covered = 0u64;
    for e in extents.iter().filter(|e| e.len > 0) {
        if covered >= u64::from(req.length) {
            break;
        }
        let len = if req.flags & CMD_FLAG_REQ_ONE != 0 { e.len.min(req.length) } else { e.len };
        out.extend_from_slice(&len.to_be_bytes());
        out.extend_from_slice(&e.flags.to_be_bytes());
        covered += u64::from(len);
        if req.flags & CMD_FLAG_REQ_ONE != 0 {
            break;
        }
    }
    if out.is_empty() {
        out.extend_from_slice(&req.length.to_be_bytes());
        out.extend_from_slice(&0u32.to_be_bytes());
    }
    out
}

/// Parses LIST/SET_META_CONTEXT data: the export name and the queries.
pub fn parse_meta_request(data: &[u8]) -> Option<(String, Vec<String>)> {
    let mut at = 0usize;
    let mut take = |n: usize| -> Option<&[u8]> {
        let b = data.get(at..at.checked_add(n)?)?;
        at += n;
        Some(b)
    };
    let word = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
    let name_len = word(take(4)?);
    let name = String::from_utf8(take(name_len)?.to_vec()).ok()?;
    let count = word(take(4)?);
    let mut queries = Vec::new();
    for _ in 0..count {
        let len = word(take(4)?);
        queries.push(String::from_utf8(take(len)?.to_vec()).ok()?);
    }
    (at == data.len()).then_some((name, queries))
}

fn simple_header(handle: u64, error: u32) -> [u8; 16] {
    let mut h = [0u8; 16];
    h[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    h[4..8].copy_from_slice(&error.to_be_bytes());
    h[8..16].copy_from_slice(&handle.to_be_bytes());
    h
}

fn structured_header(handle: u64, kind: u16, len: u32) -> [u8; 20] {
    let mut h = [0u8; 20];
    h[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    h[4..6].copy_from_slice(&REPLY_FLAG_DONE.to_be_bytes());
    h[6..8].copy_from_slice(&kind.to_be_bytes());
    h[8..16].copy_from_slice(&handle.to_be_bytes());
    h[16..20].copy_from_slice(&len.to_be_bytes());
    h
}

/// Parses the data of INFO/GO: name length, name, count, info types.
pub fn parse_info_request(data: &[u8]) -> Option<(String, Vec<u16>)> {
    let name_len = u32::from_be_bytes(data.get(0..4)?.try_into().ok()?) as usize;
    let name_end = 4usize.checked_add(name_len)?;
    let name = std::str::from_utf8(data.get(4..name_end)?).ok()?.to_string();
    let n = u16::from_be_bytes(data.get(name_end..name_end + 2)?.try_into().ok()?) as usize;
    let rest = data.get(name_end + 2..)?;
    if rest.len() != n * 2 {
        return None;
    }
    let requests = rest.chunks_exact(2).map(|c| u16::from_be_bytes([c[0], c[1]])).collect();
    Some((name, requests))
}

/// Sends the server's greeting and reads the client's flags; returns
/// whether the client asked to skip the 124 zero bytes after EXPORT_NAME.
fn greet(rd: &mut impl Read, w: &mut Writer) -> io::Result<bool> {
    let mut hello = Vec::with_capacity(18);
    hello.extend_from_slice(&NBDMAGIC.to_be_bytes());
    hello.extend_from_slice(&IHAVEOPT.to_be_bytes());
    hello.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    w.send(&[&hello])?;
    let client_flags = read_u32(rd)?;
    if client_flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
        return Err(protocol_error(format!("unknown client flags {client_flags:#x}")));
    }
    Ok(client_flags & FLAG_C_NO_ZEROES != 0)
}

fn option_reply(w: &mut Writer, opt: u32, kind: u32, data: &[u8]) -> io::Result<()> {
    let mut h = [0u8; 20];
    h[0..8].copy_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    h[8..12].copy_from_slice(&opt.to_be_bytes());
    h[12..16].copy_from_slice(&kind.to_be_bytes());
    h[16..20].copy_from_slice(&(data.len() as u32).to_be_bytes());
    w.send(&[&h, data])
}

fn option_error(w: &mut Writer, opt: u32, kind: u32, msg: &str) -> io::Result<()> {
    debug!("option {opt}: {msg}");
    option_reply(w, opt, kind, msg.as_bytes())
}

fn protocol_error(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_be_bytes(b))
}

fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_be_bytes(b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_request_parsing_is_strict() {
        let mut d = Vec::new();
        d.extend_from_slice(&3u32.to_be_bytes());
        d.extend_from_slice(b"abc");
        d.extend_from_slice(&1u16.to_be_bytes());
        d.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        assert_eq!(parse_info_request(&d), Some(("abc".to_string(), vec![INFO_BLOCK_SIZE])));
        assert_eq!(parse_info_request(&d[..d.len() - 1]), None);
        let mut huge = d.clone();
        huge[0..4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_eq!(parse_info_request(&huge), None);
    }
}
