//! Which keys were read lately, one bit per bucket of key hashes: a write to a key nobody
//! read since the last clear has no reads in the sketch to weigh against, so it skips the
//! sketch, whose block is a cache miss on most writes of a write-heavy load (6% of corral's
//! CPU on SETs over a million keys). Most writes name keys GETs never read (counters, lists,
//! hashes...). A bit shared by two keys only costs a write a needless decrement.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// 64K bits, 8 KiB: touched on every GET, so it must stay in the CPU's cache.
const WORDS: usize = 1024;

/// The bits.
#[derive(Debug)]
pub(super) struct ReadLately {
    words: Box<[AtomicU64]>,
}

impl Default for ReadLately {
    fn default() -> Self {
        ReadLately {
            words: (0..WORDS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl ReadLately {
    /// The word and bit of the key with this hash (bits the sketch's block choice does not
    /// use alone).
    fn slot(&self, hash: u64) -> (&AtomicU64, u64) {
        let i = (hash >> 16) as usize;
        (&self.words[(i / 64) % WORDS], 1 << (i % 64))
    }

    /// A read of the key with this hash. A plain load first: a key read again writes
    /// nothing.
    pub(super) fn note(&self, hash: u64) {
        let (word, bit) = self.slot(hash);
        if word.load(Relaxed) & bit == 0 {
            word.fetch_or(bit, Relaxed);
        }
    }

    /// Asks the CPU to load the word of the key with this hash.
    pub(super) fn prefetch(&self, hash: u64) {
        crate::prefetch::read(self.slot(hash).0);
    }

    /// Whether the key with this hash (or one sharing its bit) was read since the last clear.
    pub(super) fn seen(&self, hash: u64) -> bool {
        let (word, bit) = self.slot(hash);
        word.load(Relaxed) & bit != 0
    }

    /// Forgets every read.
    pub(super) fn clear(&self) {
        for w in self.words.iter() {
            w.store(0, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_seen_until_cleared() {
        let r = ReadLately::default();
        let (a, b) = (0x1234_5678_9abc_def0u64, 0x0fed_cba9_8765_4321u64);
        r.note(a);
        assert!(r.seen(a) && !r.seen(b));
        r.clear();
        assert!(!r.seen(a));
    }
}
