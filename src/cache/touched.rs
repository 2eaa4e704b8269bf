//! The keys of a sample of the cache's hits since the last look of `touch.rs`, which
//! touches those still cached on Redis.
//!
//! Why every sampled key, and not only the hottest: a key the cache serves is seen by Redis
//! only at its fills, at most every `max_age_ms`. Touching only the 64 keys of
//! [`super::hotkeys`]'s top left every other key the cache served looking unused to Redis
//! for up to a minute: on a skewed load the cache holds tens of thousands of keys read
//! several times a second, and an `allkeys-lru` or `allkeys-lfu` policy took those for its
//! coldest and evicted them first. A sample of hits reaches a key about as often as the
//! cache serves it, so a key served more often is touched more often, up to once a look.
//! Hits only: a GET that reaches Redis is a use Redis sees itself.
//!
//! Bounds: a look keeps at most [`PER_SECOND`] keys a second of `touch_ms` and [`MOST`] in
//! all, and at most [`MOST_BYTES`] of them; keys sampled past a bound wait for a later sample.
//! A key sampled twice in a look is kept once.

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::Duration;

use bytes::Bytes;

/// Keys touched a second at most: a `TOUCH` costs Redis about 0.75-0.9 µs a key on a large
/// key space (a memory miss each), so this is at most about 3.7 ms of Redis's time a second.
const PER_SECOND: u64 = 4096;
/// Keys kept for one look at most, whatever `touch_ms`: with the default 250 ms, the
/// [`PER_SECOND`] bound.
pub(super) const MOST: usize = 1024;
/// Bytes of keys kept for one look at most; a larger key is never kept.
const MOST_BYTES: usize = 256 * 1024;

/// The keys sampled since the last [`Touched::take`].
#[derive(Debug)]
pub(super) struct Touched {
    kept: Mutex<Kept>,
    /// Set while the look's keys or bytes are all taken, or while touches are off: a
    /// sampled hit then takes no lock.
    full: AtomicBool,
    /// Keys a look keeps at most; 0 with touches off (`touch_ms` = 0).
    most: usize,
}

#[derive(Debug, Default)]
struct Kept {
    hashes: HashSet<u64>,
    keys: Vec<Bytes>,
    bytes: usize,
}

impl Touched {
    /// A set for looks `every` apart; with `every` zero (touches off) it keeps nothing.
    pub(super) fn new(every: Duration) -> Touched {
        let per_look =
            PER_SECOND.saturating_mul(u64::try_from(every.as_millis()).unwrap_or(u64::MAX)) / 1000;
        let most = if every.is_zero() {
            0
        } else {
            usize::try_from(per_look).unwrap_or(MOST).clamp(1, MOST)
        };
        Touched {
            kept: Mutex::default(),
            full: AtomicBool::new(most == 0),
            most,
        }
    }

    /// A sampled hit served `key`, whose hash is `hash`.
    pub(super) fn sampled(&self, hash: u64, key: &[u8]) {
        if self.full.load(Relaxed) || key.len() > MOST_BYTES {
            return;
        }
        let Ok(mut kept) = self.kept.lock() else {
            return;
        };
        if kept.keys.len() >= self.most
            || kept.bytes + key.len() > MOST_BYTES
            || !kept.hashes.insert(hash)
        {
            return;
        }
        kept.keys.push(Bytes::copy_from_slice(key));
        kept.bytes += key.len();
        if kept.keys.len() >= self.most || kept.bytes >= MOST_BYTES {
            self.full.store(true, Relaxed);
        }
    }

    /// The keys sampled since the last call, each once; the set starts again empty.
    pub(super) fn take(&self) -> Vec<Bytes> {
        let Ok(mut kept) = self.kept.lock() else {
            return Vec::new();
        };
        kept.hashes.clear();
        kept.bytes = 0;
        let keys = std::mem::take(&mut kept.keys);
        self.full.store(self.most == 0, Relaxed);
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOOK: Duration = Duration::from_millis(250);

    #[test]
    fn each_key_sampled_since_the_last_take_is_taken_once() {
        let t = Touched::new(LOOK);
        t.sampled(1, b"a");
        t.sampled(2, b"b");
        t.sampled(1, b"a");
        assert_eq!(t.take(), [&b"a"[..], &b"b"[..]]);
        assert!(t.take().is_empty(), "each sample is taken once");
        t.sampled(2, b"b");
        assert_eq!(t.take(), [&b"b"[..]]);
    }

    #[test]
    fn a_look_keeps_at_most_its_share_of_keys_and_bytes() {
        let t = Touched::new(LOOK);
        for i in 0..MOST as u64 + 10 {
            t.sampled(i, &i.to_le_bytes());
        }
        assert_eq!(t.take().len(), MOST);
        // Room again after the take.
        t.sampled(1, b"k");
        assert_eq!(t.take().len(), 1);
        // A key larger than the bytes bound is never kept, and keeps out nothing else.
        t.sampled(1, &vec![b'x'; MOST_BYTES + 1]);
        t.sampled(2, b"small");
        assert_eq!(t.take(), [&b"small"[..]]);
        // Three keys of just over a quarter of the bytes fit; a fourth does not, a small one
        // does.
        let big = vec![b'x'; MOST_BYTES / 4 + 1];
        for i in 0..4 {
            t.sampled(i, &big);
        }
        t.sampled(9, b"small");
        assert_eq!(t.take().len(), 4);
        // Looks 10 ms apart keep 40 keys (4,096 a second).
        let t = Touched::new(Duration::from_millis(10));
        for i in 0..100u64 {
            t.sampled(i, &i.to_le_bytes());
        }
        assert_eq!(t.take().len(), 40);
    }

    #[test]
    fn with_touches_off_nothing_is_kept() {
        let t = Touched::new(Duration::ZERO);
        t.sampled(1, b"a");
        assert!(t.take().is_empty());
        t.sampled(1, b"a");
        assert!(t.take().is_empty());
    }
}
