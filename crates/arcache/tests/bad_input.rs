//! Malformed and hostile clients get the protocol's answer, and the server
//! keeps serving everyone else.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::*;
use nbd::proto::*;

fn server(read_only: bool) -> Serve {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("b.img");
    random_file(&p, 1 << 20, 1);
    // A store of its own: two writable exports of one file are refused
    // (each would cache writes the other never sees).
    let second = dir.path().join("b2.img");
    random_file(&second, 1 << 20, 1);
    let mut args = vec!["--export".to_string(), p.display().to_string()];
    args.push("--export".into());
    args.push(format!("ro={}", second.display()));
    if read_only {
        args.push("--read-only".into());
    }
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    Serve::start(dir, &refs)
}

/// Opens a raw connection after the greeting, with structured replies off.
fn raw(s: &Serve) -> UnixStream {
    let mut c = UnixStream::connect(&s.sock).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut hello = [0u8; 18];
    c.read_exact(&mut hello).unwrap();
    assert_eq!(&hello[0..8], &NBDMAGIC.to_be_bytes());
    c.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes()).unwrap();
    c
}

fn send_option(c: &mut UnixStream, opt: u32, data: &[u8]) {
    let mut o = Vec::new();
    o.extend_from_slice(&IHAVEOPT.to_be_bytes());
    o.extend_from_slice(&opt.to_be_bytes());
    o.extend_from_slice(&(data.len() as u32).to_be_bytes());
    o.extend_from_slice(data);
    c.write_all(&o).unwrap();
}

fn option_reply(c: &mut UnixStream) -> (u32, Vec<u8>) {
    let mut h = [0u8; 20];
    c.read_exact(&mut h).unwrap();
    assert_eq!(&h[0..8], &OPTION_REPLY_MAGIC.to_be_bytes());
    let kind = u32::from_be_bytes(h[12..16].try_into().unwrap());
    let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
    let mut d = vec![0u8; len as usize];
    c.read_exact(&mut d).unwrap();
    (kind, d)
}

/// A raw connection in transmission on `export`, via EXPORT_NAME.
fn transmitting(s: &Serve, export: &str) -> UnixStream {
    let mut c = raw(s);
    send_option(&mut c, OPT_EXPORT_NAME, export.as_bytes());
    let mut info = [0u8; 10];
    c.read_exact(&mut info).unwrap();
    c
}

fn request(c: &mut UnixStream, kind: u16, handle: u64, offset: u64, length: u32) {
    c.write_all(&Request { flags: 0, kind, handle, offset, length }.encode()).unwrap();
}

fn simple_reply(c: &mut UnixStream) -> (u32, u64) {
    let mut h = [0u8; 16];
    c.read_exact(&mut h).unwrap();
    assert_eq!(&h[0..4], &SIMPLE_REPLY_MAGIC.to_be_bytes());
    (u32::from_be_bytes(h[4..8].try_into().unwrap()), u64::from_be_bytes(h[8..16].try_into().unwrap()))
}

fn still_serves(s: &Serve) {
    let mut c = nbd::Client::connect(&s.target(), "").expect("server still accepts clients");
    let mut b = [0u8; 512];
    c.read(0, &mut b).expect("and serves reads");
}

#[test]
fn unknown_option_gets_unsup_and_the_handshake_goes_on() {
    let s = server(false);
    let mut c = raw(&s);
    send_option(&mut c, 0xdead, b"junk");
    assert_eq!(option_reply(&mut c).0, REP_ERR_UNSUP);
    send_option(&mut c, OPT_STARTTLS, &[]);
    assert!(option_reply(&mut c).0 & REP_FLAG_ERROR != 0, "no TLS configured: an error, not a hang");
    let mut go = Vec::new();
    go.extend_from_slice(&7u32.to_be_bytes());
    go.extend_from_slice(b"missing");
    go.extend_from_slice(&0u16.to_be_bytes());
    send_option(&mut c, OPT_GO, &go);
    assert_eq!(option_reply(&mut c).0, REP_ERR_UNKNOWN);
    send_option(&mut c, OPT_GO, &[0, 0, 0, 9]);
    assert_eq!(option_reply(&mut c).0, REP_ERR_INVALID, "truncated GO");
    send_option(&mut c, OPT_ABORT, &[]);
    assert_eq!(option_reply(&mut c).0, REP_ACK);
    still_serves(&s);
}

#[test]
fn garbage_in_the_handshake_closes_only_that_connection() {
    let s = server(false);
    for garbage in [&b"GET / HTTP/1.1\r\n\r\n"[..], &[0xff; 300][..], &[0, 0, 0, 3, 0xde, 0xad][..]] {
        let mut c = UnixStream::connect(&s.sock).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut hello = [0u8; 18];
        c.read_exact(&mut hello).unwrap();
        let _ = c.write_all(garbage);
        let _ = c.shutdown(std::net::Shutdown::Write);
        let mut rest = Vec::new();
        let _ = c.read_to_end(&mut rest);
    }
    // An option claiming a gigantic payload.
    let mut c = raw(&s);
    let mut o = Vec::new();
    o.extend_from_slice(&IHAVEOPT.to_be_bytes());
    o.extend_from_slice(&OPT_GO.to_be_bytes());
    o.extend_from_slice(&u32::MAX.to_be_bytes());
    c.write_all(&o).unwrap();
    let mut rest = Vec::new();
    let _ = c.read_to_end(&mut rest);
    assert!(rest.is_empty(), "server hangs up instead of allocating 4 GiB");
    still_serves(&s);
}

#[test]
fn transmission_errors_are_answered_and_the_connection_continues() {
    let s = server(false);
    let mut c = transmitting(&s, "");
    request(&mut c, CMD_READ, 1, (1 << 20) - 100, 4096);
    assert_eq!(simple_reply(&mut c), (EINVAL, 1), "read past the end");
    request(&mut c, 77, 2, 0, 0);
    assert_eq!(simple_reply(&mut c), (EINVAL, 2), "unknown command");
    request(&mut c, CMD_READ, 3, 0, (64 << 20) + 4096);
    assert_eq!(simple_reply(&mut c), (EINVAL, 3), "oversized read");
    request(&mut c, CMD_TRIM, 4, u64::MAX - 10, 100);
    assert_eq!(simple_reply(&mut c), (EINVAL, 4), "offset overflow");
    // An oversized write: its payload is skipped and the stream stays in step.
    let big = (64u32 << 20) + 5;
    request(&mut c, CMD_WRITE, 5, 0, big);
    c.write_all(&vec![0u8; big as usize]).unwrap();
    assert_eq!(simple_reply(&mut c), (EINVAL, 5), "oversized write");
    // Within the limit but past the end: ENOSPC, as the protocol asks of writes.
    request(&mut c, CMD_WRITE, 7, (1 << 20) - 512, 4096);
    c.write_all(&[0u8; 4096]).unwrap();
    assert_eq!(simple_reply(&mut c), (ENOSPC, 7), "write past the end");
    request(&mut c, CMD_READ, 6, 0, 512);
    assert_eq!(simple_reply(&mut c), (0, 6));
    let mut data = [0u8; 512];
    c.read_exact(&mut data).unwrap();
    still_serves(&s);
}

#[test]
fn writes_to_a_read_only_export_get_eperm() {
    let s = server(true);
    let mut c = transmitting(&s, "ro");
    request(&mut c, CMD_WRITE, 1, 0, 4);
    c.write_all(b"nope").unwrap();
    assert_eq!(simple_reply(&mut c), (EPERM, 1));
    request(&mut c, CMD_TRIM, 2, 0, 4096);
    assert_eq!(simple_reply(&mut c), (EPERM, 2));
    request(&mut c, CMD_WRITE_ZEROES, 3, 0, 4096);
    assert_eq!(simple_reply(&mut c), (EPERM, 3));
    let nc = nbd::Client::connect(&s.target(), "ro").unwrap();
    assert!(nc.read_only(), "the read-only flag is advertised");
}

#[test]
fn a_client_vanishing_mid_request_does_not_hurt_the_others() {
    let s = server(false);
    for _ in 0..20 {
        let mut c = transmitting(&s, "");
        // Half a header, a write without its payload, reads never collected.
        request(&mut c, CMD_READ, 1, 0, 1 << 20);
        request(&mut c, CMD_WRITE, 2, 0, 1 << 16);
        c.write_all(&[1u8; 100]).unwrap();
        drop(c);
        let mut c = transmitting(&s, "");
        c.write_all(&[0x25, 0x60]).unwrap();
        drop(c);
    }
    still_serves(&s);
    let st = s.stat();
    assert!(st["nbd_connections"].as_u64().unwrap() >= 40);
}

#[test]
fn structured_replies_carry_data_and_errors() {
    let s = server(false);
    let mut c = raw(&s);
    send_option(&mut c, OPT_STRUCTURED_REPLY, &[]);
    assert_eq!(option_reply(&mut c).0, REP_ACK);
    let mut go = Vec::new();
    go.extend_from_slice(&0u32.to_be_bytes());
    go.extend_from_slice(&1u16.to_be_bytes());
    go.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
    send_option(&mut c, OPT_GO, &go);
    let mut saw_block_size = false;
    loop {
        let (kind, d) = option_reply(&mut c);
        if kind == REP_ACK {
            break;
        }
        assert_eq!(kind, REP_INFO);
        if d[0..2] == INFO_BLOCK_SIZE.to_be_bytes() {
            saw_block_size = true;
            assert_eq!(u32::from_be_bytes(d[6..10].try_into().unwrap()), 16384, "preferred = recordsize");
        }
    }
    assert!(saw_block_size);
    request(&mut c, CMD_READ, 9, 4096, 100);
    let mut h = [0u8; 20];
    c.read_exact(&mut h).unwrap();
    assert_eq!(&h[0..4], &STRUCTURED_REPLY_MAGIC.to_be_bytes());
    assert_eq!(u16::from_be_bytes([h[6], h[7]]), REPLY_TYPE_OFFSET_DATA);
    let mut body = vec![0u8; 8 + 100];
    c.read_exact(&mut body).unwrap();
    assert_eq!(u64::from_be_bytes(body[0..8].try_into().unwrap()), 4096);
    request(&mut c, CMD_READ, 10, 1 << 21, 100);
    c.read_exact(&mut h).unwrap();
    assert_eq!(u16::from_be_bytes([h[6], h[7]]), REPLY_TYPE_ERROR);
    let mut e = [0u8; 6];
    c.read_exact(&mut e).unwrap();
    assert_eq!(u32::from_be_bytes(e[0..4].try_into().unwrap()), EINVAL);
}

/// The process's peak resident memory, from /proc.
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib = status.lines().find_map(|l| l.strip_prefix("VmHWM:")).unwrap();
    kib.trim().trim_end_matches("kB").trim().parse::<u64>().unwrap() << 10
}

#[test]
fn a_client_piling_up_huge_reads_it_never_collects_is_held_to_its_memory_budget() {
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("sparse.img");
    std::fs::File::create(&backing).unwrap().set_len(1 << 30).unwrap();
    let b = backing.to_str().unwrap();
    let s = Serve::start(dir, &["--export", b, "--arc-max", "64M", "--max-conn-memory", "64M"]);
    let pid = s.child.as_ref().unwrap().id();
    let mut greedy = nbd::Client::connect(&s.target(), "").unwrap();
    // 1 GiB of 32 MiB replies asked for, none read: without a budget every
    // reply buffer would be allocated and filled at once.
    for i in 0..32u64 {
        greedy.send_read(i << 25, 32 << 20).unwrap();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while s.stat()["nbd_budget_waits"].as_u64().unwrap_or(0) == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    // Time for anything admitted to be read from the backing store.
    std::thread::sleep(Duration::from_secs(2));
    let peak = peak_rss(pid);
    eprintln!("peak RSS with 1 GiB of replies pending: {} MiB", peak >> 20);
    assert!(peak < 400 << 20, "peak RSS {} MiB: the 64 MiB budget did not hold", peak >> 20);
    assert!(s.stat()["nbd_budget_waits"].as_u64() > Some(0), "the reader waited for its budget");
    still_serves(&s);
    drop(greedy);
    still_serves(&s);
}

#[test]
fn connections_beyond_max_connections_are_closed_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("b.img");
    random_file(&backing, 1 << 20, 2);
    let s = Serve::start(dir, &["--export", backing.to_str().unwrap(), "--max-connections", "2"]);
    let idle = |n: u64| {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while s.stat()["nbd_active_connections"].as_u64() != Some(n) {
            assert!(std::time::Instant::now() < deadline, "connections never settled at {n}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    idle(0); // the start-up probes are gone
    let first = nbd::Client::connect(&s.target(), "").unwrap();
    let _second = nbd::Client::connect(&s.target(), "").unwrap();
    assert!(nbd::Client::connect(&s.target(), "").is_err(), "a third connection is refused");
    assert_eq!(s.stat()["nbd_refused_connections"].as_u64(), Some(1));
    first.disconnect().unwrap();
    idle(1);
    let mut again = nbd::Client::connect(&s.target(), "").expect("a freed place is taken again");
    let mut buf = [0u8; 512];
    again.read(0, &mut buf).unwrap();
}

/// A build without the `rbd` feature refuses an `rbd:` export, saying why
/// (and a malformed spec as malformed).
#[cfg(not(feature = "rbd"))]
#[test]
fn an_rbd_export_in_a_build_without_rbd_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let err = serve_refused(dir.path(), &["--export", "disk=rbd:rbd/disk0?conf=/etc/ceph/ceph.conf"]);
    assert!(err.contains("built without RBD support"), "{err}");
    let err = serve_refused(dir.path(), &["--export", "disk=rbd:rbd"]);
    assert!(err.contains("no /IMAGE after the pool"), "{err}");
}
