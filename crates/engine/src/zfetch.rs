//! zfetch: sequential stream detection per export, in the manner of
//! OpenZFS's `dmu_zfetch` (reference §4), on records instead of blocks.
//!
//! Each export keeps up to `zfetch_max_streams` streams, each expecting a
//! next record. A read at the expected place (or overlapping it) is a hit and
//! moves the stream on. A read ahead of it within `zfetch_max_reorder` is
//! remembered as a future range (`future`); once the future ranges cover
//! all but a quarter of the span up to the furthest of them, the stream
//! jumps there (`stride`): out-of-order clients and strided access keep
//! their stream, random reads do not fake one. A read just behind a
//! recently used stream is tolerated without prefetching (`past`).
//! Anything else starts a new stream, reusing an idle one when the table is
//! full. A stream's prefetch distance starts at the demand size, doubles per
//! hit up to `zfetch_min_distance`, then grows by an eighth per hit only when
//! the prefetch was late, up to `zfetch_max_distance`. Data is prefetched only
//! once the stream has seen a demand miss: a stream that hits in RAM anyway
//! costs nothing.

use std::ops::Range;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use arcache_sync::Mutex;

#[derive(Debug)]
pub struct ZfetchTunables {
    pub disable: AtomicBool,
    pub max_distance: AtomicU64,
    pub min_distance: AtomicU64,
    pub max_streams: AtomicU64,
    pub max_reorder: AtomicU64,
}

impl Default for ZfetchTunables {
    fn default() -> Self {
        ZfetchTunables {
            disable: AtomicBool::new(false),
            max_distance: AtomicU64::new(64 << 20),
            min_distance: AtomicU64::new(4 << 20),
            max_streams: AtomicU64::new(8),
            max_reorder: AtomicU64::new(16 << 20),
        }
    }
}

/// zfetchstats, summed over every export.
#[derive(Debug, Default)]
pub struct ZfetchStats {
    pub hits: AtomicU64,
    pub future: AtomicU64,
    pub stride: AtomicU64,
    pub past: AtomicU64,
    pub misses: AtomicU64,
    pub max_streams: AtomicU64,
    pub io_issued: AtomicU64,
    pub io_active: AtomicU64,
}

/// Streams idle this long are reused first, and dropped after twice as long.
const MIN_REAP: Duration = Duration::from_secs(1);
const MAX_REAP: Duration = Duration::from_secs(2);

#[derive(Debug)]
struct Stream {
    /// The record the stream expects next.
    next: u64,
    last_use: Instant,
    /// Prefetch distance in bytes.
    dist: u64,
    /// Prefetch has been issued up to (not including) this record.
    issued_until: u64,
    missed: bool,
    hit_once: bool,
    /// Reads that met the stream where it expected them (saturating).
    in_order: u32,
    /// Ranges read ahead of `next`, at most [`MAX_FUTURE`].
    future: Vec<Range<u64>>,
}

const MAX_FUTURE: usize = 8;

/// Reads in order after which a stream counts as running for
/// [`Zfetch::continues_stream`]: random reads make a stream now and then
/// by landing next to another, but seldom several in a row, and a miss
/// they widen by mistake costs a whole unit.
const RUNNING: u32 = 4;

impl Stream {
    /// Future ranges the stream now reaches are part of it: it moves past
    /// each.
    fn absorb_reached_futures(&mut self) {
        while let Some(i) = self.future.iter().position(|f| f.start <= self.next) {
            let f = self.future.swap_remove(i);
            self.next = self.next.max(f.end);
        }
    }

    /// Records an access ahead of the stream; true if the stream should now
    /// jump to the end of its future ranges.
    fn note_future(&mut self, r: Range<u64>) -> bool {
        if self.future.len() == MAX_FUTURE {
            // A client with more reads in flight than are kept here: the
            // stream catches up to the lowest of them rather than forget
            // it. Forgotten, it left a hole no later read fills (the read
            // was already seen), and the stream stood still behind it
            // while its reader went on.
            let lowest = (0..self.future.len()).min_by_key(|&i| self.future[i].start).unwrap_or(0);
            let f = self.future.swap_remove(lowest);
            self.next = self.next.max(f.end);
            self.absorb_reached_futures();
        }
        self.future.push(r);
        let far = self.future.iter().map(|f| f.end).max().unwrap_or(self.next);
        let span = far.saturating_sub(self.next);
        let mut covered: Vec<Range<u64>> = self.future.clone();
        covered.sort_by_key(|f| f.start);
        let mut sum = 0;
        let mut reach = self.next;
        for f in covered {
            let start = f.start.max(reach);
            if f.end > start {
                sum += f.end - start;
                reach = f.end;
            }
        }
        span > 0 && (span - sum) * 4 <= span
    }
}

/// The streams of one export.
pub struct Zfetch {
    streams: Mutex<Vec<Stream>>,
    recordsize: u64,
    records: u64,
    /// Prefetches end on multiples of this many records (the backing
    /// store's read unit; 1 for none).
    unit: AtomicU64,
}

impl Zfetch {
    pub fn new(recordsize: u64, size: u64) -> Zfetch {
        Zfetch::with_unit(recordsize, size, 1)
    }

    /// Streams whose prefetches are whole units of `unit` records: a store
    /// that is costly per request then gets one read per unit, however
    /// little the stream moved since the last prefetch.
    pub fn with_unit(recordsize: u64, size: u64, unit: u64) -> Zfetch {
        Zfetch {
            streams: Mutex::new(Vec::new()),
            recordsize,
            records: size.div_ceil(recordsize),
            unit: AtomicU64::new(unit.max(1)),
        }
    }

    /// Notes a demand read of records `first..first+n`; `missed` if any of
    /// them was not in RAM. Returns the records to prefetch now, if any.
    pub fn observe(
        &self,
        first: u64,
        n: u64,
        missed: bool,
        now: Instant,
        t: &ZfetchTunables,
        st: &ZfetchStats,
    ) -> Option<Range<u64>> {
        if t.disable.load(Relaxed) || n == 0 {
            return None;
        }
        let end = first + n;
        let reorder = (t.max_reorder.load(Relaxed) / self.recordsize).max(1);
        let mut streams = self.streams.lock();
        streams.retain(|s| now.duration_since(s.last_use) < MAX_REAP || !s.hit_once);
        let found = streams.iter().position(|s| {
            (first <= s.next && s.next <= end) || (first > s.next && first - s.next <= reorder)
        });
        if let Some(i) = found {
            let s = &mut streams[i];
            if first > s.next {
                if !s.note_future(first..end) {
                    s.last_use = now;
                    st.future.fetch_add(1, Relaxed);
                    return None;
                }
                let far = s.future.iter().map(|f| f.end).max().unwrap_or(end);
                s.future.clear();
                st.stride.fetch_add(1, Relaxed);
                return self.advance(s, first, far, missed, now, t);
            }
            st.hits.fetch_add(1, Relaxed);
            // Only reads that meet the stream where it expects them make it
            // running: random reads seldom do so several times in a row.
            s.in_order = s.in_order.saturating_add(1);
            return self.advance(s, first, end, missed, now, t);
        }
        let behind = streams.iter_mut().find(|s| {
            first < s.next && s.next - first <= reorder && now.duration_since(s.last_use) < MAX_REAP
        });
        if let Some(s) = behind {
            s.last_use = now;
            st.past.fetch_add(1, Relaxed);
            return None;
        }
        st.misses.fetch_add(1, Relaxed);
        if end >= self.records {
            return None;
        }
        let fresh = Stream {
            next: end,
            last_use: now,
            dist: n * self.recordsize,
            issued_until: end,
            missed,
            hit_once: false,
            in_order: 0,
            future: Vec::new(),
        };
        let max = t.max_streams.load(Relaxed).max(1) as usize;
        if streams.len() < max {
            streams.push(fresh);
        } else if let Some(old) = streams
            .iter_mut()
            .filter(|s| !s.hit_once || now.duration_since(s.last_use) >= MIN_REAP)
            .min_by_key(|s| s.last_use)
        {
            *old = fresh;
        } else {
            st.max_streams.fetch_add(1, Relaxed);
        }
        None
    }

    fn advance(
        &self,
        s: &mut Stream,
        first: u64,
        end: u64,
        missed: bool,
        now: Instant,
        t: &ZfetchTunables,
    ) -> Option<Range<u64>> {
        // Late: the demand caught up with data already being prefetched.
        let late = missed && first < s.issued_until && s.hit_once;
        s.next = end.max(s.next);
        s.absorb_reached_futures();
        s.last_use = now;
        s.hit_once = true;
        s.missed |= missed;
        let (min_d, max_d) = (t.min_distance.load(Relaxed), t.max_distance.load(Relaxed));
        if s.dist < min_d {
            s.dist = (s.dist * 2).min(min_d.max(self.recordsize));
        } else if late {
            s.dist += s.dist / 8;
        }
        s.dist = s.dist.min(max_d.max(self.recordsize));
        if !s.missed {
            return None;
        }
        let mut want_end = s.next + s.dist.div_ceil(self.recordsize);
        if s.in_order >= RUNNING {
            // Not before: a stream that random reads made by chance would
            // cost a whole unit for each of its few prefetches.
            let unit = self.unit.load(Relaxed);
            want_end = want_end.div_ceil(unit) * unit;
        }
        let want_end = want_end.min(self.records);
        let from = s.issued_until.max(s.next);
        if from >= want_end {
            return None;
        }
        s.issued_until = want_end;
        Some(from..want_end)
    }

    /// Whether a read of records `first..first+n` falls where a stream
    /// already seen running ([`RUNNING`] reads in order) is reading or about to
    /// read, from `zfetch_max_reorder` behind what it expects next to as
    /// far past what it has prefetched. Changes no stream: a reader asks
    /// (to widen a miss on a store that is costly per request) and reports
    /// the read with [`Zfetch::observe`] before its fills. Behind is
    /// included because clients keep many reads in flight, which the
    /// workers take up in whatever order they run, not the order sent.
    pub fn continues_stream(&self, first: u64, n: u64, t: &ZfetchTunables) -> bool {
        if t.disable.load(Relaxed) || n == 0 {
            return false;
        }
        let reorder = (t.max_reorder.load(Relaxed) / self.recordsize).max(1);
        self.streams.lock().iter().any(|s| {
            s.in_order >= RUNNING
                && first + n > s.next.saturating_sub(reorder)
                && first <= s.issued_until.max(s.next) + reorder
        })
    }

    /// Changes the unit prefetches end on (1: none).
    pub fn set_unit(&self, unit: u64) {
        self.unit.store(unit.max(1), Relaxed);
    }

    pub fn stream_count(&self) -> usize {
        self.streams.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(
        z: &Zfetch,
        first: u64,
        n: u64,
        missed: bool,
        t: &ZfetchTunables,
        st: &ZfetchStats,
    ) -> Option<Range<u64>> {
        z.observe(first, n, missed, Instant::now(), t, st)
    }

    #[test]
    fn a_sequential_reader_gets_a_growing_window_ahead() {
        let (t, st) = (ZfetchTunables::default(), ZfetchStats::default());
        let z = Zfetch::new(16 << 10, 1 << 30);
        assert_eq!(read(&z, 0, 8, true, &t, &st), None, "a first read only starts a stream");
        let mut issued = Vec::new();
        let mut at = 8;
        for _ in 0..12 {
            if let Some(r) = read(&z, at, 8, true, &t, &st) {
                assert!(r.start >= at + 8, "prefetch is ahead of the reader");
                issued.push(r);
            }
            at += 8;
        }
        assert!(!issued.is_empty());
        let widths: Vec<u64> = issued.iter().map(|r| r.end - r.start).collect();
        let reach = issued.last().unwrap().end - at;
        assert!(reach * (16 << 10) >= 4 << 20, "window reached min_distance: {widths:?}");
        assert!(reach * (16 << 10) <= 64 << 20);
        assert!(st.hits.load(Relaxed) >= 12);
    }

    #[test]
    fn only_reads_near_a_running_stream_continue_it() {
        let (t, st) = (ZfetchTunables::default(), ZfetchStats::default());
        // 128K records: zfetch_max_reorder (16M) is 128 records.
        let z = Zfetch::new(128 << 10, 1 << 34);
        assert!(!z.continues_stream(0, 2, &t), "no stream yet");
        read(&z, 1000, 2, true, &t, &st);
        for at in (1002..1010).step_by(2) {
            assert!(
                !z.continues_stream(at, 2, &t),
                "{} reads in order are not a stream yet",
                (at - 1000) / 2
            );
            read(&z, at, 2, true, &t, &st);
        }
        assert!(z.continues_stream(1010, 2, &t), "the next read");
        assert!(z.continues_stream(1010 + 100, 2, &t), "a read in flight ahead");
        assert!(z.continues_stream(1010 - 100, 2, &t), "a read in flight behind");
        assert!(!z.continues_stream(1010 + 5000, 2, &t), "far ahead is another place");
        assert!(!z.continues_stream(10, 2, &t), "far behind is another place");
        t.disable.store(true, Relaxed);
        assert!(!z.continues_stream(1010, 2, &t), "zfetch_prefetch_disable turns it off");
    }

    #[test]
    fn a_stream_on_a_store_with_a_read_unit_prefetches_whole_units() {
        let (t, st) = (ZfetchTunables::default(), ZfetchStats::default());
        let z = Zfetch::with_unit(128 << 10, 1 << 34, 32);
        let mut issued = Vec::new();
        for at in (0..400).step_by(2) {
            issued.extend(read(&z, at, 2, true, &t, &st));
        }
        assert!(!issued.is_empty());
        // Once the stream is running (RUNNING reads in order), each
        // prefetch ends on a unit and starts where the last one ended.
        let running = &issued[RUNNING as usize..];
        for r in running {
            assert_eq!(r.end % 32, 0, "{r:?} ends on a unit: {issued:?}");
        }
        for w in running.windows(2) {
            assert_eq!(w[0].end, w[1].start, "{issued:?}");
        }
        let units = (running[running.len() - 1].end - running[0].start) / 32;
        assert!(running.len() as u64 <= units, "at most one prefetch per unit: {issued:?}");
    }

    #[test]
    fn no_prefetch_while_everything_hits() {
        let (t, st) = (ZfetchTunables::default(), ZfetchStats::default());
        let z = Zfetch::new(16 << 10, 1 << 30);
        for i in 0..20 {
            assert_eq!(read(&z, i * 4, 4, false, &t, &st), None);
        }
    }

    #[test]
    fn interleaved_streams_and_reordering_are_tolerated() {
        let (t, st) = (ZfetchTunables::default(), ZfetchStats::default());
        let z = Zfetch::new(4096, 1 << 30);
        for i in 0..10u64 {
            read(&z, i * 2, 2, true, &t, &st);
            read(&z, 100_000 + i * 2, 2, true, &t, &st);
        }
        assert_eq!(z.stream_count(), 2);
        // Reads that arrive out of order: the later one first (a future
        // range), then the one it skipped, which fills the hole.
        read(&z, 22, 2, true, &t, &st);
        assert_eq!(st.future.load(Relaxed), 1);
        read(&z, 20, 2, true, &t, &st);
        assert_eq!(z.streams.lock()[0].next, 24, "the stream covers both");
        // Strided reads with small holes make the stream jump.
        read(&z, 25, 3, true, &t, &st);
        assert_eq!(st.stride.load(Relaxed), 1);
        // Just behind a live stream: tolerated, not a new stream.
        read(&z, 23, 1, true, &t, &st);
        assert_eq!(st.past.load(Relaxed), 1);
        assert_eq!(z.stream_count(), 2);
    }

    #[test]
    fn random_reads_do_not_prefetch_and_streams_stay_bounded() {
        let (t, st) = (ZfetchTunables::default(), ZfetchStats::default());
        let z = Zfetch::new(4096, 1 << 34);
        let mut x = 12345u64;
        for _ in 0..1000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            assert_eq!(read(&z, (x >> 20) % (1 << 22), 1, true, &t, &st), None);
        }
        assert!(z.stream_count() <= 8);
        assert!(st.misses.load(Relaxed) > 900);
    }

    #[test]
    fn disabled_does_nothing() {
        let (t, st) = (ZfetchTunables::default(), ZfetchStats::default());
        t.disable.store(true, Relaxed);
        let z = Zfetch::new(4096, 1 << 30);
        for i in 0..10 {
            assert_eq!(read(&z, i, 1, true, &t, &st), None);
        }
        assert_eq!(z.stream_count(), 0);
    }
}
