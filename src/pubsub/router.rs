//! Which hub a subscription goes to: channels and patterns to the main hub (in a cluster,
//! PUBLISH reaches every node); shard channels, in cluster mode, to a hub on the master of
//! the channel's slot, moved to the new owner when Redis drops them after a resharding; and
//! in cluster mode, subscriptions that may receive keyspace notifications to a hub on every
//! master as well (`notify.rs`), kept in step with the masters the topology lists.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::hub::Hub;
use super::message::{Kind, Outbox};
use super::notify::{self, Filter};
use crate::cluster::{Addr, key_slot};
use crate::upstream::cluster::ClusterUpstream;
use crate::upstream::{ConnSettings, UpstreamStatus};

/// A client's queue, kept to register it with shard hubs when it first needs one.
#[derive(Debug, Clone)]
struct Client {
    tx: Outbox,
    kill: CancellationToken,
}

#[derive(Debug, Default)]
struct Shards {
    hubs: HashMap<Addr, Arc<Hub>>,
    /// Where each shard channel is subscribed now.
    channel_node: HashMap<Bytes, Addr>,
    clients: HashMap<u64, Client>,
    /// Cluster mode: each master's hub for keyspace notifications, made at the first
    /// subscription that may receive them, with the token that ends its connection.
    notify: HashMap<Addr, (Arc<Hub>, CancellationToken)>,
}

/// All subscriptions of corral.
#[derive(Debug)]
pub struct Router {
    main: Hub,
    cluster: Option<Arc<ClusterUpstream>>,
    settings: ConnSettings,
    status: Arc<UpstreamStatus>,
    shutdown: CancellationToken,
    shards: Arc<Mutex<Shards>>,
    moved: mpsc::UnboundedSender<Bytes>,
}

impl Router {
    /// The main hub on `settings`' node; shard hubs (cluster mode) made on first use.
    pub fn start(
        settings: ConnSettings,
        status: Arc<UpstreamStatus>,
        shutdown: CancellationToken,
        cluster: Option<Arc<ClusterUpstream>>,
    ) -> Arc<Router> {
        // In a cluster the main hub's node publishes its own keys' events too: they come
        // through that node's master hub, with every other master's.
        let filter = match cluster {
            Some(_) => Filter::Others,
            None => Filter::All,
        };
        let main = Hub::start_with(
            settings.clone(),
            status.clone(),
            shutdown.child_token(),
            None,
            filter,
        );
        let (moved, moved_rx) = mpsc::unbounded_channel();
        let epochs = cluster.as_ref().map(|c| c.watch_epoch());
        let router = Arc::new(Router {
            main,
            cluster,
            settings,
            status,
            shutdown,
            shards: Arc::new(Mutex::new(Shards::default())),
            moved,
        });
        tokio::spawn(follow_moves(Arc::downgrade(&router), moved_rx));
        if let Some(epochs) = epochs {
            tokio::spawn(follow_masters(Arc::downgrade(&router), epochs));
        }
        router
    }

    fn lock(&self) -> MutexGuard<'_, Shards> {
        self.shards.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a client's message queue; `kill` disconnects it if it falls behind.
    pub fn register(&self, id: u64, tx: Outbox, kill: CancellationToken) {
        self.main.register(id, tx.clone(), kill.clone());
        self.lock().clients.insert(id, Client { tx, kill });
    }

    /// Subscribes client `id`; see [`Hub::subscribe`].
    pub fn subscribe(&self, id: u64, kind: Kind, name: &[u8]) -> Option<oneshot::Receiver<()>> {
        let main = match self.shard_hub(kind, name) {
            Some(hub) => {
                self.ensure_registered(&hub, id);
                return hub.subscribe(id, kind, name);
            }
            None => self.main.subscribe(id, kind, name),
        };
        if !self.carries(kind, name) {
            return main;
        }
        // Confirmed once every master has it: an event right after the confirmation reaches
        // the client, as from one Redis.
        let mut waits: Vec<_> = main.into_iter().collect();
        for hub in self.master_hubs() {
            self.ensure_registered(&hub, id);
            waits.extend(hub.subscribe(id, kind, name));
        }
        all_of(waits)
    }

    /// Unsubscribes client `id`; see [`Hub::unsubscribe`].
    pub fn unsubscribe(&self, id: u64, kind: Kind, name: &[u8]) -> Option<oneshot::Receiver<()>> {
        let hub = match kind {
            Kind::Shard if self.cluster.is_some() => {
                let shards = self.lock();
                shards
                    .channel_node
                    .get(name)
                    .and_then(|a| shards.hubs.get(a).cloned())
            }
            _ => None,
        };
        let main = match hub {
            Some(hub) => return hub.unsubscribe(id, kind, name),
            None => self.main.unsubscribe(id, kind, name),
        };
        if !self.carries(kind, name) {
            return main;
        }
        let mut waits: Vec<_> = main.into_iter().collect();
        for hub in self.notify_hubs() {
            waits.extend(hub.unsubscribe(id, kind, name));
        }
        self.drop_idle_master_hubs();
        all_of(waits)
    }

    /// Forgets a client entirely (it disconnected or sent RESET); see [`Hub::remove`].
    pub fn remove(&self, id: u64) -> Vec<oneshot::Receiver<()>> {
        let mut waits = self.main.remove(id);
        let hubs: Vec<Arc<Hub>> = {
            let mut shards = self.lock();
            shards.clients.remove(&id);
            let notify = shards.notify.values().map(|(hub, _)| hub.clone());
            shards.hubs.values().cloned().chain(notify).collect()
        };
        for hub in hubs {
            waits.extend(hub.remove(id));
        }
        self.drop_idle_master_hubs();
        waits
    }

    /// The correction to Redis's receiver count for `channel` (see [`Hub::count_delta`]), or
    /// `None` when there is nothing to correct. Standalone only: in cluster mode a PUBLISH
    /// runs on some node whose count corral's subscriptions on another node do not enter.
    pub fn count_delta(&self, kind: Kind, channel: &[u8], patterns: bool) -> Option<i64> {
        if self.cluster.is_some() {
            // But for a shard channel, counted on the master of its slot, where corral's
            // subscription to it is.
            return (kind == Kind::Shard)
                .then(|| self.shard_hub_of(channel))
                .flatten()
                .map(|hub| hub.count_delta(kind, channel, false));
        }
        if self.main.is_idle() {
            return None;
        }
        Some(self.main.count_delta(kind, channel, patterns))
    }

    /// Whether Redis's counts need no correction at all now (no subscription through corral,
    /// or in cluster mode no shard subscription); see [`Router::count_delta`].
    pub fn counts_exact(&self) -> bool {
        if self.cluster.is_some() {
            return self.lock().hubs.values().all(|h| h.is_idle());
        }
        self.main.is_idle()
    }

    /// The hub a shard channel was last subscribed on (cluster mode).
    fn shard_hub_of(&self, channel: &[u8]) -> Option<Arc<Hub>> {
        let shards = self.lock();
        let addr = shards.channel_node.get(channel)?;
        shards.hubs.get(addr).cloned()
    }

    /// Upstream subscriptions now (for INFO).
    pub fn upstream_subscriptions(&self) -> usize {
        let shards = self.lock();
        let notify = shards.notify.values().map(|(hub, _)| hub);
        let others: usize = shards
            .hubs
            .values()
            .chain(notify)
            .map(|h| h.upstream_subscriptions())
            .sum();
        self.main.upstream_subscriptions() + others
    }

    /// Whether a subscription to `name` is made on every master too (see `notify.rs`).
    fn carries(&self, kind: Kind, name: &[u8]) -> bool {
        self.cluster.is_some() && notify::may_carry(kind, name)
    }

    /// The masters' notification hubs there are now.
    fn notify_hubs(&self) -> Vec<Arc<Hub>> {
        let shards = self.lock();
        shards.notify.values().map(|(hub, _)| hub.clone()).collect()
    }

    /// Ends the masters' notification hubs once no subscription may receive notifications:
    /// each holds a connection to its master. Decided under the lock [`Router::master_hubs`]
    /// makes them under, after the main hub's subscriptions it reads: a subscription made
    /// meanwhile either is seen here or makes its hubs after these are gone.
    fn drop_idle_master_hubs(&self) {
        if self.cluster.is_none() {
            return;
        }
        let mut shards = self.lock();
        if shards.notify.is_empty() || !self.main.notification_topics().is_empty() {
            return;
        }
        for (_, (_, token)) in shards.notify.drain() {
            token.cancel();
        }
        debug!("keyspace notification hubs ended: no subscription needs them");
    }

    /// A notification hub on every master the topology lists, made where missing (with the
    /// main hub's subscriptions that may receive notifications), and none left on a node
    /// that is no longer a master.
    fn master_hubs(&self) -> Vec<Arc<Hub>> {
        let Some(cluster) = &self.cluster else {
            return Vec::new();
        };
        let masters = cluster.masters();
        let mut shards = self.lock();
        shards.notify.retain(|addr, (_, token)| {
            let keep = masters.contains(addr);
            if !keep {
                token.cancel();
            }
            keep
        });
        for addr in &masters {
            if shards.notify.contains_key(addr) {
                continue;
            }
            let token = self.shutdown.child_token();
            let settings = ConnSettings {
                addr: addr.to_string(),
                ..self.settings.clone()
            };
            let hub = Arc::new(Hub::start_with(
                settings,
                self.status.clone(),
                token.clone(),
                None,
                Filter::Notifications,
            ));
            for (kind, name, subscribers) in self.main.notification_topics() {
                for h in subscribers {
                    if !hub.is_registered(h.id) {
                        hub.register(h.id, h.tx, h.kill);
                    }
                    // Confirmations are not awaited: the clients already had theirs.
                    let _ = hub.subscribe(h.id, kind, &name);
                }
            }
            debug!(master = %addr, "keyspace notification hub");
            shards.notify.insert(addr.clone(), (hub, token));
        }
        shards.notify.values().map(|(hub, _)| hub.clone()).collect()
    }

    /// In cluster mode, the hub on the master of a shard channel's slot.
    fn shard_hub(&self, kind: Kind, name: &[u8]) -> Option<Arc<Hub>> {
        let cluster = self.cluster.as_ref()?;
        if kind != Kind::Shard {
            return None;
        }
        let addr = cluster
            .master_of(key_slot(name))
            .unwrap_or_else(|| cluster.any_node());
        let mut shards = self.lock();
        shards
            .channel_node
            .insert(Bytes::copy_from_slice(name), addr.clone());
        let hub = shards
            .hubs
            .entry(addr.clone())
            .or_insert_with(|| {
                let settings = ConnSettings {
                    addr: addr.to_string(),
                    ..self.settings.clone()
                };
                Arc::new(Hub::start_with(
                    settings,
                    self.status.clone(),
                    self.shutdown.child_token(),
                    Some(self.moved.clone()),
                    Filter::All,
                ))
            })
            .clone();
        Some(hub)
    }

    fn ensure_registered(&self, hub: &Hub, id: u64) {
        if hub.is_registered(id) {
            return;
        }
        let client = self.lock().clients.get(&id).cloned();
        if let Some(c) = client {
            hub.register(id, c.tx, c.kill);
        }
    }

    /// A shard channel Redis dropped after its slot moved: subscribe its subscribers on the
    /// slot's new master.
    async fn move_channel(&self, name: Bytes) {
        let Some(cluster) = &self.cluster else { return };
        let old = self.lock().channel_node.get(&name).cloned();
        let Some(old_hub) = old.as_ref().and_then(|a| self.lock().hubs.get(a).cloned()) else {
            return;
        };
        // Wait (bounded) for the slot map to show the new owner.
        cluster.request_refresh();
        for _ in 0..50 {
            if cluster.master_of(key_slot(&name)) != old {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let moved = old_hub.take_topic(Kind::Shard, &name);
        debug!(subscribers = moved.len(), "shard channel moved");
        let Some(hub) = self.shard_hub(Kind::Shard, &name) else {
            return;
        };
        for h in moved {
            if !hub.is_registered(h.id) {
                hub.register(h.id, h.tx, h.kill);
            }
            // Confirmations are not awaited: the clients already had theirs.
            let _ = hub.subscribe(h.id, Kind::Shard, &name);
        }
    }
}

/// Cluster mode: after each change of topology, a notification hub on every master while
/// any subscription may receive notifications (see [`Router::master_hubs`]).
async fn follow_masters(router: std::sync::Weak<Router>, mut epochs: watch::Receiver<u64>) {
    while epochs.changed().await.is_ok() {
        let Some(r) = router.upgrade() else { return };
        if r.main.notification_topics().is_empty() {
            r.drop_idle_master_hubs();
        } else {
            r.master_hubs();
        }
    }
}

/// One receiver that fires once all of `waits` have (or were dropped).
fn all_of(waits: Vec<oneshot::Receiver<()>>) -> Option<oneshot::Receiver<()>> {
    if waits.len() <= 1 {
        return waits.into_iter().next();
    }
    let (tx, rx) = oneshot::channel();
    tokio::spawn(async move {
        for w in waits {
            let _ = w.await;
        }
        let _ = tx.send(());
    });
    Some(rx)
}

async fn follow_moves(router: std::sync::Weak<Router>, mut moved: mpsc::UnboundedReceiver<Bytes>) {
    while let Some(name) = moved.recv().await {
        let Some(r) = router.upgrade() else { return };
        if r.cluster.is_none() {
            warn!("shard channel dropped by the server outside cluster mode");
            continue;
        }
        r.move_channel(name).await;
    }
}
