//! Which keys are worth keeping: GET frequencies net of writes and wasted fills (a count-min
//! sketch), the sampled top keys for `CORRAL HOTKEYS`, and when a hit should refresh early.

use std::cell::Cell;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

use rand::Rng;
use tokio_util::sync::CancellationToken;

use super::bar::Bar;
use super::churn::{Churn, PAYS};
use super::entry::Entry;
use super::hotkeys::{self, HotKey, HotKeys};
use super::lasting::{self, Lasting};
use super::lately::ReadLately;
use super::sketch::FrequencySketch;
use super::touched::Touched;
use super::tracking::{LaneState, Tracking};
use super::window::Window;
use super::written::WrittenLately;
use crate::striped::StripedCounter;

/// What a write weighs against a key's reads, in reads: all a counter holds (15), so a write
/// resets the key's estimate, and only the reads since its last write count towards its
/// admission. A write ends the key's entry, and the tracked fill that replaces it costs two
/// upstream commands (PTTL, GET), Redis's tracking of the key, the invalidation push of the
/// next write and corral's handling of each, where forwarding costs one command per read.
/// With a weight of 4, keys read nine times per write (Zipf GET/SET 90/10) were cached and
/// refilled 0.054 times per request, and the cache cost corral and Redis together more CPU
/// than it saved them; at 15, 0.018 times, with less CPU on both sides.
const WRITE_WEIGHT: u64 = 15;
/// Longest an XFetch refresh can come early: `-ln r` for the smallest positive `r` drawn.
const MAX_EARLY_FACTOR: f64 = 708.5;
/// An entry bounded by `max_age_ms` alone draws its refresh on this fraction of its life
/// (see [`Admission::age_refresh`]).
const AGE_SCALE: u32 = 128;
/// ...and draws only in this last fraction of it.
const AGE_WINDOW: u32 = 16;
/// Looks (250 ms each) after a switch of the read sketch's window before the store may be
/// swept (see [`Admission::follow_served`]): a switch forgets every count, and a second of
/// GETs at the rates where the window grows (a short sample's worth, or more) counts the
/// keys worth keeping again.
const RECOUNT_LOOKS: u8 = 4;

thread_local! {
    /// State of a per-thread xorshift generator for sampling GETs: `rand::rng()` costs
    /// more than the rest of a hit's bookkeeping, and sampling needs no quality. A constant
    /// seed makes the thread-local a plain load, with no lazy initialisation to check.
    static SAMPLER: Cell<u64> = const { Cell::new(0x9e37_79b9_7f4a_7c15) };
}

/// True about once in `n` calls (`n` a power of two), at random, so a periodic request
/// pattern (a pipeline repeating the same keys) is not sampled at one fixed position.
#[inline]
pub(super) fn one_in(n: u64) -> bool {
    below(n) == 0
}

/// A number from 0 to `n - 1` (`n` a power of two), at random.
#[inline]
pub(super) fn below(n: u64) -> u64 {
    SAMPLER.with(|s| {
        let mut x = s.get();
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        s.set(x);
        (x >> 32) & (n - 1)
    })
}

/// A GET's count in the sketch, as [`Admission::record_get`] leaves it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Reads {
    /// The key's estimate, this GET included.
    pub(super) count: u8,
    /// Above the noise floor ([`Admission::may_be_cached`]).
    pub(super) warm: bool,
    /// Clearly above it: by more than one count, when there is a floor. On a large key space
    /// a key read once clears the floor by one count by chance about one time in ten (its
    /// four counters all hold at least the mean: 9% of uniform GETs over 1M keys), by two
    /// far less often (about one time in fifty, estimated). A key that
    /// is not is treated as cold on a miss: only a second read soon after registers a read
    /// others may join (`recent.rs`).
    pub(super) settled: bool,
}

/// Admission state shared by every GET.
#[derive(Debug)]
pub(super) struct Admission {
    reads: FrequencySketch,
    /// Keys read above the noise floor since the last decay tick: only their writes weigh
    /// against reads.
    lately: ReadLately,
    /// Keys whose entries writes end before they repay their fill: not admitted.
    churn: Churn,
    /// Whether the entries filled lately last.
    lasting: Lasting,
    /// Keys written lately: not worth a read others may join.
    written: WrittenLately,
    hot: HotKeys,
    /// Keys of sampled hits since `touch.rs` last looked.
    touched: Touched,
    hasher: foldhash::fast::RandomState,
    bar: Bar,
    /// Whether `reads` counts over its long window (see `window.rs`).
    window: Window,
    /// Keys written (through corral, or invalidated before a hit), counted since start, and
    /// what the last look at the window saw of it.
    writes: StripedCounter,
    writes_seen: AtomicU64,
    /// Looks since the window last switched (saturating; at the most if it never did).
    since_switch: AtomicU8,
    /// The bar came back to the top too soon after a switch: the sweep waits.
    sweep_waiting: AtomicBool,
    beta: f64,
}

impl Admission {
    /// `candidates` sizes the sketches; a key read `hot_threshold` times is admitted; `beta`
    /// scales early refreshes (0 disables them).
    pub(super) fn new(candidates: usize, hot_threshold: u8, beta: f64) -> Admission {
        Admission {
            reads: FrequencySketch::new(candidates),
            lately: ReadLately::default(),
            churn: Churn::default(),
            lasting: Lasting::default(),
            written: WrittenLately::default(),
            hot: HotKeys::default(),
            touched: Touched::new(Duration::ZERO),
            hasher: foldhash::fast::RandomState::default(),
            bar: Bar::new(hot_threshold, hot_threshold),
            window: Window::new(false),
            writes: StripedCounter::default(),
            writes_seen: AtomicU64::new(0),
            since_switch: AtomicU8::new(u8::MAX),
            sweep_waiting: AtomicBool::new(false),
            beta,
        }
    }

    /// Lets the bar come down to `least` while the cache serves most GETs (see `bar.rs`).
    pub(super) fn lowering_to(mut self, least: u8) -> Admission {
        self.bar = Bar::new(self.bar.top(), least);
        self
    }

    /// Keeps the keys of sampled hits for `touch.rs`, looking every `every` (zero: never), to
    /// take ([`Admission::touched`]).
    pub(super) fn touching(mut self, every: Duration) -> Admission {
        self.touched = Touched::new(every);
        self
    }

    /// Lets the read sketch take its long window while the cache serves most GETs and few
    /// keys are written (see `window.rs`).
    pub(super) fn growing_window(mut self, allowed: bool) -> Admission {
        self.window = Window::new(allowed);
        if allowed {
            self.reads = FrequencySketch::growing(self.reads.short_words());
        }
        self
    }

    /// The hasher behind [`Admission::hash`].
    pub(super) fn hasher(&self) -> foldhash::fast::RandomState {
        self.hasher.clone()
    }

    pub(super) fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    /// Asks the CPU to load the key's counters, to have them at hand when its GET is counted.
    pub(super) fn prefetch(&self, hash: u64) {
        self.reads.prefetch(hash);
    }

    /// Asks the CPU to load what a write of the key with this hash reads: whether it was
    /// read lately ([`Admission::record_write`]), a cache miss on most SETs of a write-only
    /// load, and its read counters, which a write of a key read lately takes from: a miss
    /// on nearly every SET of the 90/10 mix, where the write weighing took 4.0 ns per
    /// request without this and 0.5 with it (perf, -P 16, the mix settled).
    pub(super) fn prefetch_write(&self, hash: u64) {
        self.lately.prefetch(hash);
        self.reads.prefetch(hash);
    }

    /// Counts a GET of `key` (hash `hash`), and samples it for the top keys. Returns the
    /// key's read estimate, for [`Admission::may_be_cached`] and [`Admission::admit`].
    pub(super) fn record_get(&self, hash: u64, key: &[u8]) -> Reads {
        let count = self.reads.increment(hash);
        let floor = self.reads.noise_floor();
        // `may_be_cached`, with the floor read once for both.
        let warm = count > floor;
        let settled = count > floor.saturating_add(u8::from(floor > 0));
        // A key at the noise floor (on a large key space, nearly every GET) is neither a top
        // key nor one whose writes need weighing: it costs the sketch alone. Only keys hot
        // enough to be admitted are sampled for the top keys: on a long tail most sampled
        // keys would otherwise evict one another from its 64 slots, each with a copy of the
        // key.
        if warm {
            self.lately.note(hash);
            if count >= self.top_bar(floor) && one_in(hotkeys::SAMPLE_EVERY) {
                self.hot.record(hash, key);
            }
        }
        Reads {
            count,
            warm,
            settled,
        }
    }

    /// A hit the store served (counted by [`Admission::record_get`] or
    /// [`Admission::record_read`]): sampled for the keys to touch (`touched.rs`). Hits only:
    /// a GET that reaches Redis is a use Redis sees.
    pub(super) fn sample_touch(&self, hash: u64, key: &[u8]) {
        if one_in(hotkeys::SAMPLE_EVERY) {
            self.touched.sampled(hash, key);
        }
    }

    /// A front hit served without counting it ([`Admission::record_get`]): sampled for the
    /// keys to touch and the top keys at the rate a counted GET of a key past the bar is, so
    /// keys the front serves rank among the others by their real rates.
    pub(super) fn sample_hit(&self, hash: u64, key: &[u8]) {
        if one_in(hotkeys::SAMPLE_EVERY) {
            self.touched.sampled(hash, key);
            self.hot.record(hash, key);
        }
    }

    /// Whether a key read `reads` times (its estimate) can be in the store at all: a key is
    /// admitted only once read `hot_threshold` times above the noise floor, so one at or
    /// below the floor is a cold key, and its GET skips the store lookup (on a large key
    /// space, a miss in a large table). An entry whose key has cooled off since is then
    /// not served but read from Redis, which is always correct.
    pub(super) fn may_be_cached(&self, reads: u8) -> bool {
        reads > self.reads.noise_floor()
    }

    /// The key's read estimate, as it stands.
    #[cfg(test)]
    pub(super) fn estimate(&self, hash: u64) -> u8 {
        self.reads.estimate(hash)
    }

    /// The read sketch's noise floor (see `FrequencySketch::noise_floor`), for the stats.
    pub(super) fn noise_floor(&self) -> u8 {
        self.reads.noise_floor()
    }

    /// A write of the key with this hash weighs against its reads: one through corral, about
    /// to be forwarded, or one corral did not see (another client writing to Redis directly),
    /// known when Redis invalidated the key's entry before it served a hit. A count of such
    /// wasted fills of its own, apart from the reads, would shut out the hottest keys of a
    /// read-mostly workload: they are filled most often, so they also waste the most fills,
    /// though few of theirs.
    ///
    /// A key not read since the last decay tick has nothing in the sketch worth taking off
    /// (see `lately.rs`); its write leaves the sketch alone.
    pub(super) fn record_write(&self, hash: u64) {
        self.writes.inc();
        self.written.wrote(hash);
        if self.lately.seen(hash) {
            self.reads.decrement(hash, WRITE_WEIGHT);
        }
    }

    /// Whether the key with this hash was written lately (see [`Admission::record_write`]):
    /// unless it is admitted, its GETs are forwarded rather than made reads others join
    /// (see `written.rs`).
    pub(super) fn written_lately(&self, hash: u64) -> bool {
        self.written.lately(hash)
    }

    /// Counts a read of the key with this hash for hotness only (MGET); returns its estimate.
    pub(super) fn record_read(&self, hash: u64) -> u8 {
        let reads = self.reads.increment(hash);
        if self.may_be_cached(reads) {
            self.lately.note(hash);
        }
        reads
    }

    /// A write (through corral or not) ended an entry of the key with this hash after it
    /// served `hits`: the key's entries may not repay their fills (see `churn.rs`).
    pub(super) fn entry_ended(&self, hash: u64, hits: u8) {
        self.churn.ended(hash, hits);
        if hits < PAYS {
            self.lasting.ended_young();
        }
    }

    /// A fill of the key with this hash read a value over `max_value_bytes`: the key is
    /// not admitted again for a while (`Churn::shut`). Filled again at each miss, it would
    /// cost a tracked fill per GET, each holding up the lane's invalidations behind it
    /// (and, over Redis's `client-output-buffer-limit`, closing the lane: a key whose fills
    /// were lost with their lane twice lately is taken for one, `lost.rs`).
    pub(super) fn oversized(&self, hash: u64) {
        self.churn.shut(hash);
    }

    /// Whether the entries filled lately last (see `lasting.rs`).
    pub(super) fn fills_last(&self) -> bool {
        self.lasting.last()
    }

    /// A tracked fill started; returns whether the entries filled lately last (see
    /// `lasting.rs`).
    pub(super) fn filled(&self) -> bool {
        self.lasting.filled()
    }

    /// Every [`lasting::LOOK`]: works out again whether fills last, and ages the keys
    /// written lately.
    pub(super) fn look(&self) {
        self.look_at_fills();
        self.written.tick();
    }

    /// Works out again whether fills last, from the fills and young endings since the last
    /// look.
    pub(super) fn look_at_fills(&self) {
        self.lasting.look();
    }

    /// Hot enough to keep: reads net of [`WRITE_WEIGHT`] per write and per wasted fill,
    /// and entries that writes let serve enough hits (see [`Admission::hot`]).
    ///
    /// Hot means read `hot_threshold` times more than the sketch's noise floor: over a key
    /// space far larger than the sketch every counter is shared, and a key read once would
    /// otherwise often look hot and cost a tracked fill for nothing. With few
    /// keys the floor is 0 and the threshold is what it says.
    pub(super) fn admit(&self, reads: u8, hash: u64, lane: &LaneState) -> bool {
        lane.tracking() != Tracking::Down && self.hot(reads, hash)
    }

    /// Whether the key with this hash, read `reads` times (its estimate), is hot enough to
    /// be admitted, whatever the state of its lane (see [`Admission::admit`]): read often
    /// enough since its last write, and not one whose entries writes end too soon.
    pub(super) fn hot(&self, reads: u8, hash: u64) -> bool {
        reads >= self.bar(self.reads.noise_floor()) && !self.churn.shut_out(hash)
    }

    /// The estimate a key needs to be admitted, over a noise floor of `floor`.
    fn bar(&self, floor: u8) -> u8 {
        self.bar.get().saturating_add(floor).min(15)
    }

    /// The estimate the bar asks as set, unlowered: a key read this often is sampled for the
    /// top keys, and a lowered bar does not crowd their 64 slots with more of a long tail.
    fn top_bar(&self, floor: u8) -> u8 {
        self.bar.top().saturating_add(floor).min(15)
    }

    /// After a period in which the cache saw `gets` GETs and served `served` of them (and
    /// keys were written since the last look): switches the read sketch's window if
    /// `window.rs` says so, and moves the bar (see `bar.rs`). Returns whether the store is to
    /// be swept of the entries whose keys the top bar would not admit now: when the bar came
    /// back to the top, or later if that was within [`RECOUNT_LOOKS`] of a switch of window.
    pub(super) fn follow_served(&self, gets: u64, served: u64) -> bool {
        let writes = self.writes.get();
        let written = writes.saturating_sub(self.writes_seen.swap(writes, Relaxed));
        let long = self.reads.is_long();
        let switched = self
            .reads
            .set_long(self.window.follow(long, gets, served, written));
        let back_at_top = self.bar.follow(gets, served, self.lasting.last());
        self.sweep_due(switched, back_at_top)
    }

    /// Whether to sweep now (see [`Admission::follow_served`]). Right after a switch every
    /// estimate is near 0, and a sweep would drop the hottest keys with the tail: the window
    /// leaves the long one when writes come, just when entries ended young send the bar back
    /// to the top.
    fn sweep_due(&self, switched: bool, back_at_top: bool) -> bool {
        let since = match switched {
            true => 0,
            false => self.since_switch.load(Relaxed).saturating_add(1),
        };
        self.since_switch.store(since, Relaxed);
        if !back_at_top && !self.sweep_waiting.load(Relaxed) {
            return false;
        }
        let waits = since < RECOUNT_LOOKS;
        self.sweep_waiting.store(waits, Relaxed);
        // A bar come down again meanwhile keeps what it admits.
        !waits && self.bar.get() == self.bar.top()
    }

    /// Whether the read sketch counts over its long window (see `window.rs`).
    pub(super) fn long_window(&self) -> bool {
        self.reads.is_long()
    }

    /// Whether the key with this hash is read often enough for the bar as set, unlowered.
    pub(super) fn hot_at_top(&self, hash: u64) -> bool {
        self.reads.estimate(hash) >= self.top_bar(self.reads.noise_floor())
    }

    /// The longest an XFetch refresh can come before expiry for a key whose fill took
    /// `delta` (zero with refreshes off): kept in its entry, so a hit far from expiry skips
    /// the draw with one comparison.
    pub(super) fn refresh_window(&self, delta: Duration) -> Duration {
        if self.beta <= 0.0 {
            return Duration::ZERO;
        }
        let most_us = (delta.as_micros() as f64 * self.beta * MAX_EARLY_FACTOR).min(3.6e9);
        Duration::from_micros(most_us as u64)
    }

    /// XFetch's scale and window for an entry that only `max_age_ms` bounds (no TTL in Redis
    /// ends it sooner), whose fill took `delta` and which lives `life`. Such an entry's
    /// expiry is corral's own, not the data's: refreshed a little early, a key still read
    /// goes on being served instead of missing once every `max_age_ms` (a round of
    /// requests waiting on the fill). The draw scales with a 128th of the life rather than
    /// the fill's time, so a key read a few times a second is refreshed in its last second
    /// or so, a key read once in a while seldom is (it would rather expire), and no draw
    /// comes earlier than a 16th of its life before expiry.
    pub(super) fn age_refresh(&self, delta: Duration, life: Duration) -> (Duration, Duration) {
        if self.beta <= 0.0 {
            return (delta, Duration::ZERO);
        }
        let scale = delta.max(life / AGE_SCALE);
        (scale, self.refresh_window(scale).min(life / AGE_WINDOW))
    }

    /// XFetch: refresh with a probability that grows as expiry nears, earlier for keys whose
    /// fill took longer.
    #[inline]
    pub(super) fn should_refresh(&self, e: &Entry, now: Instant) -> bool {
        // Far from expiry no draw can make it early enough (see `refresh_window`).
        if e.fresh_at(now) || self.beta <= 0.0 {
            return false;
        }
        self.draw_refresh(e, now)
    }

    fn draw_refresh(&self, e: &Entry, now: Instant) -> bool {
        let r: f64 = rand::rng().random_range(f64::MIN_POSITIVE..1.0);
        let early = e.delta().as_secs_f64() * self.beta * -r.ln();
        now + Duration::from_secs_f64(early.min(3600.0)) >= e.expires()
    }

    /// The `n` hottest keys by sampled GET rate.
    pub(super) fn top(&self, n: usize) -> Vec<HotKey> {
        self.hot.top(n)
    }

    /// The keys of sampled hits since the last call (`touch.rs`), each once.
    pub(super) fn touched(&self) -> Vec<bytes::Bytes> {
        self.touched.take()
    }

    /// Ages the top keys, the writes weighed and the churn scores; and (more often) looks at
    /// whether fills last and ages the keys written lately.
    pub(super) async fn decay(self: Arc<Self>, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(Duration::from_secs(10));
        let mut look = tokio::time::interval(lasting::LOOK);
        // A look compares what happened since the last: after a stall, one takes it all in.
        look.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    self.hot.decay();
                    self.lately.clear();
                    self.churn.halve();
                }
                _ = look.tick() => self.look(),
                _ = shutdown.cancelled() => return,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sampling_takes_about_one_in_n() {
        let hits = (0..16_000).filter(|_| one_in(16)).count();
        assert!((700..1300).contains(&hits), "{hits} of 16000");
    }

    #[test]
    fn only_keys_hot_enough_to_admit_are_sampled_for_the_top_keys() {
        let a = Admission::new(1024, 4, 1.0);
        let mut x = 1u64;
        for i in 0..200_000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = if i % 10 == 0 { 7 } else { x % 1_000_000 };
            a.record_get(a.hash(&key.to_le_bytes()), &key.to_le_bytes());
        }
        let top = a.top(hotkeys::SLOTS);
        assert_eq!(&top[0].key[..], &7u64.to_le_bytes());
        // Some 18,000 of the cold GETs clear the noise floor (about one in ten), enough to
        // fill every slot were they sampled; few clear the admission bar.
        assert!(top.len() < hotkeys::SLOTS / 2, "{} keys sampled", top.len());
    }

    #[test]
    fn keys_read_once_over_a_big_key_space_are_not_admitted_but_repeated_ones_are() {
        let a = Admission::new(1024, 4, 1.0);
        let lane = LaneState::new("test", Tracking::On);
        let mut x = 1u64;
        let (mut admitted, mut misses) = (0, 0);
        for i in 0..200_000u64 {
            // Uniform over a million keys, with one key read every tenth GET.
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = if i % 10 == 0 { 7 } else { x % 1_000_000 };
            let hash = a.hash(&key.to_le_bytes());
            a.record_get(hash, &key.to_le_bytes());
            if key != 7 {
                misses += 1;
                admitted += usize::from(a.admit(a.reads.estimate(hash), hash, &lane));
            }
        }
        assert!(
            admitted * 100 < misses,
            "{admitted} of {misses} cold keys admitted"
        );
        let hot = a.hash(&7u64.to_le_bytes());
        assert!(a.admit(a.reads.estimate(hot), hot, &lane));
    }

    /// GETs, out of the last `measured` of `total` uniform GETs over a million keys, whose
    /// key could be admitted as it was read, with the sketch sized as for the default budget.
    fn cold_admissions(hot_threshold: u8, total: u64, measured: u64) -> u64 {
        let a = Admission::new(1 << 16, hot_threshold, 1.0);
        let lane = LaneState::new("test", Tracking::On);
        let mut x = 7u64;
        let mut admitted = 0;
        for i in 0..total {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let key = (x % 1_000_000).to_le_bytes();
            let hash = a.hash(&key);
            let reads = a.record_get(hash, &key);
            if i >= total - measured && a.admit(reads.count, hash, &lane) {
                admitted += 1;
            }
        }
        admitted
    }

    #[test]
    fn uniform_reads_over_a_big_key_space_are_almost_never_admitted_by_default() {
        // At the sketch's steady state a cold key's estimate is a few counts above the noise
        // floor by chance often enough that a bar of 4 over the floor admitted about one
        // GET in 200 (each a fill serving one or two hits, hits that kept connections from
        // being treated as cool); the default bar admits about one in 4,000.
        let default = crate::config::CacheConfig::default().hot_threshold;
        let (total, measured) = (1_500_000, 500_000);
        let at_default = cold_admissions(default, total, measured);
        let at_four = cold_admissions(4, total, measured);
        assert!(
            at_default * 2_000 < measured,
            "{at_default} of {measured} admitted"
        );
        assert!(
            at_default * 10 < at_four,
            "{at_default} admitted, {at_four} with a bar of 4"
        );
    }

    #[test]
    fn the_top_keys_list_the_hot_key_among_many_cold_ones() {
        let a = Admission::new(1024, 2, 1.0);
        for i in 0u64..200_000 {
            let cold = i.to_le_bytes();
            a.record_get(a.hash(&cold), &cold);
            if i % 4 == 0 {
                a.record_get(a.hash(b"hot"), b"hot");
            }
        }
        assert!(a.noise_floor() > 0);
        let top = a.top(1);
        assert_eq!(top.first().map(|h| &h.key[..]), Some(&b"hot"[..]));
    }

    /// A write resets a key's estimate: only the reads since its last write admit it.
    #[test]
    fn a_key_is_admitted_only_once_read_enough_since_its_last_write() {
        let a = Admission::new(1024, 2, 1.0);
        let lane = LaneState::new("test", Tracking::On);
        let (busy, calm) = (b"busy".as_slice(), b"calm".as_slice());
        let read = |key: &[u8]| a.record_get(a.hash(key), key).count;
        let (b, c) = (a.hash(busy), a.hash(calm));
        for _ in 0..100 {
            // Written after every read: never admitted.
            assert!(!a.admit(read(busy), b, &lane));
            a.record_write(b);
        }
        for _ in 0..20 {
            read(calm);
        }
        assert!(a.admit(a.reads.estimate(c), c, &lane));
        a.record_write(c);
        assert!(!a.admit(read(calm), c, &lane), "one read since the write");
        assert!(a.admit(read(calm), c, &lane), "two since the write");
    }

    /// The window leaves the long one and the bar goes back to the top in the same look: the
    /// sweep waits until the counts have built up again.
    #[test]
    fn no_sweep_right_after_a_switch_of_window() {
        let a = Admission::new(1024, 4, 1.0)
            .lowering_to(3)
            .growing_window(true);
        for _ in 0..8 {
            assert!(!a.follow_served(1000, 600));
        }
        assert!(a.long_window());
        assert_eq!(a.bar.get(), 3);
        // Under one GET in 4 served: back to the short window, the bar back to the top.
        assert!(!a.follow_served(1000, 100), "the sweep waits");
        assert!(!a.long_window());
        assert_eq!(a.bar.get(), 4);
        for _ in 1..RECOUNT_LOOKS {
            assert!(!a.follow_served(1000, 100));
        }
        assert!(a.follow_served(1000, 100), "then it comes");
        assert!(!a.follow_served(1000, 100), "once");
        // Without a switch the sweep comes with the bar's return, as before.
        let b = Admission::new(1024, 4, 1.0).lowering_to(3);
        assert!(!b.follow_served(1000, 600));
        assert!(b.follow_served(1000, 100));
    }

    #[test]
    fn entries_only_max_age_bounds_are_refreshed_in_their_last_seconds() {
        let a = Admission::new(1024, 2, 1.0);
        let life = Duration::from_secs(48);
        let (scale, window) = a.age_refresh(Duration::from_micros(200), life);
        assert_eq!((scale, window), (life / 128, life / 16));
        let now = Instant::now();
        let due_in = |left: Duration| {
            let e = Entry::new(
                b"k",
                super::super::value::Value::Nil,
                now + left,
                scale,
                window,
            );
            (0..1000).filter(|_| a.should_refresh(&e, now)).count()
        };
        // Before its window no draw is made; in its last 10 ms nearly every hit refreshes;
        // a second before expiry some do (e^-(1/0.375) of them, 7%).
        assert_eq!(due_in(life / 16 + Duration::from_millis(1)), 0);
        assert!(due_in(Duration::from_millis(10)) > 900);
        assert!((10..300).contains(&due_in(Duration::from_secs(1))));
        // The fill's own time still counts where it is the longer.
        let slow = Duration::from_secs(1);
        assert_eq!(a.age_refresh(slow, life).0, slow);
        // Refreshes off: no window.
        let off = Admission::new(1024, 2, 0.0);
        assert_eq!(off.age_refresh(slow, life).1, Duration::ZERO);
    }

    #[test]
    fn entries_far_from_expiry_are_never_refreshed_and_expired_ones_always() {
        let a = Admission::new(1024, 2, 1.0);
        let now = Instant::now();
        let delta = Duration::from_millis(1);
        let far = Entry::new(
            b"k",
            super::super::value::Value::Nil,
            now + Duration::from_secs(60),
            delta,
            a.refresh_window(delta),
        );
        assert!((0..1000).all(|_| !a.should_refresh(&far, now)));
        let due = Entry::new(
            b"k",
            super::super::value::Value::Nil,
            now,
            delta,
            a.refresh_window(delta),
        );
        assert!((0..1000).all(|_| a.should_refresh(&due, now)));
    }
}
