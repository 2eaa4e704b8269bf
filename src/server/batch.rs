//! The forwarded requests of a round not yet handed to the upstream: consecutive requests
//! for one upstream connection travel as one job.

use bytes::{Bytes, BytesMut};

use super::pending::Interleaved;
use crate::cache::Lead;
use crate::upstream::UpstreamConn;

/// Requests waiting to be sent together, and what their replies need.
#[derive(Default)]
pub(super) struct Batch {
    bytes: BytesMut,
    count: u32,
    conn: Option<UpstreamConn>,
    /// Cluster mode: each request and its slot, to retry after a redirection.
    cmds: Vec<(Bytes, Option<u16>)>,
    /// GETs in the batch that other clients' GETs wait for: (position in the batch, lead).
    leads: Vec<(u32, Lead)>,
    /// Cache replies between its requests: (forwarded requests before it, reply).
    interleaved: Vec<(u32, Interleaved)>,
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
    pub(super) interleaved: Vec<(u32, Interleaved)>,
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
    /// only (see [`Batch::is_empty`]).
    pub(super) fn push(&mut self, bytes: &[u8], conn: Option<UpstreamConn>) {
        if self.count == 0 {
            self.conn = conn;
        }
        self.bytes.extend_from_slice(bytes);
        self.count += 1;
    }

    /// Whether a request for `conn` can join the batch (it is empty or goes there too).
    pub(super) fn fits(&self, conn: &UpstreamConn) -> bool {
        self.count == 0 || self.conn.as_ref().is_some_and(|c| c.same(conn))
    }

    /// Cluster mode: adds a request for `conn` (see [`Batch::fits`]), kept with its slot to
    /// follow a redirection.
    pub(super) fn push_routed(&mut self, conn: UpstreamConn, req: Bytes, slot: Option<u16>) {
        if self.count == 0 {
            self.conn = Some(conn);
        }
        self.bytes.extend_from_slice(&req);
        self.count += 1;
        self.cmds.push((req, slot));
    }

    /// The next request added is a GET others wait for.
    pub(super) fn lead_next(&mut self, lead: Lead) {
        self.leads.push((self.count, lead));
    }

    /// A cache reply to the request after the batch's requests so far: written between
    /// their replies and those of requests added later.
    pub(super) fn interleave(&mut self, reply: Interleaved) {
        self.interleaved.push((self.count, reply));
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
        Some(Taken {
            bytes: self.bytes.split().freeze(),
            count: std::mem::take(&mut self.count),
            conn: self.conn.take(),
            cmds: std::mem::take(&mut self.cmds),
            leads: std::mem::take(&mut self.leads),
            interleaved: std::mem::take(&mut self.interleaved),
            script: std::mem::take(&mut self.script),
            script_keys: std::mem::take(&mut self.script_keys),
            skip_first: std::mem::take(&mut self.skip_first),
        })
    }
}
