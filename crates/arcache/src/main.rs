//! `arcache`: a ZFS-style ARC cache for slow block storage, served over NBD.

use std::process::ExitCode;

use arcache::{demo, l2cmd, logcmd, mount, s3cmd, serve, simcmd, statcmd, summary};
use clap::{Parser, Subcommand};

/// Records of 4K..1M are allocated and freed by dozens of threads; glibc's
/// per-thread arenas then keep freed memory and the process grows well past
/// `arc_max`. mimalloc returns it.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Debug, Parser)]
#[command(
    name = "arcache",
    version = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("ARCACHE_BUILD_COMMIT"), ")"),
    about = "A ZFS-style ARC and L2ARC cache with write-back, in front of slow block storage, served over NBD"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Serve exports over NBD through a shared ARC in RAM.
    Serve(Box<serve::ServeArgs>),
    /// Show a directory through FUSE with its metadata and small files
    /// cached in the ARC: `mount SOURCE MOUNTPOINT`.
    Mount(Box<mount::MountArgs>),
    /// arcstat-style columns of a running server: `stat [INTERVAL [COUNT]]`,
    /// `-f` to pick columns, `-v` to list them, `--json` for every counter.
    Stat(statcmd::StatArgs),
    /// An arc_summary-like report of a running server.
    Summary(summary::SummaryArgs),
    /// Print tunables of a running server.
    Get(statcmd::GetArgs),
    /// Change a tunable of a running server.
    Set(statcmd::SetArgs),
    /// Replay a block trace through the cache policies, without IO.
    Sim(simcmd::SimArgs),
    /// Show, on a simulated slow disk array, what the cache buys.
    Demo(demo::DemoArgs),
    /// Inspect (`l2 dump PATH [-v|-vv]`) or empty (`l2 forget PATH`) an L2 cache device.
    L2(l2cmd::L2Args),
    /// Inspect (`log dump PATH [-v]`) or empty (`log forget PATH`) an intent log device.
    Log(logcmd::LogArgs),
    /// Sync a transaction group of a running server now: all dirty data to the backing stores.
    Flush(logcmd::FlushArgs),
    /// S3 chunked disks: `s3 show`, `s3 create`, `s3 break-lease` of s3://BUCKET/PREFIX/.
    S3(s3cmd::S3Args),
}

fn init_logging(default_level: &str) {
    use std::io::IsTerminal;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        // rustls warns on every libnbd connection by IP (an IP as SNI is
        // illegal but harmless); keep its errors only.
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(format!("{default_level},rustls=error")));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
}

/// mimalloc's `mi_option_purge_delay` (missing from the Rust bindings'
/// constants; its place in the option enum of mimalloc v3, which
/// libmimalloc-sys builds, and of v2).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
/// `mi_option_arena_eager_commit`, likewise.
const MI_OPTION_ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;

/// mimalloc commits its first arena before `main` runs, eagerly: the soak
/// test measured 520 MiB resident for a 64 MiB ARC that way and 190 MiB
/// with lazy commit. The option only takes effect from the environment at
/// start, so a server without it sets it and starts itself again.
fn reexec_with_lazy_arenas() {
    use std::os::unix::process::CommandExt;
    const VAR: &str = "MIMALLOC_ARENA_EAGER_COMMIT";
    let mut args = std::env::args_os();
    let is_serve = args.nth(1).is_some_and(|a| a == "serve" || a == "mount");
    if !is_serve || std::env::var_os(VAR).is_some() {
        return;
    }
    let Ok(exe) = std::env::current_exe() else { return };
    // Only returns on failure; then this process serves as it is.
    let err = std::process::Command::new(exe).args(std::env::args_os().skip(1)).env(VAR, "0").exec();
    eprintln!("arcache: could not restart with lazy memory commit ({err}); continuing");
}

/// A report piped into `head` ends as any Unix tool does when the reader
/// goes, instead of panicking on the next line. Servers keep Rust's ignored
/// SIGPIPE: a client closing its socket must not kill them.
fn die_quietly_on_closed_stdout() {
    // SAFETY: restoring a signal's default disposition before any thread
    // is started has no memory-safety preconditions.
    unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
}

fn main() -> ExitCode {
    // Give freed pages back at once: with dozens of threads each holding
    // freed record buffers for a while, RSS would run well past arc_max
    // (measured: 150 MB instead of 114 MB for a 64 MB ARC).
    // SAFETY: setting an allocator option has no memory-safety preconditions.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, 0) };
    // SAFETY: as above.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_ARENA_EAGER_COMMIT, 0) };
    reexec_with_lazy_arenas();
    let cli = Cli::parse();
    if matches!(
        cli.cmd,
        Cmd::Stat(_) | Cmd::Summary(_) | Cmd::Get(_) | Cmd::Sim(_) | Cmd::L2(_) | Cmd::Log(_)
    ) {
        die_quietly_on_closed_stdout();
    }
    // Arms the points FAILPOINTS names (a fault-test build only).
    #[cfg(feature = "failpoints")]
    let _fail_points = fail::FailScenario::setup();
    // The demo talks to a person; its server's log lines would only interrupt.
    init_logging(if matches!(cli.cmd, Cmd::Demo(_) | Cmd::L2(_) | Cmd::Log(_)) { "warn" } else { "info" });
    let result = match cli.cmd {
        Cmd::Serve(a) => serve::run(&a),
        Cmd::Mount(a) => mount::run(&a),
        Cmd::Stat(a) => statcmd::stat(&a),
        Cmd::Summary(a) => summary::run(&a),
        Cmd::Get(a) => statcmd::get(&a),
        Cmd::Set(a) => statcmd::set(&a),
        Cmd::Sim(a) => simcmd::run(&a),
        Cmd::Demo(a) => demo::run(&a),
        Cmd::L2(a) => l2cmd::run(&a),
        Cmd::Log(a) => logcmd::run(&a),
        Cmd::Flush(a) => logcmd::flush(&a),
        Cmd::S3(a) => s3cmd::run(&a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            if e.downcast_ref::<l2cmd::Inconsistent>().is_none() {
                eprintln!("arcache: {e:#}");
            }
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod allocator_tests {
    /// The L2 feed writes a record from its own memory, and reads a run of
    /// records back into a buffer each, only where that memory is aligned
    /// for O_DIRECT (l2arc's `BatchLayout`, `L2Device::read_records`); it
    /// relies on this allocator placing whole pages on page boundaries.
    /// Another allocator would make both copy again: this test says so.
    #[test]
    fn the_servers_allocator_puts_buffers_of_whole_pages_on_page_boundaries() {
        for len in [4096usize, 16384, 131072, 1 << 20] {
            let held: Vec<Box<[u8]>> = (0..64).map(|i| vec![i as u8; len].into_boxed_slice()).collect();
            for b in &held {
                assert!(
                    (b.as_ptr() as usize).is_multiple_of(4096),
                    "a {len}-byte buffer at {:p}",
                    b.as_ptr()
                );
            }
        }
    }
}
