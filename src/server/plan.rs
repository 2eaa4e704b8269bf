//! What a routed request still needs once routing decided where it goes: the value
//! `route.rs` returns and `round.rs` carries out.

use bytes::Bytes;

use super::clients::ReplyMode;
use super::pending::{Fan, Part, PendingReply, Then};
use super::pin::QueuedCmd;
use super::writes::WrittenKeys;
use crate::commands::Tx;
use crate::upstream::UpstreamConn;

/// What a routed request still needs after the synchronous part.
pub(super) enum Plan {
    /// Appended to the batch: nothing more to do.
    Batched,
    /// A reply (local, a cache hit, a read to wait for...) queued after the batch so far.
    Reply(PendingReply),
    /// A GET that others may join: forwarded in the batch, its reply shared when it arrives.
    Lead(crate::cache::Lead),
    /// A request sent on its own after the batch so far. The large, rarer variants are
    /// boxed: a plan is moved for every request, and the common ones (batched, a hit) are
    /// small.
    Alone(Box<AloneReq>),
    /// EXEC after corral refused a command inside MULTI, or EXEC refused itself (the
    /// refusal): the transaction is discarded on Redis and the client gets EXECABORT, as
    /// Redis does.
    AbortExec(Option<Bytes>),
    /// A transaction command (the request bytes), which may pin or unpin the client.
    Tx {
        tx: Tx,
        req: Bytes,
        /// Cluster mode: the node to pin to.
        node: Option<String>,
    },
    /// A command that may block.
    Blocking(Box<BlockingReq>),
    /// Cluster mode: MULTI answered locally until the first queued command says which node
    /// the transaction runs on (`open`), or EXEC/DISCARD of such a MULTI with nothing queued
    /// (`!open`); `reply` is corral's answer.
    Deferred { open: bool, reply: Bytes },
    /// Cluster mode: the first command queued after a deferred MULTI, for `node`.
    StartMulti(Box<StartMulti>),
    /// SELECT: `db` if the argument is a valid index.
    Select { db: Option<u32>, req: Bytes },
    /// CONFIG SET requirepass (the request, the new password): sent alone, followed by
    /// corral once Redis accepts it (`password.rs`).
    Requirepass(Box<(Bytes, String)>),
    /// SCRIPT KILL, FUNCTION KILL, SHUTDOWN: sent alone on a connection of its own.
    OutOfBand { req: Bytes, shutdown: bool },
    /// MONITOR: relay once this round's replies are written.
    Monitor,
    /// CLIENT REPLY changed the reply mode; `reply` is its own reply (maybe empty).
    ReplyMode { mode: ReplyMode, reply: Bytes },
    /// A local reply (RESET, AUTH, HELLO) that changes what the client's pinned connection
    /// must be: `change` says how.
    Repin { reply: Bytes, change: Repin },
    /// AUTH or HELLO AUTH as a Redis user, checked by Redis (`users.rs`).
    AuthUser(Box<AuthReq>),
    /// (P|S)(UN)SUBSCRIBE of a Redis user's client, asked of Redis first (`user_pubsub.rs`).
    UserPubSub(Box<super::user_pubsub::UserSub>),
    /// CLIENT TRACKING/CACHING/GETREDIR/TRACKINGINFO (arguments, request bytes).
    Tracking { argv: Vec<Bytes>, req: Bytes },
    /// Cluster mode: a request for one node.
    Node(Box<NodeReq>),
    /// Cluster mode: a multi-key request split per slot.
    Split {
        kind: crate::cluster::SplitKind,
        parts: Vec<Part>,
    },
    /// Cluster mode: the same request to every master.
    Fanout {
        how: Fan,
        parts: Vec<(UpstreamConn, Bytes)>,
    },
}

/// A request sent on its own after the batch so far, on `conn` (the client's usual
/// connection if `None`); its one reply is handled as `then` says ([`Plan::Alone`]).
pub(super) struct AloneReq {
    pub(super) conn: Option<UpstreamConn>,
    pub(super) req: Bytes,
    pub(super) then: Then,
}

/// Cluster mode: the first command after a deferred MULTI ([`Plan::StartMulti`]).
pub(super) struct StartMulti {
    pub(super) node: String,
    pub(super) req: Bytes,
    /// What it tells the pin ([`Conn::queued_cmd`]).
    ///
    /// [`Conn::queued_cmd`]: super::client::Conn::queued_cmd
    pub(super) queued: QueuedCmd,
}

/// A command that may block, with the keys it may write ([`Plan::Blocking`]).
pub(super) struct BlockingReq {
    pub(super) req: Bytes,
    pub(super) writes: WrittenKeys,
    /// It may change every key (FLUSHALL... while a CLIENT PAUSE lasts): every key is held
    /// in `writes` until it is answered, and the cache flushed again then.
    pub(super) writes_all: bool,
    /// A script or function (while a CLIENT PAUSE lasts), which may write keys it does not
    /// name: once answered, the tracking connection catches up before the reply is written.
    pub(super) lane_barrier: bool,
    /// Cluster mode: the node serving the keys.
    pub(super) node: Option<String>,
}

/// Cluster mode: a request for one node (`slot`: its keys' slot, to retry after a
/// redirection) ([`Plan::Node`]).
pub(super) struct NodeReq {
    pub(super) conn: UpstreamConn,
    pub(super) req: Bytes,
    pub(super) slot: Option<u16>,
    /// A GET whose read others may join: it leads that read in the batch.
    pub(super) lead: Option<crate::cache::Lead>,
}

/// AUTH or HELLO AUTH as a Redis user ([`Plan::AuthUser`]).
pub(super) struct AuthReq {
    pub(super) auth: super::user_auth::UserAuth,
    pub(super) req: Bytes,
}

/// How a local reply changes the client's pinned connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Repin {
    /// RESET: pinning and reply mode are reset too.
    Reset,
    /// A successful AUTH back to `default` (or to one of corral's users) of a client
    /// authenticated as a user: the client leaves its Redis user's pool, and any pinned
    /// connection is dropped after this round.
    Unpin,
    /// HELLO switched the protocol of a client whose pinned connection it keeps (tracking):
    /// that connection switches too.
    Hello,
}

impl Plan {
    /// A reply produced on the spot.
    pub(super) fn ready(bytes: Bytes) -> Plan {
        Plan::Reply(PendingReply::Ready(bytes))
    }
}
