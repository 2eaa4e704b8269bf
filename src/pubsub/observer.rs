//! The hub connection's push frames: subscription confirmations wake the clients waiting for
//! them, messages go to every subscriber's queue (a subscriber that falls behind is
//! disconnected), and a reconnect has every subscription sent again.

use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::mpsc;
use tracing::{debug, warn};

use super::message::{Kind, Message};
use super::notify::Filter;
use super::state::Inner;
use crate::upstream::LinkObserver;

/// Handles the hub connection's push frames and reconnects.
#[derive(Debug)]
pub(super) struct Observer {
    inner: Arc<Inner>,
    /// Wakes the task that resends subscriptions after a reconnect.
    ups: mpsc::Sender<()>,
    /// Where shard channels the server dropped by itself are reported.
    moved: Option<mpsc::UnboundedSender<Bytes>>,
    /// Which messages are passed on (see `notify.rs`).
    filter: Filter,
}

impl LinkObserver for Observer {
    fn up(&self, _tracking: bool) {
        // Subscriptions do not survive a reconnect: mark them unconfirmed and have them sent
        // again. Messages published while the connection was down are lost, as they would be
        // for a client of a restarted Redis.
        let mut state = self.inner.lock();
        for topic in state.topics.values_mut() {
            topic.confirmed = false;
        }
        state.release_unsubscribes();
        let _ = self.ups.try_send(());
    }

    fn down(&self, _cause: &str) {
        self.inner.lock().release_unsubscribes();
    }

    fn push(&self, frame: &[u8]) {
        use redis_protocol::resp3::types::BytesFrame as F;
        let bytes = Bytes::copy_from_slice(frame);
        let Ok(Some((F::Push { data, .. }, _))) =
            redis_protocol::resp3::decode::complete::decode_bytes(&bytes)
        else {
            debug!("undecodable push on the pub/sub connection");
            return;
        };
        let blob = |f: &F| match f {
            F::BlobString { data, .. } | F::SimpleString { data, .. } => Some(data.clone()),
            _ => None,
        };
        let parts: Vec<Option<Bytes>> = data.iter().map(blob).collect();
        let text = |i: usize| parts.get(i).cloned().flatten();
        let Some(kind) = text(0) else {
            return;
        };
        match &kind[..] {
            b"subscribe" => self.confirm(Kind::Channel, text(1)),
            b"psubscribe" => self.confirm(Kind::Pattern, text(1)),
            b"ssubscribe" => self.confirm(Kind::Shard, text(1)),
            b"unsubscribe" => {
                self.unsubscribed(Kind::Channel, text(1));
            }
            b"punsubscribe" => {
                self.unsubscribed(Kind::Pattern, text(1));
            }
            // Ours, or sent by the server itself when the channel's slot moved to another
            // node (a SUNSUBSCRIBE of ours removed the topic before it was sent).
            b"sunsubscribe" => {
                if self.unsubscribed(Kind::Shard, text(1)) {
                    return;
                }
                if let (Some(name), Some(moved)) = (text(1), &self.moved)
                    && self
                        .inner
                        .lock()
                        .topics
                        .contains_key(&(Kind::Shard, name.clone()))
                {
                    let _ = moved.send(name);
                }
            }
            b"message" => {
                if let (Some(channel), Some(payload)) = (text(1), text(2))
                    && self.filter.passes(&channel)
                {
                    let key = (Kind::Channel, channel.clone());
                    self.deliver(&key, Message::Message { channel, payload });
                }
            }
            b"pmessage" => {
                if let (Some(pattern), Some(channel), Some(payload)) = (text(1), text(2), text(3))
                    && self.filter.passes(&channel)
                {
                    let key = (Kind::Pattern, pattern.clone());
                    let msg = Message::PMessage {
                        pattern,
                        channel,
                        payload,
                    };
                    self.deliver(&key, msg);
                }
            }
            b"smessage" => {
                if let (Some(channel), Some(payload)) = (text(1), text(2)) {
                    let key = (Kind::Shard, channel.clone());
                    self.deliver(&key, Message::SMessage { channel, payload });
                }
            }
            _ => {}
        }
    }
}

impl Observer {
    pub(super) fn new(
        inner: Arc<Inner>,
        ups: mpsc::Sender<()>,
        moved: Option<mpsc::UnboundedSender<Bytes>>,
        filter: Filter,
    ) -> Observer {
        Observer {
            inner,
            ups,
            moved,
            filter,
        }
    }

    fn confirm(&self, kind: Kind, name: Option<Bytes>) {
        let Some(name) = name else { return };
        let mut state = self.inner.lock();
        if let Some(topic) = state.topics.get_mut(&(kind, name)) {
            topic.confirmed = true;
            for w in topic.waiters.drain(..) {
                let _ = w.send(());
            }
        }
    }

    /// Redis confirmed an UNSUBSCRIBE; false if none of ours was waiting for it.
    fn unsubscribed(&self, kind: Kind, name: Option<Bytes>) -> bool {
        match name {
            Some(name) => self.inner.confirm_unsubscribe(&(kind, name)),
            None => false,
        }
    }

    fn deliver(&self, key: &(Kind, Bytes), msg: Message) {
        let state = self.inner.lock();
        // Until Redis confirms the subscription, a message on this stream belongs to an
        // earlier subscription of the same name (its UNSUBSCRIBE still in flight): Redis
        // would not deliver it to a client that subscribed after it was published. Those
        // whose unsubscribe ended such an earlier one get it (see `State::unsubscribing`).
        let topic = state.topics.get(key).filter(|t| t.confirmed);
        let leaving = state.unsubscribing.get(key);
        if topic.is_none() && leaving.is_none_or(|q| q.is_empty()) {
            return;
        }
        let msg = Arc::new(msg);
        // And those that left a topic others keep, until their PING is back (one that has
        // subscribed again meanwhile is among the subscribers already).
        let parting = state
            .parting
            .get(key)
            .into_iter()
            .flatten()
            .filter(|id| !topic.is_some_and(|t| t.subscribers.contains(id)));
        let ids = topic
            .into_iter()
            .flat_map(|t| t.subscribers.iter())
            .chain(leaving.into_iter().flatten().map(|(_, id)| id))
            .chain(parting);
        for id in ids {
            if let Some(sub) = state.subscribers.get(id)
                && !sub.kill.is_cancelled()
                && !sub.tx.push(&msg)
            {
                warn!(client = id, "pub/sub client too slow, disconnecting");
                sub.kill.cancel();
            }
        }
    }
}
