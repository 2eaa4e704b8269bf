//! The task behind one [`super::UpstreamConn`]: connects, serves the live connection until it
//! fails, and reconnects with jittered exponential backoff, failing jobs at once while the
//! upstream is unreachable. A dedicated connection (one that does not reconnect) fails for
//! good instead, and answers whatever is still sent to it with an error.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use rand::Rng;
use tokio::sync::mpsc;
use tokio::time::{Instant, sleep_until};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::dial::{Stream, connect};
use super::job::{Job, LinkObserver};
use super::link::{End, Link};
use super::settings::ConnSettings;
use super::status::UpstreamStatus;
use crate::error::UpstreamError;

/// Everything the connection task owns; shared parts are also held by the handles.
pub(super) struct Task {
    pub(super) s: ConnSettings,
    pub(super) status: Arc<UpstreamStatus>,
    pub(super) rx: mpsc::Receiver<Job>,
    /// Woken by [`super::UpstreamConn::reset`] and [`super::UpstreamConn::renew`].
    pub(super) reset: Arc<super::conn::Reset>,
    /// The server's client id for the live connection.
    pub(super) client_id: Arc<AtomicU64>,
    /// Set live once a connection's handshake is done, and not live when it ends.
    pub(super) up: Arc<super::conn::Up>,
    /// Set when a connection that does not reconnect fails to connect.
    pub(super) never_up: Arc<AtomicBool>,
    pub(super) observer: Option<Arc<dyn LinkObserver>>,
    pub(super) shutdown: CancellationToken,
}

/// What a task does once its live connection ended.
enum After {
    Reconnect,
    Stop,
}

impl Task {
    /// Runs until shut down or, for a dedicated connection, until it fails; then marks the
    /// connection `dead`.
    pub(super) async fn run(mut self, dead: Arc<AtomicBool>) {
        self.keep_connected().await;
        dead.store(true, Ordering::Relaxed);
        if !self.s.reconnect || self.revoked() {
            // Answer whatever is still sent until every handle is gone.
            self.rx.close();
            let cause = match self.revoked() {
                true => crate::error::replies::USER_REVOKED,
                false => "dedicated connection closed",
            };
            while let Some(job) = self.rx.recv().await {
                job.reply.send(Err(UpstreamError::ConnectionLost {
                    addr: self.s.addr.clone(),
                    cause: cause.into(),
                }));
            }
        }
    }

    async fn keep_connected(&mut self) {
        let mut backoff = self.s.backoff_min;
        loop {
            // Each step has its deadline (`dial::connect`).
            let attempt = tokio::select! {
                r = connect(&self.s, &self.status) => r,
                _ = self.shutdown.cancelled() => return,
            };
            let cause = match attempt {
                Ok((stream, tracking, id)) => {
                    backoff = self.s.backoff_min;
                    match self.serve(stream, tracking, id).await {
                        // Reconnect at once after losing a working connection; back off
                        // only on failed attempts.
                        After::Reconnect => continue,
                        After::Stop => return,
                    }
                }
                Err(e) => e,
            };
            self.status.disconnected(&cause);
            if !self.s.reconnect || self.revoked() {
                // Known before the queued jobs learn it, so that whoever reads their error
                // already sees it (and unpins from a connection that never was).
                self.never_up.store(true, Ordering::Relaxed);
                self.fail_queued(&cause);
                return;
            }
            if self.status.refused().is_some() {
                // Logged once by `connect_failed`, as an error; not again each retry.
                debug!(upstream = %self.s.addr, %cause, retry_ms = backoff.as_millis() as u64, "upstream unavailable");
            } else {
                warn!(upstream = %self.s.addr, %cause, retry_ms = backoff.as_millis() as u64, "upstream unavailable");
            }
            let jitter = rand::rng().random_range(0.5..1.0);
            let deadline = Instant::now() + backoff.mul_f64(jitter);
            backoff = (backoff * 2).min(self.s.backoff_max);
            if let After::Stop = self.fail_fast_until(deadline, &cause).await {
                return;
            }
        }
    }

    /// Serves a live connection until it fails, is reset or shut down.
    async fn serve(&mut self, stream: Stream, tracking: bool, id: Option<u64>) -> After {
        let s = &self.s;
        // A renewal asked for while no connection was live is not this one's; one asked for
        // from now on is (the observer learns the connection is up only after this).
        let reset = self.reset.clone();
        reset.renew.store(false, Ordering::Relaxed);
        let reset_asked = reset.notify.notified();
        tokio::pin!(reset_asked);
        reset_asked.as_mut().enable();
        self.client_id.store(id.unwrap_or(0), Ordering::Relaxed);
        self.up.set(true);
        // Registered by `connect` (for MONITOR) until the connection closes.
        let local = stream.local_addr().ok();
        self.status.connected();
        info!(upstream = %s.addr, proto = s.proto.as_int(), tracking, "upstream connected");
        if let Some(o) = &self.observer {
            o.up(tracking);
        }
        let health = if s.reconnect { s.health } else { None };
        let mut link = Link::new(&s.addr, self.observer.clone(), health, self.status.clone());
        if id.is_some() {
            // HELLO answered with this connection's id: Redis 6 or later.
            link.probe_with_hello();
        }
        // A dedicated connection serves one client, whose round is already one job: there is
        // nobody to wait for.
        link.gather = s.gather && s.reconnect;
        link.hold_at = if link.gather { s.hold_at } else { 0 };
        // A dedicated connection's client waits as long as Redis takes (see `collect.rs`).
        link.request_timeout = s.request_timeout.filter(|_| s.reconnect);
        let end = tokio::select! {
            r = link.serve(stream, &mut self.rx) => r,
            _ = &mut reset_asked => match reset.renew.swap(false, Ordering::Relaxed) {
                true => End::renewed(),
                false => End::timed_out("reset after a request timed out"),
            },
            _ = self.shutdown.cancelled() => End::lost("shutting down"),
        };
        link.fail_all(&end);
        let cause = end.cause.clone();
        self.client_id.store(0, Ordering::Relaxed);
        self.up.set(false);
        if let Some(a) = local {
            self.status.remove_conn(a);
        }
        if let Some(o) = &self.observer {
            match end.renewed {
                true => o.renewed(),
                false => o.down(&cause),
            }
        }
        self.status.lost();
        // A connection ended on purpose (a lane or hub no longer needed, a lane renewed, or
        // corral shutting down) is no upstream error for INFO's `upstream_last_error`.
        if !self.shutdown.is_cancelled() && !end.renewed {
            self.status.disconnected(&cause);
        }
        // Shut down, or every handle dropped: nothing left to serve.
        if self.shutdown.is_cancelled() || self.rx.is_closed() {
            return After::Stop;
        }
        if !s.reconnect {
            debug!(upstream = %s.addr, %cause, "dedicated connection closed");
            return After::Stop;
        }
        if let Some(revoked) = &s.revoked
            && !end.timed_out
        {
            // A Redis ACL user's shared connection: Redis dropped it (CLIENT KILL, ACL
            // DELUSER, a restart) or the network did; it is not made again with the password
            // a client once gave (`users.rs`). A reset after a timeout is corral's own doing.
            revoked.cancel();
            debug!(upstream = %s.addr, %cause, "ACL user's connection lost");
            return After::Stop;
        }
        if end.renewed {
            debug!(upstream = %s.addr, "connection renewed");
        } else {
            warn!(upstream = %s.addr, %cause, "upstream connection lost");
        }
        After::Reconnect
    }

    /// Whether this is a Redis ACL user's connection that must not be made again.
    fn revoked(&self) -> bool {
        self.s.revoked.as_ref().is_some_and(|r| r.is_cancelled())
    }

    /// Fails what is queued now: the connection will not be made.
    fn fail_queued(&mut self, cause: &str) {
        while let Ok(job) = self.rx.try_recv() {
            job.reply.send(Err(self.unavailable(cause)));
        }
    }

    /// Waits until `deadline` before the next attempt, failing jobs at once meanwhile: a client
    /// should learn at once that the upstream is down. New credentials (a reload) end the
    /// wait: they may be what the upstream was waiting for.
    async fn fail_fast_until(&mut self, deadline: Instant, cause: &str) -> After {
        let access = self.s.access.clone();
        loop {
            tokio::select! {
                _ = sleep_until(deadline) => return After::Reconnect,
                () = access.changed() => return After::Reconnect,
                job = self.rx.recv() => match job {
                    Some(job) => job.reply.send(Err(self.unavailable(cause))),
                    None => return After::Stop,
                },
                _ = self.shutdown.cancelled() => return After::Stop,
            }
        }
    }

    fn unavailable(&self, cause: &str) -> UpstreamError {
        UpstreamError::Unavailable {
            addr: self.s.addr.clone(),
            cause: cause.to_string(),
        }
    }
}
