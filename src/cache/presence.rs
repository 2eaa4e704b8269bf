//! Which keys may have an entry in the store or a read in flight (`fills`, `leads`): a count
//! per slot of key hashes of what is there now. A slot at zero proves the key has none, so a
//! write's invalidations and a GET's look for an entry or a read to join skip the maps, whose
//! locks and probes were most of what the cache added to a SET and to a GET of a key read
//! often but not cached.
//!
//! Each thing is counted before it is put in its map and uncounted after it left, so a count
//! is never below what the maps hold. Every access is `SeqCst`, as in `epochs.rs`: a write
//! that finds a slot at zero read it before the count of any read registered since, and
//! such a read is one its second invalidation looks for (`epochs.rs`).
//!
//! Entries and reads are counted apart (see [`Held`]): a GET looks in the store only for a
//! key that may have an entry, and for a read to join only for one that may have a read,
//! and a write touches only the maps its key may be in.
//!
//! A summary, one bit per slot (16 KiB), says which slots are not at zero, for a cool
//! connection's GETs alone ([`Presence::may_hold`]): the slots themselves (256 KiB) were a
//! cache miss on nearly every such GET. A bit is set when its slot leaves zero and cleared
//! when it comes back; on several threads two changes of one slot may set and clear out of
//! order, and every 250 ms look sets the bits of slots not at zero again
//! ([`Presence::mend`]). A bit wrongly clear only sends a cool connection's GET to Redis
//! unlooked, which is what such a GET is anyway and always reads the current value (within
//! a round it then goes behind any read of the key in the batch, and a round that waits on
//! a joined read checks its notes first, `server/cached.rs`); a bit wrongly set (a look that
//! crossed a change) costs a lookup until the slot next comes back to zero. A write's
//! invalidations and every other look read the slots.

use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};

/// Slots: 256 KiB. A slot shared by keys only costs a look in the maps that finds nothing,
/// but with the store's lookup a few cache misses deep, that look costs: on Zipf GETs over
/// 1M keys (about 33,000 entries), four times the slots read the store for 9.7% of
/// requests instead of 13.0%.
const SLOTS: usize = 1 << 17;
/// A count that reached this stays: it no longer counts, so it may never reach zero.
const STUCK: u16 = u8::MAX as u16;

/// What a count is of. Both counts of a slot are one atomic word: a write checks both in
/// one load, and a read completed into an entry is counted as the entry before it is
/// uncounted as a read, so the word never passes through zero meanwhile.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Held {
    /// An entry in the store.
    Entry,
    /// A read in flight (`fills`, `leads`).
    Read,
}

impl Held {
    fn shift(self) -> u32 {
        match self {
            Held::Entry => 0,
            Held::Read => 8,
        }
    }
}

/// The counts of one slot, as loaded once.
#[derive(Debug, Clone, Copy)]
pub(super) struct Counts(u16);

impl Counts {
    /// Whether the key may have an entry or a read in flight: false only if it has neither.
    pub(super) fn any(self) -> bool {
        self.0 != 0
    }

    /// Whether the key may have an entry in the store: false only if it has none.
    pub(super) fn entry(self) -> bool {
        self.0 & 0xff != 0
    }

    /// Whether the key may have a read in flight: false only if it has none.
    pub(super) fn read(self) -> bool {
        self.0 >> 8 != 0
    }
}

/// The counts.
#[derive(Debug)]
pub(super) struct Presence {
    slots: Box<[AtomicU16]>,
    /// A bit per slot: clear when the slot is at zero, else set, but for changes that
    /// crossed on two threads, mended at the next look.
    summary: Box<[AtomicU64]>,
    /// The store held at least as many entries as there are slots when last looked at.
    crowded: AtomicBool,
}

impl Default for Presence {
    fn default() -> Self {
        Presence {
            slots: (0..SLOTS).map(|_| AtomicU16::new(0)).collect(),
            summary: (0..SLOTS / 64).map(|_| AtomicU64::new(0)).collect(),
            crowded: AtomicBool::new(false),
        }
    }
}

impl Presence {
    fn index(hash: u64) -> usize {
        // Middle bits: `recent.rs` indexes by the low ones, `epochs.rs` by the top ones.
        (hash >> 24) as usize % SLOTS
    }

    fn slot(&self, hash: u64) -> &AtomicU16 {
        &self.slots[Presence::index(hash)]
    }

    /// The summary's word and bit of the key with this hash.
    fn bit(&self, hash: u64) -> (&AtomicU64, u64) {
        let i = Presence::index(hash);
        (&self.summary[i / 64], 1 << (i % 64))
    }

    /// Notes how many entries the store holds (looked at every 250 ms). From as many as
    /// there are slots, most slots are counted, and most writes' invalidations probe the
    /// store's table: a long-running cache on Zipf GETs over 1M keys held 232,147 entries
    /// after 6 s and 594,974 after 26 s, against 131,072 slots.
    pub(super) fn follow_store(&self, entries: usize) {
        self.crowded.store(entries >= SLOTS, Relaxed);
    }

    /// Whether the store held as many entries as there are slots at the last look: a key's
    /// count then says little, and a write's invalidation nearly always reads the table.
    pub(super) fn crowded(&self) -> bool {
        self.crowded.load(Relaxed)
    }

    /// Asks the CPU to load the key's slot (see `Cache::prefetch`).
    pub(super) fn prefetch(&self, hash: u64) {
        crate::prefetch::read(self.slot(hash));
    }

    /// Asks the CPU to load the key's bit of the summary (see [`Presence::may_hold`]).
    pub(super) fn prefetch_summary(&self, hash: u64) {
        crate::prefetch::read(self.bit(hash).0);
    }

    /// Counts one more or one less `what` in the key's slot, unless that count is stuck.
    fn change(&self, hash: u64, what: Held, up: bool) {
        let shift = what.shift();
        let next = |w: u16| {
            let n = match (w >> shift) & STUCK {
                STUCK => return None,
                n if up => n + 1,
                n => {
                    debug_assert!(n > 0, "a count would go below zero");
                    n.checked_sub(1)?
                }
            };
            Some(w & !(STUCK << shift) | n << shift)
        };
        let Ok(was) = self.slot(hash).fetch_update(SeqCst, SeqCst, next) else {
            return;
        };
        let now = next(was).unwrap_or(was);
        let (word, bit) = self.bit(hash);
        if was == 0 && now != 0 {
            word.fetch_or(bit, SeqCst);
        } else if was != 0 && now == 0 {
            word.fetch_and(!bit, SeqCst);
        }
    }

    /// Sets the summary's bits of the slots not at zero (see the module's doc): called at
    /// every 250 ms look. Reads the 256 KiB of slots.
    pub(super) fn mend(&self) {
        for (w, word) in self.summary.iter().enumerate() {
            let held = self.slots[w * 64..(w + 1) * 64]
                .iter()
                .enumerate()
                .filter(|(_, s)| s.load(Relaxed) != 0)
                .fold(0u64, |bits, (i, _)| bits | 1 << i);
            if held & !word.load(Relaxed) != 0 {
                word.fetch_or(held, SeqCst);
            }
        }
    }

    /// Something of the key with this hash is about to be put in a map.
    pub(super) fn add(&self, hash: u64, what: Held) {
        self.change(hash, what, true);
    }

    /// Something of the key with this hash left its map.
    pub(super) fn remove(&self, hash: u64, what: Held) {
        self.change(hash, what, false);
    }

    /// The key's counts, loaded now.
    pub(super) fn counts(&self, hash: u64) -> Counts {
        Counts(self.slot(hash).load(SeqCst))
    }

    /// Whether the key with this hash may have an entry or a read in flight, by the summary:
    /// false if it has neither, and, after two changes of its slot crossed on two threads,
    /// until the next look mends it (see the module's doc). For a cool connection's GETs
    /// only.
    pub(super) fn may_hold(&self, hash: u64) -> bool {
        let (word, bit) = self.bit(hash);
        word.load(SeqCst) & bit != 0
    }

    /// Whether every count is zero: for unit tests.
    #[cfg(test)]
    pub(super) fn is_clear(&self) -> bool {
        self.slots.iter().all(|s| s.load(SeqCst) == 0)
            && self.summary.iter().all(|w| w.load(SeqCst) == 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_is_crowded_from_as_many_entries_as_slots() {
        let p = Presence::default();
        assert!(!p.crowded());
        p.follow_store(SLOTS - 1);
        assert!(!p.crowded());
        p.follow_store(SLOTS);
        assert!(p.crowded());
        p.follow_store(0);
        assert!(!p.crowded());
    }

    #[test]
    fn a_slot_is_clear_only_when_all_its_keys_left() {
        let p = Presence::default();
        let (a, b) = (7u64 << 24, (7 + SLOTS as u64) << 24);
        assert!(!p.may_hold(a));
        p.add(a, Held::Entry);
        p.add(b, Held::Read);
        assert!(p.may_hold(a) && p.may_hold(b), "one slot");
        p.remove(a, Held::Entry);
        assert!(p.may_hold(a), "b is still there");
        p.remove(b, Held::Read);
        assert!(!p.may_hold(a));
    }

    #[test]
    fn the_summary_follows_the_slots_and_a_look_mends_it() {
        let p = Presence::default();
        let (a, b) = (9u64 << 24, 10u64 << 24);
        p.add(a, Held::Read);
        p.add(a, Held::Entry);
        p.remove(a, Held::Read);
        assert!(p.may_hold(a) && !p.may_hold(b));
        p.remove(a, Held::Entry);
        assert!(!p.may_hold(a), "back at zero");
        // A bit cleared by two changes that crossed on other threads: the look sets it again.
        p.add(b, Held::Entry);
        let (word, bit) = p.bit(b);
        word.fetch_and(!bit, SeqCst);
        assert!(!p.may_hold(b));
        p.mend();
        assert!(p.may_hold(b) && !p.may_hold(a));
    }

    #[test]
    fn entries_and_reads_are_counted_apart() {
        let p = Presence::default();
        p.add(3, Held::Read);
        let c = p.counts(3);
        assert!(c.any() && c.read() && !c.entry());
        // A read completed into an entry: counted as the entry first.
        p.add(3, Held::Entry);
        p.remove(3, Held::Read);
        let c = p.counts(3);
        assert!(c.any() && c.entry() && !c.read());
        p.remove(3, Held::Entry);
        assert!(!p.may_hold(3));
    }

    #[test]
    fn a_full_count_sticks() {
        let p = Presence::default();
        for _ in 0..STUCK {
            p.add(1, Held::Read);
        }
        p.add(1, Held::Read);
        p.remove(1, Held::Read);
        let c = p.counts(1);
        assert!(c.read() && !c.entry());
        assert_eq!(p.slot(1).load(SeqCst), STUCK << 8);
        // The other count still counts.
        p.add(1, Held::Entry);
        p.remove(1, Held::Entry);
        assert!(!p.counts(1).entry());
    }
}
