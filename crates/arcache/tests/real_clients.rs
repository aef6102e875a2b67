//! Real NBD clients (fio, qemu-img, qemu-io, nbdcopy, nbdinfo) against the
//! real binary.

mod common;

use std::process::Command;

use common::*;

fn image(size: usize) -> (tempfile::TempDir, std::path::PathBuf, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("backing.img");
    let data = random_file(&p, size, 42);
    (dir, p, data)
}

#[test]
fn fio_random_reads_and_verified_writes() {
    need("fio");
    let (dir, backing, _) = image(64 << 20);
    let s = Serve::start(dir, &["--export", backing.to_str().unwrap(), "--arc-max", "16M"]);
    // Writes with checksums, read back and verified, at queue depth 16; the
    // ARC is smaller than the data, so verification also reads evicted records.
    fio_verified_writes(&s.uri(""), "verify", "48M", &["--randseed=7"]);
    run(Command::new("fio")
        .args(["--name=reads", "--ioengine=nbd", "--rw=randread", "--bs=4k", "--size=48M", "--iodepth=8"])
        .args(["--number_ios=4000", "--randseed=9"])
        .arg(format!("--uri={}", s.uri(""))));
    let st = s.stat();
    assert!(st["hits"].as_u64().unwrap() > 0, "some reads were hits: {st}");
    assert!(st["misses"].as_u64().unwrap() > 0);
    assert!(st["size"].as_u64().unwrap() <= 16 << 20, "ARC stays under arc_max");
}

#[test]
fn qemu_img_convert_and_qemu_io_read_after_write() {
    need("qemu-img");
    need("qemu-io");
    let (dir, backing, data) = image(8 << 20);
    let out = dir.path().join("copy.img");
    let s = Serve::start(dir, &["--export", backing.to_str().unwrap()]);
    run(Command::new("qemu-img").args(["convert", "-f", "raw", "-O", "raw", &s.uri("")]).arg(&out));
    assert!(std::fs::read(&out).unwrap() == data, "qemu-img copy equals the backing image");
    let o = run(Command::new("qemu-io")
        .args(["-f", "raw", "-c", "write -P 0xab 12288 65536", "-c", "read -P 0xab 12288 65536"])
        .args(["-c", "write -z 200000 5000", "-c", "read -P 0 200000 5000", "-c", "flush", &s.uri("")]));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(!text.contains("Pattern verification failed"), "{text}");
    let disk = std::fs::read(&backing).unwrap();
    assert!(disk[12288..12288 + 65536].iter().all(|&b| b == 0xab), "writes reached the backing file");
    assert!(disk[200000..205000].iter().all(|&b| b == 0), "zeroes reached the backing file");
}

#[test]
fn nbdcopy_through_arcache_and_back_is_byte_identical() {
    need("nbdcopy");
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("backing.img");
    std::fs::write(&backing, vec![0u8; 24 << 20]).unwrap();
    let src = dir.path().join("src.img");
    let data = random_file(&src, 24 << 20, 5);
    let back = dir.path().join("back.img");
    let s = Serve::start(
        tempfile::tempdir().unwrap(),
        &["--export", backing.to_str().unwrap(), "--arc-max", "8M"],
    );
    run(Command::new("nbdcopy").arg(&src).arg(s.uri("")));
    run(Command::new("nbdcopy").arg(s.uri("")).arg(&back));
    assert!(std::fs::read(&back).unwrap() == data, "round trip through arcache is exact");
    // nbdcopy's reads are of whole records: answered with the records.
    let pieces = s.stat()["nbd_piece_replies"].as_u64().unwrap_or(0);
    assert!(pieces >= 24, "{pieces} of nbdcopy's 96 reads of 256K answered with the records themselves");
    // Write-back: the data reaches the backing store with a txg; `arcache
    // flush` forces one now.
    let o = s.ctl(&["flush"]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("synced"));
    assert!(std::fs::read(&backing).unwrap() == data, "the backing store has it too");
    drop(dir);
}

#[test]
fn nbdinfo_lists_several_exports() {
    need("nbdinfo");
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.img");
    let b = dir.path().join("b.img");
    std::fs::write(&a, vec![1u8; 1 << 20]).unwrap();
    std::fs::write(&b, vec![2u8; 2 << 20]).unwrap();
    // Each export its own store: one writable file twice is refused.
    let c = dir.path().join("c.img");
    std::fs::write(&c, vec![3u8; 1 << 20]).unwrap();
    let s = Serve::start(
        dir,
        &[
            "--export",
            &format!("alpha={}", a.display()),
            "--export",
            &format!("beta={}", b.display()),
            "--export",
            c.to_str().unwrap(),
        ],
    );
    let o = run(Command::new("nbdinfo").arg("--list").arg(s.uri("")));
    let text = String::from_utf8_lossy(&o.stdout);
    for name in ["alpha", "beta"] {
        assert!(text.contains(&format!("export=\"{name}\"")) || text.contains(name), "{name} listed: {text}");
    }
    let o = run(Command::new("nbdinfo").arg("--json").arg(s.uri("beta")));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["exports"][0]["export-size"], 2 << 20);
    assert_eq!(v["exports"][0]["can_multi_conn"], true, "file backings are multi-conn safe");
}

#[test]
fn second_connection_sees_first_ones_flushed_writes() {
    let (dir, backing, _) = image(4 << 20);
    let s = Serve::start(dir, &["--export", backing.to_str().unwrap()]);
    let mut a = nbd::Client::connect(&s.target(), "").unwrap();
    let mut b = nbd::Client::connect(&s.target(), "").unwrap();
    let mut before = vec![0u8; 8192];
    b.read(1 << 20, &mut before).unwrap(); // now cached
    a.write((1 << 20) + 100, b"written by a", false).unwrap();
    a.flush().unwrap();
    let mut after = vec![0u8; 8192];
    b.read(1 << 20, &mut after).unwrap();
    assert_eq!(&after[100..112], b"written by a");
    assert_eq!(&after[..100], &before[..100], "untouched bytes unchanged");
    let disk = std::fs::read(&backing).unwrap();
    assert_eq!(&disk[(1 << 20) + 100..(1 << 20) + 112], b"written by a");
}

#[test]
fn arcache_in_front_of_a_remote_nbd_export() {
    need("nbdkit");
    let dir = tempfile::tempdir().unwrap();
    let remote_sock = dir.path().join("remote.sock");
    let mut nbdkit = Command::new("nbdkit")
        .args(["--foreground", "--exit-with-parent", "-U"])
        .arg(&remote_sock)
        .args(["memory", "16M"])
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(&remote_sock).is_err() {
        assert!(std::time::Instant::now() < deadline, "nbdkit did not start");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let backing = format!("nas=nbd+unix:///?socket={}", remote_sock.display());
    let s = Serve::start(tempfile::tempdir().unwrap(), &["--export", &backing]);
    let mut c = nbd::Client::connect(&s.target(), "nas").unwrap();
    assert_eq!(c.size(), 16 << 20);
    c.write(4096, &[0x5a; 8192], true).unwrap();
    // Read it from the remote server directly: the write went through.
    let mut direct = nbd::Client::connect(&nbd::Target::Unix(remote_sock.clone()), "").unwrap();
    let mut buf = vec![0u8; 8192];
    direct.read(4096, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0x5a));
    c.read(4096, &mut buf).unwrap();
    assert!(buf.iter().all(|&b| b == 0x5a));
    drop(s);
    let _ = nbdkit.kill();
    let _ = nbdkit.wait();
}
