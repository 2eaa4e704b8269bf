//! Redis's own ACL users, passed through: `AUTH <user> <pass>` and `HELLO <ver> AUTH <user>
//! <pass>` for a user other than `default` are checked by Redis itself, on a dedicated
//! connection. On success the client stays pinned to that connection, now authenticated as
//! the user, so that Redis applies the user's ACLs to every command exactly; on failure the
//! client gets Redis's own error and stays as it was.
//!
//! The connection is never returned to the idle pool (it is authenticated as the user): it
//! is closed on RESET, on a successful AUTH back to `default`, or when the client leaves.
//! A later AUTH as another user goes on the same connection, as in Redis, so WATCHed keys and
//! CLIENT TRACKING survive it.

use bytes::{Bytes, BytesMut};

use super::client::Conn;
use super::pending::{AloneReply, PendingReply, Then};
use super::user_auth::UserAuth;
use crate::error::replies;
use crate::upstream::Dedicated;

impl Conn {
    /// Sends an AUTH or HELLO AUTH for a Redis user on the client's pinned connection, or on a
    /// dedicated one taken for it (counted against `upstream.max_dedicated`). Ends the round:
    /// where later requests go depends on Redis's answer.
    pub(super) async fn auth_user(&mut self, auth: UserAuth, req: Bytes) -> bool {
        self.flush_batch().await;
        if self.shared.upstream.cluster.is_some() {
            // Each node would need its own connection authenticated as the user.
            self.refuse(replies::ACL_USER_IN_CLUSTER.text()).await;
            return true;
        }
        let (conn, ded) =
            match &self.pin {
                Some(pin) => (pin.ded.conn.clone(), None),
                None => match self.shared.upstream.dedicated_to(
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
    /// write (`start`: where the answer begins, after any tracking pushes). On success the
    /// client is pinned to the connection as the user; on an error nothing changes and `ded`,
    /// if any, is closed.
    pub(super) fn auth_answered(
        &mut self,
        replies: Bytes,
        start: usize,
        auth: UserAuth,
        ded: Option<Dedicated>,
    ) -> Bytes {
        if replies.get(start).is_none_or(|&b| b == b'-') {
            return replies;
        }
        match ded {
            // Never reused by another client: `dirty` keeps it out of the idle pool.
            Some(ded) => {
                let pin = self.pin_to(ded);
                pin.user = Some(auth.user.clone());
                pin.dirty = true;
            }
            None => {
                if let Some(pin) = &mut self.pin {
                    pin.user = Some(auth.user.clone());
                    pin.dirty = true;
                }
            }
        }
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
                rewrite_hello_id(&replies, start, self.session.id)
            }
            None => replies,
        }
    }

    /// Whether the client is authenticated as a Redis user through corral.
    pub(super) fn user_pinned(&self) -> bool {
        self.pin.as_ref().is_some_and(|p| p.user.is_some())
    }

    /// The connection authenticated as the client's Redis user is gone (Redis restarted,
    /// CLIENT KILL, a network fault): corral cannot authenticate again without the password,
    /// so the client is closed, as Redis closes a killed client.
    pub(super) fn user_connection_lost(&self) -> bool {
        self.pin
            .as_ref()
            .is_some_and(|p| p.user.is_some() && p.ded.conn.is_dead())
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
