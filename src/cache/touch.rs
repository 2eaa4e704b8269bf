//! The hottest cached keys, touched on Redis now and then.
//!
//! A GET the cache serves never reaches Redis, so Redis's idea of when a key was last used
//! (`OBJECT IDLETIME`, the LRU clock) and how often (the LFU counter) stops at the read that
//! filled it. Under an `allkeys-lru` or `allkeys-lfu` `maxmemory-policy`, Redis would then
//! take the keys read most through corral for the least used, and evict them first: a hot
//! key's entry invalidated, its next read a miss that the application reloads from its
//! database. Every `touch_ms`, the keys of [`super::hotkeys`]'s top that a sampled GET read
//! since the last look and that are cached now go to Redis as `TOUCH key`, on the tracking
//! lane of their node (at most [`super::hotkeys::SLOTS`] a look). To Redis, a key sampled in
//! every look is then used within the last `touch_ms`, about as it would be without the
//! cache (and counted as one read per look, not one per GET); a key sampled less often (read
//! less than some hundreds of times a second) is touched as often as it is sampled.

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

/// Touches the hot keys the cache served, every `every`, until `shutdown`.
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
            .sampled_hot()
            .into_iter()
            .filter(|k| core.store.contains(k))
            .collect();
        for (lane, bytes, count) in batches(&route, &keys) {
            core.stats.touches.inc_by(u64::from(count));
            // Nothing waits for the replies: a key deleted meanwhile is touched by no one, and
            // an error (a Redis user without TOUCH) changes nothing corral serves.
            let done = |r: crate::upstream::JobResult| {
                if let Err(e) = r {
                    debug!(error = %e, "TOUCH of hot keys failed");
                }
            };
            lane.conn
                .send_to(bytes, count, ReplyTo::Call(Box::new(done)))
                .await;
        }
    }
}

/// `keys` as `TOUCH key` requests, one batch per lane that tracks (a lane down holds none of
/// them), with how many each holds.
fn batches(route: &Route, keys: &[Bytes]) -> Vec<(Arc<LaneHandle>, Bytes, u32)> {
    let mut out: Vec<(Arc<LaneHandle>, BytesMut, u32)> = Vec::new();
    for key in keys {
        let Some(lane) = route.lane(key) else {
            continue;
        };
        if lane.info.tracking() != Tracking::On {
            continue;
        }
        let i = match out.iter().position(|(l, ..)| Arc::ptr_eq(l, &lane)) {
            Some(i) => i,
            None => {
                out.push((lane, BytesMut::new(), 0));
                out.len() - 1
            }
        };
        let (_, bytes, count) = &mut out[i];
        encode_request(&[b"TOUCH", key], bytes);
        *count += 1;
    }
    out.into_iter()
        .map(|(lane, bytes, count)| (lane, bytes.freeze(), count))
        .collect()
}
