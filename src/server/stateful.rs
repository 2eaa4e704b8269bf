//! Commands whose state a shared upstream connection cannot carry: transactions (the client is
//! pinned to a dedicated connection from MULTI or WATCH until EXEC, DISCARD or UNWATCH),
//! blocking commands (sent alone on a dedicated connection), scripts (the client is pinned to
//! a dedicated connection for the rest of the round), SCRIPT KILL, FUNCTION KILL and SHUTDOWN
//! (out of band), SELECT (validated by the upstream, then served by that database's shared
//! connections) and MONITOR (a relay); and the local replies that change a client's pinned
//! connection (HELLO, RESET, leaving it).

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::client::Conn;
use super::pending::{AfterAck, AloneReply, Blocking, PendingReply, Then};
use super::pin::QueuedCmd;
use super::plan::Repin;
use crate::commands::Tx;
use crate::error::replies;
use crate::resp::encode::encode_request;
use crate::tls::Stream;

impl Conn {
    /// A local reply that changes the pinned connection; true ends the round.
    pub(super) async fn repin(&mut self, reply: Bytes, change: Repin) -> bool {
        match change {
            Repin::Unpin => {
                self.push_ready(reply).await;
                // Dropped, not released, at the end of the round (see `release_pin_if_done`);
                // later requests start a new round, on corral's own connections.
                self.drop_pin_after_round();
                self.leave_user();
                true
            }
            Repin::Hello => {
                self.hello_pinned(reply).await;
                false
            }
            Repin::Reset => {
                self.flush_batch().await;
                let waits = self.reset_state();
                // RESET turns replies back on, its own included. Like an UNSUBSCRIBE's, its
                // reply waits until Redis dropped the upstream subscriptions it ended.
                // Its subscriptions, and their queue, are gone: nothing to write first.
                self.push_reply(PendingReply::Subscribed(Box::new(
                    super::pending::Subscribed {
                        reply,
                        waits,
                        leaving: false,
                    },
                )));
                true
            }
        }
    }

    /// EXEC after a command refused inside MULTI: DISCARD goes to Redis in its place (its
    /// `+OK` is not the client's), and the client gets Redis's EXECABORT.
    pub(super) async fn abort_exec(&mut self, why: Option<Bytes>) -> bool {
        self.tx_failed = false;
        if self.pin.as_ref().is_some_and(|p| p.in_multi) {
            if self.redis_user()
                && let Some(pin) = &mut self.pin
            {
                // The user may not be allowed DISCARD: its transaction may stay open on
                // Redis, so the connection is closed rather than reused.
                pin.dirty = true;
            }
            self.flush_batch().await;
            self.batch.skip_first = true;
            let mut discard = BytesMut::new();
            encode_request(&[b"DISCARD"], &mut discard);
            self.transaction(Tx::Discard, discard.freeze(), None).await;
        }
        self.deferred_multi = false;
        let reply = match why {
            Some(refusal) => replies::line(&replies::exec_abort_because(&refusal)),
            None => replies::EXECABORT.to_bytes(),
        };
        self.push_ready(reply).await;
        true
    }

    /// HELLO switched the protocol of a client with a pinned connection that must follow
    /// (tracking, a Redis user): the client gets corral's reply, the connection the HELLO.
    async fn hello_pinned(&mut self, reply: Bytes) {
        self.push_ready(reply).await;
        // Redis's reply to this HELLO is not the client's: it got corral's.
        let mut hello = BytesMut::new();
        let version = self.session.proto.as_int().to_string();
        encode_request(&[b"HELLO", version.as_bytes()], &mut hello);
        self.batch.skip_first = true;
        self.append(&hello);
        self.flush_batch().await;
    }

    /// MULTI/EXEC/DISCARD/WATCH/UNWATCH. MULTI and WATCH pin the client first; the others
    /// update the pin's state, and the pin is released after the round once nothing is left.
    pub(super) async fn transaction(&mut self, tx: Tx, req: Bytes, node: Option<String>) -> bool {
        if matches!(tx, Tx::Multi | Tx::Watch) && self.pin.is_none() {
            self.flush_batch().await;
            if let Err(msg) = self.pin_new(node.as_deref()) {
                self.push_ready(replies::line(msg)).await;
                return false;
            }
        }
        let mut ends = false;
        let mut exec_select = None;
        if let Some(pin) = &mut self.pin {
            match tx {
                Tx::Multi => {
                    if !pin.in_multi {
                        pin.queued = 0;
                        pin.queued_selects.clear();
                        pin.script_queued = false;
                    }
                    pin.in_multi = true;
                }
                // WATCH inside MULTI is an error that changes nothing.
                Tx::Watch if !pin.in_multi => pin.watching = true,
                // EXEC and DISCARD end a transaction and forget watched keys; without MULTI
                // they are errors that change nothing.
                Tx::Exec | Tx::Discard if pin.in_multi => {
                    pin.in_multi = false;
                    pin.watching = false;
                    let selects = std::mem::take(&mut pin.queued_selects);
                    if tx == Tx::Exec && !selects.is_empty() {
                        exec_select = Some(selects);
                    }
                    // EXEC runs the queued scripts now: count them as running.
                    self.batch.script |= tx == Tx::Exec && std::mem::take(&mut pin.script_queued);
                    // Discarded, the queued writes never run: a later EXEC must not count them.
                    if tx == Tx::Discard {
                        pin.tx_writes = Default::default();
                    }
                    ends = true;
                }
                Tx::Unwatch if !pin.in_multi => {
                    pin.watching = false;
                    ends = true;
                }
                _ => {}
            }
            if pin.in_multi || pin.watching {
                pin.holds_state(&self.kill);
            } else {
                pin.holds_nothing();
            }
        }
        self.append(&req);
        if ends {
            // The connection is released after this round: what follows goes elsewhere and
            // must not overtake what was sent on it.
            self.exec_select = exec_select;
            self.flush_batch().await;
        }
        ends
    }

    /// A blocking command (or any request while a CLIENT PAUSE lasts): alone on the pinned
    /// connection, or on a dedicated one of its own, so that it never holds up other
    /// clients; `after` is the cache's work once it is answered. Ends the round: nothing
    /// after it may run before it returns.
    pub(super) async fn blocking(
        &mut self,
        req: Bytes,
        after: AfterAck,
        node: Option<String>,
    ) -> bool {
        self.flush_batch().await;
        let dedicated = match &self.pin {
            Some(_) => None,
            None => match self.shared.upstream.dedicated_to(
                self.user_pool(),
                node.as_deref(),
                self.session.proto,
                self.session.db,
            ) {
                Ok(d) => Some(d),
                Err(msg) => {
                    self.push_ready(replies::line(msg)).await;
                    return true;
                }
            },
        };
        let conn = match &dedicated {
            Some(d) => d.conn.clone(),
            None => self.target(),
        };
        let rx = conn.send(req, 1).await;
        let blocking = Blocking {
            dedicated,
            blocked: true,
            closes_client: false,
        };
        self.push_reply(PendingReply::one(rx, conn, after, Some(blocking)));
        self.blocking_unshown = true;
        true
    }

    /// SCRIPT KILL, FUNCTION KILL or SHUTDOWN, not pinned: sent alone on a connection of its
    /// own, so it reaches Redis at once whatever the shared connections are waiting for. Ends
    /// the round: what follows must not overtake it.
    pub(super) async fn out_of_band(&mut self, req: Bytes, shutdown: bool) -> bool {
        self.flush_batch().await;
        let ded =
            self.shared
                .upstream
                .out_of_band(self.user_pool(), self.session.proto, self.session.db);
        let conn = ded.conn.clone();
        let rx = conn.send(req, 1).await;
        let blocking = Blocking {
            dedicated: Some(ded),
            blocked: false,
            closes_client: shutdown,
        };
        self.push_reply(PendingReply::one(
            rx,
            conn,
            AfterAck::default(),
            Some(blocking),
        ));
        true
    }

    /// SELECT: checked by the upstream on a database-0 connection as `SELECT n` followed by
    /// `SELECT 0` (sent together, so nothing else runs on that connection in between); on
    /// success the client's later requests use database `n`'s connections. When pinned, it
    /// goes to the pinned connection, which is then not reused.
    pub(super) async fn select(&mut self, db: Option<u32>, req: Bytes) -> bool {
        self.flush_batch().await;
        let (conn, bytes, count) = match &mut self.pin {
            Some(pin) => {
                pin.dirty = true;
                (pin.ded.conn.clone(), req, 1)
            }
            None => {
                let mut both = BytesMut::from(&req[..]);
                encode_request(&[b"SELECT", b"0"], &mut both);
                // As the client's user: Redis checks its permission for SELECT.
                (self.shared_conn(0), both.freeze(), 2)
            }
        };
        let rx = conn.send(bytes, count).await;
        self.push_reply(PendingReply::Reply(Box::new(AloneReply {
            rx,
            conn,
            then: Then::Select(db),
        })));
        true
    }

    /// Cluster mode: the first command after a deferred MULTI. Pins the client to `node`,
    /// sends the MULTI there followed by the command; the MULTI's `+OK` was already given.
    /// The pin learns what the command will do at EXEC ([`Conn::queued_cmd`]).
    pub(super) async fn start_multi(
        &mut self,
        node: String,
        req: Bytes,
        queued: QueuedCmd,
    ) -> bool {
        self.deferred_multi = false;
        self.flush_batch().await;
        let kill = self.kill.clone();
        match self.pin_new(Some(&node)) {
            Ok(pin) => {
                pin.in_multi = true;
                pin.queue(queued);
                pin.holds_state(&kill);
                let mut multi = BytesMut::new();
                encode_request(&[b"MULTI"], &mut multi);
                self.append(&multi);
                self.batch.skip_first = true;
                self.append(&req);
                false
            }
            Err(msg) => {
                self.push_ready(replies::line(msg)).await;
                false
            }
        }
    }

    /// MONITOR: the client's connection becomes a byte relay to a dedicated upstream
    /// connection that ran MONITOR, until either side closes. The connection is
    /// authenticated as the client's Redis ACL user, if it has one, so Redis checks the
    /// user's permissions: a MONITOR Redis refuses gets Redis's error, and the client goes
    /// on as a client of corral (`Ok(false)`), as it would go on with Redis; so does one
    /// corral could not run (no connection, no reply within `request_timeout_ms`).
    pub(super) async fn relay_monitor(&mut self, client: &mut Stream) -> std::io::Result<bool> {
        let mut upstream = match self
            .shared
            .upstream
            .raw(
                self.user_pool().map(|p| &**p),
                self.session.proto,
                self.session.db,
            )
            .await
        {
            Ok(s) => s,
            Err(e) => {
                let msg = replies::upstream_unavailable_for("MONITOR", &e.to_string());
                super::connection::send(client, &replies::line(&msg)).await?;
                return Ok(false);
            }
        };
        let mut first = BytesMut::new();
        encode_request(&[b"MONITOR"], &mut first);
        super::connection::send(&mut upstream, &first).await?;
        // Its reply, one line: `+OK`, or an error (`-NOPERM` for a user without MONITOR).
        let mut buf = BytesMut::with_capacity(16 * 1024);
        let reply_line = async {
            loop {
                if let Some(at) = buf.windows(2).position(|w| w == b"\r\n") {
                    return Ok(Some(at + 2));
                }
                if upstream.read_buf(&mut buf).await? == 0 {
                    return Ok::<_, std::io::Error>(None);
                }
            }
        };
        let waited = match self.shared.upstream.request_timeout {
            Some(limit) => tokio::select! {
                r = tokio::time::timeout(limit, reply_line) => r.unwrap_or(Ok(None)),
                () = self.kill.cancelled() => return Ok(true),
            },
            None => tokio::select! {
                r = reply_line => r,
                () = self.kill.cancelled() => return Ok(true),
            },
        };
        let Some(line_end) = waited? else {
            let msg = replies::upstream_unavailable_for("MONITOR", "no reply to MONITOR");
            super::connection::send(client, &replies::line(&msg)).await?;
            return Ok(false);
        };
        let reply = buf.split_to(line_end);
        super::connection::send(client, &reply).await?;
        if !reply.starts_with(b"+") {
            return Ok(false);
        }
        // Requests the client sent after MONITOR go to Redis in order.
        if !self.rbuf.is_empty() {
            super::connection::send(&mut upstream, &self.rbuf).await?;
            self.rbuf.clear();
        }
        let status = self.shared.upstream.status.clone();
        let (mut up_rd, mut up_wr) = upstream.split();
        let (mut cl_rd, mut cl_wr) = client.split();
        let to_upstream = tokio::io::copy(&mut cl_rd, &mut up_wr);
        let to_client = async {
            let mut out = BytesMut::new();
            loop {
                filter_monitor(&mut buf, &mut out, &|a, cmd| status.monitor_hides(a, cmd));
                if !out.is_empty() {
                    cl_wr.write_all(&out).await?;
                    cl_wr.flush().await?;
                    out.clear();
                }
                if up_rd.read_buf(&mut buf).await? == 0 {
                    return Ok::<(), std::io::Error>(());
                }
            }
        };
        tokio::select! {
            r = to_upstream => r.map(|_| ()),
            r = to_client => r,
            _ = self.kill.cancelled() => Ok(()),
        }
        .map(|()| true)
    }
}

/// Says whether MONITOR hides a command (its name) run by a client address.
type Hide<'a> = &'a dyn Fn(&str, &[u8]) -> bool;

/// Moves the complete lines of a MONITOR stream from `buf` to `out`, leaving out the lines
/// `hide` claims (corral's own traffic: the cache's tracking lanes, connection handshakes),
/// so what a client sees does not depend on corral's internals or the cache setting. Other
/// replies (`+OK`, errors, the replies to commands the client sent after MONITOR) are single
/// lines too and pass unchanged; an incomplete line stays in `buf`.
fn filter_monitor(buf: &mut BytesMut, out: &mut BytesMut, hide: Hide<'_>) {
    while let Some(nl) = buf.windows(2).position(|w| w == b"\r\n") {
        let line = buf.split_to(nl + 2);
        if !hidden(&line, hide) {
            out.extend_from_slice(&line);
        }
    }
}

/// Whether `line` is a MONITOR line (`+<time> [<db> <addr>] "cmd" ...`) that `hide` claims.
fn hidden(line: &[u8], hide: Hide<'_>) -> bool {
    let Some(rest) = line.strip_prefix(b"+") else {
        return false;
    };
    let Some(open) = rest.iter().position(|&b| b == b'[') else {
        return false;
    };
    // `[db addr]`; an IPv6 address has brackets of its own: `[0 [::1]:6379]`.
    let Some(space) = rest[open..].iter().position(|&b| b == b' ') else {
        return false;
    };
    let addr_start = open + space + 1;
    let close_after = |from: usize| {
        rest.get(from..)
            .and_then(|r| r.iter().position(|&b| b == b']'))
            .map(|p| from + p)
    };
    let end = match rest.get(addr_start) {
        Some(b'[') => close_after(addr_start).and_then(|inner| close_after(inner + 1)),
        _ => close_after(addr_start),
    };
    let Some(end) = end else { return false };
    // The command name: the first quoted argument after `] `.
    let cmd = rest
        .get(end + 1..)
        .and_then(|r| r.strip_prefix(b" \""))
        .and_then(|r| r.iter().position(|&b| b == b'"').map(|q| &r[..q]))
        .unwrap_or_default();
    match std::str::from_utf8(&rest[addr_start..end]) {
        Ok(addr) => hide(addr, cmd),
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monitor_lines_of_internal_connections_are_dropped() {
        let lane = "127.0.0.1:5000";
        let internal = |a: &str, cmd: &[u8]| a == lane || a == "[::1]:7" || cmd == b"HELLO";
        let mut buf = BytesMut::from(
            &b"+OK\r\n+1.5 [0 127.0.0.1:5000] \"PING\"\r\n+1.6 [0 127.0.0.1:5001] \"GET\" \"k\"\r\n\
               +1.7 [0 lua] \"get\" \"k\"\r\n+1.8 [0 [::1]:7] \"PING\"\r\n\
               +1.85 [0 127.0.0.1:5001] \"HELLO\" \"2\"\r\n+1.9 [0 127.0.0"[..],
        );
        let mut out = BytesMut::new();
        filter_monitor(&mut buf, &mut out, &internal);
        assert_eq!(
            &out[..],
            &b"+OK\r\n+1.6 [0 127.0.0.1:5001] \"GET\" \"k\"\r\n+1.7 [0 lua] \"get\" \"k\"\r\n"[..]
        );
        assert_eq!(&buf[..], b"+1.9 [0 127.0.0");
    }
}
