//! A client pinned to a dedicated upstream connection (transaction, tracking, a script),
//! and what corral knows of that connection's state.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use super::track_state::Tracking;
use super::writes::{TxWrites, WrittenKeys};
use crate::upstream::{Dedicated, LinkObserver};

/// A client pinned to a dedicated connection.
#[derive(Debug)]
pub(super) struct Pin {
    pub(super) ded: Dedicated,
    /// Between MULTI and EXEC/DISCARD (as far as corral can tell from the requests).
    pub(super) in_multi: bool,
    /// WATCH was sent outside MULTI and not yet cleared.
    pub(super) watching: bool,
    /// Something changed the connection's state beyond a transaction (an AUTH as a Redis
    /// user ran on it, say): do not reuse it.
    pub(super) dirty: bool,
    /// Keys written by commands queued in MULTI, invalidated again after EXEC.
    pub(super) tx_writes: TxWrites,
    /// Commands queued since MULTI.
    pub(super) queued: usize,
    /// SELECTs queued in MULTI: (database, position in the transaction). At EXEC the client
    /// moves to the last one that succeeded.
    pub(super) queued_selects: Vec<(u32, usize)>,
    /// A script or function is queued in MULTI: EXEC runs it.
    pub(super) script_queued: bool,
    /// CLIENT TRACKING is on (or on its way): the pin stays until it is turned off.
    pub(super) tracking: Option<Tracking>,
    /// Set while losing the connection must end the client, whose kill this is (see
    /// [`Pin::holds_state`]).
    ends_client: Option<CancellationToken>,
}

/// Ends the client when its dedicated connection is lost while it holds a transaction or a
/// WATCH. Redis forgot them with the connection; a client left open would go on as if they
/// held, and its next writes would run outside the transaction, unguarded by the WATCH.
/// Closing it is what Redis does when the client's own connection is killed.
#[derive(Debug)]
struct EndsClient(CancellationToken);

impl LinkObserver for EndsClient {
    fn up(&self, _tracking: bool) {}

    fn down(&self, _cause: &str) {
        self.0.cancel();
    }

    fn push(&self, _frame: &[u8]) {}
}

impl Pin {
    /// A pin with no transaction state yet: released after the round unless MULTI, WATCH or
    /// CLIENT TRACKING comes.
    pub(super) fn new(ded: Dedicated) -> Pin {
        Pin {
            ded,
            in_multi: false,
            watching: false,
            dirty: false,
            tx_writes: TxWrites::default(),
            queued: 0,
            queued_selects: Vec::new(),
            script_queued: false,
            tracking: None,
            ends_client: None,
        }
    }
}

/// What a command queued in a MULTI tells its pin ([`Pin::queue`]).
#[derive(Default)]
pub(super) struct QueuedCmd {
    /// The keys it writes when EXEC runs it, for the cache.
    pub(super) writes: WrittenKeys,
    /// It may change every key (FLUSHALL, SWAPDB...).
    pub(super) changes_all: bool,
    /// It is a script or function.
    pub(super) script: bool,
    /// It changes the connection's state: the connection is not reused after.
    pub(super) dirty: bool,
}

impl Pin {
    /// A command was queued in the transaction: what EXEC will run, for the cache and for
    /// what is known of the connection afterwards.
    pub(super) fn queue(&mut self, mut q: QueuedCmd) {
        self.script_queued |= q.script;
        self.dirty |= q.dirty;
        self.tx_writes.add(&mut q.writes);
        if q.changes_all {
            self.tx_writes.change_all();
        }
        self.queued += 1;
    }

    /// The connection now holds a transaction or a WATCH: losing it must end the client (see
    /// [`EndsClient`]). A tracking client's observer does that already.
    pub(super) fn holds_state(&mut self, kill: &CancellationToken) {
        if self.ends_client.is_none() {
            self.ends_client = Some(kill.clone());
            self.watch_loss();
        }
    }

    /// Has the connection's loss end the client, unless tracking's observer does already.
    fn watch_loss(&self) {
        if let (None, Some(kill)) = (&self.tracking, &self.ends_client) {
            let observer: Arc<dyn LinkObserver> = Arc::new(EndsClient(kill.clone()));
            self.ded.pushes.set(Some(observer));
        }
    }

    /// The connection no longer holds a transaction or a WATCH: it may be lost quietly (and
    /// go back to the idle connections), unless tracking (turned on since, inside the
    /// transaction say) put its own observer there.
    pub(super) fn holds_nothing(&mut self) {
        if self.ends_client.take().is_some() && self.tracking.is_none() {
            self.ded.pushes.set(None);
        }
    }

    /// Stops routing pushes to the client (tracking off, or the pin is dropped).
    pub(super) fn stop_tracking(&mut self) {
        if self.tracking.take().is_some() {
            self.ded.pushes.set(None);
            // Redis no longer tracks for it, but the connection is not reused all the same.
            self.dirty = true;
            // A transaction or WATCH it still holds.
            self.watch_loss();
        }
    }
}
