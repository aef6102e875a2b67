//! The pieces of the `arcache` program. A library as well as a binary so
//! fuzz targets can reach the parsers the binary uses.

pub mod advice;
pub mod arcstat;
pub mod config;
mod contents;
pub mod control;
pub mod demo;
pub mod exports;
pub mod l2cmd;
pub mod logcmd;
pub mod metrics;
pub mod mount;
pub mod mrccmd;
pub mod plot;
pub mod recorder;
pub mod s3cmd;
pub mod serve;
pub mod simcmd;
pub mod size;
pub mod startup;
pub mod statcmd;
pub mod summary;
pub mod tunables;

use std::path::PathBuf;

/// The `--control PATH` option shared by the client subcommands.
#[derive(Debug, clap::Args, Clone)]
pub struct ControlArg {
    /// The server's control socket (default: the runtime directory's).
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
}

impl ControlArg {
    pub fn path(&self) -> PathBuf {
        self.control.clone().unwrap_or_else(config::default_control_path)
    }
}

/// Whether a server holds `path` now, for the dumps.
pub fn held_now(path: &std::path::Path) -> String {
    blockdev::current_holder(path)
        .map_or_else(|| "no (no server has it open)".into(), |h| format!("yes, by {h}"))
}
