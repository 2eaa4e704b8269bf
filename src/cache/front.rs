//! A per-thread memo of the store's recent hits, in front of it: a table of slots in sets of
//! two, the set picked by the key's hash, each slot holding a key and its entry.
//!
//! Why: a hit in the store reads its shard's lock, a bucket, and the entry; measured when the
//! store was a `quick_cache` map (its table, its slab entry, the entry: three cache misses on
//! a large store), 81-123 ns per request at pipeline depth 16 (perf, Zipfian GETs over a
//! million keys, about 0.6 of them hits). A front slot's address follows from
//! the hash alone, so a round prefetches its GETs' slots with their sketch blocks and a hit
//! then reads its slot from the CPU's cache and the entry itself.
//!
//! Coherence: a slot is filled only from a store hit, and serves its entry only while the
//! entry is live; the store marks an entry dead when it leaves it for any reason (removed,
//! replaced, evicted, cleared, expired) before that removal returns. A front hit that saw
//! the flag set came before the removal returned, as a store hit would have.
//!
//! Size: a thread's front starts with [`MIN_SLOTS`] and grows (empty again) to the size the
//! store asks for, twice its entries rounded up to a power of two, and shrinks (empty again)
//! when a sweep or a clear left the store a quarter of that or less ([`fit`]): with a fixed
//! 16,384 direct-mapped slots and 100,000 entries read uniformly, most hits missed the front
//! and paid `quick_cache`'s misses (37% of corral's time in perf, 0.89 µs per request; with
//! 131,072 slots in sets of two, 0.58-0.61 µs).
//!
//! Bounds: a slot may still hold an entry that left the store until another store hit that
//! maps to the slot replaces it. Only entries of values up to [`MAX_VALUE`] bytes and keys up
//! to [`INLINE`] bytes go in, so what a front holds outside the store's budget is at most its
//! slots × ([`PIN_BYTES`]); the store caps the slots it asks for so that this stays within
//! 3/8 of its budget per worker thread (see [`max_slots`]).

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use super::entry::Entry;
use super::short_key::{INLINE, ShortKey};
use crate::huge::HugeSlice;

/// Slots a thread's front starts with (a power of two): 64 bytes each, 1 MiB. With 8,192,
/// on Zipf GETs over 1M keys (about 6,600 entries) one hit in 14 missed the front for a slot
/// another key held.
pub(super) const MIN_SLOTS: usize = 16384;
/// Largest value whose entry goes in a slot.
pub(super) const MAX_VALUE: usize = 512;
/// The most memory one slot may keep outside the store's budget: the slot and an entry that
/// left the store (its allocation, with a value of up to [`MAX_VALUE`] outside it).
pub(super) const PIN_BYTES: u64 = 64 + 192 + MAX_VALUE as u64;

/// The most slots a front of a store of `max_bytes` grows to: a power of two, whose slots may
/// keep up to 3/8 of `max_bytes` (256 MiB: 131,072 slots, 8 MiB of them).
pub(super) fn max_slots(max_bytes: u64) -> usize {
    let most = usize::try_from(max_bytes / 8 * 3 / PIN_BYTES).unwrap_or(usize::MAX);
    // The largest power of two not above `most`, and never below the starting size.
    let pow = most.checked_next_power_of_two().unwrap_or(1 << 30);
    let pow = if pow > most { pow / 2 } else { pow };
    pow.clamp(MIN_SLOTS, 1 << 24)
}

/// The slots a front should have for a store of `entries` (at most `max`).
pub(super) fn slots_for(entries: usize, max: usize) -> usize {
    entries
        .saturating_mul(2)
        .checked_next_power_of_two()
        .unwrap_or(max)
        .clamp(MIN_SLOTS, max.max(MIN_SLOTS))
}

static OWNERS: AtomicU32 = AtomicU32::new(1);

/// A number naming one store among the process's: slots of another store are misses.
pub(super) fn new_owner() -> u32 {
    OWNERS.fetch_add(1, Ordering::Relaxed)
}

#[derive(Default)]
#[repr(align(64))]
struct Slot {
    owner: u32,
    /// What a store hit of another key must be read as often as (its sketch estimate) to
    /// take the slot: the holder's estimate at its last hit, less one for each key turned
    /// away since.
    bar: u8,
    hash: u64,
    /// The entry holds its key too, at its end: kept here as well, a hit compares the key in
    /// the slot's own line, and loads of the entry stop before its key.
    key: Option<ShortKey>,
    entry: Option<Arc<Entry>>,
}

thread_local! {
    /// Allocated at the thread's first lookup: threads that never serve a GET pay nothing.
    static FRONT: RefCell<Option<HugeSlice<Slot>>> = const { RefCell::new(None) };
}

/// Slots a key may take: the key's hash picks a set of this many neighbouring slots. With
/// one (direct-mapped), 100,000 entries read uniformly through 131,072 slots cost 0.66 µs
/// per request; with two, 0.58-0.61 (steady state, consecutive runs).
const WAYS: usize = 2;

/// Where the set of `hash` starts among `len` slots (a power of two).
fn set_start(len: usize, hash: u64) -> usize {
    (hash as usize & (len / WAYS - 1)) * WAYS
}

/// The set of slots of `hash` in `slots`.
fn set(slots: &[Slot], hash: u64) -> &[Slot] {
    let first = set_start(slots.len(), hash);
    &slots[first..first + WAYS]
}

fn set_mut(slots: &mut [Slot], hash: u64) -> &mut [Slot] {
    let first = set_start(slots.len(), hash);
    &mut slots[first..first + WAYS]
}

impl Slot {
    /// Whether it holds `key` (whose hash is `hash`) for store `owner`.
    fn holds(&self, owner: u32, hash: u64, key: &[u8]) -> bool {
        self.owner == owner
            && self.hash == hash
            && self.key.as_ref().is_some_and(|k| k.bytes() == key)
    }

    /// Whether it holds an entry of store `owner`: one that a colder key must not take at
    /// once. Whether the entry is still live is not looked at: that read the holder's entry,
    /// a cache miss on nearly every store hit put here (perf, Zipf GETs -P 16 over 1M keys:
    /// 60% of `Store::get`'s time). A holder that left the store is replaced when its key is
    /// read again (the slot holds the key), or loses the slot like any holder no longer read.
    fn taken(&self, owner: u32) -> bool {
        self.owner == owner && self.entry.is_some()
    }
}

/// Asks the CPU to load the slots of the key with this hash.
pub(super) fn prefetch(hash: u64) {
    FRONT.with(|f| {
        if let Ok(f) = f.try_borrow()
            && let Some(slots) = f.as_ref()
        {
            for slot in set(slots, hash) {
                crate::prefetch::read(slot);
            }
        }
    });
}

/// Asks the CPU to load the entry in this thread's front for `hash`, once the slots
/// themselves are at hand (after [`prefetch`]), if a slot is the key's: a cold key's slots
/// hold other keys' entries, not worth loading.
/// Returns whether a slot was the key's.
pub(super) fn prefetch_entry(hash: u64) -> bool {
    FRONT.with(|f| {
        if let Ok(f) = f.try_borrow()
            && let Some(slots) = f.as_ref()
            && let Some(slot) = set(slots, hash).iter().find(|s| s.hash == hash)
            && let Some(e) = &slot.entry
        {
            e.prefetch();
            return true;
        }
        false
    })
}

/// Hands `f` the live entry of `key` in this thread's front, if a slot of `hash` holds it
/// for `owner`: what `f` returns, `None` if no slot does. `reads`, the key's read estimate
/// when it was counted, becomes the slot's standing (see [`put`]), which `None` leaves as it
/// is.
#[inline]
pub(super) fn with_entry<R>(
    owner: u32,
    hash: u64,
    key: &[u8],
    reads: Option<u8>,
    f: impl FnOnce(&Arc<Entry>) -> Option<R>,
) -> Option<R> {
    FRONT.with(|front| {
        let mut front = front.try_borrow_mut().ok()?;
        let slot = set_mut(front.as_mut()?, hash)
            .iter_mut()
            .find(|s| s.holds(owner, hash, key))?;
        let entry = slot.entry.as_ref()?;
        if !entry.live() {
            return None;
        }
        if let Some(reads) = reads {
            slot.bar = reads;
        }
        f(entry)
    })
}

/// The live entry of `key` in this thread's front (see [`with_entry`]).
#[cfg(test)]
fn get(owner: u32, hash: u64, key: &[u8], reads: Option<u8>) -> Option<Arc<Entry>> {
    with_entry(owner, hash, key, reads, |e| Some(e.clone()))
}

/// Lets go of this thread's front if it has more than `size` slots: the next [`put`] starts
/// one of `size`. A store that shrank asks for fewer slots; a thread whose hits stopped would
/// otherwise keep its front, and the entries that left the store in it, at its largest.
pub(super) fn fit(size: usize) {
    let old = FRONT.with(|f| {
        let mut f = f.try_borrow_mut().ok()?;
        if f.as_ref().is_some_and(|s| s.len() > size.max(WAYS)) {
            f.take()
        } else {
            None
        }
    });
    if let Some(old) = old {
        retire(old);
    }
}

/// Drops a front let go of a step at a time (`drops.rs`): each of its slots may hold the
/// last reference to an entry, so dropping one of 131,072 slots walks that many lines and may
/// free as many entries, which a worker thread's clients would wait for. The slots' memory
/// goes with the last step.
fn retire(mut old: HugeSlice<Slot>) {
    let slots = 0..old.len();
    super::drops::in_steps(slots, move |i| drop(old[i].entry.take()));
}

/// Puts a store hit in this thread's front for `hash`: in the slot of its set that holds the
/// key, else one that holds no live entry, else the one whose holder is read least often,
/// unless that holder is read more often than the key (see [`Slot::bar`]): `reads` is the
/// key's read estimate. Keys too long or values too large stay out. With more entries than
/// slots, a hot key's slot would otherwise go to each colder key that maps there, and its
/// next hit would read the store again; a holder that stopped being read loses the slot
/// after a few keys turned away. A front of other than `size` slots (a power of two) is
/// first replaced by an empty one of that size: larger as the store grows, smaller once a
/// sweep or a clear shrank it. (A process has one store: two of different sizes read on one
/// thread would take turns emptying its front, which only unit tests do.)
pub(super) fn put(owner: u32, hash: u64, key: &[u8], entry: &Arc<Entry>, reads: u8, size: usize) {
    if key.len() > INLINE || entry.size() > MAX_VALUE {
        return;
    }
    FRONT.with(|f| {
        let Ok(mut f) = f.try_borrow_mut() else {
            return;
        };
        let size = size.max(WAYS);
        if f.as_ref().is_none_or(|s| s.len() != size) {
            let old = f.replace(HugeSlice::new(size, Slot::default));
            if let Some(old) = old {
                retire(old);
            }
        }
        let Some(slots) = f.as_mut() else {
            return;
        };
        let set = set_mut(slots, hash);
        let at = match set.iter().position(|s| s.holds(owner, hash, key)) {
            Some(i) => i,
            None => match set.iter().position(|s| !s.taken(owner)) {
                Some(i) => i,
                None => {
                    let i = (0..WAYS).min_by_key(|&i| set[i].bar).unwrap_or(0);
                    if set[i].bar > reads {
                        set[i].bar -= 1;
                        return;
                    }
                    i
                }
            },
        };
        set[at] = Slot {
            owner,
            bar: reads,
            hash,
            key: Some(ShortKey::new(key)),
            entry: Some(entry.clone()),
        };
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sets in a front of `MIN_SLOTS`: hashes this far apart share a set.
    const SETS: u64 = (MIN_SLOTS / WAYS) as u64;

    #[test]
    fn a_slot_serves_only_its_own_key_of_its_own_store_while_live() {
        let (a, b) = (new_owner(), new_owner());
        let e = Entry::of(b"v");
        put(a, 7, b"k", &e, 0, MIN_SLOTS);
        assert!(get(a, 7, b"k", Some(0)).is_some_and(|h| Arc::ptr_eq(&h, &e)));
        assert!(get(b, 7, b"k", Some(0)).is_none(), "another store's slot");
        assert!(get(a, 7, b"j", Some(0)).is_none(), "another key, same hash");
        assert!(
            get(a, 7 + MIN_SLOTS as u64, b"k", Some(0)).is_none(),
            "another hash, same slot"
        );
        e.retire();
        assert!(
            get(a, 7, b"k", Some(0)).is_none(),
            "an entry that left the store"
        );
    }

    #[test]
    fn a_key_read_less_often_takes_a_live_slot_only_after_others_were_turned_away() {
        let owner = new_owner();
        let (hot, warm, cold) = (Entry::of(b"h"), Entry::of(b"w"), Entry::of(b"c"));
        // Three hashes of one set: the hot and the warm key fill its two slots.
        let (h, w, other) = (21, 21 + SETS, 21 + 2 * SETS);
        put(owner, h, b"hot", &hot, 9, MIN_SLOTS);
        put(owner, w, b"warm", &warm, 8, MIN_SLOTS);
        // Turned away while the least read holder's bar (8, less one per key turned away)
        // is higher.
        for _ in 0..2 {
            put(owner, other, b"cold", &cold, 6, MIN_SLOTS);
            assert!(get(owner, other, b"cold", Some(6)).is_none());
        }
        // A hit of the holder raises its bar again.
        assert!(get(owner, w, b"warm", Some(8)).is_some());
        for _ in 0..2 {
            put(owner, other, b"cold", &cold, 6, MIN_SLOTS);
        }
        put(owner, other, b"cold", &cold, 6, MIN_SLOTS);
        assert!(
            get(owner, other, b"cold", Some(6)).is_some(),
            "the bar fell to 6"
        );
        assert!(
            get(owner, w, b"warm", Some(8)).is_none(),
            "the warm key's slot went"
        );
        assert!(
            get(owner, h, b"hot", Some(9)).is_some(),
            "the hot key kept its own"
        );
        // A holder that left the store is not served, and keeps its slot as a live one
        // does: until its key's next entry takes it, or its bar falls.
        put(owner, w, b"warm", &warm, 15, MIN_SLOTS);
        put(owner, h, b"hot", &hot, 15, MIN_SLOTS);
        hot.retire();
        assert!(get(owner, h, b"hot", Some(15)).is_none(), "a dead entry");
        put(owner, other, b"cold", &cold, 0, MIN_SLOTS);
        assert!(get(owner, other, b"cold", Some(0)).is_none(), "turned away");
        let refilled = Entry::of(b"h2");
        put(owner, h, b"hot", &refilled, 15, MIN_SLOTS);
        assert!(get(owner, h, b"hot", Some(15)).is_some_and(|e| Arc::ptr_eq(&e, &refilled)));
        assert!(get(owner, w, b"warm", Some(15)).is_some());
    }

    #[test]
    fn long_keys_and_large_values_stay_out() {
        let owner = new_owner();
        put(
            owner,
            11,
            &[b'k'; INLINE + 1],
            &Entry::of(b"v"),
            0,
            MIN_SLOTS,
        );
        assert!(get(owner, 11, &[b'k'; INLINE + 1], Some(0)).is_none());
        put(
            owner,
            12,
            b"k",
            &Entry::of(&[b'v'; MAX_VALUE + 1]),
            0,
            MIN_SLOTS,
        );
        assert!(get(owner, 12, b"k", Some(0)).is_none());
        put(
            owner,
            13,
            b"k",
            &Entry::of(&[b'v'; MAX_VALUE]),
            0,
            MIN_SLOTS,
        );
        assert!(get(owner, 13, b"k", Some(0)).is_some());
    }

    #[test]
    fn a_front_takes_the_size_asked_for_and_then_serves_from_it() {
        let owner = new_owner();
        let e = Entry::of(b"v");
        // Three hashes sharing a set among MIN_SLOTS, not among twice as many.
        let (a, b, c) = (5, 5 + SETS, 5 + 2 * SETS);
        put(owner, a, b"a", &e, 0, MIN_SLOTS);
        put(owner, b, b"b", &e, 0, MIN_SLOTS);
        put(owner, c, b"c", &e, 0, MIN_SLOTS);
        let held = [(a, b"a"), (b, b"b"), (c, b"c")];
        let served = |owner| {
            held.iter()
                .filter(|(h, k)| get(owner, *h, *k, Some(0)).is_some())
                .count()
        };
        assert_eq!(served(owner), 2, "one of the three lost its slot");
        for (h, k) in held {
            put(owner, h, k, &e, 0, MIN_SLOTS * 2);
        }
        assert_eq!(served(owner), 3);
        // A smaller size asked for later starts a smaller front, empty but for the put.
        put(owner, a, b"a", &e, 0, MIN_SLOTS);
        assert_eq!(served(owner), 1);
        // Fitted to a size it is within, it stays; to a smaller one, it is let go of.
        fit(MIN_SLOTS);
        assert_eq!(served(owner), 1);
        fit(MIN_SLOTS / 2);
        assert_eq!(served(owner), 0);
        assert!(FRONT.with(|f| f.borrow().is_none()));
    }

    #[test]
    fn fronts_grow_with_the_store_within_their_cap() {
        assert_eq!(slots_for(0, 1 << 20), MIN_SLOTS);
        assert_eq!(slots_for(100_000, 1 << 20), 262_144);
        assert_eq!(slots_for(100_000, 131_072), 131_072);
        assert_eq!(slots_for(usize::MAX, 131_072), 131_072);
        assert_eq!(max_slots(256 << 20), 131_072);
        assert_eq!(max_slots(1 << 20), MIN_SLOTS, "never below the start");
        assert!(max_slots(u64::MAX).is_power_of_two(), "no overflow");
        for mb in [1u64, 64, 256, 1000, 100_000] {
            let n = max_slots(mb << 20);
            assert!(n.is_power_of_two());
            assert!(n == MIN_SLOTS || n as u64 * PIN_BYTES <= (mb << 20) * 3 / 8);
        }
    }

    #[test]
    fn a_slot_is_one_cache_line() {
        assert_eq!(std::mem::size_of::<Slot>(), 64);
    }
}
