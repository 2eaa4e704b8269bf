//! Shared subscriptions: however many clients subscribe to a channel, corral subscribes once
//! upstream and fans each message out. One RESP3 connection carries every subscription; its
//! push frames (confirmations and messages) are handled on that connection's task.
//!
//! Subscribers register a bounded queue; a subscriber that falls behind by more than its
//! queue is disconnected, as Redis disconnects pub/sub clients over their output buffer limit.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::{Bytes, BytesMut};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::resp::request::encode_request;
use crate::upstream::{ConnSettings, LinkObserver, ReplyTo, UpstreamConn, UpstreamStatus};

mod router;
pub use router::Router;

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
    fn subscribe_cmd(self) -> &'static [u8] {
        match self {
            Kind::Channel => b"SUBSCRIBE",
            Kind::Pattern => b"PSUBSCRIBE",
            Kind::Shard => b"SSUBSCRIBE",
        }
    }

    fn unsubscribe_cmd(self) -> &'static [u8] {
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

#[derive(Debug, Default)]
struct Topic {
    subscribers: HashSet<u64>,
    confirmed: bool,
    waiters: Vec<oneshot::Sender<()>>,
}

#[derive(Debug)]
struct Subscriber {
    tx: mpsc::Sender<Arc<Message>>,
    kill: CancellationToken,
    topics: HashSet<(Kind, Bytes)>,
}

#[derive(Debug, Default)]
struct State {
    topics: HashMap<(Kind, Bytes), Topic>,
    subscribers: HashMap<u64, Subscriber>,
}

#[derive(Debug, Default)]
struct Inner {
    state: Mutex<State>,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The subscription hub.
#[derive(Debug)]
pub struct Hub {
    inner: Arc<Inner>,
    conn: UpstreamConn,
}

impl Hub {
    /// Starts the hub's upstream connection.
    pub fn start(
        settings: ConnSettings,
        status: Arc<UpstreamStatus>,
        shutdown: CancellationToken,
    ) -> Hub {
        Hub::start_with(settings, status, shutdown, None)
    }

    /// Like [`Hub::start`]; `moved` receives the shard channels the server dropped on its own
    /// (`sunsubscribe` pushes after its slot moved away), to be subscribed elsewhere.
    pub fn start_with(
        settings: ConnSettings,
        status: Arc<UpstreamStatus>,
        shutdown: CancellationToken,
        moved: Option<mpsc::UnboundedSender<Bytes>>,
    ) -> Hub {
        let inner = Arc::new(Inner::default());
        let settings = ConnSettings {
            proto: crate::resp::Proto::Resp3,
            tracking: false,
            reconnect: true,
            ..settings
        };
        let (ups_tx, ups_rx) = mpsc::channel(1);
        let observer: Arc<dyn LinkObserver> = Arc::new(Observer {
            inner: inner.clone(),
            ups: ups_tx,
            moved,
        });
        let conn = UpstreamConn::spawn(settings, status, shutdown, Some(observer));
        tokio::spawn(resubscribe(inner.clone(), conn.clone(), ups_rx));
        Hub { inner, conn }
    }

    /// Registers a client's message queue; `kill` disconnects it if it falls behind.
    pub fn register(&self, id: u64, tx: mpsc::Sender<Arc<Message>>, kill: CancellationToken) {
        let sub = Subscriber {
            tx,
            kill,
            topics: HashSet::new(),
        };
        self.inner.lock().subscribers.insert(id, sub);
    }

    /// Subscribes client `id` to `name`. Returns a receiver that fires once Redis has
    /// confirmed the upstream subscription, or `None` when it already had.
    pub fn subscribe(&self, id: u64, kind: Kind, name: &[u8]) -> Option<oneshot::Receiver<()>> {
        let mut state = self.inner.lock();
        let key = (kind, Bytes::copy_from_slice(name));
        if let Some(sub) = state.subscribers.get_mut(&id) {
            sub.topics.insert(key.clone());
        }
        let topic = state.topics.entry(key).or_default();
        let first = topic.subscribers.is_empty() && !topic.confirmed && topic.waiters.is_empty();
        topic.subscribers.insert(id);
        if topic.confirmed {
            return None;
        }
        let (tx, rx) = oneshot::channel();
        topic.waiters.push(tx);
        drop(state);
        if first {
            self.send(kind.subscribe_cmd(), name);
        }
        Some(rx)
    }

    /// Unsubscribes client `id` from `name`; the upstream subscription ends with its last
    /// subscriber.
    pub fn unsubscribe(&self, id: u64, kind: Kind, name: &[u8]) {
        let mut state = self.inner.lock();
        let key = (kind, Bytes::copy_from_slice(name));
        if let Some(sub) = state.subscribers.get_mut(&id) {
            sub.topics.remove(&key);
        }
        let Some(topic) = state.topics.get_mut(&key) else {
            return;
        };
        topic.subscribers.remove(&id);
        if topic.subscribers.is_empty() {
            state.topics.remove(&key);
            drop(state);
            self.send(kind.unsubscribe_cmd(), name);
        }
    }

    /// Forgets a client entirely (it disconnected or sent RESET).
    pub fn remove(&self, id: u64) {
        let topics = match self.inner.lock().subscribers.get(&id) {
            Some(sub) => sub.topics.iter().cloned().collect::<Vec<_>>(),
            None => return,
        };
        for (kind, name) in topics {
            self.unsubscribe(id, kind, &name);
        }
        self.inner.lock().subscribers.remove(&id);
    }

    /// Removes a topic (its upstream subscription is gone) and returns its subscribers with
    /// their queues, to subscribe them elsewhere.
    pub fn take_topic(&self, kind: Kind, name: &[u8]) -> Vec<Handoff> {
        let mut state = self.inner.lock();
        let key = (kind, Bytes::copy_from_slice(name));
        let Some(topic) = state.topics.remove(&key) else {
            return Vec::new();
        };
        topic
            .subscribers
            .iter()
            .filter_map(|id| {
                let sub = state.subscribers.get_mut(id)?;
                sub.topics.remove(&key);
                Some(Handoff {
                    id: *id,
                    tx: sub.tx.clone(),
                    kill: sub.kill.clone(),
                })
            })
            .collect()
    }

    /// Whether client `id` has a queue registered here.
    pub fn is_registered(&self, id: u64) -> bool {
        self.inner.lock().subscribers.contains_key(&id)
    }

    /// Upstream subscriptions now (for INFO).
    pub fn upstream_subscriptions(&self) -> usize {
        self.inner.lock().topics.len()
    }

    fn send(&self, cmd: &[u8], name: &[u8]) {
        let mut req = BytesMut::new();
        encode_request(&[cmd, name], &mut req);
        // In RESP3 the answers are push frames, handled by the observer: no reply to wait for.
        self.conn
            .try_send_to(req.freeze(), 0, ReplyTo::Call(Box::new(|_| {})));
    }
}

/// Handles the hub connection's push frames and reconnects.
#[derive(Debug)]
struct Observer {
    inner: Arc<Inner>,
    /// Wakes the task that resends subscriptions after a reconnect.
    ups: mpsc::Sender<()>,
    /// Where shard channels the server dropped by itself are reported.
    moved: Option<mpsc::UnboundedSender<Bytes>>,
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
        let _ = self.ups.try_send(());
    }

    fn down(&self, _cause: &str) {}

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
            // Sent by the server itself when the channel's slot moved to another node (a
            // SUNSUBSCRIBE of ours removed the topic before it was sent).
            b"sunsubscribe" => {
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
                if let (Some(channel), Some(payload)) = (text(1), text(2)) {
                    let key = (Kind::Channel, channel.clone());
                    self.deliver(&key, Message::Message { channel, payload });
                }
            }
            b"pmessage" => {
                if let (Some(pattern), Some(channel), Some(payload)) = (text(1), text(2), text(3)) {
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

    fn deliver(&self, key: &(Kind, Bytes), msg: Message) {
        let state = self.inner.lock();
        // Until Redis confirms the subscription, a message on this stream belongs to an
        // earlier subscription of the same name (its UNSUBSCRIBE still in flight): Redis
        // would not deliver it to a client that subscribed after it was published.
        let Some(topic) = state.topics.get(key).filter(|t| t.confirmed) else {
            return;
        };
        let msg = Arc::new(msg);
        for id in &topic.subscribers {
            if let Some(sub) = state.subscribers.get(id)
                && !sub.kill.is_cancelled()
                && sub.tx.try_send(msg.clone()).is_err()
            {
                warn!(client = id, "pub/sub client too slow, disconnecting");
                sub.kill.cancel();
            }
        }
    }
}

/// Resends every live subscription; called by the hub after its connection came back.
async fn resubscribe(inner: Arc<Inner>, conn: UpstreamConn, mut ups: mpsc::Receiver<()>) {
    while ups.recv().await.is_some() {
        let topics: Vec<(Kind, Bytes)> = inner.lock().topics.keys().cloned().collect();
        for (kind, name) in topics {
            let mut req = BytesMut::new();
            encode_request(&[kind.subscribe_cmd(), &name], &mut req);
            conn.send_to(req.freeze(), 0, ReplyTo::Call(Box::new(|_| {})))
                .await;
        }
    }
}
