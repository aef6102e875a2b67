//! Puts the commit a binary was built from into `arcache --version`, so a
//! benchmark can say which code each arm ran rather than trust a file name
//! (a copied binary once carried the wrong commit into an A/B).

use std::path::Path;
use std::process::Command;

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    // Any source edit can change "-dirty"; HEAD and the index change with a
    // commit or checkout. A directory is scanned for changes as a whole.
    for watched in ["crates", "Cargo.toml", "Cargo.lock", ".git/HEAD", ".git/index"] {
        let path = root.join(watched);
        if path.exists() {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    println!("cargo:rerun-if-env-changed=ARCACHE_BUILD_COMMIT");
    let commit = std::env::var("ARCACHE_BUILD_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
        .or_else(|| commit_of(&root))
        .unwrap_or_else(|| "unknown".to_owned());
    println!("cargo:rustc-env=ARCACHE_BUILD_COMMIT={commit}");
}

/// `git rev-parse --short HEAD`, with "-dirty" when tracked files differ
/// from it; None outside a git checkout (a source tarball).
fn commit_of(root: &Path) -> Option<String> {
    let git = |args: &[&str]| Command::new("git").arg("-C").arg(root).args(args).output().ok();
    let head = git(&["rev-parse", "--short", "HEAD"]).filter(|o| o.status.success())?;
    let mut commit = String::from_utf8(head.stdout).ok()?.trim().to_owned();
    let _ = git(&["update-index", "-q", "--refresh"]);
    let clean = git(&["diff", "--quiet", "HEAD", "--", ".", ":(exclude)bench/results"])
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !clean {
        commit.push_str("-dirty");
    }
    Some(commit)
}
