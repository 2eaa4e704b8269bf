//! The values subscriptions are made of: the namespace of a subscription, a message for a
//! subscriber, and a subscriber handed from one hub to another.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

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

impl Message {
    /// About the bytes it takes to send: what a subscriber's queue counts against
    /// [`QUEUE_BYTES`].
    fn size(&self) -> usize {
        const FRAMING: usize = 48;
        FRAMING
            + match self {
                Message::Message { channel, payload } | Message::SMessage { channel, payload } => {
                    channel.len() + payload.len()
                }
                Message::PMessage {
                    pattern,
                    channel,
                    payload,
                } => pattern.len() + channel.len() + payload.len(),
            }
    }
}

/// A subscriber moved from one hub to another.
#[derive(Debug)]
pub struct Handoff {
    /// Client id.
    pub id: u64,
    /// Its message queue.
    pub tx: Outbox,
    /// Its disconnect token.
    pub kill: CancellationToken,
}

/// Most bytes of messages queued for one subscriber (about what they take to send) before it
/// counts as too slow and is disconnected: the hard limit Redis gives pub/sub clients by
/// default (`client-output-buffer-limit pubsub 32mb 8mb 60`). Counted in bytes, not
/// messages, so that a subscriber reading a burst of small messages is not cut off.
pub const QUEUE_BYTES: usize = 32 * 1024 * 1024;

/// A new subscriber's message queue: the side the hubs send on, and the client's.
pub fn queue() -> (Outbox, Inbox) {
    let (tx, rx) = mpsc::unbounded_channel();
    let queued = Arc::new(AtomicUsize::new(0));
    (
        Outbox {
            tx,
            queued: queued.clone(),
        },
        Inbox { rx, queued },
    )
}

/// Where the hubs queue a subscriber's messages, up to [`QUEUE_BYTES`].
#[derive(Debug, Clone)]
pub struct Outbox {
    tx: mpsc::UnboundedSender<Arc<Message>>,
    queued: Arc<AtomicUsize>,
}

impl Outbox {
    /// Queues `msg`; false, with nothing queued, when that would take the subscriber past
    /// [`QUEUE_BYTES`] (or it is gone).
    pub fn push(&self, msg: &Arc<Message>) -> bool {
        let size = msg.size();
        if self.queued.fetch_add(size, Ordering::Relaxed) + size > QUEUE_BYTES
            || self.tx.send(msg.clone()).is_err()
        {
            self.queued.fetch_sub(size, Ordering::Relaxed);
            return false;
        }
        true
    }
}

/// A subscriber's queued messages, read by its connection.
#[derive(Debug)]
pub struct Inbox {
    rx: mpsc::UnboundedReceiver<Arc<Message>>,
    queued: Arc<AtomicUsize>,
}

impl Inbox {
    /// The next message, once one is queued; `None` once no hub can send any more.
    pub async fn recv(&mut self) -> Option<Arc<Message>> {
        let msg = self.rx.recv().await?;
        self.queued.fetch_sub(msg.size(), Ordering::Relaxed);
        Some(msg)
    }

    /// The next message if one is queued now.
    pub fn try_recv(&mut self) -> Option<Arc<Message>> {
        let msg = self.rx.try_recv().ok()?;
        self.queued.fetch_sub(msg.size(), Ordering::Relaxed);
        Some(msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_holds_up_to_its_bytes_and_each_message_read_makes_room() {
        let (tx, mut rx) = queue();
        let msg = Arc::new(Message::Message {
            channel: Bytes::from_static(b"c"),
            payload: Bytes::from(vec![b'p'; 1 << 20]),
        });
        let mut queued = 0;
        while tx.push(&msg) {
            queued += 1;
        }
        assert_eq!(queued, QUEUE_BYTES / msg.size());
        assert!(rx.try_recv().is_some());
        assert!(tx.push(&msg), "room for one again");
        assert!(!tx.push(&msg));
        let (tx, rx) = queue();
        drop(rx);
        assert!(!tx.push(&msg), "nobody reads any more");
        assert_eq!(tx.queued.load(Ordering::Relaxed), 0);
    }
}
