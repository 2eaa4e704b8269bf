//! The local store: key → cached GET result with its expiry, bounded in bytes, evicting by
//! frequency and recency (S3-FIFO, from `quick_cache`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use quick_cache::sync::Cache;
use quick_cache::{DefaultHashBuilder, Lifecycle, Weighter};

use super::short_key::ShortKey;
use super::value::Value;

/// Bookkeeping bytes charged per entry on top of key and value.
const ENTRY_OVERHEAD: usize = 96;

/// A cached GET result.
#[derive(Debug)]
pub struct Entry {
    /// The value.
    pub value: Value,
    /// When it must stop being served (the key's TTL in Redis, or corral's maximum age).
    pub expires: Instant,
    /// How long the fill took: XFetch refreshes earlier for slower keys.
    pub delta: Duration,
    /// Served at least once: an entry invalidated before any hit was a wasted fill.
    pub hit: AtomicBool,
}

impl Entry {
    /// A new, not yet served entry.
    pub fn new(value: Value, expires: Instant, delta: Duration) -> Arc<Entry> {
        Arc::new(Entry {
            value,
            expires,
            delta,
            hit: AtomicBool::new(false),
        })
    }

    /// Records a hit; a plain load first keeps the hot path free of writes to shared memory.
    pub fn mark_hit(&self) {
        if !self.hit.load(Ordering::Relaxed) {
            self.hit.store(true, Ordering::Relaxed);
        }
    }
}

#[derive(Debug, Clone)]
struct ByteWeighter;

impl Weighter<ShortKey, Arc<Entry>> for ByteWeighter {
    fn weight(&self, key: &ShortKey, val: &Arc<Entry>) -> u64 {
        (key.bytes().len() + val.value.size() + ENTRY_OVERHEAD) as u64
    }
}

#[derive(Debug, Clone, Default)]
struct CountEvictions(Arc<AtomicU64>);

impl Lifecycle<ShortKey, Arc<Entry>> for CountEvictions {
    type RequestState = ();

    fn on_evict(&self, _state: &mut (), _key: ShortKey, _val: Arc<Entry>) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// Byte-bounded key → entry map. Keys are inline when short, so a lookup compares the key
/// in the table's own memory.
#[derive(Debug)]
pub struct Store {
    map: Cache<ShortKey, Arc<Entry>, ByteWeighter, DefaultHashBuilder, CountEvictions>,
    evictions: Arc<AtomicU64>,
}

impl Store {
    /// A store holding at most `max_bytes` of keys, values and overhead.
    pub fn new(max_bytes: u64) -> Self {
        let evictions = CountEvictions::default();
        let counter = evictions.0.clone();
        let estimated_items = (max_bytes / 512).clamp(1024, 4_000_000) as usize;
        Store {
            map: Cache::with(
                estimated_items,
                max_bytes,
                ByteWeighter,
                DefaultHashBuilder::default(),
                evictions,
            ),
            evictions: counter,
        }
    }

    /// The live entry for `key`; an expired one is removed and reported as absent.
    pub fn get(&self, key: &[u8], now: Instant) -> Option<Arc<Entry>> {
        let e = self.map.get(key)?;
        if now >= e.expires {
            self.map.remove(key);
            return None;
        }
        Some(e)
    }

    /// Inserts or replaces an entry (may evict others to stay within the budget).
    pub fn insert(&self, key: &[u8], entry: Arc<Entry>) {
        self.map.insert(ShortKey::new(key), entry);
    }

    /// Removes `key`, returning its entry if it was present.
    pub fn remove(&self, key: &[u8]) -> Option<Arc<Entry>> {
        self.map.remove(key).map(|(_, e)| e)
    }

    /// Removes everything.
    pub fn clear(&self) {
        self.map.clear();
    }

    /// Whether `key` is present (expired or not).
    pub fn contains(&self, key: &[u8]) -> bool {
        self.map.contains_key(key)
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Bytes charged against the budget.
    pub fn bytes(&self) -> u64 {
        self.map.weight()
    }

    /// Entries evicted to stay within the budget, since start.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(v: &[u8], ttl: Duration) -> Arc<Entry> {
        Entry::new(Value::bulk(v), Instant::now() + ttl, Duration::ZERO)
    }

    #[test]
    fn expired_entries_are_not_served() {
        let s = Store::new(1 << 20);
        s.insert(b"k", entry(b"v", Duration::ZERO));
        assert!(s.get(b"k", Instant::now()).is_none());
        s.insert(b"k", entry(b"v", Duration::from_secs(60)));
        assert!(s.get(b"k", Instant::now()).is_some());
    }

    #[test]
    fn byte_budget_holds() {
        let s = Store::new(1 << 20);
        let big = vec![7u8; 64 * 1024];
        for i in 0..100 {
            s.insert(
                format!("k{i}").as_bytes(),
                entry(&big, Duration::from_secs(60)),
            );
        }
        assert!(s.bytes() <= 1 << 20, "{}", s.bytes());
        assert!(s.evictions() > 0);
    }
}
