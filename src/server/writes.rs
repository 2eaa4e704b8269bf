//! What a connection has written, as the cache needs to know it: keys written earlier in the
//! round (a later GET of one must not be served locally), keys to invalidate again once a
//! batch is acknowledged, and the writes queued in a MULTI.

use std::collections::HashSet;

use bytes::Bytes;

/// Most keys collected from the writes queued in one MULTI; past this, EXEC flushes the
/// whole cache once acknowledged instead (memory per client stays bounded).
pub(super) const MAX_TX_WRITE_KEYS: usize = 10_000;
/// A round's written-key set keeps at most this much capacity into the next round.
const KEEP_ROUND_CAPACITY: usize = 1024;

/// Writes seen by a connection, as the cache needs them.
#[derive(Default)]
pub(super) struct Writes {
    /// Keys written earlier in this round: a later GET of one of them must not be served
    /// from the cache or coalesced, or it could miss the write. A set, so a pipeline of one
    /// huge DEL and many GETs costs one lookup per GET, not a scan of the DEL's keys.
    pub(super) round_keys: HashSet<Bytes, foldhash::fast::RandomState>,
    /// This round forwarded a write whose keys are not known (a script, an unknown command)
    /// or that changes every key: no later GET in it may be served locally.
    pub(super) round_all: bool,
    /// Keys written by the current batch, invalidated again once it is acknowledged.
    pub(super) keys: Vec<Bytes>,
    /// The current batch holds a command that may change every key.
    pub(super) all: bool,
    /// The current batch runs a script or function, which may write keys it did not declare:
    /// once it is acknowledged, wait for the tracking connection to deliver what Redis sent.
    pub(super) barrier: bool,
}

impl Writes {
    /// A new round: nothing written in it yet.
    pub(super) fn new_round(&mut self) {
        if self.round_keys.capacity() > KEEP_ROUND_CAPACITY {
            // Do not carry (and clear, every round) the table of one huge write.
            self.round_keys = HashSet::default();
        } else if !self.round_keys.is_empty() {
            self.round_keys.clear();
        }
        self.round_all = false;
    }

    /// Whether a write earlier in this round may have changed `key`.
    pub(super) fn touched(&self, key: &[u8]) -> bool {
        self.round_all || (!self.round_keys.is_empty() && self.round_keys.contains(key))
    }

    /// An EXEC is being sent: the writes it runs count as written in this round and are
    /// invalidated again once it is acknowledged.
    pub(super) fn exec(&mut self, tx: &mut TxWrites) {
        if std::mem::take(&mut tx.all) {
            self.round_all = true;
            self.all = true;
        } else {
            self.round_keys.extend(tx.keys.iter().cloned());
            self.keys.append(&mut tx.keys);
        }
        tx.keys = Vec::new();
    }
}

/// Keys written by the commands queued in a MULTI, bounded by [`MAX_TX_WRITE_KEYS`].
#[derive(Debug, Default)]
pub(super) struct TxWrites {
    keys: Vec<Bytes>,
    /// Too many keys to track: EXEC invalidates everything.
    all: bool,
}

impl TxWrites {
    /// Adds the keys of one queued write.
    pub(super) fn add(&mut self, keys: &mut Vec<Bytes>) {
        if self.all {
            return;
        }
        if self.keys.len() + keys.len() > MAX_TX_WRITE_KEYS {
            self.all = true;
            self.keys = Vec::new();
            return;
        }
        self.keys.append(keys);
    }
}
