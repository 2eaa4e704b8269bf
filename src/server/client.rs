//! One client's state: its session, where its requests go (a pin, a batch being built), the
//! replies being collected, and what CLIENT LIST shows of it. The connection loop
//! (`connection.rs`) reads and writes; a round (`round.rs`) routes requests (`route.rs`) and
//! collects replies (`collect.rs`).

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::BytesMut;
use tokio_util::sync::CancellationToken;

use super::attention::Attention;
use super::batch::Batch;
use super::clients::{ClientEntry, ReplyMode};
use super::pending::{Effect, Queued};
use super::pin::Pin;
use super::shared::Shared;
use super::subscriber::Subscriptions;
use super::track_state::Inbox;
use super::writes::Writes;
use crate::cache::Ahead;
use crate::commands::{self, Session};
use crate::resp::{Limits, RequestParser};
use crate::upstream::{Dedicated, UpstreamConn, UserLease, UserPool};

/// Bytes read from a client at a time (and the buffers' initial size).
pub(super) const READ_CHUNK: usize = 16 * 1024;
/// Most capacity a client's emptied read or write buffer keeps into its next round.
const KEEP_BUFFER: usize = 1024 * 1024;

/// A client connection's state.
pub(super) struct Conn {
    pub(super) shared: Arc<Shared>,
    pub(super) session: Session,
    entry: Arc<ClientEntry>,
    /// Cancelled by shutdown or CLIENT KILL.
    pub(super) kill: CancellationToken,
    pub(super) parser: RequestParser,
    pub(super) rbuf: BytesMut,
    pub(super) wbuf: BytesMut,
    /// Scratch space for local replies, split off into `PendingReply::Ready`.
    pub(super) local: BytesMut,
    /// Forwarded requests not yet handed to the upstream.
    pub(super) batch: Batch,
    /// Cluster mode: the round's batches for other nodes, and its gathered jobs.
    pub(super) gather: super::gather::Gather,
    /// Cluster mode: the slot map and master connections plain requests are routed by.
    pub(super) routes: Option<crate::upstream::routes::Routes>,
    /// Writes in this round and batch, for the cache.
    pub(super) writes: Writes,
    /// This round's GETs as the cache's look-ahead found them.
    pub(super) ahead: Ahead,
    /// This round's replies, in request order.
    pub(super) replies: Vec<Queued>,
    /// Close the connection after this round's replies are written (QUIT, protocol error).
    pub(super) closing: bool,
    /// Close the connection at once, writing nothing more (client gone, output limit).
    gone: bool,
    /// A dedicated connection this client is pinned to (MULTI/WATCH).
    pub(super) pin: Option<Pin>,
    /// The pool of the Redis ACL user the client authenticated as (`users.rs`): every
    /// upstream connection it uses is that user's.
    pub(super) lease: Option<UserLease>,
    pub(super) reply_mode: ReplyMode,
    /// Replies to the request being routed are dropped (CLIENT REPLY OFF/SKIP).
    pub(super) silent_now: bool,
    /// After this round, the connection becomes a MONITOR relay.
    pub(super) monitor: bool,
    /// RESET was processed: drop the pinned connection after this round.
    pin_reset: bool,
    /// The session changed in a way CLIENT LIST shows.
    info_changed: bool,
    /// The last command CLIENT LIST shows for this client (published at the end of a round).
    published_cmd: commands::session::LastCmd,
    /// The round sent a blocking command: its session (`cmd=blpop`...) is published once the
    /// client shows blocked, as on Redis, where both change when the command runs (see
    /// `Conn::wait_blocking`).
    pub(super) blocking_unshown: bool,
    /// Pub/sub subscriptions, once the client subscribed to something.
    pub(super) subs: Option<Subscriptions>,
    /// An EXEC being sent runs these queued SELECTs (database, position).
    pub(super) exec_select: Option<Vec<(u32, usize)>>,
    /// Cluster mode: MULTI was answered, no command queued yet.
    pub(super) deferred_multi: bool,
    /// corral refused a command inside MULTI: EXEC fails with EXECABORT (`permit.rs`).
    pub(super) tx_failed: bool,
    /// Requests were read from the client while waiting for a reply on a dedicated
    /// connection: parse them before waiting for more input.
    pub(super) read_ahead: bool,
    /// Raised when pushes wait in an inbox (CLIENT TRACKING) or the client is killed.
    pub(super) attention: Arc<Attention>,
    /// Invalidations redirected to this client (CLIENT TRACKING ... REDIRECT its id).
    pub(super) redirected: Arc<Inbox>,
}

impl Conn {
    /// A new client `id` at `addr`, connected to corral's `laddr`, registered with the
    /// client list and the tracking registry.
    pub(super) fn new(
        id: u64,
        addr: SocketAddr,
        laddr: SocketAddr,
        shared: Arc<Shared>,
        kill: CancellationToken,
    ) -> Conn {
        let l = &shared.cfg.limits;
        let limits = Limits {
            max_bulk_len: l.proto_max_bulk_len,
            max_multibulk_len: l.max_multibulk_len,
            max_inline_len: l.max_inline_len,
        };
        let authenticated = !shared.auth.requirepass.is_set();
        let session = Session::new(id, addr, laddr, authenticated);
        let attention = Arc::new(Attention::default());
        let entry = shared
            .clients
            .add(&session, kill.clone(), attention.clone());
        let redirected = Inbox::new(attention.clone(), kill.clone());
        shared.tracking.register(id, redirected.clone());
        Conn {
            session,
            entry,
            kill,
            parser: RequestParser::new(limits),
            rbuf: BytesMut::with_capacity(READ_CHUNK),
            wbuf: BytesMut::with_capacity(READ_CHUNK),
            local: BytesMut::new(),
            batch: Batch::default(),
            gather: super::gather::Gather::default(),
            routes: None,
            writes: Writes::new(
                shared
                    .cache
                    .as_ref()
                    .map_or_else(Default::default, |c| c.hasher()),
            ),
            ahead: Ahead::default(),
            replies: Vec::new(),
            closing: false,
            gone: false,
            pin: None,
            lease: None,
            reply_mode: ReplyMode::On,
            silent_now: false,
            monitor: false,
            pin_reset: false,
            info_changed: false,
            published_cmd: commands::session::LastCmd::default(),
            blocking_unshown: false,
            subs: None,
            exec_select: None,
            deferred_multi: false,
            tx_failed: false,
            read_ahead: false,
            attention,
            redirected,
            shared,
        }
    }

    /// Whether the client may run commands: it authenticated, or `default` needs no password
    /// now. As in Redis, a client that connected while a password was set is let in once a
    /// `CONFIG SET requirepass ""` (or a reload) clears it, and must authenticate again if one
    /// is set before it did. The password is read only for a client that did not authenticate.
    pub(super) fn authenticated(&self) -> bool {
        self.session.authenticated || !self.shared.auth.requirepass.is_set()
    }

    /// The upstream connection this client's requests go to now.
    pub(super) fn target(&self) -> UpstreamConn {
        if let Some(pin) = &self.pin {
            return pin.ded.conn.clone();
        }
        if let Some(cluster) = &self.shared.upstream.cluster {
            return cluster.conn_for(&cluster.any_node(), self.session.proto, self.session.id);
        }
        self.shared_conn(self.session.db)
    }

    /// The shared connection this client uses in database `db`: its Redis user's, or
    /// corral's own.
    pub(super) fn shared_conn(&self, db: u32) -> UpstreamConn {
        let user = self.user_pool().map(|p| &**p);
        self.shared
            .upstream
            .conn_db(user, self.session.proto, db, self.session.id)
    }

    /// The pool of the Redis ACL user the client is authenticated as, if any: every
    /// connection taken for the client comes from it.
    pub(super) fn user_pool(&self) -> Option<&Arc<UserPool>> {
        self.lease.as_ref().map(UserLease::pool)
    }

    /// RESET: besides the session (reset by the local handler), drop any pinned connection
    /// and restore replies.
    pub(super) fn reset_state(&mut self) -> Vec<tokio::sync::oneshot::Receiver<()>> {
        let waits = self.unsubscribe_all();
        self.session.db = 0;
        self.reply_mode = ReplyMode::On;
        self.pin_reset = true;
        // RESET makes the client `default` again: its user's pool is left after this round.
        self.lease = None;
        waits
    }

    /// Pins the client to a new dedicated connection (to `node` in cluster mode) in its
    /// protocol and database, and returns the pin for the caller to mark (MULTI, a user...).
    ///
    /// # Errors
    /// Every dedicated connection is in use: corral's refusal text.
    pub(super) fn pin_new(&mut self, node: Option<&str>) -> Result<&mut Pin, &'static str> {
        let ded = self.shared.upstream.dedicated_to(
            self.user_pool(),
            node,
            self.session.proto,
            self.session.db,
        )?;
        Ok(self.pin_to(ded))
    }

    /// Pins the client to `ded`, a dedicated connection taken for it earlier.
    pub(super) fn pin_to(&mut self, ded: Dedicated) -> &mut Pin {
        self.pin.insert(Pin::new(ded))
    }

    /// Carries out what a collected reply changes (see [`Effect`]).
    pub(super) fn apply(&mut self, effect: Effect) {
        match effect {
            Effect::Database(db) => {
                self.session.db = db;
                self.info_changed = true;
            }
            Effect::Gone => self.gone = true,
        }
    }

    /// Whether the connection must close at once, writing nothing more.
    pub(super) fn is_gone(&self) -> bool {
        self.gone
    }

    /// The session changed in a way CLIENT LIST shows: publish it after this round.
    pub(super) fn info_changed(&mut self) {
        self.info_changed = true;
    }

    /// Drop (not release) the pinned connection at the end of this round: its state on Redis
    /// (a transaction, a user) must not reach another client.
    pub(super) fn drop_pin_after_round(&mut self) {
        self.pin_reset = true;
    }

    /// Shows the client as blocked on `on` (the upstream address and Redis's id of the
    /// connection, for CLIENT UNBLOCK) in CLIENT LIST, or as not blocked any more.
    pub(super) fn show_blocked(&mut self, on: Option<UpstreamConn>) {
        let blocked = on.is_some();
        if blocked {
            self.session.flags = self.flags(true);
            self.entry.update(&self.session);
            self.published_cmd = self.session.last_cmd;
            self.info_changed = false;
        }
        self.entry.set_blocked(on);
        if !blocked {
            self.session.flags = self.flags(false);
            self.info_changed = true;
        }
    }

    /// End-of-round bookkeeping: release a finished pin, publish session changes.
    pub(super) fn after_round(&mut self) {
        self.release_pin_if_done();
        self.publish_session();
        // A large reply or pipeline grew these: not kept for the client's lifetime, as Redis
        // shrinks an idle client's buffers.
        if self.wbuf.is_empty() && self.wbuf.capacity() > KEEP_BUFFER {
            self.wbuf = BytesMut::with_capacity(READ_CHUNK);
        }
        if self.rbuf.is_empty() && self.rbuf.capacity() > KEEP_BUFFER {
            self.rbuf = BytesMut::with_capacity(READ_CHUNK);
        }
    }

    /// Shows session changes (the last command, flags) to CLIENT LIST and CLIENT INFO. Done
    /// once the round's requests are routed, before their replies are written, as Redis
    /// updates a client before it replies: a client that got its reply and asks another
    /// connection's CLIENT LIST sees the command it sent last.
    pub(super) fn publish_session(&mut self) {
        if self.blocking_unshown {
            return;
        }
        if self.info_changed || self.session.last_cmd != self.published_cmd {
            self.info_changed = false;
            self.published_cmd = self.session.last_cmd;
            self.session.flags = self.flags(false);
            self.entry.update(&self.session);
        }
    }

    /// Releases (or drops) a dedicated connection once no transaction or tracking is left on
    /// it; it goes back to the idle connections of the user it is authenticated as.
    fn release_pin_if_done(&mut self) {
        // A connection that died, or never came up (the client got the error for its MULTI
        // or WATCH), holds no transaction or watch any more: Redis forgot them with it.
        let dead = self
            .pin
            .as_ref()
            .is_some_and(|p| p.tracking.is_none() && p.ded.conn.is_dead());
        let done = self.pin_reset
            || dead
            || self
                .pin
                .as_ref()
                .is_some_and(|p| !p.in_multi && !p.watching && p.tracking.is_none());
        if !done {
            return;
        }
        let reset = std::mem::take(&mut self.pin_reset);
        if let Some(mut pin) = self.pin.take() {
            // RESET turns tracking off: Redis forgets it when the connection closes.
            pin.stop_tracking();
            self.info_changed = true;
            // After RESET the connection may still be in MULTI or watching, or authenticated
            // as a user it was not taken for (`dirty`): close it.
            pin.holds_nothing();
            if !pin.dirty && !reset && !dead {
                self.shared.upstream.release(pin.ded);
            }
        }
    }

    /// Whether a script (`key`: [`commands::busy::script_key`]) runs on a connection of its
    /// own: unless turned off, until it has been seen to finish quickly.
    pub(super) fn isolates(&self, key: Option<u64>) -> bool {
        self.shared.cfg.upstream.isolate_scripts
            && !key.is_some_and(|k| self.shared.upstream.status.script_book().is_quick(k))
    }

    /// Whether this client's forwarded requests go alone on a dedicated connection because a
    /// CLIENT PAUSE is in effect (not for a pinned client: it has a connection of its own).
    pub(super) fn paused_alone(&self) -> bool {
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
