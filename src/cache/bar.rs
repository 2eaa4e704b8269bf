//! How many reads above the sketch's noise floor a key needs to be admitted: the bar
//! `hot_threshold` sets, lowered step by step towards `hot_threshold_min` while the cache
//! serves most GETs, and raised back as its share falls.
//!
//! Why: a fill costs Redis a tracked read and corral its handling; an entry repays it by the
//! hits it serves before it ends. On a skewed load that the cache already serves, the keys
//! just under the bar are read again and again, and entries there last (no writes end them).
//! Zipf GETs over 1M keys, -P 16, bars of 6 (the default) and 2 (`scripts/ab.sh`, three
//! rounds): about 33,000 and 100,000 entries, 70% and 77% of GETs hit, 1.00-1.05M and
//! 1.12-1.15M requests/s at the same corral CPU per request (0.49-0.51 against 0.46-0.50 µs).
//! But on GETs spread evenly over 1M keys, a bar of 2 admits keys read twice by chance,
//! fills that few hits repay: corral's CPU per request 1.5x the default bar's. The share of
//! GETs served tells the two apart (about 70% against none). The hits per fill of the keys
//! under the default bar do not: on both loads they grow as the entries do (1.4 to 15 and
//! 0.3 to 2.9 over 12 s).
//!
//! A lower bar admits more of whatever tail the load has. A workload whose hits come from a
//! few hot keys while most of its GETs spread over a large key space (its share served near
//! one half) fills more of that spread; `hot_threshold_min = hot_threshold` keeps the bar
//! where it is set.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

use tokio::task::JoinHandle;

use super::coherence::Core;

/// The bar comes down one step per look (`served.rs`) while the cache serves at least one
/// GET in this many.
pub(super) const LOWER_AT: u64 = 2;
/// The bar goes up one step per look while the cache serves fewer than one GET in this many.
pub(super) const RAISE_AT: u64 = 4;

/// The admission bar, over the noise floor.
#[derive(Debug)]
pub(super) struct Bar {
    top: u8,
    least: u8,
    now: AtomicU8,
}

impl Bar {
    /// A bar at `top`, which may come down to `least` (at most `top`).
    pub(super) fn new(top: u8, least: u8) -> Bar {
        Bar {
            top,
            least: least.min(top),
            now: AtomicU8::new(top),
        }
    }

    /// The bar now.
    #[inline]
    pub(super) fn get(&self) -> u8 {
        self.now.load(Relaxed)
    }

    /// The bar as set, before any lowering.
    pub(super) fn top(&self) -> u8 {
        self.top
    }

    /// Moves the bar one step after a period in which the cache saw `gets` GETs and served
    /// `served` of them; straight back to the top if the entries filled lately do not last
    /// (`lasting.rs`: writes end them before they repay their fills, so more fills would
    /// only be ended young too). A period with no GET leaves it where it is. Returns whether
    /// the bar came back to the top from below it.
    pub(super) fn follow(&self, gets: u64, served: u64, fills_last: bool) -> bool {
        let now = self.get();
        let next = if !fills_last {
            self.top
        } else if gets == 0 {
            now
        } else if served.saturating_mul(LOWER_AT) >= gets {
            now.saturating_sub(1).max(self.least)
        } else if served.saturating_mul(RAISE_AT) < gets {
            now.saturating_add(1).min(self.top)
        } else {
            now
        };
        self.now.store(next, Relaxed);
        next == self.top && now < self.top
    }
}

/// After a period in which the cache saw `gets` GETs and served `served` of them: moves the
/// bar, and if that brought it back to the top, drops the entries whose keys the top bar
/// would not admit now.
///
/// Why: the entries a lowered bar let in stay until they expire (`max_age_ms`, a minute by
/// default) or a write ends them, and the load that no longer pays for them still pays for
/// them being there: on the 90/10 mix right after Zipf GETs, 100,000 entries instead of
/// 35,000 kept far fewer of its GETs from the store's lookups (presence counts a slot for
/// each), and corral's CPU per request at 0.51-0.54 µs against 0.42-0.43 for 20 s.
///
/// The store is gone through on a blocking thread, a few buckets under a read lock at a
/// time (see `Table::retain`): a worker thread serves its clients meanwhile. A large store
/// the sweep would keep only a few entries of is cleared instead (`Store::retain`). One sweep at a
/// time: none starts while one is under way. Returns that sweep's handle.
pub(super) fn follow(core: &Arc<Core>, gets: u64, served: u64) -> Option<JoinHandle<()>> {
    if !core.admission.follow_served(gets, served) || core.store.sweeping() {
        return None;
    }
    let core = core.clone();
    Some(tokio::task::spawn_blocking(move || {
        core.store.retain(|hash| core.admission.hot_at_top(hash));
    }))
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::super::admission::Admission;
    use super::super::entry::Entry;
    use super::super::value::Value;
    use super::*;

    #[test]
    fn the_bar_comes_down_while_most_gets_are_served_and_goes_back_up_as_fewer_are() {
        let bar = Bar::new(6, 2);
        assert!(!bar.follow(1000, 499, true));
        assert_eq!(bar.get(), 6, "under one GET in 2 served");
        assert!(!bar.follow(1000, 700, true));
        assert_eq!(bar.get(), 5, "one step per look");
        for _ in 0..10 {
            bar.follow(1000, 700, true);
        }
        assert_eq!(bar.get(), 2, "never under the least");
        bar.follow(1000, 300, true);
        assert_eq!(bar.get(), 2, "between one in 4 and one in 2: held");
        bar.follow(0, 0, true);
        assert_eq!(bar.get(), 2, "no GET: held");
        assert!(!bar.follow(1000, 249, true));
        assert_eq!(bar.get(), 3, "under one in 4 served");
        assert!(bar.follow(1000, 700, false), "back at the top");
        assert_eq!(bar.get(), 6, "fills ended young: back to the top at once");
        for _ in 0..10 {
            assert!(!bar.follow(1000, 0, true), "already at the top");
        }
        assert_eq!(bar.get(), 6, "never over the top");
    }

    fn put(core: &Core, key: &[u8]) {
        let e = Entry::new(
            key,
            Value::bulk(b"v"),
            Instant::now() + Duration::from_secs(60),
            Duration::ZERO,
            Duration::ZERO,
        );
        core.store.insert(e);
    }

    fn read(core: &Core, key: &[u8], times: usize) {
        for _ in 0..times {
            core.admission.record_get(core.admission.hash(key), key);
        }
    }

    #[tokio::test]
    async fn back_at_the_top_the_bar_drops_the_entries_it_would_not_admit_now() {
        let core = Arc::new(Core::for_test_with(
            Admission::new(1024, 4, 1.0).lowering_to(1),
        ));
        for _ in 0..3 {
            assert!(follow(&core, 100, 100).is_none());
        }
        read(&core, b"hot", 6);
        read(&core, b"warm", 2);
        assert!(!core.admission.hot_at_top(core.admission.hash(b"warm")));
        for key in [b"hot".as_slice(), b"warm", b"cold"] {
            put(&core, key);
        }
        let held = |key: &[u8]| core.store.contains(key);
        for _ in 0..2 {
            assert!(follow(&core, 100, 0).is_none());
        }
        assert!(held(b"warm") && held(b"cold"), "raised, not yet to the top");
        let warm = core
            .store
            .get(b"warm", core.store.hash(b"warm"), Instant::now(), true, 0)
            .expect("held");
        let sweep = follow(&core, 100, 0).expect("back at the top");
        sweep.await.unwrap();
        assert!(held(b"hot"), "read often enough for the top bar");
        assert!(!held(b"warm") && !held(b"cold"));
        assert!(!warm.live(), "retired: no front serves it");
        assert!(!core.presence.counts(core.admission.hash(b"warm")).any());
        put(&core, b"warm");
        assert!(follow(&core, 100, 0).is_none(), "already at the top");
        assert!(held(b"warm"), "only a return to the top drops entries");
    }

    #[test]
    fn a_lowered_bar_admits_keys_read_fewer_times() {
        let core = Arc::new(Core::for_test_with(
            Admission::new(1024, 4, 1.0).lowering_to(2),
        ));
        let hash = core.admission.hash(b"k");
        read(&core, b"k", 2);
        let reads = core.admission.estimate(hash);
        assert!(!core.admission.hot(reads, hash), "two reads, a bar of 4");
        follow(&core, 100, 50);
        follow(&core, 100, 50);
        assert!(
            core.admission.hot(reads, hash),
            "half the GETs served: a bar of 2"
        );
    }

    #[test]
    fn a_least_at_or_over_the_top_keeps_the_bar_where_it_is_set() {
        for least in [6, 9] {
            let bar = Bar::new(6, least);
            bar.follow(1000, 1000, true);
            assert_eq!(bar.get(), 6);
            assert_eq!(bar.top(), 6);
        }
    }
}
