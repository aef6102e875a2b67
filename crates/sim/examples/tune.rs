//! Developer tool: arc-adaptive against max(LRU, textbook ARC) at every
//! reference point and on sets of synthetic traces. Not a test: the
//! numbers are for choosing constants, the tests pin what is chosen.
//!
//! Usage: tune REFERENCE_DIR|- [SET_DIR ...]
//!
//! The reference file's points come as two sets: its `4k` points (issue
//! 20's bar) and its `4k-r` points (the same traces' reads alone), which
//! a change can move far where the `4k` ones barely move.
//!
//! A SET_DIR holds `NAME.csv.gz` traces and a `sizes.txt` of `NAME
//! SIZE,SIZE,...` lines (what traces/tools/synthetic.py and
//! random_family.py write). LRU's and textbook ARC's hit counts do not
//! change while arc-adaptive is tuned, so they are kept in
//! `TUNE_BASELINE` (a file of `TRACE_PATH SIZE LRU ARC` lines) when that is
//! set. Points run on two threads.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use arc_policy::by_name;
use arcache_sim::{on_threads, read_accesses, reference_traces_in, replay, BlockAccess};

fn hits(name: &str, size: u64, acc: &[BlockAccess]) -> u64 {
    let mut p = by_name(name, size).expect("policy");
    replay(p.as_mut(), size, acc).hits
}

fn load(path: &Path, reads_only: bool) -> Vec<BlockAccess> {
    read_accesses(path, 4096, reads_only).expect("trace")
}

/// One trace of a set: its label, file and cache sizes.
struct Job {
    set: usize,
    label: String,
    path: PathBuf,
    sizes: Vec<u64>,
    reads_only: bool,
}

/// One point's result: arc-adaptive's hit ratio and its gap to max(LRU, ARC), in %.
struct Point {
    set: usize,
    label: String,
    size: u64,
    adaptive: f64,
    gap: f64,
}

/// The reference points: `4k` as set 0, `4k-r` as set 1.
fn reference_jobs(dir: &Path) -> Vec<Job> {
    let mut jobs = Vec::new();
    for (set, mode) in ["4k", "4k-r"].into_iter().enumerate() {
        let traces = reference_traces_in(dir, mode).expect("reference traces");
        jobs.extend(traces.into_iter().map(|t| Job {
            set,
            label: t.name,
            path: t.path,
            sizes: t.sizes,
            reads_only: mode == "4k-r",
        }));
    }
    jobs
}

fn set_jobs(set: usize, dir: &Path) -> Vec<Job> {
    let list = std::fs::read_to_string(dir.join("sizes.txt")).expect("sizes.txt");
    list.lines()
        .map(|line| {
            let (name, sizes) = line.split_once(' ').expect("line");
            Job {
                set,
                label: name.to_string(),
                path: dir.join(format!("{name}.csv.gz")),
                sizes: sizes.split(',').filter_map(|s| s.parse().ok()).collect(),
                reads_only: false,
            }
        })
        .collect()
}

type Baseline = HashMap<(String, u64), (u64, u64)>;

fn read_baseline(path: Option<&str>) -> Baseline {
    let Some(text) = path.and_then(|p| std::fs::read_to_string(p).ok()) else { return Baseline::new() };
    text.lines()
        .filter_map(|l| {
            // From the right: a trace's path may hold spaces.
            let mut f = l.rsplitn(4, ' ');
            let (arc, lru, size) =
                (f.next()?.parse().ok()?, f.next()?.parse().ok()?, f.next()?.parse().ok()?);
            Some(((f.next()?.to_string(), size), (lru, arc)))
        })
        .collect()
}

fn run(job: &Job, base: &Mutex<Baseline>) -> Vec<Point> {
    let acc = load(&job.path, job.reads_only);
    let n = acc.len() as f64;
    // By the trace's file, not its set's place on the command line: one
    // baseline then serves runs that name the sets in any order.
    let mode = if job.reads_only { " (reads)" } else { "" };
    let key = |s: u64| (format!("{}{mode}", job.path.display()), s);
    job.sizes
        .iter()
        .map(|&s| {
            let known = base.lock().expect("lock").get(&key(s)).copied();
            let (l, p) = known.unwrap_or_else(|| {
                let computed = (hits("lru", s, &acc), hits("arc-paper", s, &acc));
                base.lock().expect("lock").insert(key(s), computed);
                computed
            });
            let a = hits("arc-adaptive", s, &acc) as f64 / n * 100.0;
            let better = l.max(p) as f64 / n * 100.0;
            Point { set: job.set, label: job.label.clone(), size: s, adaptive: a, gap: a - better }
        })
        .collect()
}

fn summary(name: &str, v: &[&Point]) {
    if v.is_empty() {
        return;
    }
    let mean = v.iter().map(|x| x.adaptive).sum::<f64>() / v.len() as f64;
    if std::env::var_os("TUNE_ALL").is_some() {
        for p in v {
            println!("  {} {} {:.2} {:+.2}", p.label, p.size, p.adaptive, p.gap);
        }
    }
    let below = v.iter().filter(|x| x.gap < -1.0).count();
    let mut worst: Vec<&&Point> = v.iter().collect();
    worst.sort_by(|a, b| a.gap.total_cmp(&b.gap));
    let w: Vec<String> =
        worst.iter().take(4).map(|p| format!("{:+.2} {} {}", p.gap, p.label, p.size)).collect();
    println!("{name}: mean {mean:.2}, {below} of {} below 1 pp; worst {}", v.len(), w.join(", "));
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mut jobs = if args[1] == "-" { Vec::new() } else { reference_jobs(Path::new(&args[1])) };
    for (i, d) in args[2..].iter().enumerate() {
        jobs.extend(set_jobs(i + 2, Path::new(d)));
    }
    let base_path = std::env::var("TUNE_BASELINE").ok();
    let base = Mutex::new(read_baseline(base_path.as_deref()));
    let points = on_threads(&jobs, 2, |job| run(job, &base));
    if let Some(p) = base_path {
        let b = base.into_inner().expect("lock");
        let text: String = b.iter().map(|((l, s), (x, y))| format!("{l} {s} {x} {y}\n")).collect();
        std::fs::write(p, text).expect("baseline");
    }
    let names =
        ["reference".to_string(), "reference 4k-r".to_string()].into_iter().chain(args[2..].iter().cloned());
    for (set, name) in names.enumerate() {
        summary(&name, &points.iter().filter(|p| p.set == set).collect::<Vec<_>>());
    }
}
