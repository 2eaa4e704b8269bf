//! The cache's counters, and how they are shown: INFO's `# Cache` section,
//! `CORRAL CACHE STATS` and Prometheus.

use std::sync::Arc;

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::store::Store;
use super::tracking::{self, LaneState, Tracking};
use crate::striped::StripedCounter;
use crate::upstream::Health;

type Labels = Vec<(String, String)>;

/// Cache counters, exported to INFO, `CORRAL CACHE STATS` and Prometheus.
#[derive(Debug, Default)]
pub(super) struct Stats {
    pub(super) hits: StripedCounter,
    pub(super) misses: StripedCounter,
    pub(super) skipped: StripedCounter,
    pub(super) coalesced: StripedCounter,
    pub(super) fills: StripedCounter,
    pub(super) reads: StripedCounter,
    pub(super) inserts: StripedCounter,
    pub(super) invalidations: StripedCounter,
    pub(super) local_invalidations: StripedCounter,
    pub(super) flushes: StripedCounter,
    pub(super) renewals: StripedCounter,
    pub(super) refreshes: StripedCounter,
    pub(super) oversized: StripedCounter,
    pub(super) barriers: StripedCounter,
    pub(super) barrier_failures: StripedCounter,
    pub(super) touches: StripedCounter,
    entries: Gauge,
    bytes: Gauge,
    evictions: Gauge,
    sweep_clears: Gauge,
    stale_window_ms: Gauge,
    long_window: Gauge,
    lone_reads: Gauge,
    /// Per lane (label `node`): its state as [`Tracking::as_gauge`].
    lane_state: Family<Labels, Gauge>,
    /// Per lane: losses and resets since it was created.
    lane_resets: Family<Labels, Gauge>,
    /// Per lane: always 1, with the state and the last reset cause as labels.
    lane_info: Family<Labels, Gauge>,
}

/// What the counters are reported with: the store, the lanes' health settings and state.
pub(super) struct Sources<'a> {
    pub(super) store: &'a Store,
    pub(super) health: &'a Health,
    /// Every lane, ordered by address.
    pub(super) lanes: &'a [Arc<LaneState>],
    /// Reads in flight now.
    pub(super) inflight: usize,
    /// The sketch's noise floor: what a key read once is estimated at (`Admission`).
    pub(super) noise_floor: u8,
    /// Whether the sketch counts over its long window (`window.rs`).
    pub(super) long_window: bool,
    /// Whether reads GETs lead are left alone lately (`lone.rs`).
    pub(super) lone_reads: bool,
}

impl Stats {
    /// Registers the cache's metrics.
    pub(super) fn register(&self, registry: &mut Registry) {
        for (name, help, c) in self.counters() {
            registry.register(name, help, c.clone());
        }
        for (name, help, g) in self.gauges() {
            registry.register(name, help, g.clone());
        }
        for (name, help, f) in self.lane_families() {
            registry.register(name, help, f.clone());
        }
    }

    /// Counters with their Prometheus names and help.
    fn counters(&self) -> [(&'static str, &'static str, &StripedCounter); 16] {
        [
            (
                "cache_hits",
                "GETs answered from the local cache",
                &self.hits,
            ),
            ("cache_misses", "GETs not answered locally", &self.misses),
            (
                "cache_skipped",
                "GETs of connections reading only cold keys, forwarded with no lookup",
                &self.skipped,
            ),
            (
                "cache_coalesced",
                "GETs that joined another client's upstream read",
                &self.coalesced,
            ),
            (
                "cache_fills",
                "Hot-key reads over the tracking connection",
                &self.fills,
            ),
            (
                "cache_reads",
                "Coalesced GETs sent upstream for keys not hot",
                &self.reads,
            ),
            ("cache_inserts", "Entries stored", &self.inserts),
            (
                "cache_invalidations",
                "Keys invalidated by Redis (CLIENT TRACKING)",
                &self.invalidations,
            ),
            (
                "cache_local_invalidations",
                "Keys invalidated by writes through corral",
                &self.local_invalidations,
            ),
            (
                "cache_flushes",
                "Whole-cache flushes (FLUSHALL, lost tracking)",
                &self.flushes,
            ),
            (
                "cache_lane_renewals",
                "Tracking connections renewed on purpose: Redis tracked many keys the cache no longer held",
                &self.renewals,
            ),
            (
                "cache_refreshes",
                "Background refreshes of entries near expiry",
                &self.refreshes,
            ),
            (
                "cache_oversized",
                "Values too large to cache",
                &self.oversized,
            ),
            (
                "cache_barriers",
                "Read barriers passed or failed (read_barrier): one PING per tracking lane each",
                &self.barriers,
            ),
            (
                "cache_barrier_failures",
                "Read barriers a lane did not answer in time: the cache was flushed",
                &self.barrier_failures,
            ),
            (
                "cache_touches",
                "Keys served locally, touched on Redis (TOUCH) so its LRU/LFU sees them used",
                &self.touches,
            ),
        ]
    }

    /// Gauges with their Prometheus names and help.
    fn gauges(&self) -> [(&'static str, &'static str, &Gauge); 7] {
        [
            ("cache_entries", "Entries in the local cache", &self.entries),
            (
                "cache_bytes",
                "Bytes charged to the cache budget",
                &self.bytes,
            ),
            (
                "cache_evictions",
                "Entries evicted for the memory budget",
                &self.evictions,
            ),
            (
                "cache_sweep_clears",
                "Sweeps of the admission bar's return that cleared the store instead, as they would have kept few entries",
                &self.sweep_clears,
            ),
            (
                "cache_stale_window_ms",
                "Longest a cached value can outlive a write while its tracking lane is silently dead (lane_check_ms + lane_deadline_ms)",
                &self.stale_window_ms,
            ),
            (
                "cache_long_window",
                "1 while the admission sketch counts over its long window (the cache serves most GETs and few keys are written), else 0",
                &self.long_window,
            ),
            (
                "cache_lone_reads",
                "1 while few GETs join the reads others lead, so a key neither cached nor read again lately is read with no lead (a stampede on it costs two reads), else 0",
                &self.lone_reads,
            ),
        ]
    }

    /// Per-lane gauges with their Prometheus names and help.
    fn lane_families(&self) -> [(&'static str, &'static str, &Family<Labels, Gauge>); 3] {
        [
            (
                "cache_lane_state",
                "Tracking lane state per node: 0 down, 1 tracking, 2 ttl-only fallback",
                &self.lane_state,
            ),
            (
                "cache_lane_resets",
                "Times each tracking lane was lost or reset (dead, fill timed out, closed)",
                &self.lane_resets,
            ),
            (
                "cache_lane_info",
                "Tracking lanes, with their state and last reset cause as labels",
                &self.lane_info,
            ),
        ]
    }

    /// Refreshes the gauges (entries, bytes, evictions, lanes) before a scrape.
    pub(super) fn update_gauges(&self, src: &Sources<'_>) {
        let st = src.store;
        self.entries.set(st.len() as i64);
        self.bytes.set(st.bytes() as i64);
        self.evictions.set(st.evictions() as i64);
        self.sweep_clears.set(st.sweep_clears() as i64);
        self.stale_window_ms
            .set(src.health.window().as_millis() as i64);
        self.long_window.set(i64::from(src.long_window));
        self.lone_reads.set(i64::from(src.lone_reads));
        // Rebuilt at each scrape, so lanes dropped with the topology leave no series behind.
        self.lane_state.clear();
        self.lane_resets.clear();
        self.lane_info.clear();
        for info in src.lanes {
            let node = vec![("node".to_string(), info.addr.clone())];
            self.lane_state
                .get_or_create(&node)
                .set(info.tracking().as_gauge());
            self.lane_resets
                .get_or_create(&node)
                .set(info.resets() as i64);
            let labels = vec![
                ("node".to_string(), info.addr.clone()),
                ("state".to_string(), info.tracking().as_str().to_string()),
                (
                    "last_reset".to_string(),
                    info.last_reset().unwrap_or_else(|| "none".into()),
                ),
            ];
            self.lane_info.get_or_create(&labels).set(1);
        }
    }

    /// `name:value` lines for INFO's `# Cache` section and `CORRAL CACHE STATS`; each lane
    /// gets a `cache_lane<N>` line (`node=..,state=..,resets=..,last_reset=..`), by address.
    pub(super) fn lines(&self, src: &Sources<'_>) -> Vec<(String, String)> {
        let st = src.store;
        let health = src.health;
        let lanes = src.lanes;
        let states: Vec<Tracking> = lanes.iter().map(|l| l.tracking()).collect();
        let down = states.iter().filter(|t| **t == Tracking::Down).count();
        let resets: u64 = lanes.iter().map(|l| l.resets()).sum();
        let out: Vec<(&str, String)> = vec![
            (
                "cache_tracking",
                tracking::aggregate(&states).as_str().to_string(),
            ),
            (
                "cache_stale_window_ms",
                health.window().as_millis().to_string(),
            ),
            ("cache_lane_check_ms", health.check.as_millis().to_string()),
            (
                "cache_lane_deadline_ms",
                health.deadline.as_millis().to_string(),
            ),
            ("cache_lanes", lanes.len().to_string()),
            ("cache_lanes_down", down.to_string()),
            ("cache_lane_resets", resets.to_string()),
            ("cache_hits", self.hits.get().to_string()),
            ("cache_misses", self.misses.get().to_string()),
            ("cache_skipped", self.skipped.get().to_string()),
            ("cache_coalesced", self.coalesced.get().to_string()),
            ("cache_fills", self.fills.get().to_string()),
            ("cache_reads", self.reads.get().to_string()),
            ("cache_inserts", self.inserts.get().to_string()),
            ("cache_invalidations", self.invalidations.get().to_string()),
            (
                "cache_local_invalidations",
                self.local_invalidations.get().to_string(),
            ),
            ("cache_flushes", self.flushes.get().to_string()),
            ("cache_lane_renewals", self.renewals.get().to_string()),
            ("cache_refreshes", self.refreshes.get().to_string()),
            ("cache_oversized", self.oversized.get().to_string()),
            ("cache_barriers", self.barriers.get().to_string()),
            (
                "cache_barrier_failures",
                self.barrier_failures.get().to_string(),
            ),
            ("cache_touches", self.touches.get().to_string()),
            ("cache_evictions", st.evictions().to_string()),
            ("cache_sweep_clears", st.sweep_clears().to_string()),
            ("cache_entries", st.len().to_string()),
            ("cache_bytes", st.bytes().to_string()),
            ("cache_inflight_reads", src.inflight.to_string()),
            ("cache_noise_floor", src.noise_floor.to_string()),
            (
                "cache_admission_window",
                if src.long_window { "long" } else { "short" }.to_string(),
            ),
            ("cache_lone_reads", u8::from(src.lone_reads).to_string()),
        ];
        let mut out: Vec<(String, String)> =
            out.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
        for (i, info) in lanes.iter().enumerate() {
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
