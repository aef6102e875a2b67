//! NBD over TLS (STARTTLS) through the real binary, with libnbd's clients
//! and a CA made fresh for each test.

mod common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use common::*;
use rcgen::{BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair};

/// PEM files for one test: a CA, a server certificate for localhost, and
/// certificate directories in the layout libnbd reads.
struct Pki {
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    /// ca-cert.pem only: a client that checks the server.
    anonymous: PathBuf,
    /// ca-cert.pem plus a client certificate the CA signed.
    trusted_client: PathBuf,
    /// A client certificate from another CA.
    rogue_client: PathBuf,
}

fn new_ca(name: &str) -> (rcgen::Certificate, Issuer<'static, KeyPair>) {
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    (cert, Issuer::new(params, key))
}

fn leaf(
    issuer: &Issuer<'static, KeyPair>,
    names: &[&str],
    usage: ExtendedKeyUsagePurpose,
) -> (String, String) {
    let mut params = CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    params.distinguished_name.push(DnType::CommonName, names[0]);
    params.extended_key_usages = vec![usage];
    let key = KeyPair::generate().unwrap();
    let cert = params.signed_by(&key, issuer).unwrap();
    (cert.pem(), key.serialize_pem())
}

fn write(path: &Path, text: &str) -> PathBuf {
    std::fs::write(path, text).unwrap();
    path.to_path_buf()
}

fn make_pki(dir: &Path) -> Pki {
    let (ca_cert, ca) = new_ca("arcache test CA");
    let (_, rogue) = new_ca("someone else's CA");
    let (cert, key) = leaf(&ca, &["localhost", "127.0.0.1"], ExtendedKeyUsagePurpose::ServerAuth);
    let client_dir = |name: &str, signer: Option<&Issuer<'static, KeyPair>>| {
        let d = dir.join(name);
        std::fs::create_dir(&d).unwrap();
        write(&d.join("ca-cert.pem"), &ca_cert.pem());
        if let Some(signer) = signer {
            let (c, k) = leaf(signer, &["alice"], ExtendedKeyUsagePurpose::ClientAuth);
            write(&d.join("client-cert.pem"), &c);
            write(&d.join("client-key.pem"), &k);
        }
        d
    };
    Pki {
        ca: write(&dir.join("ca.pem"), &ca_cert.pem()),
        server_cert: write(&dir.join("server-cert.pem"), &cert),
        server_key: write(&dir.join("server-key.pem"), &key),
        anonymous: client_dir("anonymous", None),
        trusted_client: client_dir("trusted", Some(&ca)),
        rogue_client: client_dir("rogue", Some(&rogue)),
    }
}

fn start(mode: &str, extra: impl Fn(&Pki) -> Vec<String>) -> (Serve, Pki, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let pki = make_pki(dir.path());
    let backing = dir.path().join("backing.img");
    random_file(&backing, 8 << 20, 3);
    let mut args = vec!["--export".to_string(), backing.display().to_string(), "--tls".into(), mode.into()];
    for (flag, p) in [("--tls-cert", &pki.server_cert), ("--tls-key", &pki.server_key)] {
        args.extend([flag.to_string(), p.display().to_string()]);
    }
    args.extend(extra(&pki));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    (Serve::start(dir, &args), pki, backing)
}

fn tls_uri(s: &Serve, certs: &Path) -> String {
    format!("nbds+unix:///?socket={}&tls-certificates={}", s.sock.display(), certs.display())
}

fn nbdinfo_size(uri: &str) -> Output {
    need("nbdinfo");
    let child = Command::new("nbdinfo")
        .args(["--size", uri])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_timeout(child, Duration::from_secs(30))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[test]
fn required_tls_carries_real_clients_and_refuses_plaintext() {
    need("nbdcopy");
    let port = free_port();
    let listen = format!("tcp:127.0.0.1:{port}");
    let (s, pki, backing) = start("required", |_| vec!["--listen".into(), listen.clone()]);
    let over_unix = tls_uri(&s, &pki.anonymous);
    let over_tcp = format!("nbds://127.0.0.1:{port}/?tls-certificates={}", pki.anonymous.display());
    for uri in [&over_unix, &over_tcp] {
        let out = nbdinfo_size(uri);
        assert!(out.status.success(), "{uri}: {}", String::from_utf8_lossy(&out.stderr));
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), (8 << 20).to_string());
    }
    // Plaintext is refused on both listeners, not silently served.
    for uri in [s.uri(""), format!("nbd://127.0.0.1:{port}/")] {
        let out = nbdinfo_size(&uri);
        assert!(!out.status.success(), "{uri} must be refused without TLS");
    }
    // Data through TLS: nbdcopy in and out, fio with verification at depth 16.
    let src = s.dir.path().join("src.img");
    let data = random_file(&src, 8 << 20, 11);
    run(Command::new("nbdcopy").arg(&src).arg(&over_tcp));
    let back = s.dir.path().join("back.img");
    run(Command::new("nbdcopy").args(["--connections=2", "--requests=16"]).arg(&over_unix).arg(&back));
    assert!(std::fs::read(&back).unwrap() == data, "what nbdcopy read back over TLS equals what it wrote");
    // Many requests in flight on several connections: replies sealed by
    // worker threads while the reader decrypts the next requests.
    let src2 = s.dir.path().join("src2.img");
    let data2 = random_file(&src2, 8 << 20, 12);
    run(Command::new("nbdcopy")
        .args(["--connections=4", "--requests=64", "--request-size=65536"])
        .arg(&src2)
        .arg(&over_unix));
    run(Command::new("nbdcopy").args(["--connections=4", "--requests=64"]).arg(&over_tcp).arg(&back));
    assert!(std::fs::read(&back).unwrap() == data2, "a second, more concurrent round trip is exact too");
    let st = s.stat();
    assert_eq!(st["nbd_request_errors"].as_u64(), Some(0), "{st}");
    assert!(
        st["nbd_tls_sessions"].as_u64() >= Some(5),
        "two nbdinfo and three nbdcopy runs, each over TLS: {st}"
    );
    let dir = s.stop();
    let disk = std::fs::read(&backing).unwrap();
    assert!(disk == data2, "data written over TLS reached the backing store");
    drop(dir);
}

#[test]
fn client_certificates_are_verified_when_a_client_ca_is_given() {
    let (s, pki, _) = start("required", |pki| vec!["--tls-client-ca".into(), pki.ca.display().to_string()]);
    let ok = nbdinfo_size(&tls_uri(&s, &pki.trusted_client));
    let err = String::from_utf8_lossy(&ok.stderr);
    assert!(ok.status.success(), "a client certificate from the CA is accepted: {err}");
    for (what, certs) in
        [("no client certificate", &pki.anonymous), ("another CA's certificate", &pki.rogue_client)]
    {
        let out = nbdinfo_size(&tls_uri(&s, certs));
        assert!(!out.status.success(), "{what} must be refused");
    }
    let st = s.stat();
    assert_eq!(st["nbd_tls_sessions"].as_u64(), Some(1), "{st}");
    assert_eq!(st["nbd_tls_handshake_errors"].as_u64(), Some(2), "both refusals are counted: {st}");
}

#[test]
fn tls_on_lets_each_client_choose() {
    let (s, pki, _) = start("on", |_| vec![]);
    for uri in [s.uri(""), tls_uri(&s, &pki.anonymous)] {
        let out = nbdinfo_size(&uri);
        assert!(out.status.success(), "{uri}: {}", String::from_utf8_lossy(&out.stderr));
    }
}

// ------------------------------------------------------------ the raw protocol

const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
const OPT_EXPORT_NAME: u32 = 1;
const OPT_STARTTLS: u32 = 5;
const OPT_GO: u32 = 7;
const REP_ERR_TLS_REQD: u32 = (1 << 31) | 5;

fn option(opt: u32, data: &[u8]) -> Vec<u8> {
    let mut v = IHAVEOPT.to_be_bytes().to_vec();
    v.extend_from_slice(&opt.to_be_bytes());
    v.extend_from_slice(&(data.len() as u32).to_be_bytes());
    v.extend_from_slice(data);
    v
}

/// Connects, reads the greeting and sends the client flags plus `then`.
fn raw_session(s: &Serve, then: &[u8]) -> UnixStream {
    let mut c = UnixStream::connect(&s.sock).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut hello = [0u8; 18];
    c.read_exact(&mut hello).unwrap();
    let mut msg = 3u32.to_be_bytes().to_vec(); // fixed newstyle, no zeroes
    msg.extend_from_slice(then);
    c.write_all(&msg).unwrap();
    c
}

/// The type of the next option reply.
fn reply_type(c: &mut UnixStream) -> u32 {
    let mut h = [0u8; 20];
    c.read_exact(&mut h).unwrap();
    let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
    let mut skip = vec![0u8; len as usize];
    c.read_exact(&mut skip).unwrap();
    u32::from_be_bytes(h[12..16].try_into().unwrap())
}

fn closed(c: &mut UnixStream) -> bool {
    let mut b = [0u8; 64];
    matches!(c.read(&mut b), Ok(0) | Err(_))
}

#[test]
fn a_tls_only_server_answers_nothing_but_starttls_in_plaintext() {
    let (s, _, _) = start("required", |_| vec![]);
    let mut go = 0u32.to_be_bytes().to_vec();
    go.extend_from_slice(&0u16.to_be_bytes());
    let mut c = raw_session(&s, &option(OPT_GO, &go));
    assert_eq!(reply_type(&mut c), REP_ERR_TLS_REQD, "GO before STARTTLS is refused");
    // EXPORT_NAME has no error reply: the server must hang up.
    c.write_all(&option(OPT_EXPORT_NAME, b"")).unwrap();
    assert!(closed(&mut c), "EXPORT_NAME without TLS ends the connection");
}

#[test]
fn bytes_pipelined_after_starttls_are_not_taken_as_encrypted() {
    let (s, _, _) = start("required", |_| vec![]);
    // A man in the middle could append plaintext after STARTTLS hoping the
    // server reads it as if it came through TLS; the server must refuse.
    let mut msg = option(OPT_STARTTLS, b"");
    msg.extend_from_slice(&option(OPT_EXPORT_NAME, b""));
    let mut c = raw_session(&s, &msg);
    assert!(closed(&mut c), "no ACK, no TLS: the connection is dropped");
    // The server still serves others.
    let mut c = raw_session(&s, &option(OPT_STARTTLS, b"x"));
    assert_ne!(reply_type(&mut c), 1, "STARTTLS with data is invalid, not acknowledged");
}

#[test]
fn tls_settings_are_checked_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("b.img");
    random_file(&backing, 1 << 20, 1);
    let b = backing.to_str().unwrap();
    let sock = format!("unix:{}", dir.path().join("s.sock").display());
    let missing = dir.path().join("missing.pem");
    let m = missing.to_str().unwrap();
    for (args, expect) in [
        (vec!["--tls", "on"], "--tls-cert"),
        (vec!["--tls", "sometimes", "--tls-cert", m, "--tls-key", m], "off, on or required"),
        (vec!["--tls-cert", m, "--tls-key", m], "missing.pem"),
    ] {
        let out = Command::new(BIN)
            .args(["serve", "--export", b, "--listen", &sock, "--control"])
            .arg(dir.path().join("c.sock"))
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} must fail");
        assert!(err.contains(expect), "{args:?}: error should mention {expect:?}: {err}");
    }
}

// ------------------------------------------------------------ nbds backing stores

#[test]
fn an_nbds_backing_store_is_reached_over_tls_and_its_certificate_checked() {
    let dir = tempfile::tempdir().unwrap();
    let pki = make_pki(dir.path());
    // nbdkit reads ca-cert.pem, server-cert.pem and server-key.pem from one directory.
    let kit_dir = dir.path().join("kit");
    std::fs::create_dir(&kit_dir).unwrap();
    for (from, to) in
        [(&pki.ca, "ca-cert.pem"), (&pki.server_cert, "server-cert.pem"), (&pki.server_key, "server-key.pem")]
    {
        std::fs::copy(from, kit_dir.join(to)).unwrap();
    }
    let tls_dir = format!("--tls-certificates={}", kit_dir.display());
    let kit = Nbdkit::start(dir.path(), "origin", &["--tls=require", &tls_dir, "memory", "8M"]);
    let backing = |certs: &Path| {
        format!("nbds+unix:///?socket={}&tls-certificates={}", kit.sock.display(), certs.display())
    };

    // A CA that did not sign nbdkit's certificate: refused at start, clearly.
    let (stranger, _) = new_ca("a stranger");
    let wrong = dir.path().join("wrong-ca");
    std::fs::create_dir(&wrong).unwrap();
    write(&wrong.join("ca-cert.pem"), &stranger.pem());
    let out = Command::new(BIN)
        .args(["serve", "--export", &backing(&wrong), "--listen"])
        .arg(format!("unix:{}", dir.path().join("x.sock").display()))
        .arg("--control")
        .arg(dir.path().join("x.ctl"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("TLS"), "an untrusted server is refused: {err}");

    let s = Serve::start(tempfile::tempdir().unwrap(), &["--export", &backing(&pki.anonymous)]);
    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 + 3) as u8).collect();
    let mut c = nbd::Client::connect(&s.target(), "").unwrap();
    c.write(1 << 20, &data, false).unwrap();
    c.flush().unwrap();
    let mut back = vec![0u8; data.len()];
    c.read(1 << 20, &mut back).unwrap();
    assert!(back == data, "read back through arcache");
    drop(c);
    drop(s.stop());
    // What nbdkit itself holds, read over TLS by libnbd.
    need("nbdcopy");
    let copy = dir.path().join("origin-copy.img");
    run(Command::new("nbdcopy").arg(backing(&pki.anonymous)).arg(&copy));
    let origin = std::fs::read(&copy).unwrap();
    assert!(origin[1 << 20..2 << 20] == data[..], "the write reached the TLS-only origin");
}

#[test]
fn a_tls_client_that_vanishes_without_close_notify_ends_its_session() {
    let (s, pki, _) = start("required", |_| vec![]);
    let uri = nbd::NbdUri::parse(&tls_uri(&s, &pki.anonymous)).unwrap();
    let mut c = nbd::Client::connect_uri(&uri).expect("our own client speaks TLS to our server");
    let mut buf = vec![0u8; 4096];
    c.read(0, &mut buf).unwrap();
    // Dropped without NBD_CMD_DISC or a TLS close_notify: the server must
    // see the end of the stream and free the connection, not wait or spin.
    drop(c);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while s.stat()["nbd_active_connections"].as_u64() != Some(0) {
        assert!(std::time::Instant::now() < deadline, "the session never ended");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(s.stat()["nbd_tls_sessions"].as_u64(), Some(1));
}

// ------------------------------------------------------------ key types

/// A self-signed certificate for localhost with a key `openssl` makes from
/// `genpkey` arguments; returns (cert, key, a libnbd certificate dir).
fn openssl_pki(dir: &Path, name: &str, genpkey: &[&str]) -> (PathBuf, PathBuf, PathBuf) {
    need("openssl");
    let key = dir.join(format!("{name}-key.pem"));
    let cert = dir.join(format!("{name}-cert.pem"));
    run(Command::new("openssl").arg("genpkey").args(genpkey).arg("-out").arg(&key));
    run(Command::new("openssl")
        .args(["req", "-new", "-x509", "-days", "2", "-subj", "/CN=localhost"])
        .args(["-addext", "subjectAltName=DNS:localhost", "-key"])
        .arg(&key)
        .arg("-out")
        .arg(&cert));
    let certs = dir.join(format!("{name}-certs"));
    std::fs::create_dir_all(&certs).unwrap();
    std::fs::copy(&cert, certs.join("ca-cert.pem")).unwrap();
    (cert, key, certs)
}

/// Keys users have: RSA of any usual size (the reference NBD project's own
/// test CA makes 2432-bit ones, which the previous crypto provider refused),
/// ECDSA and Ed25519; each loads and carries a real client's session.
#[test]
fn server_keys_of_every_usual_kind_load() {
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("b.img");
    random_file(&backing, 1 << 20, 1);
    let kinds: [(&str, &[&str]); 7] = [
        ("rsa2048", &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048"]),
        ("rsa2432", &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2432"]),
        ("rsa3072", &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:3072"]),
        ("rsa4096", &["-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:4096"]),
        ("p256", &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"]),
        ("p384", &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-384"]),
        ("ed25519", &["-algorithm", "ED25519"]),
    ];
    for (name, genpkey) in kinds {
        let (cert, key, certs) = openssl_pki(dir.path(), name, genpkey);
        let sdir = tempfile::tempdir().unwrap();
        let args = ["--export", backing.to_str().unwrap(), "--tls", "required"];
        let tls = ["--tls-cert", cert.to_str().unwrap(), "--tls-key", key.to_str().unwrap()];
        let s = Serve::start(sdir, &[&args[..], &tls[..]].concat());
        let out = nbdinfo_size(&tls_uri(&s, &certs));
        assert!(
            out.status.success() && String::from_utf8_lossy(&out.stdout).trim() == "1048576",
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        s.stop();
    }
}

/// A key that is not a private key, or one that does not belong to the
/// certificate, is refused at start with the path and what is wrong.
#[test]
fn an_unusable_key_is_refused_with_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("b.img");
    random_file(&backing, 1 << 20, 1);
    let (cert, _, _) =
        openssl_pki(dir.path(), "a", &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"]);
    let (_, other_key, _) =
        openssl_pki(dir.path(), "b", &["-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256"]);
    let dsa = dir.path().join("dsa-key.pem");
    run(Command::new("openssl")
        .args(["genpkey", "-genparam", "-algorithm", "DSA", "-out"])
        .arg(dir.path().join("dsa.param")));
    run(Command::new("openssl")
        .args(["genpkey", "-paramfile"])
        .arg(dir.path().join("dsa.param"))
        .arg("-out")
        .arg(&dsa));
    for (key, expect) in [(&other_key, "does not match"), (&dsa, "DSA")] {
        let (b, c, k) = (backing.to_str().unwrap(), cert.to_str().unwrap(), key.to_str().unwrap());
        let err = serve_refused(dir.path(), &["--export", b, "--tls", "on", "--tls-cert", c, "--tls-key", k]);
        assert!(err.contains(k) && err.contains(expect), "{key:?}: {err}");
    }
}
