//! When reads were last registered, by bucket of key hashes: lets the second invalidation of a
//! write through corral (once Redis acknowledged it) skip keys no read was registered for
//! since the first one, which is nearly every key of a write-heavy workload.
//!
//! The second invalidation exists for one race: a read registered after the first
//! invalidation (before the write was forwarded) may have run in Redis before the write, and
//! must not be joined or fill the cache once the write is acknowledged. Such a read bumps its
//! bucket after it is registered and before it is sent; a write takes a mark of the clock
//! before its first invalidation. If the key's bucket is still at or below the mark after the
//! acknowledgement, either no read was registered since, or one was but had not bumped its
//! bucket yet, and then it had not been sent either, so it runs in Redis after the write.
//! Every access is `SeqCst`: the argument needs one order of the clock, the buckets and the
//! maps' locks.

use std::sync::atomic::{AtomicU64, Ordering::SeqCst};

/// Buckets: 8 KiB. A bucket shared by keys only costs a second invalidation that finds nothing.
const BUCKETS: usize = 1024;

/// The clock and the buckets.
#[derive(Debug)]
pub(super) struct ReadEpochs {
    clock: AtomicU64,
    buckets: Box<[AtomicU64]>,
}

impl Default for ReadEpochs {
    fn default() -> Self {
        ReadEpochs {
            clock: AtomicU64::new(0),
            buckets: (0..BUCKETS).map(|_| AtomicU64::new(0)).collect(),
        }
    }
}

impl ReadEpochs {
    fn bucket(&self, hash: u64) -> &AtomicU64 {
        // The high bits: the low ones pick slots in `recent` and `leads`.
        &self.buckets[(hash >> 54) as usize % BUCKETS]
    }

    /// A write's mark, taken before its first invalidation.
    pub(super) fn mark(&self) -> u64 {
        self.clock.load(SeqCst)
    }

    /// A read of a key with this hash was registered (in `fills` or `leads`) and is about
    /// to be sent.
    pub(super) fn registered(&self, hash: u64) {
        let now = self.clock.fetch_add(1, SeqCst) + 1;
        self.bucket(hash).fetch_max(now, SeqCst);
    }

    /// Whether any read may have been registered after `mark`: if not, no key's bucket can
    /// say so either (a bucket only takes values of the clock), and a write-only load's
    /// acknowledged keys need no look at their buckets, each a cache miss.
    pub(super) fn any_since(&self, mark: u64) -> bool {
        self.clock.load(SeqCst) > mark
    }

    /// Whether a read of a key with this hash may have been registered after `mark`.
    pub(super) fn since(&self, hash: u64, mark: u64) -> bool {
        self.bucket(hash).load(SeqCst) > mark
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_read_registered_after_the_mark_in_the_same_bucket_counts() {
        let e = ReadEpochs::default();
        let (a, b) = (1u64 << 54, 2u64 << 54);
        e.registered(a);
        let mark = e.mark();
        assert!(!e.since(a, mark) && !e.since(b, mark));
        e.registered(b);
        assert!(!e.since(a, mark) && e.since(b, mark));
        // A mark of 0 (a write whose first invalidation came before any mark) skips nothing
        // registered ever.
        assert!(e.since(a, 0));
        // With nothing registered after a mark, no key's bucket is past it.
        let quiet = e.mark();
        assert!(!e.any_since(quiet) && !e.since(a, quiet) && !e.since(b, quiet));
        e.registered(a);
        assert!(e.any_since(quiet) && e.since(a, quiet) && e.any_since(0));
    }
}
