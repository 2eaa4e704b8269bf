//! The cache's part in a client connection: GET and MGET lookups, and write invalidation.

use bytes::BytesMut;

use super::client::Conn;
use super::noted::Note;
use super::pending::{PendingReply, Then};
use super::plan::{AloneReq, Plan};
use super::writes::{Writes, WrittenKeys};
use crate::cache::{Cache, Entry, Lookup};
use crate::commands::{self, Access, Command, KeyPositions};
use crate::resp::encode::encode_request;
use crate::upstream::UpstreamConn;

impl Conn {
    /// The read barrier at the start of a round (`[cache] read_barrier`): passed now if the
    /// round's look ahead (`Cache::prefetch`, which only loads memory) found a GET, as nearly
    /// every round with GETs does. Returns whether the round may look keys up; if not, it
    /// passes the barrier at its first GET or MGET ([`Conn::barrier_now`]) and takes no
    /// request the quick way before.
    pub(super) async fn barrier_at_start(&mut self) -> bool {
        let Some(cache) = &self.shared.cache else {
            return true;
        };
        if !cache.read_barrier() {
            return true;
        }
        if !self.cache_may_serve() {
            return false;
        }
        let get_ahead = !self.ahead.is_empty();
        if get_ahead {
            cache.pass_barrier(&mut self.writes.clock).await;
        }
        get_ahead
    }

    /// The read barrier before a GET or MGET the round's start did not see: the requests
    /// batched before it go first, rather than wait with it. Returns whether it was passed:
    /// not for a client the cache does not serve, whose GETs look nothing up.
    pub(super) async fn barrier_now(&mut self) -> bool {
        if !self.cache_may_serve() {
            return false;
        }
        self.flush_batch().await;
        if let Some(cache) = &self.shared.cache {
            cache.pass_barrier(&mut self.writes.clock).await;
        }
        true
    }

    /// Whether the cache may answer this client's GETs at all: what `through_cache` asks
    /// (the cluster's step asks more). A client it may not answer needs no read barrier.
    pub(super) fn cache_may_serve(&self) -> bool {
        self.pin.is_none() && self.session.db == 0 && !self.redis_user()
    }

    /// What the cache's step made of a request standalone: a plan to carry out, or `None`
    /// when the request goes in the batch (a leading read goes with it, noted here).
    #[inline]
    pub(super) fn cache_plan(&mut self, step: Option<Plan>) -> Option<Plan> {
        match step {
            Some(Plan::Lead(lead)) => {
                self.batch.lead_next(lead);
                None
            }
            step => step,
        }
    }
}

/// The cache's part in a forwarded command: a GET is looked up (and becomes the returned
/// slot); a write invalidates its keys now, and records them to invalidate again once it is
/// acknowledged.
pub(super) fn cache_step(
    cache: &Cache,
    conn: &UpstreamConn,
    node: Option<&crate::cluster::Addr>,
    writes: &mut Writes,
    access: Access,
    cmd: &Command<'_>,
    may_serve: bool,
) -> Option<Plan> {
    let args = &cmd.args;
    match access {
        Access::Get if args.len() == 2 && may_serve => {
            let key = args.get(1)?;
            let hash = cache.hash(key);
            match unlooked(cache, || conn, writes, key, hash) {
                Some(Written::Plan(plan)) => Some(plan),
                Some(_) => None,
                None => looked_up(cache, conn, node, writes, key, hash),
            }
        }
        // In cluster mode the missing keys of an MGET may span slots: it is routed as usual.
        Access::MGet
            if args.len() > 1
                && may_serve
                && node.is_none()
                && !writes.clock.uncached()
                && !args.iter().skip(1).any(|k| writes.touched_key(k)) =>
        {
            let parts = cache.get_many(args.iter().skip(1));
            let missing: Vec<&[u8]> = args
                .iter()
                .skip(1)
                .zip(&parts)
                .filter_map(|(k, p)| p.is_none().then_some(k))
                .collect();
            if missing.is_empty() {
                return Some(Plan::Reply(PendingReply::Values(parts)));
            }
            // The keys read from Redis, as a GET forwarded (`Writes::read_forwarded`).
            for k in &missing {
                writes.read_forwarded(cache.hash(k));
            }
            if missing.len() == parts.len() {
                // Nothing cached: forward the MGET as it is.
                return None;
            }
            let mut req = BytesMut::new();
            let mut argv: Vec<&[u8]> = Vec::with_capacity(missing.len() + 1);
            argv.push(b"MGET");
            argv.extend(missing);
            encode_request(&argv, &mut req);
            Some(Plan::Alone(Box::new(AloneReq {
                conn: None,
                req: req.freeze(),
                then: Then::MGet(parts),
            })))
        }
        // Forwarded, it runs at Redis after the round: a later GET of a key it reads must
        // not be served a value older than the one it sees (`Writes::read_forwarded`).
        Access::Get | Access::MGet | Access::Read => {
            let positions = cmd.keys();
            if positions.is_known() && !reads_undeclared(cmd.name()) {
                positions
                    .keys(args)
                    .for_each(|k| writes.read_forwarded(cache.hash(k)));
            } else {
                // Any key may be among those it reads: no later GET in the round is served
                // locally.
                writes.round_all = true;
            }
            None
        }
        Access::Write | Access::All => {
            write_step(cache, writes, access, cmd);
            None
        }
    }
}

/// The cache's part in a write being forwarded (`access` [`Access::Write`] or
/// [`Access::All`]; nothing for others): its keys invalidated now, held, and recorded to
/// invalidate again once it is acknowledged; or for a write that may change every key,
/// every key held and the cache flushed.
pub(super) fn write_step(cache: &Cache, writes: &mut Writes, access: Access, cmd: &Command<'_>) {
    match access {
        Access::Write => {
            if writes_undeclared(cmd.name()) {
                writes.barrier = true;
                writes.round_all = true;
            }
            let positions = cmd.keys();
            if !positions.is_known() {
                writes.round_all = true;
            }
            writes.mark.get_or_insert_with(|| cache.write_mark());
            each_write_key(cmd, positions, |k| {
                writes.write_coming(cache, k, cache.hash(k))
            });
        }
        Access::All => {
            writes.round_all = true;
            cache.write_coming_all(&mut writes.keys.unacked);
            writes.all = true;
        }
        _ => {}
    }
}

/// What a GET of `key`, whose [`Cache::hash`] is `hash`, is given with no lookup, if anything
/// (`None`: look it up). Forwarded: after a write of its key earlier in the round or a GET of
/// it forwarded, or when the connection is cool and the key cold ([`Cache::skips`], which
/// counts it so; noted as a GET forwarded). Or the read an earlier GET of its key in the
/// round waits on: joined, or led in the batch (forwarded behind it if that lead is no
/// longer the key's); see `noted.rs`. `conn` is asked for only to join a lead. Asked once
/// per GET, before [`looked_up`] or [`get_step_writing`].
#[inline]
pub(super) fn unlooked<'c>(
    cache: &Cache,
    conn: impl FnOnce() -> &'c UpstreamConn,
    writes: &mut Writes,
    key: &[u8],
    hash: u64,
) -> Option<Written> {
    if writes.clock.uncached() {
        return Some(Written::Forward);
    }
    // Most GETs a cool connection skips are of keys the round has no note of, and one with a
    // note but a joined read's is forwarded behind that note anyway: skipped first, with no
    // look at the notes, unless a GET of the round waits on a read outside the batch.
    let waiting = writes.waiting();
    if !waiting && cache.skips(hash, &mut writes.clock) {
        writes.read_forwarded(hash);
        return Some(Written::Forward);
    }
    let Some(note) = writes.earlier(hash) else {
        if waiting && cache.skips(hash, &mut writes.clock) {
            writes.read_forwarded(hash);
            return Some(Written::Forward);
        }
        return None;
    };
    let rx = match note {
        Note::Forward => None,
        Note::Joined(rx) => {
            cache.count_join(key, hash, &mut writes.clock);
            Some(rx)
        }
        Note::Led(id) => cache.rejoin(key, hash, id, conn(), &mut writes.clock),
    };
    Some(match rx {
        Some(rx) => Written::Plan(Plan::Reply(PendingReply::Fill { rx })),
        None => {
            writes.read_forwarded(hash);
            Written::Forward
        }
    })
}

/// The cache's part in a GET of `key`, whose [`Cache::hash`] is `hash`, from a client the
/// cache may serve, once [`unlooked`] left it to a lookup: a hit, a read to join or to
/// lead, or `None` to forward it.
pub(super) fn looked_up(
    cache: &Cache,
    conn: &UpstreamConn,
    node: Option<&crate::cluster::Addr>,
    writes: &mut Writes,
    key: &[u8],
    hash: u64,
) -> Option<Plan> {
    // A leading read rides in the client's own batch (in cluster mode, its node's).
    let lookup = cache.get(key, hash, conn, node, &mut writes.clock);
    lookup_plan(lookup, writes, hash)
}

/// What [`get_step_writing`] made of a GET.
pub(super) enum Written {
    /// Forward it in the batch.
    Forward,
    /// A hit whose reply is written: nothing more to do.
    Hit,
    /// A plan to carry out.
    Plan(Plan),
}

/// [`looked_up`] of a standalone GET whose hit `write` writes at once (see
/// `Cache::get_or_write`).
#[inline]
pub(super) fn get_step_writing<'c>(
    cache: &Cache,
    route: (
        impl FnOnce() -> &'c UpstreamConn,
        Option<&crate::cluster::Addr>,
    ),
    writes: &mut Writes,
    key: &[u8],
    hash: u64,
    write: impl FnMut(&Entry) -> bool,
) -> Written {
    match cache.get_or_write(key, hash, route, &mut writes.clock, write) {
        None => Written::Hit,
        Some(lookup) => lookup_plan(lookup, writes, hash).map_or(Written::Forward, Written::Plan),
    }
}

/// The plan for a GET the cache looked up (its key's hash `hash`): `None` to forward it. A
/// GET that waits on a read outside the batch is noted in `writes` (see `Writes::waits_on`),
/// and so are one that leads a read (`Writes::leads`) and one forwarded
/// (`Writes::read_forwarded`).
fn lookup_plan(lookup: Lookup, writes: &mut Writes, hash: u64) -> Option<Plan> {
    Some(match lookup {
        Lookup::Hit(v) => Plan::Reply(PendingReply::Value(v)),
        Lookup::Forward => {
            writes.read_forwarded(hash);
            return None;
        }
        Lookup::Wait(rx) => {
            writes.waits_on(hash, &rx);
            Plan::Reply(PendingReply::Fill { rx })
        }
        Lookup::Lead(lead) => {
            writes.leads(hash, lead.id());
            Plan::Lead(lead)
        }
    })
}

/// Whether a read command (upper-cased `name`) may read keys it does not name: a read-only
/// script, which Redis lets read undeclared keys outside cluster mode.
fn reads_undeclared(name: &[u8]) -> bool {
    matches!(name, b"EVAL_RO" | b"EVALSHA_RO" | b"FCALL_RO")
}

/// Whether a write command (upper-cased `name`) may write keys it does not name: a script
/// or function, whose reply then waits for the tracking connection to catch up.
pub(super) fn writes_undeclared(name: &[u8]) -> bool {
    matches!(name, b"EVAL" | b"EVALSHA" | b"FCALL")
}

/// The cache's part in a write of the one key `key` (a plain SET), as [`cache_step`] takes
/// any write: the key invalidated now and held, and recorded to invalidate again once
/// acknowledged. `hash` is the key's [`Cache::hash`], if the look-ahead had it.
pub(super) fn write_one(cache: &Cache, writes: &mut Writes, key: &[u8], hash: Option<u64>) {
    writes.mark.get_or_insert_with(|| cache.write_mark());
    let hash = hash.unwrap_or_else(|| cache.hash(key));
    writes.write_coming(cache, key, hash);
}

/// Invalidates the keys a write command names (before it is forwarded) and returns them,
/// held, to invalidate again once it is acknowledged. The keys come from the command table
/// of Redis (every key position, read or written), or the first argument for unknown
/// commands.
pub(super) fn invalidate_writes(cache: &Cache, cmd: &Command<'_>) -> WrittenKeys {
    let mut keys = WrittenKeys::default();
    each_write_key(cmd, cmd.keys(), |k| {
        cache.write_coming(k, &mut keys.unacked);
        keys.push(k);
    });
    keys
}

/// The keys a write command names, found as [`invalidate_writes`] finds them, but neither
/// invalidated nor held: a write queued in a MULTI runs only at EXEC, which does both
/// (`Writes::exec`). Held from queueing, a transaction left open would keep its keys (and
/// the others of their slots) out of the cache for as long as its client idled.
pub(super) fn queued_write_keys(cmd: &Command<'_>) -> WrittenKeys {
    let mut keys = WrittenKeys::default();
    each_write_key(cmd, cmd.keys(), |k| keys.push(k));
    keys
}

/// Hands each key the write names to `add`, with the key positions already looked up.
fn each_write_key(cmd: &Command<'_>, positions: KeyPositions, mut add: impl FnMut(&[u8])) {
    if positions.is_known() {
        positions.keys(&cmd.args).for_each(&mut add);
    } else if let Some(k) = commands::keys::unknown_write_key(cmd.name(), &cmd.args) {
        add(k);
    }
}
