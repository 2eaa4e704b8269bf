//! The local hot-key cache and GET coalescing.
//!
//! Every GET that is not a local hit becomes, or joins, one in-flight upstream read per key
//! (singleflight). Keys the frequency sketch finds hot are read over a dedicated RESP3
//! connection with `CLIENT TRACKING ON` (the tracking lane) as `MULTI / PTTL k / GET k / EXEC`
//! and kept locally. Coherence rests on three rules:
//!
//! 1. The lane's replies and Redis's invalidation pushes share one FIFO and are applied by the
//!    lane's own task, in wire order: a fill inserts before the push that invalidates it is
//!    applied, never after.
//! 2. An invalidation (a push, or a write through corral before it is forwarded and again when
//!    it is acknowledged) removes the key's in-flight read from the singleflight map: that read
//!    can no longer insert, and later GETs cannot join it.
//! 3. Losing the lane, or (re)connecting it, flushes everything: invalidations may have been
//!    missed. A lane that goes silent counts as lost within `lane_check_ms + lane_deadline_ms`
//!    (see [`lane`]).

mod hotkeys;
mod lane;
mod sketch;
mod store;
mod value;

use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use dashmap::DashMap;
use dashmap::mapref::entry::Entry as MapEntry;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use rand::Rng;
use std::sync::OnceLock;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

pub use hotkeys::HotKey;
pub use value::Value;

use crate::config::Config;
use crate::error::UpstreamError;
use crate::resp::request::encode_request;
use crate::upstream::{ConnSettings, Health, JobResult, ReplyTo, UpstreamConn, UpstreamStatus};
use hotkeys::HotKeys;
use lane::{LaneHandle, LaneState, Lanes};
use sketch::FrequencySketch;
use store::{Entry, Store};

/// A key whose last fills were invalidated unused this many times is not cached for a while.
const MAX_WASTED_FILLS: u8 = 2;
/// Oldest in-flight read a GET may join when requests have no timeout.
const DEFAULT_JOIN_BOUND: Duration = Duration::from_secs(5);

/// What a waiter eventually receives: the GET result or why there is none.
pub type FillResult = Result<Value, UpstreamError>;
/// Where a waiter gets the result of a shared read.
#[derive(Debug)]
pub struct FillRx(Arc<Fill>);

impl FillRx {
    /// Waits for the result.
    pub async fn wait(&self) -> FillResult {
        loop {
            let notified = self.0.notify.notified();
            if let Some(r) = self.0.result.get() {
                return r.clone();
            }
            notified.await;
        }
    }

    /// The result, if it arrived.
    pub fn peek(&self) -> Option<FillResult> {
        self.0.result.get().cloned()
    }

    /// Whether the read is a tracked fill over a tracking lane (not the client's own GET).
    pub fn tracked(&self) -> bool {
        self.0.lane.is_some()
    }

    /// The waiter gave up after the request timeout: a lane fill that late means the lane is
    /// not answering, so it is reset (its entries dropped). The error names the node the read
    /// was sent to.
    pub fn timed_out(&self) -> UpstreamError {
        let Some(via) = &self.0.via else {
            return UpstreamError::Timeout {
                addr: "(unknown)".into(),
            };
        };
        if self.tracked() {
            via.reset();
        }
        UpstreamError::Timeout {
            addr: via.addr().to_string(),
        }
    }
}

/// Outcome of a GET lookup.
#[derive(Debug)]
pub enum Lookup {
    /// Served from the local cache.
    Hit(Value),
    /// Wait for an upstream read (started now, or joined).
    Wait(FillRx),
    /// This GET is the read others may join: the caller sends it in its own batch and hands
    /// its reply to [`Lead::complete`] (from the connection task, so a client that goes away
    /// cancels nothing).
    Lead(Lead),
}

/// A plain GET that concurrent GETs of the same key wait for.
#[derive(Debug)]
pub struct Lead {
    core: Arc<Core>,
    key: Bytes,
    fill: Arc<Fill>,
}

impl Lead {
    /// Shares the GET's reply (one RESP frame), or its failure, with the waiters.
    pub fn complete(self, reply: JobResult) {
        self.core.complete_read(&self.key, &self.fill, reply);
    }
}

impl Drop for Lead {
    /// A read dropped unsent (shutdown) must not leave waiters hanging.
    fn drop(&mut self) {
        self.fill.publish(Err(UpstreamError::ShuttingDown));
    }
}

impl Fill {
    fn new(started: Instant, lane: Option<Arc<LaneState>>, via: Option<UpstreamConn>) -> Arc<Fill> {
        Arc::new(Fill {
            result: OnceLock::new(),
            notify: Notify::new(),
            started,
            lane,
            via,
        })
    }

    /// Publishes the result once (later calls are ignored) and wakes the waiters.
    fn publish(&self, r: FillResult) {
        if self.result.set(r).is_ok() {
            self.notify.notify_waiters();
        }
    }

    fn waiter(self: &Arc<Self>) -> FillRx {
        FillRx(self.clone())
    }
}

/// Completes a read from the upstream connection's task; if the job is dropped unanswered
/// (shutdown), its waiters get an error instead of waiting.
struct Completer {
    core: Arc<Core>,
    key: Bytes,
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

/// State of the tracking lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tracking {
    /// Not connected yet, or reconnecting: nothing is cached.
    Down,
    /// Connected with `CLIENT TRACKING ON`: entries live until invalidated or expired.
    On,
    /// Connected, but the upstream refused tracking: entries live `fallback_ttl_ms` at most.
    Fallback,
    /// Several lanes (cluster mode), some down: keys of their masters are read uncached, the
    /// others are cached. Only ever an aggregate, never one lane's state.
    Partial,
}

impl Tracking {
    /// Label for INFO and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Tracking::Down => "down",
            Tracking::On => "on",
            Tracking::Fallback => "off (ttl-only fallback)",
            Tracking::Partial => "partial",
        }
    }

    fn from_u8(v: u8) -> Self {
        match v {
            1 => Tracking::On,
            2 => Tracking::Fallback,
            3 => Tracking::Partial,
            _ => Tracking::Down,
        }
    }

    /// Gauge value: 0 down, 1 tracking, 2 TTL-only fallback, 3 partial.
    fn as_gauge(self) -> i64 {
        self as i64
    }
}

/// Cache counters, exported to INFO, `CORRAL CACHE STATS` and Prometheus.
#[derive(Debug, Default)]
struct Stats {
    hits: Counter,
    misses: Counter,
    coalesced: Counter,
    fills: Counter,
    reads: Counter,
    inserts: Counter,
    invalidations: Counter,
    local_invalidations: Counter,
    flushes: Counter,
    refreshes: Counter,
    oversized: Counter,
    entries: Gauge,
    bytes: Gauge,
    evictions: Gauge,
    stale_window_ms: Gauge,
    /// Per lane (label `node`): its state as [`Tracking::as_gauge`].
    lane_state: Family<Vec<(String, String)>, Gauge>,
    /// Per lane: losses and resets since it was created.
    lane_resets: Family<Vec<(String, String)>, Gauge>,
    /// Per lane: always 1, with the state and the last reset cause as labels.
    lane_info: Family<Vec<(String, String)>, Gauge>,
}

/// One in-flight upstream read that waiters share.
#[derive(Debug)]
struct Fill {
    /// Set once; waiters are woken through `notify`. (A `watch` channel allocates far more
    /// per read, and there is one read per miss.)
    result: OnceLock<FillResult>,
    notify: Notify,
    started: Instant,
    /// The tracking lane the read went over (`None` for plain coalesced reads).
    lane: Option<Arc<LaneState>>,
    /// The connection the read was sent on (`None` only in unit tests).
    via: Option<UpstreamConn>,
}

#[derive(Debug)]
struct Core {
    store: Store,
    fills: DashMap<Bytes, Arc<Fill>, foldhash::fast::RandomState>,
    reads: FrequencySketch,
    /// Fills whose entry was invalidated before serving a single hit: keys written about as
    /// often as they are read. Halved every few seconds.
    wasted: FrequencySketch,
    hot: HotKeys,
    hasher: foldhash::fast::RandomState,
    stats: Stats,
    hot_threshold: u8,
    max_value: usize,
    max_age: Duration,
    fallback_ttl: Duration,
    beta: f64,
    /// A GET joins an in-flight read only if it was sent less than this long ago.
    join_bound: Duration,
}

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
    cluster: Option<Arc<crate::upstream::cluster::ClusterUpstream>>,
    seen_epoch: std::sync::atomic::AtomicU64,
}

impl Cache {
    /// Creates the cache and starts its tracking lanes: to the upstream, or in cluster mode
    /// to every master (following the topology).
    pub fn start(
        cfg: &Config,
        settings: ConnSettings,
        status: Arc<UpstreamStatus>,
        shutdown: CancellationToken,
        cluster: Option<Arc<crate::upstream::cluster::ClusterUpstream>>,
    ) -> Cache {
        let c = &cfg.cache;
        // 1M four-bit counters (512 KiB) at most: the sketch is touched on every GET and must
        // stay in cache; collisions only blur estimates.
        let candidates = (c.max_bytes / 1024).clamp(4096, 1 << 16) as usize;
        let core = Arc::new(Core {
            store: Store::new(c.max_bytes),
            fills: DashMap::default(),
            reads: FrequencySketch::new(candidates),
            wasted: FrequencySketch::new(candidates),
            hot: HotKeys::default(),
            hasher: foldhash::fast::RandomState::default(),
            stats: Stats::default(),
            hot_threshold: c.hot_threshold,
            max_value: c.max_value_bytes,
            max_age: Duration::from_millis(c.max_age_ms),
            fallback_ttl: Duration::from_millis(c.fallback_ttl_ms),
            beta: c.refresh_beta,
            // Past the request timeout its waiters have given up on it anyway.
            join_bound: cfg.request_timeout().unwrap_or(DEFAULT_JOIN_BOUND),
        });
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
            ..settings
        };
        tokio::spawn(decay_hot_keys(core.clone(), shutdown.clone()));
        let upstream_addr = lane_settings.addr.clone();
        let lanes = Arc::new(Lanes::new(
            core.clone(),
            lane_settings,
            status,
            shutdown.clone(),
        ));
        let default_lane = match &cluster {
            // Standalone: connect the lane now, so the first hot key finds it up.
            None => Some(lanes.start(&upstream_addr)),
            Some(c) => {
                tokio::spawn(lane::follow_topology(
                    lanes.clone(),
                    c.clone(),
                    c.watch_epoch(),
                    shutdown,
                ));
                None
            }
        };
        Cache {
            core,
            lanes,
            default_lane,
            health,
            cluster,
            seen_epoch: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The tracking lane for a read from `node` (standalone: `None`, the upstream's lane). In
    /// cluster mode lanes come and go with the masters; a node without one (not a master in
    /// the current map) gets no tracked reads.
    fn lane(&self, node: Option<&str>) -> Option<Arc<LaneHandle>> {
        match node {
            None => self.default_lane.clone(),
            Some(addr) => self.lanes.get(addr),
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

    /// Registers the cache's metrics.
    pub fn register(&self, registry: &mut Registry) {
        let s = &self.core.stats;
        let counters: [(&str, &str, &Counter); 11] = [
            ("cache_hits", "GETs answered from the local cache", &s.hits),
            ("cache_misses", "GETs not answered locally", &s.misses),
            (
                "cache_coalesced",
                "GETs that joined another client's upstream read",
                &s.coalesced,
            ),
            (
                "cache_fills",
                "Hot-key reads over the tracking connection",
                &s.fills,
            ),
            (
                "cache_reads",
                "Coalesced GETs sent upstream for keys not hot",
                &s.reads,
            ),
            ("cache_inserts", "Entries stored", &s.inserts),
            (
                "cache_invalidations",
                "Keys invalidated by Redis (CLIENT TRACKING)",
                &s.invalidations,
            ),
            (
                "cache_local_invalidations",
                "Keys invalidated by writes through corral",
                &s.local_invalidations,
            ),
            (
                "cache_flushes",
                "Whole-cache flushes (FLUSHALL, lost tracking)",
                &s.flushes,
            ),
            (
                "cache_refreshes",
                "Background refreshes of entries near expiry",
                &s.refreshes,
            ),
            ("cache_oversized", "Values too large to cache", &s.oversized),
        ];
        for (name, help, c) in counters {
            registry.register(name, help, c.clone());
        }
        registry.register(
            "cache_entries",
            "Entries in the local cache",
            s.entries.clone(),
        );
        registry.register(
            "cache_bytes",
            "Bytes charged to the cache budget",
            s.bytes.clone(),
        );
        registry.register(
            "cache_evictions",
            "Entries evicted for the memory budget",
            s.evictions.clone(),
        );
        registry.register(
            "cache_stale_window_ms",
            "Longest a cached value can outlive a write while its tracking lane is silently dead (lane_check_ms + lane_deadline_ms)",
            s.stale_window_ms.clone(),
        );
        registry.register(
            "cache_lane_state",
            "Tracking lane state per node: 0 down, 1 tracking, 2 ttl-only fallback",
            s.lane_state.clone(),
        );
        registry.register(
            "cache_lane_resets",
            "Times each tracking lane was lost or reset (dead, fill timed out, closed)",
            s.lane_resets.clone(),
        );
        registry.register(
            "cache_lane_info",
            "Tracking lanes, with their state and last reset cause as labels",
            s.lane_info.clone(),
        );
    }

    /// Refreshes the gauges (entries, bytes, evictions) before a scrape.
    pub fn update_gauges(&self) {
        let s = &self.core.stats;
        let st = &self.core.store;
        s.entries.set(st.len() as i64);
        s.bytes.set(st.bytes() as i64);
        s.evictions.set(st.evictions() as i64);
        s.stale_window_ms
            .set(self.health.window().as_millis() as i64);
        // Rebuilt at each scrape, so lanes dropped with the topology leave no series behind.
        s.lane_state.clear();
        s.lane_resets.clear();
        s.lane_info.clear();
        for l in self.lanes.all() {
            let info = &l.info;
            let node = vec![("node".to_string(), info.addr.clone())];
            s.lane_state
                .get_or_create(&node)
                .set(info.tracking().as_gauge());
            s.lane_resets.get_or_create(&node).set(info.resets() as i64);
            let labels = vec![
                ("node".to_string(), info.addr.clone()),
                ("state".to_string(), info.tracking().as_str().to_string()),
                (
                    "last_reset".to_string(),
                    info.last_reset().unwrap_or_else(|| "none".into()),
                ),
            ];
            s.lane_info.get_or_create(&labels).set(1);
        }
    }

    /// Looks up a GET of `key`: a local hit, or an upstream read to wait for. A read that is
    /// started goes over the tracking lane for hot keys, else over `conn`.
    ///
    /// With `lead`, a read that is not a tracked fill is returned as [`Lookup::Lead`] for the
    /// caller to send in its own batch; else it is sent here over `conn`.
    pub fn get(&self, key: &[u8], conn: &UpstreamConn, node: Option<&str>, lead: bool) -> Lookup {
        self.check_topology();
        let core = &self.core;
        let now = Instant::now();
        let hash = core.hasher.hash_one(key);
        core.reads.increment(hash);
        if rand::rng().random_ratio(1, hotkeys::SAMPLE_EVERY as u32) {
            core.hot.record(key);
        }
        if let Some(e) = core.store.get(key, now) {
            core.stats.hits.inc();
            e.mark_hit();
            if core.should_refresh(&e, now) {
                self.refresh(key, node);
            }
            return Lookup::Hit(e.value.clone());
        }
        core.stats.misses.inc();
        if let Some(f) = core.fills.get(key)
            && core.joinable(&f, now)
        {
            core.stats.coalesced.inc();
            return Lookup::Wait(f.waiter());
        }
        let key = Bytes::copy_from_slice(key);
        let new_fill = || {
            let lane = self.lane(node).filter(|l| core.admit(hash, &l.info));
            let via = lane.as_ref().map_or(conn, |l| &l.conn).clone();
            let fill = Fill::new(now, lane.as_ref().map(|l| l.info.clone()), Some(via));
            (fill, lane)
        };
        let (fill, lane) = match core.fills.entry(key.clone()) {
            // Another client started a read in between.
            MapEntry::Occupied(o) if core.joinable(o.get(), now) => {
                core.stats.coalesced.inc();
                return Lookup::Wait(o.get().waiter());
            }
            // A read sent too long ago (stuck behind a dead connection, say) is not joined:
            // a new one takes its place, and the old one can no longer insert.
            MapEntry::Occupied(mut o) => {
                let (fill, lane) = new_fill();
                o.insert(fill.clone());
                (fill, lane)
            }
            MapEntry::Vacant(v) => {
                let (fill, lane) = new_fill();
                v.insert(fill.clone());
                (fill, lane)
            }
        };
        let rx = fill.waiter();
        if let Some(lane) = lane {
            self.start_fill(key, fill, &lane);
        } else if lead {
            core.stats.reads.inc();
            return Lookup::Lead(Lead {
                core: self.core.clone(),
                key,
                fill,
            });
        } else {
            core.stats.reads.inc();
            let mut req = BytesMut::new();
            encode_request(&[b"GET", &key], &mut req);
            let done = Completer {
                core: self.core.clone(),
                key,
                fill,
                tracked: false,
            };
            conn.try_send_to(
                req.freeze(),
                1,
                ReplyTo::Call(Box::new(move |r| done.run(r))),
            );
        }
        Lookup::Wait(rx)
    }

    /// Sends a tracked fill for `key` over the lane.
    fn start_fill(&self, key: Bytes, fill: Arc<Fill>, lane: &LaneHandle) {
        self.core.stats.fills.inc();
        let mut req = BytesMut::new();
        encode_request(&[b"MULTI"], &mut req);
        encode_request(&[b"PTTL", &key], &mut req);
        encode_request(&[b"GET", &key], &mut req);
        encode_request(&[b"EXEC"], &mut req);
        let done = Completer {
            core: self.core.clone(),
            key,
            fill,
            tracked: true,
        };
        let reply = ReplyTo::Call(Box::new(move |r| done.run(r)));
        lane.conn.try_send_to(req.freeze(), 4, reply);
    }

    /// Starts a background refresh of `key` unless a read is already in flight.
    fn refresh(&self, key: &[u8], node: Option<&str>) {
        let core = &self.core;
        let key = Bytes::copy_from_slice(key);
        let Some(lane) = self.lane(node) else {
            return;
        };
        let fill = match core.fills.entry(key.clone()) {
            MapEntry::Occupied(_) => return,
            MapEntry::Vacant(v) => {
                let fill = Fill::new(
                    Instant::now(),
                    Some(lane.info.clone()),
                    Some(lane.conn.clone()),
                );
                v.insert(fill.clone());
                fill
            }
        };
        core.stats.refreshes.inc();
        self.start_fill(key, fill, &lane);
    }

    /// Local hits for an MGET: one slot per key, `None` where the key is not cached. Counts
    /// each key's read for hotness; misses are not coalesced (the caller fetches them in
    /// one MGET).
    pub fn get_many<'a>(&self, keys: impl Iterator<Item = &'a [u8]>) -> Vec<Option<Value>> {
        let core = &self.core;
        let now = Instant::now();
        keys.map(|key| {
            core.reads.increment(core.hasher.hash_one(key));
            match core.store.get(key, now) {
                // MGET answers nil, not an error, for other types; only strings and nil are
                // ever cached, so a hit reads the same either way.
                Some(e) => {
                    core.stats.hits.inc();
                    e.mark_hit();
                    Some(e.value.clone())
                }
                None => {
                    core.stats.misses.inc();
                    None
                }
            }
        })
        .collect()
    }

    /// A write through corral to `key` is about to be forwarded, or was acknowledged.
    pub fn invalidate_for_write(&self, key: &[u8]) {
        let core = &self.core;
        if core.invalidate(key) {
            core.stats.local_invalidations.inc();
        }
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

    /// Drops every entry and in-flight read (FLUSHALL, FLUSHDB, SWAPDB through corral).
    pub fn flush(&self) {
        self.core.flush();
    }

    /// The `n` hottest keys with estimated GET rates and whether each is cached now.
    pub fn hot_keys(&self, n: usize) -> Vec<(HotKey, bool)> {
        self.core
            .hot
            .top(n)
            .into_iter()
            .map(|h| {
                let cached = self.core.store.contains(&h.key);
                (h, cached)
            })
            .collect()
    }

    /// State of the tracking lanes taken together: `Partial` when some of several are down.
    pub fn tracking(&self) -> Tracking {
        let states: Vec<Tracking> = self.lanes.all().iter().map(|l| l.info.tracking()).collect();
        lane::aggregate(&states)
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

    /// `name:value` lines for INFO's `# Cache` section and `CORRAL CACHE STATS`; each lane
    /// gets a `cache_lane<N>` line (`node=..,state=..,resets=..,last_reset=..`), by address.
    pub fn stats(&self) -> Vec<(String, String)> {
        let s = &self.core.stats;
        let st = &self.core.store;
        let lanes = self.lanes.all();
        let states: Vec<Tracking> = lanes.iter().map(|l| l.info.tracking()).collect();
        let down = states.iter().filter(|t| **t == Tracking::Down).count();
        let mut out: Vec<(&str, String)> = vec![
            (
                "cache_tracking",
                lane::aggregate(&states).as_str().to_string(),
            ),
            (
                "cache_stale_window_ms",
                self.health.window().as_millis().to_string(),
            ),
            (
                "cache_lane_check_ms",
                self.health.check.as_millis().to_string(),
            ),
            (
                "cache_lane_deadline_ms",
                self.health.deadline.as_millis().to_string(),
            ),
            ("cache_lanes", lanes.len().to_string()),
            ("cache_lanes_down", down.to_string()),
            (
                "cache_lane_resets",
                lanes
                    .iter()
                    .map(|l| l.info.resets())
                    .sum::<u64>()
                    .to_string(),
            ),
            ("cache_hits", s.hits.get().to_string()),
            ("cache_misses", s.misses.get().to_string()),
            ("cache_coalesced", s.coalesced.get().to_string()),
            ("cache_fills", s.fills.get().to_string()),
            ("cache_reads", s.reads.get().to_string()),
            ("cache_inserts", s.inserts.get().to_string()),
            ("cache_invalidations", s.invalidations.get().to_string()),
            (
                "cache_local_invalidations",
                s.local_invalidations.get().to_string(),
            ),
            ("cache_flushes", s.flushes.get().to_string()),
            ("cache_refreshes", s.refreshes.get().to_string()),
            ("cache_oversized", s.oversized.get().to_string()),
            ("cache_evictions", st.evictions().to_string()),
            ("cache_entries", st.len().to_string()),
            ("cache_bytes", st.bytes().to_string()),
            ("cache_inflight_reads", self.core.fills.len().to_string()),
        ];
        let mut out: Vec<(String, String)> =
            out.drain(..).map(|(k, v)| (k.to_string(), v)).collect();
        for (i, l) in lanes.iter().enumerate() {
            let info = &l.info;
            // INFO values are `key=value` lists split on commas: keep the cause free of them.
            let cause = info
                .last_reset()
                .unwrap_or_else(|| "none".into())
                .replace([',', '\r', '\n'], " ");
            out.push((
                format!("cache_lane{i}"),
                format!(
                    "node={},state={},resets={},last_reset={cause}",
                    info.addr,
                    info.tracking().as_str(),
                    info.resets(),
                ),
            ));
        }
        out
    }
}

impl Core {
    /// Hot enough to keep, and not one whose recent entries were invalidated before they
    /// served anything (written about as often as read).
    fn admit(&self, hash: u64, lane: &LaneState) -> bool {
        if lane.tracking() == Tracking::Down {
            return false;
        }
        let reads = self.reads.estimate(hash);
        reads >= self.hot_threshold && self.wasted.estimate(hash) < MAX_WASTED_FILLS
    }

    /// Whether a GET arriving `now` may wait for `fill` rather than start its own read.
    fn joinable(&self, fill: &Fill, now: Instant) -> bool {
        now.saturating_duration_since(fill.started) < self.join_bound
    }

    /// XFetch: refresh with a probability that grows as expiry nears, earlier for keys whose
    /// fill took longer.
    fn should_refresh(&self, e: &Entry, now: Instant) -> bool {
        if self.beta <= 0.0 {
            return false;
        }
        let r: f64 = rand::rng().random_range(f64::MIN_POSITIVE..1.0);
        let early = e.delta.as_secs_f64() * self.beta * -r.ln();
        now + Duration::from_secs_f64(early.min(3600.0)) >= e.expires
    }

    /// Removes `key` and its in-flight read. Order matters: the read is unlinked first, so it
    /// cannot insert after the store removal.
    fn invalidate(&self, key: &[u8]) -> bool {
        let unlinked = self.fills.remove(key).is_some();
        let removed = self.store.remove(key);
        if let Some(e) = &removed
            && !e.hit.load(Ordering::Relaxed)
        {
            self.wasted.increment(self.hasher.hash_one(key));
        }
        unlinked || removed.is_some()
    }

    fn flush(&self) {
        self.fills.clear();
        self.store.clear();
        self.stats.flushes.inc();
    }

    /// A tracked fill finished (runs on the lane task, in wire order with invalidations).
    fn complete_fill(&self, key: &Bytes, fill: &Arc<Fill>, r: JobResult) {
        let parsed = r.and_then(|bytes| {
            value::parse_fill_reply(&bytes).map_err(|cause| UpstreamError::BadReply { cause })
        });
        let result = match parsed {
            Ok((pttl, value)) => {
                self.insert_if_current(key, fill, pttl, &value);
                Ok(value)
            }
            Err(e) => {
                self.fills.remove_if(key, |_, f| Arc::ptr_eq(f, fill));
                Err(e)
            }
        };
        fill.publish(result);
    }

    /// A coalesced plain GET finished: share it, keep nothing.
    fn complete_read(&self, key: &Bytes, fill: &Arc<Fill>, r: JobResult) {
        self.fills.remove_if(key, |_, f| Arc::ptr_eq(f, fill));
        let result = r.and_then(|bytes| {
            Value::from_get_reply(&bytes).ok_or_else(|| UpstreamError::BadReply {
                cause: format!(
                    "unexpected GET reply {:?}",
                    String::from_utf8_lossy(&bytes[..bytes.len().min(64)])
                ),
            })
        });
        fill.publish(result);
    }

    /// Stores the value if `fill` is still the key's current read, i.e. no invalidation came
    /// since it was sent.
    fn insert_if_current(&self, key: &Bytes, fill: &Arc<Fill>, pttl: i64, value: &Value) {
        let tracking = fill.lane.as_ref().map_or(Tracking::Down, |l| l.tracking());
        let cacheable = match value {
            Value::Error(_) => false,
            v if v.size() > self.max_value => {
                self.stats.oversized.inc();
                false
            }
            _ => tracking != Tracking::Down,
        };
        // The key's TTL counts from when Redis ran the read, which is after `started`.
        let mut life = self.max_age;
        if pttl >= 0 {
            life = life.min(Duration::from_millis(pttl as u64));
        }
        if tracking == Tracking::Fallback {
            life = life.min(self.fallback_ttl);
        }
        if let MapEntry::Occupied(o) = self.fills.entry(key.clone()) {
            if !Arc::ptr_eq(o.get(), fill) {
                return;
            }
            if cacheable && !life.is_zero() {
                let entry = Entry::new(value.clone(), fill.started + life, fill.started.elapsed());
                self.store.insert(key.clone(), entry);
                self.stats.inserts.inc();
            }
            o.remove();
        }
    }
}

async fn decay_hot_keys(core: Arc<Core>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_secs(10));
    loop {
        tokio::select! {
            _ = tick.tick() => {
                core.hot.decay();
                // A key penalised for wasted fills gets another chance after a while.
                core.wasted.halve();
            }
            _ = shutdown.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upstream::LinkObserver;

    fn core() -> Core {
        Core {
            store: Store::new(1 << 20),
            fills: DashMap::default(),
            reads: FrequencySketch::new(1024),
            wasted: FrequencySketch::new(1024),
            hot: HotKeys::default(),
            hasher: foldhash::fast::RandomState::default(),
            stats: Stats::default(),
            hot_threshold: 2,
            max_value: 1024,
            max_age: Duration::from_secs(60),
            fallback_ttl: Duration::from_secs(1),
            beta: 1.0,
            join_bound: Duration::from_secs(5),
        }
    }

    fn lane_on() -> Arc<LaneState> {
        Arc::new(LaneState::new("test", Tracking::On))
    }

    fn fill(c: &Core, key: &'static [u8]) -> Arc<Fill> {
        fill_on(c, key, lane_on())
    }

    fn fill_on(c: &Core, key: &'static [u8], lane: Arc<LaneState>) -> Arc<Fill> {
        let f = Fill::new(Instant::now(), Some(lane), None);
        c.fills.insert(Bytes::from_static(key), f.clone());
        f
    }

    const REPLY: &[u8] = b"+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n:-1\r\n$1\r\nv\r\n";

    #[test]
    fn fill_inserts_when_nothing_intervened() {
        let c = core();
        let f = fill(&c, b"k");
        let rx = f.waiter();
        c.complete_fill(&Bytes::from_static(b"k"), &f, Ok(Bytes::from_static(REPLY)));
        assert!(c.store.get(b"k", Instant::now()).is_some());
        assert!(c.fills.is_empty());
        assert_eq!(rx.peek(), Some(Ok(Value::Bulk(Bytes::from_static(b"v")))));
    }

    #[test]
    fn fill_after_invalidation_does_not_insert_but_answers_waiters() {
        let c = core();
        let f = fill(&c, b"k");
        let rx = f.waiter();
        c.invalidate(b"k");
        c.complete_fill(&Bytes::from_static(b"k"), &f, Ok(Bytes::from_static(REPLY)));
        assert!(c.store.get(b"k", Instant::now()).is_none());
        assert!(rx.peek().is_some());
    }

    #[test]
    fn superseded_fill_does_not_remove_the_new_one() {
        let c = core();
        let old = fill(&c, b"k");
        c.invalidate(b"k");
        let new = fill(&c, b"k");
        c.complete_fill(
            &Bytes::from_static(b"k"),
            &old,
            Ok(Bytes::from_static(REPLY)),
        );
        assert!(c.store.get(b"k", Instant::now()).is_none());
        assert!(Arc::ptr_eq(&*c.fills.get(&b"k"[..]).unwrap(), &new));
    }

    #[test]
    fn oversized_errors_and_untracked_values_are_not_cached() {
        let c = core();
        let big = format!(
            "+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n:-1\r\n$2000\r\n{}\r\n",
            "x".repeat(2000)
        );
        let f = fill(&c, b"big");
        c.complete_fill(&Bytes::from_static(b"big"), &f, Ok(Bytes::from(big)));
        assert!((c.store.len() == 0));
        let f = fill(&c, b"e");
        let err = b"+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n:-1\r\n-WRONGTYPE x\r\n";
        c.complete_fill(&Bytes::from_static(b"e"), &f, Ok(Bytes::from_static(err)));
        assert!((c.store.len() == 0));
        let f = fill_on(&c, b"k", Arc::new(LaneState::new("test", Tracking::Down)));
        c.complete_fill(&Bytes::from_static(b"k"), &f, Ok(Bytes::from_static(REPLY)));
        assert!((c.store.len() == 0));
    }

    #[test]
    fn invalidation_push_removes_keys_and_null_flushes() {
        let lane = lane::Lane {
            core: Arc::new(core()),
            info: lane_on(),
            stop: CancellationToken::new(),
        };
        for k in [&b"a"[..], b"b"] {
            let e = Entry::new(
                Value::Nil,
                Instant::now() + Duration::from_secs(60),
                Duration::ZERO,
            );
            lane.core.store.insert(Bytes::copy_from_slice(k), e);
        }
        lane.push(b">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\na\r\n");
        assert!(!lane.core.store.contains(b"a"));
        assert!(lane.core.store.contains(b"b"));
        lane.push(b">2\r\n$10\r\ninvalidate\r\n_\r\n");
        assert!((lane.core.store.len() == 0));
    }

    #[test]
    fn a_lost_lane_drops_every_entry_and_records_why() {
        let lane = lane::Lane {
            core: Arc::new(core()),
            info: lane_on(),
            stop: CancellationToken::new(),
        };
        let e = Entry::new(
            Value::Nil,
            Instant::now() + Duration::from_secs(60),
            Duration::ZERO,
        );
        lane.core.store.insert(Bytes::from_static(b"a"), e);
        lane.down("no reply to a health-check PING within 500 ms");
        assert_eq!(lane.core.store.len(), 0);
        assert_eq!(lane.info.tracking(), Tracking::Down);
        assert_eq!(lane.info.resets(), 1);
        assert!(lane.info.last_reset().unwrap().contains("PING"));
        // Stopped on purpose (dropped with the topology, shutdown): not a reset.
        lane.stop.cancel();
        lane.down("shutting down");
        assert_eq!(lane.info.resets(), 1);
    }

    #[test]
    fn reads_older_than_the_bound_are_not_joined() {
        let c = core();
        let fresh = Fill::new(Instant::now(), None, None);
        assert!(c.joinable(&fresh, Instant::now()));
        let later = Instant::now() + Duration::from_secs(6);
        assert!(!c.joinable(&fresh, later));
    }

    #[test]
    fn ttl_bounds_entry_life() {
        let c = core();
        let f = fill(&c, b"k");
        let r = b"+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n:0\r\n$1\r\nv\r\n";
        c.complete_fill(&Bytes::from_static(b"k"), &f, Ok(Bytes::from_static(r)));
        assert!(c.store.get(b"k", Instant::now()).is_none());
    }
}
