//! The subscription hub: however many clients subscribe to a channel, corral subscribes once
//! upstream, on one RESP3 connection, and fans each message out (see `observer.rs`).

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::message::{Handoff, Kind, Outbox};
use super::notify::Filter;
use super::observer::Observer;
use super::state::{Inner, State, Subscriber};
use crate::commands::glob;
use crate::resp::encode::encode_request;
use crate::upstream::{ConnSettings, LinkObserver, ReplyTo, UpstreamConn, UpstreamStatus};

/// A command for the hub's connection, with the replies it has (pushes aside) and what to do
/// with them.
type Command = (Bytes, u32, ReplyTo);

/// The subscription hub.
#[derive(Debug)]
pub struct Hub {
    inner: Arc<Inner>,
    /// Commands for the upstream connection, queued under the state lock: they reach Redis
    /// in the order they were decided. Were a newcomer's SUBSCRIBE queued ahead of the last
    /// leaver's UNSUBSCRIBE of the same name, Redis would end up unsubscribed while corral
    /// counts the subscription confirmed. Unbounded, so that no (UN)SUBSCRIBE is ever
    /// dropped (a client may subscribe to thousands of channels in one command): it holds
    /// at most what clients' commands asked for.
    commands: mpsc::UnboundedSender<Command>,
}

impl Hub {
    /// Starts the hub's upstream connection.
    pub fn start(
        settings: ConnSettings,
        status: Arc<UpstreamStatus>,
        shutdown: CancellationToken,
    ) -> Hub {
        Hub::start_with(settings, status, shutdown, None, Filter::All)
    }

    /// Like [`Hub::start`]; `moved` receives the shard channels the server dropped on its own
    /// (`sunsubscribe` pushes after its slot moved away), to be subscribed elsewhere; `filter`
    /// says which messages go to the subscribers.
    pub fn start_with(
        settings: ConnSettings,
        status: Arc<UpstreamStatus>,
        shutdown: CancellationToken,
        moved: Option<mpsc::UnboundedSender<Bytes>>,
        filter: Filter,
    ) -> Hub {
        let inner = Arc::new(Inner::default());
        // A subscription's waiter gives up without resetting the connection.
        let settings = ConnSettings {
            proto: crate::resp::Proto::Resp3,
            tracking: false,
            reconnect: true,
            gather: false,
            ..settings
        }
        .background();
        let (ups_tx, ups_rx) = mpsc::channel(1);
        let observer: Arc<dyn LinkObserver> =
            Arc::new(Observer::new(inner.clone(), ups_tx, moved, filter));
        let conn = UpstreamConn::spawn(settings, status, shutdown, Some(observer));
        let (commands, queued) = mpsc::unbounded_channel();
        tokio::spawn(forward(conn, queued));
        tokio::spawn(resubscribe(inner.clone(), commands.clone(), ups_rx));
        Hub { inner, commands }
    }

    /// Registers a client's message queue; `kill` disconnects it if it falls behind.
    pub fn register(&self, id: u64, tx: Outbox, kill: CancellationToken) {
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
        if first {
            // In RESP3 the answers are push frames, handled by the observer: no reply to
            // wait for.
            let ignore = ReplyTo::Call(Box::new(|_| {}));
            let _ = self
                .commands
                .send((command(kind.subscribe_cmd(), name), 0, ignore));
        }
        Some(rx)
    }

    /// Unsubscribes client `id` from `name`; the upstream subscription ends with its last
    /// subscriber. Returns a receiver that fires once Redis has confirmed that end, or `None`
    /// when the upstream subscription stays: after the client saw its confirmation, PUBLISH
    /// no longer counts corral for it. Where it stays, the receiver fires once the messages
    /// Redis may have sent the client before are in (see `Hub::part`).
    pub fn unsubscribe(&self, id: u64, kind: Kind, name: &[u8]) -> Option<oneshot::Receiver<()>> {
        self.leave(id, kind, name, true)
    }

    /// [`Hub::unsubscribe`]; without `part`, a client leaving a topic others keep is gone at
    /// once (it disconnected: nothing more is written to it).
    fn leave(&self, id: u64, kind: Kind, name: &[u8], part: bool) -> Option<oneshot::Receiver<()>> {
        let mut state = self.inner.lock();
        let key = (kind, Bytes::copy_from_slice(name));
        if let Some(sub) = state.subscribers.get_mut(&id) {
            sub.topics.remove(&key);
        }
        let topic = state.topics.get_mut(&key)?;
        topic.subscribers.remove(&id);
        if !topic.subscribers.is_empty() {
            return part.then(|| self.part(&mut state, key, id)).flatten();
        }
        state.topics.remove(&key);
        let (tx, rx) = oneshot::channel();
        state
            .unsubscribing
            .entry(key.clone())
            .or_default()
            .push_back((tx, id));
        let (inner, sent) = (self.inner.clone(), key.clone());
        // Not sent (connection closed): no confirmation will come.
        let failed = move |r: crate::upstream::JobResult| {
            if r.is_err() {
                inner.confirm_unsubscribe(&sent);
            }
        };
        let req = command(kind.unsubscribe_cmd(), name);
        let queued = self
            .commands
            .send((req, 0, ReplyTo::Call(Box::new(failed))));
        drop(state);
        if queued.is_err() {
            // The forwarding task is gone (shutdown).
            self.inner.confirm_unsubscribe(&key);
        }
        Some(rx)
    }

    /// Client `id` left `key`, which others keep: Redis may have sent the topic a message
    /// before the client's unsubscribe that corral has not read yet. The client keeps getting
    /// the topic's messages until a PING sent now comes back behind them; the receiver fires
    /// then.
    fn part(
        &self,
        state: &mut State,
        key: (Kind, Bytes),
        id: u64,
    ) -> Option<oneshot::Receiver<()>> {
        let (tx, rx) = oneshot::channel();
        state.parting.entry(key.clone()).or_default().push(id);
        let (inner, parted) = (self.inner.clone(), key.clone());
        // The reply, or the connection's end: either way nothing more of the topic is coming
        // from before the unsubscribe. HELLO (no arguments: it changes nothing) rather than
        // PING, which a Redis ACL user's hub may be denied: a NOPERM would count in Redis's
        // error statistics.
        let back = move |_: crate::upstream::JobResult| {
            inner.lock().parted(&parted, id);
            let _ = tx.send(());
        };
        let mut hello = BytesMut::new();
        encode_request(&[b"HELLO"], &mut hello);
        let queued = self
            .commands
            .send((hello.freeze(), 1, ReplyTo::Call(Box::new(back))));
        if queued.is_err() {
            // The forwarding task is gone (shutdown): nothing will come back.
            state.parted(&key, id);
            return None;
        }
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
            .filter_map(|(kind, name)| self.leave(id, kind, &name, false))
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

    /// The topics that may receive keyspace notifications (`notify.rs`), each with its
    /// subscribers and their queues: for a master's hub made after they subscribed.
    pub(super) fn notification_topics(&self) -> Vec<(Kind, Bytes, Vec<Handoff>)> {
        let state = self.inner.lock();
        state
            .topics
            .iter()
            .filter(|((kind, name), _)| super::notify::may_carry(*kind, name))
            .map(|((kind, name), topic)| {
                let subs = topic
                    .subscribers
                    .iter()
                    .filter_map(|id| {
                        let sub = state.subscribers.get(id)?;
                        Some(Handoff {
                            id: *id,
                            tx: sub.tx.clone(),
                            kill: sub.kill.clone(),
                        })
                    })
                    .collect();
                (*kind, name.clone(), subs)
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
}

/// `cmd name` as a request.
fn command(cmd: &[u8], name: &[u8]) -> Bytes {
    let mut req = BytesMut::new();
    encode_request(&[cmd, name], &mut req);
    req.freeze()
}

/// Hands the hub's commands to its connection in order, waiting for room in its queue.
async fn forward(conn: UpstreamConn, mut queued: mpsc::UnboundedReceiver<Command>) {
    while let Some((req, replies, reply)) = queued.recv().await {
        conn.send_to(req, replies, reply).await;
    }
}

/// Resends every live subscription; called by the hub after its connection came back.
async fn resubscribe(
    inner: Arc<Inner>,
    commands: mpsc::UnboundedSender<Command>,
    mut ups: mpsc::Receiver<()>,
) {
    while ups.recv().await.is_some() {
        // Under the lock, like every other command: an UNSUBSCRIBE decided meanwhile follows.
        let state = inner.lock();
        for (kind, name) in state.topics.keys() {
            let ignore = ReplyTo::Call(Box::new(|_| {}));
            let _ = commands.send((command(kind.subscribe_cmd(), name), 0, ignore));
        }
    }
}
