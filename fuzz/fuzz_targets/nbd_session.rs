//! A whole NBD session from arbitrary client bytes: handshake, options and
//! the request stream, against an in-memory export. The server must answer
//! or close, never panic or hang. The first byte picks the server: odd, one that
//! requires TLS, so the plaintext STARTTLS paths (refusals, the injection
//! guard, a handshake fed garbage) are fuzzed too.
#![no_main]

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::{Arc, Mutex, OnceLock};

use libfuzzer_sys::fuzz_target;
use nbd::conn::Conn;
use nbd::server::{Export, ExportInfo, ExportSet, NbdResult, Server, ServerConfig};
use nbd::TlsPolicy;

struct Mem(Mutex<Vec<u8>>);

impl Export for Mem {
    fn info(&self) -> ExportInfo {
        ExportInfo {
            size: 1 << 20,
            read_only: false,
            multi_conn: true,
            rotational: false,
            description: "fuzz".into(),
            min_block: 1,
            preferred_block: 4096,
        }
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> NbdResult {
        let m = self.0.lock().unwrap();
        buf.copy_from_slice(&m[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8], _fua: bool) -> NbdResult {
        self.0.lock().unwrap()[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn flush(&self) -> NbdResult {
        Ok(())
    }
    fn trim(&self, _o: u64, _l: u64, _f: bool) -> NbdResult {
        Ok(())
    }
    fn write_zeroes(&self, o: u64, l: u64, _f: bool) -> NbdResult {
        self.0.lock().unwrap()[o as usize..(o + l) as usize].fill(0);
        Ok(())
    }
    fn cache(&self, _o: u64, _l: u64) -> NbdResult {
        Ok(())
    }
}

struct Set(Arc<Mem>);

impl ExportSet for Set {
    fn list(&self) -> Vec<(String, String)> {
        vec![(String::new(), "fuzz".into())]
    }
    fn open(&self, name: &str) -> Option<Arc<dyn Export>> {
        name.is_empty().then(|| Arc::clone(&self.0) as Arc<dyn Export>)
    }
}

fn new_server(tls: Option<TlsPolicy>) -> Arc<Server> {
    let mem = Arc::new(Mem(Mutex::new(vec![0; 1 << 20])));
    let cfg = ServerConfig { workers: 2, max_request: 1 << 20, ..ServerConfig::default() };
    Server::with_tls(Arc::new(Set(mem)), cfg, tls)
}

fn server() -> &'static Arc<Server> {
    static S: OnceLock<Arc<Server>> = OnceLock::new();
    S.get_or_init(|| new_server(None))
}

/// A server that requires TLS, with a self-signed certificate made once.
fn tls_server() -> &'static Arc<Server> {
    static S: OnceLock<Arc<Server>> = OnceLock::new();
    S.get_or_init(|| {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert =
            rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap().self_signed(&key).unwrap();
        let dir = std::env::temp_dir().join(format!("arcache-fuzz-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (c, k) = (dir.join("cert.pem"), dir.join("key.pem"));
        std::fs::write(&c, cert.pem()).unwrap();
        std::fs::write(&k, key.serialize_pem()).unwrap();
        let config = nbd::tls::server_config(&c, &k, None).unwrap();
        // The config holds the key and certificate now: no files left behind.
        let _ = std::fs::remove_dir_all(&dir);
        new_server(Some(TlsPolicy { config, required: true }))
    })
}

fuzz_target!(|input: &[u8]| {
    let (mut client, theirs) = UnixStream::pair().unwrap();
    let Some((&pick, data)) = input.split_first() else { return };
    let srv = Arc::clone(if pick & 1 == 1 { tls_server() } else { server() });
    let t = std::thread::spawn(move || srv.handle(Conn::Unix(theirs)));
    let _ = client.set_read_timeout(Some(std::time::Duration::from_secs(5)));
    let _ = client.write_all(data);
    let _ = client.shutdown(std::net::Shutdown::Write);
    let mut sink = Vec::new();
    let _ = client.read_to_end(&mut sink);
    drop(client);
    t.join().unwrap();
});
