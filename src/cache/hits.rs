//! A GET served locally: on a warm connection, looked for in this thread's front first
//! ([`Core::begin`]), and counted as a hit wherever it was found.

use std::sync::Arc;
use std::time::Instant;

use super::admission::one_in;
use super::clock::Clock;
use super::coherence::Core;
use super::entry::Entry;
use super::lane::LaneHandle;
use super::read::{Lookup, Route};
use super::value::Value;

/// A front hit is counted in the read sketch (with what counting does besides: the slot's
/// standing, the key noted as read lately) one time in this many, the rest served straight
/// from the front. The sketch's count was the dearest part of a hit, mostly a wait for the
/// key's counters: with every GET a hit (2,000 keys, 50 clients, -P 64), perf put the count
/// at 18-19 ns per hit before and 4-5 after, the lookup's whole part 10-14 ns lower. A key
/// the front serves is read often: a quarter of its reads keeps its estimate above the bar,
/// and a write still finds it read lately.
const COUNT_FRONT_HITS: u64 = 4;

/// How [`Core::begin`] left a GET's lookup.
pub(super) enum Begun<R> {
    /// Served from this thread's front: what the server returned.
    Served(R),
    /// To be looked up in the store ([`Core::lookup_store`]); `front`, in the front too.
    Store {
        /// The front was not looked at: a hit counted in the read sketch is looked for there.
        front: bool,
    },
}

impl Core {
    /// The start of every GET's lookup: the GET counted in its connection's window and, on a
    /// warm connection, looked for in this thread's front, which serves it (handing the entry
    /// to `serve`, which may decline it) uncounted but for one in `COUNT_FRONT_HITS`: see
    /// that constant. `lane` gives the lane to refresh the entry over, if its expiry is near.
    #[inline]
    pub(super) fn begin<R>(
        self: &Arc<Self>,
        key: &[u8],
        hash: u64,
        lane: &impl Fn() -> Option<Arc<LaneHandle>>,
        clock: &mut Clock,
        serve: impl FnOnce(&Arc<Entry>) -> Option<R>,
    ) -> Begun<R> {
        clock.counted(|| self.admission.fills_last());
        if !clock.warm() {
            return Begun::Store { front: false };
        }
        if one_in(COUNT_FRONT_HITS) {
            return Begun::Store { front: true };
        }
        let now = clock.now();
        let served = self.store.front_hit(key, hash, now, |e| {
            let served = serve(e)?;
            Some((served, self.hit(e, now, clock)))
        });
        let Some((served, refresh)) = served else {
            // Looked at: the store need not look again.
            return Begun::Store { front: false };
        };
        self.admission.sample_hit(hash, key);
        if refresh && let Some(lane) = lane() {
            self.refresh(key, hash, &lane);
        }
        Begun::Served(served)
    }

    /// A hit on `e`, the entry of `key`: counted, and refreshed early if its expiry is near
    /// (XFetch).
    pub(super) fn served<L>(
        self: &Arc<Self>,
        key: &[u8],
        hash: u64,
        e: Arc<Entry>,
        route: &Route<'_, L>,
        clock: &mut Clock,
    ) -> Lookup
    where
        L: Fn() -> Option<Arc<LaneHandle>>,
    {
        let now = clock.now();
        self.admission.sample_touch(hash, key);
        if self.hit(&e, now, clock)
            && let Some(lane) = (route.lane)()
        {
            self.refresh(key, hash, &lane);
        }
        Lookup::Hit(Value::Cached(e))
    }

    /// Counts a hit on `e` at `now`: whether the entry is to be refreshed early (XFetch).
    #[inline]
    fn hit(&self, e: &Entry, now: Instant, clock: &mut Clock) -> bool {
        clock.hit();
        self.stats.hits.inc();
        e.mark_hit();
        self.admission.should_refresh(e, now)
    }
}
