//! Writing a streamed batch's replies
//! ([`PendingReply::Streamed`](super::pending::PendingReply::Streamed)): large ones as their
//! parts arrive from the connection, rather than once all have.

use bytes::{Bytes, BytesMut};
use tokio::sync::mpsc::UnboundedReceiver;

use super::cache_reply::Merge;
use super::client::Conn;
use super::pending::{Effect, Streamed};
use crate::cluster::Redirect;
use crate::error::UpstreamError;
use crate::tls::Stream;
use crate::upstream::{JobResult, Reply, STREAM_PART, UpstreamConn};

/// Where the first redirection (MOVED, ASK, TRYAGAIN, CLUSTERDOWN) among a part's reply
/// frames starts.
fn first_redirect(part: &[u8]) -> Option<usize> {
    crate::resp::frames(part)
        .find(|f| !f.push && f.bytes.first() == Some(&b'-') && Redirect::parse(f.bytes).is_some())
        .map(|f| f.start)
}

impl Conn {
    /// Writes a plain batch's replies (see the module), with the cache replies between
    /// them: large ones as their parts arrive, the buffer written to the client each time
    /// it holds [`STREAM_PART`] bytes, so a pipeline of large values reaches the client
    /// while Redis is still sending it, and corral does not hold all of it. The keys the
    /// batch writes are invalidated again before each part is written: the part holding a
    /// write's acknowledgement came after Redis ran it. In cluster mode the replies up to
    /// the first redirection go out so; from it on they are gathered, the redirections
    /// followed, and the keys invalidated again (a redirected write runs where it is
    /// retried). An error after some parts answers the requests whose replies did not come.
    pub(super) async fn resolve_streamed(
        &mut self,
        streamed: Streamed,
        client: &mut Stream,
    ) -> Option<Effect> {
        let Streamed {
            rx,
            count,
            conn,
            interleaved,
            after,
            mut redirects,
        } = streamed;
        let first = match self.wait_for(rx, &conn).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Reply::Whole(Err(UpstreamError::ShuttingDown)),
            Err(e) => Reply::Whole(Err(e)),
        };
        let (first, mut rest) = match first {
            Reply::Parts(first, rest) => (first, rest),
            Reply::Whole(r) => {
                let r = match (r, &redirects) {
                    (Ok(b), Some(cmds)) => Ok(self.follow_redirects(b, cmds, &conn).await),
                    (r, _) => r,
                };
                // Whatever the outcome, the writes may have run.
                self.invalidate_after(&after);
                self.writes.recycle(after.writes);
                self.write_interleaved(r, count, interleaved).await;
                return None;
            }
        };
        let mut merge = Merge::new(interleaved);
        let mut part = Ok(first);
        let effect = loop {
            self.invalidate_after(&after);
            let redirect_at = match (&part, &redirects) {
                (Ok(b), Some(_)) => first_redirect(b),
                _ => None,
            };
            match (part, redirect_at) {
                (Ok(b), Some(at)) => {
                    // The rest is gathered here, and no part comes after it.
                    let cmds = redirects.take().unwrap_or_default();
                    self.merge_part(&mut merge, &b[..at], false).await;
                    let from = (merge.done as usize).min(cmds.len());
                    let (followed, lost) = self
                        .gather_redirected(b.slice(at..), &mut rest, &cmds[from..], &conn)
                        .await;
                    self.invalidate_after(&after);
                    self.merge_part(&mut merge, &followed, false).await;
                    if let Some(e) = lost {
                        self.merge_error(&mut merge, &e, count).await;
                        break None;
                    }
                }
                (Ok(b), None) => self.merge_part(&mut merge, &b, false).await,
                (Err(e), _) => {
                    self.merge_error(&mut merge, &e, count).await;
                    break None;
                }
            }
            if merge.done >= count {
                // The cache replies after the last forwarded one.
                self.merge_part(&mut merge, &[], true).await;
                break None;
            }
            if self.wbuf.len() >= STREAM_PART {
                if !matches!(self.send_replies(client).await, Ok(true)) {
                    break Some(Effect::Gone);
                }
                self.wbuf.clear();
            }
            part = match self.wait_for(rest.recv(), &conn).await {
                Ok(Some(r)) => r,
                Ok(None) => Err(UpstreamError::ShuttingDown),
                Err(e) => Err(e),
            };
        };
        self.writes.recycle(after.writes);
        effect
    }

    /// Cluster mode: the rest of a streamed batch's replies from its first redirection on
    /// (`first`, then what `rest` brings), gathered, and their redirections followed
    /// (`cmds`: the requests they answer). The error that ended them early, if one did,
    /// comes back beside the replies that came before it.
    async fn gather_redirected(
        &mut self,
        first: Bytes,
        rest: &mut UnboundedReceiver<JobResult>,
        cmds: &[(Bytes, Option<u16>)],
        conn: &UpstreamConn,
    ) -> (Bytes, Option<UpstreamError>) {
        let mut all = BytesMut::from(&first[..]);
        let lost = loop {
            match self.wait_for(rest.recv(), conn).await {
                Ok(Some(Ok(b))) => all.extend_from_slice(&b),
                Ok(Some(Err(e))) | Err(e) => break Some(e),
                Ok(None) => break None,
            }
        };
        let all = all.freeze();
        let answered = crate::resp::frames(&all).filter(|f| !f.push).count();
        let cmds = &cmds[..answered.min(cmds.len())];
        (self.follow_redirects(all, cmds, conn).await, lost)
    }
}

#[cfg(test)]
mod tests {
    use super::first_redirect;

    #[test]
    fn the_first_redirection_is_found_past_replies_errors_and_pushes() {
        let before = &b"$3\r\nabc\r\n-ERR no\r\n>2\r\n$7\r\nmessage\r\n$1\r\nx\r\n"[..];
        let part = [before, b"-MOVED 1 127.0.0.1:7001\r\n$1\r\nx\r\n"].concat();
        assert_eq!(first_redirect(&part), Some(before.len()));
        assert_eq!(first_redirect(b"-ASK 1 127.0.0.1:7001\r\n"), Some(0));
        assert_eq!(first_redirect(b"-TRYAGAIN later\r\n:1\r\n"), Some(0));
        assert_eq!(
            first_redirect(b"+OK\r\n-ERR MOVED away\r\n*1\r\n-ASK x\r\n"),
            None
        );
        assert_eq!(first_redirect(b""), None);
    }
}
