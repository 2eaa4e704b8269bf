//! When to renew the tracking lanes: Redis keeps tracking, for a lane's connection, every
//! key a fill read over it until the key is written, expires or is evicted, whether or not
//! corral still holds it. After a sweep or eviction lets go of most of the store, each write
//! of such a key still costs Redis an invalidation to send and corral one to read (a 90/10
//! mix right after Zipf GETs over 1M keys: some 10,000 a second, Redis's CPU per SET 1.46 µs
//! against 0.97 through `--no-cache`). A new connection has a new client id, and Redis
//! forgets the old one's keys.
//!
//! A renewal drops the store, as a lost lane does, so it is done only while the store holds
//! few entries against the keys Redis is estimated to track: the fills started since the
//! lanes were last renewed or came up, less the keys Redis invalidated since. The estimate
//! counts a key filled twice with no invalidation between (evicted, then read again) twice,
//! and so grows without end on a large store whose tail comes and goes; hence the bars: at
//! least [`LEAST`] keys, [`RATIO`] times the store's entries, and at most [`MOST_HELD`]
//! entries. A renewal then costs at most one fill in [`RATIO`] of those since the last, and
//! a read or two per hot key while the new lane connects.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Fewest keys estimated tracked, net, before a renewal.
pub(super) const LEAST: u64 = 65_536;
/// Keys estimated tracked per entry held, at least, before a renewal.
pub(super) const RATIO: u64 = 64;
/// Most entries the store may hold for a renewal: what it drops is refilled in moments.
pub(super) const MOST_HELD: usize = 4096;

/// The fills and invalidations counted when the estimate last started from zero.
#[derive(Debug, Default)]
pub(super) struct Renewal {
    /// Fills started, less keys invalidated by Redis, counted at the last rebase (wrapping).
    base: AtomicU64,
}

impl Renewal {
    /// Starts the estimate from zero: a lane came up, or the lanes are being renewed.
    pub(super) fn rebase(&self, fills: u64, invalidations: u64) {
        self.base.store(fills.wrapping_sub(invalidations), Relaxed);
    }

    /// Keys estimated tracked for the lanes, from the totals of fills and invalidations.
    pub(super) fn tracked(&self, fills: u64, invalidations: u64) -> u64 {
        let net = fills.wrapping_sub(invalidations);
        let since = net.wrapping_sub(self.base.load(Relaxed));
        // Invalidations of keys tracked before the base outnumbered fills since: none.
        if since > u64::MAX / 2 { 0 } else { since }
    }

    /// Whether the lanes are due for a renewal, with `entries` in the store; if so the
    /// estimate starts again from zero.
    pub(super) fn due(&self, fills: u64, invalidations: u64, entries: usize) -> bool {
        let tracked = self.tracked(fills, invalidations);
        let due = tracked >= LEAST && tracked / RATIO >= entries as u64 && entries <= MOST_HELD;
        if due {
            self.rebase(fills, invalidations);
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewed_only_when_many_keys_are_tracked_for_few_held() {
        let r = Renewal::default();
        assert!(!r.due(LEAST - 1, 0, 0), "too few keys tracked");
        assert!(
            !r.due(LEAST + 10_000, 10_001, 0),
            "invalidated keys are not tracked"
        );
        let tracked = 4 * LEAST;
        assert!(
            !r.due(tracked, 0, (tracked / RATIO + 1) as usize),
            "a store that holds many"
        );
        assert!(r.due(tracked, 0, (tracked / RATIO) as usize));
        assert!(
            !r.due(tracked * 1000, 0, MOST_HELD + 1),
            "a large store, however many"
        );
        // Counted afresh from the renewal on.
        assert_eq!(r.tracked(tracked, 0), 0);
        assert!(!r.due(tracked + LEAST - 1, 0, 0));
        assert!(r.due(tracked + LEAST, 0, 0));
    }

    #[test]
    fn more_invalidations_than_fills_since_the_base_estimate_none() {
        let r = Renewal::default();
        r.rebase(1_000, 0);
        assert_eq!(r.tracked(1_000, 500), 0);
        assert!(!r.due(1_000, 500, 0));
        assert_eq!(r.tracked(1_000 + LEAST + 500, 500), LEAST);
    }
}
