//! Client-side caching through corral (CLIENT TRACKING). A client that turns tracking on is
//! pinned to a dedicated upstream connection until it turns it off, so Redis tracks exactly
//! its reads; that connection's invalidation pushes reach the client in wire order with its
//! replies. A REDIRECT names a corral client: corral gives that client an upstream connection
//! of its own to redirect to (a sink), whose invalidations it relays in the target's protocol,
//! and translates ids between the two in replies (GETREDIR, TRACKINGINFO, redirect-broken).

use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};

use super::client::Conn;
use super::pending::{AloneReply, PendingReply, Then};
use super::track_state::{Change, Inbox, OwnPushes, Tracking};
use crate::error::replies;
use crate::resp::Proto;
use crate::resp::digits::parse_int;
use crate::resp::encode::encode_request;
use crate::resp::reply::Encoder;
use crate::upstream::LinkObserver;

impl Conn {
    /// CLIENT TRACKING/CACHING/GETREDIR/TRACKINGINFO outside MULTI.
    pub(super) async fn client_tracking(&mut self, argv: Vec<Bytes>, req: Bytes) -> bool {
        let sub = argv
            .get(1)
            .map(|s| s.to_ascii_uppercase())
            .unwrap_or_default();
        if sub.as_slice() == b"TRACKING" {
            return self.tracking_on_off(argv, req).await;
        }
        // The redirection as of the last CLIENT TRACKING sent (this round's included).
        let redirect = self
            .pin
            .as_ref()
            .and_then(|p| p.tracking.as_ref())
            .and_then(|t| *t.own.redirect.lock().unwrap_or_else(|e| e.into_inner()));
        match (sub.as_slice(), redirect) {
            // Redis answers with the sink's id: the client knows the target by its corral id.
            (b"GETREDIR" | b"TRACKINGINFO", Some((up, mine))) => {
                self.flush_batch().await;
                let conn = self.target();
                let rx = conn.send(req, 1).await;
                self.push_reply(PendingReply::Reply(Box::new(AloneReply {
                    rx,
                    conn,
                    then: Then::Redir { from: up, to: mine },
                })));
            }
            // Without tracking they go to a shared connection, which never tracks: Redis's
            // replies for a client without tracking (CACHING's error included).
            _ => self.append(&req),
        }
        false
    }

    /// CLIENT TRACKING ON/OFF outside MULTI: pins the client while tracking is on.
    async fn tracking_on_off(&mut self, argv: Vec<Bytes>, req: Bytes) -> bool {
        let mode = argv
            .get(2)
            .map(|s| s.to_ascii_uppercase())
            .unwrap_or_default();
        let on = match mode.as_slice() {
            b"ON" => true,
            b"OFF" => false,
            // Redis's syntax error, from a connection whose state it does not change.
            _ => {
                self.append(&req);
                return false;
            }
        };
        if self.shared.upstream.cluster.is_some() {
            self.error_reply(replies::TRACKING_IN_CLUSTER.text().into())
                .await;
            return false;
        }
        let tracking = self.pin.as_ref().is_some_and(|p| p.tracking.is_some());
        if !on && !tracking {
            // Nothing to turn off: Redis's `+OK` from wherever the client's requests go.
            let req = self.redirect_for_off(&argv, req);
            self.append(&req);
            return false;
        }
        let mut argv = argv;
        let (redirect, bcast) = match self.tracking_options(&mut argv).await {
            Ok(o) => o,
            Err(e) => {
                self.error_reply(e).await;
                return false;
            }
        };
        if on && let Err(e) = self.start_tracking() {
            self.error_reply(e.into()).await;
            return false;
        }
        if let Some(t) = self.pin.as_ref().and_then(|p| p.tracking.as_ref()) {
            *t.own.redirect.lock().unwrap_or_else(|e| e.into_inner()) =
                redirect.map(|(mine, up)| (up, mine));
        }
        self.flush_batch().await;
        let mut bytes = BytesMut::new();
        if redirect.is_some() {
            let words: Vec<&[u8]> = argv.iter().map(|a| &a[..]).collect();
            encode_request(&words, &mut bytes);
        } else {
            bytes.extend_from_slice(&req);
        }
        let conn = self.target();
        let rx = conn.send(bytes.freeze(), 1).await;
        self.push_reply(PendingReply::Reply(Box::new(AloneReply {
            rx,
            conn,
            then: Then::Tracking(Change {
                on,
                redirect,
                bcast,
            }),
        })));
        false
    }

    /// CLIENT TRACKING OFF of a client without tracking, as Redis will get it. Redis checks
    /// that a REDIRECT names a connected client even then: a corral id naming one becomes the
    /// id of an upstream connection Redis has (the client's own), any other one an id Redis
    /// cannot have, so that Redis's reply, and which error comes first, are its own.
    fn redirect_for_off(&self, argv: &[Bytes], req: Bytes) -> Bytes {
        let redirects = |j: usize| {
            argv[j].eq_ignore_ascii_case(b"REDIRECT")
                && argv.get(j + 1).and_then(|a| parse_int(a)).is_some()
        };
        if !(3..argv.len()).any(redirects) {
            return req;
        }
        let own = self.target().client_id();
        let mut words: Vec<Bytes> = argv.to_vec();
        for j in (3..argv.len()).filter(|&j| redirects(j)) {
            let named = parse_int(&argv[j + 1])
                .and_then(|n| u64::try_from(n).ok())
                .is_some_and(|id| self.shared.tracking.inboxes.contains_key(&id));
            // `own` is 0 only while the client's connection is not up (its requests fail
            // then anyway); the id is read now, for a request sent in this round.
            let up = if named && own != 0 {
                own.to_string()
            } else {
                i64::MAX.to_string()
            };
            words[j + 1] = Bytes::from(up);
        }
        let mut bytes = BytesMut::new();
        let words: Vec<&[u8]> = words.iter().map(|a| &a[..]).collect();
        encode_request(&words, &mut bytes);
        bytes.freeze()
    }

    /// BCAST and REDIRECT of CLIENT TRACKING ON/OFF: a REDIRECT's corral id becomes, in
    /// `argv`, the upstream id of the sink made for that client (both are returned).
    async fn tracking_options(
        &mut self,
        argv: &mut [Bytes],
    ) -> Result<(Option<(u64, u64)>, bool), String> {
        let mut redirect = None;
        let mut bcast = false;
        let mut j = 3;
        while j < argv.len() {
            if argv[j].eq_ignore_ascii_case(b"BCAST") {
                bcast = true;
            } else if argv[j].eq_ignore_ascii_case(b"REDIRECT")
                && let Some(target) = argv
                    .get(j + 1)
                    .and_then(|a| parse_int(a))
                    .and_then(|n| u64::try_from(n).ok())
            {
                let sink = self
                    .shared
                    .tracking
                    .sink_id(target, &self.shared.upstream)
                    .await;
                match sink {
                    Ok(up) => {
                        argv[j + 1] = Bytes::from(up.to_string());
                        redirect = Some((target, up));
                    }
                    Err(e) => return Err(e),
                }
                j += 1;
            }
            j += 1;
        }
        Ok((redirect, bcast))
    }

    /// Pins the client (if it is not yet) and routes its connection's pushes to it.
    ///
    /// # Errors
    /// Too many tracking clients or dedicated connections.
    pub(super) fn start_tracking(&mut self) -> Result<(), &'static str> {
        if self.pin.as_ref().is_some_and(|p| p.tracking.is_some()) {
            return Ok(());
        }
        let permit = self.shared.upstream.tracking_permit()?;
        if self.pin.is_none() {
            self.pin_new(None)?;
        }
        let own = Arc::new(OwnPushes {
            inbox: Inbox::new(self.attention.clone(), self.kill.clone()),
            redirect: Mutex::new(None),
        });
        if let Some(pin) = &mut self.pin {
            let observer: Arc<dyn LinkObserver> = own.clone();
            pin.ded.pushes.set(Some(observer));
            pin.tracking = Some(Tracking {
                own,
                confirmed: false,
                redirect: None,
                bcast: false,
                _permit: permit,
            });
        }
        self.info_changed();
        Ok(())
    }

    /// Applies Redis's answer to CLIENT TRACKING ON/OFF (`ok`: it said `+OK`).
    pub(super) fn tracking_answered(&mut self, ok: bool, change: Change) {
        if ok && change.on && self.pin.as_ref().is_some_and(|p| p.tracking.is_none()) {
            // An OFF (or a refused ON) sent ahead of this ON in one pipeline was answered
            // after this ON was sent, and ended the tracking this ON found on: Redis tracks
            // for the client now, so its pushes must reach it again.
            if self.start_tracking().is_err() {
                // No room to route them: the client must not keep a cache nothing
                // invalidates. Closing it makes its library drop that cache.
                self.kill.cancel();
                return;
            }
            if let Some(t) = self.pin.as_ref().and_then(|p| p.tracking.as_ref()) {
                *t.own.redirect.lock().unwrap_or_else(|e| e.into_inner()) =
                    change.redirect.map(|(mine, up)| (up, mine));
            }
        }
        let Some(pin) = &mut self.pin else { return };
        match (ok, change.on) {
            (true, true) => {
                if let Some(t) = &mut pin.tracking {
                    t.confirmed = true;
                    t.redirect = change.redirect;
                    t.bcast = change.bcast;
                }
            }
            (true, false) => pin.stop_tracking(),
            (false, _) => {
                if pin.tracking.as_ref().is_some_and(|t| !t.confirmed) {
                    pin.stop_tracking();
                } else if let Some(t) = &pin.tracking {
                    // Refused: the redirection in force is still the confirmed one.
                    *t.own.redirect.lock().unwrap_or_else(|e| e.into_inner()) =
                        t.redirect.map(|(mine, up)| (up, mine));
                }
            }
        }
        self.info_changed();
    }

    /// Tracking inside MULTI: the queued ON may turn tracking on at EXEC, so the client
    /// keeps its connection (and its pushes) from now on.
    pub(super) fn tracking_in_multi(&mut self) -> Option<Bytes> {
        if self.shared.upstream.cluster.is_some() {
            return Some(replies::TRACKING_IN_CLUSTER.to_bytes());
        }
        match self.start_tracking() {
            Ok(()) => {
                if let Some(t) = self.pin.as_mut().and_then(|p| p.tracking.as_mut()) {
                    t.confirmed = true;
                }
                None
            }
            Err(e) => Some(replies::line(e)),
        }
    }

    /// Writes the pushes waiting for this client: its own connection's, as they are, and
    /// invalidations redirected to it, in the form Redis gives them to a client of its
    /// protocol (a RESP2 client gets them only in pub/sub mode).
    pub(super) fn take_inbox(&mut self) {
        if let Some(t) = self.pin.as_ref().and_then(|p| p.tracking.as_ref()) {
            for f in t.own.inbox.take() {
                self.wbuf.extend_from_slice(&f);
            }
        }
        let subscribed = self.subs.as_ref().is_some_and(|s| s.active());
        for f in self.redirected.take() {
            match self.session.proto {
                Proto::Resp3 => self.wbuf.extend_from_slice(&f),
                // Redis sends a RESP2 target a message on `__redis__:invalidate` (with the
                // push's payload as it is) when it is subscribed, and nothing otherwise.
                Proto::Resp2 if subscribed => {
                    if let Some(payload) = f.strip_prefix(b">2\r\n$10\r\ninvalidate\r\n") {
                        self.wbuf.extend_from_slice(
                            b"*3\r\n$7\r\nmessage\r\n$20\r\n__redis__:invalidate\r\n",
                        );
                        self.wbuf.extend_from_slice(payload);
                    }
                }
                Proto::Resp2 => {}
            }
        }
    }

    async fn error_reply(&mut self, text: String) {
        let mut out = BytesMut::new();
        Encoder {
            proto: self.session.proto,
            out: &mut out,
        }
        .error(&text);
        self.push_ready(out.freeze()).await;
    }
}

/// Whether the last reply in `replies` (pushes may come before it) is `+OK`.
pub(super) fn ends_ok(replies: &[u8]) -> bool {
    replies == b"+OK\r\n" || replies.ends_with(b"\n+OK\r\n")
}

/// A GETREDIR or TRACKINGINFO reply with the redirection's upstream id `from` replaced by the
/// corral id `to`.
pub(super) fn rewrite_redirect(replies: &[u8], from: u64, to: u64) -> Bytes {
    let field = format!("redirect\r\n:{from}\r\n");
    let bare = format!(":{from}\r\n");
    let getredir = replies.ends_with(bare.as_bytes())
        && !replies.ends_with(field.as_bytes())
        && (replies.len() == bare.len() || replies[replies.len() - bare.len() - 1] == b'\n');
    if getredir {
        // GETREDIR: the last reply is the id itself.
        let mut out = BytesMut::from(&replies[..replies.len() - bare.len()]);
        out.extend_from_slice(format!(":{to}\r\n").as_bytes());
        return out.freeze();
    }
    // TRACKINGINFO: the `redirect` field (flags, before it, are fixed words).
    match replies
        .windows(field.len())
        .position(|w| w == field.as_bytes())
    {
        Some(at) => {
            let mut out = BytesMut::from(&replies[..at]);
            out.extend_from_slice(format!("redirect\r\n:{to}\r\n").as_bytes());
            out.extend_from_slice(&replies[at + field.len()..]);
            out.freeze()
        }
        None => Bytes::copy_from_slice(replies),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn getredir_reply_names_the_corral_client() {
        assert_eq!(&rewrite_redirect(b":17\r\n", 17, 4)[..], b":4\r\n");
        assert_eq!(
            &rewrite_redirect(
                b">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nk\r\n:17\r\n",
                17,
                4
            )[..],
            b">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nk\r\n:4\r\n"
        );
        assert_eq!(&rewrite_redirect(b":-1\r\n", 17, 4)[..], b":-1\r\n");
    }

    #[test]
    fn trackinginfo_reply_names_the_corral_client() {
        let reply = b"*6\r\n$5\r\nflags\r\n*1\r\n$2\r\non\r\n$8\r\nredirect\r\n:17\r\n\
                      $8\r\nprefixes\r\n*0\r\n";
        let want = b"*6\r\n$5\r\nflags\r\n*1\r\n$2\r\non\r\n$8\r\nredirect\r\n:4\r\n\
                     $8\r\nprefixes\r\n*0\r\n";
        assert_eq!(&rewrite_redirect(reply, 17, 4)[..], &want[..]);
    }

    #[test]
    fn ok_may_follow_pushes() {
        assert!(ends_ok(b"+OK\r\n"));
        assert!(ends_ok(b">2\r\n$10\r\ninvalidate\r\n_\r\n+OK\r\n"));
        assert!(!ends_ok(b"-ERR no\r\n"));
    }
}
