//! The keys of the last cold GETs, by hash: how a cold key read again while its first read may
//! still be in flight (a stampede on a key nobody read before) is told from a key read once.
//!
//! A cold GET (its sketch estimate at the noise floor) is forwarded as it is, with no per-key
//! state: on a large key space nearly every GET is one, and most keys are read once. Such a
//! read cannot be joined. The table remembers its hash, so a second GET of the same key soon
//! after takes the full path and becomes the read that the rest join: a stampede on a key
//! never read before costs two upstream reads, not one per client.

use std::sync::atomic::{AtomicU64, Ordering};

/// Slots in the table: 32 KiB, small enough to stay in the CPU's cache. A slot is taken over
/// by another cold key after about this many other cold GETs, far more than arrive in one
/// round trip to Redis.
const SLOTS: usize = 4096;

/// Direct-mapped hashes of recent cold GETs.
#[derive(Debug)]
pub(super) struct RecentReads {
    slots: Box<[AtomicU64]>,
}

impl Default for RecentReads {
    fn default() -> Self {
        RecentReads {
            slots: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl RecentReads {
    /// Asks the CPU to load the slot of the key with this hash (see `Cache::prefetch`).
    pub(super) fn prefetch(&self, hash: u64) {
        crate::prefetch::read(&self.slots[hash as usize % SLOTS]);
    }

    /// Records a cold GET of the key with this hash; true if the last cold GET in its slot
    /// was of a key with the same hash (the same key, but for a 64-bit collision, which
    /// only sends the GET down the full path).
    pub(super) fn read_again(&self, hash: u64) -> bool {
        let slot = &self.slots[hash as usize % SLOTS];
        if slot.load(Ordering::Relaxed) == hash {
            return true;
        }
        // A swap, not a store: of two GETs of one key racing on two threads, only one is
        // the first.
        slot.swap(hash, Ordering::Relaxed) == hash
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_read_again_is_recognised_until_another_takes_its_slot() {
        let r = RecentReads::default();
        assert!(!r.read_again(42));
        assert!(r.read_again(42));
        assert!(r.read_again(42));
        // Another key in the same slot.
        assert!(!r.read_again(42 + SLOTS as u64));
        assert!(!r.read_again(42));
        // Keys in other slots leave it alone.
        assert!(!r.read_again(43));
        assert!(r.read_again(42));
    }
}
