//! The local store: key → cached GET result with its expiry, bounded in bytes, evicting by
//! use (a clock over the table's slots, `table.rs`), with a per-thread front of recent hits
//! (`front.rs`).

use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use tracing::debug;

use super::drops;
use super::entry::Entry;
use super::front;
use super::presence::{Held, Presence};
use super::table::{Exit, Table};

/// How keys are hashed, for the table and for [`Presence`]: the admission's hasher, so that
/// the hashes lookups are given are the ones entries were stored and counted by.
pub(super) type KeyHasher = foldhash::fast::RandomState;

/// What is done as entries leave: the one place every way out (removal, replacement,
/// eviction, expiry, clearing) goes through.
#[derive(Debug)]
struct Exits {
    evictions: AtomicU64,
    presence: Arc<Presence>,
}

impl Exits {
    /// `e`, whose key's hash is `hash`, left the table: the fronts stop serving it, and it is
    /// no longer counted present.
    fn left(&self, hash: u64, e: &Entry) {
        retire(&self.presence, hash, e);
    }
}

/// Retires `e`, whose key's hash is `hash`, and uncounts it in `presence`, the first time
/// only (see [`Exits::left`]).
fn retire(presence: &Presence, hash: u64, e: &Entry) {
    if e.retire() {
        presence.remove(hash, Held::Entry);
    }
}

/// Byte-bounded key → entry map. Recent hits are served from each thread's front
/// (`front.rs`), which is why every way an entry leaves the table retires it. Entries are
/// counted in a [`Presence`] while they are in the table.
#[derive(Debug)]
pub struct Store {
    table: Table,
    exits: Exits,
    hasher: KeyHasher,
    /// Names this store's slots in the fronts; a new name at each [`Store::clear`], so that
    /// no front serves what was in the store before it.
    owner: AtomicU32,
    /// Inserts so far, to look at the table's length every [`WEIGH_EVERY`] of them.
    inserts: AtomicU64,
    /// The slots each thread's front should have now (see `front::slots_for`), up to
    /// `front_cap`.
    front_slots: AtomicUsize,
    front_cap: usize,
    /// A [`Store::retain`] is under way.
    sweeping: AtomicBool,
    /// Sweeps that cleared the store instead ([`Store::retain`]).
    sweep_clears: AtomicU64,
}

/// Inserts between two looks at the table's length (which reads a count from every shard).
const WEIGH_EVERY: u64 = 64;
/// Least entries for which a sweep that would keep few clears the store instead
/// ([`Store::retain`]): under it a sweep is quick anyway.
pub(super) const CLEAR_FROM: usize = 16_384;
/// A sweep that would keep at most one entry in this many clears the store instead...
const CLEAR_KEEPING: usize = 16;
/// ...and at most this many: what a clear drops beyond the sweep is filled again in moments.
/// A sweep that would keep a short window's tens of thousands of hot keys out of a settled
/// long window's 630,000 entries stays a sweep, and the fronts sized for them stay.
const CLEAR_MOST_KEPT: usize = 4096;
/// Buckets looked at to tell (some 1,500 entries in a full table, at most three a bucket).
const SAMPLE_BUCKETS: usize = 512;

impl Store {
    /// A store holding at most `max_bytes` of keys, values and overhead, counting its
    /// entries in `presence`; `hasher` hashes its keys, as the lookups' hashes were.
    pub(super) fn new(max_bytes: u64, presence: Arc<Presence>, hasher: KeyHasher) -> Self {
        Store {
            table: Table::new(max_bytes),
            exits: Exits {
                evictions: AtomicU64::new(0),
                presence,
            },
            hasher,
            owner: AtomicU32::new(front::new_owner()),
            inserts: AtomicU64::new(0),
            front_slots: AtomicUsize::new(front::MIN_SLOTS),
            front_cap: front::max_slots(max_bytes),
            sweeping: AtomicBool::new(false),
            sweep_clears: AtomicU64::new(0),
        }
    }

    /// A store of `max_bytes` with presence counts of its own: for unit tests.
    #[cfg(test)]
    pub(super) fn for_test(max_bytes: u64) -> Self {
        Store::new(max_bytes, Arc::default(), KeyHasher::default())
    }

    /// The hash lookups of `key` must give: for unit tests.
    #[cfg(test)]
    pub(super) fn hash(&self, key: &[u8]) -> u64 {
        self.hasher.hash_one(key)
    }

    /// The live entry for `key`, whose hash (from the hasher the store was made with) is
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
        // Read once, before the table: an entry a clear took out meanwhile goes in the front
        // under the name of before the clear, which no lookup after it serves.
        let owner = self.owner();
        if front
            && let Some(e) = self.in_front(owner, key, hash, now, Some(reads), |e| Some(e.clone()))
        {
            return Some(e);
        }
        let e = self.table.get(hash, key)?;
        if !e.live_at(now) {
            self.table.remove_if(
                hash,
                key,
                |x| Arc::ptr_eq(x, &e),
                |x| self.exits.left(hash, x),
            );
            return None;
        }
        let size = self.front_slots.load(Ordering::Relaxed);
        front::put(owner, hash, key, &e, reads, size);
        Some(e)
    }

    /// Hands `serve` the entry of `key` if this thread's front holds it, live at `now`: a hit
    /// that reads neither the table nor the read sketch (see `read.rs`), and takes no
    /// reference to the entry. What `serve` returns; `None` if the front does not hold the
    /// key, or `serve` declined the entry.
    #[inline]
    pub fn front_hit<R>(
        &self,
        key: &[u8],
        hash: u64,
        now: Instant,
        serve: impl FnOnce(&Arc<Entry>) -> Option<R>,
    ) -> Option<R> {
        self.in_front(self.owner(), key, hash, now, None, serve)
    }

    /// The front's part of a lookup: see `front::with_entry` for `reads`.
    #[inline]
    fn in_front<R>(
        &self,
        owner: u32,
        key: &[u8],
        hash: u64,
        now: Instant,
        reads: Option<u8>,
        serve: impl FnOnce(&Arc<Entry>) -> Option<R>,
    ) -> Option<R> {
        front::with_entry(owner, hash, key, reads, |e| {
            if !e.live_at(now) {
                return None;
            }
            let served = serve(e)?;
            // The table's clock sees the key in use, as a hit there would have shown it.
            e.mark_used();
            Some(served)
        })
    }

    /// Asks the CPU to load this thread's front slot for `hash`.
    pub fn prefetch(&self, hash: u64) {
        front::prefetch(hash);
    }

    /// Asks the CPU to load the entry in this thread's front slot for `hash`: worth it once
    /// the slot is loaded, some time after [`Store::prefetch`]. Returns false if no slot was
    /// the key's: the lookup will read the table, whose bucket [`Store::prefetch_table`]
    /// loads.
    pub fn prefetch_entry(&self, hash: u64) -> bool {
        front::prefetch_entry(hash)
    }

    /// Asks the CPU to load the table's bucket for `hash`. Not with the front's slot: a
    /// round's GETs then asked for more lines at once than the CPU fetches in parallel, and
    /// the prefetches themselves waited (perf, Zipf GETs with `hot_threshold = 1`: 26 ns per
    /// request more in `Store::prefetch`), for keys the front mostly serves.
    pub fn prefetch_table(&self, hash: u64) {
        self.table.prefetch(hash);
    }

    /// Asks the CPU to load the entry the table holds for `hash`, key and all: worth it once
    /// its bucket is loaded, some time after [`Store::prefetch_table`]. A lookup in the table
    /// compares the entry's key, which a front hit does not read, and which lies past what
    /// [`Store::prefetch_entry`] loads.
    pub fn prefetch_table_entry(&self, hash: u64) {
        self.table.prefetch_entry(hash);
    }

    /// [`Store::insert_hashed`], the key hashed here.
    #[cfg(test)]
    pub fn insert(&self, entry: Arc<Entry>) {
        self.insert_hashed(self.hasher.hash_one(entry.key()), entry);
    }

    /// Inserts or replaces the entry of `entry`'s key, whose hash (from the store's hasher)
    /// is `hash`: the fill that made it has it at hand. May evict others to stay within the
    /// budget; a replaced entry is retired like any other that leaves.
    pub(super) fn insert_hashed(&self, hash: u64, entry: Arc<Entry>) {
        debug_assert_eq!(hash, self.hasher.hash_one(entry.key()));
        // Counted before it is in the table: a lookup that finds it must find it counted.
        self.exits.presence.add(hash, Held::Entry);
        self.table.insert(hash, entry, |e, why| {
            // An evicted entry may be of another key: its hash is worked out again.
            let h = if why == Exit::Replaced {
                hash
            } else {
                self.hasher.hash_one(e.key())
            };
            self.exits.left(h, &e);
            if why == Exit::Evicted {
                self.exits.evictions.fetch_add(1, Ordering::Relaxed);
            }
        });
        if self
            .inserts
            .fetch_add(1, Ordering::Relaxed)
            .is_multiple_of(WEIGH_EVERY)
        {
            let slots = front::slots_for(self.table.len(), self.front_cap);
            self.front_slots.fetch_max(slots, Ordering::Relaxed);
        }
    }

    /// Removes `key`, returning its entry if it was present.
    pub fn remove(&self, key: &[u8]) -> Option<Arc<Entry>> {
        let hash = self.hasher.hash_one(key);
        self.table
            .remove_if(hash, key, |_| true, |e| self.exits.left(hash, e))
    }

    /// This store's name in the fronts now (see [`Store::clear`]).
    #[inline]
    fn owner(&self) -> u32 {
        self.owner.load(Ordering::Acquire)
    }

    /// Removes everything. The fronts stop serving it at once: the store takes a new name
    /// there once the table is empty. Each entry is then retired and uncounted in
    /// [`Presence`] a step at a time on the runtime (`drops.rs`), a cache miss or two per
    /// entry that held corral's thread for 37 ms when a lane reset cleared a settled store;
    /// until then the counts are higher than what the store holds, which only sends a
    /// lookup or an invalidation to the table for nothing.
    pub fn clear(&self) {
        let taken = self.table.clear();
        // After the table: a lookup that reads the new name finds only what came after.
        self.owner.store(front::new_owner(), Ordering::Release);
        self.fit_fronts();
        let (presence, hasher) = (self.exits.presence.clone(), self.hasher.clone());
        drops::in_steps(taken, move |e| {
            retire(&presence, hasher.hash_one(e.key()), &e)
        });
    }

    /// Sizes the fronts for the entries held now once they would have at most a quarter of
    /// their slots: after a sweep or a clear, a front grown for many more entries would keep
    /// as many slots, and the entries in them that left the store, until it grew again
    /// (inserts only ever ask for more slots). A store that shrank less keeps its fronts: a
    /// sweep near a power of two would otherwise halve them, and the next inserts double
    /// them again, each time emptying every thread's front.
    fn fit_fronts(&self) {
        let slots = front::slots_for(self.table.len(), self.front_cap);
        if slots <= self.front_slots.load(Ordering::Relaxed) / 4 {
            self.front_slots.store(slots, Ordering::Relaxed);
        }
    }

    /// Lets go of this thread's front if it has more slots than the store asks for now (see
    /// [`Store::fit_fronts`]): the next hit put there starts one of the right size. For a
    /// thread whose hits stopped, which no put would shrink.
    #[inline]
    pub fn fit_front(&self) {
        front::fit(self.front_slots.load(Ordering::Relaxed));
    }

    /// Removes every entry whose key's hash `keep` refuses, unless another call is doing so
    /// already (see [`Store::sweeping`]): false then, and nothing done. The entries are
    /// dropped a step at a time on the runtime, even when this runs on a blocking thread
    /// (`drops.rs`).
    ///
    /// A store of at least [`CLEAR_FROM`] entries of which a sample says `keep` would keep at
    /// most one in [`CLEAR_KEEPING`], and at most [`CLEAR_MOST_KEPT`] in all, is cleared
    /// instead, its few kept entries with the rest: a sweep reads each entry's key and its
    /// sketch counts, a miss or three each, and takes each one out under its shard's write
    /// lock. After Zipf GETs over 1M keys turned into the 90/10 mix, such a sweep of 193,000
    /// entries kept 216, and its walk took 48 ns of corral's CPU per request over the mix's
    /// first two seconds (956 in all). The few are filled again at their next GETs.
    pub fn retain(&self, keep: impl Fn(u64) -> bool) -> bool {
        if self.sweeping.swap(true, Ordering::AcqRel) {
            return false;
        }
        // Let go however the sweep ends.
        struct Done<'a>(&'a AtomicBool);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                self.0.store(false, Ordering::Release);
            }
        }
        let _done = Done(&self.sweeping);
        let len = self.table.len();
        if len >= CLEAR_FROM {
            let sample = self.table.sample(SAMPLE_BUCKETS);
            let seen = sample.len();
            let kept = sample
                .iter()
                .filter(|e| keep(self.hasher.hash_one(e.key())))
                .count();
            drop(sample);
            if seen > 0 && kept * CLEAR_KEEPING <= seen && kept * len <= CLEAR_MOST_KEPT * seen {
                debug!(
                    entries = len,
                    seen, kept, "store cleared: a sweep would keep few"
                );
                self.sweep_clears.fetch_add(1, Ordering::Relaxed);
                self.clear();
                return true;
            }
        }
        let taken = self.table.retain(
            |e| self.hasher.hash_one(e.key()),
            keep,
            |hash, e| self.exits.left(hash, e),
        );
        self.fit_fronts();
        drops::drop_in_steps(taken);
        true
    }

    /// Whether a [`Store::retain`] is under way: one runs at a time, so that a bar that goes
    /// back to the top again before a sweep ends does not start a second walk of the store.
    pub fn sweeping(&self) -> bool {
        self.sweeping.load(Ordering::Acquire)
    }

    /// Whether `key` is present (expired or not).
    pub fn contains(&self, key: &[u8]) -> bool {
        self.table.contains(self.hasher.hash_one(key), key)
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    /// Bytes charged against the budget.
    pub fn bytes(&self) -> u64 {
        self.table.bytes()
    }

    /// Sweeps that cleared the store instead, since start (see [`Store::retain`]).
    pub fn sweep_clears(&self) -> u64 {
        self.sweep_clears.load(Ordering::Relaxed)
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

    fn entry(key: &[u8], v: &[u8], ttl: Duration) -> Arc<Entry> {
        Entry::new(
            key,
            Value::bulk(v),
            Instant::now() + ttl,
            Duration::ZERO,
            Duration::ZERO,
        )
    }

    #[test]
    fn a_sweep_that_would_keep_few_of_many_clears_instead() {
        let filled = |n: usize| {
            let s = Store::for_test(64 << 20);
            for i in 0..n {
                let k = format!("key:{i}");
                s.insert(entry(k.as_bytes(), b"v", Duration::from_secs(60)));
            }
            s
        };
        // One key in `1 / share` of 256 kept, by bits the table's buckets do not go by.
        let keeps = |share: u64| move |h: u64| h.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56 < share;
        let many = CLEAR_FROM + 4_000;
        // One in 32 kept: all gone, the few with the rest.
        let s = filled(many);
        assert!(s.retain(keeps(8)));
        assert_eq!((s.len(), s.sweep_clears()), (0, 1));
        // One in 8 kept: swept, the kept ones stay.
        let s = filled(many);
        assert!(s.retain(keeps(32)));
        assert!((2_000..3_200).contains(&s.len()), "{}", s.len());
        assert_eq!(s.sweep_clears(), 0);
        // One in 21 of 150,000, some 7,000 kept: more than a clear may drop.
        let s = filled(150_000);
        assert!(s.retain(keeps(12)));
        assert!((6_000..8_000).contains(&s.len()), "{}", s.len());
        // Few kept of a store under the floor: swept.
        let s = filled(CLEAR_FROM / 2);
        assert!(s.retain(keeps(2)));
        assert!((20..200).contains(&s.len()), "{}", s.len());
    }

    #[test]
    fn one_sweep_at_a_time() {
        let s = Store::for_test(1 << 20);
        s.insert(entry(b"k", b"v", Duration::from_secs(60)));
        assert!(!s.sweeping());
        let swept = s.retain(|_| {
            assert!(s.sweeping());
            assert!(!s.retain(|_| false), "a second sweep meanwhile");
            true
        });
        assert!(swept && !s.sweeping());
        assert!(s.contains(b"k"), "the second sweep did nothing");
        assert!(s.retain(|_| false));
        assert!(!s.contains(b"k"));
    }

    #[test]
    fn expired_entries_are_not_served() {
        let s = Store::for_test(1 << 20);
        s.insert(entry(b"k", b"v", Duration::ZERO));
        assert!(s.get(b"k", s.hash(b"k"), Instant::now(), true, 0).is_none());
        s.insert(entry(b"k", b"v", Duration::from_secs(60)));
        assert!(s.get(b"k", s.hash(b"k"), Instant::now(), true, 0).is_some());
    }

    /// A key read once more after each change, so that the front holds its entry.
    fn served(s: &Store, key: &[u8], h: u64) -> Option<Arc<Entry>> {
        s.get(key, h, Instant::now(), true, 0)
    }

    #[test]
    fn the_front_never_serves_an_entry_that_left_the_store() {
        let s = Store::for_test(1 << 20);
        let h = s.hash(b"k");
        let first = entry(b"k", b"1", Duration::from_secs(60));
        s.insert(first.clone());
        assert!(served(&s, b"k", h).is_some_and(|e| Arc::ptr_eq(&e, &first)));
        // Served from the front now; replaced, removed, cleared: never the old entry.
        assert!(served(&s, b"k", h).is_some_and(|e| Arc::ptr_eq(&e, &first)));
        let second = entry(b"k", b"2", Duration::from_secs(60));
        s.insert(second.clone());
        assert!(served(&s, b"k", h).is_some_and(|e| Arc::ptr_eq(&e, &second)));
        assert!(s.remove(b"k").is_some());
        assert!(served(&s, b"k", h).is_none());
        s.insert(entry(b"k", b"3", Duration::from_secs(60)));
        assert!(served(&s, b"k", h).is_some());
        s.clear();
        assert!(served(&s, b"k", h).is_none());
    }

    /// A clear hides at once every entry a front holds, one a lookup that read the table
    /// before the clear puts there after it too, though the entries are retired and
    /// uncounted later, a step at a time.
    #[tokio::test]
    async fn after_a_clear_no_front_serves_what_the_store_held() {
        let presence = Arc::new(Presence::default());
        let s = Store::new(1 << 20, presence.clone(), KeyHasher::default());
        let h = s.hash(b"k");
        let front_hit = |s: &Store| s.front_hit(b"k", h, Instant::now(), |e| Some(e.clone()));
        let first = entry(b"k", b"1", Duration::from_secs(60));
        s.insert(first.clone());
        assert!(served(&s, b"k", h).is_some());
        assert!(front_hit(&s).is_some(), "in the front");
        let before = s.owner();
        s.clear();
        assert!(front_hit(&s).is_none(), "cleared");
        assert!(served(&s, b"k", h).is_none());
        front::put(before, h, b"k", &first, 15, front::MIN_SLOTS);
        assert!(
            front_hit(&s).is_none(),
            "put under the name of before the clear"
        );
        assert!(
            first.live() && presence.counts(h).entry(),
            "not yet retired"
        );
        for _ in 0..10 {
            if !first.live() {
                break;
            }
            tokio::task::yield_now().await;
        }
        assert!(
            !first.live() && !presence.counts(h).entry(),
            "retired, uncounted"
        );
        let second = entry(b"k", b"2", Duration::from_secs(60));
        s.insert(second.clone());
        assert!(served(&s, b"k", h).is_some_and(|e| Arc::ptr_eq(&e, &second)));
        assert!(front_hit(&s).is_some_and(|e| Arc::ptr_eq(&e, &second)));
        assert!(presence.counts(h).entry(), "the new entry counted");
    }

    /// [`Store::front_hit`] finds only the live entry the front holds, as a lookup would.
    #[test]
    fn a_front_hit_is_never_an_entry_that_left_or_expired() {
        let s = Store::for_test(1 << 20);
        let h = s.hash(b"k");
        let now = Instant::now;
        // The entry the front hands over, declined if it is not `first`'s value.
        let front_hit = |s: &Store, h, now| s.front_hit(b"k", h, now, |e| Some(e.clone()));
        assert!(front_hit(&s, h, now()).is_none(), "nothing cached");
        let first = entry(b"k", b"1", Duration::from_secs(60));
        s.insert(first.clone());
        assert!(front_hit(&s, h, now()).is_none(), "not in the front yet");
        assert!(served(&s, b"k", h).is_some());
        assert!(front_hit(&s, h, now()).is_some_and(|e| Arc::ptr_eq(&e, &first)));
        s.insert(entry(b"k", b"2", Duration::from_secs(60)));
        assert!(front_hit(&s, h, now()).is_none(), "replaced");
        assert!(served(&s, b"k", h).is_some());
        assert!(front_hit(&s, h, now()).is_some());
        assert!(s.remove(b"k").is_some());
        assert!(front_hit(&s, h, now()).is_none(), "removed");
        s.insert(entry(b"k", b"3", Duration::from_millis(30)));
        assert!(served(&s, b"k", h).is_some());
        assert!(
            front_hit(&s, h, now() + Duration::from_millis(40)).is_none(),
            "expired"
        );
    }

    /// A front hit gives what its server returns, which may decline the entry.
    #[test]
    fn a_front_hit_gives_what_its_server_returns() {
        let s = Store::for_test(1 << 20);
        let h = s.hash(b"k");
        s.insert(entry(b"k", b"1", Duration::from_secs(60)));
        assert!(served(&s, b"k", h).is_some());
        assert_eq!(s.front_hit(b"k", h, Instant::now(), |_| None::<()>), None);
        assert_eq!(s.front_hit(b"k", h, Instant::now(), |_| Some(7)), Some(7));
    }

    #[test]
    fn the_front_never_serves_an_expired_or_evicted_entry() {
        let s = Store::for_test(1 << 20);
        let h = s.hash(b"k");
        s.insert(entry(b"k", b"v", Duration::from_millis(30)));
        assert!(served(&s, b"k", h).is_some());
        std::thread::sleep(Duration::from_millis(40));
        assert!(served(&s, b"k", h).is_none());
        assert!(!s.contains(b"k"), "an expired entry is removed when found");

        // Each key is read right after its insert, so the front holds it when it is evicted.
        let keys: Vec<String> = (0..20_000).map(|i| format!("key:{i}")).collect();
        for k in &keys {
            s.insert(entry(k.as_bytes(), b"v", Duration::from_secs(60)));
            served(&s, k.as_bytes(), s.hash(k.as_bytes()));
        }
        assert!(s.evictions() > 0);
        for k in &keys {
            let got = served(&s, k.as_bytes(), s.hash(k.as_bytes())).is_some();
            assert_eq!(got, s.contains(k.as_bytes()), "{k}");
        }
    }

    #[test]
    fn fronts_are_asked_to_follow_the_entries_up_to_the_cap() {
        let s = Store::for_test(256 << 20);
        let slots = || s.front_slots.load(Ordering::Relaxed);
        assert_eq!(slots(), front::MIN_SLOTS);
        for i in 0..20_000 {
            let k = format!("key:{i}");
            s.insert(entry(k.as_bytes(), b"v", Duration::from_secs(60)));
        }
        assert_eq!(slots(), 65_536, "about twice 20,000 entries");
        // The entries stay served through the larger front.
        for i in (0..20_000).step_by(97) {
            let k = format!("key:{i}");
            assert!(served(&s, k.as_bytes(), s.hash(k.as_bytes())).is_some());
            assert!(served(&s, k.as_bytes(), s.hash(k.as_bytes())).is_some());
        }
        // A sweep that leaves a few entries more than half, not.
        s.retain(|h| h % 16 != 0);
        assert_eq!(slots(), 65_536);
        // A sweep that leaves few entries, or a clear, asks for fewer slots again.
        s.retain(|h| h % 16 == 1);
        assert!(s.len() < 2_000, "{}", s.len());
        assert_eq!(slots(), front::slots_for(s.len(), s.front_cap));
        assert!(slots() < 65_536);
        s.clear();
        assert_eq!(slots(), front::MIN_SLOTS);
        let small = Store::for_test(1 << 20);
        for i in 0..20_000 {
            let k = format!("key:{i}");
            small.insert(entry(k.as_bytes(), b"v", Duration::from_secs(60)));
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
            let k = format!("k{i}");
            s.insert(entry(k.as_bytes(), &big, Duration::from_secs(60)));
        }
        assert!(s.bytes() <= 1 << 20, "{}", s.bytes());
        assert!(s.evictions() > 0);
    }
}
