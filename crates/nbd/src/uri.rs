//! NBD URIs, as far as arcache needs them: `nbd://host[:port]/export`,
//! `nbd+unix:///export?socket=PATH`, and their TLS forms `nbds://` and
//! `nbds+unix://` with libnbd's `tls-certificates=DIR` and `tls-hostname=`.

use std::path::PathBuf;

pub const DEFAULT_PORT: u16 = 10809;

/// Where an NBD server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Tcp { host: String, port: u16 },
    Unix(PathBuf),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NbdUri {
    pub target: Target,
    pub export: String,
    /// `Some` for `nbds` URIs: the client must negotiate TLS.
    pub tls: Option<ClientTls>,
}

/// How a client checks the server (and proves itself) over TLS.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClientTls {
    /// A directory as libnbd reads it: `ca-cert.pem`, and for a client
    /// certificate `client-cert.pem` and `client-key.pem`.
    pub certificates: Option<PathBuf>,
    /// The name the server's certificate must carry; default the host
    /// (or `localhost` over a unix socket).
    pub hostname: Option<String>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("bad NBD URI {uri:?}: {why}")]
pub struct UriError {
    pub uri: String,
    pub why: &'static str,
}

/// Percent-decoding for the few escapes URIs of paths and names carry.
fn unescape(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

impl NbdUri {
    pub fn is_nbd_uri(s: &str) -> bool {
        ["nbd://", "nbd+unix://", "nbd+tcp://", "nbds://", "nbds+unix://", "nbds+tcp://"]
            .iter()
            .any(|p| s.starts_with(p))
    }

    pub fn parse(uri: &str) -> Result<NbdUri, UriError> {
        let err = |why| UriError { uri: uri.to_string(), why };
        let (scheme, rest) = uri.split_once("://").ok_or(err("missing scheme"))?;
        let (rest, query) = match rest.split_once('?') {
            Some((r, q)) => (r, Some(q)),
            None => (rest, None),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        let export = unescape(path).ok_or(err("bad escape in export name"))?;
        let param = |name: &str| -> Result<Option<String>, UriError> {
            let prefix = format!("{name}=");
            match query.into_iter().flat_map(|q| q.split('&')).find_map(|kv| kv.strip_prefix(prefix.as_str()))
            {
                Some(v) => unescape(v).map(Some).ok_or(err("bad escape in a query parameter")),
                None => Ok(None),
            }
        };
        let (base, tls) = match scheme {
            "nbds" | "nbds+tcp" | "nbds+unix" => {
                let tls = ClientTls {
                    certificates: param("tls-certificates")?.map(PathBuf::from),
                    hostname: param("tls-hostname")?,
                };
                (scheme.replacen("nbds", "nbd", 1), Some(tls))
            }
            other => (other.to_string(), None),
        };
        let target = match base.as_str() {
            "nbd" | "nbd+tcp" => {
                if authority.is_empty() {
                    return Err(err("missing host"));
                }
                let (host, port) = if let Some(h) = authority.strip_prefix('[') {
                    let (h, after) = h.split_once(']').ok_or(err("unclosed [ in host"))?;
                    (h.to_string(), after.strip_prefix(':'))
                } else {
                    match authority.rsplit_once(':') {
                        Some((h, p)) => (h.to_string(), Some(p)),
                        None => (authority.to_string(), None),
                    }
                };
                let port = match port {
                    Some(p) => p.parse().map_err(|_| err("bad port"))?,
                    None => DEFAULT_PORT,
                };
                Target::Tcp { host, port }
            }
            "nbd+unix" => {
                if !authority.is_empty() {
                    return Err(err("nbd+unix takes no host"));
                }
                let socket = param("socket")?.ok_or(err("nbd+unix needs ?socket=PATH"))?;
                Target::Unix(PathBuf::from(socket))
            }
            _ => return Err(err("unknown scheme")),
        };
        Ok(NbdUri { target, export, tls })
    }
}

impl std::fmt::Display for NbdUri {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = if self.tls.is_some() { "s" } else { "" };
        let mut query: Vec<String> = Vec::new();
        match &self.target {
            Target::Tcp { host, port } if host.contains(':') => {
                write!(f, "nbd{s}://[{host}]:{port}/{}", self.export)?
            }
            Target::Tcp { host, port } => write!(f, "nbd{s}://{host}:{port}/{}", self.export)?,
            Target::Unix(p) => {
                write!(f, "nbd{s}+unix:///{}", self.export)?;
                query.push(format!("socket={}", p.display()));
            }
        }
        if let Some(t) = &self.tls {
            query.extend(t.certificates.as_ref().map(|d| format!("tls-certificates={}", d.display())));
            query.extend(t.hostname.as_ref().map(|h| format!("tls-hostname={h}")));
        }
        if !query.is_empty() {
            write!(f, "?{}", query.join("&"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_forms_we_document() {
        let u = NbdUri::parse("nbd://nas.local/vol1").unwrap();
        assert_eq!(u.target, Target::Tcp { host: "nas.local".into(), port: 10809 });
        assert_eq!(u.export, "vol1");
        let u = NbdUri::parse("nbd://127.0.0.1:1234").unwrap();
        assert_eq!(u.target, Target::Tcp { host: "127.0.0.1".into(), port: 1234 });
        assert_eq!(u.export, "");
        let u = NbdUri::parse("nbd://[::1]:99/x%20y").unwrap();
        assert_eq!(u.target, Target::Tcp { host: "::1".into(), port: 99 });
        assert_eq!(u.export, "x y");
        let u = NbdUri::parse("nbd+unix:///disk?socket=/run/a.sock").unwrap();
        assert_eq!(u.target, Target::Unix("/run/a.sock".into()));
        assert_eq!(u.to_string(), "nbd+unix:///disk?socket=/run/a.sock");
    }

    #[test]
    fn rejects_what_it_cannot_serve() {
        assert!(NbdUri::parse("nbd+unix:///disk").is_err());
        assert!(NbdUri::parse("nbd://host:notaport/").is_err());
        assert!(NbdUri::parse("http://x/").is_err());
    }

    #[test]
    fn tls_forms() {
        let u = NbdUri::parse("nbds://nas:99/vol?tls-certificates=/etc/pki/x").unwrap();
        assert_eq!(u.target, Target::Tcp { host: "nas".into(), port: 99 });
        assert_eq!(u.tls.as_ref().unwrap().certificates, Some("/etc/pki/x".into()));
        assert_eq!(u.to_string(), "nbds://nas:99/vol?tls-certificates=/etc/pki/x");
        let u = NbdUri::parse("nbds+unix:///e?socket=/s&tls-hostname=h.example").unwrap();
        assert_eq!(u.target, Target::Unix("/s".into()));
        assert_eq!(u.tls.as_ref().unwrap().hostname.as_deref(), Some("h.example"));
        assert!(NbdUri::is_nbd_uri("nbds+unix:///e?socket=/s"));
        assert!(NbdUri::parse("nbd://h/").unwrap().tls.is_none());
        assert!(NbdUri::parse("nbds+unix:///e").is_err(), "a socket is still needed");
    }
}
