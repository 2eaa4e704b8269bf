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

use super::connection::Conn;
use super::pending::{PendingReply, Then};
use super::stateful::Pin;
use crate::commands::Local;
use crate::resp::request::parse_int;
use crate::resp::{Args, Proto};
use crate::upstream::Dedicated;

/// An AUTH or HELLO AUTH that Redis must check: its user, and what a HELLO changes.
#[derive(Debug)]
pub(super) struct UserAuth {
    /// The user name, as the client sent it.
    user: Bytes,
    /// HELLO: the protocol and name to take once Redis accepted it.
    hello: Option<HelloSet>,
}

/// What a successful HELLO changes in the session.
#[derive(Debug)]
struct HelloSet {
    proto: Proto,
    /// SETNAME's argument, if given.
    name: Option<Bytes>,
}

/// The AUTH or HELLO AUTH in `args` when it names a user other than `default` (corral has no
/// users of its own: `requirepass` is its `default`). `None` for every other form, which
/// corral answers itself, syntax errors included: Redis reports them before checking the
/// credentials, with the same text.
pub(super) fn upstream_auth(cmd: Local, args: &Args<'_>) -> Option<UserAuth> {
    let other = |u: &[u8]| u != b"default";
    match cmd {
        Local::Auth if args.len() == 3 => {
            let user = args.get(1)?;
            other(user).then(|| UserAuth {
                user: Bytes::copy_from_slice(user),
                hello: None,
            })
        }
        Local::Hello => {
            let proto = match parse_int(args.get(1)?)? {
                2 => Proto::Resp2,
                3 => Proto::Resp3,
                _ => return None,
            };
            let (mut user, mut name) = (None, None);
            let mut i = 2;
            while let Some(opt) = args.get(i) {
                let more = args.len() - i - 1;
                if opt.eq_ignore_ascii_case(b"AUTH") && more >= 2 {
                    user = args.get(i + 1);
                    i += 3;
                } else if opt.eq_ignore_ascii_case(b"SETNAME") && more >= 1 {
                    name = args.get(i + 1).map(Bytes::copy_from_slice);
                    i += 2;
                } else {
                    return None;
                }
            }
            let user = user.filter(|u| other(u))?;
            Some(UserAuth {
                user: Bytes::copy_from_slice(user),
                hello: Some(HelloSet { proto, name }),
            })
        }
        _ => None,
    }
}

impl Conn {
    /// Sends an AUTH or HELLO AUTH for a Redis user on the client's pinned connection, or on a
    /// dedicated one taken for it (counted against `upstream.max_dedicated`). Ends the round:
    /// where later requests go depends on Redis's answer.
    pub(super) async fn auth_user(&mut self, auth: UserAuth, req: Bytes) -> bool {
        self.flush_batch().await;
        if self.shared.upstream.cluster.is_some() {
            // Each node would need its own connection authenticated as the user.
            self.refuse(
                "ERR AUTH as a Redis ACL user other than 'default' is not supported by corral \
                 in cluster mode",
            )
            .await;
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
        self.push_reply(PendingReply::Reply {
            rx,
            conn,
            then: Then::Auth { auth, ded },
        });
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
                self.pin = Some(Pin {
                    user: Some(auth.user.clone()),
                    dirty: true,
                    ..Pin::new(ded)
                });
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
        self.info_changed = true;
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
        let mut out = BytesMut::from(&b"-"[..]);
        out.extend_from_slice(text.as_bytes());
        out.extend_from_slice(b"\r\n");
        self.push_ready(out.freeze()).await;
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

    fn parse(words: &[&str]) -> Option<UserAuth> {
        let owned: Vec<Vec<u8>> = words.iter().map(|w| w.as_bytes().to_vec()).collect();
        let args = Args::Owned(&owned);
        let cmd = match crate::commands::classify(&args) {
            crate::commands::Route::Local(c) => c,
            _ => return None,
        };
        upstream_auth(cmd, &args)
    }

    #[test]
    fn only_other_users_go_to_redis() {
        assert!(parse(&["AUTH", "pass"]).is_none());
        assert!(parse(&["AUTH", "default", "pass"]).is_none());
        assert_eq!(
            &parse(&["AUTH", "bob", "p"])
                .map(|a| a.user)
                .unwrap_or_default()[..],
            b"bob"
        );
        assert!(parse(&["AUTH", "bob", "p", "x"]).is_none());
        assert!(parse(&["HELLO", "3"]).is_none());
        assert!(parse(&["HELLO", "3", "AUTH", "default", "p"]).is_none());
        assert!(parse(&["HELLO", "4", "AUTH", "bob", "p"]).is_none());
        assert!(parse(&["HELLO", "3", "AUTH", "bob"]).is_none());
        let a = parse(&["hello", "3", "setname", "n", "auth", "bob", "p"]);
        let h = a.and_then(|a| a.hello);
        assert!(h.as_ref().is_some_and(|h| h.proto == Proto::Resp3));
        assert_eq!(h.and_then(|h| h.name).as_deref(), Some(&b"n"[..]));
    }

    #[test]
    fn hello_id_becomes_corral_id() {
        let reply = b"%2\r\n$5\r\nproto\r\n:3\r\n$2\r\nid\r\n:17\r\n";
        let want = b"%2\r\n$5\r\nproto\r\n:3\r\n$2\r\nid\r\n:4\r\n";
        assert_eq!(&rewrite_hello_id(reply, 0, 4)[..], &want[..]);
    }
}
