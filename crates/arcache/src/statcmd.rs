//! Clients of the control socket: `stat`, `get`, `set`.

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::Value;

use crate::arcstat;
use crate::control::{call, Request};
use crate::ControlArg;

#[derive(Debug, Args)]
pub struct StatArgs {
    /// Seconds between lines; without it, one line of counts since start.
    pub interval: Option<f64>,
    /// Number of lines (default: until interrupted, with an interval).
    pub count: Option<u64>,
    /// Columns to show, comma-separated (arcstat names; `-v` lists them).
    #[arg(short = 'f', long = "fields", value_delimiter = ',')]
    pub fields: Vec<String>,
    /// List the available columns with their meaning.
    #[arg(short = 'v', long)]
    pub verbose: bool,
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
    if a.verbose {
        for f in arcstat::FIELDS {
            println!("{:<9} {}", f.name, f.description);
        }
        return Ok(());
    }
    let path = a.control.path();
    if a.json {
        println!("{}", serde_json::to_string(&call(&path, &Request::Stat)?)?);
        return Ok(());
    }
    let mut first = call(&path, &Request::Stat)?;
    let names: Vec<String> = if a.fields.is_empty() {
        let mut d: Vec<String> = arcstat::DEFAULT_FIELDS.iter().map(|s| s.to_string()).collect();
        if first.get("l2_ndev").and_then(Value::as_u64).unwrap_or(0) > 0 {
            d.extend(arcstat::L2_FIELDS.iter().map(|s| s.to_string()));
        }
        d
    } else {
        a.fields.clone()
    };
    let fields = names
        .iter()
        .map(|n| {
            arcstat::find(n).with_context(|| format!("unknown field {n:?}; `arcache stat -v` lists them"))
        })
        .collect::<Result<Vec<_>>>()?;
    let header: Vec<String> = fields.iter().map(|f| format!("{:>w$}", f.name, w = f.width())).collect();
    println!("{}", header.join(" "));
    let line = |prev: Option<&Value>, now: &Value, secs: f64| {
        let clock = clock_now();
        let cols: Vec<String> = fields
            .iter()
            .map(|f| format!("{:>w$}", f.value(prev, now, secs, &clock), w = f.width()))
            .collect();
        println!("{}", cols.join(" "));
    };
    let Some(interval) = a.interval else {
        let up = first.get("uptime_secs").and_then(Value::as_f64).unwrap_or(1.0);
        line(None, &first, up);
        return Ok(());
    };
    if interval.is_nan() || interval <= 0.0 {
        bail!("interval must be positive");
    }
    let mut printed = 0;
    while a.count.is_none_or(|c| printed < c) {
        let started = std::time::Instant::now();
        std::thread::sleep(std::time::Duration::from_secs_f64(interval));
        let now = call(&path, &Request::Stat)?;
        line(Some(&first), &now, started.elapsed().as_secs_f64());
        first = now;
        printed += 1;
    }
    Ok(())
}

fn clock_now() -> String {
    let secs =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    format!("{:02}:{:02}:{:02}", secs / 3600 % 24, secs / 60 % 60, secs % 60)
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
