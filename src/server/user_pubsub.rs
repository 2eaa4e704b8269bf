//! Pub/sub for a client authenticated as a Redis ACL user (`users.rs`). Its subscriptions
//! are made upstream on the user's own hub (connections authenticated as the user, shared by
//! its clients), never on corral's. Redis decides whether the user may run each
//! (P|S)(UN)SUBSCRIBE first: corral asks it as `MULTI`, the command, `DISCARD` on a RESP2
//! connection of the user's own, where Redis checks the command and its channels at queue
//! time without running it (`+QUEUED`, or its own `-NOPERM` error, which the client gets as it
//! is). Only then does corral apply the command to the client's subscriptions, as for any
//! client. The connection is private to the check because a user may lack MULTI or DISCARD:
//! the command would then run for real, or the transaction stay open; such a connection is
//! closed, never reused (in RESP2 every outcome gives at least the three replies awaited).

use std::any::Any;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::time::timeout;

use super::client::Conn;
use super::pending::{AloneReply, PendingReply, Then};
use crate::commands::PubSub;
use crate::error::replies;
use crate::pubsub::Router;
use crate::resp::Proto;
use crate::resp::encode::encode_request;
use crate::upstream::Dedicated;

/// A user's (P|S)(UN)SUBSCRIBE waiting for Redis's verdict.
#[derive(Debug)]
pub(super) struct UserSub {
    pub(super) sub: PubSub,
    pub(super) args: Vec<Vec<u8>>,
    /// The connection the check runs on.
    pub(super) ded: Option<Dedicated>,
}

impl Conn {
    /// The hub this client subscribes on now: its Redis user's, or corral's.
    pub(super) fn hub(&self) -> Arc<Router> {
        let Some(pool) = self.user_pool() else {
            return self.shared.pubsub.clone();
        };
        let any = pool.hub(|settings, status, token| {
            let hub: Arc<dyn Any + Send + Sync> = Router::start(settings, status, token, None);
            hub
        });
        // Only `Router`s are ever put there (above); corral's hub is a safe fallback.
        any.downcast::<Router>()
            .unwrap_or_else(|_| self.shared.pubsub.clone())
    }

    /// Every hub whose upstream subscriptions Redis counts in PUBLISH and PUBSUB NUMSUB:
    /// corral's and each Redis user's.
    pub(super) fn all_hubs(&self) -> Vec<Arc<Router>> {
        let users = self.shared.upstream.users.hubs();
        let mut hubs = Vec::with_capacity(users.len() + 1);
        hubs.push(self.shared.pubsub.clone());
        hubs.extend(
            users
                .into_iter()
                .filter_map(|h| h.downcast::<Router>().ok()),
        );
        hubs
    }

    /// Asks Redis, as the client's user, whether it may run this (un)subscribe (see the
    /// module docs); the answer is applied by [`Conn::user_pubsub_answered`].
    pub(super) async fn user_pubsub(&mut self, mut s: UserSub) {
        self.flush_batch().await;
        let ded = match self
            .shared
            .upstream
            .dedicated_to(self.user_pool(), None, Proto::Resp2, 0)
        {
            Ok(d) => d,
            Err(msg) => {
                self.push_ready(replies::line(msg)).await;
                return;
            }
        };
        let mut probe = BytesMut::new();
        encode_request(&[b"MULTI"], &mut probe);
        let argv: Vec<&[u8]> = s.args.iter().map(Vec::as_slice).collect();
        encode_request(&argv, &mut probe);
        encode_request(&[b"DISCARD"], &mut probe);
        let conn = ded.conn.clone();
        let rx = conn.send(probe.freeze(), 3).await;
        s.ded = Some(ded);
        self.push_reply(PendingReply::Reply(Box::new(AloneReply {
            rx,
            conn,
            then: Then::PubSub(Box::new(s)),
        })));
    }

    /// Redis's verdict on a user's (un)subscribe (`replies`: MULTI's, the command's, and
    /// DISCARD's): queued, the command is applied to the client's subscriptions and its
    /// confirmations written once the upstream ones are in place; refused, Redis's error is
    /// written.
    pub(super) async fn user_pubsub_answered(&mut self, answer: Bytes, mut s: UserSub) {
        let mut frames = crate::resp::frames(&answer).map(|f| f.bytes);
        let (multi, verdict, discard) = (frames.next(), frames.next(), frames.next());
        if let Some(ded) = s.ded.take()
            && multi == Some(&b"+OK\r\n"[..])
            && discard == Some(&b"+OK\r\n"[..])
        {
            // No transaction left open, nothing run: as clean as it was taken.
            self.shared.upstream.release(ded);
        }
        if multi != Some(&b"+OK\r\n"[..]) {
            // The command may have run outside a transaction: its reply says nothing.
            let text = replies::USER_PUBSUB_UNCHECKED.text();
            self.wbuf.extend_from_slice(&replies::line(text));
            return;
        }
        match verdict {
            Some(b"+QUEUED\r\n") => {
                let args = crate::resp::Args::Owned(&s.args);
                let (reply, waits) = self.pubsub(s.sub, &args);
                let all = async {
                    for w in waits {
                        let _ = w.await;
                    }
                };
                match self.shared.upstream.request_timeout {
                    Some(d) => drop(timeout(d, all).await),
                    None => all.await,
                }
                self.wbuf.extend_from_slice(&reply);
            }
            Some(refused) => self.wbuf.extend_from_slice(refused),
            None => self.wbuf.extend_from_slice(&answer),
        }
    }
}
