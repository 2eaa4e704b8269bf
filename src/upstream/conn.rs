//! One shared, pipelined connection to the upstream, kept alive by its own task: the handle
//! clients use ([`UpstreamConn`]). The task is in `task.rs`, the live connection in `link.rs`.
//!
//! Clients hand it a [`Job`]: the encoded bytes of one or more consecutive requests and how many
//! replies they produce. Jobs are written in arrival order and answered in the same order. The
//! task reconnects with jittered exponential backoff; while the upstream is unreachable, jobs
//! fail at once instead of waiting. A connection that reconnects is also checked for life
//! ([`super::Health`], `health.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::job::{Job, JobResult, LinkObserver, PartHook, Reply, ReplyTo};
use super::settings::ConnSettings;
use super::status::UpstreamStatus;
use super::task::Task;
use crate::error::UpstreamError;

/// Handle to a connection task; cheap to clone: one reference count, however many parts
/// the handle has. Every client's round clones and drops it, each count a locked add and
/// subtract (and, with several worker threads, a cache line they take from each other):
/// with each part counted on its own (the channel's sender twice), that took 1.1% of
/// corral's CPU on Zipf GETs at -P 16.
#[derive(Debug, Clone)]
pub struct UpstreamConn(Arc<Handle>);

/// What a handle holds; the task shares the atomics.
#[derive(Debug)]
struct Handle {
    tx: mpsc::Sender<Job>,
    reset: Arc<Reset>,
    addr: Arc<str>,
    dead: Arc<AtomicBool>,
    /// A connection that does not reconnect failed to connect at all: nothing sent to it ever
    /// reached Redis.
    never_up: Arc<AtomicBool>,
    /// Serves one client at a time (does not reconnect).
    dedicated: bool,
    /// The server's client id for the live connection (0: none, or not reported).
    client_id: Arc<AtomicU64>,
    /// Whether the connection is live, for [`UpstreamConn::live`].
    up: Arc<Up>,
    /// Its task times its requests out (see [`ConnSettings::request_timeout`]).
    times_out: bool,
}

/// Whether the connection is live (its handshake done), and a wake-up when it becomes so.
#[derive(Debug, Default)]
pub(super) struct Up {
    live: AtomicBool,
    notify: Notify,
}

impl Up {
    /// The task's connection finished its handshake (`true`) or ended.
    pub(super) fn set(&self, live: bool) {
        // Release: whoever sees it live sees the client id stored before.
        self.live.store(live, Ordering::Release);
        if live {
            self.notify.notify_waiters();
        }
    }
}

/// How a handle ends the live connection for a new one: [`UpstreamConn::reset`] and
/// [`UpstreamConn::renew`].
#[derive(Debug, Default)]
pub(super) struct Reset {
    pub(super) notify: Notify,
    /// The reset asked for is a renewal, not a fault.
    pub(super) renew: AtomicBool,
}

/// Most jobs queued per connection before senders wait (backpressure, bounded memory).
const QUEUE: usize = 4096;

impl UpstreamConn {
    /// Starts the connection task.
    pub fn spawn(
        settings: ConnSettings,
        status: Arc<UpstreamStatus>,
        shutdown: CancellationToken,
        observer: Option<Arc<dyn LinkObserver>>,
    ) -> UpstreamConn {
        let (tx, rx) = mpsc::channel(QUEUE);
        let reset = Arc::new(Reset::default());
        let dead = Arc::new(AtomicBool::new(false));
        let never_up = Arc::new(AtomicBool::new(false));
        let client_id = Arc::new(AtomicU64::new(0));
        let up = Arc::new(Up::default());
        let handle = UpstreamConn(Arc::new(Handle {
            tx,
            reset: reset.clone(),
            addr: settings.addr.clone().into(),
            dead: dead.clone(),
            never_up: never_up.clone(),
            dedicated: !settings.reconnect,
            client_id: client_id.clone(),
            up: up.clone(),
            times_out: settings.reconnect && settings.request_timeout.is_some(),
        }));
        let task = Task {
            s: settings,
            status,
            rx,
            reset,
            client_id,
            up,
            never_up,
            observer,
            shutdown,
        };
        tokio::spawn(task.run(dead));
        handle
    }

    /// Queues `bytes` (holding `count` requests) and returns where their replies will arrive.
    pub async fn send(&self, bytes: Bytes, count: u32) -> oneshot::Receiver<JobResult> {
        let (tx, rx) = oneshot::channel();
        self.send_to(bytes, count, ReplyTo::Channel(tx)).await;
        rx
    }

    /// Like [`UpstreamConn::send`], for requests whose replies the caller takes in parts
    /// as they arrive, when they are large (see [`Reply`]); `hook` sees each part first, on
    /// the connection's task.
    pub async fn send_streamed(
        &self,
        bytes: Bytes,
        count: u32,
        hook: Option<PartHook>,
    ) -> oneshot::Receiver<Reply> {
        let (tx, rx) = oneshot::channel();
        self.send_to(bytes, count, ReplyTo::Streamed(tx, hook))
            .await;
        rx
    }

    /// Queues `bytes` (holding `count` requests); their replies go to `reply`.
    pub async fn send_to(&self, bytes: Bytes, count: u32, reply: ReplyTo) {
        let job = Job {
            bytes,
            count,
            reply,
        };
        if let Err(mpsc::error::SendError(job)) = self.0.tx.send(job).await {
            job.reply.send(Err(UpstreamError::ShuttingDown));
        }
    }

    /// Like [`UpstreamConn::send_to`] without waiting: fails the job at once (with `Busy`)
    /// when the queue is full. For callers that cannot await.
    pub fn try_send_to(&self, bytes: Bytes, count: u32, reply: ReplyTo) {
        let job = Job {
            bytes,
            count,
            reply,
        };
        match self.0.tx.try_send(job) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(job)) => job.reply.send(Err(UpstreamError::Busy {
                addr: self.0.addr.to_string(),
            })),
            Err(mpsc::error::TrySendError::Closed(job)) => {
                job.reply.send(Err(UpstreamError::ShuttingDown))
            }
        }
    }

    /// Drops the current connection (failing what is in flight) and reconnects; used when a
    /// reply is overdue, since nothing after it on this connection can arrive sooner.
    pub fn reset(&self) {
        // Wakes only a live connection's waiter: no permit is stored, so a reset asked for
        // while reconnecting cannot kill the next, healthy connection. A fault, even if a
        // renewal was asked for too.
        self.0.reset.renew.store(false, Ordering::Relaxed);
        self.0.reset.notify.notify_waiters();
    }

    /// Ends the live connection on purpose and makes a new one at once, failing what is in
    /// flight as a reset does; not reported as an upstream error. A tracking lane is renewed
    /// so that Redis forgets the keys it tracked for the old connection.
    pub fn renew(&self) {
        self.0.reset.renew.store(true, Ordering::Relaxed);
        self.0.reset.notify.notify_waiters();
    }

    /// The upstream address, for error messages.
    pub fn addr(&self) -> &str {
        &self.0.addr
    }

    /// Whether two handles drive the same connection task.
    pub fn same(&self, other: &UpstreamConn) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }

    /// Whether its task fails a request unanswered for `upstream.request_timeout_ms` (and
    /// everything in flight with it): a waiter needs no timer of its own.
    pub fn times_out(&self) -> bool {
        self.0.times_out
    }

    /// Whether this connection serves one client at a time (a transaction, a blocking
    /// command, a script): nothing of another client can be stuck behind its replies.
    pub fn is_dedicated(&self) -> bool {
        self.0.dedicated
    }

    /// True once a connection that does not reconnect has failed or closed.
    pub fn is_dead(&self) -> bool {
        self.0.dead.load(Ordering::Relaxed)
    }

    /// True once a connection that does not reconnect failed to connect at all (then it is
    /// dead too): no request sent to it reached Redis.
    pub fn never_connected(&self) -> bool {
        self.0.never_up.load(Ordering::Relaxed)
    }

    /// The server's client id for this connection (from HELLO), 0 while unknown.
    pub fn client_id(&self) -> u64 {
        self.0.client_id.load(Ordering::Relaxed)
    }

    /// Waits until the connection is live: its handshake done, so its [`client_id`] known
    /// (on Redis 6 and later), and the requests queued for it written next. At once if it
    /// is.
    ///
    /// [`client_id`]: UpstreamConn::client_id
    pub async fn live(&self) {
        loop {
            let notified = self.0.up.notify.notified();
            if self.0.up.live.load(Ordering::Acquire) {
                return;
            }
            notified.await;
        }
    }
}
