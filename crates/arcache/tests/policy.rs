//! `serve --policy`: the server runs the replacement policy it is given,
//! says which in `stat --json`, and refuses names it cannot run.

mod common;

use common::*;

fn serve_with(policy: Option<&str>) -> Serve {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    random_file(&img, 4 << 20, 5);
    let mut args = vec!["--export".to_string(), img.display().to_string(), "--arc-max".into(), "64M".into()];
    if let Some(p) = policy {
        args.extend(["--policy".into(), p.into()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Serve::start(dir, &args)
}

#[test]
fn the_policy_given_is_the_policy_run_and_reported() {
    for (given, runs) in [
        (None, "arc-adaptive"),
        (Some("arc"), "arc"),
        (Some("lru"), "lru"),
        (Some("arc-adaptive"), "arc-adaptive"),
    ] {
        let s = serve_with(given);
        let mut c = nbd::Client::connect(&s.target(), "").unwrap();
        let mut buf = vec![0u8; 65536];
        c.read(0, &mut buf).unwrap();
        c.read(0, &mut buf).unwrap();
        let st = s.stat();
        assert_eq!(st["policy"], runs, "{given:?}: {st}");
        assert!(st["hits"].as_u64().unwrap() > 0, "{given:?}: the second read hits: {st}");
        if runs == "lru" {
            assert_eq!(st["mfu_size"].as_u64(), Some(0), "LRU has one list");
        }
        s.stop();
    }
}

#[test]
fn a_policy_the_server_cannot_run_is_refused_with_the_names_it_can() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("disk.img");
    random_file(&img, 1 << 20, 5);
    for (name, expect) in [("arc-paper", "counts entries"), ("nope", "choose one of arc-adaptive, arc, lru")]
    {
        let err = serve_refused(dir.path(), &["--export", img.to_str().unwrap(), "--policy", name]);
        assert!(err.contains(expect) && err.contains(name), "{name}: {err}");
    }
}
