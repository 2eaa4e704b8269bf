//! The hottest keys, for `CORRAL HOTKEYS`: a space-saving top-k over a sample of GETs.
//! Sampling keeps the lock off the hot path; counts are scaled back by the sampling rate.

use std::sync::Mutex;
use std::time::Instant;

use bytes::Bytes;

/// One in this many GETs is recorded.
pub const SAMPLE_EVERY: u64 = 16;
const SLOTS: usize = 64;

#[derive(Debug)]
struct Slot {
    /// The key's hash, compared first: the scan then reads no key but the matching one.
    hash: u64,
    key: Bytes,
    count: u64,
}

#[derive(Debug)]
struct Inner {
    slots: Vec<Slot>,
    since: Instant,
}

/// Top keys by sampled frequency.
#[derive(Debug)]
pub struct HotKeys {
    inner: Mutex<Inner>,
}

/// A hot key and its estimated request rate.
#[derive(Debug, Clone, PartialEq)]
pub struct HotKey {
    /// The key.
    pub key: Bytes,
    /// Estimated GETs per second since the counts were last reset.
    pub rate: f64,
}

impl Default for HotKeys {
    fn default() -> Self {
        HotKeys {
            inner: Mutex::new(Inner {
                slots: Vec::with_capacity(SLOTS),
                since: Instant::now(),
            }),
        }
    }
}

impl HotKeys {
    /// Records one sampled GET of `key`, whose hash is `hash`.
    pub fn record(&self, hash: u64, key: &[u8]) {
        let Ok(mut inner) = self.inner.lock() else {
            return;
        };
        let slots = &mut inner.slots;
        if let Some(s) = slots.iter_mut().find(|s| s.hash == hash && s.key == key) {
            s.count += 1;
        } else if slots.len() < SLOTS {
            slots.push(Slot {
                hash,
                key: Bytes::copy_from_slice(key),
                count: 1,
            });
        } else if let Some(min) = slots.iter_mut().min_by_key(|s| s.count) {
            // Space-saving: the newcomer inherits the evicted count, an upper bound.
            min.hash = hash;
            min.key = Bytes::copy_from_slice(key);
            min.count += 1;
        }
    }

    /// The `n` hottest keys, hottest first.
    pub fn top(&self, n: usize) -> Vec<HotKey> {
        let Ok(inner) = self.inner.lock() else {
            return Vec::new();
        };
        let secs = inner.since.elapsed().as_secs_f64().max(0.001);
        let mut v: Vec<&Slot> = inner.slots.iter().collect();
        v.sort_by_key(|s| std::cmp::Reverse(s.count));
        v.into_iter()
            .take(n)
            .map(|s| HotKey {
                key: s.key.clone(),
                rate: (s.count * SAMPLE_EVERY) as f64 / secs,
            })
            .collect()
    }

    /// Halves all counts so the list follows current traffic; called periodically.
    pub fn decay(&self) {
        if let Ok(mut inner) = self.inner.lock() {
            for s in inner.slots.iter_mut() {
                s.count /= 2;
            }
            inner.slots.retain(|s| s.count > 0);
            // Rates are per second over the decayed window: restart the clock at half
            // weight by pretending the window started half as long ago.
            let half = inner.since.elapsed() / 2;
            inner.since = Instant::now().checked_sub(half).unwrap_or(inner.since);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hottest_key_comes_first() {
        let h = HotKeys::default();
        let record = |key: &[u8]| {
            let hash =
                std::hash::BuildHasher::hash_one(&foldhash::fast::FixedState::default(), key);
            h.record(hash, key);
        };
        for i in 0..1000 {
            record(b"hot");
            record(format!("cold{i}").as_bytes());
        }
        let top = h.top(3);
        assert_eq!(&top[0].key[..], b"hot");
        assert_eq!(top.len(), 3);
    }
}
