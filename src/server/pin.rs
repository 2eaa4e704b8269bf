//! A client pinned to a dedicated upstream connection (transaction, tracking, a script),
//! and what corral knows of that connection's state.

use super::track_state::Tracking;
use super::writes::TxWrites;
use crate::upstream::Dedicated;

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
        }
    }
}

impl Pin {
    /// Stops routing pushes to the client (tracking off, or the pin is dropped).
    pub(super) fn stop_tracking(&mut self) {
        if self.tracking.take().is_some() {
            self.ded.pushes.set(None);
            // Redis no longer tracks for it, but the connection is not reused all the same.
            self.dirty = true;
        }
    }
}
