//! An ARC that behaves like OpenZFS's (2.2 and later) for one class of data:
//! byte-based sizes, a target `c` that grows from `c_min` to `c_max`, the
//! MRU share kept as a 32-bit fixed-point fraction (`pd`) that adapts lazily
//! from ghost-hit bytes once per eviction run, the 62 ms MRU→MFU debounce,
//! prefetches that do not promote on their first demand and are protected
//! from eviction for a minimum lifetime.
//!
//! Where it differs from OpenZFS on purpose: each ghost list may describe up
//! to `c` bytes and the whole directory up to `2c`, instead of "half of the
//! other classes". With one class of data, OpenZFS's rule (and the paper's
//! `|T1|+|B1| <= c`) leaves no MRU ghosts while a first pass fills the cache,
//! so a second pass over a working set a little larger than the cache gets no
//! ghost hits and thrashes like LRU. Remembering the last `c` bytes evicted
//! from MRU lets that second pass move blocks into MFU, where they stay.

use rustc_hash::FxHashMap;

use crate::slab::{List, Slab};
use crate::{Access, Key, ListKind, Lookup, Policy, PolicyStats};

/// One in 2^32 fixed point: `pd == ONE` means "all of the cache for MRU".
const ONE: u64 = 1 << 32;

#[derive(Debug, Clone, Copy)]
pub struct ZfsArcConfig {
    pub c_min: u64,
    pub c_max: u64,
    /// A second access must come this long after the first to promote
    /// MRU→MFU (OpenZFS: ARC_MINTIME, hz/16).
    pub min_promote_ns: u64,
    /// Prefetched entries are not evicted younger than this
    /// (`zfs_arc_min_prefetch_ms`, default 1 s).
    pub min_prefetch_ns: u64,
    /// `c` grows while the resident size is within this margin of it.
    pub grow_margin: u64,
}

impl ZfsArcConfig {
    /// A cache of fixed size, as the simulator wants it.
    pub fn fixed(capacity: u64) -> Self {
        ZfsArcConfig {
            c_min: capacity,
            c_max: capacity,
            min_promote_ns: 62_500_000,
            min_prefetch_ns: 1_000_000_000,
            grow_margin: 0,
        }
    }

    /// A cache that starts at `c_min` and grows to `c_max` as data arrives.
    pub fn growing(c_min: u64, c_max: u64) -> Self {
        ZfsArcConfig {
            c_min: c_min.min(c_max),
            c_max,
            grow_margin: (32 << 20u64).min(c_max / 16),
            ..Self::fixed(c_max)
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Mru = 0,
    Mfu = 1,
    MruGhost = 2,
    MfuGhost = 3,
}

impl State {
    fn ghost_of(self) -> State {
        match self {
            State::Mru => State::MruGhost,
            State::Mfu => State::MfuGhost,
            ghost => ghost,
        }
    }
}

#[derive(Debug)]
pub(crate) struct Entry {
    key: Key,
    size: u64,
    state: State,
    last_access_ns: u64,
    prefetch: bool,
}

pub struct ZfsArc {
    cfg: ZfsArcConfig,
    c: u64,
    pd: u64,
    now_ns: u64,
    slab: Slab<Entry>,
    index: FxHashMap<Key, u32>,
    lists: [List; 4],
    sizes: [u64; 4],
    /// Ghost-hit bytes since the last adaptation, MRU ghost then MFU ghost.
    ghost_hit_bytes: [u64; 2],
    stats: PolicyStats,
}

impl ZfsArc {
    pub fn new(cfg: ZfsArcConfig) -> Self {
        ZfsArc {
            c: cfg.c_min,
            cfg,
            pd: ONE / 2,
            now_ns: 0,
            slab: Slab::new(),
            index: FxHashMap::default(),
            lists: [List::default(); 4],
            sizes: [0; 4],
            ghost_hit_bytes: [0; 2],
            stats: PolicyStats::default(),
        }
    }

    /// Changes the minimum lifetime of prefetched entries.
    pub fn set_min_prefetch_ns(&mut self, ns: u64) {
        self.cfg.min_prefetch_ns = ns;
    }

    /// Walks a resident list from its eviction end, at most `max_bytes` deep,
    /// calling `f(key, size, prefetch)` until it returns false. The L2 feed
    /// uses it to find what will be evicted next.
    pub fn scan_tail(&self, list: ListKind, max_bytes: u64, mut f: impl FnMut(Key, u64, bool) -> bool) {
        let state = match list {
            ListKind::Mru => State::Mru,
            ListKind::Mfu => State::Mfu,
        };
        let mut seen = 0;
        let mut cur = self.lists[state as usize].tail();
        while let Some(idx) = cur {
            let e = self.slab.get(idx);
            if seen >= max_bytes || !f(e.key, e.size, e.prefetch) {
                return;
            }
            seen += e.size;
            cur = self.slab.prev_of(idx);
        }
    }

    fn resident(&self) -> u64 {
        self.sizes[State::Mru as usize] + self.sizes[State::Mfu as usize]
    }

    fn relink(&mut self, idx: u32, to: State) {
        let e = self.slab.get(idx);
        let (from, size) = (e.state, e.size);
        self.slab.unlink(&mut self.lists[from as usize], idx);
        self.sizes[from as usize] -= size;
        self.slab.get_mut(idx).state = to;
        self.slab.push_head(&mut self.lists[to as usize], idx);
        self.sizes[to as usize] += size;
    }

    fn drop_entry(&mut self, idx: u32) {
        let e = self.slab.get(idx);
        let (key, size, state) = (e.key, e.size, e.state);
        self.slab.unlink(&mut self.lists[state as usize], idx);
        self.sizes[state as usize] -= size;
        self.slab.release(idx);
        self.index.remove(&key);
    }

    fn touch(&mut self, idx: u32) {
        self.slab.get_mut(idx).last_access_ns = self.now_ns;
    }

    fn grow(&mut self, added: u64) {
        if self.c < self.cfg.c_max && self.resident() + self.cfg.grow_margin >= self.c {
            self.c = (self.c + added.max(128 << 10)).min(self.cfg.c_max);
        }
    }

    /// Moves `pd` by the ghost hits seen since the last run, relative to how
    /// big the ghost lists are, damped near the ends of the range so neither
    /// side can be starved in one step.
    fn adapt(&mut self) {
        let [up, down] = std::mem::take(&mut self.ghost_hit_bytes);
        let total = self.sizes[State::MruGhost as usize] + self.sizes[State::MfuGhost as usize];
        self.pd = adjust_fraction(self.pd, total, up, down);
    }

    /// Demotes entries from the tail of `from` until `want` bytes are freed.
    /// Young prefetches are skipped while `honor_lifetime` holds.
    fn evict_from(&mut self, from: State, want: u64, honor_lifetime: bool, out: &mut Vec<Key>) -> u64 {
        let mut freed = 0;
        let mut skipped = 0u32;
        let mut cur = self.lists[from as usize].tail();
        while let Some(idx) = cur {
            if freed >= want {
                break;
            }
            cur = self.slab.prev_of(idx);
            let e = self.slab.get(idx);
            let young = self.now_ns.saturating_sub(e.last_access_ns) < self.cfg.min_prefetch_ns;
            if honor_lifetime && e.prefetch && young {
                self.stats.evict_skip += 1;
                skipped += 1;
                // A bounded scan: a list full of young prefetches must not make
                // every insert walk it whole.
                if skipped >= 64 {
                    break;
                }
                continue;
            }
            freed += e.size;
            out.push(e.key);
            self.stats.evicted += 1;
            self.relink(idx, from.ghost_of());
        }
        freed
    }

    fn evict(&mut self, out: &mut Vec<Key>) {
        if self.resident() <= self.c {
            return;
        }
        self.adapt();
        let excess = self.resident() - self.c;
        let mru_target = ((self.c as u128 * self.pd as u128) >> 32) as u64;
        let mru_over = self.sizes[State::Mru as usize].saturating_sub(mru_target);
        let mut freed = self.evict_from(State::Mru, excess.min(mru_over), true, out);
        // Each step takes what the previous ones left; the last two give up
        // on the split and then on prefetch lifetimes, so RAM stays bounded.
        for (state, honor) in
            [(State::Mfu, true), (State::Mru, true), (State::Mfu, false), (State::Mru, false)]
        {
            if freed >= excess {
                break;
            }
            freed += self.evict_from(state, excess - freed, honor, out);
        }
    }

    fn delete_ghost_tail(&mut self, state: State) -> bool {
        match self.lists[state as usize].tail() {
            Some(idx) => {
                self.drop_entry(idx);
                self.stats.deleted += 1;
                true
            }
            None => false,
        }
    }

    fn trim_ghosts(&mut self) {
        let c = self.c;
        for ghost in [State::MruGhost, State::MfuGhost] {
            while self.sizes[ghost as usize] > c {
                if !self.delete_ghost_tail(ghost) {
                    break;
                }
            }
        }
        while self.sizes.iter().sum::<u64>() > 2 * c {
            if !self.delete_ghost_tail(State::MfuGhost) && !self.delete_ghost_tail(State::MruGhost) {
                break;
            }
        }
    }

    fn place(&mut self, key: Key, size: u64, access: Access) {
        let idx = self.slab.alloc(Entry {
            key,
            size,
            state: State::Mru,
            last_access_ns: self.now_ns,
            prefetch: access.prefetch,
        });
        self.slab.push_head(&mut self.lists[State::Mru as usize], idx);
        self.sizes[State::Mru as usize] += size;
        self.index.insert(key, idx);
    }
}

/// `frac + up/total - down/total` in 2^32 fixed point, with each step
/// limited to about 1/32 of the range and damped near either end.
fn adjust_fraction(frac: u64, total: u64, up: u64, down: u64) -> u64 {
    adjust_fraction_balanced(frac, total, up, down, 100)
}

/// [`adjust_fraction`] with `down` weighted `100 / balance` after the step
/// limit (OpenZFS 2.2's rule for metadata's share, `zfs_arc_meta_balance`:
/// at 500 a data ghost hit moves it a fifth as far as a metadata one).
pub(crate) fn adjust_fraction_balanced(frac: u64, total: u64, up: u64, down: u64, balance: u64) -> u64 {
    if total == 0 || up + down == 0 {
        return frac;
    }
    let (mut up, mut down) = (up as u128, down as u128);
    let limit = (total / 32).max(1) as u128;
    if up + down > limit {
        let sum = up + down;
        up = up * limit / sum;
        down = down * limit / sum;
    }
    let f = frac as u128;
    let g = (ONE as u128) - f;
    if f >= 4 * g {
        up = up * 2 * g / (f + 2 * g).max(1);
    }
    if g >= 4 * f {
        down = down * 2 * f / (g + 2 * f).max(1);
    }
    let total = total as u128;
    let up = up * ONE as u128 / total;
    let down = down * ONE as u128 / total * 100 / balance.max(1) as u128;
    (f + up).saturating_sub(down).min(ONE as u128) as u64
}

impl Policy for ZfsArc {
    fn name(&self) -> &'static str {
        "arc"
    }

    fn lookup(&mut self, key: Key, access: Access) -> Lookup {
        self.now_ns = self.now_ns.max(access.now_ns);
        let Some(&idx) = self.index.get(&key) else {
            self.stats.misses += 1;
            return Lookup::Miss;
        };
        let (state, size, last, was_prefetch) = {
            let e = self.slab.get(idx);
            (e.state, e.size, e.last_access_ns, e.prefetch)
        };
        match state {
            State::Mru => {
                self.stats.hits += 1;
                self.stats.mru_hits += 1;
                if was_prefetch && !access.prefetch {
                    // The demand a prefetch was made for: not yet a re-use.
                    self.stats.demand_hit_prefetch += 1;
                    self.slab.get_mut(idx).prefetch = false;
                    self.touch(idx);
                    self.relink(idx, State::Mru);
                } else if !access.prefetch && self.now_ns >= last + self.cfg.min_promote_ns {
                    self.touch(idx);
                    self.relink(idx, State::Mfu);
                } else {
                    self.relink(idx, State::Mru);
                }
                Lookup::Hit(ListKind::Mru)
            }
            State::Mfu => {
                self.stats.hits += 1;
                self.stats.mfu_hits += 1;
                self.touch(idx);
                self.relink(idx, State::Mfu);
                Lookup::Hit(ListKind::Mfu)
            }
            State::MruGhost => {
                self.stats.misses += 1;
                self.stats.mru_ghost_hits += 1;
                self.ghost_hit_bytes[0] += size;
                Lookup::GhostHit(ListKind::Mru)
            }
            State::MfuGhost => {
                self.stats.misses += 1;
                self.stats.mfu_ghost_hits += 1;
                self.ghost_hit_bytes[1] += size;
                Lookup::GhostHit(ListKind::Mfu)
            }
        }
    }

    fn insert(&mut self, key: Key, size: u64, access: Access, evicted: &mut Vec<Key>) {
        self.now_ns = self.now_ns.max(access.now_ns);
        if let Some(&idx) = self.index.get(&key) {
            let e = self.slab.get(idx);
            let (state, old_size, was_prefetch) = (e.state, e.size, e.prefetch);
            // Resize in place, then file it where the access takes it.
            self.sizes[state as usize] -= old_size;
            self.sizes[state as usize] += size;
            self.slab.get_mut(idx).size = size;
            let to = match state {
                State::Mru | State::Mfu => state,
                State::MruGhost if was_prefetch || access.prefetch => State::Mru,
                State::MruGhost | State::MfuGhost => State::Mfu,
            };
            let e = self.slab.get_mut(idx);
            e.prefetch = access.prefetch;
            e.last_access_ns = self.now_ns;
            self.relink(idx, to);
        } else {
            self.place(key, size, access);
        }
        self.grow(size);
        self.evict(evicted);
        self.trim_ghosts();
    }

    fn scan_tail(&self, list: ListKind, max_size: u64, f: &mut dyn FnMut(Key, u64, bool) -> bool) {
        ZfsArc::scan_tail(self, list, max_size, f)
    }

    fn set_min_prefetch_ns(&mut self, ns: u64) {
        ZfsArc::set_min_prefetch_ns(self, ns)
    }

    fn remove(&mut self, key: Key) -> bool {
        let Some(&idx) = self.index.get(&key) else {
            return false;
        };
        let resident = matches!(self.slab.get(idx).state, State::Mru | State::Mfu);
        self.drop_entry(idx);
        resident
    }

    fn contains(&self, key: Key) -> bool {
        self.index.get(&key).is_some_and(|&i| matches!(self.slab.get(i).state, State::Mru | State::Mfu))
    }

    fn set_limits(&mut self, c_min: u64, c_max: u64, evicted: &mut Vec<Key>) {
        self.cfg.c_min = c_min.min(c_max);
        self.cfg.c_max = c_max;
        self.cfg.grow_margin = (32 << 20u64).min(c_max / 16);
        self.c = self.c.clamp(self.cfg.c_min, c_max);
        self.evict(evicted);
        self.trim_ghosts();
    }

    fn stats(&self) -> PolicyStats {
        let mut s = self.stats;
        s.c = self.c;
        s.c_min = self.cfg.c_min;
        s.c_max = self.cfg.c_max;
        s.mru_size = self.sizes[State::Mru as usize];
        s.mfu_size = self.sizes[State::Mfu as usize];
        s.mru_ghost_size = self.sizes[State::MruGhost as usize];
        s.mfu_ghost_size = self.sizes[State::MfuGhost as usize];
        s.size = self.resident();
        s.entries = (self.lists[0].len() + self.lists[1].len()) as u64;
        s.pd = self.pd;
        s
    }

    fn validate(&self) -> Result<(), String> {
        let c = self.c;
        if !(self.cfg.c_min..=self.cfg.c_max).contains(&c) {
            return Err(format!("c = {c} outside [{}, {}]", self.cfg.c_min, self.cfg.c_max));
        }
        if self.pd > ONE {
            return Err(format!("pd = {} > 2^32", self.pd));
        }
        let mut largest = 0;
        let mut listed = 0;
        for state in [State::Mru, State::Mfu, State::MruGhost, State::MfuGhost] {
            let list = &self.lists[state as usize];
            let mut sum = 0;
            for (idx, e) in self.slab.iter(list) {
                if e.state != state || self.index.get(&e.key) != Some(&idx) {
                    return Err(format!("entry {} misfiled on {state:?}", e.key));
                }
                sum += e.size;
                largest = largest.max(e.size);
            }
            if sum != self.sizes[state as usize] {
                return Err(format!(
                    "{state:?} size {} but entries sum to {sum}",
                    self.sizes[state as usize]
                ));
            }
            listed += list.len();
        }
        if listed != self.index.len() {
            return Err("index and lists disagree".into());
        }
        let [mru, mfu, mru_g, mfu_g] = self.sizes;
        // One entry larger than the whole cache may stand alone.
        if mru + mfu > c && self.lists[0].len() + self.lists[1].len() > 1 {
            return Err(format!("resident {} > c = {c}", mru + mfu));
        }
        if mru_g > c.max(largest) || mfu_g > c.max(largest) {
            return Err(format!("a ghost list exceeds c = {c}: {mru_g}, {mfu_g}"));
        }
        if mru + mfu + mru_g + mfu_g > 2 * c.max(largest) {
            return Err(format!("directory {} > 2c", mru + mfu + mru_g + mfu_g));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    fn arc(cap: u64) -> ZfsArc {
        ZfsArc::new(ZfsArcConfig::fixed(cap))
    }

    #[test]
    fn second_access_promotes_only_after_debounce() {
        let mut a = arc(10);
        let mut ev = Vec::new();
        assert_eq!(a.lookup(1, Access::demand(0)), Lookup::Miss);
        a.insert(1, 1, Access::demand(0), &mut ev);
        assert_eq!(a.lookup(1, Access::demand(10 * MS)), Lookup::Hit(ListKind::Mru));
        assert_eq!(a.stats().mru_size, 1, "a quick re-access stays in MRU");
        assert_eq!(a.lookup(1, Access::demand(100 * MS)), Lookup::Hit(ListKind::Mru));
        assert_eq!(a.stats().mfu_size, 1, "a later re-access promotes");
        a.validate().unwrap();
    }

    #[test]
    fn first_demand_after_prefetch_does_not_promote() {
        let mut a = arc(10);
        let mut ev = Vec::new();
        let pf = Access { now_ns: 0, prefetch: true };
        a.lookup(7, pf);
        a.insert(7, 1, pf, &mut ev);
        a.lookup(7, Access::demand(500 * MS));
        assert_eq!(a.stats().mru_size, 1);
        a.lookup(7, Access::demand(900 * MS));
        assert_eq!(a.stats().mfu_size, 1);
    }

    #[test]
    fn eviction_keeps_size_at_c_and_makes_ghosts() {
        let mut a = arc(4);
        let mut ev = Vec::new();
        for k in 0..6 {
            a.lookup(k, Access::demand(k * MS));
            a.insert(k, 1, Access::demand(k * MS), &mut ev);
            a.validate().unwrap();
        }
        assert_eq!(ev, vec![0, 1]);
        assert_eq!(a.stats().size, 4);
        assert!(!a.contains(0));
        assert_eq!(a.lookup(1, Access::demand(10 * MS)), Lookup::GhostHit(ListKind::Mru));
    }

    #[test]
    fn mfu_ghost_hits_shrink_the_mru_share() {
        let mut a = arc(64);
        let mut ev = Vec::new();
        let mut t = 0;
        // A frequently used set that is larger than the MFU side can hold
        // beside a stream of one-time reads.
        for round in 0..40 {
            for k in 0..48 {
                t += 100 * MS;
                if !a.lookup(k, Access::demand(t)).is_hit() {
                    a.insert(k, 1, Access::demand(t), &mut ev);
                }
            }
            for k in 0..32 {
                let key = 1000 + round * 32 + k;
                t += 100 * MS;
                a.lookup(key, Access::demand(t));
                a.insert(key, 1, Access::demand(t), &mut ev);
            }
            a.validate().unwrap();
        }
        let s = a.stats();
        assert!(s.pd < ONE / 2, "{s:?}");
    }

    #[test]
    fn young_prefetches_are_skipped_then_forced() {
        let mut a = arc(2);
        let mut ev = Vec::new();
        let pf = Access { now_ns: 0, prefetch: true };
        a.insert(1, 1, pf, &mut ev);
        a.insert(2, 1, pf, &mut ev);
        a.insert(3, 1, pf, &mut ev);
        assert!(a.stats().evict_skip > 0);
        assert_eq!(a.stats().size, 2, "RAM stays bounded even when all are young");
        a.validate().unwrap();
    }

    #[test]
    fn scan_tail_walks_from_the_eviction_end() {
        let mut a = arc(10);
        let mut ev = Vec::new();
        for k in 0..5 {
            a.insert(k, 1, Access::demand(k), &mut ev);
        }
        let mut seen = Vec::new();
        a.scan_tail(ListKind::Mru, 3, |k, _, _| {
            seen.push(k);
            true
        });
        assert_eq!(seen, vec![0, 1, 2]);
    }

    #[test]
    fn adjust_fraction_moves_and_stays_in_range() {
        assert_eq!(adjust_fraction(ONE / 2, 0, 5, 0), ONE / 2);
        let up = adjust_fraction(ONE / 2, 1 << 20, 1 << 10, 0);
        assert!(up > ONE / 2);
        let down = adjust_fraction(ONE / 2, 1 << 20, 0, 1 << 10);
        assert!(down < ONE / 2);
        assert_eq!(adjust_fraction(0, 1 << 20, 0, 1 << 20), 0);
        assert!(adjust_fraction(ONE, 1 << 20, 1 << 20, 0) <= ONE);
    }
}
