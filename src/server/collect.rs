//! Collecting a round's replies: each pending reply is waited for in request order and
//! written to the client's buffer. What a reply changes in the client's state (the database
//! after SELECT or EXEC, the client gone) is returned as an [`Effect`] and carried out by
//! `Conn::apply` (`client.rs`); what it changes in a pin (AUTH, CLIENT TRACKING) by the file
//! that owns that state (`users.rs`, `tracking.rs`); the cache is invalidated again after an
//! acknowledged write.

use bytes::Bytes;
use tokio::io::AsyncReadExt;
use tokio::sync::oneshot;
use tokio::time::timeout;
use tracing::warn;

use super::client::Conn;
use super::pending::{
    AfterAck, AloneReply, Between, Blocking, Effect, Forwarded, PendingReply, Queued, Then,
};
use super::subscriber::encode_message;
use super::{info, mget};
use crate::error::UpstreamError;
use crate::resp::Proto;
use crate::tls::Stream;
use crate::upstream::{JobResult, STREAM_PART, UpstreamConn};

/// The database the client is in after an EXEC whose reply is the last one in `replies`,
/// given the SELECTs it queued: the last one answered `+OK` (none if EXEC did not run).
fn selected_by_exec(replies: &[u8], selects: &[(u32, usize)]) -> Option<u32> {
    let exec = crate::resp::frames(replies).last()?;
    let elements = crate::resp::array_elements(exec.bytes)?;
    selects
        .iter()
        .rev()
        .find(|(_, i)| elements.get(*i) == Some(&&b"+OK\r\n"[..]))
        .map(|(db, _)| *db)
}

/// Where the first reply (not a push) in `replies` starts and ends.
fn first_reply(replies: &[u8]) -> Option<(usize, usize)> {
    crate::resp::frames(replies)
        .find(|f| !f.push)
        .map(|f| (f.start, f.end()))
}

/// Waits for every receiver, one after another (a closed one counts as done).
async fn wait_each(waits: Vec<oneshot::Receiver<()>>) {
    for w in waits {
        let _ = w.await;
    }
}

impl Conn {
    /// Waits for every pending reply in order and appends its bytes to the write buffer. `client` is
    /// watched while a blocking command waits, to notice a client that goes away.
    pub(super) async fn collect(&mut self, client: &mut Stream) {
        let mut replies = std::mem::take(&mut self.replies);
        for Queued {
            reply,
            silent,
            proto,
        } in replies.drain(..)
        {
            // Replies held from rounds before go out before the client blocks, as Redis
            // writes them before it blocks the client.
            if reply.blocks() && !self.wbuf.is_empty() && !self.write_out(client).await {
                break;
            }
            let mark = self.wbuf.len();
            let effect = self.resolve(reply, proto, client).await;
            if silent {
                self.wbuf.truncate(mark);
            }
            if let Some(effect) = effect {
                self.apply(effect);
            }
            if self.is_gone() {
                break;
            }
            let limit = self.shared.cfg.limits.client_output_buffer_limit;
            if limit > 0 && self.wbuf.len() > limit {
                warn!(limit, "closing client over the output buffer limit");
                self.wbuf.clear();
                self.apply(Effect::Gone);
                break;
            }
            // Large replies go out as they are collected, not once the round's last one is
            // in: a pipeline of large values answered by many jobs (a cluster's, one per run
            // of requests for one node) is not held whole, twice (the jobs' replies and this
            // buffer), before its first byte reaches the client. Under an output buffer limit
            // the round's replies are counted whole, as Redis counts what a pipeline adds.
            if limit == 0 && self.wbuf.len() >= STREAM_PART && !self.write_out(client).await {
                break;
            }
        }
        // Jobs whose segments were not all written (the client went away) are dropped.
        self.gather.jobs.clear();
        // Keep the allocation for the next round.
        self.replies = replies;
        self.replies.clear();
    }

    /// Writes the replies collected so far to the client; false (the client gone) if it
    /// closed its side meanwhile.
    async fn write_out(&mut self, client: &mut Stream) -> bool {
        if !matches!(self.send_replies(client).await, Ok(true)) {
            self.apply(Effect::Gone);
            return false;
        }
        self.wbuf.clear();
        true
    }

    /// Waits for one pending reply and writes it, what corral encodes in `proto` (the
    /// request's); returns what it changes in the client's state.
    async fn resolve(
        &mut self,
        reply: PendingReply,
        proto: Proto,
        client: &mut Stream,
    ) -> Option<Effect> {
        match reply {
            PendingReply::Ready(b) => self.wbuf.extend_from_slice(&b),
            PendingReply::Value(v) => v.encode(proto, &mut self.wbuf),
            PendingReply::Values(parts) => {
                mget::merge(&parts, None, proto, &mut self.wbuf);
            }
            PendingReply::Fill { rx } => self.resolve_fill(&rx, proto).await,
            PendingReply::Upstream(up) => {
                let Forwarded {
                    rx,
                    count,
                    conn,
                    after,
                    blocking,
                    interleaved,
                } = *up;
                let Some(result) = self.wait_upstream(rx, &conn, blocking, client).await else {
                    return Some(Effect::Gone);
                };
                return self
                    .upstream_answered(result, count, &conn, after, interleaved)
                    .await;
            }
            PendingReply::Segment { job, count } => {
                return self.resolve_segment(job, count, client).await;
            }
            PendingReply::Streamed(streamed) => {
                return self.resolve_streamed(*streamed, client).await;
            }
            PendingReply::Split { kind, parts, after } => {
                self.resolve_split(kind, parts).await;
                self.invalidate_after(&after);
            }
            PendingReply::Fanout { how, parts, after } => {
                self.resolve_fanout(how, parts).await;
                self.invalidate_after(&after);
            }
            PendingReply::Subscribed(sub) => {
                let super::pending::Subscribed {
                    reply,
                    waits,
                    leaving,
                } = *sub;
                // Without an upstream the subscription is still registered and will be made
                // when the connection returns; the client is not held up longer.
                let all = wait_each(waits);
                match self.shared.upstream.request_timeout {
                    Some(d) => drop(timeout(d, all).await),
                    None => all.await,
                }
                if leaving && let Some(subs) = &mut self.subs {
                    // Delivered before Redis confirmed the unsubscribe: Redis sent them first.
                    while let Some(m) = subs.rx.try_recv() {
                        encode_message(&m, proto, &mut self.wbuf);
                    }
                }
                self.wbuf.extend_from_slice(&reply);
            }
            PendingReply::Reply(alone) => {
                let AloneReply { rx, conn, then } = *alone;
                match self.wait(rx, &conn).await {
                    Ok(b) => match then {
                        Then::PubSub(s) => self.user_pubsub_answered(b, *s).await,
                        Then::Scan(walk) => self.scan_walk(b, *walk).await,
                        then => return self.reply_arrived(b, then, proto),
                    },
                    Err(e) => {
                        if let Then::Tracking(change) = then {
                            self.tracking_answered(false, change);
                        }
                        self.upstream_error(&e, 1);
                    }
                }
            }
        }
        None
    }

    /// Waits for a batch's replies; `None` if the client is gone meanwhile (or a SHUTDOWN
    /// closed the connection, as it closes the client's).
    async fn wait_upstream(
        &mut self,
        rx: oneshot::Receiver<JobResult>,
        conn: &UpstreamConn,
        blocking: Option<Blocking>,
        client: &mut Stream,
    ) -> Option<JobResult> {
        Some(match blocking {
            // A pinned connection serves this client alone: wait as long as Redis
            // takes (a script in a transaction, say), as a client of Redis would.
            None if conn.is_dedicated() => {
                match self.wait_blocking(rx, client, false, conn).await {
                    Some(r) => r,
                    None => return None,
                }
            }
            None => self.wait(rx, conn).await,
            Some(b) => match self.wait_blocking(rx, client, b.blocked, conn).await {
                Some(Err(UpstreamError::ConnectionLost { .. })) if b.closes_client => {
                    // SHUTDOWN succeeded: Redis closed the connection without a reply.
                    return None;
                }
                Some(r) => {
                    if let Some(d) = b.dedicated
                        && r.is_ok()
                    {
                        self.shared.upstream.release(d);
                    }
                    r
                }
                // The client left: dropping the dedicated connection unblocks it.
                None => return None,
            },
        })
    }

    /// A batch's replies arrived (`count` of them, or the error): what was written is
    /// invalidated, redirections followed, and the replies written; returns the database an
    /// EXEC moved the client to.
    async fn upstream_answered(
        &mut self,
        result: JobResult,
        count: u32,
        conn: &UpstreamConn,
        mut after: AfterAck,
        interleaved: Between,
    ) -> Option<Effect> {
        // The batch's scripts are over (or nobody waits for them any more).
        if let Some(mut run) = after.script.take()
            && result.is_ok()
        {
            run.answered();
        }
        // A write the cluster redirected runs where it is retried: held until then.
        let cluster_cmds = after.cluster_cmds.take();
        let result = match (result, &cluster_cmds) {
            (Ok(b), Some(cmds)) => Ok(self.follow_redirects(b, cmds, conn).await),
            (r, _) => r,
        };
        // Whatever the outcome, the write may have run.
        self.invalidate_after(&after);
        self.writes.recycle(std::mem::take(&mut after.writes));
        if after.lane_barrier
            && let Some(cache) = &self.shared.cache
        {
            cache.sync_lane(self.shared.upstream.request_timeout).await;
        }
        let AfterAck {
            exec_select,
            skip_first,
            ..
        } = after;
        let (result, count) = match result {
            Ok(b) if skip_first => match first_reply(&b) {
                // Pushes before it (a tracking connection) are the client's.
                Some((start, end)) => {
                    let mut kept = bytes::BytesMut::from(&b[..start]);
                    kept.extend_from_slice(&b[end..]);
                    (Ok(kept.freeze()), count - 1)
                }
                None => (Ok(b), count),
            },
            Err(e) if skip_first => (Err(e), count - 1),
            r => (r, count),
        };
        let selected = match (exec_select, &result) {
            (Some(selects), Ok(b)) => selected_by_exec(b, &selects),
            _ => None,
        };
        self.write_interleaved(result, count, interleaved).await;
        selected.map(Effect::Database)
    }

    /// Writes the one reply of a request sent on its own, handled as `then` says; returns the
    /// database a SELECT moved the client to.
    fn reply_arrived(&mut self, b: Bytes, then: Then, proto: Proto) -> Option<Effect> {
        match then {
            Then::MGet(parts) => {
                mget::merge(&parts, Some(&b), proto, &mut self.wbuf);
            }
            Then::Info { with_proxy } => {
                let b = self.pushes_first(b);
                if with_proxy {
                    let sections = info::proxy_sections(&self.shared);
                    info::append_section(&b, &sections, &mut self.wbuf);
                } else {
                    self.wbuf.extend_from_slice(&b);
                }
            }
            Then::Counted(count) => {
                let b = super::pubcount::correct(&count, b, &self.all_hubs());
                self.wbuf.extend_from_slice(&b);
            }
            Then::Tracking(change) => {
                self.tracking_answered(super::tracking::ends_ok(&b), change);
                self.wbuf.extend_from_slice(&b);
            }
            Then::Auth { auth, ded } => {
                let start = first_reply(&b).map_or(0, |(start, _)| start);
                let b = self.auth_answered(b, start, auth, ded);
                self.wbuf.extend_from_slice(&b);
            }
            Then::Redir { from, to } => {
                let b = super::tracking::rewrite_redirect(&b, from, to);
                self.wbuf.extend_from_slice(&b);
            }
            // Handled in `resolve`, which can wait: for the upstream subscriptions, for the
            // next masters of a SCAN.
            Then::PubSub(_) | Then::Scan(_) => self.wbuf.extend_from_slice(&b),
            Then::Select(db) => {
                // The SELECT's reply, after any invalidation pushes that came before it
                // (tracking connection), without the `SELECT 0` that followed it.
                let (start, end) = first_reply(&b).unwrap_or((0, b.len()));
                self.wbuf.extend_from_slice(&b[..end]);
                let selected =
                    &b[start..end] == b"+OK\r\n" && self.pin.as_ref().is_none_or(|p| !p.in_multi);
                return db.filter(|_| selected).map(Effect::Database);
            }
        }
        None
    }

    /// Writes the invalidation pushes that precede an INFO reply (tracking connection) and
    /// returns the reply, without corral's cache lane in `tracking_clients`.
    fn pushes_first(&mut self, reply: Bytes) -> Bytes {
        let start = first_reply(&reply).map_or(0, |(start, _)| start);
        self.wbuf.extend_from_slice(&reply[..start]);
        self.hide_lanes(reply.slice(start..))
    }

    /// An INFO reply without corral's own cache lane in `tracking_clients` (standalone mode;
    /// in cluster mode INFO comes from one node, which may or may not have a lane).
    fn hide_lanes(&self, reply: Bytes) -> Bytes {
        match &self.shared.cache {
            Some(cache) if self.shared.upstream.cluster.is_none() => {
                info::hide_lanes(reply, cache.tracking_lanes())
            }
            _ => reply,
        }
    }

    /// Invalidates again what acknowledged writes may have changed. Their holds
    /// (`Unacked`) are released after, when `after.writes` is emptied or dropped.
    pub(super) fn invalidate_after(&self, after: &AfterAck) {
        if let Some(cache) = &self.shared.cache {
            if cache.reads_since(after.write_mark) {
                for k in after.writes.iter() {
                    cache.invalidate_for_write(k, after.write_mark);
                }
            }
            if after.writes_all {
                cache.flush();
            }
        }
    }

    pub(super) async fn wait(
        &self,
        rx: oneshot::Receiver<JobResult>,
        conn: &UpstreamConn,
    ) -> JobResult {
        self.wait_for(rx, conn)
            .await
            .and_then(|r| r.unwrap_or(Err(UpstreamError::ShuttingDown)))
    }

    /// Waits for `reply` from `conn`: a timeout error if the request deadline passes first
    /// (the connection is then reset).
    pub(super) async fn wait_for<T>(
        &self,
        reply: impl Future<Output = T>,
        conn: &UpstreamConn,
    ) -> Result<T, UpstreamError> {
        // The deadline protects the other clients of a shared connection; a dedicated one
        // has none, and resetting it would only lose this client's state. A connection whose
        // task times its requests out itself answers this one with the timeout.
        let deadline = self
            .shared
            .upstream
            .request_timeout
            .filter(|_| !conn.is_dedicated() && !conn.times_out());
        match deadline {
            Some(d) => timeout(d, reply).await.map_err(|_| {
                conn.reset();
                UpstreamError::Timeout {
                    addr: conn.addr().to_string(),
                }
            }),
            None => Ok(reply.await),
        }
    }

    /// Waits for a reply on a connection that serves this client alone, as long as it takes;
    /// `None` if the client closed its connection (or was killed) meanwhile. Requests the
    /// client sends meanwhile are kept for later rounds. `blocked`: a blocking command, shown
    /// as such by CLIENT LIST.
    async fn wait_blocking(
        &mut self,
        mut rx: oneshot::Receiver<JobResult>,
        client: &mut Stream,
        blocked: bool,
        conn: &UpstreamConn,
    ) -> Option<JobResult> {
        // Shown blocked in CLIENT LIST (with the round's session: `cmd=blpop`...), and
        // CLIENT UNBLOCK from another client given this connection's id on the server, once
        // the connection is live: a new one learns its id in its handshake, and writes the
        // blocking command right after. Shown before, an UNBLOCK sent as soon as CLIENT LIST
        // showed it could name no one, and the client stayed blocked.
        let live = conn.live();
        tokio::pin!(live);
        let mut shown = false;
        let limit = self.shared.cfg.limits.client_query_buffer_limit;
        let result = loop {
            if self.rbuf.capacity() - self.rbuf.len() < 4096 {
                self.rbuf.reserve(16 * 1024);
            }
            tokio::select! {
                () = &mut live, if blocked && !shown => {
                    self.show_blocked(Some(conn.clone()));
                    shown = true;
                }
                r = &mut rx => break Some(r.unwrap_or(Err(UpstreamError::ShuttingDown))),
                n = client.read_buf(&mut self.rbuf), if self.rbuf.len() < limit => match n {
                    Ok(0) | Err(_) => break None,
                    Ok(_) => {
                        self.read_ahead = true;
                        continue;
                    }
                },
                _ = self.kill.cancelled() => break None,
            }
        };
        if blocked {
            self.blocking_unshown = false;
            if shown {
                self.show_blocked(None);
            } else {
                // Answered before it showed: the session as any round's, before the reply.
                self.publish_session();
            }
        }
        result
    }

    pub(super) fn upstream_error(&mut self, e: &UpstreamError, count: u32) {
        self.shared.metrics.upstream_errors.inc_by(u64::from(count));
        let reply = e.to_reply();
        for _ in 0..count {
            self.wbuf.extend_from_slice(&reply);
        }
    }
}
