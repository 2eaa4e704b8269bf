//! Redis's own ACL users, passed through: `AUTH <user> <pass>` and `HELLO <ver> AUTH <user>
//! <pass>` for a user other than `default` are checked by Redis itself, on a connection taken
//! for the check (or the client's pinned one). On success the client is served from that
//! user's pool (`upstream/users.rs`: connections authenticated as the user, shared by all its
//! clients, keyed by user and password digest), so that Redis applies the user's ACLs to every
//! command exactly; on failure the client gets Redis's own error and stays as it was.
//!
//! The connection the AUTH ran on is then authenticated as the user and was taken for
//! someone else: it is closed, never reused (after a refusal it is still corral's own). A pinned one (WATCH, tracking) keeps serving the client
//! until its state ends, as in Redis, and is closed then.

use bytes::{Bytes, BytesMut};

use super::client::Conn;
use super::pending::{AloneReply, PendingReply, Then};
use super::user_auth::UserAuth;
use crate::error::replies;
use crate::upstream::Dedicated;

impl Conn {
    /// Sends an AUTH or HELLO AUTH for a Redis user on the client's pinned connection, or on a
    /// dedicated one taken for it (counted against `upstream.max_dedicated` while the check
    /// lasts). Ends the round: where later requests go depends on Redis's answer.
    pub(super) async fn auth_user(&mut self, auth: UserAuth, req: Bytes) -> bool {
        self.flush_batch().await;
        if self.shared.upstream.cluster.is_some() {
            // Each node would need its own connections authenticated as the user.
            self.refuse(replies::ACL_USER_IN_CLUSTER.text()).await;
            return true;
        }
        // Refused before Redis is asked: credentials corral could not pass on.
        if let Err(msg) = self.shared.upstream.users.check(&auth.user, &auth.password) {
            self.refuse(msg).await;
            return true;
        }
        let (conn, ded) = match &self.pin {
            Some(pin) => (pin.ded.conn.clone(), None),
            None => match self.shared.upstream.dedicated_to(
                None,
                None,
                self.session.proto,
                self.session.db,
            ) {
                Ok(d) => (d.conn.clone(), Some(d)),
                Err(msg) => {
                    self.refuse(msg).await;
                    return true;
                }
            },
        };
        let rx = conn.send(req, 1).await;
        self.push_reply(PendingReply::Reply(Box::new(AloneReply {
            rx,
            conn,
            then: Then::Auth { auth, ded },
        })));
        true
    }

    /// Applies Redis's answer to an AUTH or HELLO AUTH for a user and returns the replies to
    /// write (`answer`; `start`: where Redis's reply begins, after any tracking pushes). On success the
    /// client is served from the user's pool from its next request on; on an error nothing
    /// changes. `ded`, the connection the check ran on, is closed on success and kept for
    /// reuse on an error.
    pub(super) fn auth_answered(
        &mut self,
        answer: Bytes,
        start: usize,
        auth: UserAuth,
        ded: Option<Dedicated>,
    ) -> Bytes {
        if answer.get(start).is_none_or(|&b| b == b'-') {
            // A refused AUTH leaves the connection as it was: still corral's own.
            if let Some(d) = ded {
                self.shared.upstream.release(d);
            }
            return answer;
        }
        // Now authenticated as the user, and taken for someone else: closed.
        drop(ded);
        if let Some(pin) = &mut self.pin {
            // Now authenticated as the user, it must never go back to anyone's idle pool.
            pin.dirty = true;
        }
        let lease = self.shared.upstream.users.lease(
            &auth.user,
            &auth.password,
            self.session.id,
            self.kill.clone(),
        );
        let lease = match lease {
            Ok(l) => l,
            Err(msg) => {
                // Redis accepted it, but corral cannot serve the user (`auth.max_user_pools`):
                // the client stays as it was, off the pinned connection.
                self.drop_pin_after_round();
                return replies::line(msg);
            }
        };
        self.lease = Some(lease);
        self.session.authenticated = true;
        self.session.user = Some(auth.user);
        // Redis checks this user's permissions now, not corral.
        self.session.acl = None;
        self.info_changed();
        match auth.hello {
            Some(h) => {
                self.session.proto = h.proto;
                if let Some(n) = h.name {
                    self.session.name = (!n.is_empty()).then_some(n);
                }
                rewrite_hello_id(&answer, start, self.session.id)
            }
            None => answer,
        }
    }

    /// Whether the client is authenticated as a Redis user through corral.
    pub(super) fn redis_user(&self) -> bool {
        self.lease.is_some()
    }

    /// Redis dropped or refused a connection of the client's user (CLIENT KILL, ACL DELUSER,
    /// a changed password, a restart): corral does not authenticate again with the password
    /// the client once gave, so the client is closed, as Redis closes a killed client.
    pub(super) fn user_connection_lost(&self) -> bool {
        self.user_pool().is_some_and(|p| p.is_revoked())
    }

    /// The client left its Redis user (AUTH as `default` or as one of corral's users): later
    /// requests go to corral's own connections.
    pub(super) fn leave_user(&mut self) {
        self.lease = None;
    }

    async fn refuse(&mut self, text: &str) {
        self.push_ready(replies::line(text)).await;
    }
}

/// Redis's HELLO reply (at `start` in `replies`) with its `id` field, Redis's id for corral's
/// connection, replaced by the client's corral id, which CLIENT ID and CLIENT LIST show.
fn rewrite_hello_id(replies: &[u8], start: usize, id: u64) -> Bytes {
    let key = b"$2\r\nid\r\n:";
    let Some(at) = replies[start..]
        .windows(key.len())
        .position(|w| w == key)
        .map(|p| start + p + key.len())
    else {
        return Bytes::copy_from_slice(replies);
    };
    let Some(end) = replies[at..]
        .iter()
        .position(|&b| b == b'\r')
        .map(|p| at + p)
    else {
        return Bytes::copy_from_slice(replies);
    };
    let mut out = BytesMut::from(&replies[..at]);
    out.extend_from_slice(id.to_string().as_bytes());
    out.extend_from_slice(&replies[end..]);
    out.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hello_id_becomes_corral_id() {
        let reply = b"%2\r\n$5\r\nproto\r\n:3\r\n$2\r\nid\r\n:17\r\n";
        let want = b"%2\r\n$5\r\nproto\r\n:3\r\n$2\r\nid\r\n:4\r\n";
        assert_eq!(&rewrite_hello_id(reply, 0, 4)[..], &want[..]);
    }
}
