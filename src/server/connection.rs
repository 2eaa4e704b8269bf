//! One client connection: read pipelined requests, route each, write replies in request order.
//!
//! Each round parses every complete request in the read buffer. Consecutive forwarded requests
//! become one job on the client's upstream connection; local replies are produced on the spot.
//! The round's replies are then collected in request order (see `pending.rs`) and written with
//! one write. With the cache on, GETs are looked up or coalesced and writes invalidate
//! (`cached.rs`); transactions, blocking commands, SELECT and MONITOR use dedicated upstream
//! connections (`stateful.rs`).

use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::cached::{cache_step, invalidate_writes};
use super::clients::{self, ClientEntry, ReplyMode};
use super::pending::{AfterAck, PendingReply, Queued, Then};
use super::pin::Pin;
use super::subscriber::{Subscriptions, encode_message};
use super::track_state::Inbox;
use super::writes::Writes;
use super::{Shared, cluster_view, corral, info, routed};
use crate::commands::{
    self, Access, Command, Exclusive, Kind, Local, LocalCtx, Outcome, Route, Session, Tx,
};
use crate::resp::reply::{self, Encoder};
use crate::resp::request::{encode_request, parse_int};
use crate::resp::{Limits, Parsed, RequestParser};
use crate::upstream::UpstreamConn;

/// Most requests handled in one round; bounds the replies buffered per client.
const MAX_PER_ROUND: usize = 1024;
/// Stop adding to a round once this many request bytes are queued for the upstream.
const MAX_ROUND_BYTES: usize = 1024 * 1024;
const READ_CHUNK: usize = 16 * 1024;

pub(super) struct Conn {
    pub(super) shared: Arc<Shared>,
    pub(super) session: Session,
    entry: Arc<ClientEntry>,
    /// Cancelled by shutdown or CLIENT KILL.
    pub(super) kill: CancellationToken,
    parser: RequestParser,
    pub(super) rbuf: BytesMut,
    pub(super) wbuf: BytesMut,
    /// Scratch space for local replies, split off into `PendingReply::Ready`.
    local: BytesMut,
    /// Forwarded requests not yet handed to the upstream, and where they go.
    batch: BytesMut,
    batch_count: u32,
    batch_conn: Option<UpstreamConn>,
    /// Writes in this round and batch, for the cache.
    writes: Writes,
    pub(super) replies: Vec<Queued>,
    /// Close the connection after this round's replies are written (QUIT, protocol error).
    pub(super) closing: bool,
    /// Close the connection at once, writing nothing more (client gone, output limit).
    pub(super) gone: bool,
    /// A dedicated connection this client is pinned to (MULTI/WATCH).
    pub(super) pin: Option<Pin>,
    reply_mode: ReplyMode,
    /// Replies to the request being routed are dropped (CLIENT REPLY OFF/SKIP).
    silent_now: bool,
    /// After this round, the connection becomes a MONITOR relay.
    monitor: bool,
    /// RESET was processed: drop the pinned connection after this round.
    pub(super) pin_reset: bool,
    /// The session changed in a way CLIENT LIST shows.
    pub(super) info_changed: bool,
    /// The last command CLIENT LIST shows for this client (published at the end of a round).
    published_cmd: commands::session::LastCmd,
    /// Pub/sub subscriptions, once the client subscribed to something.
    pub(super) subs: Option<Subscriptions>,
    /// An EXEC being sent runs these queued SELECTs (database, position).
    pub(super) exec_select: Option<Vec<(u32, usize)>>,
    /// Cluster mode: each batched request and its slot, to retry after a redirection.
    batch_cmds: Vec<(Bytes, Option<u16>)>,
    /// GETs in the batch that other clients' GETs wait for: (position in the batch, lead).
    batch_leads: Vec<(u32, crate::cache::Lead)>,
    /// Cluster mode: MULTI was answered, no command queued yet.
    pub(super) deferred_multi: bool,
    /// The next batch starts with a request whose reply the client must not see (the MULTI
    /// sent late for a deferred one).
    pub(super) skip_first: bool,
    /// The current batch runs a script or function (or an EXEC that does).
    pub(super) batch_script: bool,
    /// The current batch's scripts ([`commands::busy::script_key`]), to learn how long they take.
    pub(super) batch_script_keys: Vec<u64>,
    /// Requests were read from the client while waiting for a reply on a dedicated
    /// connection: parse them before waiting for more input.
    pub(super) read_ahead: bool,
    /// Woken when pushes wait in an inbox (CLIENT TRACKING).
    pub(super) wake: Arc<tokio::sync::Notify>,
    /// Invalidations redirected to this client (CLIENT TRACKING ... REDIRECT its id).
    pub(super) redirected: Arc<Inbox>,
}

/// Serves one client until it disconnects, sends QUIT, breaks the protocol, or shutdown.
///
/// # Errors
/// An I/O error on the client socket.
pub async fn run(
    mut stream: TcpStream,
    id: u64,
    shared: Arc<Shared>,
    kill: CancellationToken,
) -> std::io::Result<()> {
    let addr = stream.peer_addr()?;
    let laddr = stream.local_addr()?;
    let l = &shared.cfg.limits;
    let limits = Limits {
        max_bulk_len: l.proto_max_bulk_len,
        max_multibulk_len: l.max_multibulk_len,
        max_inline_len: l.max_inline_len,
    };
    let authenticated = shared.cfg.requirepass.get().is_none();
    let session = Session::new(id, addr, laddr, authenticated);
    let entry = shared.clients.add(&session, kill.clone());
    let wake = Arc::new(tokio::sync::Notify::new());
    let redirected = Inbox::new(wake.clone(), kill.clone());
    shared.tracking.register(id, redirected.clone());
    let _registered = Registered(shared.clone(), id);
    let mut c = Conn {
        session,
        entry,
        kill: kill.clone(),
        parser: RequestParser::new(limits),
        rbuf: BytesMut::with_capacity(READ_CHUNK),
        wbuf: BytesMut::with_capacity(READ_CHUNK),
        local: BytesMut::new(),
        batch: BytesMut::new(),
        batch_count: 0,
        batch_conn: None,
        writes: Writes::default(),
        replies: Vec::new(),
        closing: false,
        gone: false,
        pin: None,
        reply_mode: ReplyMode::On,
        silent_now: false,
        monitor: false,
        pin_reset: false,
        info_changed: false,
        published_cmd: commands::session::LastCmd::default(),
        subs: None,
        exec_select: None,
        batch_cmds: Vec::new(),
        batch_leads: Vec::new(),
        deferred_multi: false,
        skip_first: false,
        batch_script: false,
        batch_script_keys: Vec::new(),
        read_ahead: false,
        wake,
        redirected,
        shared,
    };
    loop {
        let wants_input = c.dispatch().await;
        if !c.replies.is_empty() {
            c.collect(&mut stream).await;
            if c.gone {
                return Ok(());
            }
            stream.write_all(&c.wbuf).await?;
            c.wbuf.clear();
        }
        c.after_round();
        if c.monitor {
            return c.relay_monitor(stream).await;
        }
        if c.closing {
            return Ok(());
        }
        if !wants_input || std::mem::take(&mut c.read_ahead) {
            continue;
        }
        if c.rbuf.len() >= c.shared.cfg.limits.client_query_buffer_limit {
            warn!(
                len = c.rbuf.len(),
                "closing client that reached max query buffer length"
            );
            c.shared.metrics.protocol_errors.inc();
            return Ok(());
        }
        let want = c
            .parser
            .needed()
            .saturating_sub(c.rbuf.len())
            .max(READ_CHUNK);
        c.rbuf.reserve(want);
        let wake = c.wake.clone();
        let n = match &mut c.subs {
            None => tokio::select! {
                r = stream.read_buf(&mut c.rbuf) => r?,
                _ = wake.notified() => {
                    c.write_inbox(&mut stream).await?;
                    continue;
                }
                _ = kill.cancelled() => return Ok(()),
            },
            // Subscribed: messages are written as they come, between requests.
            Some(subs) => tokio::select! {
                r = stream.read_buf(&mut c.rbuf) => r?,
                msg = subs.rx.recv() => {
                    let Some(msg) = msg else { return Ok(()) };
                    encode_message(&msg, c.session.proto, &mut c.wbuf);
                    while c.wbuf.len() < 64 * 1024 {
                        match subs.rx.try_recv() {
                            Ok(m) => encode_message(&m, c.session.proto, &mut c.wbuf),
                            Err(_) => break,
                        }
                    }
                    // A subscriber that stops reading must not pin this task: the hub
                    // cancels `kill` once its queue is full.
                    tokio::select! {
                        r = stream.write_all(&c.wbuf) => r?,
                        _ = kill.cancelled() => return Ok(()),
                    }
                    c.wbuf.clear();
                    continue;
                }
                _ = wake.notified() => {
                    c.write_inbox(&mut stream).await?;
                    continue;
                }
                _ = kill.cancelled() => return Ok(()),
            },
        };
        if n == 0 {
            return Ok(());
        }
    }
}

/// Removes the client from the registry when its task ends, however it ends.
struct Registered(Arc<Shared>, u64);

impl Drop for Registered {
    fn drop(&mut self) {
        self.0.clients.remove(self.1);
        // Nobody waits for the upstream unsubscribes: the client is gone.
        drop(self.0.pubsub.remove(self.1));
        self.0.tracking.remove(self.1);
    }
}

/// What a routed request still needs after the synchronous part.
pub(super) enum Plan {
    /// Appended to the batch: nothing more to do.
    Batched,
    /// A reply (local, a cache hit, a read to wait for...) queued after the batch so far.
    Reply(PendingReply),
    /// A GET that others may join: forwarded in the batch, its reply shared when it arrives.
    Lead(crate::cache::Lead),
    /// A request sent on its own after the batch so far, on `conn` (the client's usual
    /// connection if `None`); its one reply is handled as `then` says.
    Alone {
        conn: Option<UpstreamConn>,
        req: Bytes,
        then: Then,
    },
    /// A transaction command (the request bytes), which may pin or unpin the client.
    Tx {
        tx: Tx,
        req: Bytes,
        /// Cluster mode: the node to pin to.
        node: Option<String>,
    },
    /// A command that may block, with the keys it may write.
    Blocking {
        req: Bytes,
        writes: Vec<Bytes>,
        /// Cluster mode: the node serving the keys.
        node: Option<String>,
    },
    /// Cluster mode: MULTI is answered locally until the first queued command says which
    /// node the transaction runs on.
    DeferMulti,
    /// Cluster mode: the first command queued after a deferred MULTI, for `node`.
    StartMulti { node: String, req: Bytes },
    /// Cluster mode: EXEC or DISCARD of a deferred MULTI with nothing queued.
    EndDeferred(Bytes),
    /// SELECT: `db` if the argument is a valid index.
    Select { db: Option<u32>, req: Bytes },
    /// SCRIPT KILL, FUNCTION KILL, SHUTDOWN: sent alone on a connection of its own.
    OutOfBand { req: Bytes, shutdown: bool },
    /// MONITOR: relay once this round's replies are written.
    Monitor,
    /// CLIENT REPLY changed the reply mode; `reply` is its own reply (maybe empty).
    ReplyMode { mode: ReplyMode, reply: Bytes },
    /// RESET: its reply, after which pinning and reply mode are reset too.
    Reset(Bytes),
    /// HELLO switched the protocol of a client with CLIENT TRACKING on (its reply): the
    /// tracking connection, which it keeps, switches too.
    HelloPinned(Bytes),
    /// AUTH or HELLO AUTH as a Redis user, checked by Redis (`users.rs`).
    AuthUser {
        auth: super::user_auth::UserAuth,
        req: Bytes,
    },
    /// A successful AUTH back to `default` of a client authenticated as a Redis user (its
    /// reply): the user's connection is closed after this round.
    Unpin(Bytes),
    /// CLIENT TRACKING/CACHING/GETREDIR/TRACKINGINFO (arguments, request bytes).
    Tracking { argv: Vec<Bytes>, req: Bytes },
    /// Cluster mode: a request for one node (`slot`: its keys' slot, to retry after a
    /// redirection).
    Node {
        conn: UpstreamConn,
        req: Bytes,
        slot: Option<u16>,
    },
    /// Cluster mode: a multi-key request split per slot.
    Split {
        kind: crate::cluster::SplitKind,
        parts: Vec<routed::Part>,
    },
    /// Cluster mode: the same request to every master.
    Fanout {
        how: routed::Fan,
        parts: Vec<(UpstreamConn, Bytes)>,
    },
}

impl Plan {
    /// A reply produced on the spot.
    pub(super) fn ready(bytes: Bytes) -> Plan {
        Plan::Reply(PendingReply::Ready(bytes))
    }
}

impl Conn {
    /// Parses and routes the complete requests in the read buffer. Returns true when it
    /// stopped for lack of input, false when requests are left for another round.
    async fn dispatch(&mut self) -> bool {
        let mut off = 0;
        let mut handled = 0;
        let mut wants_input = false;
        self.writes.new_round();
        if self.user_connection_lost() {
            // Its requests cannot go on as the user, and must not go on as anyone else.
            self.closing = true;
            return false;
        }
        while !self.closing {
            if handled == MAX_PER_ROUND || self.batch.len() >= MAX_ROUND_BYTES {
                break;
            }
            let parsed = match self
                .parser
                .parse(&self.rbuf[off..], self.session.authenticated)
            {
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
            let cmd = Command::new(self.parser.args(&self.rbuf[off..off + len]));
            let kind = cmd.kind;
            if self.must_start_round(&cmd) {
                // This request moves the client to another upstream connection: everything
                // before it must complete first, so start it in a round of its own.
                break;
            }
            handled += 1;
            let (proto, db) = (self.session.proto, self.session.db);
            let skip = self.reply_mode == ReplyMode::Skip;
            if skip {
                // CLIENT REPLY SKIP drops exactly this request's reply: give it its own pending reply.
                self.flush_batch().await;
                self.reply_mode = ReplyMode::On;
                self.silent_now = true;
            }
            let pending = self.route(off, len, inline, kind);
            off += len;
            let barrier = self.handle(pending).await;
            if skip {
                self.flush_batch().await;
                self.silent_now = false;
            }
            if barrier || self.session.proto != proto || self.session.db != db {
                // Later requests must wait for this one (it blocks, or they go to another
                // upstream connection): end the round so Redis sees them in order.
                break;
            }
        }
        self.rbuf.advance(off);
        self.flush_batch().await;
        self.shared.metrics.commands.inc_by(handled as u64);
        wants_input
    }

    /// Carries out the asynchronous part of a routed request; true ends the round after it.
    async fn handle(&mut self, pending: Plan) -> bool {
        match pending {
            Plan::Batched => {}
            // Leads are batched by `route`; one reaching here had no batch to ride in.
            Plan::Lead(lead) => {
                lead.complete(Err(crate::error::UpstreamError::BadReply {
                    cause: "read not sent".into(),
                }));
                self.push_ready(Bytes::from_static(b"-ERR internal: read not sent\r\n"))
                    .await;
            }
            Plan::Reply(reply) => {
                self.flush_batch().await;
                self.push_reply(reply);
            }
            Plan::Alone { conn, req, then } => {
                self.flush_batch().await;
                let conn = conn.unwrap_or_else(|| self.target());
                let rx = conn.send(req, 1).await;
                self.push_reply(PendingReply::Reply { rx, conn, then });
            }
            Plan::Tx { tx, req, node } => return self.transaction(tx, req, node).await,
            Plan::Blocking { req, writes, node } => {
                return self.blocking(req, writes, node).await;
            }
            Plan::DeferMulti => {
                self.deferred_multi = true;
                self.push_ready(Bytes::from_static(reply::OK)).await;
            }
            Plan::StartMulti { node, req } => return self.start_multi(node, req).await,
            Plan::EndDeferred(reply) => {
                self.deferred_multi = false;
                self.push_ready(reply).await;
            }
            Plan::Select { db, req } => return self.select(db, req).await,
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
            Plan::Node { conn, req, slot } => {
                if self.batch_count > 0 && !self.batch_conn.as_ref().is_some_and(|c| c.same(&conn))
                {
                    self.flush_batch().await;
                }
                if self.batch_count == 0 {
                    self.batch_conn = Some(conn);
                }
                self.batch.extend_from_slice(&req);
                self.batch_count += 1;
                self.batch_cmds.push((req, slot));
            }
            Plan::Split { kind, parts } => {
                self.flush_batch().await;
                let mut sent = Vec::with_capacity(parts.len());
                for p in parts {
                    let rx = p.conn.send(p.req.clone(), 1).await;
                    sent.push((rx, p));
                }
                let after = self.take_writes();
                self.push_reply(PendingReply::Split {
                    kind,
                    parts: sent,
                    after,
                });
            }
            Plan::Fanout { how, parts } => {
                self.flush_batch().await;
                let mut sent = Vec::with_capacity(parts.len());
                for (conn, req) in parts {
                    let rx = conn.send(req.clone(), 1).await;
                    sent.push((rx, conn, req));
                }
                let after = self.take_writes();
                self.push_reply(PendingReply::Fanout {
                    how,
                    parts: sent,
                    after,
                });
            }
            Plan::Tracking { argv, req } => return self.client_tracking(argv, req).await,
            Plan::AuthUser { auth, req } => return self.auth_user(auth, req).await,
            Plan::Unpin(reply) => {
                self.push_ready(reply).await;
                // Dropped, not released, at the end of the round (see `release_pin_if_done`);
                // later requests start a new round, on corral's own connections.
                self.pin_reset = true;
                return true;
            }
            Plan::HelloPinned(reply) => {
                self.push_ready(reply).await;
                // Redis's reply to this HELLO is not the client's: it got corral's.
                let mut hello = BytesMut::new();
                let version = self.session.proto.as_int().to_string();
                encode_request(&[b"HELLO", version.as_bytes()], &mut hello);
                self.skip_first = true;
                self.append(&hello);
                self.flush_batch().await;
            }
            Plan::Reset(reply) => {
                self.flush_batch().await;
                let waits = self.reset_state();
                // RESET turns replies back on, its own included. Like an UNSUBSCRIBE's, its
                // reply waits until Redis dropped the upstream subscriptions it ended.
                self.push_reply(PendingReply::Subscribed { reply, waits });
                return true;
            }
        }
        false
    }

    /// Routes the request at `rbuf[off..off + len]`: forwards are appended to the batch, local
    /// commands run at once.
    fn route(&mut self, off: usize, len: usize, inline: bool, kind: Kind) -> Plan {
        let frame = &self.rbuf[off..off + len];
        let cmd = Command {
            args: self.parser.args(frame),
            kind,
        };
        let (args, route) = (cmd.args, kind.route);
        self.session.last_cmd.set(&args);
        let allowed_unauthenticated = matches!(
            route,
            Route::Local(Local::Auth | Local::Hello | Local::Quit | Local::Reset)
        );
        if !self.session.authenticated && !allowed_unauthenticated {
            return Plan::ready(Bytes::from_static(reply::NOAUTH));
        }
        if self.resp2_subscribed() {
            match route {
                Route::PubSub(_) | Route::Local(Local::Quit | Local::Reset) => {}
                // Redis checks that the command exists, then the subscribed-mode rule.
                _ if !cmd.exists() => {
                    return Plan::ready(unknown_command(&args));
                }
                Route::Local(Local::Ping) if args.len() > 2 => {
                    let mut e = Encoder {
                        proto: self.session.proto,
                        out: &mut self.local,
                    };
                    e.error(&reply::wrong_arity("ping"));
                    return Plan::ready(self.local.split().freeze());
                }
                // In RESP2 subscribed mode PING answers in the shape of a message.
                Route::Local(Local::Ping) => {
                    let mut e = Encoder {
                        proto: self.session.proto,
                        out: &mut self.local,
                    };
                    e.array(2);
                    e.bulk(b"pong");
                    e.bulk(args.get(1).unwrap_or_default());
                    return Plan::ready(self.local.split().freeze());
                }
                _ => {
                    let name = full_command_name(&args);
                    let mut e = Encoder {
                        proto: self.session.proto,
                        out: &mut self.local,
                    };
                    e.error(&format!(
                        "ERR Can't execute '{name}': only (P|S)SUBSCRIBE / (P|S)UNSUBSCRIBE / \
                         PING / QUIT / RESET are allowed in this context"
                    ));
                    return Plan::ready(self.local.split().freeze());
                }
            }
        }
        let req = || -> Bytes {
            if inline {
                let mut out = BytesMut::new();
                let argv: Vec<&[u8]> = args.iter().collect();
                encode_request(&argv, &mut out);
                out.freeze()
            } else {
                Bytes::copy_from_slice(frame)
            }
        };
        let in_multi = self.pin.as_ref().is_some_and(|p| p.in_multi);
        if in_multi
            && !matches!(
                route,
                Route::Local(Local::Quit | Local::Reset) | Route::Tx(_) | Route::Corral
            )
        {
            // Inside MULTI, Redis queues (almost) everything, PING and SELECT included: the
            // replies must be Redis's own. Commands that change connection state leave the
            // connection unfit for reuse.
            let mut queued_writes = match (route, &self.shared.cache) {
                (Route::Forward(Access::Write), Some(cache)) => invalidate_writes(cache, &cmd),
                _ => Vec::new(),
            };
            let bytes = if route == Route::ClientAdmin && is_unblock(&args) {
                clients::unblock_request(&args, &self.shared.clients).0
            } else {
                req()
            };
            let tracking_on =
                route == Route::Tracking && cmd.arg_is(1, b"TRACKING") && cmd.arg_is(2, b"ON");
            if tracking_on && args.iter().any(|a| a.eq_ignore_ascii_case(b"REDIRECT")) {
                // The corral id would have to become the target's upstream id, which needs a
                // connection made for it: not while Redis queues the command.
                return Plan::ready(Bytes::from_static(
                    b"-ERR CLIENT TRACKING with REDIRECT inside MULTI is not supported by corral\r\n",
                ));
            }
            let select = match route {
                Route::Select => args
                    .get(1)
                    .and_then(parse_int)
                    .and_then(|n| u32::try_from(n).ok()),
                _ => None,
            };
            let script = commands::busy::exclusive(&cmd) == Some(Exclusive::Script);
            if let Some(pause) = client_pause(&args) {
                // Takes effect at EXEC; counting it from now only routes a little early.
                self.shared.upstream.status.note_pause(pause);
            }
            if tracking_on && let Some(refused) = self.tracking_in_multi() {
                return Plan::ready(refused);
            }
            if let Some(pin) = &mut self.pin {
                pin.script_queued |= script;
                pin.dirty |= !matches!(route, Route::Forward(_) | Route::Blocking | Route::Info);
                pin.tx_writes.add(&mut queued_writes);
                if let Some(db) = select {
                    pin.queued_selects.push((db, pin.queued));
                }
                pin.queued += 1;
            }
            self.append(&bytes);
            return Plan::Batched;
        }
        if !matches!(route, Route::Forward(_)) {
            self.info_changed = true;
        }
        if let (Some(cluster), Some(cache), Route::Forward(access)) =
            (&self.shared.upstream.cluster, &self.shared.cache, route)
            && self.pin.is_none()
            && !self.deferred_multi
            && cluster.reads_from_masters()
        {
            // Cluster mode: reads of one key may be served or coalesced by the cache, through
            // the tracking lane of the key's master; writes invalidate.
            let master = args
                .get(1)
                .and_then(|k| cluster.master_of(crate::cluster::key_slot(k)));
            if let Some(master) = master {
                let conn = cluster.conn_for(&master, self.session.proto, self.session.id);
                let node = master.to_string();
                let step = cache_step(
                    cache,
                    &conn,
                    Some(&node),
                    &mut self.writes,
                    access,
                    &cmd,
                    true,
                );
                if let Some(p) = step {
                    return p;
                }
            }
        }
        if let Some(p) = self.cluster_step(&cmd, &req) {
            return p;
        }
        if let Route::Local(Local::Ping | Local::Echo) = route
            && self.shared.upstream.cluster.is_none()
            && (self.shared.upstream.status.ping_goes_upstream() || self.user_pinned())
        {
            // Redis may be busy with a script (or loading): it would answer -BUSY (-LOADING)
            // rather than PONG, so ask it. Otherwise PING checks corral itself. A Redis user's
            // ACL may deny PING or ECHO: Redis answers for it.
            if inline {
                let bytes = req();
                self.append(&bytes);
            } else {
                self.append_range(off, off + len);
            }
            return Plan::Batched;
        }
        match route {
            Route::Forward(access) => {
                if let Some(pause) = client_pause(&args) {
                    self.shared.upstream.status.note_pause(pause);
                } else if self.paused_alone() {
                    // Redis parks a paused client's connection at its first paused command: on
                    // a shared connection that would hold up every client queued behind it.
                    // While a pause sent through corral lasts, each request goes alone on a
                    // connection of its own, so only its client waits, as on Redis.
                    let writes = match &self.shared.cache {
                        Some(cache) if access == Access::Write => invalidate_writes(cache, &cmd),
                        _ => Vec::new(),
                    };
                    return Plan::Blocking {
                        req: req(),
                        writes,
                        node: None,
                    };
                }
                if self.shared.upstream.cluster.is_none() {
                    match commands::busy::exclusive(&cmd) {
                        Some(Exclusive::OutOfBand) if self.pin.is_none() => {
                            let shutdown = cmd.name() == b"SHUTDOWN";
                            return Plan::OutOfBand {
                                req: req(),
                                shutdown,
                            };
                        }
                        Some(Exclusive::Script) => {
                            let key = commands::busy::script_key(&args);
                            if self.pin.is_none() && self.isolates(key) {
                                // The script comes first in this round (`must_start_round`):
                                // pin the client to a connection of its own for the rest of
                                // the round, so no other client waits behind the script. With
                                // every dedicated connection in use it goes on the shared one.
                                self.pin = self
                                    .shared
                                    .upstream
                                    .dedicated_to(None, self.session.proto, self.session.db)
                                    .ok()
                                    .map(Pin::new);
                            }
                            self.batch_script = true;
                            self.batch_script_keys.extend(key);
                        }
                        _ => {}
                    }
                }
                if let Some(count) = super::pubcount::count_of(&args)
                    && !self.shared.pubsub.counts_exact()
                {
                    return Plan::Alone {
                        conn: None,
                        req: req(),
                        then: Then::Counted(count),
                    };
                }
                if let Some(cache) = &self.shared.cache {
                    let may_serve = self.pin.is_none() && self.session.db == 0;
                    let conn = self
                        .shared
                        .upstream
                        .conn(self.session.proto, self.session.id);
                    let step =
                        cache_step(cache, conn, None, &mut self.writes, access, &cmd, may_serve);
                    match step {
                        Some(Plan::Lead(lead)) => {
                            self.batch_leads.push((self.batch_count, lead));
                        }
                        Some(p) => return p,
                        None => {}
                    }
                }
                if inline {
                    let bytes = req();
                    self.append(&bytes);
                } else {
                    // Borrow dance: `frame` borrows `rbuf`, `append` needs `self`.
                    let (start, end) = (off, off + len);
                    self.append_range(start, end);
                }
                Plan::Batched
            }
            Route::Corral | Route::ClientAdmin
                if self.session.user.is_some() && is_admin(&args) =>
            {
                // A Redis ACL user's permissions are Redis's to check, and corral cannot check
                // them for what it answers itself: its admin commands are for `default` only.
                let name = String::from_utf8_lossy(args.get(0).unwrap_or_default()).to_lowercase();
                let sub = args
                    .get(1)
                    .filter(|_| name == "client")
                    .map(|s| format!("|{}", String::from_utf8_lossy(s).to_lowercase()))
                    .unwrap_or_default();
                Plan::ready(Bytes::from(format!(
                    "-NOPERM this user has no permissions to run the '{name}{sub}' command\r\n"
                )))
            }
            Route::Corral => {
                self.shared.metrics.local_commands.inc();
                Plan::ready(corral::execute(&args, &self.shared, self.session.proto))
            }
            Route::Info => Plan::Alone {
                conn: None,
                req: req(),
                then: Then::Info {
                    with_proxy: info::wants_proxy_section(&args),
                },
            },
            Route::Local(cmd) => {
                if matches!(cmd, Local::Auth | Local::Hello)
                    && let Some(auth) = super::user_auth::upstream_auth(cmd, &args)
                {
                    return Plan::AuthUser { auth, req: req() };
                }
                let user_before = self.session.user.is_some();
                let proto_before = self.session.proto;
                let version = self.shared.upstream.status.version();
                let ctx = LocalCtx {
                    requirepass: self.shared.cfg.requirepass.get(),
                    version: version.as_deref().unwrap_or(crate::VERSION),
                };
                self.shared.metrics.local_commands.inc();
                // CLIENT INFO shows the query buffer: this request and any after it.
                self.session.qbuf = self.rbuf.len() - off;
                let outcome =
                    commands::local::execute(cmd, &args, &mut self.session, &ctx, &mut self.local);
                self.session.qbuf = 0;
                if outcome == Outcome::Close {
                    self.closing = true;
                }
                let reply = self.local.split().freeze();
                if cmd == Local::Reset {
                    return Plan::Reset(reply);
                }
                if user_before && self.session.user.is_none() {
                    return Plan::Unpin(reply);
                }
                // The pinned connection of a tracking client or a Redis user must speak the
                // client's protocol too.
                let tracking = self
                    .pin
                    .as_ref()
                    .is_some_and(|p| p.tracking.is_some() || p.user.is_some());
                if cmd == Local::Hello && tracking && self.session.proto != proto_before {
                    return Plan::HelloPinned(reply);
                }
                Plan::ready(reply)
            }
            Route::Select => Plan::Select {
                db: args
                    .get(1)
                    .and_then(parse_int)
                    .and_then(|n| u32::try_from(n).ok()),
                req: req(),
            },
            Route::Tx(tx) => {
                if let Tx::Exec = tx
                    && let Some(pin) = &mut self.pin
                    && pin.in_multi
                {
                    // The queued writes run now: invalidate them again once EXEC is answered.
                    self.writes.exec(&mut pin.tx_writes);
                }
                Plan::Tx {
                    tx,
                    req: req(),
                    node: None,
                }
            }
            Route::Blocking => {
                let writes = match &self.shared.cache {
                    Some(cache) => invalidate_writes(cache, &cmd),
                    None => Vec::new(),
                };
                Plan::Blocking {
                    req: req(),
                    writes,
                    node: None,
                }
            }
            Route::Monitor if self.user_pinned() => Plan::ready(Bytes::from_static(
                b"-ERR MONITOR is not supported by corral for a client authenticated as a Redis \
                  ACL user\r\n",
            )),
            Route::Monitor => Plan::Monitor,
            Route::ClientAdmin if is_unblock(&args) => {
                let (req, addr) = clients::unblock_request(&args, &self.shared.clients);
                match (&self.shared.upstream.cluster, addr) {
                    // Cluster mode: to the node the blocked client's connection is on.
                    (Some(cluster), Some(addr)) => match crate::cluster::Addr::parse(&addr) {
                        Some(node) => Plan::Node {
                            conn: cluster.conn_for(&node, self.session.proto, self.session.id),
                            req,
                            slot: None,
                        },
                        None => {
                            self.append(&req);
                            Plan::Batched
                        }
                    },
                    _ => {
                        self.append(&req);
                        Plan::Batched
                    }
                }
            }
            Route::Tracking => Plan::Tracking {
                argv: args.iter().map(Bytes::copy_from_slice).collect(),
                req: req(),
            },
            Route::ClientAdmin => {
                self.shared.metrics.local_commands.inc();
                // CLIENT LIST shows the caller's query buffer: this request and any after it.
                self.session.qbuf = self.rbuf.len() - off;
                let (reply, mode) = clients::execute(&args, &self.session, &self.shared.clients);
                self.session.qbuf = 0;
                match mode {
                    Some(mode) => Plan::ReplyMode { mode, reply },
                    None => Plan::ready(reply),
                }
            }
            Route::PubSub(
                commands::PubSub::Subscribe
                | commands::PubSub::PSubscribe
                | commands::PubSub::SSubscribe,
            ) if self.user_pinned() => {
                // corral's shared pub/sub connection is authenticated as corral's upstream
                // user: the user's channel permissions would not apply.
                Plan::ready(Bytes::from_static(
                    b"-ERR SUBSCRIBE is not supported by corral for a client authenticated as \
                      a Redis ACL user\r\n",
                ))
            }
            Route::PubSub(cmd) => {
                self.shared.metrics.local_commands.inc();
                let owned: Vec<Vec<u8>> = args.iter().map(<[u8]>::to_vec).collect();
                let (reply, waits) = self.pubsub(cmd, &crate::resp::Args::Owned(&owned));
                Plan::Reply(PendingReply::Subscribed { reply, waits })
            }
            Route::Unsupported { name, why } => {
                self.shared.metrics.local_commands.inc();
                let mut e = Encoder {
                    proto: self.session.proto,
                    out: &mut self.local,
                };
                e.error(&reply::unsupported(name, why));
                Plan::ready(self.local.split().freeze())
            }
        }
    }

    /// True when the request at `rbuf[off..off + len]` needs a dedicated connection (MULTI or
    /// WATCH while not pinned, or a blocking command) and this round already sent requests
    /// elsewhere: they could otherwise run after it.
    fn must_start_round(&self, cmd: &Command<'_>) -> bool {
        if self.batch_count == 0 && self.replies.is_empty() {
            return false;
        }
        let args = cmd.args;
        match cmd.route() {
            Route::Tx(Tx::Multi | Tx::Watch) => self.pin.is_none(),
            Route::Blocking => true,
            Route::Forward(_) if client_pause(&args).is_none() && self.paused_alone() => true,
            // A script moves the client to a dedicated connection; a kill goes out of band.
            Route::Forward(_) if self.shared.upstream.cluster.is_none() => {
                self.pin.is_none()
                    && match commands::busy::exclusive(cmd) {
                        Some(Exclusive::Script) => self.isolates(commands::busy::script_key(&args)),
                        Some(Exclusive::OutOfBand) => true,
                        None => false,
                    }
            }
            // CLIENT TRACKING ON pins the client: what came before must run first.
            Route::Tracking => {
                self.pin.is_none() && cmd.arg_is(1, b"TRACKING") && cmd.arg_is(2, b"ON")
            }
            _ => false,
        }
    }

    /// Cluster mode: routes by slot, answers CLUSTER/READONLY/READWRITE/SELECT as a single
    /// node would, and refuses what is not supported there yet. `None` in standalone mode or
    /// for requests handled as usual (local commands, INFO, pub/sub...).
    fn cluster_step(&self, cmd: &Command<'_>, req: &dyn Fn() -> Bytes) -> Option<Plan> {
        let (args, route) = (&cmd.args, cmd.route());
        let cluster = self.shared.upstream.cluster.as_ref()?;
        let proto = self.session.proto;
        let error = |text: &str| {
            let mut out = BytesMut::new();
            Encoder {
                proto,
                out: &mut out,
            }
            .error(text);
            Some(Plan::ready(out.freeze()))
        };
        let name = cmd.name();
        if self.deferred_multi
            && !matches!(
                route,
                Route::Tx(_) | Route::Local(Local::Quit | Local::Reset) | Route::Corral
            )
        {
            let node = match self.node_of(cluster, cmd) {
                Ok(node) => node,
                Err(e) => return Some(Plan::ready(e)),
            };
            return Some(Plan::StartMulti { node, req: req() });
        }
        match route {
            Route::Forward(_) => match name {
                b"CLUSTER" => {
                    let healthy = cluster.map().covered() == crate::cluster::SLOTS;
                    match cluster_view::execute(args, self.session.laddr, healthy, proto) {
                        cluster_view::ClusterReply::Local(b) => Some(Plan::ready(b)),
                        cluster_view::ClusterReply::PendingReply(slot) => {
                            let addr = cluster
                                .master_of(slot)
                                .unwrap_or_else(|| cluster.any_node());
                            Some(Plan::Node {
                                conn: cluster.conn_for(&addr, proto, self.session.id),
                                req: req(),
                                slot: Some(slot),
                            })
                        }
                    }
                }
                b"READONLY" | b"READWRITE" if args.len() == 1 => {
                    Some(Plan::ready(Bytes::from_static(reply::OK)))
                }
                _ => Some(routed::route(cluster, cmd, req(), proto, self.session.id)),
            },
            Route::Select => match args.get(1).and_then(parse_int) {
                Some(0) => Some(Plan::ready(Bytes::from_static(reply::OK))),
                _ => error("ERR SELECT is not allowed in cluster mode"),
            },
            Route::Tx(tx) => self.cluster_tx(cluster, tx, cmd, req),
            Route::Blocking if self.pin.is_none() => match self.node_of(cluster, cmd) {
                Ok(node) => Some(Plan::Blocking {
                    req: req(),
                    writes: Vec::new(),
                    node: Some(node),
                }),
                Err(e) => Some(Plan::ready(e)),
            },
            Route::Monitor => error(&format!(
                "ERR '{}' is not yet supported by corral in cluster mode",
                String::from_utf8_lossy(name).to_ascii_lowercase()
            )),
            _ => None,
        }
    }

    /// Cluster mode: the master serving a request's keys, any node for a keyless one, or the
    /// CROSSSLOT error reply.
    fn node_of(
        &self,
        cluster: &crate::upstream::cluster::ClusterUpstream,
        cmd: &Command<'_>,
    ) -> Result<String, Bytes> {
        match crate::cluster::keys::keys_slot(&cmd.keys(), &cmd.args) {
            crate::cluster::KeySlot::One(slot) => Ok(cluster
                .master_of(slot)
                .unwrap_or_else(|| cluster.any_node())
                .to_string()),
            crate::cluster::KeySlot::NoKeys => Ok(cluster.any_node().to_string()),
            crate::cluster::KeySlot::Cross => {
                Err(Bytes::from_static(crate::cluster::keys::CROSSSLOT))
            }
        }
    }

    /// Cluster mode transactions: WATCH pins to its keys' node; MULTI is answered here and
    /// the transaction pinned to the node of its first queued command.
    fn cluster_tx(
        &self,
        cluster: &crate::upstream::cluster::ClusterUpstream,
        tx: Tx,
        cmd: &Command<'_>,
        req: &dyn Fn() -> Bytes,
    ) -> Option<Plan> {
        if self.pin.is_some() {
            return None;
        }
        match tx {
            Tx::Watch => Some(match self.node_of(cluster, cmd) {
                Ok(node) => Plan::Tx {
                    tx,
                    req: req(),
                    node: Some(node),
                },
                Err(e) => Plan::ready(e),
            }),
            Tx::Multi if self.deferred_multi => Some(Plan::ready(Bytes::from_static(
                b"-ERR MULTI calls can not be nested\r\n",
            ))),
            Tx::Multi => Some(Plan::DeferMulti),
            // A transaction with nothing queued: what Redis answers for it.
            Tx::Exec if self.deferred_multi => {
                Some(Plan::EndDeferred(Bytes::from_static(b"*0\r\n")))
            }
            Tx::Discard if self.deferred_multi => {
                Some(Plan::EndDeferred(Bytes::from_static(reply::OK)))
            }
            Tx::Unwatch => Some(Plan::ready(Bytes::from_static(reply::OK))),
            Tx::Exec => Some(Plan::ready(Bytes::from_static(
                b"-ERR EXEC without MULTI\r\n",
            ))),
            Tx::Discard => Some(Plan::ready(Bytes::from_static(
                b"-ERR DISCARD without MULTI\r\n",
            ))),
        }
    }

    /// The upstream connection this client's requests go to now.
    pub(super) fn target(&self) -> UpstreamConn {
        if let Some(pin) = &self.pin {
            return pin.ded.conn.clone();
        }
        if let Some(cluster) = &self.shared.upstream.cluster {
            return cluster.conn_for(&cluster.any_node(), self.session.proto, self.session.id);
        }
        self.shared
            .upstream
            .conn_db(self.session.proto, self.session.db, self.session.id)
    }

    /// Appends encoded request bytes to the batch.
    pub(super) fn append(&mut self, bytes: &[u8]) {
        if self.batch_count == 0 {
            self.batch_conn = Some(self.target());
        }
        self.batch.extend_from_slice(bytes);
        self.batch_count += 1;
    }

    /// Appends a request that is still in the read buffer.
    fn append_range(&mut self, start: usize, end: usize) {
        if self.batch_count == 0 {
            self.batch_conn = Some(self.target());
        }
        self.batch.extend_from_slice(&self.rbuf[start..end]);
        self.batch_count += 1;
    }

    /// Queues a local reply after everything routed before it.
    pub(super) async fn push_ready(&mut self, bytes: Bytes) {
        self.flush_batch().await;
        self.push_reply(PendingReply::Ready(bytes));
    }

    /// Queues a pending reply, silenced if CLIENT REPLY says so. (Un)subscribe confirmations never
    /// are: Redis sends them as pushes, which CLIENT REPLY OFF/SKIP does not silence, in
    /// either protocol (a client waiting for them would hang).
    pub(super) fn push_reply(&mut self, reply: PendingReply) {
        let silent = !matches!(reply, PendingReply::Subscribed { .. })
            && (self.silent_now || self.reply_mode == ReplyMode::Off);
        self.replies.push(Queued { reply, silent });
    }

    /// Hands the pending forwarded requests to the upstream as one job.
    pub(super) async fn flush_batch(&mut self) {
        if self.batch_count == 0 {
            return;
        }
        let bytes = self.batch.split().freeze();
        let count = std::mem::take(&mut self.batch_count);
        let conn = match self.batch_conn.take() {
            Some(c) => c,
            None => self.target(),
        };
        let rx = if self.batch_leads.is_empty() {
            conn.send(bytes, count).await
        } else {
            // The replies go through the upstream connection's task, which shares the leading
            // GETs' replies with their waiters whatever becomes of this client.
            let leads = std::mem::take(&mut self.batch_leads);
            let (tx, rx) = tokio::sync::oneshot::channel();
            let share = move |r: crate::upstream::JobResult| {
                share_leads(leads, &r);
                let _ = tx.send(r);
            };
            conn.send_to(
                bytes,
                count,
                crate::upstream::ReplyTo::Call(Box::new(share)),
            )
            .await;
            rx
        };
        let writes = std::mem::take(&mut self.writes.keys);
        let writes_all = std::mem::take(&mut self.writes.all);
        let lane_barrier = std::mem::take(&mut self.writes.barrier);
        let exec_select = self.exec_select.take();
        // Redirections are followed on shared connections only: inside a transaction a
        // MOVED is part of what the client must see (the transaction is then aborted).
        let cmds = std::mem::take(&mut self.batch_cmds);
        let cluster_cmds =
            (self.shared.upstream.cluster.is_some() && self.pin.is_none()).then_some(cmds);
        let skip_first = std::mem::take(&mut self.skip_first);
        let keys = std::mem::take(&mut self.batch_script_keys);
        let script = std::mem::take(&mut self.batch_script).then(|| {
            self.shared
                .upstream
                .status
                .script_started(keys, conn.is_dedicated())
        });
        self.push_reply(PendingReply::Upstream {
            rx,
            count,
            conn,
            after: AfterAck {
                writes,
                writes_all,
                lane_barrier,
                exec_select,
                cluster_cmds,
                skip_first,
                script,
            },
            blocking: None,
        });
    }

    /// The cache work pending for writes routed so far, to run once they are acknowledged.
    fn take_writes(&mut self) -> AfterAck {
        AfterAck {
            writes: std::mem::take(&mut self.writes.keys),
            writes_all: std::mem::take(&mut self.writes.all),
            ..AfterAck::default()
        }
    }

    /// RESET: besides the session (reset by the local handler), drop any pinned connection
    /// and restore replies.
    fn reset_state(&mut self) -> Vec<tokio::sync::oneshot::Receiver<()>> {
        let waits = self.unsubscribe_all();
        self.session.db = 0;
        self.reply_mode = ReplyMode::On;
        self.pin_reset = true;
        waits
    }

    /// Publishes the session to the client registry.
    pub(super) fn entry_update(&self) {
        self.entry.update(&self.session);
    }

    /// Publishes where the client is blocked (see [`ClientEntry::set_blocked`]).
    pub(super) fn entry_blocked(&self, on: Option<(String, u64)>) {
        self.entry.set_blocked(on);
    }

    /// End-of-round bookkeeping: release a finished pin, publish session changes.
    fn after_round(&mut self) {
        self.release_pin_if_done();
        if self.info_changed || self.session.last_cmd != self.published_cmd {
            self.info_changed = false;
            self.published_cmd = self.session.last_cmd;
            self.session.flags = self.flags(false);
            self.entry.update(&self.session);
        }
    }

    /// Whether a script (`key`: [`commands::busy::script_key`]) runs on a connection of its
    /// own: unless turned off, until it has been seen to finish quickly.
    fn isolates(&self, key: Option<u64>) -> bool {
        self.shared.cfg.upstream.isolate_scripts
            && !key.is_some_and(|k| self.shared.upstream.status.script_book().is_quick(k))
    }

    /// Whether this client's forwarded requests go alone on a dedicated connection because a
    /// CLIENT PAUSE is in effect (not for a pinned client: it has a connection of its own).
    fn paused_alone(&self) -> bool {
        self.pin.is_none()
            && self.shared.upstream.cluster.is_none()
            && self.shared.upstream.status.paused()
    }

    /// CLIENT LIST's flags for this client now, `blocked` or not.
    pub(super) fn flags(&self, blocked: bool) -> &'static str {
        let tracking = self.pin.as_ref().and_then(|p| p.tracking.as_ref());
        commands::session::flags_text(
            self.subs.as_ref().is_some_and(|s| s.active()),
            self.pin.as_ref().is_some_and(|p| p.in_multi),
            blocked,
            tracking.map(|t| t.bcast),
        )
    }
}

/// CLIENT PAUSE ms [WRITE|ALL] (`Some(Some(ms))`) or CLIENT UNPAUSE (`Some(None)`).
fn client_pause(args: &crate::resp::Args<'_>) -> Option<Option<u64>> {
    if !args.get(0)?.eq_ignore_ascii_case(b"CLIENT") {
        return None;
    }
    let sub = args.get(1)?;
    if sub.eq_ignore_ascii_case(b"UNPAUSE") {
        return Some(None);
    }
    if !sub.eq_ignore_ascii_case(b"PAUSE") {
        return None;
    }
    let ms = std::str::from_utf8(args.get(2)?)
        .ok()?
        .parse::<u64>()
        .ok()?;
    Some(Some(ms))
}

/// corral's own admin commands, which Redis puts in `@admin` (CLIENT LIST, KILL, NO-EVICT)
/// or which reveal other clients' keys (CORRAL): refused to Redis ACL users.
fn is_admin(args: &crate::resp::Args<'_>) -> bool {
    let Some(name) = args.get(0) else {
        return false;
    };
    if name.eq_ignore_ascii_case(b"CORRAL") {
        return true;
    }
    args.get(1).is_some_and(|s| {
        [&b"LIST"[..], b"KILL", b"NO-EVICT"]
            .iter()
            .any(|a| s.eq_ignore_ascii_case(a))
    })
}

/// CLIENT UNBLOCK, which goes to Redis with the blocked client's upstream id.
fn is_unblock(args: &crate::resp::Args<'_>) -> bool {
    args.get(1)
        .is_some_and(|s| s.eq_ignore_ascii_case(b"UNBLOCK"))
}

impl Conn {
    /// Writes the pushes waiting in this client's inboxes (CLIENT TRACKING), between
    /// requests.
    async fn write_inbox(&mut self, stream: &mut TcpStream) -> std::io::Result<()> {
        self.take_inbox();
        if self.wbuf.is_empty() {
            return Ok(());
        }
        // A client that stops reading must not pin this task: its inbox is bounded and
        // cancels `kill` when full.
        tokio::select! {
            r = stream.write_all(&self.wbuf) => r?,
            _ = self.kill.cancelled() => {}
        }
        self.wbuf.clear();
        Ok(())
    }
}

/// Redis's reply to an unknown command.
fn unknown_command(args: &crate::resp::Args<'_>) -> Bytes {
    let clip = |a: &[u8]| String::from_utf8_lossy(&a[..a.len().min(128)]).into_owned();
    let mut text = format!(
        "ERR unknown command '{}', with args beginning with: ",
        clip(args.get(0).unwrap_or_default())
    );
    for a in args.iter().skip(1) {
        text.push_str(&format!("'{}' ", clip(a)));
    }
    let mut out = BytesMut::new();
    Encoder {
        proto: crate::resp::Proto::Resp2,
        out: &mut out,
    }
    .error(&text);
    out.freeze()
}

/// The command name as Redis prints it in errors: `config|get` for subcommands.
fn full_command_name(args: &crate::resp::Args<'_>) -> String {
    let name = String::from_utf8_lossy(args.get(0).unwrap_or_default()).to_ascii_lowercase();
    match args.get(1) {
        Some(sub) if commands::session::is_container(name.as_bytes()) => {
            format!(
                "{name}|{}",
                String::from_utf8_lossy(sub).to_ascii_lowercase()
            )
        }
        _ => name,
    }
}

/// Completes the leading GETs of a batch from its replies (frame `i` answers request `i`).
fn share_leads(leads: Vec<(u32, crate::cache::Lead)>, replies: &crate::upstream::JobResult) {
    let frames: Vec<Bytes> = match replies {
        Ok(b) => crate::resp::frames(b)
            .map(|f| b.slice(f.start..f.end()))
            .collect(),
        Err(_) => Vec::new(),
    };
    for (i, lead) in leads {
        let r = match (replies, frames.get(i as usize)) {
            (Ok(_), Some(frame)) => Ok(frame.clone()),
            (Err(e), _) => Err(e.clone()),
            (Ok(_), None) => Err(crate::error::UpstreamError::BadReply {
                cause: "missing reply in batch".into(),
            }),
        };
        lead.complete(r);
    }
}
