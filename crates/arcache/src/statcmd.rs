//! Clients of the control socket: `stat`, `get`, `set`.

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::Value;

use crate::control::{call, Request};
use crate::size::human;
use crate::ControlArg;

#[derive(Debug, Args)]
pub struct StatArgs {
    /// Print one JSON object with every counter.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub control: ControlArg,
}

#[derive(Debug, Args)]
pub struct GetArgs {
    /// The tunable to print.
    #[arg(required_unless_present = "all")]
    pub name: Option<String>,
    /// Print every tunable with its default, unit and description.
    #[arg(long)]
    pub all: bool,
    #[command(flatten)]
    pub control: ControlArg,
}

#[derive(Debug, Args)]
pub struct SetArgs {
    /// NAME=VALUE, e.g. zfs_arc_max=4G.
    pub assignment: String,
    #[command(flatten)]
    pub control: ControlArg,
}

pub fn stat(a: &StatArgs) -> Result<()> {
    let v = call(&a.control.path(), &Request::Stat)?;
    if a.json {
        println!("{}", serde_json::to_string(&v)?);
        return Ok(());
    }
    let n = |k: &str| v.get(k).and_then(Value::as_u64).unwrap_or(0);
    let reads = n("hits") + n("iohits") + n("misses");
    let pct = |x: u64| {
        if reads == 0 {
            0.0
        } else {
            100.0 * x as f64 / reads as f64
        }
    };
    println!(
        "{:>10} {:>6} {:>6} {:>8} {:>8} {:>8} {:>8}",
        "read", "hit%", "miss%", "arcsz", "c", "mfu", "mru"
    );
    println!(
        "{:>10} {:>6.1} {:>6.1} {:>8} {:>8} {:>8} {:>8}",
        reads,
        pct(n("hits") + n("iohits")),
        pct(n("misses")),
        human(n("size")),
        human(n("c")),
        human(n("mfu_size")),
        human(n("mru_size"))
    );
    Ok(())
}

pub fn get(a: &GetArgs) -> Result<()> {
    let path = a.control.path();
    if a.all {
        let v = call(&path, &Request::GetAll)?;
        let rows = v.as_array().context("get --all returns a list")?;
        println!("{:<28} {:>14} {:>14} {:<12} description", "name", "value", "default", "unit");
        for r in rows {
            println!(
                "{:<28} {:>14} {:>14} {:<12} {}",
                r["name"].as_str().unwrap_or(""),
                r["text"].as_str().unwrap_or(""),
                r["default"],
                r["unit"].as_str().unwrap_or(""),
                r["description"].as_str().unwrap_or("")
            );
        }
        return Ok(());
    }
    let Some(name) = &a.name else { bail!("give a tunable name or --all") };
    let v = call(&path, &Request::Get { name: name.clone() })?;
    println!("{}", v["text"].as_str().unwrap_or(""));
    Ok(())
}

pub fn set(a: &SetArgs) -> Result<()> {
    let Some((name, value)) = a.assignment.split_once('=') else {
        bail!("expected NAME=VALUE, got {:?}", a.assignment);
    };
    let v = call(&a.control.path(), &Request::Set { name: name.trim().into(), value: value.trim().into() })?;
    println!("{} = {}", v["name"].as_str().unwrap_or(name), v["text"].as_str().unwrap_or(""));
    Ok(())
}
