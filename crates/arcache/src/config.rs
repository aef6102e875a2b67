//! The settings of `arcache serve`: a TOML file, overridden by flags.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Deserialize;

use crate::size::parse_size;
use crate::tunables::{self, Tunables};

/// A size written as a number of bytes or a string with a suffix.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum SizeValue {
    Bytes(u64),
    Text(String),
}

impl SizeValue {
    pub fn bytes(&self) -> Result<u64> {
        match self {
            SizeValue::Bytes(b) => Ok(*b),
            SizeValue::Text(s) => parse_size(s),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportFile {
    #[serde(default)]
    pub name: String,
    pub backing: String,
    pub recordsize: Option<SizeValue>,
    pub read_only: Option<bool>,
    pub direct: Option<bool>,
    pub secondarycache: Option<String>,
    /// standard, always or disabled; default: the `sync` tunable.
    pub sync: Option<String>,
    /// An S3 export's own credentials, region, endpoint or profile
    /// (docs/s3-backing.md, "Credentials"); each one left out comes from
    /// the environment or the shared credentials file.
    pub s3_access_key_id: Option<String>,
    pub s3_secret_access_key: Option<String>,
    pub s3_session_token: Option<String>,
    pub s3_region: Option<String>,
    pub s3_endpoint: Option<String>,
    pub s3_profile: Option<String>,
    /// How long one S3 request is retried (5xx, throttling, resets) before
    /// that client request fails with EIO; 1 to 3600. The URI's
    /// `retry_timeout=` wins.
    pub s3_retry_timeout_secs: Option<u64>,
}

impl ExportFile {
    /// The export's own S3 settings.
    pub fn s3_settings(&self) -> anyhow::Result<arcache_s3::S3Settings> {
        let retry_timeout = match self.s3_retry_timeout_secs {
            None => None,
            Some(secs @ 1..=3600) => Some(std::time::Duration::from_secs(secs)),
            Some(other) => {
                anyhow::bail!("export {:?}: s3_retry_timeout_secs is 1 to 3600, not {other}", self.name)
            }
        };
        Ok(arcache_s3::S3Settings {
            retry_timeout,
            access_key_id: self.s3_access_key_id.clone(),
            secret_access_key: self.s3_secret_access_key.clone(),
            session_token: self.s3_session_token.clone(),
            region: self.s3_region.clone(),
            endpoint: self.s3_endpoint.clone(),
            profile: self.s3_profile.clone(),
        })
    }
}

/// The config file as written.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    pub arc_max: Option<SizeValue>,
    pub arc_min: Option<SizeValue>,
    pub recordsize: Option<SizeValue>,
    pub read_only: Option<bool>,
    pub direct: Option<bool>,
    #[serde(default)]
    pub listen: Vec<String>,
    pub control: Option<PathBuf>,
    /// Where the server keeps what must outlive it apart from its devices,
    /// as `--state-dir`.
    pub state_dir: Option<PathBuf>,
    pub workers: Option<usize>,
    /// The ARC's replacement policy, as `--policy`.
    pub policy: Option<String>,
    /// L2 devices, `PATH[:SIZE]` as with `--l2`.
    #[serde(default)]
    pub l2: Vec<String>,
    /// The intent log device, `PATH[:SIZE]` as with `--log`.
    pub log: Option<String>,
    /// `HOST:PORT` for Prometheus metrics, as with `--metrics`.
    pub metrics: Option<String>,
    /// `FILE[:MAXSIZE]`, as with `--record-trace`.
    pub record_trace: Option<String>,
    pub secondarycache: Option<String>,
    /// off, on or required, as with `--tls`.
    pub tls: Option<String>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    pub tls_client_ca: Option<PathBuf>,
    /// A group allowed to use the NBD unix sockets, as with `--socket-group`.
    pub socket_group: Option<String>,
    pub max_connections: Option<usize>,
    pub max_conn_memory: Option<SizeValue>,
    /// Seconds, as with `--reply-timeout` (0: no limit).
    pub reply_timeout: Option<u64>,
    /// Tunables by name, as with `--set`.
    #[serde(default)]
    pub set: BTreeMap<String, toml::Value>,
    #[serde(default)]
    pub export: Vec<ExportFile>,
}

impl ConfigFile {
    pub fn load(path: &Path) -> Result<ConfigFile> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading config {}", path.display()))?;
        ConfigFile::parse(&text).with_context(|| format!("parsing config {}", path.display()))
    }

    pub fn parse(text: &str) -> Result<ConfigFile> {
        Ok(toml::from_str(text)?)
    }
}

/// One export, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct ExportSpec {
    pub name: String,
    pub backing: String,
    pub recordsize: u64,
    pub read_only: bool,
    pub direct: bool,
    /// `secondarycache=all` (true) or `none`.
    pub secondarycache: bool,
    /// The export's own `sync` (0 standard, 1 always, 2 disabled), if set.
    pub sync: Option<u64>,
    /// An S3 export's own credentials and endpoint (config file only).
    pub s3: arcache_s3::S3Settings,
}

impl ExportSpec {
    /// `backing` served as `name` with every per-export setting at its
    /// default (what `--export NAME=BACKING` gives with no other flag).
    pub fn plain(name: String, backing: String) -> ExportSpec {
        ExportSpec {
            name,
            backing,
            recordsize: RECORDSIZE_DEFAULT,
            read_only: false,
            direct: false,
            secondarycache: true,
            sync: None,
            s3: Default::default(),
        }
    }
}

/// An L2 device to open (and create with `size` if it is missing).
#[derive(Debug, Clone, PartialEq)]
pub struct L2Spec {
    pub path: PathBuf,
    pub size: Option<u64>,
}

/// Where a server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    Unix(PathBuf),
    Tcp(String),
}

impl Listen {
    /// `unix:PATH` or `tcp:HOST:PORT`, `tcp:HOST`, `tcp::PORT`; TCP defaults
    /// to 127.0.0.1 and port 10809.
    pub fn parse(s: &str) -> Result<Listen> {
        if let Some(p) = s.strip_prefix("unix:") {
            if p.is_empty() {
                bail!("--listen unix: needs a path");
            }
            return Ok(Listen::Unix(PathBuf::from(p)));
        }
        let Some(rest) = s.strip_prefix("tcp:") else {
            bail!("bad --listen {s:?}: use unix:PATH or tcp:HOST:PORT");
        };
        let (host, port) = if let Some(h) = rest.strip_prefix('[') {
            let (h, after) = h.split_once(']').context("unclosed [ in --listen")?;
            (h.to_string(), after.strip_prefix(':').unwrap_or(""))
        } else {
            match rest.rsplit_once(':') {
                Some((h, p)) => (h.to_string(), p),
                None => (rest.to_string(), ""),
            }
        };
        let host = if host.is_empty() { "127.0.0.1".to_string() } else { host };
        let port: u16 = if port.is_empty() {
            nbd::uri::DEFAULT_PORT
        } else {
            port.parse().with_context(|| format!("bad port in --listen {s:?}"))?
        };
        let addr = if host.contains(':') { format!("[{host}]:{port}") } else { format!("{host}:{port}") };
        Ok(Listen::Tcp(addr))
    }
}

pub const RECORDSIZE_MIN: u64 = 4 << 10;
pub const RECORDSIZE_MAX: u64 = 1 << 20;
pub const RECORDSIZE_DEFAULT: u64 = 16 << 10;

pub fn check_recordsize(rs: u64) -> Result<u64> {
    if !(RECORDSIZE_MIN..=RECORDSIZE_MAX).contains(&rs) || !rs.is_power_of_two() {
        bail!("recordsize {rs} must be a power of two from 4K to 1M");
    }
    Ok(rs)
}

/// Everything `serve` needs, after the file and the flags are merged.
#[derive(Debug, Clone)]
pub struct ServeSettings {
    pub exports: Vec<ExportSpec>,
    pub listen: Vec<Listen>,
    pub control: PathBuf,
    /// Abandoned-log marks (docs/format.md): kept across reboots.
    pub state_dir: PathBuf,
    pub tunables: Tunables,
    pub workers: usize,
    /// The ARC's replacement policy (one of `arc_policy::SERVING_POLICIES`).
    pub policy: &'static str,
    pub l2: Vec<L2Spec>,
    /// The intent log device, `--log PATH[:SIZE]` (or an NBD URI).
    pub log: Option<L2Spec>,
    /// Where to serve Prometheus metrics.
    pub metrics: Option<String>,
    /// Where to record the requests served, and the size bound.
    pub record_trace: Option<String>,
    pub tls: Option<TlsSettings>,
    /// The group (id) given read-write access to the NBD unix sockets.
    pub socket_group: Option<libc::gid_t>,
    pub max_connections: usize,
    /// Payload bytes one NBD connection may hold at once.
    pub max_conn_bytes: u64,
    /// How long a client may leave a reply untaken (`None`: forever).
    pub reply_timeout: Option<std::time::Duration>,
    /// The file view's entry for the L2 export table (`arcache mount`).
    pub view: Option<arcache_l2::ExportDesc>,
}

/// NBD worker threads unless `--workers` says otherwise.
pub const DEFAULT_WORKERS: usize = 32;

impl ServeSettings {
    /// Settings for a server run inside another command (`arcache demo`,
    /// an embedder): its control socket and state in `dir`, no L2, no log,
    /// every bound at the binary's default.
    pub fn in_dir(
        exports: Vec<ExportSpec>,
        listen: Vec<Listen>,
        dir: &Path,
        tunables: Tunables,
    ) -> ServeSettings {
        let nbd = nbd::ServerConfig::default();
        ServeSettings {
            exports,
            listen,
            control: dir.join("control.sock"),
            state_dir: dir.join("state"),
            tunables,
            workers: DEFAULT_WORKERS,
            policy: arc_policy::SERVING_POLICIES[0],
            l2: Vec::new(),
            log: None,
            metrics: None,
            record_trace: None,
            tls: None,
            socket_group: None,
            max_connections: nbd.max_connections,
            max_conn_bytes: nbd.max_conn_bytes,
            reply_timeout: nbd.reply_timeout,
            view: None,
        }
    }

    /// `cfg` with these settings' bounds on connections and their memory.
    pub fn apply_limits(&self, cfg: nbd::ServerConfig) -> nbd::ServerConfig {
        nbd::ServerConfig {
            max_connections: self.max_connections,
            max_conn_bytes: self.max_conn_bytes,
            reply_timeout: self.reply_timeout,
            ..cfg
        }
    }
}

/// TLS for NBD clients, resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct TlsSettings {
    pub cert: PathBuf,
    pub key: PathBuf,
    /// When set, clients must present a certificate this CA signed.
    pub client_ca: Option<PathBuf>,
    pub required: bool,
}

/// The TLS mode, certificate, key and client CA as given; `None` when TLS
/// is off. Certificates alone turn it on; `on`/`required` need them.
pub fn resolve_tls(
    mode: Option<&str>,
    cert: Option<PathBuf>,
    key: Option<PathBuf>,
    client_ca: Option<PathBuf>,
) -> Result<Option<TlsSettings>> {
    let required = match mode {
        Some("off") => return Ok(None),
        Some("on") => false,
        Some("required" | "require") => true,
        Some(other) => bail!("bad --tls {other:?}: use off, on or required"),
        None if cert.is_none() && key.is_none() => return Ok(None),
        None => false,
    };
    match (cert, key) {
        (Some(cert), Some(key)) => Ok(Some(TlsSettings { cert, key, client_ca, required })),
        (None, _) => bail!("TLS needs a certificate: --tls-cert FILE (PEM, leaf first)"),
        (_, None) => bail!("TLS needs the certificate's private key: --tls-key FILE (PEM)"),
    }
}

/// Splits `--export [NAME=]BACKING`. A `=` inside an NBD URI's, an S3
/// URI's or an RBD spec's query is not a name separator.
pub fn split_export(s: &str) -> (String, String) {
    if nbd::NbdUri::is_nbd_uri(s)
        || arcache_s3::is_s3_uri(s)
        || arcache_rbd::is_rbd_uri(s)
        || s.starts_with('/')
        || s.starts_with('.')
    {
        return (String::new(), s.to_string());
    }
    match s.split_once('=') {
        Some((name, backing)) => (name.to_string(), backing.to_string()),
        None => (String::new(), s.to_string()),
    }
}

/// The directory for sockets when none is given.
pub fn runtime_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("arcache");
    }
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    if uid == 0 {
        PathBuf::from("/run/arcache")
    } else {
        std::env::temp_dir().join(format!("arcache-{uid}"))
    }
}

/// Where state that must survive a reboot is kept: systemd's
/// `$STATE_DIRECTORY` (a unit with `StateDirectory=`), else
/// `/var/lib/arcache` for root, else `$XDG_STATE_HOME/arcache` or
/// `~/.local/state/arcache`, else `/var/tmp/arcache-state-UID` (the runtime
/// directory is cleared at boot; /var/tmp is not).
pub fn default_state_dir() -> PathBuf {
    // SAFETY: geteuid cannot fail.
    let uid = unsafe { libc::geteuid() };
    state_dir_for(|name| std::env::var_os(name), uid)
}

/// The state directory `default_state_dir` picks, from the environment
/// `env` gives and the user id: systemd's first, root's fixed place, the
/// XDG one, the home directory's, and a last resort that needs none.
fn state_dir_for(env: impl Fn(&str) -> Option<std::ffi::OsString>, uid: u32) -> PathBuf {
    let var = |name: &str| env(name).filter(|d| !d.is_empty()).map(PathBuf::from);
    if let Some(d) = var("STATE_DIRECTORY") {
        // systemd lists several when the unit names several; the first is ours.
        return std::env::split_paths(&d).next().unwrap_or(d);
    }
    if uid == 0 {
        return PathBuf::from("/var/lib/arcache");
    }
    if let Some(d) = var("XDG_STATE_HOME") {
        return d.join("arcache");
    }
    match var("HOME") {
        Some(home) => home.join(".local/state/arcache"),
        None => PathBuf::from(format!("/var/tmp/arcache-state-{uid}")),
    }
}

pub fn default_control_path() -> PathBuf {
    runtime_dir().join("control.sock")
}

/// Applies `NAME=VALUE` tunables in order, each validated.
pub fn apply_sets(t: &mut Tunables, sets: &[(String, String)]) -> Result<()> {
    for (name, value) in sets {
        let v = tunables::parse_value(name, value)?;
        t.set(name, v).with_context(|| format!("setting {name}={value}"))?;
    }
    Ok(())
}

pub fn toml_value_text(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The state directory's order (docs/usage.md, `--state-dir`): a
    /// systemd unit's own first, then root's, XDG's, the home's, and one
    /// that needs no environment; empty variables count as unset.
    #[test]
    fn the_state_directory_is_chosen_in_its_documented_order() {
        let pick = |vars: &[(&str, &str)], uid| {
            let env =
                |name: &str| vars.iter().find(|(k, _)| *k == name).map(|(_, v)| std::ffi::OsString::from(v));
            state_dir_for(env, uid)
        };
        let all = [("STATE_DIRECTORY", "/s/one:/s/two"), ("XDG_STATE_HOME", "/x"), ("HOME", "/h")];
        assert_eq!(pick(&all, 1000), PathBuf::from("/s/one"));
        assert_eq!(pick(&all, 0), PathBuf::from("/s/one"));
        assert_eq!(pick(&all[1..], 0), PathBuf::from("/var/lib/arcache"));
        assert_eq!(pick(&all[1..], 1000), PathBuf::from("/x/arcache"));
        assert_eq!(
            pick(&[("STATE_DIRECTORY", ""), ("XDG_STATE_HOME", ""), ("HOME", "/h")], 1000),
            PathBuf::from("/h/.local/state/arcache")
        );
        assert_eq!(pick(&[], 1000), PathBuf::from("/var/tmp/arcache-state-1000"));
    }

    #[test]
    fn an_s3_exports_retry_timeout_comes_from_its_config_key() {
        let cfg = |v: &str| {
            ConfigFile::parse(&format!(
                "[[export]]\nname = \"d\"\nbacking = \"s3://b/p/?size=1G\"\ns3_retry_timeout_secs = {v}\n"
            ))
            .unwrap()
        };
        let s = cfg("7").export[0].s3_settings().unwrap();
        assert_eq!(s.retry_timeout, Some(std::time::Duration::from_secs(7)));
        assert!(cfg("0").export[0].s3_settings().is_err());
        assert!(cfg("3601").export[0].s3_settings().is_err());
        let none = ConfigFile::parse("[[export]]\nname = \"d\"\nbacking = \"s3://b/k\"\n").unwrap();
        assert_eq!(none.export[0].s3_settings().unwrap().retry_timeout, None);
    }

    #[test]
    fn listen_forms() {
        assert_eq!(Listen::parse("tcp:").unwrap(), Listen::Tcp("127.0.0.1:10809".into()));
        assert_eq!(Listen::parse("tcp::1234").unwrap(), Listen::Tcp("127.0.0.1:1234".into()));
        assert_eq!(Listen::parse("tcp:0.0.0.0:99").unwrap(), Listen::Tcp("0.0.0.0:99".into()));
        assert_eq!(Listen::parse("tcp:[::1]:5").unwrap(), Listen::Tcp("[::1]:5".into()));
        assert_eq!(Listen::parse("unix:/x").unwrap(), Listen::Unix("/x".into()));
        assert!(Listen::parse("udp:1").is_err());
    }

    #[test]
    fn tls_forms() {
        let p = |s: &str| Some(PathBuf::from(s));
        assert_eq!(resolve_tls(None, None, None, None).unwrap(), None);
        assert_eq!(resolve_tls(Some("off"), p("c"), p("k"), None).unwrap(), None);
        let on = resolve_tls(None, p("c"), p("k"), None).unwrap().unwrap();
        assert!(!on.required);
        assert!(resolve_tls(Some("required"), p("c"), p("k"), p("ca")).unwrap().unwrap().required);
        assert!(resolve_tls(Some("on"), None, p("k"), None).is_err());
        assert!(resolve_tls(Some("required"), p("c"), None, None).is_err());
        assert!(resolve_tls(Some("maybe"), p("c"), p("k"), None).is_err());
    }

    #[test]
    fn export_forms() {
        assert_eq!(split_export("/dev/sdb"), ("".into(), "/dev/sdb".into()));
        assert_eq!(split_export("vm=/img"), ("vm".into(), "/img".into()));
        assert_eq!(split_export("nbd+unix:///x?socket=/s"), ("".into(), "nbd+unix:///x?socket=/s".into()));
        assert_eq!(split_export("s3://b/d/?size=1G"), ("".into(), "s3://b/d/?size=1G".into()));
        assert_eq!(split_export("vm=s3://b/d/?size=1G"), ("vm".into(), "s3://b/d/?size=1G".into()));
        assert_eq!(split_export("nas=nbd://h/e"), ("nas".into(), "nbd://h/e".into()));
        assert_eq!(split_export("rbd:p/i?conf=/c&id=u"), ("".into(), "rbd:p/i?conf=/c&id=u".into()));
        assert_eq!(split_export("db=rbd:p/i@s?id=u"), ("db".into(), "rbd:p/i@s?id=u".into()));
    }

    #[test]
    fn config_file_parses() {
        let c: ConfigFile = toml::from_str(
            r#"
            arc_max = "2G"
            listen = ["tcp:127.0.0.1:10809"]
            [set]
            zfs_arc_min_prefetch_ms = 500
            [[export]]
            name = "vm"
            backing = "/img"
            recordsize = "64K"
            "#,
        )
        .unwrap();
        assert_eq!(c.arc_max.unwrap().bytes().unwrap(), 2 << 30);
        assert_eq!(c.export[0].recordsize.as_ref().unwrap().bytes().unwrap(), 64 << 10);
        assert!(toml::from_str::<ConfigFile>("bogus = 1").is_err());
    }
}
