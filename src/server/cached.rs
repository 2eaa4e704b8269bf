//! The cache's part in a client connection: GET and MGET lookups, and write invalidation.

use std::collections::HashSet;

use bytes::{Bytes, BytesMut};

use super::connection::Plan;
use super::pending::{PendingReply, Then};
use crate::cache::{Cache, Lookup};
use crate::commands::{self, Access, Command, KeyPositions};
use crate::resp::request::encode_request;
use crate::upstream::UpstreamConn;

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

/// The cache's part in a forwarded command: a GET is looked up (and becomes the returned
/// slot); a write invalidates its keys now, and records them to invalidate again once it is
/// acknowledged.
#[allow(clippy::too_many_arguments)]
pub(super) fn cache_step(
    cache: &Cache,
    conn: &UpstreamConn,
    node: Option<&str>,
    writes: &mut Writes,
    access: Access,
    cmd: &Command<'_>,
    may_serve: bool,
) -> Option<Plan> {
    let args = &cmd.args;
    match access {
        Access::Get if args.len() == 2 && may_serve && !writes.touched(args.get(1)?) => {
            let key = args.get(1)?;
            // Standalone, a leading read rides in the client's own batch.
            Some(match cache.get(key, conn, node, node.is_none()) {
                Lookup::Hit(v) => Plan::Reply(PendingReply::Value(v)),
                Lookup::Wait(rx) => Plan::Reply(PendingReply::Fill {
                    rx,
                    key: Bytes::copy_from_slice(key),
                }),
                Lookup::Lead(lead) => Plan::Lead(lead),
            })
        }
        // In cluster mode the missing keys of an MGET may span slots: it is routed as usual.
        Access::MGet
            if args.len() > 1
                && may_serve
                && node.is_none()
                && !args.iter().skip(1).any(|k| writes.touched(k)) =>
        {
            let parts = cache.get_many(args.iter().skip(1));
            let missing: Vec<&[u8]> = args
                .iter()
                .skip(1)
                .zip(&parts)
                .filter_map(|(k, p)| p.is_none().then_some(k))
                .collect();
            if missing.len() == parts.len() {
                // Nothing cached: forward the MGET as it is.
                return None;
            }
            if missing.is_empty() {
                return Some(Plan::Reply(PendingReply::Values(parts)));
            }
            let mut req = BytesMut::new();
            let mut argv: Vec<&[u8]> = Vec::with_capacity(missing.len() + 1);
            argv.push(b"MGET");
            argv.extend(missing);
            encode_request(&argv, &mut req);
            Some(Plan::Alone {
                conn: None,
                req: req.freeze(),
                then: Then::MGet(parts),
            })
        }
        Access::Get | Access::MGet | Access::Read => None,
        Access::Write => {
            if matches!(cmd.name(), b"EVAL" | b"EVALSHA" | b"FCALL") {
                writes.barrier = true;
                writes.round_all = true;
            }
            let positions = cmd.keys();
            if !positions.is_known() {
                writes.round_all = true;
            }
            let keys = invalidate_keys(cache, cmd, positions);
            writes.round_keys.extend(keys.iter().cloned());
            writes.keys.extend(keys);
            None
        }
        Access::All => {
            writes.round_all = true;
            cache.flush();
            writes.all = true;
            None
        }
    }
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
    fn touched(&self, key: &[u8]) -> bool {
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

/// Invalidates the keys a write command names (before it is forwarded) and returns them, to
/// invalidate again once it is acknowledged. The keys come from the command table of Redis
/// (every key position, read or written), or the first argument for unknown commands.
pub(super) fn invalidate_writes(cache: &Cache, cmd: &Command<'_>) -> Vec<Bytes> {
    invalidate_keys(cache, cmd, cmd.keys())
}

/// [`invalidate_writes`] with the key positions already looked up.
fn invalidate_keys(cache: &Cache, cmd: &Command<'_>, positions: KeyPositions) -> Vec<Bytes> {
    let mut keys = Vec::new();
    let mut add = |k: &[u8]| {
        cache.invalidate_for_write(k);
        keys.push(Bytes::copy_from_slice(k));
    };
    if positions.is_known() {
        positions.keys(&cmd.args).for_each(&mut add);
    } else if let Some(k) = commands::keys::unknown_write_key(cmd.name(), &cmd.args) {
        add(k);
    }
    keys
}
