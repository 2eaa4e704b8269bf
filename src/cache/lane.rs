//! Tracking lanes: one RESP3 connection with `CLIENT TRACKING ON` per upstream master, their
//! state and health, and (in cluster mode) one lane per current master, no more.
//!
//! A lane is health-checked by its connection task (`upstream::Health`, strict): a PING after
//! `lane_check_ms` of quiet, and no more than `lane_deadline_ms` of silence while a PING or a
//! fill is outstanding. A lane found dead, lost, or reset after a fill timed out drops every
//! entry at once and reads go uncached until a new lane is up and tracking.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::{Core, Tracking};
use crate::upstream::cluster::ClusterUpstream;
use crate::upstream::{ConnSettings, LinkObserver, UpstreamConn, UpstreamStatus};

/// What GETs, fills and INFO read about one lane; written by the lane's connection task.
#[derive(Debug)]
pub(super) struct LaneState {
    /// The node the lane is connected to.
    pub(super) addr: String,
    state: AtomicU8,
    resets: AtomicU64,
    last_reset: Mutex<Option<String>>,
}

impl LaneState {
    pub(super) fn new(addr: &str, state: Tracking) -> LaneState {
        LaneState {
            addr: addr.to_string(),
            state: AtomicU8::new(state as u8),
            resets: AtomicU64::new(0),
            last_reset: Mutex::new(None),
        }
    }

    pub(super) fn tracking(&self) -> Tracking {
        Tracking::from_u8(self.state.load(Ordering::Relaxed))
    }

    fn set(&self, t: Tracking) {
        self.state.store(t as u8, Ordering::Relaxed);
    }

    /// Times the lane was lost or reset since it was created.
    pub(super) fn resets(&self) -> u64 {
        self.resets.load(Ordering::Relaxed)
    }

    /// Why the lane was last lost or reset, if it ever was.
    pub(super) fn last_reset(&self) -> Option<String> {
        self.last_reset
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// A running lane. Dropping the last handle stops its connection task.
#[derive(Debug)]
pub(super) struct LaneHandle {
    pub(super) conn: UpstreamConn,
    pub(super) info: Arc<LaneState>,
    stop: CancellationToken,
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

    /// Every lane, ordered by address.
    pub(super) fn all(&self) -> Vec<Arc<LaneHandle>> {
        let mut v: Vec<Arc<LaneHandle>> = self.lock().values().cloned().collect();
        v.sort_by(|a, b| a.info.addr.cmp(&b.info.addr));
        v
    }
}

/// The lanes' state taken together: in cluster mode one lane down means only that master's
/// keys are read uncached, which is not the cache being down.
pub(super) fn aggregate(states: &[Tracking]) -> Tracking {
    if states.is_empty() || states.iter().all(|s| *s == Tracking::Down) {
        Tracking::Down
    } else if states.contains(&Tracking::Down) {
        Tracking::Partial
    } else if states.contains(&Tracking::Fallback) {
        Tracking::Fallback
    } else {
        Tracking::On
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
    pub(super) core: Arc<Core>,
    pub(super) info: Arc<LaneState>,
    /// Cancelled when the lane is dropped or corral stops: not a reset worth reporting.
    pub(super) stop: CancellationToken,
}

impl LinkObserver for Lane {
    fn up(&self, tracking: bool) {
        self.core.flush();
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
            self.info.resets.fetch_add(1, Ordering::Relaxed);
            *self
                .info
                .last_reset
                .lock()
                .unwrap_or_else(|p| p.into_inner()) = Some(cause.to_string());
            warn!(node = %self.info.addr, %cause, "cache tracking connection reset: entries dropped, reads uncached until it is back");
        }
    }

    fn push(&self, frame: &[u8]) {
        use redis_protocol::resp3::types::OwnedFrame as F;
        let decoded = redis_protocol::resp3::decode::complete::decode(frame);
        let Ok(Some((F::Push { data, .. }, _))) = decoded else {
            debug!("undecodable push on tracking connection");
            return;
        };
        let core = &self.core;
        match data.as_slice() {
            [F::BlobString { data: kind, .. }, keys] if kind.as_slice() == b"invalidate" => {
                match keys {
                    F::Array { data: keys, .. } => {
                        for k in keys {
                            if let F::BlobString { data: k, .. } = k {
                                core.invalidate(k);
                                core.stats.invalidations.inc();
                            }
                        }
                    }
                    // FLUSHALL/FLUSHDB anywhere, or tracking table overflow.
                    F::Null => core.flush(),
                    _ => debug!("unexpected invalidate payload"),
                }
            }
            _ => debug!("ignored push on tracking connection"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_lane_down_of_several_is_partial_not_down() {
        use Tracking::*;
        assert_eq!(aggregate(&[]), Down);
        assert_eq!(aggregate(&[Down, Down]), Down);
        assert_eq!(aggregate(&[On, Down, On]), Partial);
        assert_eq!(aggregate(&[On, Fallback]), Fallback);
        assert_eq!(aggregate(&[On, On]), On);
    }
}
