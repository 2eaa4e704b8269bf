//! When to renew the tracking lanes: Redis keeps tracking, for a lane's connection, every
//! key a fill read over it until the key is written, expires or is evicted, whether or not
//! corral still holds it. After a sweep or eviction lets go of most of the store, each write
//! of such a key still costs Redis an invalidation to send and corral one to read (a 90/10
//! mix right after Zipf GETs over 1M keys: some 10,000 a second, Redis's CPU per SET 1.46 µs
//! against 0.97 through `--no-cache`). A new connection has a new client id, and Redis
//! sends nothing for the old one's keys.
//!
//! A renewal drops the store, as a lost lane does, so it is done only while the store holds
//! few entries against the keys Redis is estimated to track: the distinct keys filled since
//! the lanes were last renewed or came up, less the keys Redis invalidated since (an
//! underestimate: a key invalidated and filled again is tracked again but counted once).
//! Distinct, not fills: a refresh, or a refill after an eviction or `max_age_ms`, reads a
//! key Redis already tracks, and on a small store cycling over a few thousand keys counting
//! fills would renew again and again for nothing. The bars: `[cache] lane_renew_keys` keys,
//! [`RATIO`] per entry held, and at most [`MOST_HELD`] entries. A renewal then costs a read
//! or two per entry held while the new lane connects.
//!
//! The distinct keys are counted by a HyperLogLog sketch of 4,096 one-byte registers (about
//! 1.6% standard error), updated with one atomic maximum per fill: a few lines, and a crate
//! of its own would want `&mut` or a lock on the fill path.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering::Relaxed};

/// Keys estimated tracked per entry held, at least, before a renewal.
pub(super) const RATIO: u64 = 64;
/// Most entries the store may hold for a renewal: what it drops is refilled in moments.
pub(super) const MOST_HELD: usize = 4096;
/// log2 of the sketch's registers.
const BITS: u32 = 12;
const REGISTERS: usize = 1 << BITS;

/// The distinct keys filled, and the invalidations counted when the estimate last started
/// from zero.
#[derive(Debug)]
pub(super) struct Renewal {
    /// Fewest keys estimated tracked for a renewal; 0: never.
    least: u64,
    /// HyperLogLog registers of the hashes of the keys filled since the base.
    registers: Box<[AtomicU8]>,
    /// Keys invalidated by Redis, counted at the base.
    invalidations: AtomicU64,
}

impl Renewal {
    /// A renewal at `least` keys estimated tracked (`[cache] lane_renew_keys`; 0: never).
    pub(super) fn new(least: u64) -> Renewal {
        Renewal {
            least,
            registers: (0..REGISTERS).map(|_| AtomicU8::new(0)).collect(),
            invalidations: AtomicU64::new(0),
        }
    }

    /// A fill of the key with this hash was sent over a lane.
    #[inline]
    pub(super) fn filled(&self, hash: u64) {
        if self.least == 0 {
            return;
        }
        let register = (hash >> (64 - BITS)) as usize;
        // The rank of the rest: its leading zeros, plus one (a set low bit caps it).
        let rank = ((hash << BITS) | 1 << (BITS - 1)).leading_zeros() as u8 + 1;
        // A plain load first: most fills find the register as high already, and a read
        // keeps the line shared between the threads.
        let cell = &self.registers[register];
        if cell.load(Relaxed) < rank {
            cell.fetch_max(rank, Relaxed);
        }
    }

    /// Starts the estimate from zero, with `invalidations` keys invalidated so far: a lane
    /// came up, the lanes were renewed, or Redis dropped every key (a null invalidation).
    pub(super) fn rebase(&self, invalidations: u64) {
        for cell in self.registers.iter() {
            cell.store(0, Relaxed);
        }
        self.invalidations.store(invalidations, Relaxed);
    }

    /// Distinct keys filled since the base (HyperLogLog, with linear counting while many
    /// registers are empty).
    fn distinct(&self) -> u64 {
        let m = REGISTERS as f64;
        let (mut sum, mut zeros) = (0.0, 0u32);
        for cell in self.registers.iter() {
            let r = cell.load(Relaxed);
            sum += (-(f64::from(r))).exp2();
            zeros += u32::from(r == 0);
        }
        let alpha = 0.7213 / (1.0 + 1.079 / m);
        let raw = alpha * m * m / sum;
        let estimate = if raw <= 2.5 * m && zeros > 0 {
            m * (m / f64::from(zeros)).ln()
        } else {
            raw
        };
        estimate as u64
    }

    /// Keys estimated tracked for the lanes, with `invalidations` keys invalidated so far.
    pub(super) fn tracked(&self, invalidations: u64) -> u64 {
        let since = invalidations.saturating_sub(self.invalidations.load(Relaxed));
        self.distinct().saturating_sub(since)
    }

    /// Whether the lanes are due for a renewal, with `entries` in the store.
    pub(super) fn due(&self, invalidations: u64, entries: usize) -> bool {
        if self.least == 0 || entries > MOST_HELD {
            return false;
        }
        let tracked = self.tracked(invalidations);
        tracked >= self.least && tracked / RATIO >= entries as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Well-spread hashes, as the cache's keyed hasher gives.
    fn hash(i: u64) -> u64 {
        let mut x = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^ (x >> 31)
    }

    #[test]
    fn distinct_keys_are_counted_within_a_few_percent_and_repeats_not_at_all() {
        for n in [100u64, 5_000, 70_000, 1_000_000] {
            let r = Renewal::new(1);
            for round in 0..3 {
                for i in 0..n {
                    r.filled(hash(i));
                }
                let got = r.tracked(0) as f64;
                let off = (got - n as f64).abs() / n as f64;
                assert!(off < 0.05, "{n} keys, round {round}: {got}");
            }
        }
    }

    #[test]
    fn renewed_only_when_many_keys_are_tracked_for_few_held() {
        let r = Renewal::new(65_536);
        for i in 0..60_000 {
            r.filled(hash(i));
        }
        assert!(!r.due(0, 0), "too few keys tracked");
        for i in 60_000..200_000 {
            r.filled(hash(i));
        }
        let tracked = r.tracked(0);
        assert!(r.due(0, (tracked / RATIO) as usize));
        assert!(
            !r.due(0, (tracked / RATIO + 1) as usize),
            "a store that holds many"
        );
        assert!(!r.due(150_000, 0), "invalidated keys are not tracked");
        // Counted afresh from a rebase on.
        r.rebase(150_000);
        assert_eq!(r.tracked(150_000), 0);
        assert!(!r.due(150_000, 0));
    }

    #[test]
    fn a_large_store_or_a_zero_bar_is_never_renewed() {
        let r = Renewal::new(1);
        for i in 0..100_000 {
            r.filled(hash(i));
        }
        assert!(!r.due(0, MOST_HELD + 1));
        let off = Renewal::new(0);
        for i in 0..100_000 {
            off.filled(hash(i));
        }
        assert!(!off.due(0, 0));
    }
}
