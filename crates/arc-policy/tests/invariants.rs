//! Property tests: random request streams against every policy, checking the
//! structural invariants after each step and the caller-visible contract
//! (a key reported evicted is no longer resident, a hit was resident).

use arc_policy::{by_name, Access, AdaptiveArc, Lru, Policy, ZfsArc, ZfsArcConfig, POLICY_NAMES};
use proptest::prelude::*;
use std::collections::{HashSet, VecDeque};

#[derive(Debug, Clone)]
enum Op {
    Access {
        key: u64,
        size: u64,
        dt_ms: u64,
        prefetch: bool,
    },
    /// The caller stores a resident record again (a write; a record kept
    /// decompressed; attributes prefetched again), as the server does.
    Store {
        key: u64,
        prefetch: bool,
    },
    Remove(u64),
    Resize(u64),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => (0u64..64, 1u64..5, 0u64..200, prop::bool::weighted(0.1))
            .prop_map(|(key, size, dt_ms, prefetch)| Op::Access { key, size, dt_ms, prefetch }),
        2 => (0u64..64, prop::bool::weighted(0.3)).prop_map(|(key, prefetch)| Op::Store { key, prefetch }),
        1 => (0u64..64).prop_map(Op::Remove),
        1 => (4u64..40).prop_map(Op::Resize),
    ]
}

/// Drives `p` and checks it against the set of keys the caller believes resident.
fn drive(p: &mut dyn Policy, ops: &[Op], uniform: bool) -> Result<(), TestCaseError> {
    let mut resident: HashSet<u64> = HashSet::new();
    let mut now = 0;
    let mut evicted = Vec::new();
    for op in ops {
        match *op {
            Op::Access { key, size, dt_ms, prefetch } => {
                now += dt_ms * 1_000_000;
                let a = Access { now_ns: now, prefetch };
                let size = if uniform { 1 } else { size };
                let hit = p.lookup(key, a).is_hit();
                prop_assert_eq!(hit, resident.contains(&key), "hit iff resident");
                if !hit {
                    p.insert(key, size, a, &mut evicted);
                    resident.insert(key);
                }
            }
            Op::Store { key, prefetch } => {
                if resident.contains(&key) {
                    let size = if uniform { 1 } else { 1 + key % 4 };
                    p.insert(key, size, Access { now_ns: now, prefetch }, &mut evicted);
                }
            }
            Op::Remove(key) => {
                let was = p.remove(key);
                prop_assert_eq!(was, resident.remove(&key));
            }
            Op::Resize(c) => p.set_limits(c / 2, c, &mut evicted),
        }
        for k in evicted.drain(..) {
            prop_assert!(resident.remove(&k), "evicted key {} was not resident", k);
        }
        resident.retain(|k| p.contains(*k) || { false });
        for k in &resident {
            prop_assert!(p.contains(*k));
        }
        if let Err(e) = p.validate() {
            return Err(TestCaseError::fail(format!("{}: {e}", p.name())));
        }
    }
    let s = p.stats();
    prop_assert_eq!(s.entries as usize, resident.len());
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn every_policy_keeps_its_invariants(ops in prop::collection::vec(op(), 1..400)) {
        for name in POLICY_NAMES {
            let mut p = by_name(name, 16).unwrap();
            drive(p.as_mut(), &ops, *name == "arc-paper")?;
        }
        let mut growing = ZfsArc::new(ZfsArcConfig::growing(4, 32));
        drive(&mut growing, &ops, false)?;
        let mut growing = AdaptiveArc::new(ZfsArcConfig::growing(4, 32));
        drive(&mut growing, &ops, false)?;
        // The variant that fills MFU, which the copies choose only on
        // enough evidence, run from the start.
        let mut filling = AdaptiveArc::filling(ZfsArcConfig::growing(4, 32));
        drive(&mut filling, &ops, false)?;
    }

    #[test]
    fn lru_matches_a_queue_model(keys in prop::collection::vec(0u64..32, 1..500), cap in 1u64..20) {
        let mut lru = Lru::new(cap);
        let mut model: VecDeque<u64> = VecDeque::new();
        let mut ev = Vec::new();
        for (t, k) in keys.into_iter().enumerate() {
            let hit = lru.lookup(k, Access::demand(t as u64)).is_hit();
            let pos = model.iter().position(|&x| x == k);
            prop_assert_eq!(hit, pos.is_some());
            if let Some(i) = pos { model.remove(i); }
            else {
                lru.insert(k, 1, Access::demand(t as u64), &mut ev);
                if model.len() as u64 == cap { model.pop_back(); }
            }
            model.push_front(k);
        }
    }
}
