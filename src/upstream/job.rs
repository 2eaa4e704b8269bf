//! What a client hands a connection task (a [`Job`]), where the replies go ([`ReplyTo`]), and
//! who else hears about the connection ([`LinkObserver`]).

use bytes::{Bytes, BytesMut};
use tokio::sync::{mpsc, oneshot};

use crate::error::UpstreamError;

/// Replies to a job: the raw bytes of all its replies, or why there are none.
pub type JobResult = Result<Bytes, UpstreamError>;

/// A streamed job's replies ([`ReplyTo::Streamed`]): all of them, or why there are none;
/// or, once those complete add up to [`STREAM_PART`] bytes before the last has arrived,
/// the first of them and a receiver of the rest, in parts of whole replies, the last part
/// (or the error that ends them) closing it.
#[derive(Debug)]
pub enum Reply {
    /// Every reply at once, or the error.
    Whole(JobResult),
    /// The first part, and the rest to come.
    Parts(Bytes, mpsc::UnboundedReceiver<JobResult>),
}

/// How many bytes of whole replies a streamed job gathers before they are handed over
/// while more are still to come: enough that a pipeline of short replies goes over in one
/// piece, and that a pipeline of large values (a 1 MiB GET each) reaches its client while
/// Redis is still sending, rather than after it has sent them all.
pub const STREAM_PART: usize = 256 * 1024;

/// Run on the connection task with each part of a streamed job's replies (or all of them,
/// or the error that ends them) and how many replies it holds, before it is handed over,
/// whatever becomes of the waiter: a batch's leading GETs are shared with the reads that
/// joined them so.
pub type PartHook = Box<dyn FnMut(&JobResult, u32) + Send>;

/// Where a job's replies go.
pub enum ReplyTo {
    /// To a waiting task.
    Channel(oneshot::Sender<JobResult>),
    /// To a waiting task, whole or in parts (see [`Reply`]), each part through the hook
    /// first.
    Streamed(oneshot::Sender<Reply>, Option<PartHook>),
    /// To a function run on the connection task itself, in wire order with push frames; it
    /// must be quick and must not block.
    Call(Box<dyn FnOnce(JobResult) + Send>),
}

impl std::fmt::Debug for ReplyTo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ReplyTo::Channel(_) => "Channel",
            ReplyTo::Streamed(..) => "Streamed",
            ReplyTo::Call(_) => "Call",
        })
    }
}

impl ReplyTo {
    /// Hands over `r`: no reply (a job of none, or an error).
    pub(super) fn send(self, r: JobResult) {
        self.send_replies(r, 0);
    }

    /// Hands over `r`, which holds `replies` replies (all the job's).
    pub(super) fn send_replies(self, r: JobResult, replies: u32) {
        match self {
            // A closed receiver means the client went away; its replies are dropped.
            ReplyTo::Channel(tx) => drop(tx.send(r)),
            ReplyTo::Streamed(tx, hook) => {
                if let Some(mut hook) = hook {
                    hook(&r, replies);
                }
                drop(tx.send(Reply::Whole(r)));
            }
            ReplyTo::Call(f) => f(r),
        }
    }

    /// Hands over the first part of a streamed job's replies (`replies` of them) while more
    /// are to come, and returns where the rest go; a job whose replies do not go to a
    /// [`ReplyTo::Streamed`] waiter ([`ReplyTo::streams`]) gets `part` back, to send whole.
    pub(super) fn start_parts(&mut self, part: Bytes, replies: u32) -> Result<Rest, Bytes> {
        // What replaces the taken sender is never called.
        match std::mem::replace(self, ReplyTo::Call(Box::new(drop))) {
            ReplyTo::Streamed(tx, mut hook) => {
                if let Some(hook) = &mut hook {
                    hook(&Ok(part.clone()), replies);
                }
                let (rest, rx) = mpsc::unbounded_channel();
                // A closed receiver means the client went away; the rest is dropped as it
                // comes.
                drop(tx.send(Reply::Parts(part, rx)));
                Ok(Rest { tx: rest, hook })
            }
            other => {
                *self = other;
                Err(part)
            }
        }
    }

    /// Whether the replies may go over in parts ([`ReplyTo::Streamed`]).
    pub(super) fn streams(&self) -> bool {
        matches!(self, ReplyTo::Streamed(..))
    }

    /// Nobody waits for the reply any more.
    pub(super) fn is_closed(&self) -> bool {
        match self {
            ReplyTo::Channel(tx) => tx.is_closed(),
            // A hook must run: the job goes out whoever waits for it.
            ReplyTo::Streamed(tx, hook) => hook.is_none() && tx.is_closed(),
            ReplyTo::Call(_) => false,
        }
    }
}

/// Where the rest of a streamed job's replies go once its first part was handed over.
pub(super) struct Rest {
    tx: mpsc::UnboundedSender<JobResult>,
    hook: Option<PartHook>,
}

impl Rest {
    /// Hands over `r`: another part, the last one (`replies` replies), or the error that
    /// ends them.
    pub(super) fn send(&mut self, r: JobResult, replies: u32) {
        if let Some(hook) = &mut self.hook {
            hook(&r, replies);
        }
        // A closed receiver means the client went away.
        drop(self.tx.send(r));
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
    /// The connection was ended on purpose ([`super::UpstreamConn::renew`]) and a new one
    /// follows: by default, as [`LinkObserver::down`].
    fn renewed(&self) {
        self.down("renewed");
    }
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
