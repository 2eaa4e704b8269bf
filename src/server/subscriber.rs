//! A client's side of pub/sub: its subscriptions, and how messages and (un)subscribe
//! confirmations are encoded for it (the commands themselves are in `subscribe.rs`).

use std::collections::HashSet;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use crate::commands::PubSub;
use crate::pubsub::{Inbox, Kind, Message, Router};
use crate::resp::{Encoder, Proto};
use crate::upstream::UserLease;

/// A client's subscriptions and its message queue, registered with one hub (corral's, or a
/// Redis user's) until dropped.
#[derive(Debug)]
pub(super) struct Subscriptions {
    pub(super) rx: Inbox,
    /// The hub the subscriptions are made on, and the client's id there.
    pub(super) hub: Arc<Router>,
    id: u64,
    /// A Redis user's hub: the client's place in that user's pool, kept while subscribed there
    /// whoever the client authenticates as meanwhile.
    _lease: Option<UserLease>,
    channels: HashSet<Bytes>,
    patterns: HashSet<Bytes>,
    shards: HashSet<Bytes>,
}

impl Subscriptions {
    /// No subscriptions yet; messages arrive on `rx` from `hub`, where the client is `id`
    /// (holding `lease` on a Redis user's hub).
    pub(super) fn new(
        rx: Inbox,
        hub: Arc<Router>,
        id: u64,
        lease: Option<UserLease>,
    ) -> Subscriptions {
        Subscriptions {
            rx,
            hub,
            id,
            _lease: lease,
            channels: HashSet::new(),
            patterns: HashSet::new(),
            shards: HashSet::new(),
        }
    }

    pub(super) fn set(&mut self, kind: Kind) -> &mut HashSet<Bytes> {
        match kind {
            Kind::Channel => &mut self.channels,
            Kind::Pattern => &mut self.patterns,
            Kind::Shard => &mut self.shards,
        }
    }

    /// The count Redis reports after a (un)subscribe of this kind: shard channels are
    /// counted apart from channels and patterns.
    pub(super) fn count(&self, kind: Kind) -> usize {
        match kind {
            Kind::Shard => self.shards.len(),
            _ => self.channels.len() + self.patterns.len(),
        }
    }

    /// (channels, patterns, shard channels), as CLIENT LIST shows them.
    pub(super) fn counts(&self) -> (usize, usize, usize) {
        (self.channels.len(), self.patterns.len(), self.shards.len())
    }

    /// Whether the client is still subscribed to what `msg` came for.
    pub(super) fn wants(&self, msg: &Message) -> bool {
        match msg {
            Message::Message { channel, .. } => self.channels.contains(channel),
            Message::PMessage { pattern, .. } => self.patterns.contains(pattern),
            Message::SMessage { channel, .. } => self.shards.contains(channel),
        }
    }

    /// Any subscription at all.
    pub(super) fn active(&self) -> bool {
        !(self.channels.is_empty() && self.patterns.is_empty() && self.shards.is_empty())
    }
}

impl Drop for Subscriptions {
    /// The client leaves its hub (a second removal, after RESET's, finds nothing).
    fn drop(&mut self) {
        drop(self.hub.remove(self.id));
    }
}

/// Encodes a pub/sub message for a client: a push in RESP3, an array in RESP2.
pub(super) fn encode_message(msg: &Message, proto: Proto, out: &mut BytesMut) {
    let header = |n: usize, out: &mut BytesMut| {
        out.extend_from_slice(if proto == Proto::Resp3 { b">" } else { b"*" });
        out.extend_from_slice(itoa::Buffer::new().format(n).as_bytes());
        out.extend_from_slice(b"\r\n");
    };
    let (kind, pattern, channel, payload): (&[u8], _, _, _) = match msg {
        Message::Message { channel, payload } => (b"message", None, channel, payload),
        Message::PMessage {
            pattern,
            channel,
            payload,
        } => (b"pmessage", Some(pattern), channel, payload),
        Message::SMessage { channel, payload } => (b"smessage", None, channel, payload),
    };
    header(3 + usize::from(pattern.is_some()), out);
    let mut e = Encoder { proto, out };
    e.bulk(kind);
    if let Some(pattern) = pattern {
        e.bulk(pattern);
    }
    e.bulk(channel);
    e.bulk(payload);
}

/// One `subscribe name count`-style reply.
pub(super) fn confirmation(
    verb: &[u8],
    name: Option<&[u8]>,
    count: usize,
    proto: Proto,
    out: &mut BytesMut,
) {
    out.extend_from_slice(if proto == Proto::Resp3 {
        b">3\r\n"
    } else {
        b"*3\r\n"
    });
    let mut e = Encoder { proto, out };
    e.bulk(verb);
    match name {
        Some(n) => e.bulk(n),
        None => e.null(),
    }
    e.int(count as i64);
}

/// The kind and reply verb of a pub/sub command, and whether it subscribes.
pub(super) fn describe(cmd: PubSub) -> (Kind, &'static [u8], bool) {
    match cmd {
        PubSub::Subscribe => (Kind::Channel, b"subscribe", true),
        PubSub::PSubscribe => (Kind::Pattern, b"psubscribe", true),
        PubSub::SSubscribe => (Kind::Shard, b"ssubscribe", true),
        PubSub::Unsubscribe => (Kind::Channel, b"unsubscribe", false),
        PubSub::PUnsubscribe => (Kind::Pattern, b"punsubscribe", false),
        PubSub::SUnsubscribe => (Kind::Shard, b"sunsubscribe", false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_pushes_in_resp3_and_arrays_in_resp2() {
        let msg = Message::Message {
            channel: Bytes::from_static(b"ch"),
            payload: Bytes::from_static(b"hi"),
        };
        let mut out = BytesMut::new();
        encode_message(&msg, Proto::Resp2, &mut out);
        assert_eq!(&out[..], b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$2\r\nhi\r\n");
        out.clear();
        encode_message(&msg, Proto::Resp3, &mut out);
        assert_eq!(&out[..], b">3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$2\r\nhi\r\n");
    }

    #[test]
    fn unsubscribe_without_subscriptions_names_nil() {
        let mut out = BytesMut::new();
        confirmation(b"unsubscribe", None, 0, Proto::Resp2, &mut out);
        assert_eq!(&out[..], b"*3\r\n$11\r\nunsubscribe\r\n$-1\r\n:0\r\n");
    }
}
