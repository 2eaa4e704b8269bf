//! The hottest keys, for `CORRAL HOTKEYS`: a space-saving top-k over a sample of GETs.
//! Sampling keeps the lock off the hot path; counts are scaled back by the sampling rate.

use std::sync::Mutex;
use std::time::Instant;

use bytes::Bytes;

/// One in this many GETs (of keys hot enough to be admitted) is recorded: a key read a
/// thousand times a second is still sampled some 150 times per decay period, and on a long
/// tail, where nearly every sample evicts a slot, one in 16 cost 30 instructions per GET.
pub const SAMPLE_EVERY: u64 = 64;
/// Keys tracked.
pub(super) const SLOTS: usize = 64;

/// The tracked keys, column by column: a sampled GET scans only `hashes` (8 cache lines for
/// 64 slots, where whole slots took 48), and an eviction only `counts`.
#[derive(Debug)]
struct Inner {
    hashes: Vec<u64>,
    counts: Vec<u64>,
    keys: Vec<Bytes>,
    since: Instant,
}

impl Inner {
    fn slot_of(&self, hash: u64, key: &[u8]) -> Option<usize> {
        self.hashes
            .iter()
            .zip(&self.keys)
            .position(|(&h, k)| h == hash && k == key)
    }
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
                hashes: Vec::with_capacity(SLOTS),
                counts: Vec::with_capacity(SLOTS),
                keys: Vec::with_capacity(SLOTS),
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
        if let Some(i) = inner.slot_of(hash, key) {
            inner.counts[i] += 1;
        } else if inner.hashes.len() < SLOTS {
            inner.hashes.push(hash);
            inner.counts.push(1);
            inner.keys.push(Bytes::copy_from_slice(key));
        } else if let Some((i, _)) = inner.counts.iter().enumerate().min_by_key(|&(_, c)| *c) {
            // Space-saving: the newcomer inherits the evicted count, an upper bound.
            inner.hashes[i] = hash;
            inner.keys[i] = Bytes::copy_from_slice(key);
            inner.counts[i] += 1;
        }
    }

    /// The `n` hottest keys, hottest first.
    pub fn top(&self, n: usize) -> Vec<HotKey> {
        let Ok(inner) = self.inner.lock() else {
            return Vec::new();
        };
        let secs = inner.since.elapsed().as_secs_f64().max(0.001);
        let mut v: Vec<(u64, &Bytes)> = inner.counts.iter().copied().zip(&inner.keys).collect();
        v.sort_by_key(|&(count, _)| std::cmp::Reverse(count));
        v.into_iter()
            .take(n)
            .map(|(count, key)| HotKey {
                key: key.clone(),
                rate: (count * SAMPLE_EVERY) as f64 / secs,
            })
            .collect()
    }

    /// Halves all counts so the list follows current traffic; called periodically.
    pub fn decay(&self) {
        if let Ok(mut inner) = self.inner.lock() {
            let inner = &mut *inner;
            let mut i = 0;
            while i < inner.counts.len() {
                inner.counts[i] /= 2;
                if inner.counts[i] == 0 {
                    inner.counts.swap_remove(i);
                    inner.hashes.swap_remove(i);
                    inner.keys.swap_remove(i);
                } else {
                    i += 1;
                }
            }
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

    /// A sampled GET of `key`, hashed as the cache would.
    fn record(h: &HotKeys, key: &[u8]) {
        let hash = std::hash::BuildHasher::hash_one(&foldhash::fast::FixedState::default(), key);
        h.record(hash, key);
    }

    #[test]
    fn hottest_key_comes_first() {
        let h = HotKeys::default();
        let record = |key: &[u8]| record(&h, key);
        for i in 0..1000 {
            record(b"hot");
            record(format!("cold{i}").as_bytes());
        }
        let top = h.top(3);
        assert_eq!(&top[0].key[..], b"hot");
        assert_eq!(top.len(), 3);
        // Decay halves the counts and drops keys it brings to zero; the hot key stays first.
        for _ in 0..5 {
            h.decay();
        }
        let top = h.top(64);
        assert_eq!(&top[0].key[..], b"hot");
        assert!(top.len() < SLOTS, "{} keys left", top.len());
    }
}
