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

use std::sync::atomic::{AtomicU16, Ordering::SeqCst};

/// Slots: 256 KiB. A slot shared by keys only costs a look in the maps that finds nothing,
/// but with the store's lookup a few cache misses deep, that look costs: on Zipf GETs over
/// 1M keys (about 33,000 entries), four times the slots read the store for 9.7% of
/// requests instead of 13.0%.
const SLOTS: usize = 1 << 17;
/// A count that reached this stays: it no longer counts, so it may never reach zero.
const STUCK: u16 = u16::MAX;

/// The counts.
#[derive(Debug)]
pub(super) struct Presence {
    slots: Box<[AtomicU16]>,
}

impl Default for Presence {
    fn default() -> Self {
        Presence {
            slots: (0..SLOTS).map(|_| AtomicU16::new(0)).collect(),
        }
    }
}

impl Presence {
    fn slot(&self, hash: u64) -> &AtomicU16 {
        // Middle bits: `recent.rs` indexes by the low ones, `epochs.rs` by the top ones.
        &self.slots[(hash >> 24) as usize % SLOTS]
    }

    /// Asks the CPU to load the key's slot (see `Cache::prefetch`).
    pub(super) fn prefetch(&self, hash: u64) {
        crate::prefetch::read(self.slot(hash));
    }

    /// Something of the key with this hash is about to be put in a map.
    pub(super) fn add(&self, hash: u64) {
        let _ = self
            .slot(hash)
            .fetch_update(SeqCst, SeqCst, |n| (n < STUCK).then(|| n + 1));
    }

    /// Something of the key with this hash left its map.
    pub(super) fn remove(&self, hash: u64) {
        let r = self.slot(hash).fetch_update(SeqCst, SeqCst, |n| {
            (n < STUCK).then(|| n.checked_sub(1)).flatten()
        });
        debug_assert!(r != Err(0), "a count would go below zero");
    }

    /// Whether the key with this hash may have an entry or a read in flight: false only if
    /// it has neither.
    pub(super) fn may_hold(&self, hash: u64) -> bool {
        self.slot(hash).load(SeqCst) != 0
    }

    /// Whether every count is zero: for unit tests.
    #[cfg(test)]
    pub(super) fn is_clear(&self) -> bool {
        self.slots.iter().all(|s| s.load(SeqCst) == 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_clear_only_when_all_its_keys_left() {
        let p = Presence::default();
        let (a, b) = (7u64 << 24, (7 + SLOTS as u64) << 24);
        assert!(!p.may_hold(a));
        p.add(a);
        p.add(b);
        assert!(p.may_hold(a) && p.may_hold(b), "one slot");
        p.remove(a);
        assert!(p.may_hold(a), "b is still there");
        p.remove(b);
        assert!(!p.may_hold(a));
    }

    #[test]
    fn a_full_count_sticks() {
        let p = Presence::default();
        for _ in 0..STUCK {
            p.add(1);
        }
        p.add(1);
        p.remove(1);
        assert!(p.may_hold(1));
        assert_eq!(p.slot(1).load(SeqCst), STUCK);
    }
}
