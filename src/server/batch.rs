//! The forwarded requests of a round not yet handed to the upstream: consecutive requests
//! for one upstream connection travel as one job.

use bytes::{Bytes, BytesMut};

use super::pending::{Between, Interleaved};
use crate::cache::{Lead, Value};
use crate::resp::Proto;
use crate::upstream::{JobResult, PartHook, UpstreamConn};

/// Largest cache reply copied into the batch's encoded replies; a larger one is held as it is
/// until written, so a round of large hits does not copy its values twice.
const ENCODE_AT_MOST: usize = 1024;
/// Bytes taken at a time for encoded hits: a pipeline's worth of short values.
const ENCODED_BLOCK: usize = 4096;
/// Room for cache replies reserved with a batch's first: a 16-deep pipeline's runs of hits
/// fit, where growing from nothing reallocated on most batches.
const FIRST_INTERLEAVED: usize = 8;

/// Requests waiting to be sent together, and what their replies need.
#[derive(Default)]
pub(super) struct Batch {
    bytes: BytesMut,
    count: u32,
    conn: Option<UpstreamConn>,
    /// Cluster mode: where each request is in `bytes`, and its slot, to retry it after a
    /// redirection (sliced from the sent bytes then: no copy of each request).
    cmds: Vec<(usize, usize, Option<u16>)>,
    /// GETs in the batch that other clients' GETs wait for: (position in the batch, lead).
    leads: Vec<(u32, Lead)>,
    /// Cache replies between its requests: (forwarded requests before it, reply).
    interleaved: Vec<(u32, Interleaved)>,
    /// The frames of its [`Interleaved::Encoded`] replies.
    encoded: BytesMut,
    /// The batch runs a script or function (or an EXEC that does).
    pub(super) script: bool,
    /// The batch's scripts ([`crate::commands::busy::script_key`]), to learn how long they
    /// take.
    pub(super) script_keys: Vec<u64>,
    /// The batch starts with a request whose reply the client must not see (the MULTI sent
    /// late for a deferred one, the HELLO that switches a pinned connection).
    pub(super) skip_first: bool,
}

/// A batch handed over for sending.
pub(super) struct Taken {
    pub(super) bytes: Bytes,
    pub(super) count: u32,
    /// Where it goes, if it was decided when the first request was added.
    pub(super) conn: Option<UpstreamConn>,
    pub(super) cmds: Vec<(Bytes, Option<u16>)>,
    pub(super) leads: Vec<(u32, Lead)>,
    pub(super) interleaved: Between,
    pub(super) script: bool,
    pub(super) script_keys: Vec<u64>,
    pub(super) skip_first: bool,
}

impl Batch {
    /// No request in the batch.
    pub(super) fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Bytes of requests in the batch.
    pub(super) fn len_bytes(&self) -> usize {
        self.bytes.len()
    }

    /// Adds request bytes. `conn`, where the batch goes, is needed for its first request
    /// only (see [`Batch::is_empty`]). Inlined: called for every forwarded request, and left
    /// out of line it cost about 18 instructions per request.
    #[inline]
    pub(super) fn push(&mut self, bytes: &[u8], conn: Option<UpstreamConn>) {
        if self.count == 0 {
            self.conn = conn;
        }
        self.bytes.extend_from_slice(bytes);
        self.count += 1;
    }

    /// Where the batch goes, once it has a request.
    pub(super) fn conn(&self) -> Option<&UpstreamConn> {
        self.conn.as_ref()
    }

    /// Requests in the batch.
    pub(super) fn count(&self) -> u32 {
        self.count
    }

    /// Bytes its buffers hold room for (what is in them included).
    pub(super) fn capacity(&self) -> usize {
        self.bytes.capacity() + self.encoded.capacity()
    }

    /// Whether a request for `conn` can join the batch (it is empty or goes there too).
    pub(super) fn fits(&self, conn: &UpstreamConn) -> bool {
        self.count == 0 || self.conn.as_ref().is_some_and(|c| c.same(conn))
    }

    /// Cluster mode: adds a request for `conn` (see [`Batch::fits`]), kept with its slot to
    /// follow a redirection.
    pub(super) fn push_routed(&mut self, conn: UpstreamConn, req: &[u8], slot: Option<u16>) {
        if self.count == 0 {
            self.conn = Some(conn);
        }
        let start = self.bytes.len();
        self.bytes.extend_from_slice(req);
        self.count += 1;
        self.cmds.push((start, self.bytes.len(), slot));
    }

    /// The next request added is a GET others wait for.
    pub(super) fn lead_next(&mut self, lead: Lead) {
        self.leads.push((self.count, lead));
    }

    /// A cache reply to the request after the batch's requests so far: written between
    /// their replies and those of requests added later.
    pub(super) fn interleave(&mut self, reply: Interleaved) {
        if self.interleaved.capacity() == 0 {
            self.interleaved.reserve(FIRST_INTERLEAVED);
        }
        self.interleaved.push((self.count, reply));
    }

    /// A cache hit, as [`Batch::interleave`]: a short one is encoded in `proto` now, and
    /// joins the hits right before it, if any, as one reply to copy.
    pub(super) fn interleave_hit(&mut self, v: Value, proto: Proto) {
        if !self.interleave_encoded(v.reply_len(), |out| v.encode(proto, out)) {
            self.interleave(Interleaved::Value(v));
        }
    }

    /// A cache hit's reply of about `len` bytes, encoded by `encode` as [`Batch::interleave_hit`]
    /// encodes a short one: false, and nothing encoded, if it is not short.
    #[inline]
    pub(super) fn interleave_encoded(
        &mut self,
        len: usize,
        encode: impl FnOnce(&mut BytesMut),
    ) -> bool {
        if len > ENCODE_AT_MOST {
            return false;
        }
        let start = self.encoded.len();
        if self.encoded.capacity() - start < ENCODE_AT_MOST + 64 {
            self.encoded.reserve(ENCODED_BLOCK);
        }
        encode(&mut self.encoded);
        let len = (self.encoded.len() - start) as u32;
        match self.interleaved.last_mut() {
            Some((before, Interleaved::Encoded { len: run })) if *before == self.count => {
                *run += len;
            }
            _ => self.interleave(Interleaved::Encoded { len }),
        }
        true
    }

    /// Whether a reply can be interleaved: the batch has requests, and its replies are
    /// exactly one frame per request (no reply skipped).
    pub(super) fn takes_interleaved(&self) -> bool {
        self.count > 0 && !self.skip_first
    }

    /// Empties the batch; `None` if there was nothing to send.
    pub(super) fn take(&mut self) -> Option<Taken> {
        if self.count == 0 {
            return None;
        }
        let bytes = self.bytes.split().freeze();
        let cmds = self
            .cmds
            .drain(..)
            .map(|(start, end, slot)| (bytes.slice(start..end), slot))
            .collect();
        Some(Taken {
            bytes,
            count: std::mem::take(&mut self.count),
            conn: self.conn.take(),
            cmds,
            leads: std::mem::take(&mut self.leads),
            interleaved: Between {
                replies: std::mem::take(&mut self.interleaved),
                encoded: self.encoded.split().freeze(),
            },
            script: std::mem::take(&mut self.script),
            script_keys: std::mem::take(&mut self.script_keys),
            skip_first: std::mem::take(&mut self.skip_first),
        })
    }
}

/// Completes the leading GETs of a batch from its replies, or from those of its replies that
/// start with the reply to request `first` (frame `i` answers request `first + i`; leads are
/// in batch order, each answered there). Leads nobody joined, nearly all of them, end
/// without their reply; the frames are scanned only for the others.
pub(super) fn share_leads(
    leads: impl IntoIterator<Item = (u32, Lead)>,
    replies: &JobResult,
    first: u32,
) {
    let mut joined = leads
        .into_iter()
        .filter_map(|(i, lead)| lead.finish_unjoined().map(|l| (i, l)))
        .peekable();
    if joined.peek().is_none() {
        return;
    }
    let mut frames = crate::resp::frames(replies.as_ref().map_or(&[][..], |b| &b[..]));
    let mut next = first;
    for (i, lead) in joined {
        let r = match replies {
            Ok(b) => {
                let frame = i
                    .checked_sub(next)
                    .and_then(|skip| frames.nth(skip as usize));
                next = i + 1;
                frame.map(|f| b.slice(f.start..f.end())).ok_or_else(|| {
                    crate::error::UpstreamError::BadReply {
                        cause: "missing reply in batch".into(),
                    }
                })
            }
            Err(e) => Err(e.clone()),
        };
        lead.complete(r);
    }
}

/// What shares a streamed batch's leading GETs (in batch order) with the reads that joined
/// them, each as soon as the part holding its reply arrives (see [`share_leads`]).
pub(super) fn lead_hook(mut leads: Vec<(u32, Lead)>) -> PartHook {
    // Requests answered by the parts so far.
    let mut answered = 0;
    Box::new(move |r: &JobResult, replies: u32| {
        let end = if r.is_ok() {
            answered + replies
        } else {
            u32::MAX
        };
        let now = leads.partition_point(|(i, _)| *i < end);
        if now > 0 {
            share_leads(leads.drain(..now), r, answered);
        }
        answered = end;
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(b: &Between) -> Vec<(u32, Option<u32>)> {
        b.replies
            .iter()
            .map(|(before, r)| match r {
                Interleaved::Encoded { len } => (*before, Some(*len)),
                _ => (*before, None),
            })
            .collect()
    }

    #[test]
    fn hits_in_a_row_are_one_encoded_run_and_large_ones_are_held() {
        let mut b = Batch::default();
        b.push(b"*2\r\n$3\r\nGET\r\n$1\r\na\r\n", None);
        b.interleave_hit(Value::bulk(b"x"), Proto::Resp2);
        b.interleave_hit(Value::Nil, Proto::Resp3);
        b.push(b"*2\r\n$3\r\nGET\r\n$1\r\nb\r\n", None);
        b.interleave_hit(Value::bulk(b"yy"), Proto::Resp2);
        b.interleave_hit(Value::bulk(&vec![b'z'; ENCODE_AT_MOST + 1]), Proto::Resp2);
        b.interleave_hit(Value::bulk(b"w"), Proto::Resp2);
        let Some(taken) = b.take() else {
            panic!("the batch had requests")
        };
        let between = taken.interleaved;
        assert_eq!(
            runs(&between),
            vec![(1, Some(7 + 3)), (2, Some(8)), (2, None), (2, Some(7))]
        );
        assert_eq!(
            &between.encoded[..],
            b"$1\r\nx\r\n_\r\n$2\r\nyy\r\n$1\r\nw\r\n"
        );
    }
}
