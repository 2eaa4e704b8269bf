//! The local hot-key cache and GET coalescing.
//!
//! Every GET that is not a local hit becomes, or joins, one in-flight upstream read per key
//! (singleflight). Keys the frequency sketch finds hot are read over a dedicated RESP3
//! connection with `CLIENT TRACKING ON` (the tracking lane) as `PTTL k` + `GET k`
//! and kept locally. The coherence rules are stated in `coherence.rs`, next to the code that
//! keeps them.
//!
//! Layout, each file one job (an arrow is "uses"; no file uses one above it in this list):
//! - `mod.rs`: [`Cache`], the facade client connections call; owns the lanes.
//! - `ahead.rs`: a round's GETs found ahead of handling them ([`Ahead`]), and what their
//!   lookups will read loaded meanwhile (`Cache::prefetch`).
//! - `hits.rs`: a GET served locally: the thread's front first, a hit counted.
//! - `read.rs`: read-through and singleflight ([`Lookup`]) → coherence, lane.
//! - `lane.rs`: tracking lanes and their observer (invalidation pushes) → coherence.
//! - `coherence.rs`: the store and the in-flight reads kept coherent (`Core`).
//! - `leads.rs`: bare plain reads in flight ([`Lead`]), by key hash, joined by concurrent
//!   GETs.
//! - `recent.rs`: hashes of recent cold GETs (a cold key read twice is joinable).
//! - `epochs.rs`: when reads were last registered, by key hash (a write's second
//!   invalidation skips keys no read was registered for since its first).
//! - `presence.rs`: what the store and the maps of reads in flight hold, counted by key
//!   hash (a key at zero has nothing in any of them: writes and lookups skip the maps).
//! - `flight.rs`: one in-flight read that waiters share: a `Fill` ([`FillRx`]).
//! - `admission.rs`: which keys are worth keeping (sketches, hot keys, early refresh).
//! - `lately.rs`: which keys were read lately (a write to any other skips the sketch).
//! - `churn.rs`: keys whose entries writes end before they repay their fill (not admitted).
//! - `lasting.rs`: whether writes end the entries filled lately young (while they do not, a
//!   connection's fills keep it warm).
//! - `stats.rs`: counters and their INFO / Prometheus forms.
//! - `holds.rs`: whether shared upstream connections hold writes, by the share of GETs
//!   hit.
//! - `touch.rs`: the cached keys of sampled hits (`touched.rs`) touched on Redis every
//!   `touch_ms`, so its LRU/LFU sees them used → lane.
//! - `store.rs`: the entries, bounded in bytes → `front.rs`: each thread's recent hits.
//! - `entry.rs`, `value.rs`, `sketch.rs`, `hotkeys.rs`, `touched.rs`, `tracking.rs`,
//!   `short_key.rs`: leaves.

mod admission;
mod ahead;
mod bar;
mod barrier;
mod churn;
mod clock;
mod coherence;
mod drops;
mod entry;
mod epochs;
mod flight;
mod front;
mod hits;
mod holds;
mod hotkeys;
mod lane;
mod lasting;
mod lately;
mod leads;
mod lone;
mod lost;
mod presence;
mod read;
mod recent;
mod renew;
mod served;
mod short_key;
mod sketch;
mod stats;
mod store;
mod table;
mod touch;
mod touched;
mod tracking;
mod unacked;
mod value;
mod window;
mod writes;
mod written;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::BytesMut;
use dashmap::DashMap;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

pub use ahead::{Ahead, PREFETCH_MAX};
pub use clock::Clock;
pub use entry::Entry;
pub use flight::{FillResult, FillRx};
pub use hotkeys::HotKey;
pub use leads::Lead;
pub use read::Lookup;
pub use tracking::Tracking;
pub use unacked::Unacked;
pub use value::Value;

use crate::config::Config;
use crate::resp::encode::encode_request;
use crate::upstream::cluster::ClusterUpstream;
use crate::upstream::{ConnSettings, Health, UpstreamConn, UpstreamStatus};
use admission::Admission;
use barrier::Barrier;
use coherence::Core;
use lane::{LaneHandle, Lanes};
use stats::{Sources, Stats};
use store::Store;
use tracking::LaneState;

/// Oldest in-flight read a GET may join when requests have no timeout.
const DEFAULT_JOIN_BOUND: Duration = Duration::from_secs(5);

/// The cache facade used by client connections.
#[derive(Debug)]
pub struct Cache {
    core: Arc<Core>,
    /// Tracking lanes by node address: the upstream's (standalone), or one per master.
    lanes: Arc<Lanes>,
    /// Standalone: the upstream's lane, kept apart so misses take no lock.
    default_lane: Option<Arc<LaneHandle>>,
    health: Health,
    /// In cluster mode: any topology change flushes the cache, since a node that lost a slot
    /// (Redis 7.0) sends no invalidation for its keys.
    cluster: Option<Arc<ClusterUpstream>>,
    seen_epoch: AtomicU64,
    /// `[cache] read_barrier`: rounds of GETs wait for their lanes to catch up first.
    barrier: Option<Arc<Barrier>>,
}

impl Cache {
    /// Creates the cache and starts its tracking lanes: to the upstream, or in cluster mode
    /// to every master (following the topology).
    pub fn start(
        cfg: &Config,
        settings: ConnSettings,
        status: Arc<UpstreamStatus>,
        shutdown: CancellationToken,
        cluster: Option<Arc<ClusterUpstream>>,
    ) -> Cache {
        let core = Arc::new(new_core(cfg));
        tokio::spawn(core.admission.clone().decay(shutdown.clone()));
        let holds_follow = cfg.holds_follow_cache().then(|| status.clone());
        let health = Health {
            strict: true,
            ..cfg.health()
        };
        let lane_settings = ConnSettings {
            proto: crate::resp::Proto::Resp3,
            tracking: true,
            reconnect: true,
            health: Some(health),
            internal: true,
            // A fill's waiters wait on each of its writes.
            hold_at: 0,
            ..settings
        }
        // A fill that takes too long resets its lane from its waiter (`flight.rs`).
        .background();
        let upstream_addr = lane_settings.addr.clone();
        let lanes = Arc::new(Lanes::new(
            core.clone(),
            lane_settings,
            status,
            shutdown.clone(),
        ));
        let (counted, steered, renewed) = (core.clone(), core.clone(), lanes.clone());
        let react = move |gets, served| {
            bar::follow(&steered, gets, served);
            steered.lone.follow(steered.stats.coalesced.get());
            steered.presence.follow_store(steered.store.len());
            steered.presence.mend();
            let invalidated = steered.stats.invalidations.get();
            if steered.renewal.due(invalidated, steered.store.len()) && renewed.renew_all() {
                steered.renewal.rebase(invalidated);
            }
            if let Some(status) = &holds_follow {
                holds::follow(status, gets, served);
            }
        };
        let seen = move || served::Seen::of(&counted.stats);
        tokio::spawn(served::watch(seen, react, shutdown.clone()));
        let default_lane = match &cluster {
            // Standalone: connect the lane now, so the first hot key finds it up.
            None => Some(lanes.start(&upstream_addr)),
            Some(c) => {
                tokio::spawn(lane::follow_topology(
                    lanes.clone(),
                    c.clone(),
                    c.watch_epoch(),
                    shutdown.clone(),
                ));
                None
            }
        };
        if cfg.cache.touch_ms > 0 {
            let route = touch::Route {
                lanes: lanes.clone(),
                default_lane: default_lane.clone(),
                cluster: cluster.clone(),
            };
            let every = Duration::from_millis(cfg.cache.touch_ms);
            tokio::spawn(touch::run(core.clone(), route, every, shutdown));
        }
        let barrier = cfg.cache.read_barrier.then(|| {
            let deadline = Duration::from_millis(cfg.cache.lane_deadline_ms.max(1));
            Arc::new(Barrier::new(core.clone(), lanes.clone(), deadline))
        });
        Cache {
            core,
            lanes,
            default_lane,
            health,
            cluster,
            seen_epoch: AtomicU64::new(0),
            barrier,
        }
    }

    /// The tracking lane for a read from `node` (standalone: `None`, the upstream's lane). In
    /// cluster mode lanes come and go with the masters; a node without one (not a master in
    /// the current map) gets no tracked reads.
    /// The node's address is formatted here, once a read needs a lane, not for every GET.
    fn lane(&self, node: Option<&crate::cluster::Addr>) -> Option<Arc<LaneHandle>> {
        match node {
            None => self.default_lane.clone(),
            Some(addr) => self.lanes.get(&addr.to_string()),
        }
    }

    /// Cluster mode: flushes everything once the topology changed (failover, slot moves).
    fn check_topology(&self) {
        if let Some(c) = &self.cluster {
            let epoch = c.epoch();
            if self.seen_epoch.swap(epoch, Ordering::Relaxed) != epoch {
                self.core.flush();
            }
        }
    }

    /// Looks up a GET of `key`: a local hit, or an upstream read to wait for. A read that is
    /// started goes over the tracking lane for hot keys, else over `conn`.
    ///
    /// A read that is not a tracked fill is returned as [`Lookup::Lead`] for the caller to
    /// send in its own batch (over `conn`, the connection to the key's node). `hash` is the
    /// key's [`Cache::hash`]; `clock` is the client's round's (see [`Clock`]).
    pub fn get(
        &self,
        key: &[u8],
        hash: u64,
        conn: &UpstreamConn,
        node: Option<&crate::cluster::Addr>,
        clock: &mut Clock,
    ) -> Lookup {
        self.check_topology();
        let route = read::Route {
            conn,
            lane: || self.lane(node),
        };
        self.core.lookup(key, hash, route, clock)
    }

    /// [`Cache::get`], but a hit in this thread's front (most hits of a warm connection) is
    /// handed to `write`, which writes its reply where the caller wants it at once, and no
    /// reference to the entry is taken: `None` then. `write` may decline the entry (false),
    /// which is then looked up as [`Cache::get`] would, with `conn` asked for where a read
    /// goes only then (a hit needs no connection). A hit in the store is handed to `write`
    /// as well.
    #[inline]
    pub fn get_or_write<'c>(
        &self,
        key: &[u8],
        hash: u64,
        (conn, node): (
            impl FnOnce() -> &'c UpstreamConn,
            Option<&crate::cluster::Addr>,
        ),
        clock: &mut Clock,
        mut write: impl FnMut(&Entry) -> bool,
    ) -> Option<Lookup> {
        self.check_topology();
        let lane = || self.lane(node);
        let front = match (self.core).begin(key, hash, &lane, clock, |e| write(e).then_some(())) {
            hits::Begun::Served(()) => return None,
            hits::Begun::Store { front } => front,
        };
        let route = read::Route { conn: conn(), lane };
        match self.core.lookup_store(key, hash, route, clock, front) {
            // A hit counted in the read sketch: written too.
            Lookup::Hit(v) if v.entry().is_some_and(&mut write) => None,
            lookup => Some(lookup),
        }
    }

    /// A client's round ended: counts the GETs it forwarded without a lookup
    /// ([`Cache::skips`]).
    pub fn end_round(&self, clock: &mut Clock) {
        if clock.skipped > 0 {
            self.core
                .stats
                .skipped
                .inc_by(std::mem::take(&mut clock.skipped));
        }
    }

    /// A later GET of `key` in a round whose earlier GET of it led the read `id` ([`Lead::id`]):
    /// that read joined, or `None` once a write's invalidation unlinked it (`server/noted.rs`).
    pub fn rejoin(
        &self,
        key: &[u8],
        hash: u64,
        id: u64,
        conn: &UpstreamConn,
        clock: &mut Clock,
    ) -> Option<FillRx> {
        self.core.rejoin_lead(key, hash, id, conn, clock)
    }

    /// A GET given the read an earlier GET of its key waits on: its lookup's miss and join.
    pub fn count_join(&self, key: &[u8], hash: u64, clock: &mut Clock) {
        self.core.count_join(key, hash, clock);
    }

    /// Whether a GET of the key whose [`Cache::hash`] is `hash` is forwarded as it is, with
    /// no lookup: the connection reads only cold keys, and the key is one (see
    /// [`Clock::cool`]). Else it goes to [`Cache::get`].
    #[inline]
    pub fn skips(&self, hash: u64, clock: &mut Clock) -> bool {
        self.core.skips(hash, clock)
    }

    /// The hasher behind [`Cache::hash`].
    pub fn hasher(&self) -> foldhash::fast::RandomState {
        self.core.admission.hasher()
    }

    /// The hash the cache gives `key`: what [`Cache::get`] and [`Cache::skips`] take.
    #[inline]
    pub fn hash(&self, key: &[u8]) -> u64 {
        self.core.admission.hash(key)
    }

    /// Local hits for an MGET: one slot per key, `None` where the key is not cached. Counts
    /// each key's read for hotness; misses are not coalesced (the caller fetches them in
    /// one MGET).
    pub fn get_many<'a>(&self, keys: impl Iterator<Item = &'a [u8]>) -> Vec<Option<Value>> {
        self.core.get_many(keys)
    }

    /// Waits until the tracking connection has delivered everything Redis sent on it before
    /// now: a PING sent on it is answered after every invalidation already queued. Used after
    /// scripts, which may write keys they did not declare, so their writes are read back.
    pub async fn sync_lane(&self, deadline: Option<Duration>) {
        for lane in self.lanes.all() {
            if lane.info.tracking() != Tracking::On {
                continue;
            }
            let mut ping = BytesMut::new();
            encode_request(&[b"PING"], &mut ping);
            let rx = lane.conn.send(ping.freeze(), 1).await;
            match deadline {
                Some(d) => drop(tokio::time::timeout(d, rx).await),
                None => drop(rx.await),
            }
        }
    }

    /// Whether a round's GETs must pass the read barrier ([`Cache::pass_barrier`]) before
    /// anything is looked up.
    pub fn read_barrier(&self) -> bool {
        self.barrier.is_some()
    }

    /// The read barrier (`barrier.rs`): waits until every invalidation Redis sent before now
    /// has been applied, then notes the round's floor in `clock` (see
    /// [`Clock::passed_barrier`]). Without `read_barrier`, returns at once.
    pub async fn pass_barrier(&self, clock: &mut Clock) {
        if let Some(barrier) = &self.barrier {
            let floor = barrier.pass().await;
            clock.passed_barrier(floor);
        }
    }

    /// Drops every entry and in-flight read (FLUSHALL, FLUSHDB, SWAPDB through corral).
    pub fn flush(&self) {
        self.core.flush();
    }

    /// The `n` hottest keys with estimated GET rates and whether each is cached now.
    pub fn hot_keys(&self, n: usize) -> Vec<(HotKey, bool)> {
        self.core
            .admission
            .top(n)
            .into_iter()
            .map(|h| {
                let cached = self.core.store.contains(&h.key);
                (h, cached)
            })
            .collect()
    }

    /// Every lane's state, ordered by address.
    fn lane_states(&self) -> Vec<Arc<LaneState>> {
        self.lanes.all().iter().map(|l| l.info.clone()).collect()
    }

    /// State of the tracking lanes taken together: `Partial` when some of several are down.
    pub fn tracking(&self) -> Tracking {
        let states: Vec<Tracking> = self.lanes.all().iter().map(|l| l.info.tracking()).collect();
        tracking::aggregate(&states)
    }

    /// Tracking lanes connected with `CLIENT TRACKING ON`: Redis counts each in INFO's
    /// `tracking_clients`.
    pub fn tracking_lanes(&self) -> usize {
        self.lanes
            .all()
            .iter()
            .filter(|l| l.info.tracking() == Tracking::On)
            .count()
    }

    /// Registers the cache's metrics.
    pub fn register(&self, registry: &mut Registry) {
        self.core.stats.register(registry);
    }

    /// Refreshes the gauges (entries, bytes, evictions) before a scrape.
    pub fn update_gauges(&self) {
        let lanes = self.lane_states();
        self.core.stats.update_gauges(&self.sources(&lanes));
    }

    /// `name:value` lines for INFO's `# Cache` section and `CORRAL CACHE STATS`; each lane
    /// gets a `cache_lane<N>` line (`node=..,state=..,resets=..,last_reset=..`), by address.
    pub fn stats(&self) -> Vec<(String, String)> {
        let lanes = self.lane_states();
        self.core.stats.lines(&self.sources(&lanes))
    }

    fn sources<'a>(&'a self, lanes: &'a [Arc<LaneState>]) -> Sources<'a> {
        Sources {
            store: &self.core.store,
            health: &self.health,
            lanes,
            inflight: self.core.fills.len() + self.core.leads.len(),
            noise_floor: self.core.admission.noise_floor(),
            long_window: self.core.admission.long_window(),
            lone_reads: self.core.lone.on(),
        }
    }
}

/// The shared core, sized from the configuration.
fn new_core(cfg: &Config) -> Core {
    let c = &cfg.cache;
    // 1M four-bit counters (512 KiB) at most in the short window: the sketch is touched on
    // every GET looked up, and must fit in a core's L2 cache. The long window's table, eight
    // times that, is used only while most GETs are hits (`window.rs`), many of them front
    // hits that go uncounted. The size sets how rare a key the sketch can tell from the
    // noise (a sample is ten increments per counter word): on Zipf GETs over 1M keys, at
    // 64 KiB about the top 7,000 keys qualified, at 512 KiB about 30,000 (hits 0.60 →
    // 0.70). A round's lookahead loads each GET's counters ahead of its lookup, and a cool
    // connection's cold GETs are not counted (`read.rs`), so the larger table costs little;
    // collisions only blur estimates, and the noise floor (`Admission::admit`) discounts them.
    let candidates = (c.max_bytes / 1024).clamp(4096, 1 << 16) as usize;
    let admission = Admission::new(candidates, c.hot_threshold, c.refresh_beta);
    let admission = admission
        .lowering_to(c.hot_threshold_min)
        .growing_window(c.long_window)
        .touching(Duration::from_millis(c.touch_ms));
    let admission = Arc::new(admission);
    let presence = Arc::new(presence::Presence::default());
    Core {
        store: Store::new(c.max_bytes, presence.clone(), admission.hasher()),
        presence,
        fills: DashMap::default(),
        leads: leads::Leads::default(),
        recent: recent::RecentReads::default(),
        lone: lone::Lone::default(),
        renewal: renew::Renewal::new(c.lane_renew_keys),
        lost: lost::LostFills::default(),
        epochs: epochs::ReadEpochs::default(),
        unacked: Arc::new(unacked::UnackedTable::for_this_runtime()),
        joined: DashMap::default(),
        admission,
        stats: Stats::default(),
        max_value: c.max_value_bytes,
        max_age: Duration::from_millis(c.max_age_ms),
        fallback_ttl: Duration::from_millis(c.fallback_ttl_ms),
        // Past the request timeout its waiters have given up on it anyway.
        join_bound: cfg.request_timeout().unwrap_or(DEFAULT_JOIN_BOUND),
    }
}
