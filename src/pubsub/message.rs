//! The values subscriptions are made of: the namespace of a subscription, a message for a
//! subscriber, and a subscriber handed from one hub to another.

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// The three subscription namespaces of Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// SUBSCRIBE: exact channel names.
    Channel,
    /// PSUBSCRIBE: glob patterns.
    Pattern,
    /// SSUBSCRIBE: shard channels.
    Shard,
}

impl Kind {
    pub(super) fn subscribe_cmd(self) -> &'static [u8] {
        match self {
            Kind::Channel => b"SUBSCRIBE",
            Kind::Pattern => b"PSUBSCRIBE",
            Kind::Shard => b"SSUBSCRIBE",
        }
    }

    pub(super) fn unsubscribe_cmd(self) -> &'static [u8] {
        match self {
            Kind::Channel => b"UNSUBSCRIBE",
            Kind::Pattern => b"PUNSUBSCRIBE",
            Kind::Shard => b"SUNSUBSCRIBE",
        }
    }
}

/// A message for one subscriber, as Redis would send it (without the protocol framing).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// `message channel payload`
    Message {
        /// Channel.
        channel: Bytes,
        /// Payload.
        payload: Bytes,
    },
    /// `pmessage pattern channel payload`
    PMessage {
        /// The pattern that matched.
        pattern: Bytes,
        /// Channel.
        channel: Bytes,
        /// Payload.
        payload: Bytes,
    },
    /// `smessage channel payload`
    SMessage {
        /// Shard channel.
        channel: Bytes,
        /// Payload.
        payload: Bytes,
    },
}

/// A subscriber moved from one hub to another.
#[derive(Debug)]
pub struct Handoff {
    /// Client id.
    pub id: u64,
    /// Its message queue.
    pub tx: mpsc::Sender<Arc<Message>>,
    /// Its disconnect token.
    pub kill: CancellationToken,
}

/// Messages queued per subscriber before it counts as too slow.
pub const QUEUE: usize = 4096;
