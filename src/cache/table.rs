//! The store's index: key → entry, in shards of 64-byte buckets addressed by the key's hash,
//! evicting by a clock hand to stay within a byte budget.
//!
//! Why not a general-purpose cache map: with one (`quick_cache`, before this table) a lookup
//! followed its table, a slab, then the entry, three dependent cache misses on a large store,
//! none of which could be started ahead: 111-168 ns per lookup of random keys among 340,000
//! entries and 170-176 among 1M, in a standalone measurement. Here a bucket's address follows
//! from the hash alone, so a round prefetches its GETs' buckets with their other loads; a key
//! that is not cached is then decided by the bucket's tags alone, and a cached one costs the
//! bucket and its entry (25-34 and 44-51 ns in the same measurement, without prefetching).
//!
//! Layout: each shard is a lock over a power-of-two array of buckets, each four slots of a tag
//! (the key's hash with its top bit set; [`EMPTY`] or [`GONE`] when no entry is there) and an
//! entry, which holds its key. A key's probe starts at the bucket its hash picks and goes on
//! bucket by bucket until one with an empty slot. Eviction: a clock hand walks the slots; an
//! entry whose `used` mark is up (hits raise it) has it lowered and stays, one at zero goes.

use std::sync::atomic::{AtomicPtr, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

use super::entry::Entry;

/// Slots per bucket: four tags and four entry pointers make one 64-byte cache line.
const WAYS: usize = 4;
/// A slot that never held an entry since the table was built: a probe stops at its bucket.
const EMPTY: u64 = 0;
/// A slot whose entry left: probes go on past it, inserts reuse it.
const GONE: u64 = 1;
/// Buckets of a shard when it is new or cleared.
const MIN_BUCKETS: usize = 4;
/// Most shards: each is one lock, and two threads rarely want the same one of 64.
const MAX_SHARDS: u64 = 64;
/// Buckets whose entries [`Table::retain`] reads under one hold of a shard's read lock.
const RETAIN_BUCKETS: usize = 64;
/// Least budget per shard (when that allows fewer than [`MAX_SHARDS`]), so that a shard
/// holds many entries and a large value fits one.
const MIN_SHARD_BYTES: u64 = 4 << 20;

/// A key's tag: never [`EMPTY`] or [`GONE`], and its low bits pick the same bucket as the
/// hash does.
fn tag(hash: u64) -> u64 {
    hash | 1 << 63
}

/// What an entry is charged against the budget.
fn weight(e: &Entry) -> u64 {
    (e.key().len() + e.weight()) as u64
}

#[repr(C, align(64))]
#[derive(Default)]
struct Bucket {
    tags: [u64; WAYS],
    entries: [Option<Arc<Entry>>; WAYS],
}

/// One shard's slots and what it knows of them. Only touched under the shard's lock.
struct Slots {
    buckets: Box<[Bucket]>,
    /// Slots holding an entry.
    live: usize,
    /// Slots marked [`GONE`].
    gone: usize,
    /// The clock hand: the next slot eviction looks at.
    hand: usize,
    /// Bytes charged for the entries held.
    bytes: u64,
}

fn buckets(n: usize) -> Box<[Bucket]> {
    (0..n).map(|_| Bucket::default()).collect()
}

impl Slots {
    fn new(n: usize) -> Slots {
        Slots {
            buckets: buckets(n),
            live: 0,
            gone: 0,
            hand: 0,
            bytes: 0,
        }
    }

    fn mask(&self) -> usize {
        self.buckets.len() - 1
    }

    /// The slot holding `key`, whose hash is `hash`.
    fn find(&self, hash: u64, key: &[u8]) -> Option<(usize, usize)> {
        let t = tag(hash);
        let mut b = hash as usize & self.mask();
        for _ in 0..self.buckets.len() {
            let bucket = &self.buckets[b];
            for i in 0..WAYS {
                if bucket.tags[i] == t && bucket.entries[i].as_ref().is_some_and(|e| e.key() == key)
                {
                    return Some((b, i));
                }
            }
            if bucket.tags.contains(&EMPTY) {
                return None;
            }
            b = (b + 1) & self.mask();
        }
        None
    }

    /// The first slot on `tag`'s probe that holds no entry. Some slot is always free: the
    /// table is rebuilt before its used and gone slots pass 3/4 of all.
    fn free(&self, tag: u64) -> (usize, usize) {
        let mut b = tag as usize & self.mask();
        loop {
            if let Some(i) = self.buckets[b].tags.iter().position(|&t| t <= GONE) {
                return (b, i);
            }
            b = (b + 1) & self.mask();
        }
    }

    /// Puts `entry` in a free slot of its probe (the key must not be held).
    fn place(&mut self, tag: u64, entry: Arc<Entry>) {
        let (b, i) = self.free(tag);
        let bucket = &mut self.buckets[b];
        if bucket.tags[i] == GONE {
            self.gone -= 1;
        }
        bucket.tags[i] = tag;
        self.bytes += weight(&entry);
        bucket.entries[i] = Some(entry);
        self.live += 1;
    }

    /// Takes the entry out of slot `i` of bucket `b`.
    fn take(&mut self, b: usize, i: usize) -> Option<Arc<Entry>> {
        let bucket = &mut self.buckets[b];
        let e = bucket.entries[i].take()?;
        // A bucket that still has an empty slot never sent a probe on past it, so the slot
        // can be empty again; in a bucket that filled up once, probes may go on past it.
        bucket.tags[i] = if bucket.tags.contains(&EMPTY) {
            EMPTY
        } else {
            self.gone += 1;
            GONE
        };
        self.live -= 1;
        self.bytes -= weight(&e);
        Some(e)
    }

    /// Makes room for one more entry: rebuilt without the gone slots, twice as large if the
    /// entries alone would pass half of it.
    fn make_room(&mut self) {
        let slots = self.buckets.len() * WAYS;
        if (self.live + self.gone + 1) * 4 <= slots * 3 {
            return;
        }
        let n = if (self.live + 1) * 2 > slots {
            self.buckets.len() * 2
        } else {
            self.buckets.len()
        };
        let old = std::mem::replace(&mut self.buckets, buckets(n));
        (self.live, self.gone, self.hand, self.bytes) = (0, 0, 0, 0);
        for bucket in old {
            for (t, e) in bucket.tags.into_iter().zip(bucket.entries) {
                if let Some(e) = e {
                    self.place(t, e);
                }
            }
        }
    }

    /// Evicts entries until the shard is within `budget`: each entry the hand finds marked
    /// used loses one mark and stays, until the hand has gone round often enough to bring
    /// every mark to zero; past that (hits on other threads may keep raising marks, without
    /// the lock) it evicts what it finds.
    fn evict(&mut self, budget: u64, leave: &mut impl FnMut(Arc<Entry>, Exit)) {
        let slots = self.buckets.len() * WAYS;
        let mut passes = slots * (usize::from(super::entry::MAX_USE) + 1);
        while self.bytes > budget && self.live > 0 {
            let (b, i) = (self.hand / WAYS, self.hand % WAYS);
            self.hand = (self.hand + 1) % slots;
            let stays = match &self.buckets[b].entries[i] {
                Some(e) => passes > 0 && e.pass_hand(),
                None => true,
            };
            passes = passes.saturating_sub(1);
            if !stays && let Some(e) = self.take(b, i) {
                leave(e, Exit::Evicted);
            }
        }
    }
}

/// Why an entry left the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Exit {
    /// Another entry of its key took its place.
    Replaced,
    /// Evicted to stay within the budget.
    Evicted,
}

/// One shard. `base` and `mask` are read by every prefetch and change only when the
/// buckets are replaced, so they have a cache line of their own: sharing one with the lock,
/// which every lookup writes, made each prefetch wait for that line (perf, Zipf GETs with
/// `hot_threshold = 1`: 26 ns per request).
#[repr(C, align(64))]
struct Shard {
    /// The bucket array and its mask, for [`Table::prefetch`] without the lock: either may be
    /// stale for a moment after a rebuild, and a prefetch of a stale address loads nothing
    /// the program reads.
    base: AtomicPtr<Bucket>,
    mask: AtomicUsize,
    locked: Locked,
}

#[repr(align(64))]
struct Locked {
    slots: RwLock<Slots>,
    /// [`Slots::live`] and [`Slots::bytes`], for reading without the lock.
    live: AtomicUsize,
    bytes: AtomicU64,
}

impl Shard {
    fn new() -> Shard {
        let shard = Shard {
            base: AtomicPtr::default(),
            mask: AtomicUsize::new(0),
            locked: Locked {
                slots: RwLock::new(Slots::new(MIN_BUCKETS)),
                live: AtomicUsize::new(0),
                bytes: AtomicU64::new(0),
            },
        };
        shard.publish(&shard.write());
        shard
    }

    // Nothing panics while a shard's lock is held but an allocation failure, which aborts;
    // a poisoned lock's slots are whole, so they are used as they are.
    fn read(&self) -> RwLockReadGuard<'_, Slots> {
        self.locked
            .slots
            .read()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, Slots> {
        self.locked
            .slots
            .write()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes what changed under the lock readable without it; the buckets' address only
    /// when they were replaced, so that their line stays shared.
    fn publish(&self, slots: &Slots) {
        let base = slots.buckets.as_ptr().cast_mut();
        if self.base.load(Ordering::Relaxed) != base {
            self.base.store(base, Ordering::Relaxed);
            self.mask.store(slots.mask(), Ordering::Relaxed);
        }
        self.locked.live.store(slots.live, Ordering::Relaxed);
        self.locked.bytes.store(slots.bytes, Ordering::Relaxed);
    }
}

/// Key → entry, within a byte budget. Every entry that leaves it (replaced, evicted, removed,
/// cleared) is handed to the caller's `leave`, under the shard's lock, before the call that
/// took it out returns.
pub(super) struct Table {
    shards: Box<[Shard]>,
    /// How far a hash is shifted to pick its shard (from its top bits; the bucket is picked
    /// by the low ones).
    shift: u32,
    /// Each shard's budget.
    shard_bytes: u64,
}

impl std::fmt::Debug for Table {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Table")
            .field("shards", &self.shards.len())
            .field("len", &self.len())
            .field("bytes", &self.bytes())
            .finish()
    }
}

impl Table {
    /// An empty table holding at most `max_bytes` of entries (as [`Entry::weight`] and their
    /// keys count them).
    pub(super) fn new(max_bytes: u64) -> Table {
        // A power of two, rounded down: every shard keeps at least MIN_SHARD_BYTES.
        let most = (max_bytes / MIN_SHARD_BYTES).clamp(1, MAX_SHARDS);
        let shards: u64 = 1 << most.ilog2();
        Table {
            shards: (0..shards).map(|_| Shard::new()).collect(),
            shift: 64 - shards.trailing_zeros(),
            shard_bytes: max_bytes / shards,
        }
    }

    fn shard(&self, hash: u64) -> &Shard {
        // `checked_shr`: with one shard the shift is 64, and every hash picks shard 0.
        let i = hash.checked_shr(self.shift).unwrap_or(0) as usize;
        &self.shards[i]
    }

    /// Asks the CPU to load the bucket where the probe of `hash` starts.
    pub(super) fn prefetch(&self, hash: u64) {
        let shard = self.shard(hash);
        let base = shard.base.load(Ordering::Relaxed);
        let b = hash as usize & shard.mask.load(Ordering::Relaxed);
        crate::prefetch::read_addr(base.wrapping_add(b));
    }

    /// Asks the CPU to load the entry whose tag is `hash`'s in the bucket its hash picks, if
    /// one is: nearly always the key's (a tag is 63 bits of the hash), and nearly every entry
    /// is in the first bucket of its probe.
    pub(super) fn prefetch_entry(&self, hash: u64) {
        let slots = self.shard(hash).read();
        let t = tag(hash);
        let bucket = &slots.buckets[hash as usize & slots.mask()];
        if let Some(i) = bucket.tags.iter().position(|&x| x == t)
            && let Some(e) = &bucket.entries[i]
        {
            e.prefetch_with_key();
        }
    }

    /// The entry of `key` (whose hash is `hash`), marked used.
    pub(super) fn get(&self, hash: u64, key: &[u8]) -> Option<Arc<Entry>> {
        let slots = self.shard(hash).read();
        let (b, i) = slots.find(hash, key)?;
        let e = slots.buckets[b].entries[i].clone()?;
        e.mark_used();
        Some(e)
    }

    /// Whether `key` has an entry.
    pub(super) fn contains(&self, hash: u64, key: &[u8]) -> bool {
        self.shard(hash).read().find(hash, key).is_some()
    }

    /// Holds `entry` for its key, in place of the key's entry if it had one (whose standing
    /// with the clock it keeps); evicts others to stay within the budget. An entry larger
    /// than a shard's budget is handed straight to `leave`, as evicted: placed, it would
    /// have taken the whole shard out before itself.
    pub(super) fn insert(
        &self,
        hash: u64,
        entry: Arc<Entry>,
        mut leave: impl FnMut(Arc<Entry>, Exit),
    ) {
        let shard = self.shard(hash);
        let mut slots = shard.write();
        if let Some((b, i)) = slots.find(hash, entry.key())
            && let Some(old) = slots.take(b, i)
        {
            entry.keep_use_of(&old);
            leave(old, Exit::Replaced);
        }
        if weight(&entry) > self.shard_bytes {
            leave(entry, Exit::Evicted);
            shard.publish(&slots);
            return;
        }
        slots.make_room();
        slots.place(tag(hash), entry);
        slots.evict(self.shard_bytes, &mut leave);
        shard.publish(&slots);
    }

    /// Removes the entry of `key` if `which` accepts it, and returns it.
    pub(super) fn remove_if(
        &self,
        hash: u64,
        key: &[u8],
        which: impl FnOnce(&Arc<Entry>) -> bool,
        leave: impl FnOnce(&Arc<Entry>),
    ) -> Option<Arc<Entry>> {
        let shard = self.shard(hash);
        let mut slots = shard.write();
        let (b, i) = slots.find(hash, key)?;
        if !slots.buckets[b].entries[i].as_ref().is_some_and(which) {
            return None;
        }
        let e = slots.take(b, i)?;
        leave(&e);
        shard.publish(&slots);
        Some(e)
    }

    /// Removes every entry, a shard's bucket array at a time; the caller lets go of them where
    /// it chooses (`drops.rs`): gone over under the lock, a settled store's held corral's
    /// thread for 8-9 ms (600,000 entries).
    pub(super) fn clear(&self) -> impl Iterator<Item = Arc<Entry>> + Send + use<> {
        let old: Vec<Box<[Bucket]>> = self
            .shards
            .iter()
            .map(|shard| {
                let mut slots = shard.write();
                let old = std::mem::replace(&mut *slots, Slots::new(MIN_BUCKETS));
                shard.publish(&slots);
                old.buckets
            })
            .collect();
        old.into_iter().flat_map(|buckets| {
            buckets
                .into_vec()
                .into_iter()
                .flat_map(|b| b.entries.into_iter().flatten())
        })
    }

    /// Removes every entry `keep` refuses, each handed to `leave`. `keep` runs with no lock
    /// held: the entries of [`RETAIN_BUCKETS`] buckets at a time are read under the shard's
    /// read lock, and each refused one is then removed under its write lock, if still there.
    /// Held across a whole shard (some 16,000 entries of short values at the default budget,
    /// each loaded, hashed and looked up in the sketch), the write lock stalled every lookup
    /// of that shard, and the worker thread making it. An entry a rebuild moved meanwhile may be passed over, and
    /// stays. Returns the entries taken out, for the caller to drop where it chooses (see
    /// `drops.rs`).
    pub(super) fn retain(
        &self,
        hash_of: impl Fn(&Entry) -> u64,
        mut keep: impl FnMut(u64) -> bool,
        mut leave: impl FnMut(u64, &Arc<Entry>),
    ) -> Vec<Arc<Entry>> {
        let mut taken = Vec::new();
        let mut seen = Vec::with_capacity(RETAIN_BUCKETS * WAYS);
        for shard in &self.shards {
            let mut next = 0;
            loop {
                {
                    let slots = shard.read();
                    let end = (next + RETAIN_BUCKETS).min(slots.buckets.len());
                    let Some(chunk) = slots.buckets.get(next..end).filter(|c| !c.is_empty()) else {
                        break;
                    };
                    seen.extend(
                        chunk
                            .iter()
                            .flat_map(|b| b.entries.iter().flatten().cloned()),
                    );
                    next = end;
                }
                for e in seen.drain(..) {
                    let hash = hash_of(&e);
                    if !keep(hash) {
                        taken.extend(self.remove_if(
                            hash,
                            e.key(),
                            |x| Arc::ptr_eq(x, &e),
                            |x| leave(hash, x),
                        ));
                    }
                }
            }
        }
        taken
    }

    /// The entries of about `buckets` buckets spread over the table, taken under each shard's
    /// read lock, to be looked at with none held.
    pub(super) fn sample(&self, buckets: usize) -> Vec<Arc<Entry>> {
        let (per, mut out) = (buckets.div_ceil(self.shards.len()), Vec::new());
        for shard in &self.shards {
            let slots = shard.read();
            // Odd: the buckets' indices, which are the keys' hashes' low bits, take every value.
            let step = (slots.buckets.len() / per).max(1) | 1;
            let taken = slots.buckets.iter().step_by(step);
            out.extend(taken.flat_map(|b| b.entries.iter().flatten().cloned()));
        }
        out
    }

    /// Entries held.
    pub(super) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.locked.live.load(Ordering::Relaxed))
            .sum()
    }

    /// Bytes charged for the entries held.
    pub(super) fn bytes(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.locked.bytes.load(Ordering::Relaxed))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::cache::value::Value;

    fn entry(key: &[u8]) -> Arc<Entry> {
        Entry::new(
            key,
            Value::bulk(b"v"),
            Instant::now() + Duration::from_secs(60),
            Duration::ZERO,
            Duration::ZERO,
        )
    }

    /// A hash that sends every key to the same shard and bucket: probes and removals are
    /// exercised across buckets.
    fn same(_key: &[u8]) -> u64 {
        7
    }

    fn spread(key: &[u8]) -> u64 {
        use std::hash::BuildHasher;
        foldhash::fast::FixedState::with_seed(1).hash_one(key)
    }

    fn ignore(_: Arc<Entry>, _: Exit) {}

    #[test]
    fn retain_keeps_only_what_it_is_told_and_hands_over_the_rest() {
        // Over many chunks of buckets.
        let t = Table::new(1 << 20);
        let keys: Vec<Vec<u8>> = (0..1000).map(|i| format!("k{i}").into_bytes()).collect();
        for k in &keys {
            t.insert(spread(k), entry(k), ignore);
        }
        let kept: HashSet<u64> = keys
            .iter()
            .filter(|k| k.ends_with(b"7"))
            .map(|k| spread(k))
            .collect();
        let mut left = Vec::new();
        t.retain(
            |e| spread(e.key()),
            |h| kept.contains(&h),
            |h, e| left.push((h, e.key().to_vec())),
        );
        assert_eq!((t.len(), left.len()), (100, 900));
        assert!(
            left.iter()
                .all(|(h, k)| *h == spread(k) && !k.ends_with(b"7"))
        );
        assert_eq!(
            left.iter().map(|(_, k)| k).collect::<HashSet<_>>().len(),
            900
        );
        for k in &keys {
            assert_eq!(t.get(spread(k), k).is_some(), k.ends_with(b"7"));
        }
        // All on one probe, which runs over chunk boundaries: kept whole, or all gone.
        let t = Table::new(1 << 20);
        for k in &keys {
            t.insert(same(k), entry(k), ignore);
        }
        t.retain(|e| same(e.key()), |_| true, |_, _| panic!("kept"));
        assert_eq!(t.len(), 1000);
        let mut left = HashSet::new();
        t.retain(
            |e| same(e.key()),
            |_| false,
            |_, e| {
                left.insert(e.key().to_vec());
            },
        );
        assert_eq!((t.len(), left.len()), (0, 1000));
    }

    #[test]
    fn retain_beside_inserts_and_removals_hands_over_each_entry_once() {
        let t = Arc::new(Table::new(1 << 20));
        let keys: Vec<Vec<u8>> = (0..2000).map(|i| format!("k{i}").into_bytes()).collect();
        for k in &keys {
            t.insert(spread(k), entry(k), ignore);
        }
        let writer = {
            let (t, keys) = (t.clone(), keys.clone());
            std::thread::spawn(move || {
                for round in 0..5 {
                    for (i, k) in keys.iter().enumerate() {
                        if (i + round) % 3 == 0 {
                            t.remove_if(spread(k), k, |_| true, |_| {});
                        } else {
                            t.insert(spread(k), entry(k), ignore);
                        }
                    }
                }
            })
        };
        // Held, so that no entry made meanwhile takes the address of one handed over.
        let mut left: Vec<Arc<Entry>> = Vec::new();
        for _ in 0..20 {
            t.retain(
                |e| spread(e.key()),
                |h| h.is_multiple_of(2),
                |_, e| left.push(e.clone()),
            );
        }
        assert!(writer.join().is_ok());
        let once: HashSet<_> = left.iter().map(Arc::as_ptr).collect();
        assert_eq!(once.len(), left.len(), "an entry handed over twice");
        // What a last sweep leaves is only what it keeps, and the count agrees.
        t.retain(|e| spread(e.key()), |h| h.is_multiple_of(2), |_, _| {});
        let held = keys
            .iter()
            .filter(|k| t.get(spread(k), k).is_some())
            .count();
        assert_eq!(held, t.len());
        assert!(
            keys.iter()
                .all(|k| t.get(spread(k), k).is_none() || spread(k).is_multiple_of(2))
        );
    }

    #[test]
    fn keys_sharing_a_bucket_are_found_removed_and_replaced_each_on_its_own() {
        for hash in [same as fn(&[u8]) -> u64, spread] {
            let t = Table::new(64 << 20);
            let keys: Vec<Vec<u8>> = (0..200).map(|i| format!("k{i}").into_bytes()).collect();
            for k in &keys {
                t.insert(hash(k), entry(k), ignore);
            }
            assert_eq!(t.len(), 200);
            // Remove every third: the others are still found, past the gone slots.
            for k in keys.iter().step_by(3) {
                assert!(t.remove_if(hash(k), k, |_| true, |_| {}).is_some());
            }
            for (n, k) in keys.iter().enumerate() {
                assert_eq!(t.get(hash(k), k).is_some(), n % 3 != 0, "{n}");
            }
            // Replacing takes the old entry out, handed to `leave`.
            let mut left = Vec::new();
            let fresh = entry(&keys[1]);
            t.insert(hash(&keys[1]), fresh.clone(), |e, why| left.push((e, why)));
            assert_eq!(left.len(), 1);
            assert_eq!(left[0].1, Exit::Replaced);
            assert!(!Arc::ptr_eq(&left[0].0, &fresh));
            assert!(Arc::ptr_eq(
                &t.get(hash(&keys[1]), &keys[1]).unwrap(),
                &fresh
            ));
            // Inserting again reuses gone slots; the table stays consistent.
            for k in keys.iter().step_by(3) {
                t.insert(hash(k), entry(k), ignore);
            }
            assert_eq!(t.len(), 200);
            assert!(keys.iter().all(|k| t.contains(hash(k), k)));
            assert!(!t.contains(hash(b"other"), b"other"));
        }
    }

    #[test]
    fn remove_if_leaves_an_entry_it_does_not_accept() {
        let t = Table::new(1 << 20);
        let e = entry(b"k");
        t.insert(spread(b"k"), e.clone(), ignore);
        assert!(t.remove_if(spread(b"k"), b"k", |_| false, |_| {}).is_none());
        assert!(t.contains(spread(b"k"), b"k"));
        let got = t.remove_if(spread(b"k"), b"k", |x| Arc::ptr_eq(x, &e), |_| {});
        assert!(got.is_some());
        assert_eq!((t.len(), t.bytes()), (0, 0));
    }

    #[test]
    fn the_budget_holds_and_used_entries_outlast_unused_ones() {
        let budget = 1 << 20;
        let t = Table::new(budget);
        let per = weight(&entry(b"hot:00"));
        let fits = (budget / per) as usize;
        // A few keys read on and on while many others are inserted once each.
        let hot: Vec<Vec<u8>> = (0..10)
            .map(|i| format!("hot:{i:02}").into_bytes())
            .collect();
        let mut evicted = 0;
        for k in &hot {
            t.insert(spread(k), entry(k), ignore);
        }
        for i in 0..fits * 4 {
            for k in &hot {
                assert!(t.get(spread(k), k).is_some(), "hot key evicted at {i}");
            }
            let k = format!("cold:{i:06}").into_bytes();
            t.insert(spread(&k), entry(&k), |_, why| {
                assert_eq!(why, Exit::Evicted);
                evicted += 1;
            });
            assert!(t.bytes() <= budget, "{}", t.bytes());
        }
        assert!(evicted >= fits * 3, "{evicted}");
    }

    #[test]
    fn an_entry_larger_than_a_shard_is_not_kept() {
        let t = Table::new(1 << 10);
        let mut left = Vec::new();
        let big = Entry::new(
            b"big",
            Value::bulk(&[7; 4096]),
            Instant::now() + Duration::from_secs(60),
            Duration::ZERO,
            Duration::ZERO,
        );
        t.insert(spread(b"small"), entry(b"small"), ignore);
        t.insert(spread(b"big"), big, |e, why| left.push((e, why)));
        assert_eq!(left.len(), 1);
        assert_eq!(left[0].1, Exit::Evicted);
        assert_eq!(left[0].0.key(), b"big");
        assert!(t.contains(spread(b"small"), b"small"), "the others stay");
        assert_eq!(t.len(), 1);
    }

    #[test]
    fn every_shard_has_at_least_its_minimum_budget() {
        for mb in [1u64, 4, 12, 20, 36, 100, 256, 1024] {
            let t = Table::new(mb << 20);
            assert!(t.shards.len().is_power_of_two());
            assert!(t.shards.len() as u64 <= MAX_SHARDS);
            assert!(
                t.shard_bytes >= MIN_SHARD_BYTES || t.shards.len() == 1,
                "{mb} MiB: {} shards",
                t.shards.len()
            );
            assert!(t.shard_bytes * t.shards.len() as u64 <= mb << 20);
        }
    }

    #[test]
    fn a_replaced_entry_passes_its_standing_on() {
        let t = Table::new(1 << 20);
        let old = entry(b"k");
        for _ in 0..5 {
            old.mark_used();
        }
        t.insert(spread(b"k"), old, ignore);
        let new = entry(b"k");
        t.insert(spread(b"k"), new.clone(), ignore);
        // Three passes of the hand: the new entry stays for each, as the old one would have.
        for _ in 0..3 {
            assert!(new.pass_hand());
        }
        assert!(!new.pass_hand());
    }

    #[test]
    fn clear_hands_every_entry_over_and_the_table_starts_again() {
        let t = Table::new(64 << 20);
        for i in 0..5000 {
            let k = format!("k{i}").into_bytes();
            t.insert(spread(&k), entry(&k), ignore);
        }
        let taken = t.clear();
        assert_eq!(
            (t.len(), t.bytes()),
            (0, 0),
            "emptied before it is gone over"
        );
        assert_eq!(taken.count(), 5000);
        assert_eq!((t.len(), t.bytes()), (0, 0));
        t.insert(spread(b"k1"), entry(b"k1"), ignore);
        assert!(t.contains(spread(b"k1"), b"k1"));
    }

    #[test]
    fn threads_inserting_reading_and_removing_keep_every_count() {
        use std::sync::atomic::AtomicIsize;
        let budget = 256 << 10;
        let t = Table::new(budget);
        // Entries in the table = inserted - left; checked against the table's own count.
        let held = AtomicIsize::new(0);
        std::thread::scope(|scope| {
            for thread in 0..4u64 {
                let (t, held) = (&t, &held);
                scope.spawn(move || {
                    for i in 0..20_000u64 {
                        let k = format!("k{}", (i * 7 + thread * 13) % 3000).into_bytes();
                        let h = spread(&k);
                        match i % 4 {
                            0 | 1 => {
                                held.fetch_add(1, Ordering::Relaxed);
                                t.insert(h, entry(&k), |_, _| {
                                    held.fetch_sub(1, Ordering::Relaxed);
                                });
                            }
                            2 => {
                                if let Some(e) = t.get(h, &k) {
                                    assert_eq!(e.key(), &k[..]);
                                }
                            }
                            _ => {
                                t.remove_if(
                                    h,
                                    &k,
                                    |_| true,
                                    |_| {
                                        held.fetch_sub(1, Ordering::Relaxed);
                                    },
                                );
                            }
                        }
                    }
                });
            }
        });
        assert_eq!(held.load(Ordering::Relaxed), t.len() as isize);
        assert!(t.bytes() <= budget);
        assert_eq!(
            t.clear().count(),
            usize::try_from(held.load(Ordering::Relaxed)).unwrap_or(0)
        );
    }
}
