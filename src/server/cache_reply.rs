//! Writing the replies that come from the cache: shared reads (a fill, or another client's
//! GET joined), and cache replies written between the reply frames of the batch they rode in
//! (`Batch::interleave`).

use bytes::{Bytes, BytesMut};
use tokio::time::timeout;

use super::client::Conn;
use super::pending::{Between, Interleaved};
use crate::cache::{FillResult, FillRx, Value};
use crate::cluster::Redirect;
use crate::resp::Proto;
use crate::upstream::JobResult;

/// Whether a shared read failed for a reason a routed retry can fix.
fn redirected(result: &FillResult) -> bool {
    match result {
        Ok(Value::Error(e)) => Redirect::parse(e).is_some(),
        Ok(_) => false,
        Err(_) => true,
    }
}

/// The encoded hits of a batch, as far as they are written.
struct Cached {
    encoded: Bytes,
    at: usize,
}

impl Cached {
    /// Writes a cache reply that rode in a batch to `wbuf`, a hit at once; a shared read is
    /// handed back, to be waited for (and answered in its own protocol).
    fn write<'r>(
        &mut self,
        reply: &'r Interleaved,
        proto: Proto,
        wbuf: &mut BytesMut,
    ) -> Option<(&'r FillRx, Proto)> {
        match reply {
            Interleaved::Encoded { len } => {
                let end = self.at + *len as usize;
                wbuf.extend_from_slice(self.encoded.get(self.at..end).unwrap_or_default());
                self.at = end;
            }
            Interleaved::Value(v) => v.encode(proto, wbuf),
            Interleaved::Fill { rx, proto } => return Some((rx, *proto)),
        }
        None
    }
}

impl Conn {
    /// A cache fill or a read coalesced with another client's.
    pub(super) async fn resolve_fill(&mut self, rx: &FillRx, proto: Proto) {
        let tracked = rx.tracked();
        let timed_out;
        let result = match self.wait_fill(rx).await {
            Some(r) => r,
            None => {
                timed_out = Err(rx.timed_out());
                &timed_out
            }
        };
        // In cluster mode a read can meet a slot on the move (MOVED/ASK, or a fill's
        // EXEC aborted by one): answer through the routing path, uncached.
        if self.shared.upstream.cluster.is_some() && redirected(result) {
            let reply = self.routed_get(rx.key()).await;
            self.wbuf.extend_from_slice(&reply);
            return;
        }
        // A fill lost with its tracking lane (dead, reset): the client's own
        // connection may be fine, so it reads the key there, uncached.
        if tracked && result.is_err() {
            let reply = self.plain_get(rx.key()).await;
            self.wbuf.extend_from_slice(&reply);
            return;
        }
        match result {
            Ok(v) => v.encode(proto, &mut self.wbuf),
            Err(e) => self.upstream_error(e, 1),
        }
    }

    /// The shared read's result, waited for at most `request_timeout` (`None` past it).
    async fn wait_fill<'r>(&self, rx: &'r FillRx) -> Option<&'r FillResult> {
        if let Some(r) = rx.peek() {
            return Some(r);
        }
        let wait = rx.wait();
        match self.shared.upstream.request_timeout {
            Some(d) => timeout(d, wait).await.ok(),
            None => Some(wait.await),
        }
    }

    /// A GET of `key` over the client's own (database 0) connection: the reply bytes, or the
    /// error reply.
    async fn plain_get(&mut self, key: &[u8]) -> Bytes {
        let conn = self.shared_conn(0);
        let mut req = bytes::BytesMut::new();
        crate::resp::encode::encode_request(&[b"GET", key], &mut req);
        let rx = conn.send(req.freeze(), 1).await;
        match self.wait(rx, &conn).await {
            Ok(b) => b,
            Err(e) => {
                self.shared.metrics.upstream_errors.inc();
                e.to_reply()
            }
        }
    }

    /// A batch's replies (or the error that ends them, answering each request) with the cache
    /// replies that came between its requests, if any, in request order. A batch with such
    /// replies went on a shared connection in standalone mode (see `Conn::may_interleave`):
    /// one reply frame per request, nothing to skip or redirect.
    ///
    /// The cache replies are read where they are: each one moved out, across the wait a
    /// shared read may need, was stored and read back in pieces (a failed store forwarding
    /// on every hit, 14% of `resolve`'s samples in perf on Zipf GETs at -P 16).
    pub(super) async fn write_interleaved(
        &mut self,
        result: JobResult,
        count: u32,
        interleaved: Between,
    ) {
        let mut merge = Merge::new(interleaved);
        match result {
            Ok(b) => self.merge_part(&mut merge, &b, true).await,
            Err(e) => self.merge_error(&mut merge, &e, count).await,
        }
    }

    /// Writes `part`, the next of a batch's whole reply frames, with the cache replies that
    /// come between them. Cache replies after its last frame wait for the next part, unless
    /// this is the `last`.
    pub(super) async fn merge_part(&mut self, merge: &mut Merge, part: &[u8], last: bool) {
        let proto = self.session.proto;
        let mut frames = crate::resp::frames(part).filter(|f| !f.push);
        let mut written = 0;
        let mut upto = 0;
        while let Some((before, reply)) = merge.replies.get(merge.next) {
            while merge.done < *before {
                let Some(f) = frames.next() else { break };
                upto = f.end();
                merge.done += 1;
            }
            if merge.done < *before && !last {
                break;
            }
            self.wbuf.extend_from_slice(&part[written..upto]);
            written = upto;
            merge.next += 1;
            if let Some((rx, proto)) = merge.cached.write(reply, proto, &mut self.wbuf) {
                self.resolve_fill(rx, proto).await;
            }
        }
        if !last {
            merge.done += frames.count() as u32;
        }
        self.wbuf.extend_from_slice(&part[written..]);
    }

    /// Writes the cache replies that came before the batch's reply `done` (its first is 0),
    /// or after its last if `done` is their count, waiting for shared reads among them.
    pub(super) async fn merge_due(&mut self, merge: &mut Merge, done: u32) {
        let proto = self.session.proto;
        while let Some((before, reply)) = merge.replies.get(merge.next)
            && *before <= done
        {
            merge.next += 1;
            if let Some((rx, proto)) = merge.cached.write(reply, proto, &mut self.wbuf) {
                self.resolve_fill(rx, proto).await;
            }
        }
    }

    /// The batch's replies failed with `e` after `merge.done` of its `count` came: the error
    /// answers each of the others, with the cache replies between them.
    pub(super) async fn merge_error(
        &mut self,
        merge: &mut Merge,
        e: &crate::error::UpstreamError,
        count: u32,
    ) {
        let proto = self.session.proto;
        while let Some((before, reply)) = merge.replies.get(merge.next) {
            self.upstream_error(e, before.saturating_sub(merge.done));
            merge.done = merge.done.max(*before);
            merge.next += 1;
            if let Some((rx, proto)) = merge.cached.write(reply, proto, &mut self.wbuf) {
                self.resolve_fill(rx, proto).await;
            }
        }
        self.upstream_error(e, count.saturating_sub(merge.done));
    }
}

/// A batch's cache replies as its reply frames are written (see [`Conn::merge_part`]).
pub(super) struct Merge {
    replies: Vec<(u32, Interleaved)>,
    /// The next cache reply to write.
    next: usize,
    /// Reply frames of the batch's written so far.
    pub(super) done: u32,
    cached: Cached,
}

impl Merge {
    /// How many of the batch's replies come before the next cache reply not yet written.
    pub(super) fn next_before(&self) -> Option<u32> {
        self.replies.get(self.next).map(|(before, _)| *before)
    }

    /// Before any of the batch's replies.
    pub(super) fn new(interleaved: Between) -> Merge {
        let Between { replies, encoded } = interleaved;
        Merge {
            replies,
            next: 0,
            done: 0,
            cached: Cached { encoded, at: 0 },
        }
    }
}
