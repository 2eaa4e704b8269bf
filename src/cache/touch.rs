//! The cached keys the cache served lately, touched on Redis now and then.
//!
//! A GET the cache serves never reaches Redis, so Redis's idea of when a key was last used
//! (`OBJECT IDLETIME`, the LRU clock) and how often (the LFU counter) stops at the read that
//! filled it. Under an `allkeys-lru` or `allkeys-lfu` `maxmemory-policy`, Redis would then
//! take the keys read most through corral for the least used, and evict them first: a hot
//! key's entry invalidated, its next read a miss that the application reloads from its
//! database. Every `touch_ms`, the keys that hits the cache served and a sample (one in
//! [`super::hotkeys::SAMPLE_EVERY`]) took since the last look (`touched.rs`: at most 4,096
//! a second, and [`super::touched::MOST`] a look) and that are still cached go to Redis as
//! `TOUCH`, on the tracking lane of their node, in batches of at most [`BATCH_KEYS`] keys,
//! each lane's spread over three quarters of the look (a second at most): standalone one
//! `TOUCH` of a batch's keys, in cluster mode one per key (a `TOUCH` of several keys must
//! name one slot). To Redis, a key sampled in every look is then used within about the last
//! two looks, about as it would be without the cache (and counted as one read per look, not
//! one per GET); a key sampled less often (read less than some hundreds of times a second)
//! is touched as often as it is sampled, unless the look's bound was reached first.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use super::coherence::Core;
use super::lane::{LaneHandle, Lanes};
use super::tracking::Tracking;
use crate::cluster::slot::key_slot;
use crate::resp::encode::encode_request;
use crate::upstream::ReplyTo;
use crate::upstream::cluster::ClusterUpstream;

/// Where a key's `TOUCH` goes: standalone, the upstream's lane; in cluster mode the lane of
/// the master serving the key's slot.
pub(super) struct Route {
    pub(super) lanes: Arc<Lanes>,
    pub(super) default_lane: Option<Arc<LaneHandle>>,
    pub(super) cluster: Option<Arc<ClusterUpstream>>,
}

impl Route {
    fn lane(&self, key: &[u8]) -> Option<Arc<LaneHandle>> {
        match &self.cluster {
            None => self.default_lane.clone(),
            Some(c) => {
                let master = c.master_of(key_slot(key))?;
                self.lanes.get(&master.to_string())
            }
        }
    }
}

/// Touches the cached keys of sampled hits, every `every`, until `shutdown`.
pub(super) async fn run(
    core: Arc<Core>,
    route: Route,
    every: Duration,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        let keys: Vec<Bytes> = core
            .admission
            .touched()
            .into_iter()
            .filter(|k| core.store.contains(k))
            .collect();
        let per_lane = batches(&route, &keys);
        // Spread over most of the look, and a second at most: Redis runs a connection's
        // requests back to back, so one batch of a look's 1,024 keys would hold it for about
        // 0.9 ms at once. Each lane's batches are spaced; lanes (cluster nodes) go alike.
        let steps = per_lane.iter().map(Vec::len).max().unwrap_or(0);
        let spread = (every * 3 / 4).min(SPREAD_AT_MOST);
        let start = tokio::time::Instant::now();
        let mut per_lane: Vec<_> = per_lane.into_iter().map(Vec::into_iter).collect();
        for step in 0..steps {
            if step > 0 {
                let at = start + spread.mul_f64(step as f64 / steps as f64);
                tokio::select! {
                    _ = tokio::time::sleep_until(at) => {}
                    _ = shutdown.cancelled() => return,
                }
            }
            for batch in per_lane.iter_mut().filter_map(Iterator::next) {
                send(&core, batch).await;
            }
        }
    }
}

/// Sends one batch; nothing waits for the replies: a key deleted meanwhile is touched by no
/// one, and an error (a Redis user without TOUCH) changes nothing corral serves.
async fn send(core: &Core, batch: Batch) {
    core.stats.touches.inc_by(batch.keys);
    let done = |r: crate::upstream::JobResult| {
        if let Err(e) = r {
            debug!(error = %e, "TOUCH of cached keys failed");
        }
    };
    batch
        .lane
        .conn
        .send_to(batch.bytes, batch.requests, ReplyTo::Call(Box::new(done)))
        .await;
}

/// The longest a look's batches are spread over.
const SPREAD_AT_MOST: Duration = Duration::from_secs(1);

/// Keys in one batch at most: about 0.1 ms of Redis's time.
const BATCH_KEYS: usize = 128;

/// `TOUCH` requests for one lane.
struct Batch {
    lane: Arc<LaneHandle>,
    bytes: Bytes,
    /// Requests in `bytes`: replies to wait for.
    requests: u32,
    /// Keys they touch.
    keys: u64,
}

/// `keys` as batches of `TOUCH` requests of at most [`BATCH_KEYS`] keys, lane by lane, for
/// the lanes that track (a lane down holds none of them): standalone one `TOUCH` of a
/// batch's keys, in cluster mode one `TOUCH key` per key.
fn batches(route: &Route, keys: &[Bytes]) -> Vec<Vec<Batch>> {
    let mut per_lane: Vec<(Arc<LaneHandle>, Vec<&[u8]>)> = Vec::new();
    for key in keys {
        let Some(lane) = route.lane(key) else {
            continue;
        };
        if lane.info.tracking() != Tracking::On {
            continue;
        }
        match per_lane.iter_mut().find(|(l, _)| Arc::ptr_eq(l, &lane)) {
            Some((_, keys)) => keys.push(key),
            None => per_lane.push((lane, vec![key])),
        }
    }
    let mut out = Vec::new();
    for (lane, keys) in per_lane {
        let mut batches = Vec::new();
        for chunk in keys.chunks(BATCH_KEYS) {
            let mut bytes = BytesMut::new();
            let requests = if route.cluster.is_some() {
                for key in chunk {
                    encode_request(&[b"TOUCH", key], &mut bytes);
                }
                chunk.len()
            } else {
                let args: Vec<&[u8]> = std::iter::once(&b"TOUCH"[..])
                    .chain(chunk.iter().copied())
                    .collect();
                encode_request(&args, &mut bytes);
                1
            };
            batches.push(Batch {
                lane: lane.clone(),
                bytes: bytes.freeze(),
                // At most `BATCH_KEYS`.
                requests: u32::try_from(requests).unwrap_or(u32::MAX),
                keys: chunk.len() as u64,
            });
        }
        out.push(batches);
    }
    out
}
