//! One round over a client's pipelined requests: parse each complete request, route it
//! (`route.rs`) and carry out its [`Plan`]; consecutive forwarded requests go to the
//! upstream as one job (`queue.rs`). The replies are collected afterwards, in order
//! (`collect.rs`).

use bytes::{Buf, Bytes};
use tracing::debug;

use super::client::Conn;
use super::clients::ReplyMode;
use super::pending::{AfterAck, AloneReply, Interleaved, PendingReply};
use super::plan::{AloneReq, BlockingReq, NodeReq, Plan, StartMulti};
use super::route::Request;
use crate::cache::PREFETCH_MAX;
use crate::commands::{self, Access, Command, Exclusive, Route, Tx};
use crate::error::replies;
use crate::resp::Parsed;
use crate::resp::lookahead;

/// Most requests handled in one round; bounds the replies buffered per client.
const MAX_PER_ROUND: usize = 1024;
/// Stop adding to a round once this many request bytes are queued for the upstream.
const MAX_ROUND_BYTES: usize = 1024 * 1024;

impl Conn {
    /// Parses and routes the complete requests in the read buffer. Returns true when it
    /// stopped for lack of input, false when requests are left for another round.
    pub(super) async fn dispatch(&mut self) -> bool {
        let mut off = 0;
        let mut handled = 0;
        let mut wants_input = false;
        self.writes.new_round();
        if self.user_connection_lost() {
            // Its requests cannot go on as the user, and must not go on as anyone else.
            self.closing = true;
            return false;
        }
        // Requests are routed from these while `self` changes; they are put back below.
        let rbuf = std::mem::take(&mut self.rbuf);
        let mut parser = std::mem::take(&mut self.parser);
        if let Some(cache) = &self.shared.cache {
            let found = lookahead::keys(&rbuf, PREFETCH_MAX);
            cache.prefetch(found, &mut self.writes.clock, &mut self.ahead);
        }
        // With the read barrier, nothing is looked up before the round passed it.
        let mut synced = self.barrier_at_start().await;
        let mut quick = self.quick().until(synced);
        let mut left = None;
        // An (un)subscribe waiting on Redis holds back what follows it, but for more
        // (un)subscribes: those go to Redis in order on the hub's connection.
        let mut subscribing = false;
        while !self.closing {
            let queued = self.batch.len_bytes() + self.gather.parked_bytes();
            if handled == MAX_PER_ROUND || queued >= MAX_ROUND_BYTES {
                break;
            }
            if quick.gets
                && parser.at_start()
                && let Some(len) = self.quick_request(&rbuf, off, &parser, quick, &mut left)
            {
                off += len;
                handled += 1;
                if let Some(cache) = &self.shared.cache {
                    cache.prefetch_next(&mut self.ahead);
                }
                // Nearly always empty: looked at before it is taken, which moves it whole.
                if left.is_none() {
                    continue;
                }
                let Some(plan) = left.take() else {
                    continue;
                };
                // As below: `handle_now` first, with no `async` call when it is enough.
                let barrier = match self.handle_now(plan) {
                    Ok(()) => false,
                    Err(plan) => self.handle(plan).await,
                };
                if barrier {
                    break;
                }
                continue;
            }
            let parsed = match parser.parse(&rbuf[off..], self.authenticated()) {
                Ok(Some(p)) => p,
                Ok(None) => {
                    wants_input = true;
                    break;
                }
                Err(e) => {
                    debug!(error = %e.message(), "protocol error");
                    self.shared.metrics.protocol_errors.inc();
                    self.push_ready(Bytes::from(e.to_reply())).await;
                    self.closing = true;
                    break;
                }
            };
            let (len, inline) = match parsed {
                Parsed::Empty { len } => {
                    off += len;
                    continue;
                }
                Parsed::Multibulk { len } => (len, false),
                Parsed::Inline { len } => (len, true),
            };
            let frame = &rbuf[off..off + len];
            // Renamed commands are routed by their real name; refused ones are replied to.
            let guarded = self.guarded(&parser.args(frame));
            let (cmd, frame, inline) = guarded.request(parser.args(frame), frame, inline);
            if subscribing && !matches!(cmd.route(), Route::PubSub(_)) {
                break;
            }
            if self.must_start_round(&cmd) {
                // This request moves the client to another upstream connection: everything
                // before it must complete first, so start it in a round of its own.
                break;
            }
            handled += 1;
            if let Some(cache) = &self.shared.cache {
                cache.prefetch_next(&mut self.ahead);
            }
            // Only a request routed other than as a plain forward can change what
            // `quick` depends on (a pin, a transaction, the database, the user, reply
            // modes, subscriptions, a pause): scripts and CLIENT PAUSE are `special`.
            let recheck = cmd.kind.special || !matches!(cmd.route(), Route::Forward(_));
            let (proto, db) = (self.session.proto, self.session.db);
            let skip = self.reply_mode == ReplyMode::Skip;
            if skip {
                // CLIENT REPLY SKIP drops exactly this request's reply: give it its own pending reply.
                self.flush_batch().await;
                self.reply_mode = ReplyMode::On;
                self.silent_now = true;
            }
            let req = Request {
                frame,
                inline,
                queued: rbuf.len() - off,
                refused: guarded.refusal(),
            };
            if !synced
                && matches!(cmd.access(), Some(Access::Get | Access::MGet))
                && self.barrier_now().await
            {
                synced = true;
                quick = self.quick();
            }
            let plan = self.route(&cmd, &req);
            off += len;
            let barrier = match self.handle_now(plan) {
                Ok(()) => false,
                Err(plan) => self.handle(plan).await,
            };
            if skip {
                self.flush_batch().await;
                self.silent_now = false;
            }
            if barrier && self.subscribe_waits() {
                subscribing = true;
                quick = quick.until(false);
                continue;
            }
            if barrier || self.session.proto != proto || self.session.db != db {
                // Later requests must wait for this one (it blocks, or they go to another
                // upstream connection): end the round so Redis sees them in order.
                break;
            }
            if recheck {
                quick = self.quick().until(synced && !subscribing);
            }
        }
        self.rbuf = rbuf;
        self.parser = parser;
        self.rbuf.advance(off);
        self.flush_batch().await;
        self.shared.metrics.commands.inc_by(handled as u64);
        if let Some(c) = &self.shared.cache {
            c.end_round(&mut self.writes.clock);
        }
        wants_input
    }

    /// True when the request needs a dedicated connection (MULTI or
    /// WATCH while not pinned, or a blocking command) and this round already sent requests
    /// elsewhere: they could otherwise run after it.
    fn must_start_round(&self, cmd: &Command<'_>) -> bool {
        if self.batch.is_empty() && self.replies.is_empty() {
            return false;
        }
        if self.writes.waiting() && self.writes_waited(cmd) {
            return true;
        }
        if self.pinned_after_routed(cmd) {
            return true;
        }
        let args = cmd.args;
        match cmd.route() {
            Route::Tx(Tx::Multi | Tx::Watch) => self.pin.is_none(),
            Route::Blocking => true,
            Route::Forward(_) if cmd.client_pause().is_none() && self.paused_alone() => true,
            // A script moves the client to a dedicated connection; a kill goes out of band.
            Route::Forward(_) if self.shared.upstream.cluster.is_none() => {
                self.pin.is_none()
                    && match commands::busy::exclusive(cmd) {
                        Some(Exclusive::Script) => self.isolates(commands::busy::script_key(&args)),
                        Some(Exclusive::OutOfBand) => true,
                        None => false,
                    }
            }
            // An (un)subscribe goes to Redis on the hub's connection: what came before it
            // (a PUBLISH to the channel) must have run first, unless that was (un)subscribes
            // alone, which went before it on that connection.
            Route::PubSub(_) => !self.batch.is_empty() || !self.subscribes_alone(),
            // CLIENT TRACKING ON pins the client: what came before must run first.
            Route::Tracking => {
                self.pin.is_none() && cmd.arg_is(1, b"TRACKING") && cmd.arg_is(2, b"ON")
            }
            _ => false,
        }
    }

    /// Whether the last reply queued is an (un)subscribe's that waits on Redis.
    fn subscribe_waits(&self) -> bool {
        self.replies
            .last()
            .is_some_and(|q| matches!(&q.reply, PendingReply::Subscribed(s) if !s.waits.is_empty()))
    }

    /// Whether every reply queued is an (un)subscribe's, answered from corral's shared
    /// subscriptions: their upstream commands, if any, are on the hub's connection.
    fn subscribes_alone(&self) -> bool {
        self.replies
            .iter()
            .all(|q| matches!(q.reply, PendingReply::Subscribed(_)))
    }

    /// Whether `cmd` may write a key that a GET earlier in this round waits on a read of, sent
    /// outside the batch (see `Writes::waiting`): Redis must run that read first, as it
    /// would have run the GET first. A script or function may write keys it does not name.
    fn writes_waited(&self, cmd: &Command<'_>) -> bool {
        match cmd.route() {
            Route::Forward(Access::All) => true,
            Route::Forward(Access::Write) => {
                let positions = cmd.keys();
                commands::busy::exclusive(cmd).is_some()
                    || super::cached::writes_undeclared(cmd.name())
                    || !positions.is_known()
                    || positions.keys(&cmd.args).any(|k| self.writes.waits_for(k))
            }
            _ => false,
        }
    }

    /// Carries out what is left of a routed request when nothing needs waiting for: it was
    /// batched, or it is a hit written now or a reply that rides in the batch. Else gives
    /// the plan back for [`Conn::handle`]. Most requests end here, where the `async fn` call
    /// cost about 60 instructions even when it had nothing to do.
    fn handle_now(&mut self, plan: Plan) -> Result<(), Plan> {
        match plan {
            Plan::Batched => {}
            Plan::Reply(PendingReply::Value(v)) if self.may_write_now(v.reply_len()) => {
                v.encode(self.session.proto, &mut self.wbuf);
            }
            Plan::Reply(PendingReply::Value(v)) if self.may_interleave() => {
                self.batch.interleave_hit(v, self.session.proto);
            }
            Plan::Reply(PendingReply::Fill { rx }) if self.may_interleave() => {
                let proto = self.session.proto;
                self.batch.interleave(Interleaved::Fill { rx, proto });
            }
            // Cluster mode: the batch so far stays open for later requests to its node, its
            // run of requests ended before the cache's reply (`gather.rs`).
            Plan::Reply(r @ (PendingReply::Value(_) | PendingReply::Fill { .. }))
                if (!self.batch.is_empty() || self.gather.active()) && self.may_gather() =>
            {
                self.end_run();
                self.queue(r);
            }
            plan => return Err(plan),
        }
        Ok(())
    }

    /// Carries out the asynchronous part of a routed request (what [`Conn::handle_now`] gave
    /// back); true ends the round after it.
    async fn handle(&mut self, plan: Plan) -> bool {
        match plan {
            Plan::Batched => {}
            // Leads are batched by `route`; one reaching here had no batch to ride in.
            Plan::Lead(lead) => {
                lead.complete(Err(crate::error::UpstreamError::BadReply {
                    cause: "read not sent".into(),
                }));
                self.push_ready(replies::READ_NOT_SENT.to_bytes()).await;
            }
            Plan::Reply(reply) => {
                self.flush_batch().await;
                // An (un)subscribe that starts or ends an upstream subscription is answered
                // once Redis confirmed it; what the client sent after it must reach Redis
                // after that too (a PUBLISH in the same pipeline counts, and reaches, the
                // subscription as it would on Redis), so the round ends here, unless more
                // (un)subscribes follow (`dispatch`).
                let barrier = matches!(&reply, PendingReply::Subscribed(s) if !s.waits.is_empty());
                self.push_reply(reply);
                return barrier;
            }
            Plan::Alone(alone) => {
                let AloneReq { conn, req, then } = *alone;
                self.flush_batch().await;
                let conn = conn.unwrap_or_else(|| self.target());
                let rx = conn.send(req, 1).await;
                self.push_reply(PendingReply::Reply(Box::new(AloneReply { rx, conn, then })));
            }
            Plan::Tx { tx, req, node } => return self.transaction(tx, req, node).await,
            Plan::AbortExec(why) => return self.abort_exec(why).await,
            Plan::Blocking(b) => {
                let BlockingReq {
                    req,
                    writes,
                    writes_all,
                    lane_barrier,
                    node,
                } = *b;
                let after = AfterAck {
                    writes,
                    writes_all,
                    lane_barrier,
                    ..AfterAck::default()
                };
                return self.blocking(req, after, node).await;
            }
            Plan::Deferred { open, reply } => {
                self.deferred_multi = open;
                self.push_ready(reply).await;
            }
            Plan::StartMulti(s) => {
                let StartMulti { node, req, queued } = *s;
                return self.start_multi(node, req, queued).await;
            }
            Plan::Select { db, req } => return self.select(db, req).await,
            Plan::Requirepass(r) => {
                let (req, password) = *r;
                return self.set_requirepass(req, password).await;
            }
            Plan::OutOfBand { req, shutdown } => return self.out_of_band(req, shutdown).await,
            Plan::Monitor => {
                self.flush_batch().await;
                self.monitor = true;
                return true;
            }
            Plan::ReplyMode { mode, reply } => {
                self.flush_batch().await;
                self.reply_mode = mode;
                // CLIENT REPLY ON right after SKIP cancels the skip before replying, as in
                // Redis: its `+OK` is sent.
                if mode == ReplyMode::On {
                    self.silent_now = false;
                }
                self.push_ready(reply).await;
            }
            Plan::Node(_) | Plan::Split { .. } | Plan::Fanout { .. } => {
                self.send_routed(plan).await;
            }
            Plan::Tracking { argv, req } => return self.client_tracking(argv, req).await,
            Plan::AuthUser(a) => return self.auth_user(a.auth, a.req).await,
            Plan::UserPubSub(s) => {
                // Later requests wait: RESP2's subscribed mode may start with this one.
                self.user_pubsub(*s).await;
                return true;
            }
            Plan::Repin { reply, change } => return self.repin(reply, change).await,
        }
        false
    }

    /// Cluster mode: a request for one node joins the batch if it goes there too; a split or
    /// fanned-out one is sent in parts, after the batch so far.
    async fn send_routed(&mut self, plan: Plan) {
        match plan {
            Plan::Node(node) => {
                let NodeReq {
                    conn,
                    req,
                    slot,
                    lead,
                } = *node;
                // A request whose batch waits for the lane once answered (a script) is not
                // gathered: the batches so far go first.
                if self.writes.routed_barrier() && self.gather.active() {
                    self.flush_batch().await;
                }
                if !self.batch.fits(&conn) && !self.switch_batch(&conn) {
                    self.flush_batch().await;
                }
                self.writes.join_routed();
                if let Some(lead) = lead {
                    self.batch.lead_next(lead);
                }
                self.batch.push_routed(conn, &req, slot);
            }
            Plan::Split { kind, parts } => {
                self.flush_batch().await;
                let mut sent = Vec::with_capacity(parts.len());
                for p in parts {
                    let rx = p.conn.send(p.req.clone(), 1).await;
                    sent.push((rx, p));
                }
                self.writes.join_routed();
                let after = self.take_writes();
                self.push_reply(PendingReply::Split {
                    kind,
                    parts: sent,
                    after: Box::new(after),
                });
            }
            Plan::Fanout { how, parts } => {
                self.flush_batch().await;
                let mut sent = Vec::with_capacity(parts.len());
                for (conn, req) in parts {
                    let rx = conn.send(req.clone(), 1).await;
                    sent.push((rx, conn, req));
                }
                self.writes.join_routed();
                let after = self.take_writes();
                self.push_reply(PendingReply::Fanout {
                    how,
                    parts: sent,
                    after: Box::new(after),
                });
            }
            _ => {}
        }
    }
}
