//! The compact index against std's HashMap.

use std::collections::HashMap;

use arcache_l2::index::{BlobFlags, L2Index, L2Ptr};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]
    #[test]
    fn behaves_like_a_hashmap(ops in prop::collection::vec((0u8..3, 0u64..300, 0u64..1000), 1..2000)) {
        let mut ix = L2Index::new();
        let mut model: HashMap<u64, L2Ptr> = HashMap::new();
        for (op, key, v) in ops {
            let p = L2Ptr::new((v % 16) as usize, v * 512, 512, BlobFlags::default(), v);
            match op {
                0 | 1 => prop_assert_eq!(ix.insert(key, p), model.insert(key, p)),
                _ => prop_assert_eq!(ix.remove(key), model.remove(&key)),
            }
            prop_assert_eq!(ix.len(), model.len());
        }
        for (k, p) in &model {
            prop_assert_eq!(ix.get(*k), Some(*p));
        }
        prop_assert_eq!(ix.iter().count(), model.len());
    }
}
