//! TLS for the server side of NBD STARTTLS, on rustls.
//!
//! One rustls session serves two threads: the connection's reader and the
//! workers sending replies. The session sits behind a mutex that is never
//! held while waiting for the client to send: the reader takes raw bytes
//! from the socket unlocked and only then hands them to rustls.

use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig, ServerConnection};

use crate::conn::Conn;

/// How a server offers TLS.
#[derive(Clone)]
pub struct TlsPolicy {
    pub config: Arc<ServerConfig>,
    /// Refuse every option but STARTTLS (and ABORT) until TLS is up, so a
    /// man in the middle cannot strip it.
    pub required: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum TlsSetupError {
    #[error("reading {path}: {source}")]
    Pem { path: PathBuf, source: rustls::pki_types::pem::Error },
    #[error("{0} holds no certificate")]
    NoCertificate(PathBuf),
    #[error("an nbds URI needs tls-certificates=DIR (with ca-cert.pem); none was given and no libnbd default directory has one")]
    NoCertificateDir,
    #[error("CA certificate {path}: {source}")]
    Ca { path: PathBuf, source: rustls::Error },
    #[error("private key {path}: a {kind} key cannot be used ({reason}); usable keys are RSA (2048 to 8192 bits, any size between), ECDSA on P-256, P-384 or P-521, and Ed25519")]
    Key { path: PathBuf, kind: &'static str, reason: String },
    #[error("private key {key} does not match the certificate {cert} (the key of another certificate?)")]
    KeyMismatch { key: PathBuf, cert: PathBuf },
    #[error("client certificate verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
    #[error("certificate and key: {0}")]
    Rustls(#[from] rustls::Error),
}

/// Builds a server configuration from PEM files: the certificate chain
/// (leaf first), its private key and, when client certificates are
/// required, the CA that must have signed them.
pub fn server_config(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<Arc<ServerConfig>, TlsSetupError> {
    let chain = read_certs(cert)?;
    let key_path = key;
    let key = read_key(key)?;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    check_key(&provider, &key, key_path)?;
    let builder =
        ServerConfig::builder_with_provider(Arc::clone(&provider)).with_safe_default_protocol_versions()?;
    let builder = match client_ca {
        Some(ca) => {
            let verifier =
                WebPkiClientVerifier::builder_with_provider(Arc::new(read_roots(ca)?), provider).build()?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    builder.with_single_cert(chain, key).map(Arc::new).map_err(|e| match e {
        rustls::Error::InconsistentKeys(_) => {
            TlsSetupError::KeyMismatch { key: key_path.to_path_buf(), cert: cert.to_path_buf() }
        }
        other => other.into(),
    })
}

/// Loads the key with the provider first, so a key it cannot use is
/// reported with its path and kind rather than as a bare parse error.
fn check_key(
    provider: &rustls::crypto::CryptoProvider,
    key: &PrivateKeyDer<'static>,
    path: &Path,
) -> Result<(), TlsSetupError> {
    provider.key_provider.load_private_key(key.clone_key()).map(drop).map_err(|e| TlsSetupError::Key {
        path: path.to_path_buf(),
        kind: key_kind(key),
        reason: e.to_string(),
    })
}

/// The algorithm of a private key, from the object identifier near the
/// start of its DER encoding (enough to name it in an error).
fn key_kind(key: &PrivateKeyDer<'_>) -> &'static str {
    const KINDS: [(&[u8], &str); 6] = [
        (&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01], "RSA"),
        (&[0x2a, 0x86, 0x48, 0xce, 0x3d, 0x02, 0x01], "ECDSA"),
        (&[0x2a, 0x86, 0x48, 0xce, 0x38, 0x04, 0x01], "DSA"),
        (&[0x2b, 0x65, 0x70], "Ed25519"),
        (&[0x2b, 0x65, 0x71], "Ed448"),
        (&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x03, 0x01], "Diffie-Hellman"),
    ];
    let der = match key {
        PrivateKeyDer::Pkcs1(_) => return "RSA",
        PrivateKeyDer::Sec1(_) => return "ECDSA",
        other => other.secret_der(),
    };
    let head = &der[..der.len().min(48)];
    KINDS
        .iter()
        .find(|(oid, _)| head.windows(oid.len()).any(|w| w == *oid))
        .map_or("private", |(_, name)| name)
}

/// A client configuration from a libnbd-style certificate directory:
/// `ca-cert.pem` (the CA the server's certificate must chain to) and, when
/// both are there, `client-cert.pem` and `client-key.pem`. Without a
/// directory, libnbd's defaults: `/etc/pki/libnbd` for root, else
/// `$HOME/.pki/libnbd` or `$HOME/.config/pki/libnbd`.
pub fn client_config(tls: &crate::uri::ClientTls) -> Result<Arc<rustls::ClientConfig>, TlsSetupError> {
    let dir = match &tls.certificates {
        Some(d) => d.clone(),
        None => default_certificate_dir().ok_or(TlsSetupError::NoCertificateDir)?,
    };
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(read_roots(&dir.join("ca-cert.pem"))?);
    let (cert, key) = (dir.join("client-cert.pem"), dir.join("client-key.pem"));
    let config = if cert.exists() && key.exists() {
        builder.with_client_auth_cert(read_certs(&cert)?, read_key(&key)?)?
    } else {
        builder.with_no_client_auth()
    };
    Ok(Arc::new(config))
}

fn default_certificate_dir() -> Option<PathBuf> {
    // SAFETY: geteuid cannot fail.
    let candidates: Vec<PathBuf> = if unsafe { libc::geteuid() } == 0 {
        vec![PathBuf::from("/etc/pki/libnbd")]
    } else {
        let home = PathBuf::from(std::env::var_os("HOME")?);
        vec![home.join(".pki/libnbd"), home.join(".config/pki/libnbd")]
    };
    candidates.into_iter().find(|d| d.join("ca-cert.pem").exists())
}

/// The CA certificates in a PEM file, as trust roots.
fn read_roots(path: &Path) -> Result<RootCertStore, TlsSetupError> {
    let mut roots = RootCertStore::empty();
    for c in read_certs(path)? {
        roots.add(c).map_err(|source| TlsSetupError::Ca { path: path.to_path_buf(), source })?;
    }
    Ok(roots)
}

fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsSetupError> {
    PrivateKeyDer::from_pem_file(path)
        .map_err(|source| TlsSetupError::Pem { path: path.to_path_buf(), source })
}

fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsSetupError> {
    let pem_err = |source| TlsSetupError::Pem { path: path.to_path_buf(), source };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(pem_err)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(pem_err)?;
    if certs.is_empty() {
        return Err(TlsSetupError::NoCertificate(path.to_path_buf()));
    }
    Ok(certs)
}

struct Session {
    tls: Mutex<ServerConnection>,
    /// The socket's sending side; only used with `tls` locked.
    sock: Mutex<Conn>,
}

impl Session {
    /// Sends whatever rustls has queued. Called with the session locked so
    /// records leave in the order rustls sealed them.
    fn flush_records(&self, tls: &mut ServerConnection) -> io::Result<()> {
        let mut sock = self.sock.lock();
        while tls.wants_write() {
            // Interrupted: as in `write_all_vectored`, nothing was sent.
            if let Err(e) = tls.write_tls(&mut *sock) {
                if e.kind() != io::ErrorKind::Interrupted {
                    return Err(e);
                }
                crate::conn::SENDS_INTERRUPTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        }
        Ok(())
    }
}

/// The receiving half of a TLS connection.
pub struct TlsReader {
    session: Arc<Session>,
    sock: Conn,
    inbox: Inbox,
    /// The client closed its side; nothing more will come.
    eof: bool,
}

/// Bytes read from the socket, and the range rustls has not taken yet.
struct Inbox {
    raw: Box<[u8]>,
    pending: std::ops::Range<usize>,
}

/// The sending half of a TLS connection.
pub struct TlsWriter {
    session: Arc<Session>,
}

/// Runs the TLS handshake on `conn` (right after the STARTTLS reply) and
/// splits the result into a reader and a writer.
pub fn accept(conn: Conn, config: Arc<ServerConfig>) -> io::Result<(TlsReader, TlsWriter)> {
    let mut tls = ServerConnection::new(config).map_err(invalid)?;
    let mut sock = conn.try_clone()?;
    while tls.is_handshaking() {
        if let Err(e) = tls.complete_io(&mut sock) {
            // Let the client see the alert that explains the failure.
            let _ = tls.write_tls(&mut sock);
            return Err(e);
        }
    }
    while tls.wants_write() {
        tls.write_tls(&mut sock)?;
    }
    let session = Arc::new(Session { tls: Mutex::new(tls), sock: Mutex::new(sock) });
    let inbox = Inbox { raw: vec![0u8; 64 << 10].into(), pending: 0..0 };
    let reader = TlsReader { session: Arc::clone(&session), sock: conn, inbox, eof: false };
    Ok((reader, TlsWriter { session }))
}

impl Read for TlsReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        loop {
            {
                let mut tls = self.session.tls.lock();
                match tls.reader().read(out) {
                    Ok(n) => return Ok(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock && self.eof => {
                        return Err(io::ErrorKind::UnexpectedEof.into());
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
                if !self.inbox.pending.is_empty() {
                    self.inbox.feed(&self.session, &mut tls)?;
                    continue;
                }
            }
            // Wait for the client without holding the session.
            let n = self.sock.read(&mut self.inbox.raw)?;
            self.inbox.pending = 0..n;
            let mut tls = self.session.tls.lock();
            if n == 0 {
                // End of stream: rustls decides whether it was a clean close.
                tls.read_tls(&mut io::empty())?;
                tls.process_new_packets().map_err(invalid)?;
                self.eof = true;
                continue;
            }
            self.inbox.feed(&self.session, &mut tls)?;
        }
    }
}

impl TlsReader {
    pub fn socket(&self) -> &Conn {
        &self.sock
    }
}

impl Inbox {
    fn feed(&mut self, session: &Session, tls: &mut ServerConnection) -> io::Result<()> {
        let mut slice = &self.raw[self.pending.clone()];
        let before = slice.len();
        tls.read_tls(&mut slice)?;
        self.pending.start += before - slice.len();
        let processed = tls.process_new_packets();
        // Alerts, key updates and the like must reach the client either way.
        let sent = session.flush_records(tls);
        processed.map_err(invalid)?;
        sent
    }
}

impl TlsWriter {
    /// Seals `parts` into records and sends them, all or nothing.
    pub fn send(&self, parts: &[&[u8]]) -> io::Result<()> {
        let mut tls = self.session.tls.lock();
        for part in parts {
            let mut rest: &[u8] = part;
            while !rest.is_empty() {
                let n = tls.writer().write(rest)?;
                rest = &rest[n..];
                if n == 0 || !rest.is_empty() {
                    // rustls's buffer is full: make room by sending.
                    self.session.flush_records(&mut tls)?;
                }
            }
        }
        self.session.flush_records(&mut tls)
    }

    /// Tells the client the session ends, then closes the socket.
    pub fn close(&self) {
        let mut tls = self.session.tls.lock();
        tls.send_close_notify();
        let _ = self.session.flush_records(&mut tls);
        self.session.sock.lock().shutdown();
    }

    pub fn shutdown(&self) {
        self.session.sock.lock().shutdown();
    }
}

fn invalid(e: rustls::Error) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}
