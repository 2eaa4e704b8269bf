//! The local store: key → cached GET result with its expiry, bounded in bytes, evicting by
//! frequency and recency (S3-FIFO, from `quick_cache`), with a per-thread front of recent
//! hits (`front.rs`).

use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use quick_cache::sync::Cache;
use quick_cache::{DefaultHashBuilder, Lifecycle, Weighter};

use super::entry::Entry;
use super::front;
use super::presence::{Held, Presence};
use super::short_key::ShortKey;

/// How keys are hashed for [`Presence`]: the admission's hasher, so the counts are by the
/// hashes lookups and writes check.
pub(super) type KeyHasher = foldhash::fast::RandomState;

#[derive(Debug, Clone)]
struct ByteWeighter;

impl Weighter<ShortKey, Arc<Entry>> for ByteWeighter {
    fn weight(&self, key: &ShortKey, val: &Arc<Entry>) -> u64 {
        (key.bytes().len() + val.weight()) as u64
    }
}

/// What is done as entries leave: the one place every way out (removal, replacement,
/// eviction, expiry, clearing) goes through.
#[derive(Debug, Clone)]
struct Exits {
    evictions: Arc<AtomicU64>,
    presence: Arc<Presence>,
    hasher: KeyHasher,
}

impl Exits {
    /// `e` left the map: the fronts stop serving it, and it is no longer counted present.
    fn left(&self, key: &[u8], e: &Entry) {
        if e.retire() {
            self.presence.remove(self.hasher.hash_one(key), Held::Entry);
        }
    }
}

impl Lifecycle<ShortKey, Arc<Entry>> for Exits {
    type RequestState = ();

    fn on_evict(&self, _state: &mut (), key: ShortKey, val: Arc<Entry>) {
        self.left(key.bytes(), &val);
        self.evictions.fetch_add(1, Ordering::Relaxed);
    }
}

/// Byte-bounded key → entry map. Keys are inline when short, so a lookup compares the key
/// in the table's own memory. Recent hits are served from each thread's front (`front.rs`),
/// which is why every way an entry leaves the map retires it. Entries are counted in a
/// [`Presence`] while they are in the map.
#[derive(Debug)]
pub struct Store {
    map: Cache<ShortKey, Arc<Entry>, ByteWeighter, DefaultHashBuilder, Exits>,
    exits: Exits,
    /// Names this store's slots in the fronts.
    owner: u32,
    /// The budget, in the map's weights.
    max_bytes: u64,
    /// Inserts so far, to look at the map's weight every [`WEIGH_EVERY`] of them.
    inserts: AtomicU64,
    /// The map held over half its budget when last weighed: evictions may come, and hits
    /// through the fronts are shown to its eviction policy (see `front::TOUCH_EVERY`).
    /// Below that, nothing is evicted, and showing them cost a full lookup each (about a
    /// tenth of a hit's time on Zipf GETs).
    filling: AtomicBool,
    /// The slots each thread's front should have now (see `front::slots_for`), up to
    /// `front_cap`.
    front_slots: AtomicUsize,
    front_cap: usize,
}

/// Inserts between two looks at the map's weight and length (which lock every shard in turn).
const WEIGH_EVERY: u64 = 64;

impl Store {
    /// A store holding at most `max_bytes` of keys, values and overhead, counting its
    /// entries in `presence` by their keys' hashes from `hasher`.
    pub(super) fn new(max_bytes: u64, presence: Arc<Presence>, hasher: KeyHasher) -> Self {
        let exits = Exits {
            evictions: Arc::default(),
            presence,
            hasher,
        };
        let estimated_items = (max_bytes / 512).clamp(1024, 4_000_000) as usize;
        Store {
            map: Cache::with(
                estimated_items,
                max_bytes,
                ByteWeighter,
                DefaultHashBuilder::default(),
                exits.clone(),
            ),
            exits,
            owner: front::new_owner(),
            max_bytes,
            inserts: AtomicU64::new(0),
            filling: AtomicBool::new(false),
            front_slots: AtomicUsize::new(front::MIN_SLOTS),
            front_cap: front::max_slots(max_bytes),
        }
    }

    /// A store of `max_bytes` with presence counts of its own: for unit tests.
    #[cfg(test)]
    pub(super) fn for_test(max_bytes: u64) -> Self {
        Store::new(max_bytes, Arc::default(), KeyHasher::default())
    }

    /// The live entry for `key`, whose hash (any hash of the key, the same every time) is
    /// `hash`; an expired one is removed and reported as absent. With `front`, this thread's
    /// front is looked in first: worth it when the slot was prefetched, a cache miss more
    /// when it was not and the key is not there. `reads`, the key's read estimate, decides
    /// whether a hit here takes the key's front slot (`front::put`).
    pub fn get(
        &self,
        key: &[u8],
        hash: u64,
        now: Instant,
        front: bool,
        reads: u8,
    ) -> Option<Arc<Entry>> {
        if front
            && let Some(hit) = front::get(self.owner, hash, key, reads)
            && hit.entry.live_at(now)
        {
            if hit.touch && self.filling.load(Ordering::Relaxed) {
                self.map.get(key);
            }
            return Some(hit.entry);
        }
        let e = self.map.get(key)?;
        if !e.live_at(now) {
            self.remove(key);
            return None;
        }
        let size = self.front_slots.load(Ordering::Relaxed);
        front::put(self.owner, hash, key, &e, reads, size);
        Some(e)
    }

    /// Asks the CPU to load this thread's front slot for `hash`.
    pub fn prefetch(&self, hash: u64) {
        front::prefetch(hash);
    }

    /// Asks the CPU to load the entry in this thread's front slot for `hash`: worth it once
    /// the slot is loaded, some time after [`Store::prefetch`].
    pub fn prefetch_entry(&self, hash: u64) {
        front::prefetch_entry(hash);
    }

    /// Inserts or replaces an entry (may evict others to stay within the budget). A replaced
    /// entry goes through `on_evict`, which retires it, and the key keeps its standing in the
    /// eviction policy (a refresh replaces the hottest keys' entries).
    pub fn insert(&self, key: &[u8], entry: Arc<Entry>) {
        self.exits
            .presence
            .add(self.exits.hasher.hash_one(key), Held::Entry);
        self.map.insert(ShortKey::new(key), entry);
        if self
            .inserts
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(WEIGH_EVERY)
        {
            let filling = self.map.weight() > self.max_bytes / 2;
            self.filling.store(filling, Ordering::Relaxed);
            let slots = front::slots_for(self.map.len(), self.front_cap);
            self.front_slots.fetch_max(slots, Ordering::Relaxed);
        }
    }

    /// Removes `key`, returning its entry if it was present.
    pub fn remove(&self, key: &[u8]) -> Option<Arc<Entry>> {
        let (_, e) = self.map.remove(key)?;
        self.exits.left(key, &e);
        Some(e)
    }

    /// Removes everything.
    pub fn clear(&self) {
        for (k, e) in self.map.drain() {
            self.exits.left(k.bytes(), &e);
        }
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
        self.exits.evictions.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::cache::value::Value;

    fn entry(v: &[u8], ttl: Duration) -> Arc<Entry> {
        Entry::new(
            Value::bulk(v),
            Instant::now() + ttl,
            Duration::ZERO,
            Duration::ZERO,
        )
    }

    #[test]
    fn expired_entries_are_not_served() {
        let s = Store::for_test(1 << 20);
        s.insert(b"k", entry(b"v", Duration::ZERO));
        assert!(s.get(b"k", 0, Instant::now(), true, 0).is_none());
        s.insert(b"k", entry(b"v", Duration::from_secs(60)));
        assert!(s.get(b"k", 0, Instant::now(), true, 0).is_some());
    }

    /// The same hash for the same key every time, as the store's callers give it.
    fn hash(key: &[u8]) -> u64 {
        use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher};
        BuildHasherDefault::<DefaultHasher>::default().hash_one(key)
    }

    /// A key read once more after each change, so that the front holds its entry.
    fn served(s: &Store, key: &[u8], h: u64) -> Option<Arc<Entry>> {
        s.get(key, h, Instant::now(), true, 0)
    }

    #[test]
    fn the_front_never_serves_an_entry_that_left_the_store() {
        let s = Store::for_test(1 << 20);
        let h = hash(b"k");
        let first = entry(b"1", Duration::from_secs(60));
        s.insert(b"k", first.clone());
        assert!(served(&s, b"k", h).is_some_and(|e| Arc::ptr_eq(&e, &first)));
        // Served from the front now; replaced, removed, cleared: never the old entry.
        assert!(served(&s, b"k", h).is_some_and(|e| Arc::ptr_eq(&e, &first)));
        let second = entry(b"2", Duration::from_secs(60));
        s.insert(b"k", second.clone());
        assert!(served(&s, b"k", h).is_some_and(|e| Arc::ptr_eq(&e, &second)));
        assert!(s.remove(b"k").is_some());
        assert!(served(&s, b"k", h).is_none());
        s.insert(b"k", entry(b"3", Duration::from_secs(60)));
        assert!(served(&s, b"k", h).is_some());
        s.clear();
        assert!(served(&s, b"k", h).is_none());
    }

    #[test]
    fn the_front_never_serves_an_expired_or_evicted_entry() {
        let s = Store::for_test(1 << 20);
        let h = hash(b"k");
        s.insert(b"k", entry(b"v", Duration::from_millis(30)));
        assert!(served(&s, b"k", h).is_some());
        std::thread::sleep(Duration::from_millis(40));
        assert!(served(&s, b"k", h).is_none());
        assert!(!s.contains(b"k"), "an expired entry is removed when found");

        // Each key is read right after its insert, so the front holds it when it is evicted.
        let keys: Vec<String> = (0..20_000).map(|i| format!("key:{i}")).collect();
        for k in &keys {
            s.insert(k.as_bytes(), entry(b"v", Duration::from_secs(60)));
            served(&s, k.as_bytes(), hash(k.as_bytes()));
        }
        assert!(s.evictions() > 0);
        for k in &keys {
            let got = served(&s, k.as_bytes(), hash(k.as_bytes())).is_some();
            assert_eq!(got, s.contains(k.as_bytes()), "{k}");
        }
    }

    #[test]
    fn fronts_are_asked_to_grow_with_the_entries_up_to_the_cap() {
        let s = Store::for_test(256 << 20);
        let slots = || s.front_slots.load(Ordering::Relaxed);
        assert_eq!(slots(), front::MIN_SLOTS);
        for i in 0..20_000 {
            let k = format!("key:{i}");
            s.insert(k.as_bytes(), entry(b"v", Duration::from_secs(60)));
        }
        assert_eq!(slots(), 65_536, "about twice 20,000 entries");
        // The entries stay served through the larger front.
        for i in (0..20_000).step_by(97) {
            let k = format!("key:{i}");
            assert!(served(&s, k.as_bytes(), hash(k.as_bytes())).is_some());
            assert!(served(&s, k.as_bytes(), hash(k.as_bytes())).is_some());
        }
        let small = Store::for_test(1 << 20);
        for i in 0..20_000 {
            small.insert(
                format!("key:{i}").as_bytes(),
                entry(b"v", Duration::from_secs(60)),
            );
        }
        assert_eq!(
            small.front_slots.load(Ordering::Relaxed),
            front::MIN_SLOTS,
            "capped"
        );
    }

    #[test]
    fn byte_budget_holds() {
        let s = Store::for_test(1 << 20);
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
