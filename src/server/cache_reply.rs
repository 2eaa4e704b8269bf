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
        crate::resp::request::encode_request(&[b"GET", key], &mut req);
        let rx = conn.send(req.freeze(), 1).await;
        match self.wait(rx, &conn).await {
            Ok(b) => b,
            Err(e) => {
                self.shared.metrics.upstream_errors.inc();
                e.to_reply()
            }
        }
    }

    /// A batch's replies with the cache replies that came between its requests, in request
    /// order. Such a batch went on a shared connection in standalone mode (see
    /// `Conn::may_interleave`): one reply frame per request, nothing to skip or redirect.
    /// The cache replies are read where they are: each one moved out, across the wait a
    /// shared read may need, was stored and read back in pieces (a failed store forwarding
    /// on every hit, 14% of `resolve`'s samples in perf on Zipf GETs at -P 16).
    pub(super) async fn write_interleaved(
        &mut self,
        result: JobResult,
        count: u32,
        interleaved: Between,
    ) {
        let mut done = 0;
        let Between { replies, encoded } = interleaved;
        let mut cached = Cached { encoded, at: 0 };
        let proto = self.session.proto;
        match result {
            Ok(b) => {
                let mut frames = crate::resp::frames(&b).filter(|f| !f.push);
                let mut written = 0;
                for (before, reply) in &replies {
                    let mut upto = written;
                    while done < *before {
                        let Some(f) = frames.next() else { break };
                        upto = f.end();
                        done += 1;
                    }
                    self.wbuf.extend_from_slice(&b[written..upto]);
                    written = upto;
                    if let Some((rx, proto)) = cached.write(reply, proto, &mut self.wbuf) {
                        self.resolve_fill(rx, proto).await;
                    }
                }
                self.wbuf.extend_from_slice(&b[written..]);
            }
            Err(e) => {
                for (before, reply) in &replies {
                    self.upstream_error(&e, before - done);
                    done = *before;
                    if let Some((rx, proto)) = cached.write(reply, proto, &mut self.wbuf) {
                        self.resolve_fill(rx, proto).await;
                    }
                }
                self.upstream_error(&e, count - done);
            }
        }
    }
}
