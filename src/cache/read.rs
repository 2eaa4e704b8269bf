//! Read-through with singleflight: a GET is a local hit, or it starts or joins the one
//! upstream read of its key. Hot keys are read as tracked fills over their lane (and kept);
//! others as a plain GET, sent by the client's connection ([`Lead`]) or here.

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use dashmap::mapref::entry::Entry as MapEntry;

use super::clock::Clock;
use super::coherence::{Core, Key};
use super::flight::{self, Fill, FillRx};
use super::hits::Begun;
use super::lane::LaneHandle;
use super::leads::{Lead, Slot};
use super::presence::Held;
use super::tracking::{LaneState, Tracking};
use super::value::Value;
use crate::error::UpstreamError;
use crate::resp::encode::encode_pttl_get;
use crate::upstream::{JobResult, ReplyTo, UpstreamConn};

/// Outcome of a GET lookup.
#[derive(Debug)]
pub enum Lookup {
    /// Served from the local cache.
    Hit(Value),
    /// A cold key: forward the GET as it is. Nothing waits for its reply.
    Forward,
    /// Wait for an upstream read (started now, or joined).
    Wait(FillRx),
    /// This GET is the read others may join: the caller sends it in its own batch and hands
    /// its reply to [`Lead::complete`] (from the connection task, so a client that goes away
    /// cancels nothing).
    Lead(Lead),
}

/// Completes a read from the upstream connection's task; if the job is dropped unanswered
/// (shutdown), its waiters get an error instead of waiting.
struct Completer {
    core: Arc<Core>,
    key: Key,
    fill: Arc<Fill>,
    tracked: bool,
}

impl Completer {
    fn run(self, r: JobResult) {
        if self.tracked {
            self.core.complete_fill(&self.key, &self.fill, r);
        } else {
            self.core.complete_read(&self.key, &self.fill, r);
        }
    }
}

impl Drop for Completer {
    fn drop(&mut self) {
        self.fill.publish(Err(UpstreamError::ShuttingDown));
    }
}

/// Where a GET's read may go: `conn` (the client's upstream, where a plain read returned as a
/// lead goes), or the lane `lane` finds for the key's node, if any.
pub(super) struct Route<'a, L: Fn() -> Option<Arc<LaneHandle>>> {
    pub(super) conn: &'a UpstreamConn,
    pub(super) lane: L,
}

impl Core {
    /// Whether a cool connection's GET of `key` is forwarded with no lookup: see
    /// [`COOL_WINDOW`](super::clock::COOL_WINDOW).
    #[inline]
    pub(super) fn skips(&self, hash: u64, clock: &mut Clock) -> bool {
        if !clock.cool() || self.presence.may_hold(hash) || clock.samples_cool() {
            return false;
        }
        clock.skipped += 1;
        clock.counted(|| self.admission.fills_last());
        true
    }

    /// A GET of `key`: see [`super::Cache::get`].
    pub(super) fn lookup<L>(
        self: &Arc<Self>,
        key: &[u8],
        hash: u64,
        route: Route<'_, L>,
        clock: &mut Clock,
    ) -> Lookup
    where
        L: Fn() -> Option<Arc<LaneHandle>>,
    {
        match self.begin(key, hash, &route.lane, clock, |e| Some(e.clone())) {
            Begun::Served(e) => Lookup::Hit(Value::Cached(e)),
            Begun::Store { front } => self.lookup_store(key, hash, route, clock, front),
        }
    }

    /// The rest of a GET's lookup once [`Core::begin`] did not serve it: the GET counted in
    /// the read sketch, then a hit in the store (looked for in the front too if `front`), or
    /// an upstream read.
    pub(super) fn lookup_store<L>(
        self: &Arc<Self>,
        key: &[u8],
        hash: u64,
        route: Route<'_, L>,
        clock: &mut Clock,
        front: bool,
    ) -> Lookup
    where
        L: Fn() -> Option<Arc<LaneHandle>>,
    {
        let reads = self.admission.record_get(hash, key);
        let resident = reads.warm;
        // Only a key warm enough to be cached is looked for (see `Admission::may_be_cached`),
        // and only if it may have an entry.
        let counts = resident.then(|| self.presence.counts(hash));
        if let Some(e) = counts
            .is_some_and(|c| c.entry())
            .then(|| self.store.get(key, hash, clock.now(), front, reads.count))
            .flatten()
        {
            return self.served(key, hash, e, &route, clock);
        }
        self.stats.misses.inc();
        // A cold key (see `recent.rs`), or one barely above the noise (`Reads::settled`):
        // neither cached nor, most likely, read by anyone else now. It costs nothing more
        // than forwarding.
        if !reads.settled && !self.recent.read_again(hash) {
            self.stats.reads.inc();
            return Lookup::Forward;
        }
        let now = clock.now();
        let reading = counts.unwrap_or_else(|| self.presence.counts(hash)).read();
        // A read in flight may have run before a write of the key Redis has not acknowledged
        // yet, whose value this client may have read already (`unacked.rs`): not joined.
        if reading && self.unacked.held(hash) {
            self.stats.reads.inc();
            return Lookup::Forward;
        }
        // Another client's read is in flight: wait for it. A bare read first: nearly every
        // read joined is one (keys not cached), and its map is keyed by the hash in hand,
        // where `fills` hashes the key again.
        if reading {
            if let Some(mut slot) = self.leads.get_mut(&hash)
                && slot.is_for(key)
                && slot.joinable(now, self.join_bound)
                && clock.may_join(slot.started)
            {
                let rx = self.join_lead(&mut slot, Some(route.conn));
                return self.joined(rx, clock);
            }
            if let Some(f) = self.fills.get(key)
                && f.joinable(now, self.join_bound)
                && clock.may_join(f.started)
            {
                return self.joined(f.waiter(), clock);
            }
        }
        // The lane is looked for only for a key hot enough to be admitted over it: its handle
        // is reference counted, and a clone and drop are two locked operations, each of which
        // also waits for the stores before it (2.9 ns per request on the 90/10 mix).
        let lane = self
            .admission
            .hot(reads.count, hash)
            .then(|| (route.lane)())
            .flatten()
            .filter(|l| self.admission.admit(reads.count, hash, &l.info));
        // A key written lately is not worth a read others join (`written.rs`), unless it is
        // admitted: then its tracked fill is what its next GETs hit. Nor, while reads are
        // left alone (`lone.rs`), is one nobody else read lately.
        if lane.is_none() && self.admission.written_lately(hash) {
            self.stats.reads.inc();
            return Lookup::Forward;
        }
        if self.lone.read_to_lead() && lane.is_none() && !reading && !self.recent.read_again(hash) {
            self.stats.reads.inc();
            return Lookup::Forward;
        }
        self.read_led(key, hash, now, lane, route.conn, clock)
    }

    /// The read of a GET: a plain read is a lead. Every read of the key is
    /// registered, and every read to join is looked for, under the lock of the key's shard of
    /// `leads`: of GETs racing here on several threads, one reads (a lead, or a tracked fill
    /// if the key is admitted) and the rest join it. A GET that found no read in flight
    /// before it counted the key past the admission bar would otherwise start a tracked fill
    /// beside the lead another thread was registering.
    fn read_led(
        self: &Arc<Self>,
        key: &[u8],
        hash: u64,
        now: Instant,
        lane: Option<Arc<LaneHandle>>,
        conn: &UpstreamConn,
        clock: &mut Clock,
    ) -> Lookup {
        let mut slot = self.leads.entry(hash);
        let ours = matches!(&slot, MapEntry::Occupied(o) if o.get().is_for(key));
        if let MapEntry::Occupied(o) = &mut slot
            && ours
            && o.get().joinable(now, self.join_bound)
            && clock.may_join(o.get().started)
        {
            let rx = self.join_lead(o.get_mut(), Some(conn));
            return self.joined(rx, clock);
        }
        // A read of the key sent too long ago (stuck behind a dead connection, say) is not
        // joined: a new one takes its place (its waiters stay in `joined`).
        if let Some(lane) = lane {
            let key = Key::from(key);
            let info = Some(lane.info.clone());
            let fill = self.register(&key, hash, now, clock, info, &lane.conn);
            match slot {
                MapEntry::Occupied(o) if ours => {
                    o.remove();
                    self.presence.remove(hash, Held::Read);
                }
                // Unlocked before the fill is sent.
                other => drop(other),
            }
            return match fill {
                Ok(fill) => self.start_tracked(key, hash, fill, &lane, clock),
                Err(rx) => self.joined(rx, clock),
            };
        }
        // A tracked fill of the key, registered by a GET that counted it past the bar.
        if self.presence.counts(hash).read()
            && let Some(f) = self.fills.get(key)
            && f.joinable(now, self.join_bound)
            && clock.may_join(f.started)
        {
            let rx = f.waiter();
            return self.joined(rx, clock);
        }
        let id = flight::lead_id();
        let registered = match slot {
            MapEntry::Occupied(mut o) if ours => {
                o.insert(Slot::new(id, now, key));
                true
            }
            // A read of another key with the same hash is in flight: this one is sent
            // unregistered.
            MapEntry::Occupied(_) => false,
            MapEntry::Vacant(v) => {
                self.presence.add(hash, Held::Read);
                v.insert(Slot::new(id, now, key));
                true
            }
        };
        if registered {
            self.epochs.registered(hash);
        }
        self.stats.reads.inc();
        Lookup::Lead(Lead::new(self.clone(), hash, id))
    }

    /// A GET that joined a read in flight waits for `rx`.
    fn joined(&self, rx: FillRx, clock: &mut Clock) -> Lookup {
        self.stats.coalesced.inc();
        clock.joined();
        Lookup::Wait(rx)
    }

    /// Waits for the bare read in `slot`: the first GET to join creates the `Fill` the
    /// waiters share and hands it to the read through `joined`.
    pub(super) fn join_lead(&self, slot: &mut Slot, conn: Option<&UpstreamConn>) -> FillRx {
        if let Some(f) = &slot.joined {
            return f.waiter();
        }
        let fill = Fill::new(Key::from(slot.key()), slot.started, None, conn.cloned());
        // Under the map's lock: the read either finds this in `joined` or completed before,
        // and then this GET found no slot.
        self.joined.insert(slot.id, fill.clone());
        slot.joined = Some(fill.clone());
        fill.waiter()
    }

    /// A later GET of the key a GET of the same round led the read `id` of (`hash` its
    /// hash): that read joined, counted as a GET and a join would be, if it is still the
    /// key's; `None` once an invalidation unlinked it (or a newer read took its place).
    pub(super) fn rejoin_lead(
        &self,
        key: &[u8],
        hash: u64,
        id: u64,
        conn: &UpstreamConn,
        clock: &mut Clock,
    ) -> Option<FillRx> {
        let rx = {
            let mut slot = self.leads.get_mut(&hash)?;
            if slot.id != id {
                return None;
            }
            self.join_lead(&mut slot, Some(conn))
        };
        self.count_join(key, hash, clock);
        Some(rx)
    }

    /// A GET of `key` (`hash` its hash) that joins a read it did not look up: counted in the
    /// read sketch and as a miss, as looking it up would have, and as a join.
    pub(super) fn count_join(&self, key: &[u8], hash: u64, clock: &mut Clock) {
        self.admission.record_get(hash, key);
        self.stats.misses.inc();
        self.stats.coalesced.inc();
        clock.joined();
    }

    /// Registers a read of `key` in `fills` (a tracked fill if `lane` is the lane's state, a
    /// plain read otherwise, sent over `conn`), or finds the read in flight to join (`Err`).
    fn register(
        &self,
        key: &Key,
        hash: u64,
        now: Instant,
        clock: &Clock,
        lane: Option<Arc<LaneState>>,
        conn: &UpstreamConn,
    ) -> Result<Arc<Fill>, FillRx> {
        let fill = match self.fills.entry(key.clone()) {
            MapEntry::Occupied(o)
                if o.get().joinable(now, self.join_bound) && clock.may_join(o.get().started) =>
            {
                return Err(o.get().waiter());
            }
            // A stale read is replaced: it can no longer insert.
            MapEntry::Occupied(mut o) => {
                let fill = Fill::new(key.clone(), now, lane, Some(conn.clone()));
                o.insert(fill.clone());
                fill
            }
            MapEntry::Vacant(v) => {
                let fill = Fill::new(key.clone(), now, lane, Some(conn.clone()));
                self.presence.add(hash, Held::Read);
                v.insert(fill.clone());
                fill
            }
        };
        self.epochs.registered(hash);
        Ok(fill)
    }

    /// Sends the `n` commands in `req` for `fill`, to be completed as a tracked fill or a
    /// plain read.
    fn send(
        self: &Arc<Self>,
        conn: &UpstreamConn,
        req: Bytes,
        n: u32,
        key: Key,
        fill: Arc<Fill>,
        tracked: bool,
    ) {
        let core = self.clone();
        let done = Completer {
            core,
            key,
            fill,
            tracked,
        };
        let reply = ReplyTo::Call(Box::new(move |r| done.run(r)));
        conn.try_send_to(req, n, reply);
    }

    /// Sends the tracked fill `fill` of `key` over `lane`; the GET waits for it.
    fn start_tracked(
        self: &Arc<Self>,
        key: Key,
        hash: u64,
        fill: Arc<Fill>,
        lane: &LaneHandle,
        clock: &mut Clock,
    ) -> Lookup {
        if self.admission.filled() {
            clock.filled();
        }
        // Redis tracks the key from now on (a refresh's key it tracks already).
        self.renewal.filled(hash);
        let rx = fill.waiter();
        self.start_fill(key, fill, lane);
        Lookup::Wait(rx)
    }

    /// Sends a tracked fill for `key` over the lane.
    fn start_fill(self: &Arc<Self>, key: Key, fill: Arc<Fill>, lane: &LaneHandle) {
        self.stats.fills.inc();
        // With tracking on, no MULTI around the pair: PTTL makes the lane track the key, so a
        // write between the two sends its invalidation between their replies, and the lane
        // applies it (unlinking this fill) before the fill completes. Without tracking (the
        // TTL-only fallback) nothing would, so the pair runs as one transaction.
        let (req, n) = if lane.info.tracking() == Tracking::On {
            (Bytes::from(encode_pttl_get(&key)), 2)
        } else {
            const MULTI: &[u8] = b"*1\r\n$5\r\nMULTI\r\n";
            const EXEC: &[u8] = b"*1\r\n$4\r\nEXEC\r\n";
            (
                Bytes::from([MULTI, &encode_pttl_get(&key), EXEC].concat()),
                4,
            )
        };
        self.send(&lane.conn, req, n, key, fill, true);
    }

    /// Starts a background refresh of `key` unless a read is already in flight.
    pub(super) fn refresh(self: &Arc<Self>, key: &[u8], hash: u64, lane: &LaneHandle) {
        let key = Key::from(key);
        let fill = match self.fills.entry(key.clone()) {
            MapEntry::Occupied(_) => return,
            MapEntry::Vacant(v) => {
                let fill = Fill::new(
                    key.clone(),
                    Instant::now(),
                    Some(lane.info.clone()),
                    Some(lane.conn.clone()),
                );
                self.presence.add(hash, Held::Read);
                v.insert(fill.clone());
                fill
            }
        };
        self.epochs.registered(hash);
        self.stats.refreshes.inc();
        self.start_fill(key, fill, lane);
    }

    /// Local hits for an MGET: see [`super::Cache::get_many`].
    pub(super) fn get_many<'a>(&self, keys: impl Iterator<Item = &'a [u8]>) -> Vec<Option<Value>> {
        let now = Instant::now();
        keys.map(|key| {
            let hash = self.admission.hash(key);
            let reads = self.admission.record_read(hash);
            match self.store.get(key, hash, now, true, reads) {
                // MGET answers nil, not an error, for other types; only strings and nil are
                // ever cached, so a hit reads the same either way.
                Some(e) => {
                    self.stats.hits.inc();
                    e.mark_hit();
                    self.admission.sample_touch(hash, key);
                    Some(Value::Cached(e))
                }
                None => {
                    self.stats.misses.inc();
                    None
                }
            }
        })
        .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Barrier;

    use tokio_util::sync::CancellationToken;

    use super::super::clock::{COOL_SAMPLE, COOL_WINDOW, HIT_RATE, JOIN_RATE, WARM_AGAIN_RATE};
    use super::super::entry::Entry;
    use super::*;
    use crate::config::{Config, UpstreamUrl};
    use crate::upstream::{Access, ConnSettings, UpstreamAccess, UpstreamStatus};

    /// A connection nothing is sent on: a lead's read is the caller's to send.
    fn idle_conn() -> UpstreamConn {
        conn_to("redis://127.0.0.1:1")
    }

    /// A connection to `url`.
    fn conn_to(url: &str) -> UpstreamConn {
        let url = UpstreamUrl::parse(url).expect("a valid URL");
        let access = Arc::new(UpstreamAccess::new(Access::default()));
        let settings = ConnSettings::new(&Config::default(), &url, access);
        let status = Arc::new(UpstreamStatus::default());
        UpstreamConn::spawn(settings, status, CancellationToken::new(), None)
    }

    /// Runs one window of GETs through `clock` (which must be at a window's start), a hit
    /// every `hit_every` GETs and a join every `join_every` (0: none), while the cache's
    /// fills last.
    fn window(clock: &mut Clock, hit_every: u32, join_every: u32) {
        window_lasting(clock, hit_every, join_every, true);
    }

    /// [`window`], with the cache's fills lasting or not.
    fn window_lasting(clock: &mut Clock, hit_every: u32, join_every: u32, fills_last: bool) {
        for i in 0..COOL_WINDOW {
            if hit_every > 0 && i.is_multiple_of(hit_every) {
                clock.hit();
            }
            if join_every > 0 && i.is_multiple_of(join_every) {
                clock.joined();
            }
            clock.counted(|| fills_last);
        }
    }

    /// A front hit whose server declines it is neither served nor counted: the store's part
    /// of the lookup then serves it as usual. One it takes is counted as any hit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_declined_front_hit_is_left_to_the_store() {
        let core = Arc::new(Core::for_test());
        let conn = idle_conn();
        let (key, hash) = (b"front".as_slice(), core.admission.hash(b"front"));
        let expires = Instant::now() + std::time::Duration::from_secs(60);
        let quick = std::time::Duration::ZERO;
        core.store
            .insert(Entry::new(key, Value::Nil, expires, quick, quick));
        let mut clock = Clock::default();
        let route = || Route {
            conn: &conn,
            lane: || None,
        };
        // Into the front, and the connection warm.
        assert!(matches!(
            core.lookup(key, hash, route(), &mut clock),
            Lookup::Hit(_)
        ));
        clock.reset();
        let (mut declined, mut served) = (0, 0);
        for _ in 0..40 {
            let hits = core.stats.hits.get();
            match core.begin(key, hash, &|| None, &mut clock, |_| None::<()>) {
                Begun::Served(()) => panic!("served though declined"),
                Begun::Store { front } => {
                    assert_eq!(core.stats.hits.get(), hits, "a declined hit counted");
                    declined += usize::from(!front);
                    let lookup = core.lookup_store(key, hash, route(), &mut clock, front);
                    assert!(matches!(lookup, Lookup::Hit(_)));
                    assert_eq!(core.stats.hits.get(), hits + 1);
                }
            }
            let hits = core.stats.hits.get();
            let begun = core.begin(key, hash, &|| None, &mut clock, |e| Some(e.clone()));
            if let Begun::Served(e) = begun {
                assert_eq!(e.reply_len(), 5);
                assert_eq!(core.stats.hits.get(), hits + 1);
                served += 1;
            }
        }
        // Three in four are looked for in the front; the rest are sampled for counting.
        assert!(
            declined > 15 && served > 15,
            "{declined} declined, {served} served"
        );
    }

    /// A warm connection's hits on an entry in this thread's front are served from there,
    /// and only some of them counted in the read sketch; a key whose entry left is not
    /// served from it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn front_hits_are_served_and_counted_one_time_in_a_few() {
        let core = Arc::new(Core::for_test());
        let conn = idle_conn();
        let (key, hash) = (b"front".as_slice(), core.admission.hash(b"front"));
        let expires = Instant::now() + std::time::Duration::from_secs(60);
        let value = Value::Nil;
        // No fill time, and so no early refresh.
        let quick = std::time::Duration::ZERO;
        core.store
            .insert(Entry::new(key, value, expires, quick, quick));
        let mut clock = Clock::default();
        let get = |clock: &mut Clock| {
            let route = Route {
                conn: &conn,
                lane: || None,
            };
            matches!(core.lookup(key, hash, route, clock), Lookup::Hit(_))
        };
        // A cold connection's first GET takes the full path: counted, and put in the front.
        assert!(get(&mut clock));
        clock.reset();
        let first = core.admission.estimate(hash);
        assert!((0..12).all(|_| get(&mut clock)), "served from the front");
        let after = core.admission.estimate(hash);
        assert!(after < first + 12, "every hit counted: {first} -> {after}");
        assert!((0..60).all(|_| get(&mut clock)));
        assert!(
            core.admission.estimate(hash) > first,
            "no hit counted in 72"
        );
        assert!(core.store.remove(key).is_some());
        assert!((0..20).all(|_| !get(&mut clock)), "the entry left");
    }

    /// A connection with fewer than one hit in [`HIT_RATE`] GETs and one join in
    /// [`JOIN_RATE`] over a window turns cool: its GETs of keys with nothing here are then
    /// skipped, bar a sample; a key with something here never is.
    #[test]
    fn a_connection_cools_over_a_window_with_few_hits_and_joins() {
        let core = Core::for_test();
        let mut clock = Clock::default();
        // Hits and joins each just under their bar: cool after the window.
        window(&mut clock, HIT_RATE + 1, JOIN_RATE + 1);
        assert!(clock.cool());
        let n = 1600;
        let skipped = (0..n)
            .filter(|i| core.skips(core.admission.hash(format!("k{i}").as_bytes()), &mut clock))
            .count();
        let expected = n - n / COOL_SAMPLE as usize;
        assert!(
            (expected - 100..n).contains(&skipped),
            "{skipped} of {n} skipped, about {expected} expected"
        );
        assert_eq!(clock.skipped, skipped as u64);
        let hash = core.admission.hash(b"present");
        core.presence.add(hash, Held::Read);
        assert!((0..100).all(|_| !core.skips(hash, &mut clock)));
        core.presence.remove(hash, Held::Read);
    }

    /// A cool connection turns warm again after a window with one hit in
    /// [`WARM_AGAIN_RATE`], too few to keep a warm one warm; or one join in [`JOIN_RATE`],
    /// which keeps it warm with no hits at all.
    #[test]
    fn a_cool_connection_warms_on_fewer_hits_than_keep_it_warm() {
        const { assert!(WARM_AGAIN_RATE > HIT_RATE + 1) };
        for (hit_every, join_every) in [(WARM_AGAIN_RATE, 0), (0, JOIN_RATE)] {
            let mut clock = Clock::default();
            window(&mut clock, WARM_AGAIN_RATE + 1, 0);
            assert!(clock.cool());
            window(&mut clock, WARM_AGAIN_RATE + 1, 0);
            assert!(clock.cool(), "just under the bar to warm again");
            window(&mut clock, hit_every, join_every);
            assert!(
                !clock.cool(),
                "hit every {hit_every}, join every {join_every}"
            );
            window(&mut clock, hit_every, join_every);
            assert_eq!(clock.cool(), join_every == 0, "warm: the same window again");
        }
    }

    /// Where writes end the cache's entries young, a cool connection needs as many hits to
    /// turn warm again as a warm one needs to stay warm.
    #[test]
    fn a_cool_connection_warms_on_the_higher_bar_while_fills_do_not_last() {
        let mut clock = Clock::default();
        window_lasting(&mut clock, WARM_AGAIN_RATE + 1, 0, false);
        assert!(clock.cool());
        window_lasting(&mut clock, WARM_AGAIN_RATE, 0, false);
        assert!(clock.cool(), "enough to warm while fills last, not now");
        window_lasting(&mut clock, HIT_RATE, 0, false);
        assert!(!clock.cool(), "a warm connection's bar");
        window_lasting(&mut clock, HIT_RATE, 0, false);
        assert!(!clock.cool(), "and it stays warm on it");
    }

    /// A lane whose connection never answers: a fill sent over it stays in flight. The
    /// listener must outlive the lane's use.
    fn silent_lane() -> (Arc<LaneHandle>, std::net::TcpListener) {
        let silent = std::net::TcpListener::bind("127.0.0.1:0").expect("a loopback port");
        let addr = silent.local_addr().expect("the listener's address");
        let lane = Arc::new(LaneHandle::for_test(conn_to(&format!("redis://{addr}"))));
        (lane, silent)
    }

    /// Reads `key` until the next GET takes it past the admission bar.
    fn one_short_of_the_bar(core: &Core, key: &[u8]) {
        let hash = core.admission.hash(key);
        while !core
            .admission
            .hot(core.admission.record_get(hash, key).count + 1, hash)
        {}
    }

    /// Two GETs in a window that start tracked fills keep a connection warm with no hit, as
    /// long as the cache's fills last; while writes end half of them or more young, they
    /// do not count.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn fills_that_last_keep_a_connection_warm() {
        let core = Arc::new(Core::for_test());
        let conn = idle_conn();
        let (lane, _silent) = silent_lane();
        let mut keys = (0..).map(|i: u32| format!("fill:{i}").into_bytes());
        let mut fill_window = |clock: &mut Clock| {
            let before = core.stats.fills.get();
            for key in keys.by_ref().take(2) {
                one_short_of_the_bar(&core, &key);
                let route = Route {
                    conn: &conn,
                    lane: || Some(lane.clone()),
                };
                drop(core.lookup(&key, core.admission.hash(&key), route, clock));
            }
            for _ in 2..COOL_WINDOW {
                clock.counted(|| true);
            }
            core.stats.fills.get() - before
        };
        let mut clock = Clock::default();
        assert_eq!(fill_window(&mut clock), 2);
        assert!(!clock.cool(), "two fills that last keep it warm");
        // Half the fills since the last look ended young.
        core.admission.entry_ended(1, 0);
        core.admission.look_at_fills();
        assert_eq!(fill_window(&mut clock), 2);
        assert!(
            clock.cool(),
            "fills whose entries writes end young do not count"
        );
        // Those last: the next window's count again.
        core.admission.look_at_fills();
        assert_eq!(fill_window(&mut clock), 2);
        assert!(!clock.cool(), "fills that last warm a cool connection");
    }

    /// Runs two GETs of `key` at once, one with each lane (`None`: the key has none), and
    /// counts the leads they made. Both lookups are held until both ran: a lead dropped ends
    /// its read, and a GET after that rightly starts another.
    fn race(
        core: &Arc<Core>,
        conn: &UpstreamConn,
        key: &[u8],
        lanes: [Option<Arc<LaneHandle>>; 2],
    ) -> u64 {
        let start = Barrier::new(2);
        std::thread::scope(|s| {
            let racers: Vec<_> = lanes
                .into_iter()
                .map(|lane| {
                    let start = &start;
                    s.spawn(move || {
                        let route = Route {
                            conn,
                            lane: || lane.clone(),
                        };
                        start.wait();
                        core.lookup(key, core.admission.hash(key), route, &mut Clock::default())
                    })
                })
                .collect();
            let looked: Vec<Lookup> = racers.into_iter().filter_map(|r| r.join().ok()).collect();
            looked
                .iter()
                .filter(|l| matches!(l, Lookup::Lead(_)))
                .count() as u64
        })
    }

    /// A GET of a key written lately is forwarded where it would have led a read others
    /// join; two looks later (250 to 500 ms) the key leads again. Other keys are not touched.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_key_written_lately_is_forwarded_not_led() {
        let core = Arc::new(Core::for_test());
        let conn = idle_conn();
        let get = |key: &[u8]| {
            // Read once already: the next GET takes the full path and may be joined.
            core.recent.read_again(core.admission.hash(key));
            let route = Route {
                conn: &conn,
                lane: || None,
            };
            core.lookup(key, core.admission.hash(key), route, &mut Clock::default())
        };
        let leads = |key: &[u8]| matches!(get(key), Lookup::Lead(_));
        assert!(leads(b"written"));
        core.admission.record_write(core.admission.hash(b"written"));
        assert!(matches!(get(b"written"), Lookup::Forward));
        assert!(leads(b"unwritten"));
        core.admission.look();
        assert!(matches!(get(b"written"), Lookup::Forward), "one look later");
        core.admission.look();
        assert!(leads(b"written"), "two looks later");
    }

    /// While reads are left alone (`lone.rs`), a GET of a key read before (settled) but not
    /// lately is forwarded where it would have led a read; the next GET of it soon after
    /// leads one. Once joins come back, such a key leads at once again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn while_reads_are_left_alone_a_key_not_read_lately_leads_no_read() {
        let core = Arc::new(Core::for_test());
        let conn = idle_conn();
        let settled = |key: &[u8]| {
            let hash = core.admission.hash(key);
            core.admission.record_get(hash, key);
        };
        let get = |key: &[u8]| {
            let route = Route {
                conn: &conn,
                lane: || None,
            };
            core.lookup(key, core.admission.hash(key), route, &mut Clock::default())
        };
        let leads = |key: &[u8]| matches!(get(key), Lookup::Lead(_));
        settled(b"before");
        assert!(leads(b"before"), "reads not left alone: the key leads");
        for _ in 0..100_000 {
            core.lone.read_to_lead();
        }
        core.lone.follow(0);
        assert!(core.lone.on());
        settled(b"alone");
        assert!(matches!(get(b"alone"), Lookup::Forward), "not read lately");
        assert!(leads(b"alone"), "read again soon after");
        for _ in 0..100_000 {
            core.lone.read_to_lead();
        }
        core.lone.follow(50_000);
        assert!(!core.lone.on(), "joins came back");
        settled(b"joined");
        assert!(leads(b"joined"));
    }

    /// Two GETs of a key read again, racing on two threads, make one lead: the other joins it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn racing_gets_of_a_key_make_one_lead() {
        let core = Arc::new(Core::for_test());
        let conn = idle_conn();
        for i in 0..2_000u32 {
            let key = format!("race:{i}").into_bytes();
            // Read once already: the next GETs take the full path and may be joined.
            core.recent.read_again(core.admission.hash(&key));
            let leads = race(&core, &conn, &key, [None, None]);
            assert_eq!(leads, 1, "GETs of {i} made {leads} leads");
        }
    }

    /// A GET that counts a key past the admission bar races one that leads its plain read,
    /// both finding no read in flight when they looked: one read is started (the lead or the
    /// tracked fill) and the other GET joins it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_lead_and_a_tracked_fill_racing_make_one_read() {
        let core = Arc::new(Core::for_test());
        let conn = idle_conn();
        let (lane, _silent) = silent_lane();
        let mut tracked_first = 0;
        for i in 0..2_000u32 {
            let key = format!("race:{i}").into_bytes();
            // Both racers count the key past the bar.
            one_short_of_the_bar(&core, &key);
            let fills = core.stats.fills.get();
            let leads = race(&core, &conn, &key, [None, Some(lane.clone())]);
            let tracked = core.stats.fills.get() - fills;
            tracked_first += tracked;
            assert_eq!(
                leads + tracked,
                1,
                "GETs of {i}: {leads} leads, {tracked} fills"
            );
        }
        // Both orders were run: the race was a race.
        assert!(
            (1..2_000).contains(&tracked_first),
            "a tracked fill was first {tracked_first} times in 2,000"
        );
    }

    /// A later GET of a round joins the read an earlier GET of its key led while that read is
    /// the key's, and gets its reply; once a write's invalidation unlinked it, it does not.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_led_read_is_rejoined_only_while_it_is_the_keys() {
        let core = Arc::new(Core::for_test());
        let conn = idle_conn();
        let lead = |key: &[u8]| {
            let hash = core.admission.hash(key);
            // Read once already: the next GET takes the full path and may be joined.
            core.recent.read_again(hash);
            let route = Route {
                conn: &conn,
                lane: || None,
            };
            match core.lookup(key, hash, route, &mut Clock::default()) {
                Lookup::Lead(lead) => lead,
                _ => panic!("{key:?} led no read"),
            }
        };
        let rejoin = |key: &[u8], id: u64| {
            let hash = core.admission.hash(key);
            core.rejoin_lead(key, hash, id, &conn, &mut Clock::default())
        };
        let kept = lead(b"kept");
        let joins = core.stats.coalesced.get();
        let rx = rejoin(b"kept", kept.id()).expect("the lead is still the key's");
        assert_eq!(core.stats.coalesced.get(), joins + 1, "counted as a join");
        kept.complete(Ok(bytes::Bytes::from_static(b"$1\r\nv\r\n")));
        assert!(
            matches!(rx.peek(), Some(Ok(v)) if *v == Value::from_get_reply(b"$1\r\nv\r\n").unwrap_or(Value::Nil)),
            "the lead's reply answers the later GET"
        );
        let written = lead(b"written");
        core.invalidate(b"written", false);
        assert!(
            rejoin(b"written", written.id()).is_none(),
            "unlinked by a write"
        );
        let other = lead(b"other");
        assert!(
            rejoin(b"other", other.id() + 1).is_none(),
            "another read's id"
        );
    }

    /// The key with this hash was read once already: its next GETs take the full path and
    /// may be joined.
    fn read_once(core: &Core, hash: u64) {
        core.recent.read_again(hash);
    }

    /// The route of a GET whose plain read is a lead, over `conn`, of a key with no lane.
    fn led(conn: &UpstreamConn) -> Route<'_, fn() -> Option<Arc<LaneHandle>>> {
        Route {
            conn,
            lane: || None,
        }
    }

    /// A read registered after a write's first invalidation is not joined until the write's
    /// acknowledgement has been applied: it may have run before the write, whose value the
    /// joining client may have read already. A GET then goes to Redis.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_read_is_not_joined_while_a_write_of_its_key_is_unacknowledged() {
        let core = Arc::new(Core::for_test());
        let conn = idle_conn();
        let key = b"held".as_slice();
        let hash = core.admission.hash(key);
        let mut write = super::super::Unacked::default();
        write.hold(&core.unacked, hash);
        core.invalidate(key, false);
        read_once(&core, hash);
        let route = || led(&conn);
        let first = core.lookup(key, hash, route(), &mut Clock::default());
        assert!(matches!(first, Lookup::Lead(_)), "its own read");
        let second = core.lookup(key, hash, route(), &mut Clock::default());
        assert!(matches!(second, Lookup::Forward), "not joined");
        write.release();
        let third = core.lookup(key, hash, route(), &mut Clock::default());
        assert!(matches!(third, Lookup::Wait(_)), "joined once acknowledged");
    }

    /// With the read barrier, a GET joins a read in flight only if it started after the
    /// round's floor: one started before may have run before a write the round must see,
    /// and the GET starts a read of its own in its place.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_read_started_before_the_rounds_floor_is_not_joined() {
        let core = Arc::new(Core::for_test());
        let conn = idle_conn();
        let key = b"floor".as_slice();
        let hash = core.admission.hash(key);
        read_once(&core, hash);
        let route = || led(&conn);
        let first = core.lookup(key, hash, route(), &mut Clock::default());
        assert!(matches!(first, Lookup::Lead(_)));
        let mut earlier = Clock::default();
        earlier.passed_barrier(Some(Instant::now() - std::time::Duration::from_secs(1)));
        assert!(matches!(
            core.lookup(key, hash, route(), &mut earlier),
            Lookup::Wait(_)
        ));
        let mut later = Clock::default();
        later.passed_barrier(Some(Instant::now()));
        let second = core.lookup(key, hash, route(), &mut later);
        assert!(matches!(second, Lookup::Lead(_)));
        // The new read (a lead dropped unsent ends its read) is joined by a round whose
        // floor is before it.
        let mut next = Clock::default();
        next.passed_barrier(Some(Instant::now() - std::time::Duration::from_millis(1)));
        assert!(matches!(
            core.lookup(key, hash, route(), &mut next),
            Lookup::Wait(_)
        ));
    }
}
