//! Writing a streamed batch's replies
//! ([`PendingReply::Streamed`](super::pending::PendingReply::Streamed)): large ones as their
//! parts arrive from the connection, rather than once all have.

use super::cache_reply::Merge;
use super::client::Conn;
use super::pending::{Effect, Streamed};
use crate::error::UpstreamError;
use crate::tls::Stream;
use crate::upstream::{Reply, STREAM_PART};

impl Conn {
    /// Writes a plain batch's replies (see the module), with the cache replies between
    /// them: large ones as their parts arrive, the buffer written to the client each time
    /// it holds [`STREAM_PART`] bytes, so a pipeline of large values reaches the client
    /// while Redis is still sending it, and corral does not hold all of it. The keys the
    /// batch writes are invalidated again before each part is written: the part holding a
    /// write's acknowledgement came after Redis ran it. An error after some parts answers
    /// the requests whose replies did not come.
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
        } = streamed;
        let first = match self.wait_for(rx, &conn).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Reply::Whole(Err(UpstreamError::ShuttingDown)),
            Err(e) => Reply::Whole(Err(e)),
        };
        let (first, mut rest) = match first {
            Reply::Parts(first, rest) => (first, rest),
            Reply::Whole(r) => {
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
            match part {
                Ok(b) => self.merge_part(&mut merge, &b, false).await,
                Err(e) => {
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
}
