//! One shared, pipelined connection to the upstream, kept alive by its own task.
//!
//! Clients hand it a [`Job`]: the encoded bytes of one or more consecutive requests and how many
//! replies they produce. Jobs are written in arrival order; replies come back in the same order,
//! so the task hands each job the contiguous slice of the read buffer that holds its replies.
//! The task reconnects with jittered exponential backoff; while the upstream is unreachable,
//! jobs fail at once instead of waiting.
//!
//! A connection that reconnects is also checked for life ([`Health`]): after `check` without a
//! byte from the upstream and with nothing outstanding, the task sends its own `PING` (whose
//! reply it consumes); no byte within `deadline` of it means the connection is half-open (a
//! NAT or firewall dropped the flow, the peer is gone without a FIN), so it is dropped, its
//! in-flight jobs get `timed out`, and a new one is made.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
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
use super::status::{NodeLife, UpstreamStatus};
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
    /// The connection is gone (`cause` says why): anything learnt through it may have missed
    /// invalidations.
    fn down(&self, cause: &str);
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
    /// Liveness checks; only for connections that reconnect (a dedicated connection may be
    /// inside MULTI, where a PING would be queued into the client's transaction).
    pub health: Option<Health>,
    /// corral's own connection, carrying no client's commands (a cache tracking lane): its
    /// local address is recorded in [`UpstreamStatus`] so MONITOR can leave its traffic out.
    pub internal: bool,
    /// Before writing a job, yield once so that other clients' ready jobs join the write (a
    /// shared connection). Off where requests must reach Redis as soon as they are queued:
    /// the pub/sub connection (an UNSUBSCRIBE must not fall behind a PUBLISH a client sends
    /// next) and dedicated connections (always off: see `Link::gather`).
    pub gather: bool,
}

/// How a long-lived connection is checked for life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Health {
    /// Quiet time (no byte from the upstream, nothing outstanding) before corral sends a PING.
    pub check: Duration,
    /// How long a PING may go unanswered (no byte at all arrives) before the connection counts
    /// as dead.
    pub deadline: Duration,
    /// Outstanding requests are held to the same bound as a PING: dead once nothing arrived
    /// for `check` and then `deadline` more while something is outstanding. For the cache's
    /// tracking lanes, whose requests are tiny fills and whose silence could hide missed
    /// invalidations; shared connections leave their requests to the request timeout, since
    /// a client's slow command is not a dead connection.
    pub strict: bool,
}

impl Health {
    /// The longest a dead connection can go unnoticed after its last sign of life.
    pub fn window(&self) -> Duration {
        self.check + self.deadline
    }
}

/// Handle to a connection task; cheap to clone.
#[derive(Debug, Clone)]
pub struct UpstreamConn {
    tx: mpsc::Sender<Job>,
    reset: Arc<Notify>,
    addr: Arc<str>,
    dead: Arc<AtomicBool>,
    /// Serves one client at a time (does not reconnect).
    dedicated: bool,
    /// The server's client id for the live connection (0: none, or not reported).
    client_id: Arc<AtomicU64>,
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
        let client_id = Arc::new(AtomicU64::new(0));
        let handle = UpstreamConn {
            tx,
            reset: reset.clone(),
            addr: settings.addr.clone().into(),
            dead: dead.clone(),
            dedicated: !settings.reconnect,
            client_id: client_id.clone(),
        };
        tokio::spawn(async move {
            let reconnect = settings.reconnect;
            let addr = settings.addr.clone();
            let link = LinkInfo {
                reset,
                client_id,
                observer,
            };
            let mut rx = run(settings, status, rx, link, shutdown).await;
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

    /// Whether this connection serves one client at a time (a transaction, a blocking
    /// command, a script): nothing of another client can be stuck behind its replies.
    pub fn is_dedicated(&self) -> bool {
        self.dedicated
    }

    /// True once a connection that does not reconnect has failed or closed.
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Relaxed)
    }

    /// The server's client id for this connection (from HELLO), 0 while unknown.
    pub fn client_id(&self) -> u64 {
        self.client_id.load(Ordering::Relaxed)
    }
}

/// What the connection task shares with its handles, besides the job queue.
struct LinkInfo {
    reset: Arc<Notify>,
    client_id: Arc<AtomicU64>,
    observer: Option<Arc<dyn LinkObserver>>,
}

async fn run(
    s: ConnSettings,
    status: Arc<UpstreamStatus>,
    mut rx: mpsc::Receiver<Job>,
    info: LinkInfo,
    shutdown: CancellationToken,
) -> mpsc::Receiver<Job> {
    let LinkInfo {
        reset,
        client_id,
        observer,
    } = info;
    let mut backoff = s.backoff_min;
    loop {
        let attempt = tokio::select! {
            r = timeout(s.connect_timeout, connect(&s, &status)) => r,
            _ = shutdown.cancelled() => return rx,
        };
        let cause = match attempt {
            Ok(Ok((stream, tracking, id))) => {
                backoff = s.backoff_min;
                client_id.store(id.unwrap_or(0), Ordering::Relaxed);
                // Registered by `connect` (for MONITOR) until the connection closes.
                let local = stream.local_addr().ok();
                status.connected();
                info!(upstream = %s.addr, proto = s.proto.as_int(), tracking, "upstream connected");
                if let Some(o) = &observer {
                    o.up(tracking);
                }
                let health = if s.reconnect { s.health } else { None };
                let mut link = Link::new(&s.addr, observer.clone(), health, status.clone());
                // A dedicated connection serves one client, whose round is already one job:
                // there is nobody to wait for.
                link.gather = s.gather && s.reconnect;
                let end = tokio::select! {
                    r = link.serve(stream, &mut rx) => r,
                    _ = reset.notified() => End::timed_out("reset after a request timed out"),
                    _ = shutdown.cancelled() => End::lost("shutting down"),
                };
                link.fail_all(&end);
                let cause = end.cause;
                client_id.store(0, Ordering::Relaxed);
                if let Some(a) = local {
                    status.remove_conn(a);
                }
                if let Some(o) = &observer {
                    o.down(&cause);
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
    let stream = match timeout(s.connect_timeout, connect(s, status)).await {
        Ok(r) => r.map(|(stream, _, _)| stream)?,
        Err(_) => return Err("connect timed out".into()),
    };
    // Not managed here: no longer registered once handed over (it is MONITOR's relay).
    if let Ok(a) = stream.local_addr() {
        status.remove_conn(a);
    }
    Ok(stream)
}

/// Connects and runs the handshake; returns the stream, whether tracking is on, and the
/// server's client id for the connection.
async fn connect(
    s: &ConnSettings,
    status: &UpstreamStatus,
) -> Result<(TcpStream, bool, Option<u64>), String> {
    let mut stream = TcpStream::connect(&s.addr)
        .await
        .map_err(|e| e.to_string())?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    // Known to MONITOR from before the handshake, whose commands are corral's own; the
    // guard forgets it if the handshake fails or is abandoned (connect timeout).
    let mut registered = stream.local_addr().ok().map(|a| {
        status.add_conn(a, s.internal);
        ConnRegistration { status, addr: a }
    });
    let greeting = handshake::hello(
        &mut stream,
        s.proto,
        s.user.as_deref(),
        s.password.as_deref(),
    )
    .await?
    .unwrap_or_default();
    if let Some(v) = &greeting.version {
        status.set_version(v);
    }
    if s.db != 0 {
        handshake::select(&mut stream, s.proto, s.db).await?;
    }
    if s.readonly {
        handshake::readonly(&mut stream, s.proto).await?;
    }
    let tracking = s.tracking && handshake::tracking_on(&mut stream, s.proto).await?;
    // Up: the caller forgets the address when the connection closes.
    if let Some(r) = registered.take() {
        std::mem::forget(r);
    }
    Ok((stream, tracking, greeting.id))
}

/// Forgets a connection's address (see [`UpstreamStatus::add_conn`]) when dropped.
struct ConnRegistration<'a> {
    status: &'a UpstreamStatus,
    addr: std::net::SocketAddr,
}

impl Drop for ConnRegistration<'_> {
    fn drop(&mut self) {
        self.status.remove_conn(self.addr);
    }
}

/// A job whose replies are still arriving.
struct Waiter {
    remaining: u32,
    reply: ReplyTo,
    /// Replies already received, when a push frame split them (never on shared connections in
    /// practice, since they do not subscribe or track).
    partial: BytesMut,
    /// corral's own health-check PING: its reply is consumed here, never handed to a client.
    probe: bool,
}

/// Why a live connection ended.
struct End {
    cause: String,
    /// No reply came in time: in-flight jobs get `timed out` rather than `connection lost`.
    timed_out: bool,
}

impl End {
    fn lost(cause: impl Into<String>) -> End {
        End {
            cause: cause.into(),
            timed_out: false,
        }
    }

    fn timed_out(cause: impl Into<String>) -> End {
        End {
            cause: cause.into(),
            timed_out: true,
        }
    }
}

/// The encoded health-check request.
const PING: &[u8] = b"*1\r\n$4\r\nPING\r\n";

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
    health: Option<Health>,
    /// When the last bytes arrived (or the connection was made): the last sign of life.
    last_rx: Instant,
    /// When `inflight` last went from empty to non-empty.
    busy_since: Instant,
    /// When the outstanding health-check PING was sent.
    probe_sent: Option<Instant>,
    /// Told when Redis answers `-BUSY` or `-LOADING` (PING is then forwarded).
    status: Arc<UpstreamStatus>,
    /// When the node was last heard from on any health-checked connection.
    life: Arc<NodeLife>,
    /// Let other clients add their requests to a write before it is made.
    gather: bool,
}

impl Link {
    fn new(
        addr: &str,
        observer: Option<Arc<dyn LinkObserver>>,
        health: Option<Health>,
        status: Arc<UpstreamStatus>,
    ) -> Self {
        let now = Instant::now();
        let life = status.node_life(addr);
        Link {
            observer,
            life,
            status,
            gather: true,
            addr: addr.to_string(),
            inflight: VecDeque::new(),
            rbuf: BytesMut::with_capacity(READ_CHUNK),
            wbuf: BytesMut::with_capacity(READ_CHUNK),
            scanner: ReplyScanner::new(),
            frame_start: 0,
            health,
            last_rx: now,
            busy_since: now,
            probe_sent: None,
        }
    }

    /// Runs the health check due now: sends a PING on a quiet idle connection, or declares
    /// the connection dead. Returns when to look again. The timer is not touched on the hot
    /// path: it fires, and this works out from the current state whether anything is due
    /// yet. Activity moves every deadline later, except that a busy connection going idle
    /// owes a PING `check` after its last reply: so a busy connection is looked at again
    /// within `check`, and the PING is never late.
    fn check_health(&mut self, h: Health, now: Instant) -> Result<Instant, End> {
        let ms = |d: Duration| d.as_millis();
        if let Some(sent) = self.probe_sent {
            let due = sent.max(self.last_rx) + h.deadline;
            if now >= due && !h.strict && !self.life.heard_since(sent) {
                // No connection to this node has heard a byte since the PING went out: Redis
                // itself is not answering (a script before its BUSY threshold, a slow command,
                // or the node unreachable as a whole), not this one flow. Replacing the
                // connection would not help; requests in flight keep `request_timeout_ms`.
                return Ok(now + h.deadline);
            }
            if now >= due {
                return Err(End::timed_out(format!(
                    "no reply to a health-check PING within {} ms",
                    ms(h.deadline)
                )));
            }
            return Ok(due);
        }
        if self.inflight.is_empty() {
            let due = self.last_rx + h.check;
            if now < due {
                return Ok(due);
            }
            self.wbuf.extend_from_slice(PING);
            self.busy_since = now;
            self.probe_sent = Some(now);
            self.inflight.push_back(Waiter {
                remaining: 1,
                reply: ReplyTo::Call(Box::new(|_| {})),
                partial: BytesMut::new(),
                probe: true,
            });
            return Ok(now + h.deadline);
        }
        if h.strict {
            let due = (self.last_rx + h.check).max(self.busy_since) + h.deadline;
            if now >= due {
                return Err(End::timed_out(format!(
                    "no reply within {} ms",
                    ms(h.check + h.deadline)
                )));
            }
            return Ok(due.min(now + h.check));
        }
        // Busy shared connection: its requests are bounded by the request timeout.
        Ok(now + h.check)
    }

    /// Moves jobs to the socket and replies to their senders until the connection fails;
    /// returns why. Reads and writes proceed independently, so a large pipelined write can
    /// never deadlock against a large reply.
    async fn serve(&mut self, mut stream: TcpStream, rx: &mut mpsc::Receiver<Job>) -> End {
        let (mut rd, mut wr) = stream.split();
        let health = self.health;
        // Without health checks the timer branch is disabled and never polled.
        let first = health.map_or(Duration::from_secs(86_400), |h| h.check);
        let timer = sleep_until(Instant::now() + first);
        tokio::pin!(timer);
        loop {
            if self.rbuf.capacity() - self.rbuf.len() < READ_CHUNK / 4 {
                self.rbuf.reserve(READ_CHUNK);
            }
            tokio::select! {
                biased;
                r = rd.read_buf(&mut self.rbuf) => match r {
                    Ok(0) => return End::lost("closed by upstream"),
                    Ok(_) => {
                        if health.is_some() {
                            self.last_rx = Instant::now();
                            self.life.heard_at(self.last_rx);
                        }
                        if let Err(e) = self.deliver() {
                            return End::lost(e);
                        }
                    }
                    Err(e) => return End::lost(e.to_string()),
                },
                r = wr.write_buf(&mut self.wbuf), if !self.wbuf.is_empty() => {
                    if let Err(e) = r {
                        return End::lost(e.to_string());
                    }
                }
                () = &mut timer, if health.is_some() => {
                    if let Some(h) = health {
                        match self.check_health(h, Instant::now()) {
                            Ok(next) => timer.as_mut().reset(next),
                            Err(end) => {
                                warn!(upstream = %self.addr, cause = %end.cause, "upstream connection unresponsive");
                                return end;
                            }
                        }
                    }
                }
                job = rx.recv(), if self.wbuf.len() < WRITE_BATCH => match job {
                    Some(job) => {
                        self.enqueue(job);
                        // Let client tasks that are ready right now add their requests to
                        // this write: one write (and one read) for many clients' requests
                        // costs Redis and the kernel far less than one each. Not on a
                        // dedicated connection: its one client has nothing more to add, and
                        // a blocking command (or EXEC) must reach Redis before what other
                        // clients sent after it, as it would going to Redis directly.
                        if self.gather {
                            tokio::task::yield_now().await;
                        }
                        while self.wbuf.len() < WRITE_BATCH {
                            match rx.try_recv() {
                                Ok(job) => self.enqueue(job),
                                Err(_) => break,
                            }
                        }
                    }
                    None => return End::lost("shutting down"),
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
        if self.health.is_some() && self.inflight.is_empty() {
            self.busy_since = Instant::now();
        }
        self.inflight.push_back(Waiter {
            remaining: job.count,
            reply: job.reply,
            partial: BytesMut::new(),
            probe: false,
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
            // One byte compared per reply in the common case: only errors are looked at.
            let reply = &self.rbuf[self.frame_start..frame.end];
            if reply.first() == Some(&b'-') && crate::commands::busy::reports_busy(reply) {
                self.status.saw_busy();
            }
            self.frame_start = frame.end;
            front.remaining -= 1;
            if front.remaining > 0 {
                continue;
            }
            let mut bytes = self.rbuf.split_to(frame.end);
            self.scanner.consumed(frame.end);
            self.frame_start = 0;
            if let Some(w) = self.inflight.pop_front() {
                if w.probe {
                    self.probe_sent = None;
                    continue;
                }
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

    fn fail_all(&mut self, end: &End) {
        for w in self.inflight.drain(..) {
            let e = if end.timed_out {
                UpstreamError::Timeout {
                    addr: self.addr.clone(),
                }
            } else {
                UpstreamError::ConnectionLost {
                    addr: self.addr.clone(),
                    cause: end.cause.clone(),
                }
            };
            w.reply.send(Err(e));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health(strict: bool) -> Health {
        Health {
            check: Duration::from_millis(500),
            deadline: Duration::from_millis(300),
            strict,
        }
    }

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn busy(link: &mut Link, at: Instant) {
        link.busy_since = at;
        link.inflight.push_back(Waiter {
            remaining: 1,
            reply: ReplyTo::Call(Box::new(|_| {})),
            partial: BytesMut::new(),
            probe: false,
        });
    }

    #[test]
    fn a_quiet_idle_connection_gets_a_ping_then_dies_without_a_reply() {
        let h = health(false);
        let mut link = Link::new("x:1", None, Some(h), Arc::default());
        let t0 = link.last_rx;
        assert_eq!(link.check_health(h, t0 + ms(100)).ok(), Some(t0 + ms(500)));
        assert!(link.wbuf.is_empty());
        let next = link.check_health(h, t0 + ms(500)).ok();
        assert_eq!(next, Some(t0 + ms(800)));
        assert_eq!(&link.wbuf[..], PING);
        assert!(link.inflight.front().is_some_and(|w| w.probe));
        // Any byte is a sign of life and moves the deadline.
        link.last_rx = t0 + ms(700);
        assert_eq!(link.check_health(h, t0 + ms(800)).ok(), Some(t0 + ms(1000)));
        // Another connection to the node heard from it after the PING: this flow is dead.
        link.life.heard_at(t0 + ms(900));
        let end = link.check_health(h, t0 + ms(1000)).expect_err("dead");
        assert!(end.timed_out && end.cause.contains("PING"), "{}", end.cause);
    }

    #[test]
    fn a_silent_node_is_busy_not_a_dead_connection() {
        let h = health(false);
        let mut link = Link::new("x:1", None, Some(h), Arc::default());
        let t0 = link.last_rx;
        link.life.heard_at(t0);
        link.check_health(h, t0 + ms(500)).ok();
        assert!(link.inflight.front().is_some_and(|w| w.probe));
        // Nothing from the node on any connection since the PING: Redis is busy (a script
        // before its BUSY threshold), so the connection is kept and looked at again.
        assert_eq!(link.check_health(h, t0 + ms(800)).ok(), Some(t0 + ms(1100)));
        assert_eq!(
            link.check_health(h, t0 + ms(5000)).ok(),
            Some(t0 + ms(5300))
        );
        // A strict connection (a tracking lane) cannot vouch for the cache either way.
        let strict = health(true);
        let mut lane = Link::new("x:1", None, Some(strict), Arc::default());
        let t1 = lane.last_rx;
        lane.check_health(strict, t1 + ms(500)).ok();
        assert!(lane.check_health(strict, t1 + ms(800)).is_err());
    }

    #[test]
    fn the_probe_reply_is_consumed_not_delivered() {
        let h = health(false);
        let mut link = Link::new("x:1", None, Some(h), Arc::default());
        let t0 = link.last_rx;
        link.check_health(h, t0 + ms(500)).ok();
        link.rbuf.extend_from_slice(b"+PONG\r\n");
        link.deliver().expect("deliver");
        assert!(link.inflight.is_empty() && link.probe_sent.is_none());
        // The next reply is not taken for the probe's: there is no waiter for it.
        link.rbuf.extend_from_slice(b"+PONG\r\n");
        assert!(link.deliver().is_err());
    }

    #[test]
    fn busy_shared_connections_are_left_to_the_request_timeout() {
        let h = health(false);
        let mut link = Link::new("x:1", None, Some(h), Arc::default());
        let t0 = link.last_rx;
        busy(&mut link, t0);
        assert!(link.check_health(h, t0 + ms(60_000)).is_ok());
        assert!(link.wbuf.is_empty());
    }

    #[test]
    fn a_strict_connection_dies_when_a_request_goes_unanswered() {
        let h = health(true);
        let mut link = Link::new("x:1", None, Some(h), Arc::default());
        let t0 = link.last_rx;
        busy(&mut link, t0 + ms(100));
        // Looked at again within `check`, so a PING owed after going idle is never late.
        assert_eq!(link.check_health(h, t0 + ms(150)).ok(), Some(t0 + ms(650)));
        assert!(link.check_health(h, t0 + ms(799)).is_ok());
        let end = link.check_health(h, t0 + ms(800)).expect_err("dead");
        assert!(end.timed_out);
    }
}
