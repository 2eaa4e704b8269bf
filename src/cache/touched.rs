//! The keys a sampled GET read since the last look of `touch.rs`, which touches those still
//! cached on Redis.
//!
//! Why every sampled key, and not only the hottest: a key the cache serves is seen by Redis
//! only at its fills, at most every `max_age_ms`. Touching only the 64 keys of
//! [`super::hotkeys`]'s top left every other key the cache served looking unused to Redis
//! for up to a minute: on a skewed load the cache holds tens of thousands of keys read
//! several times a second, and an `allkeys-lru` or `allkeys-lfu` policy took those for its
//! coldest and evicted them first. A sample of GETs reaches a key about as often as it is
//! read, so a key read more often is touched more often, up to once a look.
//!
//! Bounds: a look touches at most [`MOST`] keys, and keeps at most [`MOST_BYTES`] of them;
//! keys sampled past either wait for a later sample. A key sampled twice in a look is kept
//! once.

use std::collections::HashSet;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use bytes::Bytes;

/// Keys kept for one look at most: with the default `touch_ms` of 250, up to 4,096 a second,
/// one `TOUCH` of them a look standalone. What the look costs Redis is then some hundreds of
/// microseconds a second at most.
pub(super) const MOST: usize = 1024;
/// Bytes of keys kept for one look at most: a few large keys take no more room than this.
const MOST_BYTES: usize = 256 * 1024;

/// The keys sampled since the last [`Touched::take`].
#[derive(Debug, Default)]
pub(super) struct Touched {
    kept: Mutex<Kept>,
    /// Set while [`MOST`] keys or [`MOST_BYTES`] are kept, or while touches are off: a sampled
    /// GET then takes no lock.
    full: AtomicBool,
    /// Whether anything takes the keys (`touch_ms` > 0).
    on: bool,
}

#[derive(Debug, Default)]
struct Kept {
    hashes: HashSet<u64>,
    keys: Vec<Bytes>,
    bytes: usize,
}

impl Touched {
    /// A set that keeps keys if `on`, and none otherwise.
    pub(super) fn new(on: bool) -> Touched {
        Touched {
            kept: Mutex::default(),
            full: AtomicBool::new(!on),
            on,
        }
    }

    /// A sampled GET read `key`, whose hash is `hash`.
    pub(super) fn sampled(&self, hash: u64, key: &[u8]) {
        if self.full.load(Relaxed) {
            return;
        }
        let Ok(mut kept) = self.kept.lock() else {
            return;
        };
        if kept.keys.len() >= MOST || kept.bytes + key.len() > MOST_BYTES {
            self.full.store(true, Relaxed);
            return;
        }
        if kept.hashes.insert(hash) {
            kept.keys.push(Bytes::copy_from_slice(key));
            kept.bytes += key.len();
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
        self.full.store(!self.on, Relaxed);
        keys
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_key_sampled_since_the_last_take_is_taken_once() {
        let t = Touched::new(true);
        t.sampled(1, b"a");
        t.sampled(2, b"b");
        t.sampled(1, b"a");
        assert_eq!(t.take(), [&b"a"[..], &b"b"[..]]);
        assert!(t.take().is_empty(), "each sample is taken once");
        t.sampled(2, b"b");
        assert_eq!(t.take(), [&b"b"[..]]);
    }

    #[test]
    fn a_look_keeps_at_most_most_keys_and_most_bytes() {
        let t = Touched::new(true);
        for i in 0..MOST as u64 + 10 {
            t.sampled(i, &i.to_le_bytes());
        }
        assert_eq!(t.take().len(), MOST);
        // Room again after the take.
        t.sampled(1, b"k");
        assert_eq!(t.take().len(), 1);
        let big = vec![b'x'; MOST_BYTES / 4 + 1];
        for i in 0..8 {
            t.sampled(i, &big);
        }
        assert_eq!(
            t.take().len(),
            3,
            "three keys fit in MOST_BYTES, a fourth does not"
        );
    }

    #[test]
    fn with_touches_off_nothing_is_kept() {
        let t = Touched::new(false);
        t.sampled(1, b"a");
        assert!(t.take().is_empty());
        t.sampled(1, b"a");
        assert!(t.take().is_empty());
    }
}
