//! Whether the reads GETs lead are left alone: looked at every 250 ms (`served.rs`), from how
//! many GETs missed and how many of them joined a read in flight since the last look.
//!
//! A GET that misses leads a read others may join (`leads.rs`): it is registered by its
//! key's hash, counted in `presence.rs` and `epochs.rs`, and taken out again when its reply
//! comes, about ten locked operations in all. That is what holds a stampede to one read, but
//! on a key space read a few times per key (uniform GETs over 100,000 keys, each key
//! settled above the sketch's noise floor but under the admission bar) nearly no read is
//! joined: of 1.5M such GETs, 833,000 missed and 2,471 joined a read (one in 340), and
//! through `corral --cluster` leading the reads took 95 ns per request of 1.32 µs (perf).
//! While fewer than one miss in [`JOINED_AT`] joins a read, a GET of a key neither admitted
//! nor read again lately (`recent.rs`) is forwarded with no lead, as a cold key's is: a
//! stampede on such a key then costs two reads (the second GET finds the first in
//! `recent.rs` and leads, the rest join it), as one on a key never read before does. A key
//! admitted to the store still fills once for all its GETs.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

/// Fewer than one miss in this many joined a read over a look: reads are left alone.
const JOINED_AT: u64 = 64;
/// Misses a look must see before it says reads are left alone: under this (16,384 a
/// second), leading every read costs too little to matter, and a stampede keeps its one read.
const LEAST_MISSES: u64 = 4096;

/// See the module.
#[derive(Debug, Default)]
pub(super) struct Lone {
    on: AtomicBool,
    /// The counters at the last look: misses, joined.
    misses: AtomicU64,
    joined: AtomicU64,
}

impl Lone {
    /// Whether reads are left alone now.
    #[inline]
    pub(super) fn on(&self) -> bool {
        self.on.load(Relaxed)
    }

    /// A look at the counters since start: `misses` GETs missed, `joined` of them joined a
    /// read. One caller (the look's task).
    pub(super) fn follow(&self, misses: u64, joined: u64) {
        let missed = misses.saturating_sub(self.misses.swap(misses, Relaxed));
        let joins = joined.saturating_sub(self.joined.swap(joined, Relaxed));
        self.on.store(
            missed >= LEAST_MISSES && joins.saturating_mul(JOINED_AT) < missed,
            Relaxed,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_left_alone_while_many_miss_and_few_join() {
        let l = Lone::default();
        assert!(!l.on(), "not before a look");
        l.follow(100_000, 0);
        assert!(l.on(), "100,000 misses, none joined");
        l.follow(200_000, 1_000);
        assert!(l.on(), "one in 100 joined");
        l.follow(300_000, 3_000);
        assert!(!l.on(), "one in 50 joined");
        l.follow(400_000, 3_000);
        assert!(l.on());
        l.follow(404_000, 3_000);
        assert!(!l.on(), "too few misses to matter");
    }
}
