//! `arcache log dump|forget`: inspect or empty an intent log device offline,
//! and `arcache flush`: sync a transaction group of a running server now.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use blockdev::{BlockDev, DevLock, FileDev, FileDevOptions};
use clap::{Args, Subcommand};
use zil::{Entry, IntentLog};

use crate::control::{call, Request};
use crate::ControlArg;

#[derive(Debug, Args)]
pub struct LogArgs {
    #[command(subcommand)]
    cmd: LogCmd,
}

#[derive(Debug, Subcommand)]
enum LogCmd {
    /// Print an intent log's header and the writes it would replay (`-v`: every entry).
    Dump {
        path: PathBuf,
        #[arg(short, action = clap::ArgAction::Count)]
        verbose: u8,
    },
    /// Drop an intent log's contents: its unsynced writes are lost for good.
    Forget { path: PathBuf },
}

fn open(path: &Path, write: bool) -> Result<Arc<dyn BlockDev>> {
    // Changing a device a server holds would corrupt it: wait for none.
    let lock = if write { DevLock::Exclusive } else { DevLock::None };
    let opts =
        FileDevOptions { direct: false, read_only: !write, create_size: None, lock, ..Default::default() };
    let dev = FileDev::open(path, opts).with_context(|| format!("opening {}", path.display()))?;
    Ok(Arc::new(dev))
}

pub fn run(a: &LogArgs) -> Result<()> {
    match &a.cmd {
        LogCmd::Dump { path, verbose } => dump(path, *verbose),
        LogCmd::Forget { path } => {
            zil::forget(open(path, true)?)?;
            println!("{}: intent log emptied; its unsynced writes are gone", path.display());
            Ok(())
        }
    }
}

fn dump(path: &Path, verbose: u8) -> Result<()> {
    let dev = open(path, false)?;
    let Some(h) = zil::read_header(dev.as_ref())? else {
        bail!("{}: no valid intent log header", path.display());
    };
    println!("intent log {}", path.display());
    println!("  uuid:         {:032x}", h.uuid);
    println!("  incarnation:  {}", h.incarnation);
    println!("  header_seq:   {}", h.header_seq);
    println!("  capacity:     {}", h.capacity);
    println!("  tail:         lpos {} seq {}", h.tail_lpos, h.tail_seq);
    for e in &h.exports {
        println!("  export {}: {:?} size {} identity {:016x}", e.id, e.name, e.size, e.identity);
    }
    println!("  last owner:   {}", h.owner.describe());
    println!("  held now:     {}", crate::held_now(path));
    let log = IntentLog::open(dev, h.exports.clone())?;
    let (mut pages, mut discards, mut bytes) = (0u64, 0u64, 0u64);
    let stats = log.replay(&|_| true, &mut |x, e| {
        match e {
            Entry::Page { page, mask, data, .. } => {
                pages += 1;
                bytes += data.len() as u64;
                if verbose > 0 {
                    println!("    PAGE  {:?} offset {} sectors {mask:08b}", x.name, page * 4096);
                }
            }
            Entry::Zero { offset, len, .. } | Entry::Trim { offset, len, .. } => {
                discards += 1;
                if verbose > 0 {
                    let kind = if matches!(e, Entry::Zero { .. }) { "ZERO" } else { "TRIM" };
                    println!("    {kind}  {:?} offset {offset} length {len}", x.name);
                }
            }
        }
        Ok(())
    })?;
    println!("chunks: {}  pages: {pages} ({bytes} bytes)  trims/zeroings: {discards}", stats.chunks);
    println!(
        "{}",
        if stats.chunks == 0 { "nothing to replay" } else { "these writes are replayed at the next start" }
    );
    Ok(())
}

#[derive(Debug, Args)]
pub struct FlushArgs {
    #[command(flatten)]
    control: ControlArg,
}

/// Forces a transaction group of a running server and waits for it.
pub fn flush(a: &FlushArgs) -> Result<()> {
    let v = call(&a.control.path(), &Request::Flush)?;
    println!(
        "transaction group {} synced in {} ms",
        v.get("txg").and_then(|x| x.as_u64()).unwrap_or(0),
        v.get("ms").and_then(|x| x.as_u64()).unwrap_or(0)
    );
    Ok(())
}
