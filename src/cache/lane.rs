//! Tracking lanes: one RESP3 connection with `CLIENT TRACKING ON` per upstream master, their
//! health, and (in cluster mode) one lane per current master, no more.
//!
//! Two of the coherence rules (see [`super::coherence`] for all three) are kept here, by
//! [`Lane`], the lane's observer, which runs on the lane's connection task:
//!
//! 1. The lane's replies and Redis's invalidation pushes share one FIFO and are applied by the
//!    lane's own task, in wire order: a fill inserts before the push that invalidates it is
//!    applied, never after.
//! 3. Losing the lane, or (re)connecting it, flushes everything: invalidations may have been
//!    missed.
//!
//! A lane is health-checked by its connection task (`upstream::Health`, strict): a PING after
//! `lane_check_ms` of quiet, and no more than `lane_deadline_ms` of silence while a PING or a
//! fill is outstanding. A lane found dead, lost, or reset after a fill timed out drops every
//! entry at once and reads go uncached until a new lane is up and tracking.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::coherence::Core;
use super::tracking::{LaneState, Tracking};
use crate::upstream::cluster::ClusterUpstream;
use crate::upstream::{ConnSettings, LinkObserver, UpstreamConn, UpstreamStatus};

/// A running lane. Dropping the last handle stops its connection task.
#[derive(Debug)]
pub(super) struct LaneHandle {
    pub(super) conn: UpstreamConn,
    pub(super) info: Arc<LaneState>,
    stop: CancellationToken,
}

#[cfg(test)]
impl LaneHandle {
    /// A lane over `conn` whose tracking is on, for tests of what a GET does with it.
    pub(super) fn for_test(conn: UpstreamConn) -> Self {
        LaneHandle {
            conn,
            info: Arc::new(LaneState::new("test", Tracking::On)),
            stop: CancellationToken::new(),
        }
    }
}

impl Drop for LaneHandle {
    /// A lane dropped with the topology must not keep reconnecting to a node that left.
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Every lane, by node address.
#[derive(Debug)]
pub(super) struct Lanes {
    core: Arc<Core>,
    /// RESP3, tracking, strict health checks; `addr` is set per lane.
    settings: ConnSettings,
    status: Arc<UpstreamStatus>,
    shutdown: CancellationToken,
    map: Mutex<HashMap<String, Arc<LaneHandle>>>,
}

impl Lanes {
    pub(super) fn new(
        core: Arc<Core>,
        settings: ConnSettings,
        status: Arc<UpstreamStatus>,
        shutdown: CancellationToken,
    ) -> Lanes {
        Lanes {
            core,
            settings,
            status,
            shutdown,
            map: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<String, Arc<LaneHandle>>> {
        self.map.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The lane to `addr`, if there is one.
    pub(super) fn get(&self, addr: &str) -> Option<Arc<LaneHandle>> {
        self.lock().get(addr).cloned()
    }

    /// The lane to `addr`, started if there is none.
    pub(super) fn start(&self, addr: &str) -> Arc<LaneHandle> {
        let mut lanes = self.lock();
        if let Some(l) = lanes.get(addr) {
            return l.clone();
        }
        let handle = Arc::new(self.spawn(addr));
        lanes.insert(addr.to_string(), handle.clone());
        handle
    }

    fn spawn(&self, addr: &str) -> LaneHandle {
        let info = Arc::new(LaneState::new(addr, Tracking::Down));
        let stop = self.shutdown.child_token();
        let observer: Arc<dyn LinkObserver> = Arc::new(Lane {
            core: self.core.clone(),
            info: info.clone(),
            stop: stop.clone(),
        });
        let settings = ConnSettings {
            addr: addr.to_string(),
            ..self.settings.clone()
        };
        let conn = UpstreamConn::spawn(settings, self.status.clone(), stop.clone(), Some(observer));
        LaneHandle { conn, info, stop }
    }

    /// Keeps exactly one lane per master in `masters`: lanes of nodes that are no longer
    /// masters are dropped (their tasks stop), and missing ones are started.
    pub(super) fn follow(&self, masters: &[String]) {
        let mut lanes = self.lock();
        lanes.retain(|addr, _| {
            let keep = masters.contains(addr);
            if !keep {
                info!(node = %addr, "tracking lane dropped: no longer a master");
            }
            keep
        });
        for m in masters {
            if !lanes.contains_key(m) {
                let handle = Arc::new(self.spawn(m));
                lanes.insert(m.clone(), handle);
            }
        }
    }

    /// Renews every tracking lane (`renew.rs`): each one up and tracking ends its connection
    /// and makes a new one at once, and Redis forgets the keys it tracked for the old one.
    /// Returns whether any was.
    pub(super) fn renew_all(&self) -> bool {
        let mut any = false;
        for lane in self.lock().values() {
            if lane.info.tracking() == Tracking::On {
                lane.conn.renew();
                any = true;
            }
        }
        any
    }

    /// Every lane, ordered by address.
    pub(super) fn all(&self) -> Vec<Arc<LaneHandle>> {
        let mut v: Vec<Arc<LaneHandle>> = self.lock().values().cloned().collect();
        v.sort_by(|a, b| a.info.addr.cmp(&b.info.addr));
        v
    }
}

/// Cluster mode: starts a lane for every master and drops those of nodes that left, each
/// time the slot map changes.
pub(super) async fn follow_topology(
    lanes: Arc<Lanes>,
    cluster: Arc<ClusterUpstream>,
    mut epoch: watch::Receiver<u64>,
    shutdown: CancellationToken,
) {
    loop {
        let masters: Vec<String> = cluster.masters().iter().map(|a| a.to_string()).collect();
        // An empty map (not fetched yet, or every node unreachable) says nothing about which
        // masters left; keep what there is.
        if !masters.is_empty() {
            lanes.follow(&masters);
        }
        tokio::select! {
            r = epoch.changed() => if r.is_err() { return },
            _ = shutdown.cancelled() => return,
        }
    }
}

/// A tracking lane's observer: applies invalidation pushes and connection changes, on the
/// lane's connection task, in wire order with the fills' replies.
#[derive(Debug)]
pub(super) struct Lane {
    core: Arc<Core>,
    info: Arc<LaneState>,
    /// Cancelled when the lane is dropped or corral stops: not a reset worth reporting.
    stop: CancellationToken,
}

impl LinkObserver for Lane {
    fn up(&self, tracking: bool) {
        self.core.flush();
        // The new connection tracks nothing yet.
        (self.core.renewal).rebase(self.core.stats.invalidations.get());
        let state = if tracking {
            info!(node = %self.info.addr, "cache tracking connection up");
            Tracking::On
        } else {
            warn!(
                node = %self.info.addr,
                ttl_ms = self.core.fallback_ttl.as_millis() as u64,
                "upstream refused CLIENT TRACKING: cache entries are bounded by fallback_ttl_ms and may be stale that long"
            );
            Tracking::Fallback
        };
        self.info.set(state);
    }

    fn down(&self, cause: &str) {
        // Down first: no fill admitted from now on may insert, then drop what was vouched for.
        self.info.set(Tracking::Down);
        self.core.flush();
        if !self.stop.is_cancelled() {
            self.info.record_reset(cause);
            warn!(node = %self.info.addr, %cause, "cache tracking connection reset: entries dropped, reads uncached until it is back");
        }
    }

    fn renewed(&self) {
        // As `down`, but no fault: counted apart, and what is in flight is read again
        // elsewhere (a renewal's end fails it as a timeout, which `lost.rs` does not count).
        // Flushed before the lane is down, unlike a lost lane: the read barrier skips a lane
        // that is down, and the old connection's unread invalidations are lost for good,
        // but nothing it filled can be inserted any more (its fills failed already).
        self.core.flush();
        self.info.set(Tracking::Down);
        self.core.stats.renewals.inc();
        info!(node = %self.info.addr, "cache tracking connection renewed: Redis tracked many keys the cache no longer holds");
    }

    fn push(&self, frame: &[u8]) {
        use crate::resp::{array_elements, bulk_body, is_null, push_elements};
        // Slices of `frame`, not owned copies or a decoded tree: a write to a cached key
        // costs one push, and decoding it into one cost more than the invalidation itself.
        let Some(parts) = push_elements(frame) else {
            debug!("undecodable push on tracking connection");
            return;
        };
        let core = &self.core;
        match parts.as_slice() {
            [kind, keys] if bulk_body(kind) == Some(b"invalidate") => {
                if let Some(keys) = array_elements(keys) {
                    for k in keys.into_iter().filter_map(bulk_body) {
                        core.invalidate(k, true);
                        core.stats.invalidations.inc();
                    }
                } else if is_null(keys) {
                    // FLUSHALL/FLUSHDB anywhere, or tracking table overflow; Redis may have
                    // dropped the keys it tracked, which the renewal's estimate must not
                    // count on.
                    core.flush();
                    core.renewal.rebase(core.stats.invalidations.get());
                } else {
                    debug!("unexpected invalidate payload");
                }
            }
            _ => debug!("ignored push on tracking connection"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::super::entry::Entry;
    use super::super::value::Value;
    use super::*;

    fn lane() -> Lane {
        Lane {
            core: Arc::new(Core::for_test()),
            info: Arc::new(LaneState::new("test", Tracking::On)),
            stop: CancellationToken::new(),
        }
    }

    fn entry(key: &[u8]) -> Arc<Entry> {
        Entry::new(
            key,
            Value::Nil,
            Instant::now() + Duration::from_secs(60),
            Duration::ZERO,
            Duration::ZERO,
        )
    }

    #[test]
    fn invalidation_push_removes_keys_and_null_flushes() {
        let lane = lane();
        for k in [&b"a"[..], b"b"] {
            lane.core.store.insert(entry(k));
        }
        lane.push(b">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\na\r\n");
        assert!(!lane.core.store.contains(b"a"));
        assert!(lane.core.store.contains(b"b"));
        // Several keys in one push, each read from its own place in the frame.
        for k in [&b"key:1"[..], b"key:22"] {
            lane.core.store.insert(entry(k));
        }
        lane.push(b">2\r\n$10\r\ninvalidate\r\n*2\r\n$5\r\nkey:1\r\n$6\r\nkey:22\r\n");
        assert!(!lane.core.store.contains(b"key:1"));
        assert!(!lane.core.store.contains(b"key:22"));
        // Other pushes, and a frame that does not decode, leave entries alone.
        lane.push(b">3\r\n$7\r\nmessage\r\n$1\r\nb\r\n$1\r\nb\r\n");
        lane.push(b">2\r\n$10\r\ninvalidate\r\n*1\r\n$9\r\nb\r\n");
        assert!(lane.core.store.contains(b"b"));
        lane.push(b">2\r\n$10\r\ninvalidate\r\n_\r\n");
        assert!((lane.core.store.len() == 0));
    }

    #[test]
    fn a_lost_lane_drops_every_entry_and_records_why() {
        let lane = lane();
        lane.core.store.insert(entry(b"a"));
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
}
