//! The file view's records in the shared ARC (`docs/fileview.md`):
//! metadata counted apart from data, `arc_meta_used` kept through inserts,
//! replacements, evictions and invalidations.

use std::sync::Arc;

use arc_policy::key::view::{self, Kind};
use arcache_engine::{Cache, CacheConfig, Record, RECORD_OVERHEAD};

fn cache(arc_max: u64) -> Arc<Cache> {
    Cache::new(CacheConfig { arc_min: arc_max / 4, arc_max, min_prefetch_ms: 0, compress: false })
}

#[test]
fn metadata_and_data_are_counted_apart() {
    let c = cache(64 << 20);
    let attr = view::make(Kind::Attr, 1, 0);
    let data = view::make(Kind::Data, 1, 0);
    assert!(c.view_lookup(attr).is_none());
    assert!(c.view_lookup(data).is_none());
    c.view_insert(attr, Arc::new(Record::new(&[7u8; 104], false)));
    c.view_insert(data, Arc::new(Record::new(&[1u8; 4096], false)));
    assert!(c.view_lookup(attr).is_some());
    assert!(c.view_lookup(attr).is_some());
    assert!(c.view_lookup(data).is_some());
    let s = c.stats();
    assert_eq!((s.demand_metadata_hits, s.demand_metadata_misses), (2, 1));
    assert_eq!((s.demand_data_hits, s.demand_data_misses), (1, 1));
    assert_eq!((s.hits, s.misses), (3, 2));
    assert_eq!(s.metadata_size, 104);
    assert_eq!(s.data_size, 4096);
    assert_eq!(s.arc_meta_used, 104 + RECORD_OVERHEAD);
    // Replacing a record counts its new size once.
    c.view_insert(attr, Arc::new(Record::new(&[8u8; 200], false)));
    assert_eq!(c.stats().arc_meta_used, 200 + RECORD_OVERHEAD);
    assert!(c.view_invalidate(attr));
    let s = c.stats();
    assert_eq!((s.metadata_size, s.arc_meta_used), (0, 0));
    assert_eq!(s.arc_meta_max, 200 + RECORD_OVERHEAD);
    c.validate().unwrap();
}

#[test]
fn evicted_metadata_leaves_arc_meta_used() {
    let c = cache(4 << 20);
    for object in 0..20_000u64 {
        c.view_insert(view::make(Kind::Attr, object, 0), Arc::new(Record::new(&[1u8; 104], false)));
        c.view_insert(view::make(Kind::Data, object, 0), Arc::new(Record::new(&[2u8; 4096], false)));
    }
    let s = c.stats();
    assert!(s.size <= 4 << 20, "size {} over arc_max", s.size);
    let meta_records = s.metadata_size / 104;
    assert_eq!(s.metadata_size % 104, 0);
    assert_eq!(s.arc_meta_used, s.metadata_size + meta_records * RECORD_OVERHEAD);
    assert!(s.evicted > 0, "nothing was evicted");
    assert!(s.arc_meta_max >= s.arc_meta_used);
    c.validate().unwrap();
}

/// The view's tables are charged to the ARC: what they hold leaves the
/// records less room, and `size` (records plus tables) stays within
/// `arc_max`, give or take one step of the charge.
#[test]
fn the_views_tables_are_charged_to_the_arc() {
    let arc_max = 16u64 << 20;
    let c = cache(arc_max);
    let fill = |c: &Cache, from: u64| {
        for object in from..from + 8_000 {
            c.view_insert(view::make(Kind::Data, object, 0), Arc::new(Record::new(&[2u8; 4096], false)));
        }
    };
    fill(&c, 0);
    let full = c.stats();
    assert!(full.size > arc_max * 9 / 10, "the ARC did not fill: {}", full.size);
    let tables = 6u64 << 20;
    c.set_dnode_size(tables);
    let s = c.stats();
    assert_eq!((s.dnode_size, s.c_max), (tables, arc_max));
    assert!(s.size <= arc_max, "records {} and tables {tables} over arc_max", s.size - tables);
    assert!(s.size - tables < full.size - tables / 2, "no record made way for the tables");
    assert_eq!(s.arc_meta_used, tables, "the tables are metadata");
    // A small change moves nothing; the tables gone, the records grow back.
    c.set_dnode_size(tables + 4096);
    assert_eq!(c.stats().c, s.c);
    c.set_dnode_size(0);
    fill(&c, 8_000);
    assert!(c.stats().size > arc_max * 9 / 10, "the records did not get the room back");
    assert!(c.stats().arc_meta_max >= tables);
    c.validate().unwrap();
}
