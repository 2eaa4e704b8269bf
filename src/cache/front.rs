//! A per-thread memo of the store's recent hits, in front of it: a direct-mapped table of
//! slots indexed by the key's hash, each holding a key and its entry.
//!
//! Why: a hit in the store follows three dependent pointers (`quick_cache`'s table, its slab
//! entry, the entry), on a large store three cache misses: 81-123 ns per request at
//! pipeline depth 16 (perf, Zipfian GETs over a million keys, about 0.6 of them hits). A front slot's address follows from
//! the hash alone, so a round prefetches its GETs' slots with their sketch blocks and a hit
//! then reads its slot from the CPU's cache and the entry itself.
//!
//! Coherence: a slot is filled only from a store hit, and serves its entry only while the
//! entry is live; the store marks an entry dead when it leaves it for any reason (removed,
//! replaced, evicted, cleared, expired) before that removal returns. A front hit that saw
//! the flag set came before the removal returned, as a store hit would have.
//!
//! Bounds: a slot may still hold an entry that left the store until another store hit that
//! maps to the slot replaces it. Only entries of values up to [`MAX_VALUE`] bytes and keys up
//! to [`INLINE`] bytes go in, so what slots hold outside the store's budget is at most
//! [`SLOTS`] × (`MAX_VALUE` + an entry's overhead), about 12 MB per worker thread, besides
//! the 1 MiB of slots themselves.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use super::entry::Entry;
use super::short_key::{INLINE, ShortKey};

/// Slots per thread (a power of two): 64 bytes each, 1 MiB. With 8,192, on Zipf GETs over
/// 1M keys (about 6,600 entries) one hit in 14 missed the front for a slot another key held.
pub(super) const SLOTS: usize = 16384;
/// Largest value whose entry goes in a slot.
pub(super) const MAX_VALUE: usize = 512;
/// Every this many hits through a slot, the lookup also reads the store, so that its
/// eviction policy still sees the key in use (once the store is over half full: see
/// `Store::filling`).
pub(super) const TOUCH_EVERY: u16 = 32;

static OWNERS: AtomicU32 = AtomicU32::new(1);

/// A number naming one store among the process's: slots of another store are misses.
pub(super) fn new_owner() -> u32 {
    OWNERS.fetch_add(1, Ordering::Relaxed)
}

#[derive(Default)]
#[repr(align(64))]
struct Slot {
    owner: u32,
    hits: u16,
    /// What a store hit of another key must be read as often as (its sketch estimate) to
    /// take the slot: the holder's estimate at its last hit, less one for each key turned
    /// away since.
    bar: u8,
    hash: u64,
    key: Option<ShortKey>,
    entry: Option<Arc<Entry>>,
}

thread_local! {
    /// Allocated at the thread's first lookup: threads that never serve a GET pay nothing.
    static FRONT: RefCell<Option<Box<[Slot]>>> = const { RefCell::new(None) };
}

fn index(hash: u64) -> usize {
    hash as usize & (SLOTS - 1)
}

/// A hit through the front.
pub(super) struct Hit {
    pub(super) entry: Arc<Entry>,
    /// The store should be read too (see [`TOUCH_EVERY`]).
    pub(super) touch: bool,
}

/// Asks the CPU to load the slot of the key with this hash.
pub(super) fn prefetch(hash: u64) {
    FRONT.with(|f| {
        if let Ok(f) = f.try_borrow()
            && let Some(slots) = f.as_ref()
        {
            crate::prefetch::read(&slots[index(hash)]);
        }
    });
}

/// Asks the CPU to load the entry in this thread's slot for `hash`, once the slot itself is
/// at hand (after [`prefetch`]), if the slot is the key's: a cold key's slot holds another
/// key's entry, not worth loading.
pub(super) fn prefetch_entry(hash: u64) {
    FRONT.with(|f| {
        if let Ok(f) = f.try_borrow()
            && let Some(slot) = f.as_ref().and_then(|s| s.get(index(hash)))
            && slot.hash == hash
            && let Some(e) = &slot.entry
        {
            e.prefetch();
        }
    });
}

/// The live entry of `key` in this thread's slot for `hash`, if the slot holds it for `owner`;
/// `reads` is the key's read estimate (see [`put`]).
pub(super) fn get(owner: u32, hash: u64, key: &[u8], reads: u8) -> Option<Hit> {
    FRONT.with(|f| {
        let mut f = f.try_borrow_mut().ok()?;
        let slot = f.as_mut()?.get_mut(index(hash))?;
        if slot.owner != owner || slot.hash != hash {
            return None;
        }
        let entry = slot.entry.as_ref()?;
        if slot.key.as_ref()?.bytes() != key || !entry.live() {
            return None;
        }
        slot.hits = slot.hits.wrapping_add(1);
        slot.bar = reads;
        Some(Hit {
            entry: entry.clone(),
            touch: slot.hits.is_multiple_of(TOUCH_EVERY),
        })
    })
}

/// Puts a store hit in this thread's slot for `hash`, unless its key or value is too long,
/// or the slot holds a live entry of a key read more often (see [`Slot::bar`]): `reads` is
/// the key's read estimate. With more entries than slots, a hot key's slot would otherwise
/// go to each colder key that maps there, and its next hit would read the store again; a
/// holder that stopped being read loses the slot after a few keys turned away.
pub(super) fn put(owner: u32, hash: u64, key: &[u8], entry: &Arc<Entry>, reads: u8) {
    if key.len() > INLINE || entry.size() > MAX_VALUE {
        return;
    }
    FRONT.with(|f| {
        let Ok(mut f) = f.try_borrow_mut() else {
            return;
        };
        let slots = f.get_or_insert_with(|| (0..SLOTS).map(|_| Slot::default()).collect());
        if let Some(slot) = slots.get_mut(index(hash)) {
            if slot.owner == owner
                && slot.bar > reads
                && slot.entry.as_ref().is_some_and(|e| e.live())
            {
                slot.bar -= 1;
                return;
            }
            *slot = Slot {
                owner,
                hits: 0,
                bar: reads,
                hash,
                key: Some(ShortKey::new(key)),
                entry: Some(entry.clone()),
            };
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_serves_only_its_own_key_of_its_own_store_while_live() {
        let (a, b) = (new_owner(), new_owner());
        let e = Entry::of(b"v");
        put(a, 7, b"k", &e, 0);
        assert!(get(a, 7, b"k", 0).is_some_and(|h| Arc::ptr_eq(&h.entry, &e)));
        assert!(get(b, 7, b"k", 0).is_none(), "another store's slot");
        assert!(get(a, 7, b"j", 0).is_none(), "another key, same hash");
        assert!(
            get(a, 7 + SLOTS as u64, b"k", 0).is_none(),
            "another hash, same slot"
        );
        e.retire();
        assert!(get(a, 7, b"k", 0).is_none(), "an entry that left the store");
    }

    #[test]
    fn every_so_many_hits_ask_for_the_store_to_be_read_too() {
        let owner = new_owner();
        put(owner, 9, b"k", &Entry::of(b"v"), 0);
        let touches = (0..TOUCH_EVERY * 3)
            .filter(|_| get(owner, 9, b"k", 0).is_some_and(|h| h.touch))
            .count();
        assert_eq!(touches, 3);
    }

    #[test]
    fn a_key_read_less_often_takes_a_live_slot_only_after_others_were_turned_away() {
        let owner = new_owner();
        let (hot, cold) = (Entry::of(b"h"), Entry::of(b"c"));
        let other = 21 + SLOTS as u64;
        put(owner, 21, b"hot", &hot, 9);
        // Turned away while the holder's bar (9, less one per key turned away) is higher.
        for _ in 0..3 {
            put(owner, other, b"cold", &cold, 6);
            assert!(get(owner, other, b"cold", 6).is_none());
        }
        // A hit of the holder raises its bar again.
        assert!(get(owner, 21, b"hot", 9).is_some());
        for _ in 0..3 {
            put(owner, other, b"cold", &cold, 6);
        }
        put(owner, other, b"cold", &cold, 6);
        assert!(get(owner, other, b"cold", 6).is_some(), "the bar fell to 6");
        // A dead holder is replaced whatever its bar.
        put(owner, 21, b"hot", &hot, 15);
        hot.retire();
        put(owner, other, b"cold", &cold, 0);
        assert!(get(owner, other, b"cold", 0).is_some());
    }

    #[test]
    fn long_keys_and_large_values_stay_out() {
        let owner = new_owner();
        put(owner, 11, &[b'k'; INLINE + 1], &Entry::of(b"v"), 0);
        assert!(get(owner, 11, &[b'k'; INLINE + 1], 0).is_none());
        put(owner, 12, b"k", &Entry::of(&[b'v'; MAX_VALUE + 1]), 0);
        assert!(get(owner, 12, b"k", 0).is_none());
        put(owner, 13, b"k", &Entry::of(&[b'v'; MAX_VALUE]), 0);
        assert!(get(owner, 13, b"k", 0).is_some());
    }

    #[test]
    fn a_slot_is_one_cache_line() {
        assert_eq!(std::mem::size_of::<Slot>(), 64);
    }
}
