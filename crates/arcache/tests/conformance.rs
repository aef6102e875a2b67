//! NBD conformance of the real server, checked by
//! `tests/conformance/nbd_conformance.py` (python3-libnbd and a raw-socket
//! client, written from the protocol document): block status, fast zero,
//! errors and limits the protocol asks for, and a verified replay of mixed
//! requests of up to 64 MiB.

mod common;

use std::path::Path;
use std::process::Command;

use common::Serve;

const SIZE: u64 = 160 << 20;
/// Where the image holds data; the rest is a hole.
const DATA: [(u64, u64); 3] = [(0, 1 << 20), (8 << 20, 1 << 20), (100 << 20, 64 << 10)];

fn sparse_image(path: &Path) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::create(path).unwrap();
    f.set_len(SIZE).unwrap();
    for (i, &(off, len)) in DATA.iter().enumerate() {
        f.write_all_at(&vec![0x11 * (i as u8 + 1); len as usize], off).unwrap();
    }
    f.sync_all().unwrap();
}

/// Debian's python3 with python3-libnbd (installed by `.ci/run`).
fn python_with_libnbd() -> &'static str {
    let py = "/usr/bin/python3";
    let ok = Command::new(py).args(["-c", "import nbd"]).status().is_ok_and(|s| s.success());
    assert!(ok, "{py} cannot import nbd: apt-get install python3-libnbd (.ci/run does)");
    py
}

#[test]
fn the_server_meets_the_protocol_document() {
    let py = python_with_libnbd();
    let rw_dir = tempfile::tempdir().unwrap();
    let ro_dir = tempfile::tempdir().unwrap();
    let (rw_img, ro_img) = (rw_dir.path().join("rw.img"), ro_dir.path().join("ro.img"));
    sparse_image(&rw_img);
    sparse_image(&ro_img);
    let rw = Serve::start(rw_dir, &["--export", rw_img.to_str().unwrap(), "--arc-max", "512M"]);
    let ro = Serve::start(ro_dir, &["--export", ro_img.to_str().unwrap(), "--read-only", "--arc-max", "64M"]);
    let layout: Vec<String> = DATA.iter().map(|(o, l)| format!("{o}:{l}")).collect();
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/conformance/nbd_conformance.py");
    let out = Command::new(py)
        .arg(script)
        .arg(&rw.sock)
        .arg(&ro.sock)
        .arg(SIZE.to_string())
        .arg(layout.join(","))
        .output()
        .expect("run the conformance script");
    let text = String::from_utf8_lossy(&out.stdout);
    println!("{text}");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success(),
        "conformance checks failed:\n{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains(" passed, 0 failed"), "no summary line:\n{text}");
    rw.stop();
    ro.stop();
}

/// nbdcopy uses the block-status map: copying a 1 GiB image that holds
/// 64 MiB of data reads about that much from the backing store (a dense
/// copy would read all 1 GiB), and the copy is exact.
#[test]
fn nbdcopy_skips_the_holes_block_status_reports() {
    common::need("nbdcopy");
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("sparse.img");
    let copy = dir.path().join("copy.img");
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::create(&img).unwrap();
        f.set_len(1 << 30).unwrap();
        // 64 MiB of data in 16 pieces of 4 MiB spread over the image.
        for i in 0..16u64 {
            let piece: Vec<u8> = (0..4u64 << 20).map(|b| (b * 31 + i * 7) as u8).collect();
            f.write_all_at(&piece, i * (64 << 20) + (1 << 20)).unwrap();
        }
    }
    let s = Serve::start(dir, &["--export", img.to_str().unwrap(), "--arc-max", "256M"]);
    let before = s.stat()["backing_read_bytes"].as_u64().unwrap();
    common::run(Command::new("nbdcopy").arg(s.uri("")).arg(&copy));
    let read = s.stat()["backing_read_bytes"].as_u64().unwrap() - before;
    assert!(read < 160 << 20, "nbdcopy made the server read {} MiB of a 64 MiB-data image", read >> 20);
    let (a, b) = (std::fs::read(&img).unwrap(), std::fs::read(&copy).unwrap());
    assert!(a == b, "the copy differs from the image");
    s.stop();
}

/// `nbdinfo --map` output as (offset, length, flags) triples.
fn nbdinfo_map(uri: &str) -> Vec<(u64, u64, u32)> {
    let out = common::run(Command::new(common::need("nbdinfo")).args(["--map", "--json", uri]));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("nbdinfo --map --json");
    let mut map: Vec<(u64, u64, u32)> = Vec::new();
    for e in v.as_array().expect("a JSON array") {
        let (o, l, t) =
            (e["offset"].as_u64().unwrap(), e["length"].as_u64().unwrap(), e["type"].as_u64().unwrap());
        match map.last_mut() {
            Some(last) if last.2 == t as u32 && last.0 + last.1 == o => last.1 += l,
            _ => map.push((o, l, t as u32)),
        }
    }
    map
}

/// Through an NBD backing store, block status is the backing server's own
/// (asked on a connection of its own with structured replies), with what
/// is dirty in arcache laid over it.
#[test]
fn block_status_of_an_nbd_backing_is_the_backing_servers() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("origin.img");
    sparse_image(&img);
    let origin = common::Nbdkit::start(dir.path(), "origin", &["file", img.to_str().unwrap()]);
    let sdir = tempfile::tempdir().unwrap();
    let s = Serve::start(sdir, &["--export", &origin.uri(), "--arc-max", "64M"]);
    let want: Vec<(u64, u64, u32)> = {
        let mut v = Vec::new();
        let mut pos = 0;
        for &(o, l) in &DATA {
            if o > pos {
                v.push((pos, o - pos, 3));
            }
            v.push((o, l, 0));
            pos = o + l;
        }
        v.push((pos, SIZE - pos, 3));
        v
    };
    assert_eq!(nbdinfo_map(&origin.uri()), want, "nbdkit's own map (the reference)");
    assert_eq!(nbdinfo_map(&s.uri("")), want, "the same map through arcache");
    // A write into a hole shows as data at once, before it reaches nbdkit.
    let mut c = nbd::Client::connect(&s.target(), "").unwrap();
    c.write(50 << 20, &[7u8; 4096], false).unwrap();
    let map = nbdinfo_map(&s.uri(""));
    assert!(
        map.iter().any(|&(o, l, t)| t == 0 && o <= 50 << 20 && o + l >= (50 << 20) + 4096),
        "written range is data: {map:?}"
    );
    s.stop();
}

/// A backing server that offers no block status (nbdkit without structured
/// replies) is taken as all data, and the export still serves its bytes.
#[test]
fn a_backing_server_without_block_status_is_all_data() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("origin.img");
    sparse_image(&img);
    let origin = common::Nbdkit::start(dir.path(), "origin", &["--no-sr", "file", img.to_str().unwrap()]);
    let sdir = tempfile::tempdir().unwrap();
    let s = Serve::start(sdir, &["--export", &origin.uri(), "--arc-max", "64M"]);
    assert_eq!(nbdinfo_map(&s.uri("")), vec![(0, SIZE, 0)], "no map from the backing: all data");
    let mut c = nbd::Client::connect(&s.target(), "").unwrap();
    let mut buf = vec![0u8; 4096];
    c.read(DATA[1].0, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0x22), "the export's bytes are served");
    s.stop();
}
