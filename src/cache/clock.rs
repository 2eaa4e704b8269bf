//! The per-connection state the cache keeps between a client's lookups: the round's time,
//! whether the last round served a hit, and whether the connection is cool.

use std::time::Instant;

use super::admission::below;

/// The time a round of requests is looked up at, read once, at the first lookup that needs
/// it: a vDSO clock read per hit cost as much as the rest of a hit's lookup. Every request of
/// a round was received before the round began, so an entry live at this time was live at a
/// moment between each request's arrival and its reply, and serving it answers as Redis could
/// have. Reads started at it count their keys' TTLs from it, which is earlier than Redis ran
/// them: their entries expire early, never late.
///
/// It also remembers whether the last round served a hit (see [`Clock::warm`]), and how many
/// of the connection's recent GETs were hits, joined reads or started fills (see
/// `COOL_WINDOW`).
#[derive(Debug, Default)]
pub struct Clock {
    now: Option<Instant>,
    hit: bool,
    warm: bool,
    /// GETs (looked up or skipped) in the current window, how many of them were local hits,
    /// how many joined a read in flight, and how many started a fill that should last.
    window: u32,
    hits: u32,
    joined: u32,
    fills: u32,
    /// The last full window had too few hits, joins and fills to pay for its lookups (see
    /// [`COOL_WINDOW`]).
    cool: bool,
    /// GETs forwarded without a lookup since the cache last counted them.
    pub(super) skipped: u64,
    /// Cool GETs of keys with nothing here to forward unlooked before the next is sampled.
    to_sample: u8,
    /// Looks ahead in a row that found no GET, and rounds since the last look (see
    /// [`Clock::looks_ahead`]).
    idle_looks: u8,
    since_look: u32,
    /// With the read barrier (`barrier.rs`), this round's floor: reads in flight started at or
    /// before it are not joined.
    floor: Option<Instant>,
    /// The round's read barrier failed: its GETs are forwarded, none looked up.
    uncached: bool,
}

/// A connection whose last [`QUIET_AFTER`] looks ahead found no GET (a client that only
/// writes) looks again only once in this many rounds, to notice GETs coming back. Walking a round's SETs to
/// prefetch what their invalidations read cost more than the loads it saved: on SETs over
/// 1M keys at -P 16 (callgrind, cache on) 2,596 instructions per request with the walk,
/// 2,318 without (`--no-cache`: 1,759), and corral's CPU per request lower in seven of
/// eight interleaved pairs of runs (medians 0.71 against 0.75 µs).
pub(super) const LOOK_AGAIN: u32 = 16;
/// Looks in a row that find no GET before a connection looks only now and then: a client
/// that mixes writes into its reads sends a round of writes alone now and then (one round in
/// ten of a 90/10 mix sent one request at a time), and its next rounds' GETs are prefetched.
pub(super) const QUIET_AFTER: u8 = 4;

/// GETs over which a connection's hits, joins and fills are judged. A window with under one
/// hit in [`HIT_RATE`] GETs (in [`WARM_AGAIN_RATE`] if it was cool), under one join in
/// [`JOIN_RATE`] and under one fill in [`FILL_RATE`] makes the connection cool for the next:
/// it reads keys the cache neither holds, nor sees read by anyone else, nor is taking in
/// (cold keys, most of them), or keys it can hold only briefly (written about as often as
/// read). A cool connection's GET of a key with nothing here (`presence.rs`) is forwarded
/// as it is, uncounted, unless it is one of the [`COOL_SAMPLE`]: a cold GET then costs about
/// what forwarding does, where counting and looking it up cost another 40% (instructions,
/// uniform GET -P 16). The GETs of keys with an entry or a read in flight are still looked
/// up, so they hit or join as before (but for up to a 250 ms look after two changes of the
/// key's presence slot crossed on two threads, see `presence.rs`).
pub(super) const COOL_WINDOW: u32 = 1024;
/// A window needs at least one local hit in this many GETs to keep a connection warm. Hits
/// are what pay for a warm connection's work on every GET (counting, lookup, a read others
/// may join, the fills and invalidations of keys admitted): on Zipf 90/10 GET/SET over 1M
/// keys, -P 16, from an empty cache, warm connections hit 17% of GETs and joined 20%, at
/// 0.65-0.78x the throughput of `--no-cache` and 1.8x its proxy CPU; cool ones at
/// 0.81-1.03x and 1.08-1.24x (Redis's CPU per request the same either way: the GETs hits
/// and joins saved were of its cheapest, hottest keys). Where Zipf GETs had left the hot
/// keys cached, the mix stayed at about 0.70x: a cool connection still looks up the keys
/// there are entries of, which kept them counted and refilled after each write, until keys
/// written too often to pay were shut out (`churn.rs`). On Zipf GETs (s 0.85 and 0.99: 44%
/// and 69% hits when warm, 29% and 56% when cool) warm connections had 7-20% more
/// throughput than cool ones; at s 0.7 (23% hits) the same throughput for 1.25x the CPU.
pub(super) const HIT_RATE: u32 = 4;
/// A cool connection turns warm again after a window with one hit in this many GETs. A
/// lower bar than [`HIT_RATE`]'s: a set of keys read evenly that the cache could hold whole
/// (uniform GETs over 100,000 keys) starts with no hits, turns cool, and has its keys
/// admitted only from a cool connection's sample; with one bar at one hit in 4 it stayed
/// cool, at 0.71x the throughput of the previous rule (one GET served in 16, either way) and
/// 4x Redis's CPU per request (-P 16, one bench round after 10 s of warming). Between the
/// bars (Zipf GETs at s 0.7: 23% hits warm, 11% cool) a connection is warm every other
/// window.
///
/// Only while the cache's fills last (`lasting.rs`): where writes end its entries young, a
/// cool connection needs [`HIT_RATE`]'s bar, as a warm one does. There the hits come from
/// entries that are leaving, and a warm window's work (every GET counted, looked up, and
/// made a read others may join; the keys it counts past the bar filled, to be written out
/// again) is what they cannot pay for. On the 90/10 mix right after 6 s of Zipf GETs (-P 16,
/// 1M keys), 7-22% of GETs hit over the first 4 s, and half the windows were warm until the
/// hits fell under one in 16 (about 5 s); with this rule every window was cool after the
/// first second. Over those 4 s, four pairs of runs (a fresh corral each): 398-529k
/// requests/s at 0.81-1.13 µs of corral's CPU per request before, 467-522k at 0.83-0.97
/// after (three pairs better, one even).
pub(super) const WARM_AGAIN_RATE: u32 = 16;
/// ... or at least one GET in this many joining a read in flight: clients that mostly read
/// keys at the same moment (a stampede, a fan-out of fresh keys) keep every GET counted and
/// coalesced, which is what spares Redis there; a cool connection's stampede would send
/// about [`COOL_SAMPLE`] reads before a sampled one registered a read to join.
pub(super) const JOIN_RATE: u32 = 2;
/// A cool connection looks up one GET in this many (a power of two) of keys with nothing
/// here, at random: enough for a key that grows hot to be counted (the sketch's counts are
/// relative, so one sampled GET in sixteen of every cool connection finds the same keys hot,
/// later) and for a stampede to start a read the rest can join. The gap to the next sampled
/// GET is drawn at each one (see [`Clock::samples_cool`]).
pub(super) const COOL_SAMPLE: u64 = 16;
/// ... or at least one GET in this many starting a tracked fill, while the cache's fills
/// last (`lasting.rs`): the connection reads keys read again and again that the cache is
/// taking in (a restart, a new working set). Cool, it would count one GET in 16 of them and
/// they would be admitted slowly: uniform GETs over 100,000 keys, after skewed runs over
/// other keys, filled at 300-2,700 entries a second for 4-6 s, until one GET in 16 hit (11,000
/// entries after 4 s; with this rule 96,000, and 1.4-1.5x the requests served in the first
/// 10 s). On cold keys (uniform GETs over 1M keys, whose few fills rarely hit) more windows
/// are warm (60-69% of GETs skipped instead of 75%), at the same throughput and CPU in
/// interleaved pairs. Where writes end the entries young (the 90/10 mix after Zipf GETs)
/// fills do not count: counted, they kept its connections warm, refilling keys about to be
/// shut out, for twice as long (0.75M requests/s instead of 0.91M over its second 4 s).
pub(super) const FILL_RATE: u32 = 512;

impl Clock {
    /// The round's time.
    pub fn now(&mut self) -> Instant {
        *self.now.get_or_insert_with(Instant::now)
    }

    /// A new round: the next lookup reads the clock again.
    pub fn reset(&mut self) {
        self.now = None;
        self.floor = None;
        self.uncached = false;
        self.warm = self.hit;
        self.hit = false;
    }

    /// The round passed the read barrier (`Cache::pass_barrier`): `floor` is its floor, or
    /// `None` when the barrier failed and nothing may be looked up this round. The round's
    /// time is read again at its next lookup, after the barrier.
    pub fn passed_barrier(&mut self, floor: Option<Instant>) {
        self.now = None;
        self.floor = floor;
        self.uncached = floor.is_none();
    }

    /// Whether the round's GETs are forwarded without a lookup: its read barrier failed.
    #[inline]
    pub fn uncached(&self) -> bool {
        self.uncached
    }

    /// Whether a read in flight started at `started` may be joined: after the round's
    /// floor, if it has one.
    #[inline]
    pub(super) fn may_join(&self, started: Instant) -> bool {
        self.floor.is_none_or(|floor| started > floor)
    }

    /// Whether the connection is cool (see `COOL_WINDOW`): its rounds prefetch only the
    /// presence summary's bits its GETs are checked against.
    pub fn cool(&self) -> bool {
        self.cool
    }

    /// A GET was looked up or skipped: one more in the window, which closes at
    /// [`COOL_WINDOW`].
    /// `fills_last` says whether the cache's fills last lately (`lasting.rs`); it is asked
    /// only when the window closes.
    pub(super) fn counted(&mut self, fills_last: impl FnOnce() -> bool) {
        self.window += 1;
        if self.window >= COOL_WINDOW {
            // Higher to stay warm than to turn warm again: a cool connection counts only a
            // sample of its GETs, so its keys are admitted slowly and its hits climb slowly.
            // Not where writes end the entries young: see `WARM_AGAIN_RATE`.
            let hit_rate = if self.cool && fills_last() {
                WARM_AGAIN_RATE
            } else {
                HIT_RATE
            };
            self.cool = self.hits.saturating_mul(hit_rate) < self.window
                && self.joined.saturating_mul(JOIN_RATE) < self.window
                && self.fills.saturating_mul(FILL_RATE) < self.window;
            self.window = 0;
            self.hits = 0;
            self.joined = 0;
            self.fills = 0;
        }
    }

    /// Whether this GET, on a cool connection, of a key with nothing here, is one of the
    /// sampled ones (see [`COOL_SAMPLE`]): one in [`COOL_SAMPLE`] on average, the gap to the
    /// next drawn at random, so a periodic request pattern is not sampled at one fixed
    /// position. A draw for every such GET cost about 20 instructions, an eighth of what
    /// skipping it adds to forwarding (uniform GETs over 1M keys at -P 16: 1,012 → 990
    /// instructions per request, against 796 with `--no-cache`).
    pub(super) fn samples_cool(&mut self) -> bool {
        if let Some(left) = self.to_sample.checked_sub(1) {
            self.to_sample = left;
            return false;
        }
        // 0 to 2 * COOL_SAMPLE - 2 GETs skipped until the next: COOL_SAMPLE - 1 on average.
        self.to_sample = (below(COOL_SAMPLE) + below(COOL_SAMPLE)) as u8;
        true
    }

    /// How many GETs [`Clock::samples_cool`] lets pass before the one it samples.
    pub(super) fn to_sample(&self) -> usize {
        usize::from(self.to_sample)
    }

    /// The GET was a local hit; the round is warm for the next (see [`Clock::warm`]).
    pub(super) fn hit(&mut self) {
        self.hit = true;
        self.hits = self.hits.saturating_add(1);
    }

    /// The GET joined a read in flight.
    pub(super) fn joined(&mut self) {
        self.joined = self.joined.saturating_add(1);
    }

    /// The GET started a tracked fill while the cache's fills last (`lasting.rs`).
    pub(super) fn filled(&mut self) {
        self.fills = self.fills.saturating_add(1);
    }

    /// Whether this round looks ahead of parsing for keys to prefetch: not on a connection
    /// whose last [`QUIET_AFTER`] looks found no GET, but for one round in [`LOOK_AGAIN`].
    pub(super) fn looks_ahead(&mut self) -> bool {
        if self.idle_looks < QUIET_AFTER {
            return true;
        }
        self.since_look += 1;
        if self.since_look < LOOK_AGAIN {
            return false;
        }
        self.since_look = 0;
        true
    }

    /// What the round's look ahead found: a GET, or none.
    pub(super) fn found_gets(&mut self, any: bool) {
        self.idle_looks = if any {
            0
        } else {
            self.idle_looks.saturating_add(1)
        };
    }

    /// Whether the previous round served a local hit. A connection whose last round had
    /// none is most likely reading keys that are not cached: [`super::Cache::prefetch`]
    /// then leaves the store's front alone, and so do this round's lookups.
    pub fn warm(&self) -> bool {
        self.warm
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rounds, of `n` in a row, that look ahead, when each look finds a GET or not.
    fn looks(clock: &mut Clock, n: u32, gets: bool) -> Vec<u32> {
        (0..n)
            .filter(|_| {
                let look = clock.looks_ahead();
                if look {
                    clock.found_gets(gets);
                }
                look
            })
            .collect()
    }

    #[test]
    fn a_connection_that_reads_looks_ahead_every_round() {
        let mut clock = Clock::default();
        assert_eq!(looks(&mut clock, 40, true).len(), 40);
    }

    #[test]
    fn a_connection_that_only_writes_looks_again_now_and_then() {
        let mut clock = Clock::default();
        let q = u32::from(QUIET_AFTER);
        let seen = looks(&mut clock, q + 2 * LOOK_AGAIN, false);
        let mut want: Vec<u32> = (0..q).collect();
        want.extend([q + LOOK_AGAIN - 1, q + 2 * LOOK_AGAIN - 1]);
        assert_eq!(seen, want);
        // GETs found again: every round looks from the next one on.
        while !clock.looks_ahead() {}
        clock.found_gets(true);
        assert_eq!(looks(&mut clock, 5, true).len(), 5);
    }

    #[test]
    fn a_round_of_writes_alone_now_and_then_stops_no_look() {
        let mut clock = Clock::default();
        for _ in 0..10 {
            let n = u32::from(QUIET_AFTER) - 1;
            assert_eq!(looks(&mut clock, n, false).len(), n as usize);
            assert_eq!(looks(&mut clock, 1, true).len(), 1);
        }
    }

    #[test]
    fn one_cool_get_in_cool_sample_is_sampled_at_gaps_drawn_at_random() {
        let mut clock = Clock::default();
        let n = 64_000;
        let sampled: Vec<usize> = (0..n).filter(|_| clock.samples_cool()).collect();
        let expected = n / COOL_SAMPLE as usize;
        assert!(
            sampled.len().abs_diff(expected) < expected / 10,
            "{} of {n} sampled, about {expected} expected",
            sampled.len()
        );
        let gaps: std::collections::BTreeSet<usize> =
            sampled.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(
            gaps.len(),
            2 * COOL_SAMPLE as usize - 1,
            "every gap from 1 to {} occurs: {gaps:?}",
            2 * COOL_SAMPLE - 1
        );
    }

    #[test]
    fn to_sample_says_how_many_gets_pass_before_the_sampled_one() {
        let mut clock = Clock::default();
        for _ in 0..200 {
            let passing = clock.to_sample();
            for _ in 0..passing {
                assert!(!clock.samples_cool());
            }
            assert!(clock.samples_cool(), "the GET after {passing} skipped");
        }
    }
}
