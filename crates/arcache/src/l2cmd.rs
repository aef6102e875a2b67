//! `arcache l2 dump|forget`: inspect or empty a cache device offline, like
//! `zdb -l` on a ZFS cache vdev.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use arcache_l2::format::{EntryKind, Header, LogPtr};
use arcache_l2::{read_header, walk, HeaderRead, L2Device, WalkEnd};
use blockdev::{DevLock, FileDev, FileDevOptions};
use clap::{Args, Subcommand};

#[derive(Debug, Args)]
pub struct L2Args {
    #[command(subcommand)]
    cmd: L2Cmd,
}

#[derive(Debug, Subcommand)]
enum L2Cmd {
    /// Print a cache device's header and log: `-v` lists the log blocks,
    /// `-vv` every entry. Exits 1 when the structure is inconsistent.
    Dump {
        path: PathBuf,
        #[arg(short, action = clap::ArgAction::Count)]
        verbose: u8,
    },
    /// Drop a cache device's contents: the next start begins empty. With
    /// --export, only those exports' records (say, of an RBD image rolled
    /// back to a snapshot); the others are kept.
    Forget {
        path: PathBuf,
        /// An export's name as `l2 dump` lists it; repeatable.
        #[arg(long = "export", value_name = "NAME")]
        exports: Vec<String>,
    },
}

fn open(path: &Path, write: bool) -> Result<L2Device> {
    // Changing a device a server holds would corrupt it: wait for none.
    let lock = if write { DevLock::Exclusive } else { DevLock::None };
    let opts =
        FileDevOptions { direct: false, read_only: !write, create_size: None, lock, ..Default::default() };
    let dev = FileDev::open(path, opts).with_context(|| format!("opening {}", path.display()))?;
    L2Device::new(path.display().to_string(), Arc::new(dev)).map_err(anyhow::Error::msg)
}

/// Exit status 1 (inconsistent) without an error message of its own.
#[derive(Debug)]
pub struct Inconsistent;

impl std::fmt::Display for Inconsistent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the device's structure is inconsistent")
    }
}

impl std::error::Error for Inconsistent {}

pub fn run(a: &L2Args) -> Result<()> {
    match &a.cmd {
        L2Cmd::Dump { path, verbose } => dump(path, *verbose),
        L2Cmd::Forget { path, exports } if exports.is_empty() => {
            let dev = open(path, true)?;
            arcache_l2::forget(&dev).map_err(anyhow::Error::msg)?;
            println!("{}: contents forgotten; the next start begins empty", path.display());
            Ok(())
        }
        L2Cmd::Forget { path, exports } => {
            let dev = open(path, true)?;
            arcache_l2::forget_exports(&dev, exports).map_err(anyhow::Error::msg)?;
            println!(
                "{}: records of {} forgotten; the other exports' are kept",
                path.display(),
                exports.join(", ")
            );
            Ok(())
        }
    }
}

fn ptr(p: &LogPtr) -> String {
    if p.is_none() {
        "none".into()
    } else {
        format!("seq {} lpos {} asize {} cksum {:016x}", p.seq, p.lpos, p.asize, p.cksum)
    }
}

fn print_header(h: &Header) {
    let mut flags = Vec::new();
    if h.persistent() {
        flags.push("PERSISTENT");
    }
    if h.flags & arcache_l2::format::FLAG_FIRST_PASS != 0 {
        flags.push("FIRST_PASS");
    }
    println!("device header (header_seq {}):", h.header_seq);
    println!("  magic        ACRL2HDR, version {}", arcache_l2::format::VERSION);
    println!("  uuid         {:032x}", h.uuid);
    println!("  incarnation  {:016x}", h.incarnation);
    println!("  flags        {}", if flags.is_empty() { "-".into() } else { flags.join(",") });
    println!("  device_size  {}", h.device_size);
    println!("  start        {}", h.start);
    println!("  capacity     {}", h.capacity);
    println!("  hand_lpos    {}", h.hand_lpos);
    println!("  evict_lpos   {}", h.evict_lpos);
    println!("  next_seq     {}", h.next_seq);
    println!("  horizon_seq  {}", h.horizon_seq);
    println!("  newest[0]    {}", ptr(&h.newest[0]));
    println!("  newest[1]    {}", ptr(&h.newest[1]));
    println!("  lb_count     {}", h.lb_count);
    println!("  lb_asize     {}", h.lb_asize);
    println!("  exports      {}", h.exports.len());
    for e in &h.exports {
        println!(
            "    tag {} {:?}: size {} recordsize {} identity {:016x} contents {:016x}",
            e.tag, e.name, e.size, e.recordsize, e.identity, e.contents
        );
    }
    println!("  last owner   {}", h.owner.describe());
    // Other devices' logs this one's header says never to restore
    // (docs/format.md, "Abandoned-logs block").
    println!("  abandoned    {}", h.abandoned.len());
    for a in &h.abandoned {
        println!("    device {:032x} incarnation {:016x}", a.uuid, a.incarnation);
    }
}

fn dump(path: &Path, verbose: u8) -> Result<()> {
    let dev = open(path, false)?;
    println!("L2 device {}: {} bytes", path.display(), dev.size());
    let h = match read_header(&dev) {
        HeaderRead::Valid(h) => h,
        HeaderRead::Blank => {
            println!("L2 device header not found");
            return Err(Inconsistent.into());
        }
        HeaderRead::Damaged(e) | HeaderRead::Unsupported(e) | HeaderRead::IoError(e) => {
            println!("L2 device header unusable: {e}");
            return Err(Inconsistent.into());
        }
    };
    print_header(&h);
    println!("  held now     {}", crate::held_now(path));
    if !h.persistent() {
        println!("no persistent log (device not persistent)");
        return Ok(());
    }
    if h.newest[0].is_none() {
        println!("no log blocks to read");
    }
    let seed = arcache_l2::format::log_seed(h.uuid, h.incarnation);
    let (mut valid, mut asize, mut cached, mut invalidations) = (0u64, 0u64, 0u64, 0u64);
    if verbose >= 1 {
        println!("log blocks, newest first:");
    }
    let end = walk(&dev, &h, seed, |p, blk| {
        valid += 1;
        asize += u64::from(p.asize);
        let c = blk.entries.iter().filter(|e| e.kind == EntryKind::Cached).count() as u64;
        cached += c;
        invalidations += blk.entries.len() as u64 - c;
        if verbose >= 1 {
            println!(
                "  lb seq {} lpos {} address {} payload {}..{} entries {} (cached {}, invalidate {}) asize {} {} cksum ok",
                p.seq,
                p.lpos,
                h.start + p.lpos % h.capacity,
                blk.payload_start,
                p.lpos,
                blk.entries.len(),
                c,
                blk.entries.len() as u64 - c,
                p.asize,
                if blk.compressed { "lz4" } else { "uncompressed" },
            );
        }
        if verbose >= 2 {
            for (i, e) in blk.entries.iter().enumerate() {
                match e.kind {
                    EntryKind::Cached => println!(
                        "    le[{i}] cached tag {} record {} lpos {} psize {} lsize {} flags {:#x} cksum {:016x}",
                        e.tag,
                        e.record,
                        e.lpos_or_count,
                        u64::from(e.blob_sectors) * 512,
                        4096u64 << e.lshift.min(20),
                        e.flags,
                        e.cksum
                    ),
                    EntryKind::Invalidate => println!(
                        "    le[{i}] invalidate tag {} records {}..{}",
                        e.tag,
                        e.record,
                        e.record.saturating_add(e.lpos_or_count)
                    ),
                }
            }
        }
        true
    });
    let invalid = match &end {
        WalkEnd::Done => 0,
        WalkEnd::IoError(e) | WalkEnd::BadBlock(e) => {
            println!("walk stopped: {e}");
            1
        }
    };
    println!("log_blk_count: {valid} with valid cksum / {invalid} with invalid cksum");
    println!("log_blk_asize: {asize}");
    println!("entries: {cached} cached, {invalidations} invalidations");
    let mut ok = invalid == 0;
    if h.lb_count != valid || h.lb_asize != asize {
        println!(
            "inconsistent: the header counts {} log blocks ({} bytes), the walk found {valid} ({asize} bytes)",
            h.lb_count, h.lb_asize
        );
        ok = false;
    }
    if !ok {
        bail!(Inconsistent);
    }
    Ok(())
}
