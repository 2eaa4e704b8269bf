//! What a client hands a connection task (a [`Job`]), where the replies go ([`ReplyTo`]), and
//! who else hears about the connection ([`LinkObserver`]).

use bytes::{Bytes, BytesMut};
use tokio::sync::oneshot;

use crate::error::UpstreamError;

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
    pub(super) fn send(self, r: JobResult) {
        match self {
            // A closed receiver means the client went away; its replies are dropped.
            ReplyTo::Channel(tx) => drop(tx.send(r)),
            ReplyTo::Call(f) => f(r),
        }
    }

    /// Nobody waits for the reply any more.
    pub(super) fn is_closed(&self) -> bool {
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
