//! The read barrier (`[cache] read_barrier`): a round of a client's GETs is answered from the
//! cache only once a PING sent on every tracking lane after the round was read has been
//! answered. Redis sends its invalidation pushes on a lane in the order it ran the writes,
//! and a write acknowledged to its writer before a GET was sent to corral ran before that
//! PING, so its invalidation has been applied by then: even a write made directly on Redis
//! is never read back stale, which tracking alone cannot promise (Redis writes the writer's
//! `+OK` before it writes the invalidation, and a reader told by the writer can reach corral
//! in between).
//!
//! The rounds of every connection that ask while a PING is not yet sent share it: one PING
//! per lane per batch of rounds, sent by a task of its own so that a client going away
//! cancels nothing.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::sync::Notify;

use super::coherence::Core;
use super::lane::Lanes;
use super::tracking::Tracking;
use crate::resp::encode::encode_request;

/// The barrier's state: the PING rounds are joining, until its task sends it.
#[derive(Debug)]
pub(super) struct Barrier {
    core: Arc<Core>,
    lanes: Arc<Lanes>,
    /// How long a lane's PONG may take: past it the cache is flushed, as the lane's own
    /// health check would do once it notices.
    deadline: Duration,
    open: Mutex<Option<Arc<Pass>>>,
    ping: Bytes,
}

/// One PING (per lane) and the rounds waiting for it.
#[derive(Debug, Default)]
struct Pass {
    /// When the PING was sent; `None` if a lane did not answer it.
    floor: OnceLock<Option<Instant>>,
    notify: Notify,
}

impl Barrier {
    pub(super) fn new(core: Arc<Core>, lanes: Arc<Lanes>, deadline: Duration) -> Barrier {
        let mut ping = BytesMut::new();
        encode_request(&[b"PING"], &mut ping);
        Barrier {
            core,
            lanes,
            deadline,
            open: Mutex::new(None),
            ping: ping.freeze(),
        }
    }

    /// Waits until every invalidation Redis sent before now has been applied. Returns the
    /// round's floor: a read in flight started at or before it may predate a write the
    /// round must see, and is not joined. `None`: the round must not look anything up (a
    /// lane did not answer and the cache was flushed, but a slow lane may still hold an
    /// invalidation of an entry filled since; or a lane is not tracking).
    pub(super) async fn pass(self: &Arc<Self>) -> Option<Instant> {
        let pass = {
            let mut open = self.open.lock().unwrap_or_else(|p| p.into_inner());
            match &*open {
                Some(pass) => pass.clone(),
                None => {
                    let pass = Arc::new(Pass::default());
                    *open = Some(pass.clone());
                    // Runs after the tasks already woken, whose rounds join this PING.
                    tokio::spawn(self.clone().run());
                    pass
                }
            }
        };
        loop {
            let notified = pass.notify.notified();
            if let Some(floor) = pass.floor.get() {
                return *floor;
            }
            notified.await;
        }
    }

    /// Sends the open PING on every tracking lane and publishes its floor once every lane
    /// answered. A lane that does not (lost, or slower than the deadline) may have lost
    /// invalidations: the cache is flushed, as losing a lane does. A lane Redis refused
    /// tracking on (entries kept `fallback_ttl_ms`, not invalidated) vouches for nothing:
    /// the round looks nothing up.
    async fn run(self: Arc<Self>) {
        // Spawned on a worker of a multi-thread runtime, this task would run before the
        // tasks already queued there, whose rounds are to join its PING.
        if tokio::runtime::Handle::current().runtime_flavor()
            != tokio::runtime::RuntimeFlavor::CurrentThread
        {
            tokio::task::yield_now().await;
        }
        let Some(pass) = self.open.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return;
        };
        let sent = Instant::now();
        let until = tokio::time::Instant::from_std(sent) + self.deadline;
        let mut replies = Vec::new();
        let mut tracked = true;
        let mut answered = true;
        for lane in self.lanes.all() {
            match lane.info.tracking() {
                Tracking::On => {
                    let send = lane.conn.send(self.ping.clone(), 1);
                    match tokio::time::timeout_at(until, send).await {
                        Ok(rx) => replies.push(rx),
                        Err(_) => answered = false,
                    }
                }
                Tracking::Fallback => tracked = false,
                // Nothing of a lane down is cached.
                Tracking::Down | Tracking::Partial => {}
            }
        }
        // Any reply does: an error (`-BUSY`, `-LOADING`) comes after the pushes before it too.
        for rx in replies {
            let pong = tokio::time::timeout_at(until, rx).await;
            answered &= matches!(pong, Ok(Ok(Ok(_))));
        }
        self.core.stats.barriers.inc();
        let floor = (answered && tracked).then_some(sent);
        if !answered {
            self.core.stats.barrier_failures.inc();
            self.core.flush();
        }
        if pass.floor.set(floor).is_ok() {
            pass.notify.notify_waiters();
        }
    }
}
