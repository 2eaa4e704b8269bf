//! Replies waiting to be written: each request of a round leaves a pending reply, and they
//! are resolved strictly in request order (`collect.rs`).

use bytes::Bytes;
use tokio::sync::oneshot;

use super::writes::WrittenKeys;
use crate::cache::{FillRx, Value};
use crate::cluster::SplitKind;
use crate::resp::Proto;
use crate::upstream::{Dedicated, JobResult, Reply, ScriptRun, UpstreamConn};

/// A reply on a connection that serves this client alone (a blocking command, a script, an
/// out-of-band command): no deadline, since nobody else waits behind it and Redis may
/// legitimately take its time; the wait ends if the client goes away.
pub(super) struct Blocking {
    /// The connection taken for this command alone, released when it returns.
    pub(super) dedicated: Option<Dedicated>,
    /// The client shows as blocked (`flags=b` in CLIENT LIST) meanwhile.
    pub(super) blocked: bool,
    /// SHUTDOWN: when Redis closes the connection (it shut down), close the client's too,
    /// with no reply, as Redis itself would.
    pub(super) closes_client: bool,
}

/// What to do when a forwarded batch is answered, besides passing the replies on.
#[derive(Debug, Default)]
pub(super) struct AfterAck {
    /// Keys the requests write: invalidated again once acknowledged, so a read that raced
    /// the write cannot leave a stale entry behind.
    pub(super) writes: WrittenKeys,
    /// The cache's mark from before the first invalidation of `writes` (0: none taken).
    pub(super) write_mark: u64,
    /// A request may have changed every key (FLUSHALL...): flush the cache.
    pub(super) writes_all: bool,
    /// Wait for the cache's tracking connection to catch up before replying (scripts).
    pub(super) lane_barrier: bool,
    /// The last request is an EXEC that runs these SELECTs (database, position): move the
    /// client to the last one that succeeded.
    pub(super) exec_select: Option<Vec<(u32, usize)>>,
    /// Cluster mode: each request and its slot, to follow redirections.
    pub(super) cluster_cmds: Option<Vec<(Bytes, Option<u16>)>>,
    /// The first reply answers a request the client did not send (a deferred MULTI).
    pub(super) skip_first: bool,
    /// The batch runs scripts or functions: counted as running until it is answered (PING is
    /// forwarded meanwhile, see `UpstreamStatus::ping_goes_upstream`).
    pub(super) script: Option<ScriptRun>,
}

/// A pending reply and whether its replies are dropped (CLIENT REPLY OFF/SKIP).
pub(super) struct Queued {
    pub(super) reply: PendingReply,
    pub(super) silent: bool,
    /// The client's protocol when the request was routed: what a reply encoded by corral is
    /// written in, though a HELLO later in the round switches it before it is written.
    pub(super) proto: Proto,
}

/// A reply, or replies, still to be written, in request order.
pub(super) enum PendingReply {
    /// Produced locally.
    Ready(Bytes),
    /// A cache hit, encoded in the client's protocol when written.
    Value(Value),
    /// An MGET answered wholly from the cache, encoded when written.
    Values(Vec<Option<Value>>),
    /// A coalesced or cache-filling read to wait for.
    Fill { rx: FillRx },
    /// `count` replies from `conn` (boxed, as the other large variants: one per batch, while
    /// every request of a round moves its own pending reply around).
    Upstream(Box<Forwarded>),
    /// `count` replies from `conn` to a batch that needs nothing done once they arrive but
    /// their writing (with the cache replies between them) and its written keys' second
    /// invalidation: large ones are written as they come (see [`Reply`]).
    Streamed(Box<Streamed>),
    /// Cluster mode: the next `count` replies of job `job`, a batch for one node that
    /// gathered the round's requests for it between requests for others (`gather.rs`,
    /// `segments.rs`).
    Segment { job: u32, count: u32 },
    /// Cluster mode: a multi-key request split per slot, merged in key order.
    Split {
        kind: SplitKind,
        parts: Vec<(oneshot::Receiver<JobResult>, Part)>,
        after: Box<AfterAck>,
    },
    /// Cluster mode: the same request to every master, replies combined.
    Fanout {
        how: Fan,
        parts: Vec<(oneshot::Receiver<JobResult>, UpstreamConn, Bytes)>,
        after: Box<AfterAck>,
    },
    /// The one reply of a request sent on its own (rare: boxed).
    Reply(Box<AloneReply>),
    /// (Un)subscribe confirmations, written once the new upstream subscriptions are in place
    /// (rare: boxed).
    Subscribed(Box<Subscribed>),
}

/// An (un)subscribe's confirmations ([`PendingReply::Subscribed`]).
#[derive(Debug)]
pub(super) struct Subscribed {
    pub(super) reply: Bytes,
    /// Redis's confirmations of the upstream subscriptions it starts or ends.
    pub(super) waits: Vec<oneshot::Receiver<()>>,
    /// An unsubscribe: the messages queued for the client before Redis confirmed it are
    /// written before its reply, where Redis put them.
    pub(super) leaving: bool,
}

/// `count` replies from `conn` to a forwarded batch ([`PendingReply::Upstream`]).
pub(super) struct Forwarded {
    pub(super) rx: oneshot::Receiver<JobResult>,
    pub(super) count: u32,
    pub(super) conn: UpstreamConn,
    pub(super) after: AfterAck,
    pub(super) blocking: Option<Blocking>,
    /// Cache replies to requests between the batch's forwarded ones. Empty but for batches
    /// of GETs partly served from the cache.
    pub(super) interleaved: Between,
}

/// A plain batch's replies ([`PendingReply::Streamed`]).
pub(super) struct Streamed {
    pub(super) rx: oneshot::Receiver<Reply>,
    pub(super) count: u32,
    pub(super) conn: UpstreamConn,
    /// Cache replies to requests between the batch's forwarded ones.
    pub(super) interleaved: Between,
    /// Keys the batch writes, invalidated again before any of its replies is written (only
    /// `writes`, `write_mark` and `writes_all` are set).
    pub(super) after: AfterAck,
    /// Cluster mode: each request and its slot, to follow redirections.
    pub(super) redirects: Option<Vec<(Bytes, Option<u16>)>>,
}

impl PendingReply {
    /// A blocking command's reply: it may take as long as Redis keeps the client blocked.
    pub(super) fn blocks(&self) -> bool {
        matches!(self, PendingReply::Upstream(up) if up.blocking.as_ref().is_some_and(|b| b.blocked))
    }

    /// The reply to one request sent on its own over `conn`, arriving at `rx`.
    pub(super) fn one(
        rx: oneshot::Receiver<JobResult>,
        conn: UpstreamConn,
        after: AfterAck,
        blocking: Option<Blocking>,
    ) -> PendingReply {
        PendingReply::Upstream(Box::new(Forwarded {
            rx,
            count: 1,
            conn,
            after,
            blocking,
            interleaved: Between::default(),
        }))
    }
}

/// Cache replies to requests between a batch's forwarded ones (see [`Interleaved`]).
#[derive(Default)]
pub(super) struct Between {
    /// (how many forwarded replies come before it, the reply).
    pub(super) replies: Vec<(u32, Interleaved)>,
    /// The frames of the [`Interleaved::Encoded`] replies, one after the other.
    pub(super) encoded: Bytes,
}

/// A cache reply answering a request that came between two forwarded requests of a batch.
/// It is written between their replies, so the batch still goes to Redis as one job: a hit
/// queued on its own would cut the batch in two, and with hits and misses alternating, a
/// pipeline of GETs would become one upstream job per miss.
pub(super) enum Interleaved {
    /// Cache hits in a row, encoded as they were looked up: the next `len` bytes of
    /// [`Between::encoded`]. The entry is read once, while its lookup has it in the CPU's
    /// cache, and let go of at once.
    Encoded { len: u32 },
    /// A cache hit too large to copy (see `Batch::interleave_hit`).
    Value(Value),
    /// A read shared with another client's, answered in `proto` (see [`Queued::proto`]).
    Fill { rx: FillRx, proto: Proto },
}

/// The one reply of a request sent on its own, then handled as `then` says
/// ([`PendingReply::Reply`]).
pub(super) struct AloneReply {
    pub(super) rx: oneshot::Receiver<JobResult>,
    pub(super) conn: UpstreamConn,
    pub(super) then: Then,
}

/// What is done with the one reply of a request sent on its own ([`PendingReply::Reply`]).
pub(super) enum Then {
    /// INFO: extended with corral's sections when `with_proxy`.
    Info { with_proxy: bool },
    /// Receiver counts corrected for corral's own subscribers.
    Counted(super::pubcount::Count),
    /// The MGET of the keys missing from `parts` (some values came from the cache): one
    /// reply for the `None` parts, in order.
    MGet(Vec<Option<Value>>),
    /// Cluster mode: a SCAN step, walked on over the next masters (`scan_walk.rs`).
    Scan(Box<super::scan_walk::ScanWalk>),
    /// CLIENT TRACKING ON/OFF: on `+OK` the change applies.
    Tracking(super::track_state::Change),
    /// AUTH or HELLO AUTH for a Redis user (`users.rs`): on success the client is served
    /// from the user's pool; `ded` is the connection taken for the check when not pinned.
    Auth {
        auth: super::user_auth::UserAuth,
        ded: Option<Dedicated>,
    },
    /// GETREDIR or TRACKINGINFO of a redirecting client: Redis's reply names the sink's id
    /// `from`, the client knows its target as `to`.
    Redir { from: u64, to: u64 },
    /// SELECT (the first of the replies); on `+OK` the client moves to the database.
    Select(Option<u32>),
    /// A Redis user's (un)subscribe, asked of Redis in MULTI/DISCARD (`user_pubsub.rs`).
    PubSub(Box<super::user_pubsub::UserSub>),
}

/// How replies from every master are combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fan {
    /// The first reply, or the first error (FLUSHALL, SCRIPT LOAD...).
    First,
    /// The sum of integer replies (DBSIZE).
    Sum,
    /// All array elements together (KEYS).
    Concat,
    /// The first non-nil reply (RANDOMKEY).
    FirstNonNil,
    /// INFO: the first reply, its keyspace section every master's (`info::merge_keyspace`),
    /// with corral's own sections if `with_proxy`.
    Info { with_proxy: bool },
}

/// One per-slot part of a split command.
#[derive(Debug)]
pub(super) struct Part {
    pub(super) conn: UpstreamConn,
    pub(super) req: Bytes,
    pub(super) slot: u16,
    /// Argument indices of the part's keys, in request order.
    pub(super) keys: Vec<usize>,
}

/// What a collected reply changes in the client's state besides the bytes it writes:
/// returned by `collect.rs`, carried out by `Conn::apply` (`client.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Effect {
    /// SELECT (or an EXEC that ran SELECTs) moved the client to this database.
    Database(u32),
    /// The client went away or went over its output limit: close at once, writing nothing
    /// more.
    Gone,
}

#[cfg(test)]
mod tests {
    use super::super::plan::Plan;
    use super::{PendingReply, Queued};
    use std::mem::size_of;

    /// Every request of a round moves its plan and its pending reply several times
    /// (route -> handle -> queue -> collect): the large, rare variants are boxed so these stay
    /// small. A new inline variant that grows them fails here rather than in a profile.
    #[test]
    fn per_request_enums_stay_small() {
        assert!(
            size_of::<PendingReply>() <= 64,
            "{}",
            size_of::<PendingReply>()
        );
        assert!(size_of::<Queued>() <= 64, "{}", size_of::<Queued>());
        assert!(size_of::<Plan>() <= 64, "{}", size_of::<Plan>());
    }
}
