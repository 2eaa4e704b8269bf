//! (P|S)(UN)SUBSCRIBE for one client, answered from corral's shared subscriptions, and the
//! RESP2 subscribed-mode rule.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::sync::oneshot;

use super::client::Conn;
use super::pending::PendingReply;
use super::plan::Plan;
use super::subscriber::{Subscriptions, confirmation, describe};
use crate::commands::{Command, PubSub};
use crate::pubsub;
use crate::resp::{Args, Encoder, Proto};

impl Conn {
    /// Runs a (P|S)(UN)SUBSCRIBE. Returns the replies and the confirmations to wait for before
    /// sending them (a new upstream subscription must be in place first, or a message
    /// published right after the client saw its confirmation could be missed).
    pub(super) fn pubsub(
        &mut self,
        cmd: PubSub,
        args: &Args<'_>,
    ) -> (Bytes, Vec<oneshot::Receiver<()>>) {
        let (kind, verb, subscribing) = describe(cmd);
        let proto = self.session.proto;
        let mut out = BytesMut::new();
        let mut waits = Vec::new();
        if subscribing && args.len() < 2 {
            let name = String::from_utf8_lossy(verb).into_owned();
            Encoder {
                proto,
                out: &mut out,
            }
            .error(&crate::error::replies::wrong_arity(&name));
            return (out.freeze(), waits);
        }
        let id = self.session.id;
        let hub = self.hub();
        if self
            .subs
            .as_ref()
            .is_some_and(|s| !Arc::ptr_eq(&s.hub, &hub))
        {
            if subscribing && self.subs.as_ref().is_some_and(Subscriptions::active) {
                // Made as another user (before an AUTH): they stay where they are, and new
                // ones cannot join them (`users.rs`).
                let text = crate::error::replies::SUBSCRIBED_AS_OTHER_USER.text();
                Encoder {
                    proto,
                    out: &mut out,
                }
                .error(text);
                return (out.freeze(), waits);
            }
            if !self.subs.as_ref().is_some_and(Subscriptions::active) {
                self.subs = None;
            }
        }
        let subs = self.subs.get_or_insert_with(|| {
            let (tx, rx) = pubsub::queue();
            hub.register(id, tx, self.kill.clone());
            // On a Redis user's hub (`hub` is the current user's): the pool stays open for it.
            let lease = self.lease.as_ref().map(crate::upstream::UserLease::share);
            Subscriptions::new(rx, hub, id, lease)
        });
        let hub = subs.hub.clone();
        let names: Vec<Bytes> = if args.len() > 1 {
            args.iter().skip(1).map(Bytes::copy_from_slice).collect()
        } else {
            subs.set(kind).iter().cloned().collect()
        };
        if names.is_empty() {
            confirmation(verb, None, subs.count(kind), proto, &mut out);
        }
        for name in names {
            if subscribing {
                if subs.set(kind).insert(name.clone())
                    && let Some(w) = hub.subscribe(id, kind, &name)
                {
                    waits.push(w);
                }
            } else if subs.set(kind).remove(&name)
                && let Some(w) = hub.unsubscribe(id, kind, &name)
            {
                // The reply waits until Redis dropped the upstream subscription, so that a
                // PUBLISH the client sends next is not counted for it.
                waits.push(w);
            }
            confirmation(verb, Some(&name), subs.count(kind), proto, &mut out);
        }
        self.session.subs = subs.counts();
        self.info_changed();
        (out.freeze(), waits)
    }

    /// (P|S)(UN)SUBSCRIBE, answered from corral's shared subscriptions.
    pub(super) fn subscriptions(&mut self, cmd: &Command<'_>, sub: PubSub) -> Plan {
        let args = cmd.args;
        let owned: Vec<Vec<u8>> = args.iter().map(<[u8]>::to_vec).collect();
        if self.redis_user() {
            // Redis checks the user's permissions for it first (`user_pubsub.rs`).
            return Plan::UserPubSub(Box::new(super::user_pubsub::UserSub {
                sub,
                args: owned,
                ded: None,
            }));
        }
        self.shared.metrics.local_commands.inc();
        let (reply, waits) = self.pubsub(sub, &crate::resp::Args::Owned(&owned));
        let leaving = !super::subscriber::describe(sub).2;
        Plan::Reply(PendingReply::Subscribed(Box::new(
            super::pending::Subscribed {
                reply,
                waits,
                leaving,
            },
        )))
    }

    /// True in RESP2 subscribed mode, where only (P|S)(UN)SUBSCRIBE, PING, QUIT and RESET
    /// are allowed.
    pub(super) fn resp2_subscribed(&self) -> bool {
        self.session.proto == Proto::Resp2 && self.subs.as_ref().is_some_and(|s| s.active())
    }

    /// Drops every subscription (RESET, disconnect). Returns the confirmations of the
    /// upstream unsubscribes this ended.
    pub(super) fn unsubscribe_all(&mut self) -> Vec<oneshot::Receiver<()>> {
        let Some(subs) = self.subs.take() else {
            return Vec::new();
        };
        self.session.subs = (0, 0, 0);
        subs.hub.remove(self.session.id)
    }
}
