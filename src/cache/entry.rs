//! A cached GET result: its key, its value (a short one's reply frame inline), its expiry,
//! and the flags the store and its front keep on it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use rand::Rng;

use super::churn::PAYS;
use super::short_key::ShortKey;
use super::value::{GetReply, Value};
use crate::resp::Proto;

/// Bytes charged per entry besides its key: the entry's allocation (with room for an inline
/// frame and a short key) and its slots in the store's table (`table.rs`: 16 bytes each, at
/// least a quarter of them in use once the table grew for its entries, so up to 64 bytes an
/// entry).
const ENTRY_OVERHEAD: usize = 240;
/// Charged on top for a value kept outside the entry: its own allocation's header.
const OUTLINE_OVERHEAD: usize = 32;
/// Longest reply frame kept inside the entry itself: `$64\r\n` + 64 bytes + CRLF fits.
/// Together with the entry's fields before the key, what a hit reads, this stays within two
/// cache lines.
const INLINE_FRAME: usize = 72;
/// Hits counted per entry: all that admission needs to know. An entry's hits beyond
/// [`PAYS`] are its key's credit against being shut out (`churn.rs`), at most one fill's
/// worth: a key earns its standing over several entries, not in one long life. With 64
/// counted, an entry filled in a spell of reads with no writes (Zipf GETs) left its key
/// three fills' worth of credit, and the 90/10 mix run right after refilled and invalidated
/// each hot key about ten times before shutting it out; with 32, over the mix's first 11 s,
/// 8,600-8,800 fills against 11,200-11,500.
pub(super) const COUNTED_HITS: u8 = 2 * PAYS;

/// The longest an entry filled now may be served: drawn between three quarters of
/// `max_age` and all of it. Entries filled together (a cache warming up after a start, a
/// flush or a lost lane) would otherwise all reach `max_age` within the same seconds, and
/// their refills would come back as one wave every `max_age`, the same wave each time
/// (Zipf GETs over 1M keys, one key sequence read every second: 108,000 fills in one
/// second, a minute after the cache warmed, and again each minute; 21,000-30,000 at most
/// with the draw, on those keys and on fresh ones); a draw per fill moves each entry's next
/// refill apart from the others'.
pub(super) fn drawn_life(max_age: Duration) -> Duration {
    let spread = max_age / 4;
    let span = u64::try_from(spread.as_nanos()).unwrap_or(u64::MAX);
    max_age - spread + Duration::from_nanos(rand::rng().random_range(0..=span))
}

/// A cached GET result. In declaration order (`repr(C)`): what every hit reads first, next
/// to the reference counts, then the frame, then the key (which the store compares on a
/// lookup that did not come through the front).
#[derive(Debug)]
#[repr(C)]
pub struct Entry {
    /// Until when it is served with no further check: its expiry less the longest an early
    /// refresh can come (see [`Entry::expires`]). A hit compares the round's time with this
    /// alone, where working out the refresh window from `delta_us` on every hit cost about
    /// 40 instructions.
    fresh_until: Instant,
    /// Hits served, up to [`COUNTED_HITS`]: an entry invalidated before any hit was a
    /// wasted fill, and one a write ends after few hits did not repay its fill (`churn.rs`).
    hits: AtomicU8,
    /// In the store: cleared when it leaves, so that the front (`front.rs`) stops serving it.
    live: AtomicBool,
    /// The store's eviction mark (`table.rs`): raised by hits up to [`MAX_USE`], lowered each
    /// time the store's clock hand passes; an entry the hand finds at zero is evicted.
    used: AtomicU8,
    /// XFetch's scale, in microseconds (saturating): how long the fill took, so slower keys
    /// are refreshed earlier, or for an entry only `max_age_ms` bounds a part of its life
    /// (`Admission::age_refresh`). Kept small so a 64-byte value still fits the two cache
    /// lines a hit reads.
    delta_us: u32,
    /// The longest an early refresh can come before expiry, in microseconds (0 with refreshes
    /// off): the expiry is `fresh_until` plus this.
    early_us: u32,
    /// The value: for short strings its reply frame, in the entry's own allocation, so a
    /// hit reads one block of memory and counts one reference (a separate value cost a
    /// second cache miss and a second reference count on every hit).
    body: Body,
    /// The key it is the value of.
    key: ShortKey,
}

/// The highest [`Entry::used`] mark: an entry hit often survives this many passes of the
/// store's clock hand without a hit.
pub(super) const MAX_USE: u8 = 3;

#[derive(Debug, PartialEq, Eq)]
enum Body {
    /// A bulk string's whole reply frame, `len` bytes of `frame`.
    Inline { len: u8, frame: [u8; INLINE_FRAME] },
    /// Anything else: a longer string, or nil.
    Value(Value),
}

impl Body {
    /// A bulk string's frame kept inline, if it is short enough.
    fn inline(f: &[u8]) -> Option<Body> {
        if f.len() > INLINE_FRAME {
            return None;
        }
        let mut frame = [0; INLINE_FRAME];
        frame[..f.len()].copy_from_slice(f);
        Some(Body::Inline {
            len: f.len() as u8,
            frame,
        })
    }
}

impl PartialEq for Entry {
    fn eq(&self, other: &Entry) -> bool {
        self.body == other.body
    }
}

impl Eq for Entry {}

impl Entry {
    /// A new, not yet served entry of `key` that expires at `expires`, refreshed early on
    /// XFetch's scale `delta` (the fill's time, or more) at most `window` before it expires
    /// (see `Admission::refresh_window`).
    pub fn new(
        key: &[u8],
        value: Value,
        expires: Instant,
        delta: Duration,
        window: Duration,
    ) -> Arc<Entry> {
        let body = match &value {
            Value::Bulk(f) => Body::inline(f),
            _ => None,
        };
        Entry::with_body(
            key,
            body.unwrap_or(Body::Value(value)),
            expires,
            delta,
            window,
        )
    }

    /// [`Entry::new`] from the GET reply a fill read: a short string's frame is copied into
    /// the entry alone, with no value of its own made first (an allocation, a copy and a
    /// free per fill).
    pub fn from_reply(
        key: &[u8],
        reply: GetReply<'_>,
        expires: Instant,
        delta: Duration,
        window: Duration,
    ) -> Arc<Entry> {
        let body = match reply {
            GetReply::Bulk(f) => Body::inline(f),
            _ => None,
        };
        let body = body.unwrap_or_else(|| Body::Value(reply.to_value()));
        Entry::with_body(key, body, expires, delta, window)
    }

    /// Whether an entry made from `reply` by [`Entry::from_reply`] keeps it inline: a
    /// short string's frame. Anything else becomes a value of its own.
    pub(super) fn holds_inline(reply: GetReply<'_>) -> bool {
        matches!(reply, GetReply::Bulk(f) if f.len() <= INLINE_FRAME)
    }

    fn with_body(
        key: &[u8],
        body: Body,
        expires: Instant,
        delta: Duration,
        window: Duration,
    ) -> Arc<Entry> {
        let early_us = u32::try_from(window.as_micros()).unwrap_or(u32::MAX);
        let (fresh_until, early_us) =
            match expires.checked_sub(Duration::from_micros(early_us.into())) {
                Some(t) => (t, early_us),
                None => (expires, 0),
            };
        Arc::new(Entry {
            fresh_until,
            hits: AtomicU8::new(0),
            live: AtomicBool::new(true),
            // One pass of the clock hand's grace: it was just read.
            used: AtomicU8::new(1),
            delta_us: u32::try_from(delta.as_micros()).unwrap_or(u32::MAX),
            early_us,
            body,
            key: ShortKey::new(key),
        })
    }

    /// The key it is the value of.
    #[inline]
    pub(super) fn key(&self) -> &[u8] {
        self.key.bytes()
    }

    /// A lookup found it: it stays longer in the store. Writes only below [`MAX_USE`], so a
    /// hot entry's hits on two threads do not take its cache line from each other.
    #[inline]
    pub(super) fn mark_used(&self) {
        count_up_to(&self.used, MAX_USE);
    }

    /// It replaces `old`, of the same key, in the store: it keeps the standing `old` had
    /// with the clock hand (a refresh of a hot key does not start it again at one pass).
    pub(super) fn keep_use_of(&self, old: &Entry) {
        let used = old.used.load(Ordering::Relaxed).max(1);
        self.used.store(used, Ordering::Relaxed);
    }

    /// The store's clock hand passes it: whether it was used since the last pass (and is
    /// kept, its mark lowered by one), or is to be evicted.
    pub(super) fn pass_hand(&self) -> bool {
        let used = self.used.load(Ordering::Relaxed);
        if used > 0 {
            self.used.store(used - 1, Ordering::Relaxed);
        }
        used > 0
    }

    /// When it must stop being served (the key's TTL in Redis, or corral's maximum age).
    pub fn expires(&self) -> Instant {
        self.fresh_until + Duration::from_micros(self.early_us.into())
    }

    /// Whether it may be served at `now`: not expired.
    #[inline]
    pub fn live_at(&self, now: Instant) -> bool {
        now < self.fresh_until || now < self.expires()
    }

    /// Whether at `now` no early refresh can be due yet.
    #[inline]
    pub(super) fn fresh_at(&self, now: Instant) -> bool {
        now < self.fresh_until
    }

    /// XFetch's scale: how long the fill took, or more (see `delta_us`).
    pub fn delta(&self) -> Duration {
        Duration::from_micros(u64::from(self.delta_us))
    }

    /// Writes the reply Redis would send in `proto`.
    pub fn encode(&self, proto: Proto, out: &mut BytesMut) {
        match &self.body {
            Body::Inline { len, frame } => out.extend_from_slice(&frame[..usize::from(*len)]),
            Body::Value(v) => v.encode(proto, out),
        }
    }

    /// Bytes charged against the store's budget besides the key.
    pub(super) fn weight(&self) -> usize {
        match &self.body {
            Body::Inline { .. } => ENTRY_OVERHEAD,
            Body::Value(v) => ENTRY_OVERHEAD + OUTLINE_OVERHEAD + v.size(),
        }
    }

    /// The value's size, as [`Value::size`].
    pub fn size(&self) -> usize {
        match &self.body {
            Body::Inline { len, frame } => Value::frame_size(&frame[..usize::from(*len)]),
            Body::Value(v) => v.size(),
        }
    }

    /// About how many bytes its reply takes, as [`Value::reply_len`].
    pub fn reply_len(&self) -> usize {
        match &self.body {
            Body::Inline { len, .. } => usize::from(*len),
            Body::Value(v) => v.reply_len(),
        }
    }

    /// Asks the CPU to load what a hit reads: the entry up to its key (which only a lookup
    /// in the table compares), a short value's frame with it.
    pub(super) fn prefetch(&self) {
        crate::prefetch::read_prefix(self, std::mem::offset_of!(Entry, key));
    }

    /// All of it, the key (an inline key's bytes) with what [`Entry::prefetch`] loads: for a
    /// lookup in the table, which compares the key.
    pub(super) fn prefetch_with_key(&self) {
        crate::prefetch::read_prefix(self, std::mem::size_of::<Entry>());
    }

    /// Whether the entry is still in the store.
    pub(super) fn live(&self) -> bool {
        self.live.load(Ordering::Acquire)
    }

    /// Marks the entry as gone from the store, before the removal returns. True the first
    /// time only.
    pub(super) fn retire(&self) -> bool {
        self.live.swap(false, Ordering::Release)
    }

    /// An entry of key `k` and the bulk string `v`, live for a minute: for unit tests.
    #[cfg(test)]
    pub(super) fn of(v: &[u8]) -> Arc<Entry> {
        Entry::new(
            b"k",
            Value::bulk(v),
            Instant::now() + Duration::from_secs(60),
            Duration::ZERO,
            Duration::ZERO,
        )
    }

    /// Records a hit. Only the first `COUNTED_HITS` write to the entry: past them a hit
    /// only loads, and the hot path stays free of writes to shared memory. Two hits on two
    /// threads at once may count as one: the count only steers admission.
    pub fn mark_hit(&self) {
        count_up_to(&self.hits, COUNTED_HITS);
    }

    /// Hits served so far, up to [`COUNTED_HITS`].
    pub(super) fn hits(&self) -> u8 {
        self.hits.load(Ordering::Relaxed)
    }
}

/// Adds one to `counter` unless it is at `max`. A load and a plain store, not a locked add:
/// once at `max` the counter is only read, and an increment two threads race on may be
/// lost, which only blurs what the counters steer.
#[inline]
fn count_up_to(counter: &AtomicU8, max: u8) {
    let n = counter.load(Ordering::Relaxed);
    if n < max {
        counter.store(n + 1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entry_from_a_reply_is_the_entry_of_its_value() {
        let at = Instant::now() + Duration::from_secs(60);
        let zero = Duration::ZERO;
        let long = [b'x'; 100];
        let replies = [
            GetReply::Bulk(b"$2\r\nhi\r\n"),
            GetReply::Bulk(b"$0\r\n\r\n"),
            GetReply::Nil,
        ];
        for reply in replies {
            let from = Entry::from_reply(b"k", reply, at, zero, zero);
            let new = Entry::new(b"k", reply.to_value(), at, zero, zero);
            assert_eq!(from, new);
            assert_eq!((from.size(), from.weight()), (new.size(), new.weight()));
        }
        // Too long to keep inline: a value of its own, either way.
        let frame = [&b"$100\r\n"[..], &long, b"\r\n"].concat();
        let from = Entry::from_reply(b"k", GetReply::Bulk(&frame), at, zero, zero);
        assert_eq!(from.size(), 100);
        assert!(from.weight() > Entry::from_reply(b"k", GetReply::Nil, at, zero, zero).weight());
        let mut out = BytesMut::new();
        from.encode(Proto::Resp2, &mut out);
        assert_eq!(&out[..], &frame[..]);
    }

    #[test]
    fn an_entry_with_a_64_byte_value_is_one_allocation_within_its_charge() {
        // The Arc's two counts come on top of the entry; the table's slots take up to 64.
        assert!(std::mem::size_of::<Entry>() + 16 + 64 <= ENTRY_OVERHEAD);
        // What a hit reads, from the Arc's counts up to the key, is two cache lines.
        assert!(std::mem::offset_of!(Entry, key) + 16 <= 128);
        let e = Entry::of(&[b'x'; 64]);
        assert!(matches!(e.body, Body::Inline { .. }));
    }

    #[test]
    fn an_entry_is_fresh_until_its_refresh_window_and_live_until_it_expires() {
        let t = Instant::now();
        let expires = t + Duration::from_secs(60);
        let e = Entry::new(
            b"k",
            Value::Nil,
            expires,
            Duration::ZERO,
            Duration::from_secs(10),
        );
        assert_eq!(e.expires(), expires);
        assert!(e.fresh_at(t + Duration::from_secs(49)));
        assert!(!e.fresh_at(t + Duration::from_secs(51)));
        assert!(e.live_at(t + Duration::from_millis(59_999)));
        assert!(!e.live_at(expires));
        let no_window = Entry::new(b"k", Value::Nil, expires, Duration::ZERO, Duration::ZERO);
        assert!(no_window.fresh_at(t + Duration::from_millis(59_999)));
        assert!(!no_window.live_at(expires));
    }

    #[test]
    fn lives_are_drawn_over_the_last_quarter_of_max_age() {
        let max = Duration::from_secs(60);
        let lives: Vec<Duration> = (0..2000).map(|_| drawn_life(max)).collect();
        assert!(lives.iter().all(|l| *l >= max * 3 / 4 && *l <= max));
        // Spread over the range, not bunched at one end: each eighth of it is drawn.
        for eighth in 0..8u32 {
            let lo = max * 3 / 4 + max / 32 * eighth;
            let hi = lo + max / 32;
            assert!(
                lives.iter().any(|l| *l >= lo && *l < hi),
                "none in {lo:?}..{hi:?}"
            );
        }
        assert_eq!(drawn_life(Duration::ZERO), Duration::ZERO);
    }

    #[test]
    fn short_and_long_values_read_back_the_same() {
        for v in [&b"v"[..], &[b'x'; 64], &[b'y'; 65], &[b'z'; 4000]] {
            let e = Entry::of(v);
            let (mut got, mut want) = (BytesMut::new(), BytesMut::new());
            e.encode(Proto::Resp3, &mut got);
            Value::bulk(v).encode(Proto::Resp3, &mut want);
            assert_eq!(got, want);
            assert_eq!(e.size(), v.len());
        }
        let nil = Entry::new(
            b"k",
            Value::Nil,
            Instant::now(),
            Duration::ZERO,
            Duration::ZERO,
        );
        let mut out = BytesMut::new();
        nil.encode(Proto::Resp2, &mut out);
        assert_eq!(&out[..], b"$-1\r\n");
    }
}
