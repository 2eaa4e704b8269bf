//! The keys written lately, by hash: whose GETs are not worth a read others may join.
//!
//! A bare read others may join (a lead, `read.rs`) costs corral two locked map operations,
//! its registration and its removal, and a pass over its batch's replies; a GET that joins
//! it costs a shared fill and a wake-up. That pays where many GETs of a key arrive while
//! nothing changes it: a stampede on a key read by many clients. A key written often pays
//! it and gets little back: each write unlinks its read in flight, so the GETs after the
//! write lead again, and the GETs joined meanwhile are ones Redis serves for a fraction of
//! what corral spent on the lead. On Zipf GET/SET 90/10 over 1M keys at -P 16, where
//! writes keep the hot keys out of the store, leads and joins cost corral about 40 ns per
//! request and 7-11% of the throughput against forwarding those GETs, with no saving in
//! Redis's CPU that could be told from the noise.
//!
//! So a key written in this epoch of 250 ms or the last (epochs ticked by
//! `Admission::look`), through corral or, as far as corral can tell, directly (an
//! invalidation that ended its entry unread: `Admission::record_write`), has its GETs
//! forwarded as a cold key's are, unless it is admitted to the store; a key nobody writes,
//! as on a stampede, keeps its single read. A slot is taken over by another key's write
//! after about [`SLOTS`] others.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Slots in the table: 32 KiB, small enough to stay in the CPU's cache. On the 90/10 mix at
/// 1M requests/s a slot changes hands about every 45 ms, longer than the hottest keys go
/// between writes; a table 16 times as large made no difference that could be measured.
const SLOTS: usize = 4096;

/// The low bits of a slot, where its write's epoch is kept (a key counts as written lately
/// in that epoch and the next); the rest are the key's hash.
const EPOCH_BITS: u64 = 0xff;
const _: () = assert!(SLOTS as u64 > EPOCH_BITS && SLOTS.is_power_of_two());

/// Direct-mapped hashes of keys written lately, each with the epoch of its write.
#[derive(Debug)]
pub(super) struct WrittenLately {
    slots: Box<[AtomicU64]>,
    epoch: AtomicU64,
}

impl Default for WrittenLately {
    fn default() -> Self {
        WrittenLately {
            // No hash's high bits are all ones but one in 2^56; such a key only loses its
            // leads until its slot is first written.
            slots: (0..SLOTS).map(|_| AtomicU64::new(u64::MAX)).collect(),
            epoch: AtomicU64::new(0),
        }
    }
}

impl WrittenLately {
    /// The key with this hash was written.
    pub(super) fn wrote(&self, hash: u64) {
        let epoch = self.epoch.load(Relaxed) & EPOCH_BITS;
        self.slot(hash).store((hash & !EPOCH_BITS) | epoch, Relaxed);
    }

    /// Whether the key with this hash was written in this epoch or the last. The slot's index
    /// holds the hash's low bits, where the slot keeps its epoch: the rest is compared.
    pub(super) fn lately(&self, hash: u64) -> bool {
        let slot = self.slot(hash).load(Relaxed);
        let now = self.epoch.load(Relaxed);
        (slot ^ hash) & !EPOCH_BITS == 0 && now.wrapping_sub(slot) & EPOCH_BITS <= 1
    }

    /// An epoch went by (`lasting::LOOK`).
    pub(super) fn tick(&self) {
        self.epoch.fetch_add(1, Relaxed);
    }

    fn slot(&self, hash: u64) -> &AtomicU64 {
        &self.slots[hash as usize % SLOTS]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_marks_its_key_for_this_epoch_and_the_next() {
        let w = WrittenLately::default();
        let key = 0x1234_5678_9abc_def0;
        assert!(!w.lately(key));
        // The second time 300 epochs on, past the wrap of the slot's epoch bits.
        for _ in 0..2 {
            w.wrote(key);
            assert!(w.lately(key));
            w.tick();
            assert!(w.lately(key), "the next epoch");
            w.tick();
            assert!(!w.lately(key), "two epochs on");
            (0..298).for_each(|_| w.tick());
        }
    }

    #[test]
    fn another_keys_write_takes_the_slot_over() {
        let w = WrittenLately::default();
        let (a, b) = (
            0x1000_0000_0000_0001u64,
            0x2000_0000_0000_0001 + SLOTS as u64,
        );
        assert_eq!(a as usize % SLOTS, b as usize % SLOTS);
        w.wrote(a);
        w.wrote(b);
        assert!(!w.lately(a));
        assert!(w.lately(b));
        // Keys in other slots, and unwritten keys in the same one, are not marked.
        assert!(!w.lately(a + 1));
        assert!(!w.lately(a + 2 * SLOTS as u64));
    }
}
