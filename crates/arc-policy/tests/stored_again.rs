//! A record stored again while resident (a client's rewrite, which the
//! server stores without a lookup, `arcache sim --writes-as-server`) is no
//! re-use: in S3-FIFO, 2Q and SIEVE it keeps its place and what it earned,
//! so the cache holds the same records as if the store had not happened.

use arc_policy::{by_name, Access, Policy};

/// Reads of a skewed mix of keys; with `restores`, every third step
/// also stores a key again if it is resident.
fn run(name: &str, restores: bool) -> (Box<dyn Policy>, u64) {
    let mut p = by_name(name, 200).unwrap();
    let mut evicted = Vec::new();
    let (mut x, mut restored) = (11u64, 0u64);
    for i in 0..20_000u64 {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        let key = if x >> 62 == 0 { (x >> 20) % 3000 } else { (x >> 20) % 150 };
        let a = Access::demand(i * 1000);
        if !p.lookup(key, a).is_hit() {
            p.insert(key, 1, a, &mut evicted);
        }
        let again = (x >> 8) % 150;
        if restores && i % 3 == 0 && p.contains(again) {
            p.insert(again, 1, a, &mut evicted);
            restored += 1;
        }
    }
    (p, restored)
}

#[test]
fn a_resident_record_stored_again_keeps_its_place() {
    for name in ["s3fifo", "2q", "sieve"] {
        let (plain, _) = run(name, false);
        let (stored, restored) = run(name, true);
        assert!(restored > 1000, "{name}: only {restored} stores of resident records");
        let held = |p: &dyn Policy| (0..3000).filter(|&k| p.contains(k)).collect::<Vec<u64>>();
        assert_eq!(held(plain.as_ref()), held(stored.as_ref()), "{name}");
        assert_eq!(plain.stats().hits, stored.stats().hits, "{name}");
        stored.validate().unwrap();
    }
}
