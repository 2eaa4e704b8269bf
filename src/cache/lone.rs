//! Whether the reads GETs lead are left alone: looked at every 250 ms (`served.rs`), from how
//! many GETs went to lead (or fill) a read and how many joined one since the last look.
//!
//! A GET that misses leads a read others may join (`leads.rs`): it is registered by its
//! key's hash, counted in `presence.rs` and `epochs.rs`, and taken out again when its reply
//! comes: some eight locked operations in all (the map shard's lock, the presence count,
//! the read epoch, the lead's reference, each on the way in and out). That is what holds a
//! stampede to one read, but on a key space read a few times per key (uniform GETs over
//! 100,000 keys, each key settled above the sketch's noise floor but under the admission
//! bar) nearly no read is joined: of 1.5M such GETs, 833,000 missed and 2,471 joined a read
//! (one in 340), and through `corral --cluster` leading the reads took 95 ns per request of
//! 1.32 µs (perf). While fewer than one read in [`JOINED_AT`] is joined, a GET of a key
//! neither admitted nor read again lately (`recent.rs`) is forwarded with no lead, as a
//! cold key's is: a stampede on such a key then costs two reads (the second GET finds the
//! first in `recent.rs` and leads, the rest join it), as one on a key never read before
//! does. A key admitted to the store still fills once for all its GETs; a key that would be
//! but for its lane (down, say) is read as any key not admitted.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use crate::striped::StripedCounter;

/// Fewer than one read in this many was joined over a look: reads are left alone.
const JOINED_AT: u64 = 64;
/// Reads a look must see before it says they are left alone: under this (16,384 a second),
/// leading every read costs too little to matter, and a stampede keeps its one read.
const LEAST_READS: u64 = 4096;

/// See the module.
#[derive(Debug, Default)]
pub(super) struct Lone {
    on: AtomicBool,
    /// GETs that went to lead a read (or fill one) or, reads being left alone, would have.
    /// Cold GETs and those of keys written lately never do: they do not count.
    reads: StripedCounter,
    /// The counts at the last look: reads, and GETs that joined one.
    seen: AtomicU64,
    joined: AtomicU64,
}

impl Lone {
    /// A GET is about to lead a read (or fill one) unless reads are left alone: counts it,
    /// and says whether they are.
    #[inline]
    pub(super) fn read_to_lead(&self) -> bool {
        self.reads.inc();
        self.on.load(Relaxed)
    }

    /// Whether reads are left alone now.
    pub(super) fn on(&self) -> bool {
        self.on.load(Relaxed)
    }

    /// A look, with `joined` GETs counted since start as having joined a read. One caller
    /// (the look's task). Once reads are left alone, those not led cannot be joined: the
    /// joins that end it come from the keys read again lately, which still lead.
    pub(super) fn follow(&self, joined: u64) {
        let reads = self.reads.get();
        let read = reads.saturating_sub(self.seen.swap(reads, Relaxed));
        let joins = joined.saturating_sub(self.joined.swap(joined, Relaxed));
        self.on.store(
            read >= LEAST_READS && joins.saturating_mul(JOINED_AT) < read,
            Relaxed,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts `n` GETs that lead (or would lead) a read.
    fn read(l: &Lone, n: u64) {
        for _ in 0..n {
            l.read_to_lead();
        }
    }

    #[test]
    fn reads_are_left_alone_while_many_are_led_and_few_joined() {
        let l = Lone::default();
        assert!(!l.on(), "not before a look");
        read(&l, 100_000);
        l.follow(0);
        assert!(l.on(), "100,000 reads, none joined");
        read(&l, 100_000);
        l.follow(1_000);
        assert!(l.on(), "one in 100 joined");
        read(&l, 100_000);
        l.follow(3_000);
        assert!(!l.on(), "one in 50 joined");
        read(&l, 100_000);
        l.follow(3_000);
        assert!(l.on());
        read(&l, 4_000);
        l.follow(3_000);
        assert!(!l.on(), "too few reads to matter");
    }
}
