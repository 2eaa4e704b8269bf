//! GETs answered from the cache's front before they are parsed.
//!
//! A hit taken the usual way is parsed, named, guarded, routed and looked up: some 1,900
//! instructions a request on hits of 30,000 keys, more than forwarding it costs. A client
//! whose state leaves nothing for those steps to decide (see [`Conn::quick_gets`]) has each
//! plain `GET key` at the head of its buffer looked for in the thread's front first; one
//! found there is answered as the usual path would answer it, and any other goes that path.

use std::sync::LazyLock;

use super::client::Conn;
use super::clients::ReplyMode;
use super::pending::PendingReply;
use super::plan::Plan;
use crate::acl::Verdict;
use crate::commands::Name;
use crate::resp::Args;
use crate::resp::lookahead::plain_get;

/// GET's name as CLIENT LIST shows a client's last command.
static GET: LazyLock<Name> =
    LazyLock::new(|| Name::of(&Args::Ranges(b"GET", std::slice::from_ref(&(0..3)))));

impl Conn {
    /// Whether a GET may be answered before it is parsed: the route would serve it from the
    /// cache with nothing else to decide. Standalone, corral's own connections (no pin, no
    /// Redis user, database 0), authenticated, no transaction, no corral user with
    /// restrictions, GET neither renamed nor refused, every reply sent, not subscribed in
    /// RESP2, no pause, and the last round's hits were a fair share of its GETs
    /// ([`crate::cache::Clock::quick`]: else most GETs would be looked for in vain).
    /// Asked at the start of a round and after each request of it routed other than as a
    /// plain forward (see `round::dispatch`), since those can change this.
    pub(super) fn quick_gets(&self) -> bool {
        self.shared.cache.is_some()
            && self.writes.clock.quick()
            && self.pin.is_none()
            && !self.deferred_multi
            && self.session.db == 0
            && self.session.authenticated
            && self.reply_mode == ReplyMode::On
            && !self.silent_now
            && self.shared.upstream.cluster.is_none()
            && !self.redis_user()
            && self.session.acl.as_ref().is_none_or(|u| !u.restricted())
            && !self.resp2_subscribed()
            && !self.shared.upstream.status.paused()
            && (self.shared.guard.is_empty()
                || matches!(self.shared.guard.check(b"GET", None), Verdict::Pass))
    }

    /// Answers the plain GET at the start of `buf` from the cache's front, if it is there
    /// and no write to its key earlier in the round waits for its acknowledgement. Returns
    /// the request's length and the hit's plan. `None` leaves everything as it was.
    pub(super) fn quick_get(&mut self, buf: &[u8]) -> Option<(usize, Plan)> {
        let (key, len) = plain_get(buf)?;
        let cache = self.shared.cache.as_ref()?;
        if self.writes.touched(key) {
            return None;
        }
        let v = cache.quick_hit(key, &mut self.writes.clock)?;
        // What the route does for every request outside a transaction.
        self.session.last_cmd.set_name(*GET);
        self.tx_failed = false;
        Some((len, Plan::Reply(PendingReply::Value(v))))
    }
}
