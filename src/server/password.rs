//! `CONFIG SET requirepass` through corral: Redis's `default` password changes, and corral
//! follows it, as a client of Redis would see it. Clients then authenticate to corral with
//! the new password (`Shared::follow_requirepass`), and corral's new upstream connections
//! authenticate with it when corral is Redis's `default` user; before this, the first new
//! upstream connection after such a change failed to authenticate.

use bytes::Bytes;
use tokio::sync::oneshot;

use super::client::Conn;
use super::pending::{AfterAck, PendingReply};
use super::plan::Plan;
use crate::commands::Command;
use crate::error::replies;
use crate::upstream::ReplyTo;

/// The password a `CONFIG SET ... requirepass <password> ...` sets (empty: none), or `None`
/// for any other command.
pub(super) fn requirepass_set<'a>(cmd: &Command<'a>) -> Option<&'a [u8]> {
    if cmd.name() != b"CONFIG" || !cmd.arg_is(1, b"SET") {
        return None;
    }
    (2..cmd.args.len())
        .step_by(2)
        .find(|&i| cmd.arg_is(i, b"requirepass"))
        .map(|i| cmd.args.get(i + 1).unwrap_or_default())
}

impl Conn {
    /// Plans a `CONFIG SET` that sets `password`: sent alone, and followed once Redis accepts
    /// it (`set_requirepass`). Refused in cluster mode, where each node would have to accept
    /// it, and for a password that is not UTF-8, which corral's upstream URL cannot hold.
    pub(super) fn plan_requirepass(&mut self, password: &[u8], req: Bytes) -> Plan {
        if self.shared.upstream.cluster.is_some() {
            return Plan::ready(replies::REQUIREPASS_IN_CLUSTER.to_bytes());
        }
        match std::str::from_utf8(password) {
            Ok(password) => Plan::Requirepass(Box::new((req, password.to_owned()))),
            Err(_) => Plan::ready(replies::REQUIREPASS_NOT_UTF8.to_bytes()),
        }
    }

    /// Sends the `CONFIG SET` on its own and, when Redis answers `+OK`, makes corral follow
    /// the new password. That is done on the upstream connection's task as the reply arrives,
    /// so it happens even if this client is gone by then. One at a time (`Auth::changing`), so
    /// that the last one Redis ran is the one corral keeps. Ends the round: an AUTH pipelined
    /// after it is checked against the new password, as Redis checks it.
    pub(super) async fn set_requirepass(&mut self, req: Bytes, password: String) -> bool {
        self.flush_batch().await;
        let conn = self.target();
        let (tx, rx) = oneshot::channel();
        let shared = self.shared.clone();
        // Released once the reply is followed (or the job is dropped with its connection).
        let turn = shared.auth.changing.clone().lock_owned().await;
        let follow = move |r: crate::upstream::JobResult| {
            match &r {
                Ok(reply) if accepted(reply) => shared.follow_requirepass(Some(&password)),
                Ok(_) => {}
                // Redis may have taken it before the connection failed: corral cannot tell.
                Err(e) => tracing::warn!(
                    error = %e,
                    "CONFIG SET requirepass through corral got no reply: if Redis took it, \
                     corral still uses the old password (set it in corral's config and reload)"
                ),
            }
            drop(turn);
            let _ = tx.send(r);
        };
        conn.send_to(req, 1, ReplyTo::Call(Box::new(follow))).await;
        self.push_reply(PendingReply::one(rx, conn, AfterAck::default(), None));
        true
    }
}

/// Whether Redis accepted the command: its reply, after any invalidation pushes of a
/// tracking client's connection, is `+OK`.
fn accepted(replies: &[u8]) -> bool {
    crate::resp::frames(replies)
        .find(|f| !f.push)
        .is_some_and(|f| &replies[f.start..f.end()] == b"+OK\r\n")
}

#[cfg(test)]
mod tests {
    use super::accepted;

    #[test]
    fn only_ok_after_pushes_is_accepted() {
        assert!(accepted(b"+OK\r\n"));
        assert!(accepted(
            b">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nk\r\n+OK\r\n"
        ));
        assert!(!accepted(b"-ERR bad\r\n"));
        assert!(!accepted(b""));
    }
}
