//! Shared subscriptions: however many clients subscribe to a channel, corral subscribes once
//! upstream and fans each message out. One RESP3 connection carries every subscription; its
//! push frames (confirmations and messages) are handled on that connection's task.
//!
//! Subscribers register a bounded queue; a subscriber that falls behind by more than its
//! queue is disconnected, as Redis disconnects pub/sub clients over their output buffer limit.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::{Bytes, BytesMut};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use crate::resp::request::encode_request;
use crate::upstream::{ConnSettings, LinkObserver, ReplyTo, UpstreamConn, UpstreamStatus};

pub(crate) mod glob;
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
    /// Upstream UNSUBSCRIBEs sent and not yet confirmed, per topic, in the order sent: each
    /// confirmation wakes the client whose unsubscribe ended the topic. Until then Redis
    /// still counts corral as a subscriber.
    unsubscribing: HashMap<(Kind, Bytes), VecDeque<oneshot::Sender<()>>>,
}

impl State {
    /// Whether Redis counts corral as subscribed to `key` now, as far as corral knows.
    fn upstream_has(&self, key: &(Kind, Bytes)) -> bool {
        self.topics.contains_key(key) || self.unsubscribing.get(key).is_some_and(|q| !q.is_empty())
    }

    /// Releases every client waiting for an upstream unsubscribe: the connection is gone,
    /// and Redis dropped its subscriptions with it.
    fn release_unsubscribes(&mut self) {
        for (_, q) in self.unsubscribing.drain() {
            for w in q {
                let _ = w.send(());
            }
        }
    }
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
            gather: false,
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
    /// subscriber. Returns a receiver that fires once Redis has confirmed that end, or `None`
    /// when the upstream subscription stays: after the client saw its confirmation, PUBLISH
    /// no longer counts corral for it.
    pub fn unsubscribe(&self, id: u64, kind: Kind, name: &[u8]) -> Option<oneshot::Receiver<()>> {
        let mut state = self.inner.lock();
        let key = (kind, Bytes::copy_from_slice(name));
        if let Some(sub) = state.subscribers.get_mut(&id) {
            sub.topics.remove(&key);
        }
        let topic = state.topics.get_mut(&key)?;
        topic.subscribers.remove(&id);
        if !topic.subscribers.is_empty() {
            return None;
        }
        state.topics.remove(&key);
        let (tx, rx) = oneshot::channel();
        state
            .unsubscribing
            .entry(key.clone())
            .or_default()
            .push_back(tx);
        drop(state);
        let mut req = BytesMut::new();
        encode_request(&[kind.unsubscribe_cmd(), name], &mut req);
        let inner = self.inner.clone();
        // Not sent (queue full, connection closed): no confirmation will come.
        let failed = move |r: crate::upstream::JobResult| {
            if r.is_err() {
                confirm_unsubscribe(&inner, &key);
            }
        };
        self.conn
            .try_send_to(req.freeze(), 0, ReplyTo::Call(Box::new(failed)));
        Some(rx)
    }

    /// How far Redis's count of receivers for a message on `channel` is from the count a
    /// client of corral should see: corral's own subscribers that would get it minus corral's
    /// upstream subscriptions that Redis counted (one per matching channel or pattern).
    /// PUBLISH (`Kind::Channel`) counts pattern subscribers too, as Redis does; with
    /// `patterns` false only the channel itself counts (PUBSUB NUMSUB).
    pub fn count_delta(&self, kind: Kind, channel: &[u8], patterns: bool) -> i64 {
        let state = self.inner.lock();
        let key = (kind, Bytes::copy_from_slice(channel));
        let mut delta = 0i64;
        let mut count = |key: &(Kind, Bytes)| {
            if let Some(t) = state.topics.get(key) {
                delta += t.subscribers.len() as i64;
            }
            if state.upstream_has(key) {
                delta -= 1;
            }
        };
        count(&key);
        if patterns && kind == Kind::Channel {
            let matching: Vec<&(Kind, Bytes)> = state
                .topics
                .keys()
                .chain(state.unsubscribing.keys())
                .filter(|(k, p)| *k == Kind::Pattern && glob::matches(p, channel))
                .collect::<HashSet<_>>()
                .into_iter()
                .collect();
            for key in matching {
                count(key);
            }
        }
        delta
    }

    /// No subscription at all, upstream or pending: Redis's counts need no correction.
    pub fn is_idle(&self) -> bool {
        let state = self.inner.lock();
        state.topics.is_empty() && state.unsubscribing.values().all(VecDeque::is_empty)
    }

    /// Forgets a client entirely (it disconnected or sent RESET). Returns the confirmations
    /// of the upstream subscriptions this ended (see [`Hub::unsubscribe`]).
    pub fn remove(&self, id: u64) -> Vec<oneshot::Receiver<()>> {
        let topics = match self.inner.lock().subscribers.get(&id) {
            Some(sub) => sub.topics.iter().cloned().collect::<Vec<_>>(),
            None => return Vec::new(),
        };
        let waits = topics
            .into_iter()
            .filter_map(|(kind, name)| self.unsubscribe(id, kind, &name))
            .collect();
        self.inner.lock().subscribers.remove(&id);
        waits
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

    /// Redis confirmed an UNSUBSCRIBE; false if none of ours was waiting for it.
    fn unsubscribed(&self, kind: Kind, name: Option<Bytes>) -> bool {
        match name {
            Some(name) => confirm_unsubscribe(&self.inner, &(kind, name)),
            None => false,
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

/// Wakes the client waiting for the oldest unconfirmed UNSUBSCRIBE of `key`; false if none.
fn confirm_unsubscribe(inner: &Inner, key: &(Kind, Bytes)) -> bool {
    let mut state = inner.lock();
    let Some(q) = state.unsubscribing.get_mut(key) else {
        return false;
    };
    let waiter = q.pop_front();
    if q.is_empty() {
        state.unsubscribing.remove(key);
    }
    match waiter {
        Some(w) => {
            let _ = w.send(());
            true
        }
        None => false,
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
