//! The cached keys the cache served lately, touched on Redis now and then.
//!
//! A GET the cache serves never reaches Redis, so Redis's idea of when a key was last used
//! (`OBJECT IDLETIME`, the LRU clock) and how often (the LFU counter) stops at the read that
//! filled it. Under an `allkeys-lru` or `allkeys-lfu` `maxmemory-policy`, Redis would then
//! take the keys read most through corral for the least used, and evict them first: a hot
//! key's entry invalidated, its next read a miss that the application reloads from its
//! database. Every `touch_ms`, the keys a sampled GET (one in
//! [`super::hotkeys::SAMPLE_EVERY`]) read since the last look (`touched.rs`, at most
//! [`super::touched::MOST`]) that are cached now go to Redis as `TOUCH`, on the tracking lane
//! of their node: standalone one `TOUCH` of them all, in cluster mode one per key (a
//! `TOUCH` of several keys must name one slot). To Redis, a key sampled in every look is
//! then used within the last `touch_ms`, about as it would be without the cache (and counted
//! as one read per look, not one per GET); a key sampled less often (read less than some
//! hundreds of times a second) is touched as often as it is sampled.

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

/// Touches the cached keys sampled GETs read, every `every`, until `shutdown`.
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
        for Batch {
            lane,
            bytes,
            requests,
            keys,
        } in batches(&route, &keys)
        {
            core.stats.touches.inc_by(keys);
            // Nothing waits for the replies: a key deleted meanwhile is touched by no one, and
            // an error (a Redis user without TOUCH) changes nothing corral serves.
            let done = |r: crate::upstream::JobResult| {
                if let Err(e) = r {
                    debug!(error = %e, "TOUCH of hot keys failed");
                }
            };
            lane.conn
                .send_to(bytes, requests, ReplyTo::Call(Box::new(done)))
                .await;
        }
    }
}

/// The `TOUCH` requests of one lane.
struct Batch {
    lane: Arc<LaneHandle>,
    bytes: Bytes,
    /// Requests in `bytes`: replies to wait for.
    requests: u32,
    /// Keys they touch.
    keys: u64,
}

/// `keys` as `TOUCH` requests, one batch per lane that tracks (a lane down holds none of
/// them): standalone one `TOUCH` of all its keys, in cluster mode one `TOUCH key` per key.
fn batches(route: &Route, keys: &[Bytes]) -> Vec<Batch> {
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
            None => per_lane.push((lane, vec![b"TOUCH", key])),
        }
    }
    per_lane
        .into_iter()
        .map(|(lane, args)| {
            let keys = &args[1..];
            let mut bytes = BytesMut::new();
            let requests = if route.cluster.is_some() {
                for key in keys {
                    encode_request(&[b"TOUCH", key], &mut bytes);
                }
                keys.len()
            } else {
                encode_request(&args, &mut bytes);
                1
            };
            Batch {
                lane,
                bytes: bytes.freeze(),
                // At most `touched::MOST` keys a look.
                requests: u32::try_from(requests).unwrap_or(u32::MAX),
                keys: keys.len() as u64,
            }
        })
        .collect()
}
