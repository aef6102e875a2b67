//! The S3 chunked disk's manifest, lease and head decoders: never a panic, and
//! what decodes re-encodes to the same values. Bytes are decoded as they
//! come, then (from the second byte on) sealed with the magic, version,
//! length and checksum they would carry, so the field checks behind the
//! checksum are reached.
#![no_main]

use arcache_s3::format::{seal_head, seal_lease, seal_manifest, Head, Lease, Manifest};
use libfuzzer_sys::fuzz_target;

fn check(bytes: &[u8], sealed: bool) {
    if let Ok(m) = Manifest::decode(bytes) {
        assert_eq!(Manifest::decode(&m.encode()), Ok(m), "manifest encoding is not stable");
    }
    match Lease::decode(bytes) {
        Ok(l) => assert_eq!(Lease::decode(&l.encode()), Ok(l), "lease encoding is not stable"),
        Err(e) if sealed => assert!(!e.contains("checksum"), "a sealed lease failed its checksum"),
        Err(_) => {}
    }
    match Head::decode(bytes) {
        Ok(h) => assert_eq!(h.encode().as_deref().map(Head::decode), Ok(Ok(h)), "head encoding is not stable"),
        Err(e) if sealed => assert!(!e.contains("checksum"), "a sealed head failed its checksum"),
        Err(_) => {}
    }
}

fuzz_target!(|data: &[u8]| {
    check(data, false);
    let Some((_, rest)) = data.split_first() else { return };
    let mut m = rest.to_vec();
    seal_manifest(&mut m);
    check(&m, false);
    let mut l = rest.to_vec();
    seal_lease(&mut l);
    check(&l, true);
    let mut h = rest.to_vec();
    seal_head(&mut h);
    check(&h, true);
});
