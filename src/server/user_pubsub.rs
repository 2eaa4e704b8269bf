//! Pub/sub for a client authenticated as a Redis ACL user (`users.rs`). Its subscriptions
//! are made upstream on the user's own hub (connections authenticated as the user, shared by
//! its clients), never on corral's. Redis decides whether the user may run each
//! (P|S)(UN)SUBSCRIBE first: corral asks it as `MULTI`, the command, `DISCARD` on the user's
//! shared connection, where Redis checks the command and its channels at queue time without
//! running it (`+QUEUED`, or its own `-NOPERM` error, which the client gets as it is). Only
//! then does corral apply the command to the client's subscriptions, as for any client.

use std::any::Any;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::time::timeout;

use super::client::Conn;
use super::pending::{AloneReply, PendingReply, Then};
use crate::commands::PubSub;
use crate::pubsub::Router;
use crate::resp::request::encode_request;

/// A user's (P|S)(UN)SUBSCRIBE waiting for Redis's verdict.
#[derive(Debug)]
pub(super) struct UserSub {
    pub(super) sub: PubSub,
    pub(super) args: Vec<Vec<u8>>,
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
    pub(super) async fn user_pubsub(&mut self, sub: PubSub, args: Vec<Vec<u8>>) {
        self.flush_batch().await;
        let mut probe = BytesMut::new();
        encode_request(&[b"MULTI"], &mut probe);
        let argv: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
        encode_request(&argv, &mut probe);
        encode_request(&[b"DISCARD"], &mut probe);
        // One job: nothing of another client runs between MULTI and DISCARD.
        let conn = self.shared_conn(self.session.db);
        let rx = conn.send(probe.freeze(), 3).await;
        self.push_reply(PendingReply::Reply(Box::new(AloneReply {
            rx,
            conn,
            then: Then::PubSub(Box::new(UserSub { sub, args })),
        })));
    }

    /// Redis's verdict on a user's (un)subscribe (`replies`: MULTI's, the command's, and
    /// DISCARD's): queued, the command is applied to the client's subscriptions and its
    /// confirmations written once the upstream ones are in place; refused, Redis's error is
    /// written.
    pub(super) async fn user_pubsub_answered(&mut self, replies: Bytes, s: UserSub) {
        let verdict = crate::resp::frames(&replies).nth(1).map(|f| f.bytes);
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
            None => self.wbuf.extend_from_slice(&replies),
        }
    }
}
