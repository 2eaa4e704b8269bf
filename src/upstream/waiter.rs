//! A job on a live connection whose replies are still arriving ([`Waiter`]), and how they
//! are handed over: whole, or (a streamed job's) in parts.

use bytes::BytesMut;
use tokio::time::Instant;

use super::job::{JobResult, LinkObserver, ReplyTo, Rest};

/// A job whose replies are still arriving.
pub(super) struct Waiter {
    pub(super) remaining: u32,
    pub(super) reply: ReplyTo,
    /// Replies already received, when a push frame split them (never on shared connections in
    /// practice, since they do not subscribe or track).
    pub(super) partial: BytesMut,
    /// corral's own health check (HELLO, or PING before Redis 6): its reply is consumed here,
    /// never handed to a client.
    pub(super) probe: bool,
    /// When it was queued for writing, or (the oldest waiter) when replies last arrived, to
    /// time it out (see `Link::request_timeout`).
    pub(super) since: Instant,
    /// Where the rest of its replies go, once a first part of them was handed over (see
    /// [`ReplyTo::Streamed`]).
    rest: Option<Rest>,
    /// Replies received and not handed over yet.
    pub(super) unsent: u32,
}

impl Waiter {
    /// A job of `count` requests queued at `since`, its replies going to `reply`.
    pub(super) fn new(count: u32, reply: ReplyTo, since: Instant) -> Waiter {
        Waiter {
            remaining: count,
            reply,
            partial: BytesMut::new(),
            probe: false,
            since,
            rest: None,
            unsent: 0,
        }
    }

    /// corral's own health check, sent at `since`.
    pub(super) fn probe(since: Instant) -> Waiter {
        Waiter {
            probe: true,
            ..Waiter::new(1, ReplyTo::Call(Box::new(drop)), since)
        }
    }

    /// Whether its replies may go over in parts.
    pub(super) fn streams(&self) -> bool {
        self.rest.is_some() || self.reply.streams()
    }

    /// Hands over `part`, its whole replies received so far, while more are to come (see
    /// [`Waiter::streams`]).
    pub(super) fn hand_part(&mut self, observer: Option<&dyn LinkObserver>, part: BytesMut) {
        let part = self.with_pending(observer, part).freeze();
        let replies = std::mem::take(&mut self.unsent);
        match &mut self.rest {
            Some(rest) => rest.send(Ok(part), replies),
            None => self.rest = self.reply.start_parts(part, replies).ok(),
        }
    }

    /// Hands over `r`, the last of its replies (the `unsent` ones) or the error that ends
    /// them.
    pub(super) fn finish(self, r: JobResult) {
        let replies = if r.is_ok() { self.unsent } else { 0 };
        match self.rest {
            Some(mut rest) => rest.send(r, replies),
            None => self.reply.send_replies(r, replies),
        }
    }

    /// `bytes`, replies of its own, after what comes before them: pushes the observer kept
    /// while no job was in flight, and replies a push split off (`partial`, taken).
    pub(super) fn with_pending(
        &mut self,
        observer: Option<&dyn LinkObserver>,
        bytes: BytesMut,
    ) -> BytesMut {
        let mut all = BytesMut::new();
        if let Some(o) = observer {
            o.take_pending(&mut all);
        }
        if self.partial.is_empty() && all.is_empty() {
            return bytes;
        }
        all.extend_from_slice(&self.partial);
        self.partial.clear();
        all.extend_from_slice(&bytes);
        all
    }
}
