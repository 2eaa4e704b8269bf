//! The local store: key → cached GET result with its expiry, bounded in bytes, evicting by
//! frequency and recency (S3-FIFO, from `quick_cache`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::BytesMut;
use quick_cache::sync::Cache;
use quick_cache::{DefaultHashBuilder, Lifecycle, Weighter};

use super::short_key::ShortKey;
use super::value::Value;
use crate::resp::Proto;

/// Bytes charged per entry besides its key: the entry's allocation (with room for an inline
/// frame) and its slot in the table.
const ENTRY_OVERHEAD: usize = 192;
/// Charged on top for a value kept outside the entry: its own allocation's header.
const OUTLINE_OVERHEAD: usize = 32;
/// Longest reply frame kept inside the entry itself: `$64\r\n` + 64 bytes + CRLF fits.
/// Together with the entry's other fields this stays within two cache lines.
const INLINE_FRAME: usize = 72;

/// A cached GET result. In declaration order (`repr(C)`): what every hit reads first, next
/// to the reference counts, then the frame.
#[derive(Debug)]
#[repr(C)]
pub struct Entry {
    /// When it must stop being served (the key's TTL in Redis, or corral's maximum age).
    pub expires: Instant,
    /// Served at least once: an entry invalidated before any hit was a wasted fill.
    pub hit: AtomicBool,
    /// How long the fill took, in microseconds (saturating): XFetch refreshes earlier for
    /// slower keys. Kept small so a 64-byte value still fits the entry's two cache lines.
    delta_us: u32,
    /// The value: for short strings its reply frame, in the entry's own allocation, so a
    /// hit reads one block of memory and counts one reference (a separate value cost a
    /// second cache miss and a second reference count on every hit).
    body: Body,
}

#[derive(Debug, PartialEq, Eq)]
enum Body {
    /// A bulk string's whole reply frame, `len` bytes of `frame`.
    Inline { len: u8, frame: [u8; INLINE_FRAME] },
    /// Anything else: a longer string, or nil.
    Value(Value),
}

impl PartialEq for Entry {
    fn eq(&self, other: &Entry) -> bool {
        self.body == other.body
    }
}

impl Eq for Entry {}

impl Entry {
    /// A new, not yet served entry.
    pub fn new(value: Value, expires: Instant, delta: Duration) -> Arc<Entry> {
        let body = match &value {
            Value::Bulk(f) if f.len() <= INLINE_FRAME => {
                let mut frame = [0; INLINE_FRAME];
                frame[..f.len()].copy_from_slice(f);
                Body::Inline {
                    len: f.len() as u8,
                    frame,
                }
            }
            _ => Body::Value(value),
        };
        Arc::new(Entry {
            expires,
            hit: AtomicBool::new(false),
            delta_us: u32::try_from(delta.as_micros()).unwrap_or(u32::MAX),
            body,
        })
    }

    /// How long the fill took.
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
    fn weight(&self) -> usize {
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
        (key.bytes().len() + val.weight()) as u64
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
    fn an_entry_with_a_64_byte_value_is_one_allocation_of_two_cache_lines() {
        // The Arc's two counts come on top of the entry.
        assert!(std::mem::size_of::<Entry>() + 16 <= 128);
        let e = entry(&[b'x'; 64], Duration::from_secs(60));
        assert!(matches!(e.body, Body::Inline { .. }));
    }

    #[test]
    fn short_and_long_values_read_back_the_same() {
        for v in [&b"v"[..], &[b'x'; 64], &[b'y'; 65], &[b'z'; 4000]] {
            let e = entry(v, Duration::from_secs(60));
            let (mut got, mut want) = (BytesMut::new(), BytesMut::new());
            e.encode(Proto::Resp3, &mut got);
            Value::bulk(v).encode(Proto::Resp3, &mut want);
            assert_eq!(got, want);
            assert_eq!(e.size(), v.len());
        }
        let nil = Entry::new(Value::Nil, Instant::now(), Duration::ZERO);
        let mut out = BytesMut::new();
        nil.encode(Proto::Resp2, &mut out);
        assert_eq!(&out[..], b"$-1\r\n");
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
