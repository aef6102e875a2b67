//! `arcache s3 break-lease URI [--force]`: frees a chunked disk whose
//! writer is gone (docs/s3-backing.md, section 5, "Lease"); `s3 show`
//! prints a chunked disk as the bucket holds it; `s3 create` makes one
//! without serving it.

use anyhow::{anyhow, Result};
use clap::{Args, Subcommand};

#[derive(Debug, Args)]
pub struct S3Args {
    #[command(subcommand)]
    cmd: S3Cmd,
}

#[derive(Debug, Subcommand)]
enum S3Cmd {
    /// Mark the lease of s3://BUCKET/PREFIX/ released, so another server
    /// may write the disk. Refused while the holder renewed it within six
    /// of its renewal periods (a minute by default: it looks alive) unless
    /// --force.
    BreakLease {
        uri: String,
        #[arg(long)]
        force: bool,
    },
    /// Print the chunked disk s3://BUCKET/PREFIX/: its manifest (size,
    /// chunk size, id), who holds its lease and when it was last renewed
    /// (by S3's clock), and the chunks stored.
    Show {
        uri: String,
        /// One JSON object instead of lines for people.
        #[arg(long)]
        json: bool,
    },
    /// Make the chunked disk s3://BUCKET/PREFIX/?size=SIZE[&chunk=SIZE]
    /// (its manifest) without serving it; a disk already there with the
    /// same size and chunk size is left as it is, another is an error.
    Create { uri: String },
}

pub fn run(a: &S3Args) -> Result<()> {
    match &a.cmd {
        S3Cmd::BreakLease { uri, force } => {
            let loc = arcache_s3::S3Location::parse(uri)?;
            if !loc.is_prefix() {
                return Err(anyhow!("{uri}: a lease belongs to a chunked disk, s3://BUCKET/PREFIX/"));
            }
            let creds = arcache_s3::S3Settings::default().resolve().map_err(|e| anyhow!("{uri}: {e}"))?;
            let said = arcache_s3::break_lease(&loc, &creds, *force).map_err(|e| anyhow!(e))?;
            println!("{said}");
            Ok(())
        }
        S3Cmd::Show { uri, json } => show(uri, *json),
        S3Cmd::Create { uri } => create(uri),
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn show(uri: &str, json: bool) -> Result<()> {
    let loc = arcache_s3::S3Location::parse(uri)?;
    let creds = arcache_s3::S3Settings::default().resolve().map_err(|e| anyhow!("{uri}: {e}"))?;
    let d = arcache_s3::show(&loc, &creds).map_err(|e| anyhow!(e))?;
    let m = &d.manifest;
    let lease = d.lease.as_ref().map(|(l, age)| {
        serde_json::json!({
            "state": if l.held { "held" } else { "released" },
            "host": l.host,
            "pid": l.pid,
            "acquired_ms": l.acquired_ms,
            "renewed_ms": l.renewed_ms,
            "renewals": l.renewals,
            "renew_period_ms": l.renew_period_ms,
            "generation": l.generation,
            "written_secs_ago": age.as_secs(),
        })
    });
    if json {
        let v = serde_json::json!({
            "disk": loc.to_string(),
            "disk_uuid": hex(&m.disk_uuid),
            "size": m.size,
            "chunk_size": m.chunk_size,
            "created": m.created,
            "chunks_stored": d.chunks,
            "bytes_stored": d.stored_bytes,
            "lease": lease,
            "head_generation": d.head.as_ref().and_then(|h| h.as_ref().ok()).map(|h| h.0),
            "head_entries": d.head.as_ref().and_then(|h| h.as_ref().ok()).map(|h| h.1),
            "head_error": d.head.as_ref().and_then(|h| h.as_ref().err()),
        });
        println!("{v}");
        return Ok(());
    }
    println!("disk {loc}");
    println!(
        "  id {}  size {}  chunk size {}  created {} (unix time)",
        hex(&m.disk_uuid),
        m.size,
        m.chunk_size,
        m.created
    );
    let total = m.size.div_ceil(m.chunk_size);
    println!(
        "  chunks stored {} of {total}, {} bytes (a chunk never written is not stored)",
        d.chunks, d.stored_bytes
    );
    match &d.head {
        None => println!("  head: none (no generation committed yet)"),
        Some(Ok((generation, entries))) => {
            println!(
                "  head: generation {generation}, listing {entries} chunk changes of the last generations"
            )
        }
        Some(Err(e)) => println!("  head: does not decode: {e}"),
    }
    match &d.lease {
        None => println!("  lease: never taken"),
        Some((l, age)) => println!(
            "  lease: {} by host {} pid {}, written {} s ago by S3's clock, {} renewals every {} ms",
            if l.held { "held" } else { "released" },
            l.host,
            l.pid,
            age.as_secs(),
            l.renewals,
            l.renew_period_ms
        ),
    }
    Ok(())
}

fn create(uri: &str) -> Result<()> {
    let loc = arcache_s3::S3Location::parse(uri)?;
    let size = loc
        .size
        .as_deref()
        .map(crate::size::parse_size)
        .transpose()?
        .ok_or_else(|| anyhow!("{uri}: give the disk's size: {loc}?size=SIZE"))?;
    let chunk = loc.chunk.as_deref().map(crate::size::parse_size).transpose()?;
    let creds = arcache_s3::S3Settings::default().resolve().map_err(|e| anyhow!("{uri}: {e}"))?;
    let (m, made) = arcache_s3::create(&loc, &creds, size, chunk).map_err(|e| anyhow!(e))?;
    let what = if made { "made" } else { "already there:" };
    println!("{loc}: {what} a disk of {} bytes in chunks of {}", m.size, m.chunk_size);
    Ok(())
}
