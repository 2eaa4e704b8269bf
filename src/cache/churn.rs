//! Keys whose entries a write ends before they repay their fill, by bucket of key hashes.
//!
//! The read sketch admits a key once read often enough since its last write, but that says
//! nothing of how many reads the entry will serve before the next write: writes come at
//! random, so a key read nine times per write (a Zipf 90/10 GET/SET mix, where every key has
//! that ratio however hot it is) serves about nine hits per fill whatever the bar, and a
//! tracked fill with its invalidation costs corral and Redis more than nine forwarded GETs
//! save them. Each entry a write ends scores its bucket the hits it fell short of
//! [`PAYS`] by (or takes off what it served beyond, as far as entries count hits: one
//! fill's worth); a bucket at [`SHUT_OUT`] or above admits nothing until the periodic
//! halving brings it down, when its keys get another fill to prove themselves. A key read
//! far more often than written keeps its bucket well below zero (over several entries), so
//! the odd entry written early does not shut it out.

use std::sync::atomic::{AtomicI8, Ordering::Relaxed};

use super::entry::COUNTED_HITS;

/// Hits an entry must serve before a write ends it for its fill to have paid: on the 90/10
/// mix the cache cost more than it saved at about 8 hits per fill.
pub(super) const PAYS: u8 = 16;
/// A bucket at or above this admits nothing: its entries fell about one fill's worth of
/// hits short, net of what the others served beyond [`PAYS`]. With two fills' worth, the
/// 90/10 mix run after Zipf GETs took seconds longer to shut its keys out: 0.63-0.68M
/// requests/s over its first 4 s and 0.79-0.80M from then on, against 0.70-0.72M and
/// 0.79-0.85M at one.
const SHUT_OUT: i8 = PAYS as i8;
/// The highest score: one halving brings any bucket back under [`SHUT_OUT`], so a key is
/// shut out for at most one tick (10 s) after its last short-lived entry, and a key whose
/// writes stopped is cached again soon. A key still written as often gets one more fill
/// per tick, which shuts it out again.
const BOUND: i8 = 2 * SHUT_OUT - 1;
/// The lowest score: a key read far more often than written sits here, and it would take
/// several short-lived entries in a row (each up to [`PAYS`]) to shut it out.
const FLOOR: i8 = -(3 * PAYS as i8);
/// 256K one-byte buckets, 256 KiB: touched only when an entry ends and when a key is about
/// to be admitted. A shut-out bucket shuts out every key in it: on the 90/10 mix over 1M
/// keys, thousands of keys are, and fewer buckets would shut out a share of other keys too.
const BUCKETS: usize = 1 << 18;

/// The buckets' scores.
#[derive(Debug)]
pub(super) struct Churn {
    scores: Box<[AtomicI8]>,
}

impl Default for Churn {
    fn default() -> Self {
        Churn {
            scores: (0..BUCKETS).map(|_| AtomicI8::new(0)).collect(),
        }
    }
}

impl Churn {
    /// The bucket of the key with this hash (bits that neither the read sketch's block
    /// choice nor `lately.rs` use alone).
    fn bucket(&self, hash: u64) -> &AtomicI8 {
        &self.scores[(hash >> 40) as usize % BUCKETS]
    }

    /// A write (through corral or not) ended an entry of the key with this hash after it
    /// served `hits`. Two racing updates may lose one: the score only steers admission.
    pub(super) fn ended(&self, hash: u64, hits: u8) {
        let b = self.bucket(hash);
        let change = i16::from(PAYS) - i16::from(hits.min(COUNTED_HITS));
        let score = (i16::from(b.load(Relaxed)) + change).clamp(FLOOR.into(), BOUND.into());
        b.store(score as i8, Relaxed);
    }

    /// A fill of the key with this hash read a value too large to keep: shut out until the
    /// next halving, as far as [`BOUND`] goes (at most one tick), so its GETs are read as a
    /// cold key's are rather than filled again at each miss.
    pub(super) fn shut(&self, hash: u64) {
        self.bucket(hash).store(BOUND, Relaxed);
    }

    /// Whether the key with this hash is shut out of the store for now.
    pub(super) fn shut_out(&self, hash: u64) -> bool {
        self.bucket(hash).load(Relaxed) >= SHUT_OUT
    }

    /// Halves every score (towards zero), so what a bucket's keys did long ago weighs less
    /// than what they do now, and a shut-out key gets another chance.
    pub(super) fn halve(&self) {
        for s in self.scores.iter() {
            let v = s.load(Relaxed);
            if v != 0 {
                s.store(v / 2, Relaxed);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ends `n` entries of `hash`, each serving a geometric number of hits: one key with
    /// `reads_per_write` reads to each write, written at random.
    fn lives(c: &Churn, hash: u64, reads_per_write: u32, n: usize, seed: &mut u64) {
        for _ in 0..n {
            let mut hits = 0u8;
            loop {
                *seed ^= *seed << 13;
                *seed ^= *seed >> 7;
                *seed ^= *seed << 17;
                if seed.is_multiple_of(u64::from(reads_per_write + 1)) || hits == u8::MAX {
                    break;
                }
                hits += 1;
            }
            c.ended(hash, hits);
        }
    }

    #[test]
    fn a_key_read_nine_times_per_write_is_shut_out_and_one_read_a_hundred_is_not() {
        let c = Churn::default();
        let (mixed, read_mostly) = (1u64 << 40, 2u64 << 40);
        let mut seed = 7;
        lives(&c, mixed, 9, 20, &mut seed);
        assert!(c.shut_out(mixed));
        // Shut for one halving: an oversized value's key.
        let big = 3u64 << 40;
        lives(&c, big, 100, 10, &mut seed);
        c.shut(big);
        assert!(c.shut_out(big));
        c.halve();
        assert!(!c.shut_out(big));
        // Many fills: a run of short lives must not shut a hot key out.
        for _ in 0..1_000 {
            lives(&c, read_mostly, 100, 1, &mut seed);
            assert!(!c.shut_out(read_mostly));
        }
    }

    #[test]
    fn one_long_life_earns_at_most_one_fill_of_credit() {
        let c = Churn::default();
        let hash = 5u64 << 40;
        // An entry of a spell of reads with no writes: it served every hit counted.
        c.ended(hash, COUNTED_HITS);
        // Two entries that served nothing shut the key out: the long life earned one
        // fill's worth, not three.
        c.ended(hash, 0);
        assert!(!c.shut_out(hash));
        c.ended(hash, 0);
        assert!(c.shut_out(hash));
    }

    #[test]
    fn halving_gives_a_shut_out_key_another_chance() {
        let c = Churn::default();
        let hash = 3u64 << 40;
        for _ in 0..10 {
            c.ended(hash, 0);
        }
        assert!(c.shut_out(hash));
        c.halve();
        assert!(!c.shut_out(hash), "one halving opens even a full bucket");
        c.ended(hash, 0);
        assert!(c.shut_out(hash), "one more short life shuts it again");
        assert!(!c.shut_out(4u64 << 40), "other buckets are untouched");
    }
}
