//! `arcache serve`: exports behind one shared ARC, served over NBD.

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use arcache_engine::{
    Cache, CacheConfig, Feed, FeedStats, FeedTunables, SyncMode, Volume, VolumeConfig, WriteBack,
    WriteTunables, ZfetchTunables, MAX_EXPORTS,
};
use arcache_l2::{ExportDesc, L2Arc, L2Device, PersistOptions};
use arcache_remote::NbdDev;
use blockdev::{BlockDev, DevLock, FileDev, FileDevOptions};
use clap::Args;
use nbd::{Listeners, NbdUri, Server, ServerConfig, TlsPolicy};
use parking_lot::Mutex;
use serde_json::{json, Value};
use tracing::{info, warn};
use zil::{IntentLog, LogExport};

use crate::advice;
use crate::config::{
    apply_sets, check_recordsize, default_control_path, default_state_dir, runtime_dir, split_export,
    toml_value_text, ConfigFile, ExportSpec, L2Spec, Listen, ServeSettings, RECORDSIZE_DEFAULT,
};
use crate::contents::{contents_of, Follower};
use crate::control::{self, Request};
use crate::exports::{ExportTable, NbdExport};
use crate::metrics;
use crate::recorder::{self, Recorder};
use crate::size::parse_size;
use crate::startup;
use crate::tunables::{self, Tunables};

#[derive(Debug, Args, Default, Clone)]
pub struct ServeArgs {
    /// An export: [NAME=]BACKING, where BACKING is a file, a block device or
    /// an NBD URI (nbd://host[:port]/name, nbd+unix:///name?socket=PATH, or
    /// nbds://... and nbds+unix://... with tls-certificates=DIR for TLS), or
    /// s3://BUCKET/KEY (one S3 object, served read-only), or
    /// s3://BUCKET/PREFIX/?size=SIZE[&chunk=SIZE] (a writable disk of chunk
    /// objects, 4M each unless chunk= says so when the disk is made, one
    /// writer at a time); credentials, region and endpoint as the AWS tools
    /// take them: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_REGION,
    /// AWS_ENDPOINT_URL, AWS_PROFILE; or rbd:POOL/IMAGE[@SNAP][?conf=PATH&id=USER]
    /// (a Ceph RBD image through librbd, in builds with the rbd feature;
    /// written by one server at a time, which holds its exclusive lock; a
    /// snapshot is served read-only; conf defaults to what librados finds,
    /// CEPH_CONF or /etc/ceph/ceph.conf, and id to admin).
    /// Repeatable; no NAME means the default export "".
    #[arg(long = "export", value_name = "[NAME=]BACKING")]
    pub exports: Vec<String>,
    /// Where to listen: unix:PATH or tcp:HOST:PORT (repeatable). TCP defaults
    /// to 127.0.0.1 and port 10809. Default: a unix socket in the runtime dir.
    #[arg(long = "listen", value_name = "ADDR")]
    pub listen: Vec<String>,
    /// Largest ARC size in RAM (K/M/G suffixes); the zfs_arc_max tunable.
    #[arg(long, value_name = "SIZE")]
    pub arc_max: Option<String>,
    /// Smallest ARC target (K/M/G suffixes); the zfs_arc_min tunable.
    #[arg(long, value_name = "SIZE")]
    pub arc_min: Option<String>,
    /// Cache block size of each export, 4K..1M (default 16K), like a zvol's volblocksize.
    #[arg(long, value_name = "SIZE")]
    pub recordsize: Option<String>,
    /// Serve every export read-only.
    #[arg(long)]
    pub read_only: bool,
    /// Open file and block-device backings with O_DIRECT (aligned IO bypasses the page cache).
    #[arg(long)]
    pub direct: bool,
    /// A TOML file with the same settings; flags override it.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Set a tunable at start, by its ZFS name where ZFS has one (repeatable).
    #[arg(long = "set", value_name = "NAME=VALUE")]
    pub sets: Vec<String>,
    /// The control socket for `arcache stat/get/set` (mode 0600).
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
    /// Where state that must outlive the server apart from its devices is
    /// kept (marks of L2 logs never to be restored): $STATE_DIRECTORY (systemd),
    /// else /var/lib/arcache for root, else $XDG_STATE_HOME/arcache or
    /// ~/.local/state/arcache, else /var/tmp/arcache-state-UID.
    #[arg(long, value_name = "DIR")]
    pub state_dir: Option<PathBuf>,
    /// Worker threads for requests that must wait for the backing store.
    #[arg(long, value_name = "N")]
    pub workers: Option<usize>,
    /// The ARC's replacement policy, a name `arcache sim --policy` takes
    /// that runs on bytes: arc-adaptive (the default: an ARC whose lists
    /// decide like S3-FIFO), arc (OpenZFS's) or lru.
    #[arg(long, value_name = "NAME")]
    pub policy: Option<String>,
    /// An L2ARC cache device: a file (created with SIZE if missing) or a
    /// block device, opened with O_DIRECT. Repeatable.
    #[arg(long = "l2", value_name = "PATH[:SIZE]")]
    pub l2: Vec<String>,
    /// Whether records of every export may go to L2: all or none (default all).
    #[arg(long, value_name = "all|none")]
    pub secondarycache: Option<String>,
    /// The intent log (like a ZFS SLOG): a file (created with SIZE if
    /// missing), a block device or an NBD URI on fast storage. Sync writes
    /// and FLUSHes are made durable there; without it they sync a
    /// transaction group to the backing store.
    #[arg(long = "log", value_name = "PATH[:SIZE]")]
    pub log: Option<String>,
    /// Serve Prometheus metrics at http://HOST:PORT/metrics (give a
    /// loopback address unless the network is trusted).
    #[arg(long, value_name = "HOST:PORT")]
    pub metrics: Option<String>,
    /// Record every read and write served to FILE (the CSV form `arcache
    /// sim --trace` reads), stopping at MAXSIZE bytes (default 1G).
    #[arg(long, value_name = "FILE[:MAXSIZE]")]
    pub record_trace: Option<String>,
    /// NBD STARTTLS: off, on (clients choose) or required (every option
    /// but STARTTLS is refused until TLS is up). Default: on when
    /// --tls-cert is given, else off.
    #[arg(long, value_name = "off|on|required")]
    pub tls: Option<String>,
    /// The server's certificate chain, PEM, leaf first.
    #[arg(long, value_name = "FILE")]
    pub tls_cert: Option<PathBuf>,
    /// The certificate's private key, PEM (PKCS#8, PKCS#1 or SEC1).
    #[arg(long, value_name = "FILE")]
    pub tls_key: Option<PathBuf>,
    /// Require client certificates signed by this CA (PEM).
    #[arg(long, value_name = "FILE")]
    pub tls_client_ca: Option<PathBuf>,
    /// Let this group use the NBD unix sockets (mode 0660); by default only
    /// the server's user may (0600).
    #[arg(long, value_name = "GROUP")]
    pub socket_group: Option<String>,
    /// NBD connections served at once (default 128); more are closed.
    #[arg(long, value_name = "N")]
    pub max_connections: Option<usize>,
    /// Request and reply payload bytes one connection may hold at once
    /// (default 64M, at least 64M, the largest request): the bound on what one client can make
    /// the server allocate.
    #[arg(long, value_name = "SIZE")]
    pub max_conn_memory: Option<String>,
    /// Seconds a client may leave a reply untaken before its connection is
    /// closed (default 60; 0: no limit), so a client that stops reading
    /// cannot stall the threads that answer every client.
    #[arg(long, value_name = "SECS")]
    pub reply_timeout: Option<u64>,
}

/// `PATH[:SIZE]` of an L2 device.
pub fn parse_l2(s: &str) -> Result<L2Spec> {
    if let Some((p, size)) = s.rsplit_once(':') {
        if let Ok(bytes) = parse_size(size) {
            return Ok(L2Spec { path: PathBuf::from(p), size: Some(bytes) });
        }
    }
    Ok(L2Spec { path: PathBuf::from(s), size: None })
}

fn parse_secondarycache(s: &str) -> Result<bool> {
    match s {
        "all" => Ok(true),
        "none" => Ok(false),
        "metadata" => bail!("secondarycache=metadata: block exports have no metadata; use all or none"),
        other => bail!("bad secondarycache {other:?}: use all or none"),
    }
}

fn parse_sync(s: &str) -> Result<u64> {
    tunables::parse_value("sync", s).with_context(|| format!("bad sync {s:?}"))
}

fn split_set(s: &str) -> Result<(String, String)> {
    match s.split_once('=') {
        Some((n, v)) if !n.trim().is_empty() => Ok((n.trim().to_string(), v.trim().to_string())),
        _ => bail!("bad --set {s:?}: expected NAME=VALUE"),
    }
}

/// Merges defaults, the config file and the flags, in that order.
pub fn resolve(args: &ServeArgs) -> Result<ServeSettings> {
    let file = match &args.config {
        Some(p) => ConfigFile::load(p)?,
        None => ConfigFile::default(),
    };
    resolve_with(args, file)
}

/// [`resolve`] with the config file already read: checks every value in
/// it and in `args` without opening any device or socket.
pub fn resolve_with(args: &ServeArgs, file: ConfigFile) -> Result<ServeSettings> {
    resolve_settings(args, file, true)
}

/// [`resolve`] for `arcache mount`, where exports are optional: without
/// any, no NBD socket is bound unless `--listen` asks for one.
pub fn resolve_for_view(args: &ServeArgs) -> Result<ServeSettings> {
    let file = match &args.config {
        Some(p) => ConfigFile::load(p)?,
        None => ConfigFile::default(),
    };
    resolve_settings(args, file, false)
}

fn resolve_settings(args: &ServeArgs, file: ConfigFile, need_exports: bool) -> Result<ServeSettings> {
    let mut t = Tunables::defaults();
    let mut sets: Vec<(String, String)> = Vec::new();
    if let Some(v) = &file.arc_max {
        sets.push(("zfs_arc_max".into(), v.bytes()?.to_string()));
    }
    if let Some(v) = &file.arc_min {
        sets.push(("zfs_arc_min".into(), v.bytes()?.to_string()));
    }
    sets.extend(file.set.iter().map(|(k, v)| (k.clone(), toml_value_text(v))));
    if let Some(v) = &args.arc_max {
        sets.push(("zfs_arc_max".into(), parse_size(v)?.to_string()));
    }
    if let Some(v) = &args.arc_min {
        sets.push(("zfs_arc_min".into(), parse_size(v)?.to_string()));
    }
    for s in &args.sets {
        sets.push(split_set(s)?);
    }
    let mut given_min = None;
    for (name, value) in &sets {
        if name == "zfs_arc_min" {
            given_min = Some(tunables::parse_value(name, value)?);
        }
    }
    apply_sets(&mut t, &sets)?;
    // A lower arc_max pulls the default arc_min down; one the user chose is kept or refused.
    if let Some(min) = given_min.filter(|&m| m != t.value("zfs_arc_min")) {
        bail!("zfs_arc_min ({min}) exceeds zfs_arc_max ({})", t.value("zfs_arc_max"));
    }

    let default_rs = match (&args.recordsize, &file.recordsize) {
        (Some(s), _) => parse_size(s)?,
        (None, Some(v)) => v.bytes()?,
        (None, None) => RECORDSIZE_DEFAULT,
    };
    check_recordsize(default_rs)?;
    let all_ro = args.read_only || file.read_only.unwrap_or(false);
    // The view takes `metadata` too (mount.rs); exports beside it then
    // keep all.
    let all_secondary = match (&args.secondarycache, &file.secondarycache) {
        (Some(v), _) | (None, Some(v)) if need_exports || v != "metadata" => parse_secondarycache(v)?,
        _ => true,
    };
    let direct = args.direct || file.direct.unwrap_or(false);
    let mut exports: BTreeMap<String, ExportSpec> = BTreeMap::new();
    for e in &file.export {
        let rs = match &e.recordsize {
            Some(v) => check_recordsize(v.bytes()?)?,
            None => default_rs,
        };
        let spec = ExportSpec {
            name: e.name.clone(),
            backing: e.backing.clone(),
            recordsize: rs,
            read_only: all_ro || e.read_only.unwrap_or(false),
            direct: e.direct.unwrap_or(direct),
            secondarycache: match &e.secondarycache {
                Some(v) => parse_secondarycache(v)?,
                None => all_secondary,
            },
            sync: e.sync.as_deref().map(parse_sync).transpose()?,
            s3: e.s3_settings()?,
        };
        if exports.insert(e.name.clone(), spec).is_some() {
            bail!("export {:?} is defined twice in the config file", e.name);
        }
    }
    let mut from_flags = BTreeMap::new();
    for s in &args.exports {
        let (name, backing) = split_export(s);
        if backing.is_empty() {
            bail!("--export {s:?} has no backing store");
        }
        let spec = ExportSpec {
            recordsize: default_rs,
            read_only: all_ro,
            direct,
            secondarycache: all_secondary,
            ..ExportSpec::plain(name.clone(), backing)
        };
        if from_flags.insert(name.clone(), spec).is_some() {
            bail!("export {name:?} is given twice");
        }
    }
    exports.extend(from_flags);
    // `--set sync=...` at start applies to every export, over the config file.
    if args.sets.iter().any(|s| split_set(s).is_ok_and(|(n, _)| n == "sync")) {
        for e in exports.values_mut() {
            e.sync = None;
        }
    }
    if exports.is_empty() && need_exports {
        bail!(
            "nothing to serve: give at least one --export [NAME=]BACKING (or [[export]] in the config file)"
        );
    }
    let socket_group = args
        .socket_group
        .as_ref()
        .or(file.socket_group.as_ref())
        .map(|g| control::group_id(g))
        .transpose()?;
    let nbd_defaults = ServerConfig::default();
    let listen_src = if args.listen.is_empty() { &file.listen } else { &args.listen };
    let mut listen = listen_src.iter().map(|s| Listen::parse(s)).collect::<Result<Vec<_>>>()?;
    if listen.is_empty() && !exports.is_empty() {
        listen.push(Listen::Unix(runtime_dir().join("nbd.sock")));
    }
    Ok(ServeSettings {
        exports: exports.into_values().collect(),
        listen,
        control: args.control.clone().or(file.control).unwrap_or_else(default_control_path),
        state_dir: args.state_dir.clone().or(file.state_dir).unwrap_or_else(default_state_dir),
        tunables: t,
        workers: args.workers.or(file.workers).unwrap_or(crate::config::DEFAULT_WORKERS),
        policy: serving_policy(args.policy.as_deref().or(file.policy.as_deref()))?,
        l2: args.l2.iter().chain(file.l2.iter()).map(|s| parse_l2(s)).collect::<Result<Vec<_>>>()?,
        log: args.log.as_ref().or(file.log.as_ref()).map(|s| parse_l2(s)).transpose()?,
        metrics: args.metrics.clone().or(file.metrics),
        record_trace: args.record_trace.clone().or(file.record_trace),
        tls: crate::config::resolve_tls(
            args.tls.as_deref().or(file.tls.as_deref()),
            args.tls_cert.clone().or(file.tls_cert),
            args.tls_key.clone().or(file.tls_key),
            args.tls_client_ca.clone().or(file.tls_client_ca),
        )?,
        socket_group,
        max_connections: args
            .max_connections
            .or(file.max_connections)
            .unwrap_or(nbd_defaults.max_connections)
            .max(1),
        max_conn_bytes: match args.max_conn_memory.as_deref() {
            Some(s) => parse_size(s)?,
            None => file
                .max_conn_memory
                .as_ref()
                .map(|v| v.bytes())
                .transpose()?
                .unwrap_or(nbd_defaults.max_conn_bytes),
        },
        reply_timeout: match args.reply_timeout.or(file.reply_timeout) {
            Some(0) => None,
            Some(secs) => Some(std::time::Duration::from_secs(secs)),
            None => nbd_defaults.reply_timeout,
        },
        view: None,
    })
}

/// Whether `e` comes from a full filesystem or an exhausted quota.
fn is_disk_full(e: &anyhow::Error) -> bool {
    e.chain()
        .filter_map(|c| c.downcast_ref::<std::io::Error>())
        .any(|io| matches!(io.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT)))
}

fn tls_policy(settings: &ServeSettings) -> Result<Option<TlsPolicy>> {
    let Some(t) = &settings.tls else { return Ok(None) };
    let config =
        nbd::tls::server_config(&t.cert, &t.key, t.client_ca.as_deref()).context("setting up TLS")?;
    info!(
        "TLS {} for NBD clients{}",
        if t.required { "required" } else { "offered" },
        if t.client_ca.is_some() { ", client certificates verified" } else { "" }
    );
    Ok(Some(TlsPolicy { config, required: t.required }))
}

/// Binds every listener, adding each unix socket's path to `sockets` once
/// bound (to remove at exit, a failed start's included); returns the URIs
/// clients can use.
fn listen_all(
    settings: &ServeSettings,
    server: &Arc<Server>,
    volumes: &[Arc<Volume>],
    sockets: &mut Vec<PathBuf>,
) -> Result<Vec<String>> {
    let mut targets = Vec::new();
    for l in &settings.listen {
        match l {
            Listen::Unix(p) => {
                let listener = control::bind_private(p)?;
                sockets.push(p.clone());
                if let Some(gid) = settings.socket_group {
                    control::share_with_group(p, gid)?;
                }
                server.listen_unix(listener);
                targets.push(nbd::Target::Unix(p.clone()));
            }
            Listen::Tcp(addr) => {
                let listener = TcpListener::bind(addr).with_context(|| format!("binding tcp {addr}"))?;
                let local = listener.local_addr()?;
                let tls_required = settings.tls.as_ref().is_some_and(|t| t.required);
                if !local.ip().is_loopback() && !tls_required {
                    warn!(
                        "listening on {local}, reachable from other hosts without TLS (see --tls required)"
                    );
                }
                server.listen_tcp(listener);
                targets.push(nbd::Target::Tcp { host: local.ip().to_string(), port: local.port() });
            }
        }
    }
    let mut uris = Vec::new();
    for target in targets {
        for v in volumes {
            // With TLS configured, point clients at the encrypted form.
            let tls = settings.tls.as_ref().map(|_| nbd::uri::ClientTls::default());
            uris.push(NbdUri { target: target.clone(), export: v.name().to_string(), tls }.to_string());
        }
    }
    Ok(uris)
}

/// The NBD export `text` names, if it is an NBD URI; `what` for errors.
/// The serving policy a name picks (default: the first of
/// `arc_policy::SERVING_POLICIES`); an error names the ones there are.
fn serving_policy(name: Option<&str>) -> Result<&'static str> {
    let Some(name) = name else { return Ok(arc_policy::SERVING_POLICIES[0]) };
    if let Some(&p) = arc_policy::SERVING_POLICIES.iter().find(|&&p| p == name) {
        return Ok(p);
    }
    let why = if arc_policy::POLICY_NAMES.contains(&name) {
        " (it counts entries, not bytes: the simulator runs it, a server cannot)"
    } else {
        ""
    };
    bail!(
        "--policy {name}: not a serving policy{why}; choose one of {}",
        arc_policy::SERVING_POLICIES.join(", ")
    )
}

fn connect_nbd(text: &str, what: &str, t: &Tunables) -> Result<Option<Arc<dyn BlockDev>>> {
    if !NbdUri::is_nbd_uri(text) {
        return Ok(None);
    }
    let uri = NbdUri::parse(text)?;
    let limit = match t.value("nbd_connect_timeout") {
        0 => None,
        secs => Some(Duration::from_secs(secs)),
    };
    let dev = NbdDev::connect_within(uri, limit)
        .with_context(|| format!("connecting to {what} {text} (nbd_connect_timeout {limit:?})"))?;
    Ok(Some(Arc::new(dev)))
}

fn open_backing(spec: &ExportSpec, t: &Tunables) -> Result<Arc<dyn BlockDev>> {
    if let Some(dev) = connect_nbd(&spec.backing, "backing", t)? {
        return Ok(dev);
    }
    if arcache_s3::is_s3_uri(&spec.backing) {
        return open_s3(&spec.backing, &spec.s3, spec.read_only, spec.recordsize);
    }
    if arcache_rbd::is_rbd_uri(&spec.backing) {
        return open_rbd(&spec.backing, spec.read_only, t);
    }
    let path = PathBuf::from(&spec.backing);
    if !path.exists() {
        bail!("backing store {} does not exist", path.display());
    }
    // Two caches over one writable store each hold writes the other never
    // sees; a read-only export only needs the store not to change under it.
    let lock = if spec.read_only { DevLock::Shared } else { DevLock::Exclusive };
    let opts = FileDevOptions {
        direct: spec.direct,
        read_only: spec.read_only,
        create_size: None,
        lock,
        ..Default::default()
    };
    let dev = FileDev::open(&path, opts).with_context(|| format!("opening backing {}", path.display()))?;
    if dev.size() == 0 {
        bail!("backing store {} is empty (size 0)", path.display());
    }
    Ok(Arc::new(dev))
}

fn open_s3(
    text: &str,
    settings: &arcache_s3::S3Settings,
    read_only: bool,
    recordsize: u64,
) -> Result<Arc<dyn BlockDev>> {
    let mut location = arcache_s3::S3Location::parse(text)?;
    location.retry_timeout = location.retry_timeout.or(settings.retry_timeout);
    let creds = settings.resolve().map_err(|e| anyhow!("{text}: {e}"))?;
    if location.is_prefix() {
        let size = location.size.as_deref().map(crate::size::parse_size).transpose()?;
        let chunk = location.chunk.as_deref().map(crate::size::parse_size).transpose()?;
        // Checked before the disk is opened (and its lease taken): a
        // record spread over two chunks would make each write of it two
        // read-modify-writes.
        if let Some(c) = chunk.filter(|&c| c < recordsize) {
            bail!("{text}: chunk={c} is smaller than the export's recordsize {recordsize}");
        }
        let dev = arcache_s3::S3ChunkDev::open(&location, &creds, size, chunk, !read_only)
            .map_err(|e| anyhow!("opening backing {e}"))?;
        info!(
            "backing {text}: a chunked disk of {} bytes in chunks of {} (credentials from {})",
            dev.size(),
            dev.write_unit().unwrap_or(0),
            creds.source
        );
        return Ok(Arc::new(dev));
    }
    let dev = arcache_s3::S3ObjectDev::open(&location, &creds).map_err(|e| anyhow!("opening backing {e}"))?;
    info!("backing {text}: {} bytes, ETag {} (credentials from {})", dev.size(), dev.etag(), creds.source);
    Ok(Arc::new(dev))
}

/// A Ceph RBD image (writable with its exclusive lock held, or read-only:
/// a snapshot, or `--read-only`).
#[cfg(feature = "rbd")]
fn open_rbd(text: &str, read_only: bool, t: &Tunables) -> Result<Arc<dyn BlockDev>> {
    let connect_timeout = match t.value("nbd_connect_timeout") {
        0 => None,
        secs => Some(Duration::from_secs(secs)),
    };
    let opts = arcache_rbd::RbdOptions { read_only, connect_timeout };
    let dev = arcache_rbd::RbdDev::open_spec(text, opts).map_err(|e| anyhow!("opening backing {e}"))?;
    Ok(Arc::new(dev))
}

#[cfg(not(feature = "rbd"))]
fn open_rbd(text: &str, _read_only: bool, _t: &Tunables) -> Result<Arc<dyn BlockDev>> {
    // The spec is checked all the same, so a typo is reported as one.
    arcache_rbd::RbdSpec::parse(text)?;
    bail!(
        "{text}: this arcache was built without RBD support (build it with `--features rbd`, \
         which needs librbd-dev and librados-dev)"
    )
}

/// Opens the intent log device: an NBD URI, or a file (created with its
/// size if missing) or block device.
fn open_log_dev(spec: &L2Spec, t: &Tunables) -> Result<Arc<dyn BlockDev>> {
    let text = spec.path.display().to_string();
    if let Some(dev) = connect_nbd(&text, "log", t)? {
        return Ok(dev);
    }
    let p = &spec.path;
    if !p.exists() && spec.size.is_none() {
        bail!("log device {text} does not exist; give its size to create it: --log {text}:SIZE");
    }
    let fresh = !p.exists();
    let opts = FileDevOptions {
        direct: true,
        read_only: false,
        create_size: spec.size,
        sync_writes: true,
        lock: DevLock::Exclusive,
    };
    let dev = FileDev::open(p, opts).with_context(|| format!("opening log device {text}"))?;
    if fresh {
        // A sparse file makes every commit allocate blocks, and each flush
        // then commits filesystem metadata too: measured 1.5x slower.
        info!("intent log {text}: writing it once so commits never allocate ({} bytes)", dev.size());
        let zeroes = vec![0u8; 8 << 20];
        let mut at = 0;
        while at < dev.size() {
            let n = (dev.size() - at).min(zeroes.len() as u64) as usize;
            dev.write_at(&zeroes[..n], at).with_context(|| format!("preparing log device {text}"))?;
            at += n as u64;
        }
        dev.flush().with_context(|| format!("preparing log device {text}"))?;
    }
    Ok(Arc::new(dev))
}

/// The exports as the intent log names them: by their stores' identity,
/// which (unlike the contents the L2 binds its records to) does not change
/// with what the store holds: a log is replayed on the disk its txgs
/// changed.
fn log_exports(descs: &[ExportDesc]) -> Vec<LogExport> {
    descs
        .iter()
        .map(|d| LogExport { id: d.id, name: d.name.clone(), identity: d.identity, size: d.size })
        .collect()
}

fn write_tunables(t: &Tunables, w: &WriteTunables) {
    let cells = [
        (&w.txg_timeout_secs, "zfs_txg_timeout"),
        (&w.dirty_data_max, "zfs_dirty_data_max"),
        (&w.dirty_data_sync_percent, "zfs_dirty_data_sync_percent"),
        (&w.delay_min_dirty_percent, "zfs_delay_min_dirty_percent"),
        (&w.delay_scale_ns, "zfs_delay_scale"),
        (&w.sync_writers, "zfs_vdev_async_write_max_active"),
        (&w.log_writes_in_flight, "zfs_vdev_sync_write_max_active"),
    ];
    for (cell, name) in cells {
        cell.store(t.value(name), Ordering::Relaxed);
    }
}

/// Replay makes an unclosed log safe; the line says why there is something
/// to replay (a crash, a kill, or a server on another host that has it).
fn warn_if_not_closed(dev: &dyn BlockDev) {
    if let Ok(Some(h)) = zil::read_header(dev) {
        if h.owner.state == blockdev::owner::OwnerState::InUse {
            warn!(
                "intent log {} was not closed cleanly (last opened by host {} pid {})",
                dev.describe(),
                h.owner.host,
                h.owner.pid
            );
        }
    }
}

/// Write-back for every export, with the intent log when there is one.
fn start_writeback(
    settings: &ServeSettings,
    exports: Vec<LogExport>,
    cache: &Arc<Cache>,
) -> Result<Arc<WriteBack>> {
    let tun = Arc::new(WriteTunables::default());
    write_tunables(&settings.tunables, &tun);
    let log = match &settings.log {
        Some(spec) => {
            let dev = open_log_dev(spec, &settings.tunables)?;
            warn_if_not_closed(dev.as_ref());
            let log = IntentLog::open(dev, exports)?;
            info!("intent log {}: {} bytes", log.name(), log.capacity());
            Some(Arc::new(log))
        }
        None => None,
    };
    Ok(WriteBack::new(log, cache.l2().cloned(), tun))
}

/// Counters by name, read at each `stat`.
pub type StatsSource = Box<dyn Fn() -> Vec<(&'static str, u64)> + Send + Sync>;

/// A running server and what it needs to stop cleanly.
pub struct Running {
    pub server: Arc<Server>,
    pub cache: Arc<Cache>,
    pub writeback: Arc<WriteBack>,
    recorder: Option<Arc<Recorder>>,
    pub volumes: Vec<Arc<Volume>>,
    /// Each export's backing store, released at a clean stop.
    backing: Vec<Arc<dyn BlockDev>>,
    /// One URI per export and listener, for clients.
    pub uris: Vec<String>,
    pub control: Option<PathBuf>,
    sockets: Vec<PathBuf>,
    feed: Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)>,
    rebuild: Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)>,
    contents: Option<Follower>,
    state: Option<Arc<ControlState>>,
    /// The control socket's and the metrics endpoint's listeners and the
    /// control sessions, shut at the end of `stop` so their threads end and
    /// let the state go.
    listening: Arc<Listeners>,
}

impl Running {
    /// Adds counters of another part of the process (the file view) to
    /// `stat --json` and the metrics.
    pub fn add_stats(&self, source: StatsSource) {
        if let Some(s) = &self.state {
            s.extra.lock().push(source);
        }
    }

    /// Puts `t` in force as `arcache set` would; the names that changed,
    /// with their new values.
    pub fn reload(&self, t: &Tunables) -> Vec<String> {
        self.state.as_ref().map_or_else(Vec::new, |s| s.reload(t))
    }

    /// Stops taking requests, answers those in flight, writes all dirty
    /// data, stops the feed, syncs the backing stores.
    pub fn stop(mut self) -> Result<()> {
        if !self.server.shutdown(Duration::from_secs(30)) {
            warn!("some clients were still connected after 30 s");
        }
        // Read-only servers of chunked S3 disks stop following their
        // writers: no change is applied to caches about to close.
        for v in &self.volumes {
            v.device().stop_watching();
        }
        if let Some(r) = &self.recorder {
            r.flush();
        }
        let mut result = self.writeback.shutdown().context("writing dirty data at shutdown");
        if let Err(e) = &result {
            warn!("{e:#}");
        }
        for (stop, handle) in self.rebuild.take().into_iter().chain(self.feed.take()) {
            stop.store(true, Ordering::Relaxed);
            let _ = handle.join();
        }
        for v in &self.volumes {
            if v.read_only() {
                continue;
            }
            if let Err(e) = v.flush_backing() {
                warn!("flushing export {:?}: {e}", v.name());
                result = Err(e).context("flushing at shutdown");
            }
        }
        // After the last change reached the stores (a txg's sync ends with
        // their flush): the next start keeps the L2 of what this server
        // wrote, if nobody else writes first. Not after any failed backing
        // IO: a write that failed may still land later (an RBD op that
        // timed out), under a record since refilled from older bytes.
        if let Some(follower) = self.contents.take() {
            let (errors, txgs) = (self.cache.stats().backing_errors, self.writeback.view().txg_sync_errors);
            if result.is_ok() && errors == 0 && txgs == 0 {
                follower.bind();
            } else {
                warn!(
                    "the L2 records of S3 disks and RBD images this server wrote, or followed as they changed, \
                     are not kept for the next start: {errors} backing store requests and {txgs} txg syncs \
                     failed in this run{}",
                    if result.is_ok() { "" } else { ", and the stop could not write or flush everything" }
                );
            }
        }
        if let Some(l2) = self.cache.l2() {
            l2.sync_logs();
            l2.mark_closed();
        }
        // Only with every dirty byte in the bucket may another server write
        // there; otherwise the lease stays held as the devices are dropped
        // (not renewed: as after a crash), and the log keeps the rest.
        // Likewise an RBD image's exclusive lock; closing the image gives it
        // back at once. An image cannot keep it past a failed stop: the
        // image closes when dropped, and a lock left by a process that is
        // gone is taken over when the cluster notices, about 30 s on. Only
        // this server's stores: another server in the process keeps its own.
        if result.is_ok() {
            give_back(&self.backing);
        }
        // Last: `arcache stat` answers while dirty data is written above.
        self.listening.close_all();
        for s in self.sockets.iter().chain(self.control.iter()) {
            let _ = std::fs::remove_file(s);
        }
        result
    }
}

/// Opens every backing store, binds every socket and starts serving.
pub fn start(settings: &ServeSettings, nbd_cfg: ServerConfig, with_control: bool) -> Result<Running> {
    startup::stage("opening the backing stores");
    let mut devices = Vec::new();
    for export in &settings.exports {
        match open_backing(export, &settings.tunables) {
            Ok(dev) => devices.push(dev),
            Err(e) => {
                give_back(&devices);
                return Err(e);
            }
        }
    }
    start_on(settings, devices, nbd_cfg, with_control)
}

/// Gives back what `devices` hold for a writer (an S3 disk's lease, an RBD
/// image's lock), once nothing can be left for them to write.
fn give_back(devices: &[Arc<dyn BlockDev>]) {
    for dev in devices {
        if let Err(e) = dev.release() {
            warn!("{}: giving it back: {e}", dev.describe());
        }
    }
}

/// Until disarmed, gives the stores back when dropped: a start that fails
/// before the intent log is replayed wrote nothing to them, so the next
/// writer need not break a lease. From the replay on, a failed start keeps
/// them as a failed stop does.
struct GiveBackOnFailure(Option<Vec<Arc<dyn BlockDev>>>);

impl GiveBackOnFailure {
    fn disarm(&mut self) {
        self.0 = None;
    }
}

impl Drop for GiveBackOnFailure {
    fn drop(&mut self) {
        if let Some(devices) = &self.0 {
            give_back(devices);
        }
    }
}

/// Opens (creating if asked) the L2 devices, and reads their headers to
/// restore their contents (the rebuild itself runs in the background).
fn open_l2(specs: &[L2Spec], exports: &[ExportDesc], opts: &PersistOptions) -> Result<Option<Arc<L2Arc>>> {
    if specs.is_empty() {
        return Ok(None);
    }
    let mut devices = Vec::new();
    for spec in specs {
        let p = &spec.path;
        if !p.exists() && spec.size.is_none() {
            bail!(
                "L2 device {} does not exist; give its size to create it: --l2 {}:SIZE",
                p.display(),
                p.display()
            );
        }
        let opts = FileDevOptions {
            direct: true,
            read_only: false,
            create_size: spec.size,
            lock: DevLock::Exclusive,
            ..Default::default()
        };
        let dev = FileDev::open(p, opts).with_context(|| format!("opening L2 device {}", p.display()))?;
        if !dev.is_direct() {
            warn!("L2 device {}: the filesystem refuses O_DIRECT; using buffered IO", p.display());
        }
        let shown = p.display().to_string();
        info!("L2 device {shown}: {} bytes", dev.size());
        devices.push(L2Device::new(shown, Arc::new(dev)).map_err(anyhow::Error::msg)?);
    }
    Ok(Some(Arc::new(L2Arc::open(devices, exports, opts).map_err(anyhow::Error::msg)?)))
}

fn zfetch_tunables(t: &Tunables, z: &ZfetchTunables) {
    z.disable.store(t.value("zfs_prefetch_disable") != 0, Ordering::Relaxed);
    z.max_distance.store(t.value("zfetch_max_distance"), Ordering::Relaxed);
    z.min_distance.store(t.value("zfetch_min_distance"), Ordering::Relaxed);
    z.max_streams.store(t.value("zfetch_max_streams"), Ordering::Relaxed);
}

fn feed_tunables(t: &Tunables, f: &FeedTunables) {
    f.write_max.store(t.value("l2arc_write_max"), Ordering::Relaxed);
    f.write_boost.store(t.value("l2arc_write_boost"), Ordering::Relaxed);
    f.headroom.store(t.value("l2arc_headroom"), Ordering::Relaxed);
    f.feed_secs.store(t.value("l2arc_feed_secs"), Ordering::Relaxed);
    f.feed_min_ms.store(t.value("l2arc_feed_min_ms"), Ordering::Relaxed);
    f.feed_again.store(t.value("l2arc_feed_again") != 0, Ordering::Relaxed);
    f.noprefetch.store(t.value("l2arc_noprefetch") as u8, Ordering::Relaxed);
    f.mfuonly.store(t.value("l2arc_mfuonly") != 0, Ordering::Relaxed);
    f.trim_ahead.store(t.value("l2arc_trim_ahead"), Ordering::Relaxed);
    f.dwpd_limit.store(t.value("l2arc_dwpd_limit"), Ordering::Relaxed);
    f.meta_percent.store(t.value("l2arc_meta_percent"), Ordering::Relaxed);
}

/// Starts serving `devices`, one per export of `settings`, in order.
pub fn start_on(
    settings: &ServeSettings,
    devices: Vec<Arc<dyn BlockDev>>,
    nbd_cfg: ServerConfig,
    with_control: bool,
) -> Result<Running> {
    let mut unwritten = GiveBackOnFailure(Some(devices.clone()));
    let t = settings.tunables.clone();
    // Before anything starts a thread: a bad certificate leaves nothing to stop.
    let tls = tls_policy(settings)?;
    let descs = export_descs(settings, &devices)?;
    let l2_descs: Vec<ExportDesc> = descs.iter().cloned().chain(settings.view.clone()).collect();
    let persist = PersistOptions {
        rebuild_enabled: t.value("l2arc_rebuild_enabled") != 0,
        min_l2size: t.value("l2arc_rebuild_blocks_min_l2size"),
        state_dir: Some(settings.state_dir.clone()),
    };
    startup::stage("opening the L2 devices");
    let l2 = open_l2(&settings.l2, &l2_descs, &persist)?;
    // One ring for every device read that can skip a worker thread: L2
    // copies, and records of backing stores opened O_DIRECT.
    let ring = match blockdev::uring::Uring::start("io-ring") {
        Ok(ring) => Some(Arc::new(ring)),
        Err(e) => {
            info!("io_uring unavailable ({e}): L2 and backing reads are done by worker threads");
            None
        }
    };
    if let (Some(l2), Some(ring)) = (&l2, &ring) {
        l2.use_ring(Arc::clone(ring));
    }
    let cache = Cache::with_policy(
        CacheConfig {
            arc_min: t.value("zfs_arc_min"),
            arc_max: t.value("zfs_arc_max"),
            min_prefetch_ms: t.value("zfs_arc_min_prefetch_ms"),
            compress: t.value("zfs_compressed_arc_enabled") != 0,
        },
        l2,
        settings.policy,
    )
    .with_context(|| format!("no serving policy named {}", settings.policy))?;
    cache.set_partial_reads(t.value("l2arc_partial_reads") != 0);
    // Not in CacheConfig, and no control request applies them before the
    // first request is served.
    cache.set_meta_balance(t.value("zfs_arc_meta_balance"));
    cache.set_dnode_limit(dnode_limit(&t));
    if let Some(l2) = cache.l2() {
        l2.set_ring_reads(t.value("l2arc_ring_reads") != 0);
    }
    zfetch_tunables(&t, &cache.zfetch);
    if settings.exports.len() > MAX_EXPORTS {
        bail!("at most {MAX_EXPORTS} exports");
    }
    let log_descs = log_exports(&descs);
    startup::stage("opening the intent log");
    let writeback = start_writeback(settings, log_descs.clone(), &cache)?;
    let mut volumes = Vec::new();
    let mut table = ExportTable::default();
    let recorder = match &settings.record_trace {
        Some(spec) => {
            let (path, max) = recorder::parse(spec)?;
            Some(Recorder::start(path, max)?)
        }
        None => None,
    };
    let contents = cache.l2().and_then(|l2| Follower::new(l2, &descs, &devices));
    if let Some(f) = &contents {
        f.unbind();
    }
    let backing = devices.clone();
    for (i, (spec, dev)) in settings.exports.iter().zip(devices).enumerate() {
        let id = u16::try_from(i).context("too many exports")?;
        cache.set_secondarycache(id, spec.secondarycache);
        let vol = Volume::with_writeback(
            id,
            VolumeConfig { name: spec.name.clone(), recordsize: spec.recordsize, read_only: spec.read_only },
            dev,
            Arc::clone(&cache),
            Arc::clone(&writeback),
        );
        info!(
            "export {:?}: {} ({} bytes, recordsize {}{})",
            spec.name,
            vol.device().describe(),
            vol.size(),
            spec.recordsize,
            if vol.read_only() { ", read-only" } else { "" }
        );
        vol.set_sync_mode(SyncMode::from_index(spec.sync.unwrap_or(t.value("sync"))));
        if let Some(ring) = &ring {
            vol.use_ring(Arc::clone(ring));
        }
        vol.set_backing_ring_reads(t.value("backing_ring_reads") != 0);
        vol.set_read_units(t.value("backing_read_units") != 0);
        table.insert(NbdExport::new(Arc::clone(&vol), spec.backing.clone(), recorder.clone()));
        volumes.push(vol);
    }
    // Before anything else reads or caches: the log's writes are the newest.
    let pairs: Vec<(LogExport, Arc<Volume>)> = log_descs.into_iter().zip(volumes.iter().cloned()).collect();
    startup::stage("replaying the intent log");
    unwritten.disarm();
    let replayed = arcache_engine::replay_log(&writeback, &pairs).context("replaying the intent log")?;
    if replayed.chunks > 0 {
        info!("intent log: {} writes replayed into the backing stores", replayed.pages + replayed.discards);
    }
    writeback.spawn();
    let feed_tun = Arc::new(FeedTunables::default());
    feed_tunables(&t, &feed_tun);
    let rebuild = start_rebuild(&cache, t.value("zfs_arc_max") * t.value("l2arc_meta_percent") / 100);
    let arc_max = Arc::new(AtomicU64::new(t.value("zfs_arc_max")));
    let (feed, feed_stats) = match Feed::new(Arc::clone(&cache), Arc::clone(&feed_tun), Arc::clone(&arc_max))
    {
        Some(f) => {
            let stats = Arc::clone(&f.stats);
            let stop = Arc::new(AtomicBool::new(false));
            (Some((Arc::clone(&stop), f.spawn(stop))), Some(stats))
        }
        None => (None, None),
    };
    let server = Server::with_tls(
        Arc::new(table),
        settings.apply_limits(ServerConfig { workers: settings.workers, ..nbd_cfg }),
        tls,
    );
    // Each connection's thread finishes the ring reads it starts
    // (blockdev::uring::LocalRing); with no ring at all, workers read.
    if ring.is_some() {
        server.set_thread_io(Arc::new(|| {
            let own = blockdev::uring::LocalRing::install().ok()?;
            Some(Box::new(ConnRing(own)) as Box<dyn nbd::ThreadIo>)
        }));
    }
    let mut running = Running {
        server,
        cache,
        writeback,
        recorder,
        volumes,
        backing,
        uris: Vec::new(),
        control: None,
        sockets: Vec::new(),
        feed,
        rebuild,
        contents,
        state: None,
        listening: Arc::new(Listeners::default()),
    };
    let parts = ControlParts { tunables: t, feed: feed_tun, feed_stats, arc_max };
    if let Err(e) = running.open_to_clients(settings, with_control, parts) {
        // Threads run and a client may have written already: stop as at a
        // signal, so nothing is left running and what was written is synced.
        if let Err(stop) = running.stop() {
            warn!("stopping after a failed start: {stop:#}");
        }
        return Err(e);
    }
    Ok(running)
}

/// What the control state takes beyond what `Running` holds.
struct ControlParts {
    tunables: Tunables,
    feed: Arc<FeedTunables>,
    feed_stats: Option<Arc<FeedStats>>,
    arc_max: Arc<AtomicU64>,
}

impl Running {
    /// Binds the NBD sockets, then the metrics endpoint and control socket.
    fn open_to_clients(
        &mut self,
        settings: &ServeSettings,
        with_control: bool,
        parts: ControlParts,
    ) -> Result<()> {
        startup::stage("binding the sockets");
        // A client may connect and write as soon as a socket is bound: a
        // signal from here on must stop cleanly (syncing what it wrote), not
        // end the process as during the stages above.
        startup::serving();
        self.uris = listen_all(settings, &self.server, &self.volumes, &mut self.sockets)?;
        if !with_control {
            return Ok(());
        }
        let handler = Arc::new(ControlState {
            cache: Arc::clone(&self.cache),
            writeback: Arc::clone(&self.writeback),
            write_tun: Arc::clone(&self.writeback.tunables),
            tunables: Mutex::new(parts.tunables),
            server: Arc::clone(&self.server),
            volumes: self.volumes.clone(),
            feed: parts.feed,
            feed_stats: parts.feed_stats,
            arc_max: parts.arc_max,
            started: std::time::Instant::now(),
            recorder: self.recorder.clone(),
            sizing_cache: Mutex::new(None),
            extra: Mutex::new(Vec::new()),
        });
        self.state = Some(Arc::clone(&handler));
        if let Some(addr) = &settings.metrics {
            let h = Arc::clone(&handler);
            let bound = metrics::serve(addr, Arc::new(move || h.stat()), &self.listening)?;
            println!("metrics http://{bound}/metrics");
        }
        self.control =
            match control::serve(&settings.control, handler as Arc<dyn control::Handler>, &self.listening) {
                Ok(p) => Some(p),
                // Clients' data matters more than our statistics: serve anyway.
                Err(e) if is_disk_full(&e) => {
                    tracing::error!(
                    "no control socket ({e:#}); serving without it, so stat/get/set cannot reach this server"
                );
                    None
                }
                Err(e) => return Err(e),
            };
        // A fault test holds start-up here with its sockets answering
        // (tests/failpoints.rs: a signal then must be a clean stop).
        #[cfg(feature = "failpoints")]
        fail::fail_point!("serve.bound");
        Ok(())
    }
}

/// What each export's L2 records are bound to: its backing store's
/// identity and, where the store can tell, what it holds now.
fn export_descs(settings: &ServeSettings, devices: &[Arc<dyn BlockDev>]) -> Result<Vec<ExportDesc>> {
    settings
        .exports
        .iter()
        .zip(devices)
        .enumerate()
        .map(|(i, (spec, dev))| {
            Ok(ExportDesc {
                id: u16::try_from(i).context("too many exports")?,
                name: spec.name.clone(),
                recordsize: u32::try_from(spec.recordsize).context("recordsize")?,
                size: dev.size(),
                identity: xxhash_rust::xxh3::xxh3_64(dev.identity().as_bytes()),
                contents: contents_of(dev.as_ref()),
            })
        })
        .collect()
}

/// Restores the L2 index from the devices' logs on a thread of its own:
/// clients are served meanwhile, and restored records are hits at once.
fn start_rebuild(cache: &Arc<Cache>, hdr_cap: u64) -> Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)> {
    let l2 = Arc::clone(cache.l2()?);
    if !l2.is_rebuilding() {
        return None;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let (c, s) = (Arc::clone(cache), Arc::clone(&stop));
    let handle = std::thread::Builder::new()
        .name("l2-rebuild".into())
        .spawn(move || l2.rebuild(hdr_cap, &|keys: &[u64]| c.count_cached(keys), &s))
        .ok()?;
    Some((stop, handle))
}

pub fn run(args: &ServeArgs) -> Result<()> {
    let settings = resolve(args)?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, Arc::clone(&stop))?;
    }
    let hup = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGHUP, Arc::clone(&hup))?;
    let watch = startup::Watch::start(Arc::clone(&stop));
    let running = start(&settings, ServerConfig::default(), true)?;
    watch.finish();
    for u in &running.uris {
        println!("serving {u}");
    }
    if let Some(c) = &running.control {
        println!("control socket {}", c.display());
    }
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
        if hup.swap(false, Ordering::Relaxed) {
            reload(args, &running);
        }
    }
    info!("stopping: answering requests in flight and syncing backing stores");
    running.stop()?;
    info!("stopped cleanly");
    Ok(())
}

/// SIGHUP: the tunables again from defaults, the config file and the
/// command line's `--set`, as at start; a config that does not parse
/// changes nothing.
fn reload(args: &ServeArgs, running: &Running) {
    let Some(path) = &args.config else {
        info!("SIGHUP: no --config file to reload");
        return;
    };
    match resolve(args) {
        Ok(s) => {
            let changed = running.reload(&s.tunables);
            info!(
                "SIGHUP: reloaded {}: {}",
                path.display(),
                if changed.is_empty() { "no change".into() } else { changed.join(", ") }
            );
        }
        Err(e) => warn!("SIGHUP: {} not reloaded, tunables unchanged: {e:#}", path.display()),
    }
}

/// Answers the control socket.
struct ControlState {
    cache: Arc<Cache>,
    writeback: Arc<WriteBack>,
    write_tun: Arc<WriteTunables>,
    tunables: Mutex<Tunables>,
    server: Arc<Server>,
    volumes: Vec<Arc<Volume>>,
    feed: Arc<FeedTunables>,
    feed_stats: Option<Arc<FeedStats>>,
    arc_max: Arc<AtomicU64>,
    started: std::time::Instant,
    recorder: Option<Arc<Recorder>>,
    sizing_cache: Mutex<Option<(std::time::Instant, Value)>>,
    extra: Mutex<Vec<StatsSource>>,
}

impl ControlState {
    fn stat(&self) -> Result<Value> {
        use std::sync::atomic::Ordering::Relaxed;
        let mut v = serde_json::to_value(self.cache.stats())?;
        let s = self.server.stats();
        let obj = v.as_object_mut().context("stats are an object")?;
        if let Value::Object(w) = serde_json::to_value(self.writeback.view())? {
            obj.extend(w);
        }
        let syncs: serde_json::Map<String, Value> =
            self.volumes.iter().map(|v| (v.name().to_string(), json!(v.sync_mode().name()))).collect();
        obj.insert("sync".into(), Value::Object(syncs));
        let per_export: Vec<Value> = self
            .volumes
            .iter()
            .map(|v| {
                let c = v.counts();
                json!({
                    "name": v.name(),
                    "size": v.size(),
                    "sync": v.sync_mode().name(),
                    "read_only": v.read_only(),
                    "reads": c.reads.load(Relaxed),
                    "read_bytes": c.read_bytes.load(Relaxed),
                    "writes": c.writes.load(Relaxed),
                    "write_bytes": c.write_bytes.load(Relaxed),
                    "flushes": c.flushes.load(Relaxed),
                    "discards": c.discards.load(Relaxed),
                    "store_changes": c.store_changes.load(Relaxed),
                    "store_changed_bytes": c.store_changed_bytes.load(Relaxed),
                })
            })
            .collect();
        obj.insert("export_stats".into(), Value::Array(per_export));
        obj.insert("nbd_connections".into(), json!(s.connections.load(Relaxed)));
        obj.insert("nbd_active_connections".into(), json!(s.active_connections.load(Relaxed)));
        obj.insert("nbd_requests".into(), json!(s.requests.load(Relaxed)));
        obj.insert("nbd_request_errors".into(), json!(s.request_errors.load(Relaxed)));
        obj.insert("nbd_sends_interrupted".into(), json!(nbd::conn::SENDS_INTERRUPTED.load(Relaxed)));
        obj.insert("nbd_immediate_reads".into(), json!(s.immediate_reads.load(Relaxed)));
        obj.insert("nbd_immediate_writes".into(), json!(s.immediate_writes.load(Relaxed)));
        obj.insert("nbd_piece_replies".into(), json!(s.piece_replies.load(Relaxed)));
        obj.insert("nbd_tls_sessions".into(), json!(s.tls_sessions.load(Relaxed)));
        obj.insert("nbd_tls_handshake_errors".into(), json!(s.tls_handshake_errors.load(Relaxed)));
        obj.insert("nbd_refused_connections".into(), json!(s.refused_connections.load(Relaxed)));
        obj.insert("nbd_budget_waits".into(), json!(s.budget_waits.load(Relaxed)));
        obj.insert("exports".into(), json!(self.volumes.len()));
        obj.insert("policy".into(), json!(self.cache.policy_name()));
        obj.insert("uptime_secs".into(), json!(self.started.elapsed().as_secs_f64()));
        obj.insert("backing_read_bw".into(), json!(self.cache.backing_read_bandwidth()));
        if let Some(r) = &self.recorder {
            obj.insert("trace_records".into(), json!(r.stats.recorded.load(Relaxed)));
            obj.insert("trace_dropped".into(), json!(r.stats.dropped.load(Relaxed)));
            obj.insert("trace_bytes".into(), json!(r.stats.bytes.load(Relaxed)));
        }
        if let Some(f) = &self.feed_stats {
            obj.insert("l2_feed_cycles".into(), json!(f.cycles.load(Relaxed)));
            obj.insert("l2_feed_budget".into(), json!(f.last_budget.load(Relaxed)));
            obj.insert("l2_feed_bytes".into(), json!(f.fed_bytes.load(Relaxed)));
            obj.insert("l2_feed_examined".into(), json!(f.examined.load(Relaxed)));
            obj.insert("l2_device_write_bw".into(), json!(f.device_write_bw.load(Relaxed)));
            obj.insert("l2_feed_prefetch".into(), json!(u64::from(f.feeds_prefetch.load(Relaxed))));
        }
        for source in self.extra.lock().iter() {
            for (name, value) in source() {
                obj.insert(name.into(), json!(value));
            }
        }
        obj.insert("sizing".into(), self.sizing(obj));
        let records = obj.get("l2_records").and_then(Value::as_u64).unwrap_or(0);
        let hdr = obj.get("l2_hdr_size").and_then(Value::as_u64).unwrap_or(0);
        if records > 0 {
            obj.insert("l2_hdr_bytes_per_record".into(), json!(hdr as f64 / records as f64));
        }
        Ok(v)
    }

    /// The `sizing` object. Building the sampled curve takes tens of
    /// milliseconds with a full window, so `arcache stat 1` and metrics
    /// scrapes reuse one for a few seconds.
    fn sizing(&self, stat: &serde_json::Map<String, Value>) -> Value {
        let mut cached = self.sizing_cache.lock();
        if let Some((_, v)) = cached.as_ref().filter(|(at, _)| at.elapsed() < Duration::from_secs(5)) {
            return v.clone();
        }
        let recordsize = self.volumes.iter().map(|v| v.recordsize()).max().unwrap_or(16 << 10);
        let snapshot = Value::Object(stat.clone());
        let (arc_rec, l2_rec) = advice::capacity_records(&snapshot, recordsize);
        let view = self.cache.sizing(&advice::sizes(arc_rec + l2_rec));
        let v = advice::sizing(&snapshot, &view, recordsize);
        *cached = Some((std::time::Instant::now(), v.clone()));
        v
    }

    fn reload(&self, new: &Tunables) -> Vec<String> {
        let mut t = self.tunables.lock();
        let changed: Vec<String> = tunables::SPECS
            .iter()
            .filter(|sp| t.value(sp.name) != new.value(sp.name))
            .map(|sp| format!("{}={}", sp.name, tunables::format_value(sp.name, new.value(sp.name))))
            .collect();
        let sync_changed = t.value("sync") != new.value("sync");
        *t = new.clone();
        self.apply(&t);
        if sync_changed {
            for vol in &self.volumes {
                vol.set_sync_mode(SyncMode::from_index(t.value("sync")));
            }
        }
        changed
    }

    fn apply(&self, t: &Tunables) {
        self.cache.set_limits(t.value("zfs_arc_min"), t.value("zfs_arc_max"));
        self.cache.set_min_prefetch_ms(t.value("zfs_arc_min_prefetch_ms"));
        self.cache.set_meta_balance(t.value("zfs_arc_meta_balance"));
        self.cache.set_dnode_limit(dnode_limit(t));
        self.cache.set_compress(t.value("zfs_compressed_arc_enabled") != 0);
        self.cache.set_partial_reads(t.value("l2arc_partial_reads") != 0);
        if let Some(l2) = self.cache.l2() {
            l2.set_ring_reads(t.value("l2arc_ring_reads") != 0);
        }
        for vol in &self.volumes {
            vol.set_backing_ring_reads(t.value("backing_ring_reads") != 0);
            vol.set_read_units(t.value("backing_read_units") != 0);
        }
        self.arc_max.store(t.value("zfs_arc_max"), Ordering::Relaxed);
        feed_tunables(t, &self.feed);
        zfetch_tunables(t, &self.cache.zfetch);
        write_tunables(t, &self.write_tun);
    }
}

/// `arc_dnode_limit`: `zfs_arc_dnode_limit`, or when 0 its share of
/// `zfs_arc_max`.
fn dnode_limit(t: &Tunables) -> u64 {
    match t.value("zfs_arc_dnode_limit") {
        0 => (t.value("zfs_arc_max") as u128 * t.value("zfs_arc_dnode_limit_percent") as u128 / 100) as u64,
        bytes => bytes,
    }
}

impl control::Handler for ControlState {
    fn handle(&self, req: Request) -> Result<Value> {
        match req {
            Request::Stat => self.stat(),
            Request::Get { name } => {
                let v = self.tunables.lock().get(&name)?;
                Ok(json!({ "name": name, "value": v, "text": tunables::format_value(&name, v) }))
            }
            Request::GetAll => {
                let t = self.tunables.lock();
                let d = Tunables::defaults();
                let rows: Vec<Value> = tunables::SPECS
                    .iter()
                    .map(|s| {
                        json!({
                            "name": s.name,
                            "value": t.value(s.name),
                            "text": tunables::format_value(s.name, t.value(s.name)),
                            "default": d.value(s.name),
                            "unit": s.unit,
                            "description": s.description,
                        })
                    })
                    .collect();
                Ok(Value::Array(rows))
            }
            Request::Flush => {
                let started = std::time::Instant::now();
                self.writeback.sync_now().context("syncing a transaction group")?;
                let w = self.writeback.view();
                Ok(json!({ "txg": w.txg_synced, "ms": started.elapsed().as_millis() as u64 }))
            }
            Request::Set { name, value } => {
                let v = tunables::parse_value(&name, &value)?;
                let mut t = self.tunables.lock();
                t.set(&name, v)?;
                self.apply(&t);
                if name == "sync" {
                    for vol in &self.volumes {
                        vol.set_sync_mode(SyncMode::from_index(v));
                    }
                }
                info!("tunable {name} set to {}", tunables::format_value(&name, v));
                Ok(json!({ "name": name, "value": v, "text": tunables::format_value(&name, v) }))
            }
        }
    }
}

/// A connection thread's own IO ring, for the NBD server.
struct ConnRing(blockdev::uring::LocalRing);

impl nbd::ThreadIo for ConnRing {
    fn busy(&self) -> bool {
        self.0.busy()
    }
    fn wait(&mut self, fd: Option<std::os::fd::RawFd>, out: &mut nbd::Batch) {
        self.0.wait(fd, out)
    }
}
