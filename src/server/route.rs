//! Routing one request: decide from its [`Command`] where it goes (the batch, a reply made on
//! the spot, a dedicated connection, the cache...) and return the [`Plan`] that says what is
//! left to do. Cluster-specific routing is in `cluster_route.rs` and `routed.rs`.

use bytes::{Bytes, BytesMut};

use super::cached::{cache_step, invalidate_writes, queued_write_keys, writes_undeclared};
use super::client::Conn;
use super::clients::{self};
use super::gate::{is_admin, no_permission};
use super::pending::Then;
use super::pin::QueuedCmd;
use super::plan::{AloneReq, AuthReq, BlockingReq, NodeReq, Plan, Repin};
use super::writes::WrittenKeys;
use super::{corral, info};
use crate::commands::{self, Access, Command, Exclusive, Local, LocalCtx, Outcome, Route, Tx};
use crate::error::replies;
use crate::resp::digits::parse_int;
use crate::resp::encode::encode_request;
use crate::resp::reply::Encoder;

/// The bytes of the request being routed, as the client sent them.
pub(super) struct Request<'a> {
    /// The whole request.
    pub(super) frame: &'a [u8],
    /// Sent as an inline command: forwarded re-encoded as RESP.
    pub(super) inline: bool,
    /// Bytes of this request and those after it still in the read buffer (the query buffer
    /// CLIENT INFO and CLIENT LIST show).
    pub(super) queued: usize,
    /// The guard's refusal of this request (`[commands]`), replied before anything else.
    pub(super) refused: Option<Bytes>,
}

impl Request<'_> {
    /// The request as RESP, to send upstream on its own.
    pub(super) fn bytes(&self, cmd: &Command<'_>) -> Bytes {
        if self.inline {
            let mut out = BytesMut::new();
            let argv: Vec<&[u8]> = cmd.args.iter().collect();
            encode_request(&argv, &mut out);
            out.freeze()
        } else {
            Bytes::copy_from_slice(self.frame)
        }
    }
}

impl Conn {
    /// Routes one request: forwards are appended to the batch, local commands run at once.
    pub(super) fn route(&mut self, cmd: &Command<'_>, req: &Request<'_>) -> Plan {
        if let Some(p) = self.route_early(cmd, req) {
            return p;
        }
        let args = cmd.args;
        match cmd.route() {
            Route::Forward(access) => self.forward(cmd, access, req),
            Route::Local(local) => self.local(cmd, local, req),
            Route::Corral | Route::ClientAdmin
                if self.session.user.is_some() && is_admin(&args) =>
            {
                no_permission(&args)
            }
            Route::Corral => {
                self.shared.metrics.local_commands.inc();
                Plan::ready(corral::execute(&args, &self.shared, self.session.proto))
            }
            Route::Info => Plan::Alone(Box::new(AloneReq {
                conn: None,
                req: req.bytes(cmd),
                then: Then::Info {
                    with_proxy: info::wants_proxy_section(&args),
                },
            })),
            Route::Select => Plan::Select {
                db: args
                    .get(1)
                    .and_then(parse_int)
                    .and_then(|n| u32::try_from(n).ok()),
                req: req.bytes(cmd),
            },
            Route::Tx(tx) => self.tx(cmd, tx, req),
            Route::Blocking => self.blocking_plan(cmd, Access::Write, req, None),
            Route::Monitor => Plan::Monitor,
            Route::ClientAdmin => self.client_admin(cmd, req),
            Route::Tracking => Plan::Tracking {
                argv: args.iter().map(Bytes::copy_from_slice).collect(),
                req: req.bytes(cmd),
            },
            Route::PubSub(sub) => self.subscriptions(cmd, sub),
            Route::Unsupported { name, why } => {
                self.shared.metrics.local_commands.inc();
                let mut e = Encoder {
                    proto: self.session.proto,
                    out: &mut self.local,
                };
                e.error(&replies::unsupported(name, why));
                Plan::ready(self.local.split().freeze())
            }
        }
    }

    /// What decides a request before its route does: a refusal, a transaction queueing it,
    /// cluster routing, or Redis answering PING.
    fn route_early(&mut self, cmd: &Command<'_>, req: &Request<'_>) -> Option<Plan> {
        let route = cmd.route();
        self.session.last_cmd.set(cmd);
        let in_multi = self.pin.as_ref().is_some_and(|p| p.in_multi);
        let in_tx = in_multi || self.deferred_multi;
        if let Some(refused) = self.refusal(cmd, req.refused.as_ref()) {
            // As in Redis, a command refused inside MULTI makes EXEC fail; a refused EXEC,
            // inside MULTI or not, discards any transaction and says why in an EXECABORT.
            // (A command the guard hides is unknown to Redis: its refusal is plain.)
            self.tx_failed |= in_tx;
            if route == Route::Tx(Tx::Exec) && req.refused.is_none() {
                return Some(Plan::AbortExec(Some(refused)));
            }
            return Some(Plan::ready(refused));
        }
        if !in_tx {
            self.tx_failed = false;
        } else if self.tx_failed && route == Route::Tx(Tx::Exec) {
            return Some(Plan::AbortExec(None));
        }
        if in_tx && let Some(refused) = self.refused_in_multi(cmd) {
            return Some(refused);
        }
        if in_multi
            && !matches!(
                route,
                Route::Local(Local::Quit | Local::Reset) | Route::Tx(_) | Route::Corral
            )
        {
            return Some(self.queue_in_multi(cmd, req));
        }
        if !matches!(route, Route::Forward(_)) {
            self.info_changed();
        }
        if let Some(password) = super::password::requirepass_set(cmd) {
            return Some(self.plan_requirepass(password, req.bytes(cmd)));
        }
        if let Some(p) = self.cluster_cache_step(cmd, req) {
            return Some(p);
        }
        if let Some(p) = self.cluster_start_multi(cmd, req) {
            return Some(p);
        }
        if let Some(p) = self.cluster_step(cmd, req) {
            if !matches!(p, Plan::Node(_) | Plan::Split { .. } | Plan::Fanout { .. }) {
                self.writes.drop_routed();
            } else if !self.cluster_cache_serves() {
                self.cluster_unserved_writes(cmd);
            }
            return Some(p);
        }
        if let Route::Local(Local::Ping | Local::Echo) = route
            && self.shared.upstream.cluster.is_none()
            && (self.shared.upstream.status.ping_goes_upstream()
                || (self.redis_user() && !self.resp2_subscribed())
                || self.pin.as_ref().is_some_and(|p| p.tracking.is_some()))
        {
            // Redis may be busy with a script (or loading): it would answer -BUSY (-LOADING)
            // rather than PONG, so ask it. Otherwise PING checks corral itself. A Redis user's
            // ACL may deny PING or ECHO: Redis answers for it (but not in RESP2 subscribed
            // mode, whose PING reply only corral's subscriptions can give). A client tracking
            // keys on its own connection gets its invalidations there, between replies: its
            // PING's reply comes after those Redis sent before it, as on Redis.
            self.append_request(cmd, req);
            return Some(Plan::Batched);
        }
        None
    }

    /// Adds the request to the batch, re-encoded if it was sent inline.
    fn append_request(&mut self, cmd: &Command<'_>, req: &Request<'_>) {
        if req.inline {
            let bytes = req.bytes(cmd);
            self.append(&bytes);
        } else {
            self.append(req.frame);
        }
    }

    /// What a command queued in a MULTI tells the pin: for the cache, the keys it writes
    /// when EXEC runs it (a blocking command's too, which inside a transaction runs at once,
    /// BLMOVE writing its destination), or whether it may change every key (SWAPDB sends no
    /// invalidation: EXEC flushes the cache once acknowledged, as the command sent alone
    /// does); whether it is a script; whether it changes the connection's state.
    pub(super) fn queued_cmd(&self, cmd: &Command<'_>) -> QueuedCmd {
        let route = cmd.route();
        let mut q = QueuedCmd {
            script: commands::busy::exclusive(cmd) == Some(Exclusive::Script),
            dirty: !matches!(route, Route::Forward(_) | Route::Blocking | Route::Info),
            ..QueuedCmd::default()
        };
        if self.shared.cache.is_some() {
            match route {
                Route::Forward(Access::Write) | Route::Blocking => {
                    q.writes = queued_write_keys(cmd);
                }
                Route::Forward(Access::All) => q.changes_all = true,
                _ => {}
            }
        }
        q
    }

    /// Inside MULTI, Redis queues (almost) everything: the request joins the batch, and the
    /// pin learns what EXEC will run.
    fn queue_in_multi(&mut self, cmd: &Command<'_>, req: &Request<'_>) -> Plan {
        let (args, route) = (cmd.args, cmd.route());
        // Inside MULTI, Redis queues (almost) everything, PING and SELECT included: the
        // replies must be Redis's own. Commands that change connection state leave the
        // connection unfit for reuse.
        let queued = self.queued_cmd(cmd);
        let bytes = if route == Route::ClientAdmin && is_unblock(&args) {
            clients::unblock_request(&args, &self.shared.clients).0
        } else {
            req.bytes(cmd)
        };
        let tracking_on =
            route == Route::Tracking && cmd.arg_is(1, b"TRACKING") && cmd.arg_is(2, b"ON");
        if tracking_on && args.iter().any(|a| a.eq_ignore_ascii_case(b"REDIRECT")) {
            // The corral id would have to become the target's upstream id, which needs a
            // connection made for it: not while Redis queues the command.
            return Plan::ready(replies::TRACKING_REDIRECT_IN_MULTI.to_bytes());
        }
        let select = match route {
            Route::Select => args
                .get(1)
                .and_then(parse_int)
                .and_then(|n| u32::try_from(n).ok()),
            _ => None,
        };
        if let Some(pause) = cmd.client_pause() {
            // Takes effect at EXEC; counting it from now only routes a little early.
            self.shared.upstream.status.note_pause(pause);
        }
        if tracking_on && let Some(refused) = self.tracking_in_multi() {
            return Plan::ready(refused);
        }
        if let Some(pin) = &mut self.pin {
            if let Some(db) = select {
                pin.queued_selects.push((db, pin.queued));
            }
            pin.queue(queued);
        }
        self.append(&bytes);
        Plan::Batched
    }

    /// A forwarded request: paused, exclusive, counted or cached, else batched.
    fn forward(&mut self, cmd: &Command<'_>, access: Access, req: &Request<'_>) -> Plan {
        let args = cmd.args;
        if let Some(pause) = cmd.client_pause() {
            self.shared.upstream.status.note_pause(pause);
        } else if self.paused_alone() {
            // Redis parks a paused client's connection at its first paused command: on
            // a shared connection that would hold up every client queued behind it.
            // While a pause sent through corral lasts, each request goes alone on a
            // connection of its own, so only its client waits, as on Redis.
            return self.blocking_plan(cmd, access, req, None);
        }
        if let Some(p) = self.exclusive_step(cmd, req) {
            return p;
        }
        if matches!(cmd.name(), b"PUBLISH" | b"SPUBLISH" | b"PUBSUB")
            && let Some(count) = super::pubcount::count_of(&args)
            && !self.all_hubs().iter().all(|h| h.counts_exact())
        {
            return Plan::Alone(Box::new(AloneReq {
                conn: None,
                req: req.bytes(cmd),
                then: Then::Counted(count),
            }));
        }
        self.through_cache(cmd, access, req)
    }

    /// The end of a forward: the cache's step (a GET looked up, a write's keys
    /// invalidated), then the batch unless the cache answered.
    pub(super) fn through_cache(
        &mut self,
        cmd: &Command<'_>,
        access: Access,
        req: &Request<'_>,
    ) -> Plan {
        if let Some(cache) = &self.shared.cache {
            // Never for a Redis user's client: a cached value, or a read coalesced with
            // another client's, would bypass Redis's check of the user's key permissions.
            let may_serve = self.cache_may_serve();
            // Only used with `may_serve` (a leading GET rides on it): corral's own.
            let conn = self
                .shared
                .upstream
                .conn(self.session.proto, self.session.id);
            let step = cache_step(cache, conn, None, &mut self.writes, access, cmd, may_serve);
            if let Some(plan) = self.cache_plan(step) {
                return plan;
            }
        }
        self.append_request(cmd, req);
        Plan::Batched
    }

    /// A request sent alone on a connection of its own (a blocking command; any request
    /// while a CLIENT PAUSE sent through corral lasts), with the cache's part in it as in a
    /// batch: the keys it may write invalidated and held until it is answered (a blocking
    /// command may write when it returns: BLMOVE, BLMPOP...), or for a command that may
    /// change every key, every key held and the cache flushed. `node`: cluster mode's.
    pub(super) fn blocking_plan(
        &self,
        cmd: &Command<'_>,
        access: Access,
        req: &Request<'_>,
        node: Option<String>,
    ) -> Plan {
        let mut writes = WrittenKeys::default();
        let mut writes_all = false;
        let mut lane_barrier = false;
        if let Some(cache) = &self.shared.cache {
            match access {
                Access::Write => {
                    writes = invalidate_writes(cache, cmd);
                    lane_barrier = writes_undeclared(cmd.name());
                }
                Access::All => {
                    cache.write_coming_all(&mut writes.unacked);
                    writes_all = true;
                }
                _ => {}
            }
        }
        Plan::Blocking(Box::new(BlockingReq {
            req: req.bytes(cmd),
            writes,
            writes_all,
            lane_barrier,
            node,
        }))
    }

    /// Standalone mode: a script goes on a connection of its own (or at least is noted as
    /// running), a kill goes out of band.
    fn exclusive_step(&mut self, cmd: &Command<'_>, req: &Request<'_>) -> Option<Plan> {
        let args = cmd.args;
        if self.shared.upstream.cluster.is_some() {
            return None;
        }
        match commands::busy::exclusive(cmd) {
            Some(Exclusive::OutOfBand) if self.pin.is_none() => {
                let shutdown = cmd.name() == b"SHUTDOWN";
                return Some(Plan::OutOfBand {
                    req: req.bytes(cmd),
                    shutdown,
                });
            }
            Some(Exclusive::Script) => {
                let key = commands::busy::script_key(&args);
                if self.pin.is_none() && self.isolates(key) {
                    // The script comes first in this round (`must_start_round`):
                    // pin the client to a connection of its own for the rest of
                    // the round, so no other client waits behind the script. With
                    // every dedicated connection in use it goes on the shared one.
                    let _ = self.pin_new(None);
                }
                self.batch.script = true;
                self.batch.script_keys.extend(key);
            }
            _ => {}
        }
        None
    }

    /// A command corral answers itself (AUTH as a Redis user aside).
    fn local(&mut self, cmd: &Command<'_>, local: Local, req: &Request<'_>) -> Plan {
        let args = cmd.args;
        if matches!(local, Local::Auth | Local::Hello)
            && let Some(auth) = super::user_auth::upstream_auth(local, &args)
            // corral's own users are checked here; without pass-through, unknown names
            // get WRONGPASS from corral too.
            && !self.shared.users.knows(&auth.user)
            && self.shared.cfg.auth.passthrough
        {
            return Plan::AuthUser(Box::new(AuthReq {
                auth,
                req: req.bytes(cmd),
            }));
        }
        let user_before = self.session.user.is_some();
        let proto_before = self.session.proto;
        let version = self.shared.upstream.status.version();
        // Only these look at the password: PING and ECHO take no lock for it.
        let requirepass = match local {
            Local::Auth | Local::Hello | Local::Reset => self.shared.auth.requirepass.get(),
            _ => None,
        };
        let ctx = LocalCtx {
            requirepass: requirepass.as_deref(),
            version: version.as_deref().unwrap_or(crate::VERSION),
            users: Some(&self.shared.users),
        };
        self.shared.metrics.local_commands.inc();
        // CLIENT INFO shows the query buffer: this request and any after it.
        self.session.qbuf = req.queued;
        let outcome =
            commands::local::execute(local, &args, &mut self.session, &ctx, &mut self.local);
        self.session.qbuf = 0;
        if outcome == Outcome::Close {
            self.closing = true;
        }
        let reply = self.local.split().freeze();
        if local == Local::Reset {
            return Plan::Repin {
                reply,
                change: Repin::Reset,
            };
        }
        let left_user = self
            .user_pool()
            .is_some_and(|p| self.session.user.as_ref() != Some(p.user()));
        if (user_before && self.session.user.is_none()) || left_user {
            return Plan::Repin {
                reply,
                change: Repin::Unpin,
            };
        }
        // The pinned connection of a tracking client must speak the client's protocol too.
        let tracking = self.pin.as_ref().is_some_and(|p| p.tracking.is_some());
        if local == Local::Hello && tracking && self.session.proto != proto_before {
            return Plan::Repin {
                reply,
                change: Repin::Hello,
            };
        }
        Plan::ready(reply)
    }

    /// MULTI, EXEC, DISCARD, WATCH, UNWATCH.
    fn tx(&mut self, cmd: &Command<'_>, tx: Tx, req: &Request<'_>) -> Plan {
        if let Tx::Exec = tx
            && let Some(pin) = &mut self.pin
            && pin.in_multi
            && let Some(cache) = &self.shared.cache
        {
            // The queued writes run now: invalidated and held until EXEC is answered.
            self.writes.exec(cache, &mut pin.tx_writes);
        }
        Plan::Tx {
            tx,
            req: req.bytes(cmd),
            node: None,
        }
    }

    /// CLIENT LIST/KILL/REPLY/NO-EVICT, answered by corral, and CLIENT UNBLOCK, which goes to
    /// Redis with the blocked client's upstream id.
    fn client_admin(&mut self, cmd: &Command<'_>, req: &Request<'_>) -> Plan {
        let args = cmd.args;
        if is_unblock(&args) {
            let (req, addr) = clients::unblock_request(&args, &self.shared.clients);
            return match (&self.shared.upstream.cluster, addr) {
                // Cluster mode: to the node the blocked client's connection is on.
                (Some(cluster), Some(addr)) => match crate::cluster::Addr::parse(&addr) {
                    Some(node) => Plan::Node(Box::new(NodeReq {
                        conn: cluster.conn_for(&node, self.session.proto, self.session.id),
                        req,
                        slot: None,
                        lead: None,
                    })),
                    None => {
                        self.append(&req);
                        Plan::Batched
                    }
                },
                _ => {
                    self.append(&req);
                    Plan::Batched
                }
            };
        }
        self.shared.metrics.local_commands.inc();
        // CLIENT LIST shows the caller's query buffer: this request and any after it.
        self.session.qbuf = req.queued;
        let (reply, mode) = clients::execute(&args, &self.session, &self.shared.clients);
        self.session.qbuf = 0;
        match mode {
            Some(mode) => Plan::ReplyMode { mode, reply },
            None => Plan::ready(reply),
        }
    }
}

/// CLIENT UNBLOCK, which goes to Redis with the blocked client's upstream id.
fn is_unblock(args: &crate::resp::Args<'_>) -> bool {
    args.get(1)
        .is_some_and(|s| s.eq_ignore_ascii_case(b"UNBLOCK"))
}
