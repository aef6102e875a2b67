//! The server and client against each other over a unix socket, with an
//! in-memory export that can be told to stall its slow path.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nbd::proto::*;
use nbd::{Client, Errno, Export, ExportInfo, ExportSet, NbdResult, Server, ServerConfig, Target};
use parking_lot::Mutex;

/// A slow-path read here panics (a bug in an export, as the server must
/// survive it).
const PANIC_AT: u64 = (1 << 19) + 7 * 4096;

struct MemExport {
    data: Mutex<Vec<u8>>,
    read_only: bool,
    /// Reads at offsets >= this go the slow way and take 300 ms.
    slow_from: u64,
    /// FLUSH answered this long after it arrives, from another thread
    /// (`Export::flush_async`); `None`: on a worker.
    async_flush: Option<Duration>,
    /// FLUSH completions kept here for the test to call (`flush_async`).
    parked: Option<Arc<Mutex<Vec<nbd::Completion>>>>,
}

impl Export for MemExport {
    fn info(&self) -> ExportInfo {
        ExportInfo {
            size: self.data.lock().len() as u64,
            read_only: self.read_only,
            multi_conn: true,
            rotational: false,
            description: "test".into(),
            min_block: 1,
            preferred_block: 4096,
        }
    }
    fn try_read_now(&self, offset: u64, buf: &mut [u8]) -> Option<NbdResult> {
        if offset >= self.slow_from {
            return None;
        }
        let d = self.data.lock();
        buf.copy_from_slice(&d[offset as usize..offset as usize + buf.len()]);
        Some(Ok(()))
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> NbdResult {
        assert_ne!(offset, PANIC_AT, "a read the test makes panic");
        std::thread::sleep(Duration::from_millis(1000));
        let d = self.data.lock();
        buf.copy_from_slice(&d[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8], _fua: bool) -> NbdResult {
        self.data.lock()[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn flush(&self) -> NbdResult {
        Ok(())
    }
    fn flush_async(&self, done: nbd::Completion, _out: &mut nbd::Batch) -> Result<(), nbd::Completion> {
        if let Some(parked) = &self.parked {
            parked.lock().push(done);
            return Ok(());
        }
        let Some(after) = self.async_flush else { return Err(done) };
        std::thread::spawn(move || {
            std::thread::sleep(after);
            done(Err(Errno(libc::EIO)), &mut nbd::Batch::new());
        });
        Ok(())
    }
    fn trim(&self, _o: u64, _l: u64, _f: bool) -> NbdResult {
        Ok(())
    }
    fn write_zeroes(&self, offset: u64, len: u64, _f: bool) -> NbdResult {
        self.data.lock()[offset as usize..(offset + len) as usize].fill(0);
        Ok(())
    }
    fn cache(&self, _o: u64, _l: u64) -> NbdResult {
        Err(Errno(libc::ENOTSUP))
    }
}

struct Set(HashMap<String, Arc<dyn Export>>);
impl ExportSet for Set {
    fn list(&self) -> Vec<(String, String)> {
        let mut v: Vec<_> = self.0.keys().map(|k| (k.clone(), String::new())).collect();
        v.sort();
        v
    }
    fn open(&self, name: &str) -> Option<Arc<dyn Export>> {
        self.0.get(name).cloned()
    }
}

/// Few, so a test can outlast them all.
const WORKERS: usize = 4;

fn start() -> (tempfile::TempDir, Target) {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s");
    let mut m: HashMap<String, Arc<dyn Export>> = HashMap::new();
    m.insert(
        "".into(),
        Arc::new(MemExport {
            data: Mutex::new(vec![0; 1 << 20]),
            read_only: false,
            slow_from: 1 << 19,
            async_flush: None,
            parked: None,
        }),
    );
    m.insert(
        "async".into(),
        Arc::new(MemExport {
            data: Mutex::new(vec![5; 1 << 16]),
            read_only: false,
            slow_from: u64::MAX,
            async_flush: Some(Duration::from_millis(300)),
            parked: None,
        }),
    );
    m.insert(
        "ro".into(),
        Arc::new(MemExport {
            data: Mutex::new(vec![7; 1 << 16]),
            read_only: true,
            slow_from: u64::MAX,
            async_flush: None,
            parked: None,
        }),
    );
    let cfg = ServerConfig { max_request: 1 << 20, workers: WORKERS, ..Default::default() };
    let server = Server::new(Arc::new(Set(m)), cfg);
    server.listen_unix(UnixListener::bind(&sock).unwrap());
    (dir, Target::Unix(sock))
}

#[test]
fn write_read_list_and_errors() {
    let (_d, t) = start();
    let mut c = Client::connect(&t, "").unwrap();
    assert_eq!(c.size(), 1 << 20);
    c.write(4096, b"hello", true).unwrap();
    let mut b = [0u8; 5];
    c.read(4096, &mut b).unwrap();
    assert_eq!(&b, b"hello");
    let e = c.read((1 << 20) - 2, &mut b).unwrap_err();
    assert_eq!(e.errno(), libc::EINVAL, "read past the end");
    c.flush().unwrap();
    let mut ro = Client::connect(&t, "ro").unwrap();
    assert!(ro.read_only());
    assert_eq!(ro.write(0, b"x", false).unwrap_err().errno(), libc::EPERM);
    assert_eq!(Client::list(&t).unwrap(), vec!["".to_string(), "async".to_string(), "ro".to_string()]);
    assert!(Client::connect(&t, "nope").is_err());
    // The connection still works after all those errors.
    c.read(4096, &mut b).unwrap();
    c.disconnect().unwrap();
}

/// A request that panics in the export is answered EIO, and the worker
/// that ran it lives on: more panics than there are workers, then a read
/// that needs one.
#[test]
fn a_panic_in_the_export_is_that_requests_eio() {
    let (_d, t) = start();
    let mut c = Client::connect(&t, "").unwrap();
    let mut b = [0u8; 512];
    for _ in 0..(WORKERS + 2) {
        assert_eq!(c.read(PANIC_AT, &mut b).unwrap_err().errno(), libc::EIO);
    }
    c.write(1 << 19, b"after", false).unwrap();
    let mut after = [0u8; 5];
    c.read(1 << 19, &mut after).expect("a worker is left to run the slow read");
    assert_eq!(&after, b"after");
}

/// Raw protocol: a slow read followed by a fast one on the same connection;
/// the fast reply must come first.
#[test]
fn fast_reply_overtakes_slow_one() {
    let (_d, t) = start();
    let mut s = raw_session(&t, "");
    let slow = Request { flags: 0, kind: CMD_READ, handle: 1, offset: 1 << 19, length: 512 };
    let fast = Request { flags: 0, kind: CMD_READ, handle: 2, offset: 0, length: 512 };
    let t0 = Instant::now();
    s.write_all(&slow.encode()).unwrap();
    s.write_all(&fast.encode()).unwrap();
    assert_eq!(simple_reply(&mut s), (0, 2), "fast reply first");
    assert!(t0.elapsed() < Duration::from_millis(700), "the hit did not wait for the 1 s miss");
    let mut data = [0u8; 512];
    s.read_exact(&mut data).unwrap();
    assert_eq!(simple_reply(&mut s), (0, 1));
}

/// The next simple reply's header: (error, handle).
fn simple_reply(s: &mut UnixStream) -> (u32, u64) {
    let mut h = [0u8; 16];
    s.read_exact(&mut h).unwrap();
    (u32::from_be_bytes(h[4..8].try_into().unwrap()), u64::from_be_bytes(h[8..16].try_into().unwrap()))
}

/// A raw session on export `name`, selected the old way (EXPORT_NAME),
/// with simple replies.
fn raw_session(t: &Target, name: &str) -> UnixStream {
    raw_session_with(t, name, false)
}

/// `raw_session` with structured replies negotiated first.
fn raw_structured_session(t: &Target, name: &str) -> UnixStream {
    raw_session_with(t, name, true)
}

fn raw_session_with(t: &Target, name: &str, structured: bool) -> UnixStream {
    let Target::Unix(p) = t else { unreachable!() };
    let mut s = UnixStream::connect(p).unwrap();
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).unwrap();
    s.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes()).unwrap();
    let option = |opt: u32, data: &[u8]| {
        let mut o = Vec::new();
        o.extend_from_slice(&IHAVEOPT.to_be_bytes());
        o.extend_from_slice(&opt.to_be_bytes());
        o.extend_from_slice(&(data.len() as u32).to_be_bytes());
        o.extend_from_slice(data);
        o
    };
    if structured {
        s.write_all(&option(OPT_STRUCTURED_REPLY, &[])).unwrap();
        // Option reply: magic, option, type, length (no data for an ACK).
        let mut rep = [0u8; 20];
        s.read_exact(&mut rep).unwrap();
        assert_eq!(
            u32::from_be_bytes(rep[12..16].try_into().unwrap()),
            REP_ACK,
            "structured replies refused"
        );
    }
    s.write_all(&option(OPT_EXPORT_NAME, name.as_bytes())).unwrap();
    let mut info = [0u8; 10];
    s.read_exact(&mut info).unwrap();
    s
}

/// The next structured reply chunk: (flags, type, handle, payload).
fn structured_chunk(s: &mut UnixStream) -> (u16, u16, u64, Vec<u8>) {
    let mut h = [0u8; 20];
    s.read_exact(&mut h).unwrap();
    assert_eq!(u32::from_be_bytes(h[0..4].try_into().unwrap()), STRUCTURED_REPLY_MAGIC);
    let mut payload = vec![0u8; u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize];
    s.read_exact(&mut payload).unwrap();
    let flags = u16::from_be_bytes(h[4..6].try_into().unwrap());
    let kind = u16::from_be_bytes(h[6..8].try_into().unwrap());
    (flags, kind, u64::from_be_bytes(h[8..16].try_into().unwrap()), payload)
}

/// A FLUSH the export answers later, from its own thread: requests behind
/// it are answered meanwhile, and its reply carries the export's result.
#[test]
fn a_flush_answered_later_by_the_export_lets_later_requests_pass() {
    let (_d, t) = start();
    let mut s = raw_session(&t, "async");
    let flush = Request { flags: 0, kind: CMD_FLUSH, handle: 1, offset: 0, length: 0 };
    let read = Request { flags: 0, kind: CMD_READ, handle: 2, offset: 0, length: 512 };
    let t0 = Instant::now();
    s.write_all(&flush.encode()).unwrap();
    s.write_all(&read.encode()).unwrap();
    assert_eq!(simple_reply(&mut s), (0, 2), "the read is answered first");
    assert!(t0.elapsed() < Duration::from_millis(250), "the read did not wait for the flush");
    let mut data = [0u8; 512];
    s.read_exact(&mut data).unwrap();
    assert!(data.iter().all(|&b| b == 5));
    assert_eq!(simple_reply(&mut s), (libc::EIO as u32, 1), "the flush, with the export's result");
    assert!(t0.elapsed() >= Duration::from_millis(300));
}

#[test]
fn garbage_handshake_closes_only_that_connection() {
    let (_d, t) = start();
    let Target::Unix(p) = &t else { unreachable!() };
    let mut s = UnixStream::connect(p).unwrap();
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).unwrap();
    s.write_all(&[0xde; 64]).unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    assert!(rest.is_empty(), "server hangs up on garbage without replying");
    let mut c = Client::connect(&t, "").unwrap();
    c.flush().unwrap();
}

/// Replies of completions given one batch are held back until it is
/// flushed, then all delivered: FLUSHes from two connections answered in
/// one batch.
#[test]
fn replies_answered_together_are_held_until_the_batch_ends() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s");
    let parked = Arc::new(Mutex::new(Vec::new()));
    let export = MemExport {
        data: Mutex::new(vec![0; 1 << 16]),
        read_only: false,
        slow_from: u64::MAX,
        async_flush: None,
        parked: Some(Arc::clone(&parked)),
    };
    let mut m: HashMap<String, Arc<dyn Export>> = HashMap::new();
    m.insert("".into(), Arc::new(export));
    let server = Server::new(Arc::new(Set(m)), ServerConfig::default());
    server.listen_unix(UnixListener::bind(&sock).unwrap());
    let t = Target::Unix(sock);
    let mut a = raw_session(&t, "");
    let mut b = raw_session(&t, "");
    for (s, handles) in [(&mut a, [1u64, 2]), (&mut b, [3, 4])] {
        for handle in handles {
            let flush = Request { flags: 0, kind: CMD_FLUSH, handle, offset: 0, length: 0 };
            s.write_all(&flush.encode()).unwrap();
        }
    }
    let t0 = Instant::now();
    while parked.lock().len() < 4 {
        assert!(t0.elapsed() < Duration::from_secs(10), "the FLUSHes reached the export");
        std::thread::sleep(Duration::from_millis(5));
    }
    let quiet = |s: &mut UnixStream| {
        s.set_nonblocking(true).unwrap();
        let mut b = [0u8; 1];
        let nothing = matches!(s.read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock);
        s.set_nonblocking(false).unwrap();
        nothing
    };
    let mut completions: Vec<nbd::Completion> = std::mem::take(&mut *parked.lock());
    let mut batch = nbd::Batch::new();
    for done in completions.drain(..) {
        done(Ok(()), &mut batch);
    }
    std::thread::sleep(Duration::from_millis(50));
    assert!(quiet(&mut a) && quiet(&mut b), "nothing is sent before the batch is flushed");
    batch.flush();
    let mut got_a = [simple_reply(&mut a), simple_reply(&mut a)];
    let mut got_b = [simple_reply(&mut b), simple_reply(&mut b)];
    got_a.sort();
    got_b.sort();
    assert_eq!(got_a, [(0, 1), (0, 2)]);
    assert_eq!(got_b, [(0, 3), (0, 4)]);
}

/// Replies the reader holds back while more requests are buffered still go
/// out before it waits: for the rest of a WRITE's payload, or for new
/// requests.
#[test]
fn held_replies_go_out_before_the_reader_waits() {
    let (_d, t) = start();
    let mut s = raw_session(&t, "");
    let mut burst = Vec::new();
    for handle in 1..=20u64 {
        let read = Request { flags: 0, kind: CMD_READ, handle, offset: handle * 512, length: 512 };
        burst.extend_from_slice(&read.encode());
    }
    let write = Request { flags: 0, kind: CMD_WRITE, handle: 99, offset: 0, length: 4096 };
    burst.extend_from_slice(&write.encode());
    burst.extend_from_slice(&[7u8; 1000]);
    s.write_all(&burst).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut handles = Vec::new();
    for _ in 1..=20 {
        let (err, handle) = simple_reply(&mut s);
        assert_eq!(err, 0);
        let mut data = [0u8; 512];
        s.read_exact(&mut data).unwrap();
        handles.push(handle);
    }
    handles.sort();
    assert_eq!(
        handles,
        (1..=20).collect::<Vec<_>>(),
        "every read answered while the write's payload is short"
    );
    s.write_all(&[7u8; 3096]).unwrap();
    assert_eq!(simple_reply(&mut s), (0, 99));
}

thread_local! {
    /// Reads `OwnReads` started on this thread, for its `ThreadIo` to finish.
    static STARTED: std::cell::RefCell<Vec<(u64, u32, nbd::ReadCompletion)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// Answers every read later, on the connection's own thread: its reads
/// wait in that thread's `STARTED` until the server lets the thread's
/// `ThreadIo` finish them. Each byte read is its offset's low byte.
struct OwnReads;

impl Export for OwnReads {
    fn info(&self) -> ExportInfo {
        ExportInfo {
            size: 1 << 20,
            read_only: true,
            multi_conn: true,
            rotational: false,
            description: "own".into(),
            min_block: 1,
            preferred_block: 4096,
        }
    }
    fn read_async(
        &self,
        offset: u64,
        len: u32,
        done: nbd::ReadCompletion,
        _out: &mut nbd::Batch,
    ) -> Result<(), nbd::ReadCompletion> {
        STARTED.with(|s| s.borrow_mut().push((offset, len, done)));
        Ok(())
    }
    fn read(&self, _offset: u64, _buf: &mut [u8]) -> NbdResult {
        panic!("every read here is the connection thread's own")
    }
    fn write(&self, _o: u64, _d: &[u8], _f: bool) -> NbdResult {
        Err(Errno(libc::EPERM))
    }
    fn flush(&self) -> NbdResult {
        Ok(())
    }
    fn trim(&self, _o: u64, _l: u64, _f: bool) -> NbdResult {
        Err(Errno(libc::EPERM))
    }
    fn write_zeroes(&self, _o: u64, _l: u64, _f: bool) -> NbdResult {
        Err(Errno(libc::EPERM))
    }
    fn cache(&self, _o: u64, _l: u64) -> NbdResult {
        Err(Errno(libc::ENOTSUP))
    }
}

/// Finishes the reads its thread started, when the server waits on it.
struct FinishStarted;

impl nbd::ThreadIo for FinishStarted {
    fn busy(&self) -> bool {
        STARTED.with(|s| !s.borrow().is_empty())
    }
    fn wait(&mut self, fd: Option<std::os::fd::RawFd>, out: &mut nbd::Batch) {
        for (offset, len, done) in STARTED.with(|s| std::mem::take(&mut *s.borrow_mut())) {
            let bytes = (offset..offset + u64::from(len)).map(|b| b as u8).collect();
            done(nbd::ReadEnd::Done(Ok(bytes)), out);
        }
        out.flush();
        if let Some(fd) = fd {
            let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
            // SAFETY: one pollfd, live for the call.
            unsafe { libc::poll(&mut p, 1, -1) };
        }
    }
}

/// A raw session with a server of `OwnReads` whose connection threads
/// finish them (`FinishStarted`); replies time out after 5 s.
fn own_reads_session(cfg: ServerConfig) -> (tempfile::TempDir, UnixStream) {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s");
    let mut m: HashMap<String, Arc<dyn Export>> = HashMap::new();
    m.insert("".into(), Arc::new(OwnReads));
    let server = Server::new(Arc::new(Set(m)), cfg);
    server.set_thread_io(Arc::new(|| Some(Box::new(FinishStarted) as Box<dyn nbd::ThreadIo>)));
    server.listen_unix(UnixListener::bind(&sock).unwrap());
    let s = raw_session(&Target::Unix(sock), "");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    (dir, s)
}

/// A connection thread with reads of its own finishes them when it has no
/// request to read, and when its budget is spent (here two requests, so
/// the third of a burst of six waits for the first two): left to the
/// socket or to the budget's condition variable, nobody would ever answer
/// them.
#[test]
fn a_connection_finishes_its_own_reads_when_it_would_wait() {
    let (_dir, mut s) =
        own_reads_session(ServerConfig { max_in_flight: 2, workers: WORKERS, ..Default::default() });
    let mut burst = Vec::new();
    for handle in 1..=6u64 {
        let read = Request { flags: 0, kind: CMD_READ, handle, offset: handle * 1000, length: 300 };
        burst.extend_from_slice(&read.encode());
    }
    s.write_all(&burst).unwrap();
    let mut handles = Vec::new();
    for _ in 1..=6 {
        let (err, handle) = simple_reply(&mut s);
        assert_eq!(err, 0);
        let mut data = [0u8; 300];
        s.read_exact(&mut data).unwrap();
        let want: Vec<u8> = (handle * 1000..handle * 1000 + 300).map(|b| b as u8).collect();
        assert_eq!(data.to_vec(), want, "request {handle}'s own bytes");
        handles.push(handle);
    }
    handles.sort();
    assert_eq!(handles, (1..=6).collect::<Vec<_>>());
    // And after a quiet spell, a read that comes alone.
    std::thread::sleep(Duration::from_millis(100));
    let read = Request { flags: 0, kind: CMD_READ, handle: 7, offset: 0, length: 10 };
    s.write_all(&read.encode()).unwrap();
    assert_eq!(simple_reply(&mut s), (0, 7));
}

/// A client whose next request's header arrives in pieces (a TCP segment
/// can end anywhere) gets the replies of the reads its connection's
/// thread has under way meanwhile: blocked in the socket read for the rest
/// of that header, the thread would answer nothing, and a client that
/// waits for a reply before it sends more would wait for ever.
#[test]
fn a_header_split_across_writes_does_not_hold_back_own_reads() {
    let (_dir, mut s) = own_reads_session(ServerConfig { workers: WORKERS, ..Default::default() });
    let first = Request { flags: 0, kind: CMD_READ, handle: 1, offset: 100, length: 50 }.encode();
    let second = Request { flags: 0, kind: CMD_READ, handle: 2, offset: 200, length: 50 }.encode();
    let mut burst = first.to_vec();
    burst.extend_from_slice(&second[..10]);
    s.write_all(&burst).unwrap();
    assert_eq!(simple_reply(&mut s), (0, 1), "the first read is answered while the second header is partial");
    let mut data = [0u8; 50];
    s.read_exact(&mut data).unwrap();
    assert_eq!(data.to_vec(), (100..150u64).map(|b| b as u8).collect::<Vec<_>>());
    s.write_all(&second[10..]).unwrap();
    assert_eq!(simple_reply(&mut s), (0, 2));
}

/// The same for a WRITE whose payload arrives in pieces: the read before it
/// is answered while the payload's second half has not come; then the
/// write, whole, meets the read-only export (EPERM), or, over the
/// server's largest request, is skipped and refused (EINVAL).
#[test]
fn a_write_payload_in_pieces_does_not_hold_back_own_reads() {
    payload_in_pieces(ServerConfig { workers: WORKERS, ..Default::default() }, EPERM);
    payload_in_pieces(ServerConfig { workers: WORKERS, max_request: 4096, ..Default::default() }, EINVAL);
}

fn payload_in_pieces(cfg: ServerConfig, want: u32) {
    let (_dir, mut s) = own_reads_session(cfg);
    let mut burst =
        Request { flags: 0, kind: CMD_READ, handle: 1, offset: 100, length: 50 }.encode().to_vec();
    burst.extend_from_slice(
        &Request { flags: 0, kind: CMD_WRITE, handle: 2, offset: 0, length: 8192 }.encode(),
    );
    burst.extend_from_slice(&[1u8; 4096]);
    s.write_all(&burst).unwrap();
    assert_eq!(simple_reply(&mut s), (0, 1), "the read is answered while the payload is half there");
    s.read_exact(&mut [0u8; 50]).unwrap();
    s.write_all(&[1u8; 4096]).unwrap();
    assert_eq!(simple_reply(&mut s), (want, 2));
}

/// Byte `i` of the export is `piece_byte(i)`; reads of whole 4K blocks
/// below `PIECES_UNTIL` are answered with pieces cut from shared blocks,
/// one block in two a shared 8K allocation holding it and its neighbour,
/// so pieces start inside their bytes too: on the connection's thread
/// (`try_read_pieces_now`) from `PIECES_NOW` on, on a worker
/// (`read_pieces`) below it. A read at `BAD_PIECES` from either start gets
/// pieces that fall short of its length; a read of anything else, and any
/// read of 8 KiB or less (the server copies those into its batch anyway),
/// goes through `read`.
struct PieceExport {
    blocks: Vec<nbd::SharedBytes>,
}

const PIECES_UNTIL: u64 = 8 << 20;
const PIECES_NOW: u64 = PIECES_UNTIL / 2;
const BAD_PIECES: u64 = 3 * 4096;

/// Not periodic in 4K, so pieces out of order would show.
fn piece_byte(i: u64) -> u8 {
    ((i >> 12) * 31 + i * 7) as u8
}

fn whole_blocks(offset: u64, len: u64) -> bool {
    offset.is_multiple_of(4096) && len.is_multiple_of(4096) && offset + len <= PIECES_UNTIL
}

/// Replies the server would rather answer with pieces.
const PIECES_ABOVE: u64 = 8 << 10;

impl PieceExport {
    fn new() -> PieceExport {
        let blocks = (0..PIECES_UNTIL / 8192)
            .map(|b| {
                let bytes: Vec<u8> = (b * 8192..(b + 1) * 8192).map(piece_byte).collect();
                Arc::new(bytes) as nbd::SharedBytes
            })
            .collect();
        PieceExport { blocks }
    }

    fn pieces(&self, offset: u64, len: u32) -> Vec<nbd::Piece> {
        let end = offset + u64::from(len);
        let mut pieces: Vec<nbd::Piece> = (offset / 4096..end / 4096)
            .map(|k| {
                let at = (k % 2 * 4096) as usize;
                nbd::Piece::new(Arc::clone(&self.blocks[(k / 2) as usize]), at..at + 4096).unwrap()
            })
            .collect();
        if offset % PIECES_NOW == BAD_PIECES {
            pieces.pop();
        }
        pieces
    }
}

impl Export for PieceExport {
    fn info(&self) -> ExportInfo {
        ExportInfo {
            size: 16 << 20,
            read_only: true,
            multi_conn: true,
            rotational: false,
            description: "pieces".into(),
            min_block: 1,
            preferred_block: 4096,
        }
    }
    fn try_read_pieces_now(&self, offset: u64, len: u32) -> Option<Result<Vec<nbd::Piece>, Errno>> {
        assert!(u64::from(len) > PIECES_ABOVE, "pieces asked for a reply the batch would copy");
        (offset >= PIECES_NOW && whole_blocks(offset, u64::from(len))).then(|| Ok(self.pieces(offset, len)))
    }
    fn read_pieces(&self, offset: u64, len: u32) -> Option<Result<Vec<nbd::Piece>, Errno>> {
        assert!(u64::from(len) > PIECES_ABOVE, "pieces asked for a reply the batch would copy");
        if !whole_blocks(offset, u64::from(len)) {
            return None;
        }
        assert!(offset < PIECES_NOW, "a read the connection's thread answers");
        Some(Ok(self.pieces(offset, len)))
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> NbdResult {
        let len = buf.len() as u64;
        assert!(
            !whole_blocks(offset, len) || len <= PIECES_ABOVE,
            "a large read of whole blocks must be answered with pieces"
        );
        for (i, b) in buf.iter_mut().enumerate() {
            *b = piece_byte(offset + i as u64);
        }
        Ok(())
    }
    fn write(&self, _o: u64, _d: &[u8], _f: bool) -> NbdResult {
        Err(Errno(libc::EPERM))
    }
    fn flush(&self) -> NbdResult {
        Ok(())
    }
    fn trim(&self, _o: u64, _l: u64, _f: bool) -> NbdResult {
        Err(Errno(libc::EPERM))
    }
    fn write_zeroes(&self, _o: u64, _l: u64, _f: bool) -> NbdResult {
        Err(Errno(libc::EPERM))
    }
    fn cache(&self, _o: u64, _l: u64) -> NbdResult {
        Err(Errno(libc::ENOTSUP))
    }
}

/// A reply made of an export's pieces carries exactly their bytes, in
/// order (however many: more than a vectored write takes at once), under
/// simple and structured replies alike; pieces that do not
/// add up to the request are that request's EIO, and the connection goes
/// on.
#[test]
fn a_read_answered_with_pieces_carries_their_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s");
    let mut m: HashMap<String, Arc<dyn Export>> = HashMap::new();
    m.insert("".into(), Arc::new(PieceExport::new()));
    let cfg = ServerConfig { workers: WORKERS, ..Default::default() };
    let server = Server::new(Arc::new(Set(m)), cfg);
    server.listen_unix(UnixListener::bind(&sock).unwrap());
    let t = Target::Unix(sock);
    let want = |o: u64, l: usize| (o..o + l as u64).map(piece_byte).collect::<Vec<u8>>();
    // Simple replies through the crate's client.
    let mut c = Client::connect(&t, "").unwrap();
    // 4 MiB is 1,024 pieces and the header: more than one vectored write
    // takes (IOV_MAX), on a worker and on the connection's thread.
    let reads = [
        (0u64, 4096usize),
        (4096, 8192),
        (20480, 65536),
        (PIECES_UNTIL - 4096, 4096),
        (PIECES_NOW - 8192, 16384),
        (100, 5000),
        (0, 4 << 20),
        (PIECES_NOW, 4 << 20),
    ];
    for (o, l) in reads {
        let mut b = vec![0u8; l];
        c.read(o, &mut b).unwrap();
        assert!(b == want(o, l), "structured read {o}+{l}");
    }
    let mut b = vec![0u8; 16384];
    assert_eq!(c.read(BAD_PIECES, &mut b).unwrap_err().errno(), libc::EIO);
    assert_eq!(c.read(PIECES_NOW + BAD_PIECES, &mut b).unwrap_err().errno(), libc::EIO);
    c.read(8192, &mut b).unwrap();
    assert!(b == want(8192, 16384), "the connection goes on after the EIO");
    // Structured replies: one OFFSET_DATA chunk, DONE, whose length and
    // offset count the pieces, on a worker and on the connection's thread.
    let mut s = raw_structured_session(&t, "");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    for (handle, offset, length) in [(1u64, 20480u64, 65536u32), (2, 0, 4 << 20), (3, PIECES_NOW, 4 << 20)] {
        s.write_all(&Request { flags: 0, kind: CMD_READ, handle, offset, length }.encode()).unwrap();
        let (flags, kind, h, payload) = structured_chunk(&mut s);
        assert_eq!((flags, kind, h), (REPLY_FLAG_DONE, REPLY_TYPE_OFFSET_DATA, handle));
        assert_eq!(u64::from_be_bytes(payload[..8].try_into().unwrap()), offset);
        assert!(payload[8..] == want(offset, length as usize), "structured read {offset}+{length}");
    }
    // Simple replies, raw.
    let mut s = raw_session(&t, "");
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let read = Request { flags: 0, kind: CMD_READ, handle: 9, offset: 12288 + 4096, length: 16384 };
    s.write_all(&read.encode()).unwrap();
    assert_eq!(simple_reply(&mut s), (0, 9));
    let mut data = vec![0u8; 16384];
    s.read_exact(&mut data).unwrap();
    assert!(data == want(16384, 16384), "simple read");
}

/// After `shutdown`, nothing the server started keeps it: the threads
/// accepting on its unix and TCP sockets end, so dropping the last handle
/// frees it and its exports (each accepting thread holds the server, so
/// its being freed says they ended); and a client connecting after the
/// shutdown is refused rather than left waiting in the backlog.
#[test]
fn a_shut_down_server_stops_accepting_and_is_freed_once_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s");
    let export: Arc<dyn Export> = Arc::new(MemExport {
        data: Mutex::new(vec![3; 1 << 16]),
        read_only: false,
        slow_from: u64::MAX,
        async_flush: None,
        parked: None,
    });
    let export_left = Arc::downgrade(&export);
    let server =
        Server::new(Arc::new(Set(HashMap::from([("".to_string(), export)]))), ServerConfig::default());
    server.listen_unix(UnixListener::bind(&sock).unwrap());
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = tcp.local_addr().unwrap();
    server.listen_tcp(tcp);
    let mut client = Client::connect(&Target::Unix(sock.clone()), "").unwrap();
    let mut b = [0u8; 4];
    client.read(0, &mut b).unwrap();
    assert_eq!(b, [3; 4]);
    let server_left = Arc::downgrade(&server);

    assert!(server.shutdown(Duration::from_secs(10)), "the connection ended");
    assert!(UnixStream::connect(&sock).is_err(), "a unix client after the shutdown is refused");
    assert!(std::net::TcpStream::connect(addr).is_err(), "a TCP client after the shutdown is refused");
    drop(server);
    let deadline = Instant::now() + Duration::from_secs(10);
    while server_left.upgrade().is_some() || export_left.upgrade().is_some() {
        assert!(
            Instant::now() < deadline,
            "the server or its export is still held after its shutdown and drop"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    drop(client);
}
