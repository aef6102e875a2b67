//! `arcache s3 break-lease URI [--force]`: frees a chunked disk whose
//! writer is gone (docs/s3-backing.md, section 5, "Lease").

use std::time::Duration;

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
    /// may write the disk. Refused while the holder renewed it within the
    /// last minute (it looks alive) unless --force.
    BreakLease {
        uri: String,
        #[arg(long)]
        force: bool,
    },
}

/// A holder renews every 10 s; six missed renewals mean it is gone or cut
/// off from the bucket.
const ALIVE_WITHIN: Duration = Duration::from_secs(60);

pub fn run(a: &S3Args) -> Result<()> {
    match &a.cmd {
        S3Cmd::BreakLease { uri, force } => {
            let loc = arcache_s3::S3Location::parse(uri)?;
            if !loc.is_prefix() {
                return Err(anyhow!("{uri}: a lease belongs to a chunked disk, s3://BUCKET/PREFIX/"));
            }
            let creds = arcache_s3::S3Settings::default().resolve().map_err(|e| anyhow!("{uri}: {e}"))?;
            let said = arcache_s3::break_lease(&loc, &creds, *force, ALIVE_WITHIN).map_err(|e| anyhow!(e))?;
            println!("{said}");
            Ok(())
        }
    }
}
