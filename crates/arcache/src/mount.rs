//! `arcache mount SOURCE MOUNTPOINT`: a FUSE view of a directory whose
//! metadata and file data are cached in the ARC `serve` builds
//! (`docs/fileview.md`). The same process may serve NBD exports too.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use arcache_fileview::ViewConfig;
use clap::Args;
use nbd::ServerConfig;
use tracing::{info, warn};

use crate::config::{check_recordsize, ConfigFile};
use crate::serve::{self, ServeArgs};
use crate::size::parse_size;
use crate::startup;

/// The view's record size unless `--recordsize` is given: a ZFS file
/// system's default.
pub const VIEW_RECORDSIZE: u64 = 128 << 10;

#[derive(Debug, Args, Clone)]
#[command(after_help = "The other options are serve's: the ARC's (--arc-max, --l2, --set, --config, \
--control, --metrics, ...) and NBD exports to serve beside the view. For the view, --read-only refuses \
every change with EROFS, --recordsize is its file-data record (default 128K), and --secondarycache \
takes all (default), metadata or none for the view's records. SIGTERM, SIGINT or \
`fusermount3 -u MOUNTPOINT` unmount and stop; see docs/fileview.md.")]
pub struct MountArgs {
    /// The directory to show (a slow disk, an NFS or SMB mount, ...).
    pub source: PathBuf,
    /// Where to show it: an existing directory.
    pub mountpoint: PathBuf,
    /// Seconds a file's cached metadata and data are used before SOURCE is
    /// asked whether it changed (size, mtime, ctime, inode); also the
    /// kernel's entry and attribute lifetime. 0 checks at every use.
    #[arg(long, value_name = "SECS", default_value_t = 1.0)]
    pub revalidate: f64,
    /// With inotify on SOURCE's directories (a local file system), how
    /// long a file or directory no event has touched since it was checked
    /// is used before it is checked anyway: changes made on this machine
    /// are seen at once, and warm passes do not ask SOURCE. The bound is
    /// for what sends no event (writes through mmap, another mount of the
    /// same disk). 0 turns inotify off; on NFS, SMB and FUSE sources it is
    /// never used.
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    pub watch_max: f64,
    /// Threads answering the kernel's requests (default 8: a miss waits
    /// for SOURCE, and other requests should not wait behind it).
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub fuse_threads: usize,
    /// Let every user use the view (FUSE's allow_other; an unprivileged
    /// user needs user_allow_other in /etc/fuse.conf).
    #[arg(long)]
    pub allow_other: bool,
    /// Have the kernel drop its page cache of a file at every open, even
    /// when the file is unchanged (by default it keeps it: FOPEN_KEEP_CACHE
    /// while the version opened is the one it opened last).
    #[arg(long)]
    pub no_keep_cache: bool,
    /// Answer listings without their entries' attributes (by default the
    /// kernel gets them with the listing: readdirplus).
    #[arg(long)]
    pub no_readdirplus: bool,
    /// Do not have SOURCE read the inodes of a directory's other entries
    /// when a file in it is opened on SOURCE (by default the first such open in a
    /// directory for 5 s does, 8 at once in the background, so a copy's
    /// later opens do not each wait for one on a cold SOURCE).
    #[arg(long)]
    pub no_open_ahead: bool,
    /// Open SOURCE's file at every open before answering it. By default a
    /// read-only open of a file inotify vouches for is answered from the
    /// cache and SOURCE's file opened right after, in the background or by
    /// the first read that needs it; a file replaced on SOURCE in between
    /// then reads as ESTALE where its records are not cached.
    #[arg(long)]
    pub no_deferred_open: bool,
    /// The settings `serve` takes (see after_help).
    #[command(flatten)]
    pub serve: ServeArgs,
}

pub fn run(args: &MountArgs) -> Result<()> {
    let mut settings = serve::resolve_for_view(&args.serve)?;
    // read_only and recordsize as serve takes them: the flag, else the
    // config file's, else the view's default.
    let file = match &args.serve.config {
        Some(p) => ConfigFile::load(p)?,
        None => ConfigFile::default(),
    };
    let recordsize = match (&args.serve.recordsize, &file.recordsize) {
        (Some(s), _) => check_recordsize(parse_size(s)?)?,
        (None, Some(v)) => check_recordsize(v.bytes()?)?,
        (None, None) => VIEW_RECORDSIZE,
    };
    let read_only = args.serve.read_only || file.read_only.unwrap_or(false);
    // ZFS's `secondarycache` of a dataset: the view has metadata.
    let view_l2 = match args.serve.secondarycache.as_deref().or(file.secondarycache.as_deref()) {
        None | Some("all") => arcache_engine::ViewL2::All,
        Some("metadata") => arcache_engine::ViewL2::Metadata,
        Some("none") => arcache_engine::ViewL2::None,
        Some(other) => bail!("bad secondarycache {other:?}: use all, metadata or none"),
    };
    if !args.revalidate.is_finite() || args.revalidate < 0.0 {
        bail!("--revalidate takes seconds, 0 or more");
    }
    if !args.watch_max.is_finite() || args.watch_max < 0.0 {
        bail!("--watch-max takes seconds, 0 or more");
    }
    if !args.source.is_dir() {
        bail!("SOURCE {} is not a directory", args.source.display());
    }
    if !args.mountpoint.is_dir() {
        bail!("MOUNTPOINT {} is not a directory", args.mountpoint.display());
    }
    let (name, identity) = arcache_fileview::l2_identity(&args.source)
        .with_context(|| format!("reading SOURCE {}", args.source.display()))?;
    settings.view = Some(arcache_l2::ExportDesc {
        id: arcache_l2::VIEW_EXPORT_ID,
        name,
        recordsize: recordsize as u32,
        size: 0,
        identity,
        contents: identity,
    });
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, Arc::clone(&stop))?;
    }
    let watch = startup::Watch::start(Arc::clone(&stop));
    let running = serve::start(&settings, ServerConfig::default(), true)?;
    watch.finish();
    running.cache.set_view_secondarycache(view_l2);
    let cfg = ViewConfig {
        source: args.source.clone(),
        recordsize,
        revalidate: Duration::from_secs_f64(args.revalidate),
        read_only,
        threads: args.fuse_threads,
        allow_other: args.allow_other,
        watch_max: Duration::from_secs_f64(args.watch_max),
        keep_cache: !args.no_keep_cache,
        readdirplus: !args.no_readdirplus,
        open_ahead: !args.no_open_ahead,
        defer_opens: !args.no_deferred_open,
    };
    let view = match arcache_fileview::mount(cfg, Arc::clone(&running.cache), &args.mountpoint) {
        Ok(v) => v,
        // Unmounted from outside (fusermount3 -u) before the kernel's first
        // request was answered: the stop asked for, come early (a test
        // that unmounted as soon as the mount showed saw exit 1).
        Err(e)
            if e.kind() == std::io::ErrorKind::NotConnected
                && !arcache_fileview::is_mounted(&args.mountpoint) =>
        {
            info!("{} was unmounted while the view started; stopping", args.mountpoint.display());
            running.stop()?;
            return Ok(());
        }
        Err(e) => {
            let _ = running.stop();
            return Err(e).with_context(|| format!("mounting the view at {}", args.mountpoint.display()));
        }
    };
    running.add_stats(view.stat_source());
    println!("mounted {} at {}", args.source.display(), args.mountpoint.display());
    for u in &running.uris {
        println!("serving {u}");
    }
    if let Some(c) = &running.control {
        println!("control socket {}", c.display());
    }
    while !stop.load(Ordering::Relaxed) && !view.ended() {
        std::thread::sleep(Duration::from_millis(100));
    }
    if view.ended() {
        info!("{} was unmounted; stopping", args.mountpoint.display());
    } else {
        info!("stopping: unmounting {}", args.mountpoint.display());
    }
    if let Err(e) = view.unmount() {
        warn!("unmounting {}: {e}", args.mountpoint.display());
    }
    running.stop()?;
    info!("stopped cleanly");
    Ok(())
}
