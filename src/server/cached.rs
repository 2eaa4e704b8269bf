//! The cache's part in a client connection: GET and MGET lookups, and write invalidation.

use bytes::{Bytes, BytesMut};

use super::connection::Pending;
use super::slot::Slot;
use crate::cache::{Cache, Lookup};
use crate::commands::{self, Access};
use crate::resp::Args;
use crate::resp::request::encode_request;
use crate::upstream::UpstreamConn;

/// Writes seen by a connection, as the cache needs them.
#[derive(Default)]
pub(super) struct Writes {
    /// This round forwarded a write: later GETs in it must not be served from the cache or
    /// coalesced, or they could miss the write.
    pub(super) in_round: bool,
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
pub(super) fn cache_step(
    cache: &Cache,
    conn: &UpstreamConn,
    writes: &mut Writes,
    access: Access,
    args: &Args<'_>,
    may_serve: bool,
) -> Option<Pending> {
    match access {
        Access::Get if args.len() == 2 && may_serve && !writes.in_round => {
            let key = args.get(1)?;
            Some(Pending::Slot(match cache.get(key, conn) {
                Lookup::Hit(v) => Slot::Value(v),
                Lookup::Wait(rx) => Slot::Fill(rx),
            }))
        }
        Access::MGet if args.len() > 1 && may_serve && !writes.in_round => {
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
            let mut req = BytesMut::new();
            if !missing.is_empty() {
                let mut argv: Vec<&[u8]> = Vec::with_capacity(missing.len() + 1);
                argv.push(b"MGET");
                argv.extend(missing);
                encode_request(&argv, &mut req);
            }
            Some(Pending::MGet {
                parts,
                req: req.freeze(),
            })
        }
        Access::Get | Access::MGet | Access::Read => None,
        Access::Write => {
            writes.in_round = true;
            let mut buf = [0u8; 24];
            let name = args
                .get(0)
                .and_then(|n| commands::table::upper(n, &mut buf));
            if matches!(name, Some(b"EVAL" | b"EVALSHA" | b"FCALL")) {
                writes.barrier = true;
            }
            writes.keys.extend(invalidate_writes(cache, args));
            None
        }
        Access::All => {
            writes.in_round = true;
            cache.flush();
            writes.all = true;
            None
        }
    }
}

/// Invalidates the keys a write command names (before it is forwarded) and returns them, to
/// invalidate again once it is acknowledged.
pub(super) fn invalidate_writes(cache: &Cache, args: &Args<'_>) -> Vec<Bytes> {
    let mut buf = [0u8; 24];
    let name = args
        .get(0)
        .and_then(|n| commands::table::upper(n, &mut buf));
    let mut keys = Vec::new();
    commands::keys::write_keys(name.unwrap_or_default(), args, |k| {
        cache.invalidate_for_write(k);
        keys.push(Bytes::copy_from_slice(k));
    });
    keys
}
