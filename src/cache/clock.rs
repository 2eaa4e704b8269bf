//! The per-connection state the cache keeps between a client's lookups: the round's time,
//! whether the last round served a hit, and whether the connection is cool.

use std::time::Instant;

/// The time a round of requests is looked up at, read once, at the first lookup that needs
/// it: a vDSO clock read per hit cost as much as the rest of a hit's lookup. Every request of
/// a round was received before the round began, so an entry live at this time was live at a
/// moment between each request's arrival and its reply, and serving it answers as Redis could
/// have. Reads started at it count their keys' TTLs from it, which is earlier than Redis ran
/// them: their entries expire early, never late.
///
/// It also remembers whether the last round served a hit (see [`Clock::warm`]), and how much
/// of the connection's recent GETs the cache served (see [`COOL_WINDOW`]).
#[derive(Debug, Default)]
pub struct Clock {
    now: Option<Instant>,
    hit: bool,
    warm: bool,
    /// GETs (looked up or skipped) in the current window, and how many of them were served.
    window: u32,
    served: u32,
    /// The last full window served fewer than one GET in [`COOL_RATE`].
    cool: bool,
    /// GETs forwarded without a lookup since the cache last counted them.
    pub(super) skipped: u64,
}

/// GETs over which a connection's share of GETs the cache served (hits, and reads joined) is
/// judged. Under one in [`COOL_RATE`], the connection is cool for the next window: it reads
/// keys the cache neither holds nor sees read by anyone else (cold keys, most of them). A
/// cool connection's GET of a key with nothing here (`presence.rs`) is forwarded as it is,
/// uncounted, unless it is one of the [`COOL_SAMPLE`]: a cold GET then costs about what
/// forwarding does, where counting and looking it up cost another 40% (instructions,
/// uniform GET -P 16). The GETs of keys with an entry or a read in flight are still looked
/// up, so they hit or join as before.
pub(super) const COOL_WINDOW: u32 = 1024;
/// A connection the cache served fewer than one GET in this many over a window is cool. A
/// connection that hits now and then is cool too: after skewed loads had left a few thousand
/// entries, uniform GETs over 1M keys hit one time in 380, and when any hit made a
/// connection warm again 92% of its GETs were counted and looked up (1.19-1.22x the proxy
/// CPU of `--no-cache`; 1.11-1.12x judged by share). Its hits are the same, since a key with
/// an entry is looked up either way; what it gives up is counting the others' reads but for
/// a sample, and prefetching.
pub(super) const COOL_RATE: u32 = 16;
/// A cool connection looks up one GET in this many (a power of two) of keys with nothing
/// here, at random: enough for a key that grows hot to be counted (the sketch's counts are
/// relative, so one sampled GET in sixteen of every cool connection finds the same keys hot,
/// later) and for a stampede to start a read the rest can join.
pub(super) const COOL_SAMPLE: u64 = 16;

impl Clock {
    /// The round's time.
    pub fn now(&mut self) -> Instant {
        *self.now.get_or_insert_with(Instant::now)
    }

    /// A new round: the next lookup reads the clock again.
    pub fn reset(&mut self) {
        self.now = None;
        self.warm = self.hit;
        self.hit = false;
    }

    /// Whether the connection is cool (see [`COOL_WINDOW`]): its rounds prefetch only the
    /// presence counts its GETs are checked against.
    pub fn cool(&self) -> bool {
        self.cool
    }

    /// A GET was looked up or skipped: one more in the window, which closes at
    /// [`COOL_WINDOW`].
    pub(super) fn counted(&mut self) {
        self.window += 1;
        if self.window >= COOL_WINDOW {
            self.cool = self.served.saturating_mul(COOL_RATE) < self.window;
            self.window = 0;
            self.served = 0;
        }
    }

    /// The GET was a local hit: served, and the round warm for the next (see
    /// [`Clock::warm`]).
    pub(super) fn hit(&mut self) {
        self.hit = true;
        self.served();
    }

    /// The GET was a hit or joined a read.
    pub(super) fn served(&mut self) {
        self.served = self.served.saturating_add(1);
    }

    /// Whether the previous round served a local hit. A connection whose last round had
    /// none is most likely reading keys that are not cached: [`super::Cache::prefetch`]
    /// then leaves the store's front alone, and so do this round's lookups.
    pub fn warm(&self) -> bool {
        self.warm
    }
}
