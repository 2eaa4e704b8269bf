//! One live upstream connection ([`Link`]): jobs are written in arrival order; replies come
//! back in the same order, so each job gets the contiguous slice of the read buffer that holds
//! its replies. Push frames go to the connection's [`LinkObserver`], or stay between the
//! replies where Redis put them when the observer says they belong to the client.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until};
use tracing::{debug, warn};

use super::dial::Stream;
use super::health::{Dead, Due, Liveness};
use super::job::{Job, LinkObserver, STREAM_PART};
use super::settings::Health;
use super::status::UpstreamStatus;
use super::waiter::Waiter;
use crate::error::UpstreamError;
use crate::resp::ReplyScanner;
use crate::tls::WriteHalf;

/// Stop gathering more jobs into one write once this much is buffered.
const WRITE_BATCH: usize = 64 * 1024;
/// Read buffer growth step.
const READ_CHUNK: usize = 16 * 1024;
/// Most capacity the emptied read buffer keeps into the next read.
const KEEP_READ_BUFFER: usize = 1024 * 1024;
/// Timer period of a connection without health checks (the timer is then never polled).
const NO_CHECKS: Duration = Duration::from_secs(86_400);

/// Writes some of `wbuf`, or, when it is empty, flushes what TLS held back. True when it
/// flushed.
async fn write_or_flush(wr: &mut WriteHalf<'_>, wbuf: &mut BytesMut) -> std::io::Result<bool> {
    if wbuf.is_empty() {
        wr.flush().await.map(|()| true)
    } else {
        wr.write_buf(wbuf).await.map(|_| false)
    }
}

/// Why a live connection ended.
pub(super) struct End {
    pub(super) cause: String,
    /// No reply came in time: in-flight jobs get `timed out` rather than `connection lost`.
    pub(super) timed_out: bool,
    /// Ended on purpose for a new connection ([`super::UpstreamConn::renew`]).
    pub(super) renewed: bool,
}

impl End {
    pub(super) fn lost(cause: impl Into<String>) -> End {
        End {
            cause: cause.into(),
            timed_out: false,
            renewed: false,
        }
    }

    pub(super) fn timed_out(cause: impl Into<String>) -> End {
        End {
            cause: cause.into(),
            timed_out: true,
            renewed: false,
        }
    }

    /// Ended for a new connection: what is in flight fails as after a timeout, since the
    /// server is not at fault, and a caller reads it again elsewhere.
    pub(super) fn renewed() -> End {
        End {
            cause: "renewed".into(),
            timed_out: true,
            renewed: true,
        }
    }
}

/// The encoded health-check request for servers before Redis 6.
const PING: &[u8] = b"*1\r\n$4\r\nPING\r\n";

/// The encoded health-check request: `HELLO` without arguments changes nothing on the
/// connection, and Redis lets every ACL user run it, where a user may be denied PING: a
/// denied probe is an error reply in Redis's statistics (`total_error_replies`,
/// `errorstat_NOPERM`) at every check of an idle connection of that user's pool.
const HELLO: &[u8] = b"*1\r\n$5\r\nHELLO\r\n";

/// State of one live connection.
pub(super) struct Link {
    addr: String,
    inflight: VecDeque<Waiter>,
    rbuf: BytesMut,
    wbuf: BytesMut,
    scanner: ReplyScanner,
    /// Start of the next frame in `rbuf`, relative to its front.
    frame_start: usize,
    observer: Option<Arc<dyn LinkObserver>>,
    /// Health checks, for a connection that has them.
    liveness: Option<Liveness>,
    /// The health-check request (see [`HELLO`]).
    probe: &'static [u8],
    /// Told when Redis answers `-BUSY` or `-LOADING` (PING is then forwarded).
    status: Arc<UpstreamStatus>,
    /// Let other clients add their requests to a write before it is made.
    pub(super) gather: bool,
    /// Requests written and not yet answered at which the next write waits (0: never), so
    /// that the requests arriving meanwhile go out as one write: see
    /// [`super::ConnSettings::hold_at`].
    pub(super) hold_at: usize,
    /// Waiters at the front of `inflight` whose requests are all written.
    sent: usize,
    /// Replies still owed to those waiters.
    owed: usize,
    /// `wbuf` holds the rest of a write begun.
    writing: bool,
    /// A request unanswered this long (counted from when it was queued, or from the last
    /// reply bytes that came for it or the requests before it: [`Link::received`]) ends the
    /// connection as timed out, failing everything in flight with
    /// [`UpstreamError::Timeout`] (see `ConnSettings::request_timeout`). Only
    /// the oldest waiter is timed, by one timer the connection re-arms when it fires: a
    /// timer per client's wait cost about 1,000 instructions per round (callgrind).
    pub(super) request_timeout: Option<Duration>,
}

/// What the request timer found ([`Link::expiry`]).
enum Expiry {
    /// Nothing in flight: the timer rests until a request is queued.
    Idle,
    /// The oldest request's deadline, not passed yet.
    At(Instant),
    /// The oldest request went unanswered too long.
    Passed,
}

impl Link {
    pub(super) fn new(
        addr: &str,
        observer: Option<Arc<dyn LinkObserver>>,
        health: Option<Health>,
        status: Arc<UpstreamStatus>,
    ) -> Self {
        let liveness = health.map(|h| Liveness::new(h, status.node_life(addr), Instant::now()));
        Link {
            observer,
            status,
            gather: true,
            addr: addr.to_string(),
            inflight: VecDeque::new(),
            rbuf: BytesMut::with_capacity(READ_CHUNK),
            wbuf: BytesMut::with_capacity(READ_CHUNK),
            scanner: ReplyScanner::new(),
            frame_start: 0,
            liveness,
            probe: PING,
            hold_at: 0,
            sent: 0,
            owed: 0,
            writing: false,
            request_timeout: None,
        }
    }

    /// Health checks ask HELLO, which the server has (Redis 6+): see [`HELLO`].
    pub(super) fn probe_with_hello(&mut self) {
        self.probe = HELLO;
    }

    /// Where the replies owed stand: the waiters in flight and the oldest one's replies still
    /// to come. A change over a read means replies arrived.
    fn owed_now(&self) -> (usize, u32) {
        (
            self.inflight.len(),
            self.inflight.front().map_or(0, |w| w.remaining),
        )
    }

    /// Delivers what a read brought. If replies arrived (or part of one, still coming), the
    /// oldest waiter's request timer starts over at `now()`: the timeout is for a connection
    /// on which Redis stopped answering, not for a long pipeline it answers steadily, nor a
    /// large reply still on its way (600 GETs of 1 MiB values in one pipeline took longer
    /// than `request_timeout_ms` on a busy machine, and every one of them failed).
    fn received(&mut self, now: impl FnOnce() -> Instant) -> Result<(), String> {
        let owed = self.owed_now();
        self.deliver()?;
        // Part of a reply (not of a push) still coming counts as well.
        let partial = self
            .rbuf
            .get(self.frame_start)
            .is_some_and(|&first| first != b'>');
        if self.request_timeout.is_some()
            && (owed != self.owed_now() || partial)
            && let Some(front) = self.inflight.front_mut()
        {
            front.since = now();
        }
        Ok(())
    }

    /// The oldest waiter's deadline, as of `now` (see [`Link::request_timeout`]).
    fn expiry(&self, now: Instant) -> Expiry {
        let (Some(limit), Some(oldest)) = (self.request_timeout, self.inflight.front()) else {
            return Expiry::Idle;
        };
        let at = oldest.since + limit;
        if at <= now {
            Expiry::Passed
        } else {
            Expiry::At(at)
        }
    }

    /// Runs the health check due now, writing the probe if one is owed. Returns when to look
    /// again, or why the connection is dead.
    fn check_health(&mut self, now: Instant) -> Result<Instant, End> {
        let Some(liveness) = &mut self.liveness else {
            return Ok(now + NO_CHECKS);
        };
        match liveness.check(self.inflight.is_empty(), now) {
            Ok(Due::Wait(at)) => Ok(at),
            Ok(Due::Ping(at)) => {
                self.wbuf.extend_from_slice(self.probe);
                self.inflight.push_back(Waiter::probe(now));
                Ok(at)
            }
            Err(Dead(cause)) => Err(End::timed_out(cause)),
        }
    }

    pub(super) async fn serve(&mut self, mut stream: Stream, rx: &mut mpsc::Receiver<Job>) -> End {
        // TLS may keep encrypted bytes it could not write yet (the socket was full) after
        // reporting the plaintext written: they go out on a flush, owed after every write.
        let tls = stream.is_tls();
        let mut unflushed = false;
        let (mut rd, mut wr) = stream.split();
        let checked = self.liveness.is_some();
        // Without health checks the timer branch is disabled and never polled.
        let first = self
            .liveness
            .as_ref()
            .map_or(NO_CHECKS, Liveness::first_check);
        let timer = sleep_until(Instant::now() + first);
        tokio::pin!(timer);
        // The request timer: armed while requests are in flight (see `request_timeout`).
        let expiry = sleep_until(Instant::now() + NO_CHECKS);
        tokio::pin!(expiry);
        let mut timing = false;
        loop {
            if self.rbuf.capacity() - self.rbuf.len() < READ_CHUNK / 4 {
                self.rbuf.reserve(READ_CHUNK);
            }
            // A large reply grew it (or `reserve` took back its whole block): not kept for
            // the connection's lifetime.
            if self.rbuf.is_empty() && self.rbuf.capacity() > KEEP_READ_BUFFER {
                self.rbuf = BytesMut::with_capacity(READ_CHUNK);
            }
            tokio::select! {
                biased;
                r = rd.read_buf(&mut self.rbuf) => match r {
                    Ok(0) => return End::lost("closed by upstream"),
                    Ok(_) => {
                        let heard = self.liveness.as_mut().map(|l| {
                            let now = Instant::now();
                            l.heard(now);
                            now
                        });
                        if let Err(e) = self.received(|| heard.unwrap_or_else(Instant::now)) {
                            return End::lost(e);
                        }
                    }
                    Err(e) => return End::lost(e.to_string()),
                },
                r = write_or_flush(&mut wr, &mut self.wbuf), if (!self.wbuf.is_empty() && !self.holds()) || unflushed => {
                    match r {
                        Ok(flushed) => unflushed = tls && !flushed,
                        Err(e) => return End::lost(e.to_string()),
                    }
                    self.written();
                }
                () = &mut timer, if checked => {
                    match self.check_health(Instant::now()) {
                        Ok(next) => timer.as_mut().reset(next),
                        Err(end) => {
                            warn!(upstream = %self.addr, cause = %end.cause, "upstream connection unresponsive");
                            return end;
                        }
                    }
                }
                () = &mut expiry, if timing => match self.expiry(Instant::now()) {
                    Expiry::Idle => timing = false,
                    Expiry::At(at) => expiry.as_mut().reset(at),
                    // Logged by the task, as a reset asked for by a client was.
                    Expiry::Passed => return End::timed_out("reset after a request timed out"),
                },
                job = rx.recv(), if self.wbuf.len() < WRITE_BATCH => match job {
                    Some(job) => {
                        let now = Instant::now();
                        self.enqueue(job, now);
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
                                Ok(job) => self.enqueue(job, now),
                                Err(_) => break,
                            }
                        }
                        if !timing && let Expiry::At(at) = self.expiry(now) {
                            expiry.as_mut().reset(at);
                            timing = true;
                        }
                    }
                    None => return End::lost("shutting down"),
                },
            }
        }
    }

    /// Whether the next write waits for replies: see [`Link::hold_at`]. A write begun is
    /// always finished.
    fn holds(&self) -> bool {
        self.hold_at > 0 && !self.writing && self.owed >= self.status.hold_bar(self.hold_at)
    }

    /// Notes a write made: once `wbuf` is all out, every waiter's requests are.
    fn written(&mut self) {
        self.writing = !self.wbuf.is_empty();
        if self.writing {
            return;
        }
        for w in self.inflight.range(self.sent..) {
            self.owed += w.remaining as usize;
        }
        self.sent = self.inflight.len();
    }

    fn enqueue(&mut self, job: Job, now: Instant) {
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
        if let (Some(l), true) = (&mut self.liveness, self.inflight.is_empty()) {
            l.went_busy(now);
        }
        self.inflight
            .push_back(Waiter::new(job.count, job.reply, now));
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
            front.unsent += 1;
            if self.sent > 0 {
                self.owed = self.owed.saturating_sub(1);
            }
            if front.remaining > 0 {
                // A streamed job's whole replies so far go over once they add up to a part.
                if frame.end >= STREAM_PART && front.streams() {
                    let part = self.rbuf.split_to(frame.end);
                    self.scanner.consumed(frame.end);
                    self.frame_start = 0;
                    front.hand_part(self.observer.as_deref(), part);
                }
                continue;
            }
            let bytes = self.rbuf.split_to(frame.end);
            self.scanner.consumed(frame.end);
            self.frame_start = 0;
            if let Some(mut w) = self.inflight.pop_front() {
                self.sent = self.sent.saturating_sub(1);
                if w.probe {
                    if let Some(l) = &mut self.liveness {
                        l.probe_answered();
                    }
                    continue;
                }
                let bytes = w.with_pending(self.observer.as_deref(), bytes);
                w.finish(Ok(bytes.freeze()));
            }
        }
        Ok(())
    }

    pub(super) fn fail_all(&mut self, end: &End) {
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
            w.finish(Err(e));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::job::ReplyTo;
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn link() -> Link {
        let h = Health {
            check: ms(500),
            deadline: ms(300),
            strict: false,
        };
        Link::new("x:1", None, Some(h), Arc::default())
    }

    fn last_heard(link: &Link) -> Instant {
        link.liveness
            .as_ref()
            .map(Liveness::last_heard)
            .expect("checked")
    }

    #[test]
    fn a_quiet_idle_connection_gets_a_ping_then_dies_without_a_reply() {
        let mut link = link();
        let t0 = last_heard(&link);
        assert_eq!(link.check_health(t0 + ms(100)).ok(), Some(t0 + ms(500)));
        assert!(link.wbuf.is_empty());
        let next = link.check_health(t0 + ms(500)).ok();
        assert_eq!(next, Some(t0 + ms(800)));
        assert_eq!(&link.wbuf[..], PING);
        assert!(link.inflight.front().is_some_and(|w| w.probe));
        // Any byte is a sign of life and moves the deadline.
        if let Some(l) = &mut link.liveness {
            l.heard(t0 + ms(700));
        }
        assert_eq!(link.check_health(t0 + ms(800)).ok(), Some(t0 + ms(1000)));
        // Another connection to the node heard from it after the PING: this flow is dead.
        link.status.node_life("x:1").heard_at(t0 + ms(900));
        let end = link.check_health(t0 + ms(1000)).expect_err("dead");
        assert!(end.timed_out && end.cause.contains("PING"), "{}", end.cause);
    }

    #[test]
    fn the_probe_reply_is_consumed_not_delivered() {
        let mut link = link();
        let t0 = last_heard(&link);
        link.check_health(t0 + ms(500)).ok();
        link.rbuf.extend_from_slice(b"+PONG\r\n");
        link.deliver().expect("deliver");
        assert!(link.inflight.is_empty());
        assert!(
            link.liveness
                .as_ref()
                .is_some_and(|l| !l.probe_outstanding())
        );
        // The next reply is not taken for the probe's: there is no waiter for it.
        link.rbuf.extend_from_slice(b"+PONG\r\n");
        assert!(link.deliver().is_err());
    }

    #[test]
    fn a_strict_connection_dies_when_a_request_goes_unanswered() {
        let h = Health {
            check: ms(500),
            deadline: ms(300),
            strict: true,
        };
        let mut link = Link::new("x:1", None, Some(h), Arc::default());
        let t0 = last_heard(&link);
        let end = link.check_health(t0 + ms(800)).err();
        assert!(end.is_none(), "an idle connection owes a PING first");
        assert!(link.inflight.front().is_some_and(|w| w.probe));
        let end = link.check_health(t0 + ms(1100)).expect_err("dead");
        assert!(end.timed_out);
    }

    fn job(
        count: u32,
    ) -> (
        Job,
        tokio::sync::oneshot::Receiver<crate::upstream::JobResult>,
    ) {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let bytes = Bytes::from(b"*1\r\n$4\r\nPING\r\n".repeat(count as usize));
        let reply = ReplyTo::Channel(tx);
        (
            Job {
                bytes,
                count,
                reply,
            },
            rx,
        )
    }

    /// A bulk reply of `len` bytes of `fill`.
    fn bulk(fill: u8, len: usize) -> Vec<u8> {
        let mut b = format!("${len}\r\n").into_bytes();
        b.resize(b.len() + len, fill);
        b.extend_from_slice(b"\r\n");
        b
    }

    /// A streamed job's whole replies go over once they add up to a part, before the rest
    /// has arrived; the hook sees every part first; the last part closes the stream; and a
    /// job that is not streamed, or whose replies stay short, gets them all at once.
    #[test]
    fn large_replies_go_over_in_parts_as_they_arrive() {
        use super::super::job::Reply;
        use std::sync::Mutex;
        let mut link = link();
        let t0 = Instant::now();
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let hooked = seen.clone();
        let hook: super::super::job::PartHook = Box::new(move |r, n| {
            if let Ok(mut s) = hooked.lock() {
                s.push((r.as_ref().map(Bytes::len).unwrap_or(0), n));
            }
        });
        link.enqueue(
            Job {
                bytes: Bytes::from(b"*2\r\n$3\r\nGET\r\n$1\r\na\r\n".repeat(4)),
                count: 4,
                reply: ReplyTo::Streamed(tx, Some(hook)),
            },
            t0,
        );
        let (short, mut short_rx) = job(2);
        link.enqueue(short, t0);
        write_all(&mut link);
        let (a, b) = (bulk(b'a', 10), bulk(b'b', STREAM_PART));
        // A short reply, and the first half of a large one: nothing yet.
        link.rbuf.extend_from_slice(&a);
        link.rbuf.extend_from_slice(&b[..STREAM_PART / 2]);
        link.deliver().expect("deliver");
        assert!(
            rx.try_recv().is_err(),
            "nothing whole adds up to a part yet"
        );
        // The large reply completes it: the two go over as the first part.
        link.rbuf.extend_from_slice(&b[STREAM_PART / 2..]);
        link.deliver().expect("deliver");
        let Ok(Reply::Parts(first, mut rest)) = rx.try_recv() else {
            panic!("the first part");
        };
        assert_eq!(first, [&a[..], &b[..]].concat());
        assert!(rest.try_recv().is_err(), "the rest is still to come");
        // Two short replies finish the job: the last part, then the stream ends.
        let c = bulk(b'c', 3);
        link.rbuf.extend_from_slice(&c);
        link.rbuf.extend_from_slice(&c);
        link.rbuf.extend_from_slice(b"+PONG\r\n+PONG\r\n");
        link.deliver().expect("deliver");
        let last = rest.try_recv().expect("the last part").expect("replies");
        assert_eq!(last, [&c[..], &c[..]].concat());
        assert!(matches!(
            rest.try_recv(),
            Err(tokio::sync::mpsc::error::TryRecvError::Disconnected)
        ));
        let lens = seen.lock().map(|s| s.clone()).unwrap_or_default();
        assert_eq!(
            lens,
            vec![(first.len(), 2), (last.len(), 2)],
            "the hook saw each part and its replies"
        );
        // The job behind it, short and not streamed, gets its replies whole.
        assert_eq!(
            short_rx.try_recv().expect("whole").expect("replies"),
            &b"+PONG\r\n+PONG\r\n"[..]
        );
        assert!(link.inflight.is_empty());
    }

    /// A streamed job cut short by a lost connection: what arrived went over, the error
    /// ends the rest.
    #[test]
    fn a_lost_connection_ends_a_streamed_job_after_its_parts() {
        use super::super::job::Reply;
        let mut link = link();
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        link.enqueue(
            Job {
                bytes: Bytes::from_static(b"*1\r\n$4\r\nPING\r\n"),
                count: 3,
                reply: ReplyTo::Streamed(tx, None),
            },
            Instant::now(),
        );
        write_all(&mut link);
        link.rbuf.extend_from_slice(&bulk(b'x', STREAM_PART));
        link.deliver().expect("deliver");
        let Ok(Reply::Parts(_, mut rest)) = rx.try_recv() else {
            panic!("the first part");
        };
        link.fail_all(&End::lost("gone"));
        assert!(matches!(
            rest.try_recv(),
            Ok(Err(UpstreamError::ConnectionLost { .. }))
        ));
    }

    /// What a write loop would do after writing all of `wbuf`.
    fn write_all(link: &mut Link) -> usize {
        let n = link.wbuf.len();
        link.wbuf.clear();
        link.written();
        n
    }

    /// The request timer follows the oldest request in flight: its deadline, passed once it
    /// went unanswered too long, and nothing to time once every request is answered.
    #[test]
    fn the_oldest_request_in_flight_is_timed() {
        let mut link = link();
        let t0 = Instant::now();
        let (a, _ra) = job(1);
        link.enqueue(a, t0);
        assert!(
            matches!(link.expiry(t0), Expiry::Idle),
            "no request timeout"
        );
        link.request_timeout = Some(ms(300));
        let (b, _rb) = job(1);
        link.enqueue(b, t0 + ms(200));
        assert!(matches!(link.expiry(t0 + ms(100)), Expiry::At(at) if at == t0 + ms(300)));
        assert!(matches!(link.expiry(t0 + ms(300)), Expiry::Passed));
        write_all(&mut link);
        link.rbuf.extend_from_slice(b"+1\r\n");
        link.deliver().expect("deliver");
        // The next one's deadline, counted from when it was queued.
        assert!(matches!(link.expiry(t0 + ms(300)), Expiry::At(at) if at == t0 + ms(500)));
        link.rbuf.extend_from_slice(b"+2\r\n");
        link.deliver().expect("deliver");
        assert!(matches!(link.expiry(t0 + ms(900)), Expiry::Idle));
    }

    /// Replies arriving start the request timer over: a pipeline answered steadily, or one
    /// large reply still coming in, never times out; a push alone does not count.
    #[test]
    fn replies_still_arriving_keep_a_request_from_timing_out() {
        let mut link = link();
        link.request_timeout = Some(ms(300));
        let t0 = Instant::now();
        let (a, _ra) = job(3);
        link.enqueue(a, t0);
        write_all(&mut link);
        link.rbuf.extend_from_slice(b"+1\r\n");
        link.received(|| t0 + ms(250)).expect("deliver");
        assert!(matches!(link.expiry(t0 + ms(400)), Expiry::At(at) if at == t0 + ms(550)));
        // Part of a large reply.
        link.rbuf.extend_from_slice(b"$10\r\n01234");
        link.received(|| t0 + ms(500)).expect("deliver");
        assert!(matches!(link.expiry(t0 + ms(700)), Expiry::At(at) if at == t0 + ms(800)));
        link.rbuf.extend_from_slice(b"56789\r\n");
        link.received(|| t0 + ms(700)).expect("deliver");
        // Nothing since: it times out.
        assert!(matches!(link.expiry(t0 + ms(1000)), Expiry::Passed));
        // The last reply: the next waiter is timed from it. A push is no reply.
        let (b, _rb) = job(1);
        link.enqueue(b, t0 + ms(700));
        link.rbuf.extend_from_slice(b"+3\r\n");
        link.received(|| t0 + ms(800)).expect("deliver");
        assert!(matches!(link.expiry(t0 + ms(900)), Expiry::At(at) if at == t0 + ms(1100)));
        link.rbuf
            .extend_from_slice(b">2\r\n$10\r\ninvalidate\r\n*0\r\n");
        link.received(|| t0 + ms(1000)).expect("deliver");
        assert!(matches!(link.expiry(t0 + ms(1100)), Expiry::Passed));
    }

    #[test]
    fn a_write_waits_while_many_requests_are_out_and_their_replies_still_arrive_in_order() {
        let mut link = link();
        link.hold_at = 4;
        let (a, mut ra) = job(3);
        let (b, mut rb) = job(2);
        link.enqueue(a, Instant::now());
        link.enqueue(b, Instant::now());
        assert!(!link.holds(), "nothing is out yet");
        write_all(&mut link);
        assert!(link.holds(), "5 requests out");
        // A job queued now waits, and is not counted as out.
        let (c, mut rc) = job(1);
        link.enqueue(c, Instant::now());
        assert!(link.holds());
        link.rbuf.extend_from_slice(b"+1\r\n");
        link.deliver().expect("deliver");
        assert!(link.holds(), "4 still out");
        link.rbuf.extend_from_slice(b"+2\r\n+3\r\n");
        link.deliver().expect("deliver");
        assert!(!link.holds(), "2 out: the held write goes");
        assert_eq!(
            ra.try_recv().ok().and_then(Result::ok).as_deref(),
            Some(&b"+1\r\n+2\r\n+3\r\n"[..])
        );
        assert_eq!(
            write_all(&mut link),
            14,
            "only the held job's bytes were left"
        );
        assert!(!link.holds(), "3 out");
        link.rbuf.extend_from_slice(b"+4\r\n+5\r\n+6\r\n");
        link.deliver().expect("deliver");
        assert_eq!(
            rb.try_recv().ok().and_then(Result::ok).as_deref(),
            Some(&b"+4\r\n+5\r\n"[..])
        );
        assert_eq!(
            rc.try_recv().ok().and_then(Result::ok).as_deref(),
            Some(&b"+6\r\n"[..])
        );
        assert_eq!((link.sent, link.owed), (0, 0));
    }

    #[test]
    fn a_write_begun_is_finished_and_nothing_waits_without_a_bar() {
        let mut link = link();
        link.hold_at = 1;
        let (a, _ra) = job(2);
        link.enqueue(a, Instant::now());
        // Half written: Redis may answer the first request before the rest is out.
        link.wbuf.advance(10);
        link.written();
        assert!(!link.holds(), "the rest of the write goes on");
        link.rbuf.extend_from_slice(b"+1\r\n");
        link.deliver().expect("deliver");
        write_all(&mut link);
        assert_eq!(link.owed, 1, "only the reply still missing is owed");
        assert!(link.holds());
        link.hold_at = 0;
        assert!(!link.holds());
        // The cache's cap lowers a bar, and never makes a connection hold that has none.
        link.status.cap_hold_bar(Some(1));
        assert!(!link.holds());
    }

    #[test]
    fn the_caches_cap_lowers_the_bar_while_it_is_set() {
        let mut link = link();
        link.hold_at = 48;
        let (a, _ra) = job(2);
        link.enqueue(a, Instant::now());
        write_all(&mut link);
        assert!(!link.holds(), "2 out, under 48");
        link.status.cap_hold_bar(Some(1));
        assert!(link.holds(), "2 out, at or over the cap of 1");
        link.status.cap_hold_bar(None);
        assert!(!link.holds(), "the connection's own bar again");
    }
}
