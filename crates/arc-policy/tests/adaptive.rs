//! arc-adaptive: still an ARC to its users (lists, ghosts, p, counters),
//! scan resistant, in bytes with variable records, and keeping young
//! prefetches.

use arc_policy::{serving, Access, AdaptiveArc, ListKind, Lookup, Policy, ZfsArcConfig};

const MS: u64 = 1_000_000;
const REC: u64 = 128 << 10;

fn read(p: &mut dyn Policy, key: u64, size: u64, now_ns: u64) -> bool {
    let a = Access::demand(now_ns);
    if p.lookup(key, a).is_hit() {
        return true;
    }
    p.insert(key, size, a, &mut Vec::new());
    false
}

/// arc-adaptive of `cache` bytes after records 0..600 were read six
/// times, a millisecond apart: the policy, the records, the time.
fn with_working_set(cache: u64) -> (Box<dyn Policy>, Vec<u64>, u64) {
    let mut p = serving("arc-adaptive", cache, cache, 1000 * MS).unwrap();
    let hot: Vec<u64> = (0..600).collect();
    let mut t = 0;
    for _ in 0..6 {
        for &k in &hot {
            t += MS;
            read(p.as_mut(), k, REC, t);
        }
    }
    (p, hot, t)
}

/// A working set read again and again, then one sequential pass over
/// five times the cache: the working set must still be there after.
#[test]
fn a_sequential_pass_does_not_wash_out_the_working_set() {
    let cache = 1024 * REC;
    let (mut p, hot, mut t) = with_working_set(cache);
    for k in 0..5 * 1024 {
        t += MS;
        read(p.as_mut(), 1_000_000 + k, REC, t);
    }
    let kept = hot.iter().filter(|&&k| p.contains(k)).count();
    assert!(kept >= 570, "only {kept} of 600 hot records survived the scan");
    let s = p.stats();
    assert!(
        s.mfu_size >= 570 * REC && s.mru_ghost_size > 0,
        "re-used records in MFU, the scan in MRU's ghosts: {s:?}"
    );
    assert!(s.mru_size + s.mfu_size == s.size && s.size <= cache, "{s:?}");
    p.validate().unwrap();
}

/// The same working set, then prefetches of five times the cache within
/// their lifetime, with or without their demand reads (a stream read
/// ahead 256 records; a flood of NBD `CACHE` nobody reads): the working
/// set must still be there, and RAM stay bounded.
#[test]
fn young_prefetches_do_not_wash_out_the_working_set() {
    for demanded in [true, false] {
        let cache = 1024 * REC;
        let (mut p, hot, mut t) = with_working_set(cache);
        for k in 0..5 * 1024u64 {
            // A tenth of a millisecond apart: all younger than a second.
            t += MS / 10;
            let ahead = Access { now_ns: t, prefetch: true };
            if !p.lookup(1_000_000 + k, ahead).is_hit() {
                p.insert(1_000_000 + k, REC, ahead, &mut Vec::new());
            }
            if demanded && k >= 256 {
                read(p.as_mut(), 1_000_000 + k - 256, REC, t);
            }
        }
        let kept = hot.iter().filter(|&&k| p.contains(k)).count();
        assert!(kept >= 570, "only {kept} of 600 hot records survived (demanded: {demanded})");
        let s = p.stats();
        assert!(s.size <= cache, "{s:?}");
        p.validate().unwrap();
    }
}

/// Records of many sizes: the byte budget holds, ghosts and counters add up.
#[test]
fn variable_record_sizes_keep_the_byte_budget() {
    let cache = 8 << 20;
    let mut p = serving("arc-adaptive", cache / 2, cache, 1000 * MS).unwrap();
    let mut x = 7u64;
    for i in 0..50_000u64 {
        arc_policy::xorshift(&mut x);
        let key = if x.is_multiple_of(3) { x % 200 } else { x % 5000 };
        let size = 4096 << (key % 6);
        read(p.as_mut(), key, size, i * MS);
        if i % 5000 == 0 {
            p.validate().unwrap();
        }
    }
    let s = p.stats();
    assert_eq!(s.hits + s.misses, 50_000);
    assert!(s.size <= cache && s.c == cache, "{s:?}");
    assert!(s.mru_ghost_hits > 0 && s.mfu_hits > 0 && s.evicted > 0, "{s:?}");
    assert!(s.pd <= 1 << 32);
    p.validate().unwrap();
}

/// A ghost hit is admitted straight to MFU, as in ARC and S3-FIFO.
#[test]
fn a_ghost_hit_enters_mfu() {
    let mut p = AdaptiveArc::new(ZfsArcConfig::fixed(100));
    for k in 0..150 {
        read(&mut p, k, 1, k * MS);
    }
    assert_eq!(p.lookup(0, Access::demand(200 * MS)), Lookup::GhostHit(ListKind::Mru));
    p.insert(0, 1, Access::demand(200 * MS), &mut Vec::new());
    assert_eq!(p.lookup(0, Access::demand(300 * MS)), Lookup::Hit(ListKind::Mfu));
    assert_eq!(p.stats().mru_ghost_hits, 1);
}

/// Young prefetches are passed over, then given up when nothing else is
/// left; with a zero lifetime they go first.
#[test]
fn young_prefetches_are_kept_then_forced() {
    let mut p = serving("arc-adaptive", 4 * REC, 4 * REC, 1000 * MS).unwrap();
    let pf = Access { now_ns: 0, prefetch: true };
    let mut ev = Vec::new();
    for k in 0..2 {
        p.insert(k, REC, pf, &mut ev);
    }
    for k in 2..5 {
        read(p.as_mut(), k, REC, MS);
    }
    assert!(p.contains(0) && p.contains(1), "young prefetches stay");
    assert!(p.stats().evict_skip > 0);
    for k in 10..20 {
        p.insert(k, REC, pf, &mut ev);
    }
    assert!(p.stats().size <= 4 * REC, "RAM stays bounded when all are young");
    // The demand a prefetch was made for is counted, and is not a re-use.
    let Some(k) = (10..20).find(|&k| p.contains(k)) else { panic!("no prefetch left") };
    assert!(p.lookup(k, Access::demand(2 * MS)).is_hit());
    assert_eq!(p.stats().demand_hit_prefetch, 1);
    let mut q = serving("arc-adaptive", 4 * REC, 4 * REC, 1000 * MS).unwrap();
    q.set_min_prefetch_ns(0);
    q.insert(0, REC, pf, &mut ev);
    for k in 1..5 {
        read(q.as_mut(), k, REC, MS);
    }
    assert!(!q.contains(0), "without a lifetime a prefetch is evicted like any block");
    p.validate().unwrap();
}

/// Young prefetches passed over stay where they are: the L2 feed reads
/// the eviction end in order and must find the oldest prefetches there,
/// not a list reshuffled by every insert (a 16 MiB sequential read through
/// a 2 MiB ARC left a third of it off L2 while they were moved).
#[test]
fn passed_over_prefetches_keep_their_order() {
    let mut p = serving("arc-adaptive", 8 * REC, 8 * REC, 1000 * MS).unwrap();
    let mut ev = Vec::new();
    for k in 0..6 {
        p.insert(k, REC, Access { now_ns: k * MS, prefetch: true }, &mut ev);
    }
    for k in 100..110 {
        read(p.as_mut(), k, REC, 10 * MS + k);
    }
    let mut order = Vec::new();
    p.scan_tail(ListKind::Mru, u64::MAX, &mut |k, _, _| {
        order.push(k);
        true
    });
    assert_eq!(&order[..6], &[0, 1, 2, 3, 4, 5], "prefetches still oldest first: {order:?}");
    assert!(p.stats().evict_skip > 0 && p.stats().size <= 8 * REC);
    p.validate().unwrap();
}

/// The MRU target moves when the copies say so: re-use at a distance
/// only a large MRU catches raises it from its tenth of the cache, and a
/// loop a little larger than the cache (where LRU hits nothing) is held by
/// frequency.
#[test]
fn the_mru_target_follows_the_workload() {
    let mut recency = AdaptiveArc::new(ZfsArcConfig::fixed(1000));
    // Each block read twice, 500 reads apart, never again.
    for i in 0..200_000u64 {
        let key = if i % 2 == 0 { i } else { i.wrapping_sub(501) };
        read(&mut recency, key, 1, i * 100 * MS);
    }
    let s = recency.stats();
    // 250 blocks enter between the two reads: more than the default
    // tenth of the cache holds.
    assert!(s.pd > (1 << 32) / 5, "{s:?}");
    assert!(s.hits > 90_000, "most second reads hit: {s:?}");
    // A loop 10 % larger than the cache, interleaved with reads of a hot
    // set of 300: LRU keeps the hot set and loses every loop read;
    // arc-adaptive keeps a part of the loop too (measured: +8 pp).
    let mut looping = AdaptiveArc::new(ZfsArcConfig::fixed(1000));
    let mut lru = arc_policy::Lru::new(1000);
    let mut x = 1u64;
    for i in 0..400_000u64 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let key = if i % 2 == 0 { (i / 2) % 1100 } else { 1_000_000 + (x >> 33) % 300 };
        read(&mut looping, key, 1, i * 100 * MS);
        read(&mut lru, key, 1, i * 100 * MS);
    }
    let (ours, theirs) = (looping.stats().hits, lru.stats().hits);
    assert!(ours > theirs + 25_000, "arc-adaptive {ours} vs lru {theirs}");
}

/// Units or bytes, fixed or growing from half: the same decisions, so
/// the simulator's `arc-adaptive` (one unit a block) is what a server with
/// 4 KiB records would do. (ZfsArc is not so: its damped adaptation
/// rounds a one-unit step to nothing.)
#[test]
fn blocks_and_bytes_decide_alike() {
    let c = 700u64;
    let mut units = arc_policy::by_name("arc-adaptive", c).unwrap();
    let mut bytes =
        arc_policy::InBlocks::new(serving("arc-adaptive", c * 4096 / 2, c * 4096, 1000 * MS).unwrap(), 4096);
    let mut x = 3u64;
    for i in 0..100_000u64 {
        arc_policy::xorshift(&mut x);
        let key = if x.is_multiple_of(4) { i % 900 } else { x % 3000 };
        assert_eq!(read(units.as_mut(), key, 1, i * MS), read(&mut bytes, key, 1, i * MS), "request {i}");
    }
    assert_eq!(units.stats().pd, bytes.stats().pd);
}

/// The server's "a twice larger ARC would hit about ..." estimate is
/// (hits + ghost hits) / reads: it must stay near the truth for the
/// default policy (issue 20: live sizing right for the new policy).
/// Skewed reads of 128 KiB records over 4x the cache; the estimate from a
/// cache of `c` against the hit ratio a cache of `2c` really gets. The
/// same reads show why the default moved off OpenZFS's rule: `arc` in
/// bytes lets MRU take nearly all the cache (pd near 1) and hits far less.
#[test]
fn ghost_hits_estimate_a_doubled_cache() {
    let c = 2000 * REC;
    let reads: Vec<u64> = {
        let mut x = 11u64;
        (0..200_000)
            .map(|_| {
                arc_policy::xorshift(&mut x);
                // Two thirds of reads on 1,500 records, the rest on 8,000.
                if x % 3 < 2 {
                    x % 1500
                } else {
                    10_000 + x % 8000
                }
            })
            .collect()
    };
    let run = |name: &str, cap: u64| {
        let mut p = serving(name, cap, cap, 0).unwrap();
        let hits =
            reads.iter().enumerate().filter(|&(i, &k)| read(p.as_mut(), k, REC, i as u64 * MS)).count();
        p.validate().unwrap();
        (hits as f64 / reads.len() as f64, p.stats())
    };
    let (at_c, s) = run("arc-adaptive", c);
    let estimate = (s.hits + s.mru_ghost_hits + s.mfu_ghost_hits) as f64 / reads.len() as f64;
    let (doubled, _) = run("arc-adaptive", 2 * c);
    assert!(
        (estimate - doubled).abs() < 0.03,
        "ghost estimate {estimate:.3} against {doubled:.3} with twice the cache"
    );
    let (zfs, _) = run("arc", c);
    assert!(at_c > zfs + 0.2, "arc-adaptive {at_c:.3} against arc {zfs:.3}");
}

/// Seed 001's file server: each pass reads every file's metadata and then
/// more file data than the cache holds. Metadata below its share
/// (`meta`, a quarter at first) is passed over at the eviction ends, so it
/// stays while the data turns over; plain recency would evict it first
/// (it was touched longest ago) and every pass would miss it all. How far
/// data ghost hits shrink that share is `zfs_arc_meta_balance`.
fn seed_001_passes(balance: Option<u64>) -> (f64, u64) {
    use arc_policy::key::view::{self, Kind};
    let cache = 1000 * 4096;
    let mut p = serving("arc-adaptive", cache, cache, 0).unwrap();
    if let Some(b) = balance {
        p.set_meta_balance(b);
    }
    let meta: Vec<u64> = (0..200).map(|o| view::make(Kind::Attr, o, 0)).collect();
    let data: Vec<u64> = (0..1500).map(|r| view::make(Kind::Data, 1_000 + r / 10, r % 10)).collect();
    let (mut t, mut hits) = (0, 0);
    for pass in 0..6 {
        for &k in &meta {
            t += MS;
            if read(p.as_mut(), k, 4096, t) && pass == 5 {
                hits += 1;
            }
        }
        for &k in &data {
            t += MS;
            read(p.as_mut(), k, 4096, t);
        }
        p.validate().unwrap();
    }
    (hits as f64 / meta.len() as f64, p.stats().meta)
}

#[test]
fn metadata_below_its_share_survives_passes_of_more_data_than_the_cache() {
    // Plain recency keeps none of it (measured with the share ignored: 0 %).
    let (ratio, meta) = seed_001_passes(None);
    assert!(ratio >= 0.6, "metadata hit ratio on the last pass {ratio}");
    assert!(meta > 0 && meta <= 1 << 32);
    let (strong, _) = seed_001_passes(Some(10_000));
    assert!(strong >= 0.95, "with zfs_arc_meta_balance 10000: {strong}");
}

#[test]
fn meta_balance_sets_how_far_data_ghost_hits_shrink_metadatas_share() {
    let (even_hits, even) = seed_001_passes(Some(100));
    let (default_hits, default) = seed_001_passes(None);
    let (strong_hits, strong) = seed_001_passes(Some(10_000));
    assert!(even < default && default < strong, "meta: balance 100 {even}, 500 {default}, 10000 {strong}");
    assert!(
        even_hits < default_hits && default_hits < strong_hits,
        "metadata hits: balance 100 {even_hits}, 500 {default_hits}, 10000 {strong_hits}"
    );
}

/// Reads `keys` through the default policy and LRU at `cache` blocks,
/// checking the policy's invariants as it goes; returns both hit counts.
fn against_lru(cache: u64, keys: impl Iterator<Item = u64>) -> (u64, u64) {
    let mut ours = AdaptiveArc::new(ZfsArcConfig::fixed(cache));
    let mut lru = arc_policy::Lru::new(cache);
    for (i, key) in keys.enumerate() {
        read(&mut ours, key, 1, i as u64 * MS);
        read(&mut lru, key, 1, i as u64 * MS);
        if i % 5000 == 0 {
            ours.validate().unwrap();
        }
    }
    ours.validate().unwrap();
    (ours.stats().hits, lru.stats().hits)
}

/// A loop three times the cache: LRU (and this policy with ghosts alone)
/// hit nothing, since nothing read comes back before its ghost is gone.
/// The copies that let MFU take in what MRU lets go hold a part of the
/// loop still, as S3-FIFO's main queue does (about 0.9 of the cache over
/// the loop's length), and the cache runs that variant.
#[test]
fn a_loop_three_times_the_cache_keeps_a_part_of_it() {
    let (ours, lru) = against_lru(1000, (0..300_000u64).map(|i| i % 3000));
    assert_eq!(lru, 0);
    assert!(ours > 300_000 / 5, "arc-adaptive hit {ours} of 300,000 loop reads");
}

/// Zipf ranks (exponent 0.8) over `n` keys, by inverting the cumulative
/// weights; deterministic.
fn zipf_ranks(n: usize, seed: u64) -> impl FnMut() -> u64 {
    let mut cdf: Vec<f64> = (1..=n).map(|r| (r as f64).powf(-0.8)).collect();
    for i in 1..n {
        cdf[i] += cdf[i - 1];
    }
    let total = cdf[n - 1];
    let mut x = seed;
    move || {
        arc_policy::xorshift(&mut x);
        let u = (x >> 11) as f64 / (1u64 << 53) as f64 * total;
        cdf.partition_point(|&c| c < u) as u64
    }
}

/// A skewed hot set of 5,000 keys that jumps by half of itself every 7,500
/// reads (random_family.py's s1031, a quarter the size): recency wins
/// here, and the sixteen-turnover windows alone (about 64,000 reads at
/// this cache's sampling rate) never reach a decision before the trace
/// ends (measured: 7.5 pp below LRU without the early switch, 2.8 pp with
/// it). The early switch must keep it within 4 pp; the
/// rest is the price of switching late at all (issue 20's open point).
#[test]
fn a_hot_set_that_jumps_is_followed_early() {
    let mut rank = zipf_ranks(5000, 7);
    let keys = (0..50_000u64).map(move |i| (i / 7500) * 2500 + rank());
    let (ours, lru) = against_lru(4000, keys);
    assert!(ours + 2000 >= lru, "arc-adaptive {ours} hits against lru {lru} of 50,000");
}
