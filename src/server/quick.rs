//! Plain GETs taken to the cache, or to the batch, without being parsed or routed.
//!
//! A GET taken the usual way is parsed, named, guarded and routed before the cache sees it:
//! some 700 instructions, about as many as the cache's own work on a hit. A client whose
//! state leaves the route nothing to decide for a GET (see [`Conn::quick`]) has each
//! complete `GET key` at the head of its buffer taken straight to the cache's step, as the
//! route would take it: a hit, a read joined or led, or the GET forwarded in the batch.
//! With `--no-cache` the GET goes to the batch the same way: Zipf GETs at -P 16 took 1,022
//! instructions per request instead of 1,625 (callgrind), and 3-18% less of corral's CPU.
//!
//! With the cache, a GET its look-ahead found (`Cache::prefetch`, which reads every GET of
//! a round before any is handled) is not read again, nor its key hashed again; and no
//! `Command` is built for it, since only the route needs one. Zipf GETs at -P 16: 2,022
//! instructions per request before, 1,848 after, and about 8% less of corral's user CPU.
//!
//! A hit is written where `handle_now` would write it, by the lookup itself (see
//! `Cache::get_or_write`), and a request batched or written leaves no plan for `dispatch` to
//! carry out: one hot key's hits took 1,273 instructions per request before, 1,101 after;
//! Zipf GETs 1,830 and 1,719, and 961 and 893 with `--no-cache`.

use std::sync::LazyLock;

use super::cached::{Written, get_step_writing, looked_up, unlooked, write_one};
use super::client::Conn;
use super::clients::ReplyMode;
use super::plan::Plan;
use crate::acl::Verdict;
use crate::cache::Entry;
use crate::commands::{Command, LastCmd};
use crate::resp::lookahead::{plain_get, plain_set};
use crate::resp::{Args, RequestParser};

/// A GET as the client's last command, copied whole. Recorded with `LastCmd::set` from a
/// `Command` built on the stack, its name was read back from stores still in flight, across
/// two of them (a failed store forwarding: 12 ns per GET in a profile of the 90/10 mix at
/// -P 16 of a build where the call was not inlined; where it was, `quick_get` went from 5.6
/// to 4.8 ns).
static GET_LAST: LazyLock<LastCmd> = LazyLock::new(|| last_cmd(b"GET"));
/// A SET as the client's last command (see [`GET_LAST`]).
static SET_LAST: LazyLock<LastCmd> = LazyLock::new(|| last_cmd(b"SET"));

/// The command `name` as a client's last command.
fn last_cmd(name: &'static [u8]) -> LastCmd {
    let mut last = LastCmd::default();
    let name_range = 0..name.len();
    last.set(&Command::new(Args::Ranges(
        name,
        std::slice::from_ref(&name_range),
    )));
    last
}

/// Which plain requests may skip the parser and the route (see [`Conn::quick`]).
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Quick {
    /// Plain GETs: taken to the cache, or to the batch.
    pub(super) gets: bool,
    /// Plain SETs too: their key invalidated, and batched.
    pub(super) sets: bool,
}

impl Quick {
    /// None of the quick way until the round passed the read barrier (`synced`): a plain GET
    /// is looked up, and the barrier is passed at the first GET the route sees.
    #[inline]
    pub(super) fn until(self, synced: bool) -> Quick {
        Quick {
            gets: self.gets && synced,
            sets: self.sets && synced,
        }
    }
}

impl Conn {
    /// Whether plain GETs, and plain SETs, may skip the parser and the route: nothing there
    /// would decide other than to take a GET to the cache (or, without one, to the batch),
    /// or a SET to the batch after the cache invalidated its key (in cluster mode, to its
    /// node's batch: `quick_routed.rs`). corral's own connections (no pin, no Redis user,
    /// database 0), authenticated, no transaction, no corral user with restrictions, the
    /// command neither renamed nor refused, every reply sent, not subscribed in RESP2, and
    /// no pause. Asked at the start of a round and after each request of it routed other
    /// than as a plain forward (see `round::dispatch`), since those can change this.
    pub(super) fn quick(&self) -> Quick {
        let passes = |name: &[u8]| {
            self.shared.guard.is_empty()
                || matches!(self.shared.guard.check(name, None), Verdict::Pass)
        };
        let gets = self.pin.is_none()
            && !self.deferred_multi
            && self.session.db == 0
            && self.authenticated()
            && self.reply_mode == ReplyMode::On
            && !self.silent_now
            && !self.redis_user()
            && self.session.acl.as_ref().is_none_or(|u| !u.restricted())
            && !self.resp2_subscribed()
            && !self.shared.upstream.status.paused()
            && passes(b"GET");
        Quick {
            gets,
            sets: gets && passes(b"SET"),
        }
    }

    /// Takes the plain GET or SET at `off` in the read buffer `rbuf` (see
    /// [`Conn::quick_get`] and [`Conn::quick_set`]), as `quick` allows: its length. The plan
    /// left to carry out, if any (nearly always none: batched, or a hit written), goes in
    /// `left`, which must be empty: returned beside the length, the pair (80 bytes) went
    /// through memory, and moving it out of the call on every request was the costliest
    /// instruction of `dispatch` (perf, the 90/10 mix at -P 16).
    pub(super) fn quick_request(
        &mut self,
        rbuf: &[u8],
        off: usize,
        parser: &RequestParser,
        quick: Quick,
        left: &mut Option<Plan>,
    ) -> Option<usize> {
        if let Some(len) = self.quick_get(rbuf, off, parser, left) {
            return Some(len);
        }
        if quick.sets {
            return self.quick_set(rbuf, off, parser, left);
        }
        None
    }

    /// Takes the plain GET at `off` in the read buffer `rbuf` to the cache as the route
    /// would: its length, and in `left` the plan left to carry out, if any. `None`, with
    /// nothing changed but the look-ahead's place (past `off`), when no complete plain GET
    /// starts there, or `parser` would refuse it for its limits (it then does, as Redis
    /// would). A GET the cache's look-ahead found is not read again, nor its key hashed.
    #[inline]
    pub(super) fn quick_get(
        &mut self,
        rbuf: &[u8],
        off: usize,
        parser: &RequestParser,
        left: &mut Option<Plan>,
    ) -> Option<usize> {
        let buf = rbuf.get(off..)?;
        let (key, len, hash) = match self.ahead.plain_at(off) {
            Some((key, hash)) => {
                let key = key.start - off..key.end - off;
                let len = key.end + 2;
                debug_assert_eq!(plain_get(buf), Some((key.clone(), len)));
                (key, len, Some(hash))
            }
            None => {
                let (key, len) = plain_get(buf)?;
                (key, len, None)
            }
        };
        if !parser.within_limits(2, key.len()) {
            return None;
        }
        let frame = buf.get(..len)?;
        // What the route does for every request outside a transaction.
        self.session.last_cmd = *GET_LAST;
        self.tx_failed = false;
        if self.shared.upstream.cluster.is_some() {
            return self
                .quick_routed(frame, key, true, hash, left)
                .then_some(len);
        }
        // What `through_cache` does with a GET, from a client `quick` says it may serve.
        if let Some(cache) = &self.shared.cache {
            let key = frame.get(key)?;
            let hash = hash.unwrap_or_else(|| cache.hash(key));
            let (proto, id) = (self.session.proto, self.session.id);
            let upstream = &self.shared.upstream;
            // The closures go by reference: moved, their captures (stored a moment before) were
            // copied in wider loads than they were stored with, a failed store forwarding on
            // every lookup (19% of `get_step_writing`'s samples in perf, Zipf GETs -P 16).
            let conn = &|| upstream.conn(proto, id);
            // A GET the cache does not look up (most of a cool connection's, or one of a key
            // the round wrote) goes to the batch here, before anything a lookup needs is
            // made ready; one of a key an earlier GET of the round read waits on that read.
            let step = if let Some(step) = unlooked(cache, conn, &mut self.writes, key, hash) {
                step
            } else if let Some(room) = self.write_room() {
                let wbuf = &mut self.wbuf;
                let write = &mut |e: &Entry| {
                    e.reply_len() <= room && {
                        e.encode(proto, wbuf);
                        true
                    }
                };
                get_step_writing(cache, (conn, None), &mut self.writes, key, hash, write)
            } else if self.may_interleave() {
                let batch = &mut self.batch;
                let write = &mut |e: &Entry| {
                    batch.interleave_encoded(e.reply_len(), |out| e.encode(proto, out))
                };
                get_step_writing(cache, (conn, None), &mut self.writes, key, hash, write)
            } else {
                looked_up(cache, conn(), None, &mut self.writes, key, hash)
                    .map_or(Written::Forward, Written::Plan)
            };
            match step {
                Written::Hit => return Some(len),
                Written::Plan(plan) => {
                    if let Some(plan) = self.cache_plan(Some(plan)) {
                        *left = Some(plan);
                        return Some(len);
                    }
                }
                Written::Forward => {}
            }
        }
        self.append(frame);
        Some(len)
    }

    /// Takes the plain SET at `off` in the read buffer `rbuf` to the batch as the route
    /// would, its key invalidated first: its length (no plan is left). `None`, with nothing
    /// changed but the look-ahead's place, when no complete plain SET starts there, or
    /// `parser` would refuse it for its limits. A SET the look-ahead found has its key's
    /// hash from there.
    #[inline]
    pub(super) fn quick_set(
        &mut self,
        rbuf: &[u8],
        off: usize,
        parser: &RequestParser,
        left: &mut Option<Plan>,
    ) -> Option<usize> {
        let buf = rbuf.get(off..)?;
        // A GET of this round waits on a read outside the batch: the route decides whether
        // this SET must wait for it (`Conn::writes_waited`).
        if self.writes.waiting() {
            return None;
        }
        let (key, value_len, len) = plain_set(buf)?;
        // A pause noted since `quick` was asked: the route sends the write alone, so Redis
        // parks no shared connection on it (`Conn::paused_alone`).
        if !parser.within_limits(3, key.len().max(value_len))
            || self.shared.upstream.status.paused()
        {
            return None;
        }
        let frame = buf.get(..len)?;
        self.session.last_cmd = *SET_LAST;
        self.tx_failed = false;
        if self.shared.upstream.cluster.is_some() {
            let hash = self.ahead.set_at(off);
            return self
                .quick_routed(frame, key, false, hash, left)
                .then_some(len);
        }
        if let Some(cache) = &self.shared.cache {
            let key = frame.get(key)?;
            let hash = self.ahead.set_at(off);
            debug_assert!(hash.is_none_or(|h| h == cache.hash(key)));
            write_one(cache, &mut self.writes, key, hash);
        }
        self.append(frame);
        Some(len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quick_request_is_the_last_command_a_parsed_one_would_be() {
        let owned = [b"get".to_vec(), b"key".to_vec()];
        let mut parsed = LastCmd::default();
        parsed.set(&Command::new(Args::Owned(&owned)));
        assert_eq!(*GET_LAST, parsed);
        assert_eq!(GET_LAST.to_vec(), b"get");
        let owned = [b"Set".to_vec(), b"key".to_vec(), b"v".to_vec()];
        parsed.set(&Command::new(Args::Owned(&owned)));
        assert_eq!(*SET_LAST, parsed);
        assert_eq!(SET_LAST.to_vec(), b"set");
    }
}
