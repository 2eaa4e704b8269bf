//! One shared, pipelined connection to the upstream, kept alive by its own task.
//!
//! Clients hand it a [`Job`]: the encoded bytes of one or more consecutive requests and how many
//! replies they produce. Jobs are written in arrival order; replies come back in the same order,
//! so the task hands each job the contiguous slice of the read buffer that holds its replies.
//! The task reconnects with jittered exponential backoff; while the upstream is unreachable,
//! jobs fail at once instead of waiting.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use rand::Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::time::{Instant, sleep_until, timeout};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::handshake;
use super::status::UpstreamStatus;
use crate::error::UpstreamError;
use crate::resp::{Proto, ReplyScanner};

/// Replies to a job: the raw bytes of all its replies, or why there are none.
pub type JobResult = Result<Bytes, UpstreamError>;

/// Where a job's replies go.
pub enum ReplyTo {
    /// To a waiting task.
    Channel(oneshot::Sender<JobResult>),
    /// To a function run on the connection task itself, in wire order with push frames; it
    /// must be quick and must not block.
    Call(Box<dyn FnOnce(JobResult) + Send>),
}

impl std::fmt::Debug for ReplyTo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ReplyTo::Channel(_) => "Channel",
            ReplyTo::Call(_) => "Call",
        })
    }
}

impl ReplyTo {
    fn send(self, r: JobResult) {
        match self {
            // A closed receiver means the client went away; its replies are dropped.
            ReplyTo::Channel(tx) => drop(tx.send(r)),
            ReplyTo::Call(f) => f(r),
        }
    }

    /// Nobody waits for the reply any more.
    fn is_closed(&self) -> bool {
        match self {
            ReplyTo::Channel(tx) => tx.is_closed(),
            ReplyTo::Call(_) => false,
        }
    }
}

/// Requests sent together, answered together.
#[derive(Debug)]
pub struct Job {
    /// Encoded requests.
    pub bytes: Bytes,
    /// How many top-level replies they produce.
    pub count: u32,
    /// Where the replies go.
    pub reply: ReplyTo,
}

/// Told about a connection's life and its push frames, on the connection task, in wire order
/// with replies. The cache's tracking lane uses this to apply invalidations.
pub trait LinkObserver: Send + Sync + std::fmt::Debug {
    /// A connection is up; `tracking` says whether `CLIENT TRACKING ON` succeeded.
    fn up(&self, tracking: bool);
    /// The connection is gone: anything learnt through it may have missed invalidations.
    fn down(&self);
    /// A RESP3 push frame arrived (whole frame bytes).
    fn push(&self, frame: &[u8]);
    /// A push frame arrived while a job is in flight. An observer for a connection whose
    /// pushes belong to the client reading its replies (CLIENT TRACKING through corral)
    /// appends the frame to `out`, which goes to that job in wire order with its replies,
    /// and returns true; by default pushes are not replies and go to [`LinkObserver::push`].
    fn push_inline(&self, _frame: &[u8], _out: &mut BytesMut) -> bool {
        false
    }
    /// A job's replies are complete: an observer that keeps pushes in wire order moves the
    /// pushes it was given while no job was in flight, and that nobody took yet, to `out`
    /// (they came before these replies).
    fn take_pending(&self, _out: &mut BytesMut) {}
}

/// Settings one connection task needs.
#[derive(Debug, Clone)]
pub struct ConnSettings {
    /// `host:port`.
    pub addr: String,
    /// ACL user for AUTH/HELLO.
    pub user: Option<String>,
    /// Password for AUTH/HELLO.
    pub password: Option<String>,
    /// Protocol spoken on this connection.
    pub proto: Proto,
    /// Deadline for connect plus handshake.
    pub connect_timeout: Duration,
    /// First reconnect delay.
    pub backoff_min: Duration,
    /// Largest reconnect delay.
    pub backoff_max: Duration,
    /// Turn on `CLIENT TRACKING` after the handshake (RESP3 only).
    pub tracking: bool,
    /// Database to SELECT after the handshake.
    pub db: u32,
    /// Reconnect after a failure. A dedicated (pinned) connection carries per-client state
    /// that a new connection would not have, so it fails for good instead.
    pub reconnect: bool,
    /// Send READONLY after the handshake: reads on a cluster replica.
    pub readonly: bool,
}

/// Handle to a connection task; cheap to clone.
#[derive(Debug, Clone)]
pub struct UpstreamConn {
    tx: mpsc::Sender<Job>,
    reset: Arc<Notify>,
    addr: Arc<str>,
    dead: Arc<AtomicBool>,
}

/// Most jobs queued per connection before senders wait (backpressure, bounded memory).
const QUEUE: usize = 4096;
/// Stop gathering more jobs into one write once this much is buffered.
const WRITE_BATCH: usize = 64 * 1024;
/// Read buffer growth step.
const READ_CHUNK: usize = 16 * 1024;

impl UpstreamConn {
    /// Starts the connection task.
    pub fn spawn(
        settings: ConnSettings,
        status: Arc<UpstreamStatus>,
        shutdown: CancellationToken,
        observer: Option<Arc<dyn LinkObserver>>,
    ) -> UpstreamConn {
        let (tx, rx) = mpsc::channel(QUEUE);
        let reset = Arc::new(Notify::new());
        let dead = Arc::new(AtomicBool::new(false));
        let handle = UpstreamConn {
            tx,
            reset: reset.clone(),
            addr: settings.addr.clone().into(),
            dead: dead.clone(),
        };
        tokio::spawn(async move {
            let reconnect = settings.reconnect;
            let addr = settings.addr.clone();
            let mut rx = run(settings, status, rx, reset, shutdown, observer).await;
            dead.store(true, Ordering::Relaxed);
            if !reconnect {
                // Answer whatever is still sent until every handle is gone.
                rx.close();
                while let Some(job) = rx.recv().await {
                    job.reply.send(Err(UpstreamError::ConnectionLost {
                        addr: addr.clone(),
                        cause: "dedicated connection closed".into(),
                    }));
                }
            }
        });
        handle
    }

    /// Queues `bytes` (holding `count` requests) and returns where their replies will arrive.
    pub async fn send(&self, bytes: Bytes, count: u32) -> oneshot::Receiver<JobResult> {
        let (tx, rx) = oneshot::channel();
        self.send_to(bytes, count, ReplyTo::Channel(tx)).await;
        rx
    }

    /// Queues `bytes` (holding `count` requests); their replies go to `reply`.
    pub async fn send_to(&self, bytes: Bytes, count: u32, reply: ReplyTo) {
        let job = Job {
            bytes,
            count,
            reply,
        };
        if let Err(mpsc::error::SendError(job)) = self.tx.send(job).await {
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
        match self.tx.try_send(job) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(job)) => job.reply.send(Err(UpstreamError::Busy {
                addr: self.addr.to_string(),
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
        // while reconnecting cannot kill the next, healthy connection.
        self.reset.notify_waiters();
    }

    /// The upstream address, for error messages.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Whether two handles drive the same connection task.
    pub fn same(&self, other: &UpstreamConn) -> bool {
        Arc::ptr_eq(&self.reset, &other.reset)
    }

    /// True once a connection that does not reconnect has failed or closed.
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Relaxed)
    }
}

async fn run(
    s: ConnSettings,
    status: Arc<UpstreamStatus>,
    mut rx: mpsc::Receiver<Job>,
    reset: Arc<Notify>,
    shutdown: CancellationToken,
    observer: Option<Arc<dyn LinkObserver>>,
) -> mpsc::Receiver<Job> {
    let mut backoff = s.backoff_min;
    loop {
        let attempt = tokio::select! {
            r = timeout(s.connect_timeout, connect(&s, &status)) => r,
            _ = shutdown.cancelled() => return rx,
        };
        let cause = match attempt {
            Ok(Ok((stream, tracking))) => {
                backoff = s.backoff_min;
                status.connected();
                info!(upstream = %s.addr, proto = s.proto.as_int(), tracking, "upstream connected");
                if let Some(o) = &observer {
                    o.up(tracking);
                }
                let mut link = Link::new(&s.addr, observer.clone());
                let cause = tokio::select! {
                    r = link.serve(stream, &mut rx) => r,
                    _ = reset.notified() => "reset after a request timed out".to_string(),
                    _ = shutdown.cancelled() => "shutting down".to_string(),
                };
                link.fail_all(&cause);
                if let Some(o) = &observer {
                    o.down();
                }
                status.lost();
                status.disconnected(&cause);
                // Shut down, or every handle dropped: nothing left to serve.
                if shutdown.is_cancelled() || rx.is_closed() {
                    return rx;
                }
                if !s.reconnect {
                    debug!(upstream = %s.addr, %cause, "dedicated connection closed");
                    return rx;
                }
                warn!(upstream = %s.addr, %cause, "upstream connection lost");
                // Reconnect at once after losing a working connection; back off only on
                // failed attempts.
                continue;
            }
            Ok(Err(e)) => e,
            Err(_) => "connect timed out".to_string(),
        };
        status.disconnected(&cause);
        if !s.reconnect {
            while let Ok(job) = rx.try_recv() {
                job.reply.send(Err(UpstreamError::Unavailable {
                    addr: s.addr.clone(),
                    cause: cause.clone(),
                }));
            }
            return rx;
        }
        warn!(upstream = %s.addr, %cause, retry_ms = backoff.as_millis() as u64, "upstream unavailable");
        let jitter = rand::rng().random_range(0.5..1.0);
        let deadline = Instant::now() + backoff.mul_f64(jitter);
        backoff = (backoff * 2).min(s.backoff_max);
        // Fail fast while waiting: a client should learn at once that the upstream is down.
        loop {
            tokio::select! {
                _ = sleep_until(deadline) => break,
                job = rx.recv() => match job {
                    Some(job) => {
                        job.reply.send(Err(UpstreamError::Unavailable {
                            addr: s.addr.clone(),
                            cause: cause.clone(),
                        }));
                    }
                    None => return rx,
                },
                _ = shutdown.cancelled() => return rx,
            }
        }
    }
}

/// Connects and runs the handshake within the connect timeout.
///
/// # Errors
/// The connect, the handshake or the deadline failed.
pub(super) async fn open(s: &ConnSettings, status: &UpstreamStatus) -> Result<TcpStream, String> {
    match timeout(s.connect_timeout, connect(s, status)).await {
        Ok(r) => r.map(|(stream, _)| stream),
        Err(_) => Err("connect timed out".into()),
    }
}

/// Connects and runs the handshake; returns the stream and whether tracking is on.
async fn connect(s: &ConnSettings, status: &UpstreamStatus) -> Result<(TcpStream, bool), String> {
    let mut stream = TcpStream::connect(&s.addr)
        .await
        .map_err(|e| e.to_string())?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let version = handshake::hello(
        &mut stream,
        s.proto,
        s.user.as_deref(),
        s.password.as_deref(),
    )
    .await?;
    if let Some(v) = version {
        status.set_version(&v);
    }
    if s.db != 0 {
        handshake::select(&mut stream, s.proto, s.db).await?;
    }
    if s.readonly {
        handshake::readonly(&mut stream, s.proto).await?;
    }
    let tracking = s.tracking && handshake::tracking_on(&mut stream, s.proto).await?;
    Ok((stream, tracking))
}

/// A job whose replies are still arriving.
struct Waiter {
    remaining: u32,
    reply: ReplyTo,
    /// Replies already received, when a push frame split them (never on shared connections in
    /// practice, since they do not subscribe or track).
    partial: BytesMut,
}

/// State of one live connection.
struct Link {
    addr: String,
    inflight: VecDeque<Waiter>,
    rbuf: BytesMut,
    wbuf: BytesMut,
    scanner: ReplyScanner,
    /// Start of the next frame in `rbuf`, relative to its front.
    frame_start: usize,
    observer: Option<Arc<dyn LinkObserver>>,
}

impl Link {
    fn new(addr: &str, observer: Option<Arc<dyn LinkObserver>>) -> Self {
        Link {
            observer,
            addr: addr.to_string(),
            inflight: VecDeque::new(),
            rbuf: BytesMut::with_capacity(READ_CHUNK),
            wbuf: BytesMut::with_capacity(READ_CHUNK),
            scanner: ReplyScanner::new(),
            frame_start: 0,
        }
    }

    /// Moves jobs to the socket and replies to their senders until the connection fails;
    /// returns why. Reads and writes proceed independently, so a large pipelined write can
    /// never deadlock against a large reply.
    async fn serve(&mut self, mut stream: TcpStream, rx: &mut mpsc::Receiver<Job>) -> String {
        let (mut rd, mut wr) = stream.split();
        loop {
            if self.rbuf.capacity() - self.rbuf.len() < READ_CHUNK / 4 {
                self.rbuf.reserve(READ_CHUNK);
            }
            tokio::select! {
                biased;
                r = rd.read_buf(&mut self.rbuf) => match r {
                    Ok(0) => return "closed by upstream".into(),
                    Ok(_) => {
                        if let Err(e) = self.deliver() {
                            return e;
                        }
                    }
                    Err(e) => return e.to_string(),
                },
                r = wr.write_buf(&mut self.wbuf), if !self.wbuf.is_empty() => {
                    if let Err(e) = r {
                        return e.to_string();
                    }
                }
                job = rx.recv(), if self.wbuf.len() < WRITE_BATCH => match job {
                    Some(job) => {
                        self.enqueue(job);
                        // Let client tasks that are ready right now add their requests to
                        // this write: one write (and one read) for many clients' requests
                        // costs Redis and the kernel far less than one each.
                        tokio::task::yield_now().await;
                        while self.wbuf.len() < WRITE_BATCH {
                            match rx.try_recv() {
                                Ok(job) => self.enqueue(job),
                                Err(_) => break,
                            }
                        }
                    }
                    None => return "shutting down".into(),
                },
            }
        }
    }

    fn enqueue(&mut self, job: Job) {
        if job.reply.is_closed() {
            // The client gave up (timed out or disconnected) before this was written: nothing
            // has reached Redis yet, so skip it rather than run it.
            return;
        }
        self.wbuf.extend_from_slice(&job.bytes);
        if job.count == 0 {
            // Requests answered only by push frames (SUBSCRIBE on RESP3): nothing to wait for.
            job.reply.send(Ok(Bytes::new()));
            return;
        }
        self.inflight.push_back(Waiter {
            remaining: job.count,
            reply: job.reply,
            partial: BytesMut::new(),
        });
    }

    /// Hands complete replies to their waiters.
    fn deliver(&mut self) -> Result<(), String> {
        while let Some(frame) = self
            .scanner
            .next_frame(&self.rbuf)
            .map_err(|e| e.to_string())?
        {
            if frame.push {
                let start = self.frame_start;
                if let (Some(o), Some(front)) = (&self.observer, self.inflight.front_mut()) {
                    let mut kept = BytesMut::new();
                    if o.push_inline(&self.rbuf[start..frame.end], &mut kept) {
                        // The push stays between the replies where Redis put it.
                        front.partial.extend_from_slice(&self.rbuf[..start]);
                        front.partial.extend_from_slice(&kept);
                        self.rbuf.advance(frame.end);
                        self.scanner.consumed(frame.end);
                        self.frame_start = 0;
                        continue;
                    }
                }
                // Keep the replies before the push; hand the push to the observer.
                match &self.observer {
                    Some(o) => o.push(&self.rbuf[start..frame.end]),
                    None => debug!(upstream = %self.addr, "dropped push frame"),
                }
                if let Some(front) = self.inflight.front_mut() {
                    front.partial.extend_from_slice(&self.rbuf[..start]);
                }
                self.rbuf.advance(frame.end);
                self.scanner.consumed(frame.end);
                self.frame_start = 0;
                continue;
            }
            let Some(front) = self.inflight.front_mut() else {
                return Err("reply without a request".into());
            };
            self.frame_start = frame.end;
            front.remaining -= 1;
            if front.remaining > 0 {
                continue;
            }
            let mut bytes = self.rbuf.split_to(frame.end);
            self.scanner.consumed(frame.end);
            self.frame_start = 0;
            if let Some(w) = self.inflight.pop_front() {
                let mut all = BytesMut::new();
                if let Some(o) = &self.observer {
                    o.take_pending(&mut all);
                }
                if !w.partial.is_empty() || !all.is_empty() {
                    all.extend_from_slice(&w.partial);
                    all.extend_from_slice(&bytes);
                    bytes = all;
                }
                w.reply.send(Ok(bytes.freeze()));
            }
        }
        Ok(())
    }

    fn fail_all(&mut self, cause: &str) {
        for w in self.inflight.drain(..) {
            w.reply.send(Err(UpstreamError::ConnectionLost {
                addr: self.addr.clone(),
                cause: cause.to_string(),
            }));
        }
    }
}
