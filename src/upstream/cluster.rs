//! A Redis Cluster upstream: the slot map, shared pipelined connections per node, and the
//! task that keeps the map current (periodically, and at once when a redirection or a
//! connection failure says it is stale).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::conn::UpstreamConn;
use super::dial::{self, Stream};
use super::settings::ConnSettings;
use super::status::UpstreamStatus;
use crate::cluster::{Addr, SlotMap};
use crate::config::ReadFrom;
use crate::resp::encode::encode_request;
use crate::resp::{Proto, ReplyScanner};

/// Shared connections to one node, per protocol.
#[derive(Debug)]
struct NodePool {
    resp2: Vec<UpstreamConn>,
    resp3: Vec<UpstreamConn>,
    readonly: bool,
}

/// The cluster as corral sees it.
#[derive(Debug)]
pub struct ClusterUpstream {
    base: ConnSettings,
    connections: usize,
    seeds: Vec<Addr>,
    map: RwLock<Arc<SlotMap>>,
    /// Looked up for every request routed: hashed with foldhash, not SipHash.
    nodes: Mutex<HashMap<Addr, Arc<NodePool>, foldhash::fast::RandomState>>,
    refresh: Notify,
    status: Arc<UpstreamStatus>,
    shutdown: CancellationToken,
    read_from: ReadFrom,
    /// Bumped whenever the slot map changes: what was learnt from the old one may be stale.
    epoch: std::sync::atomic::AtomicU64,
    /// Tells watchers (the cache's tracking lanes) that the epoch changed.
    epoch_tx: tokio::sync::watch::Sender<u64>,
    /// Counts the refreshes that let go of a node's pool (see
    /// [`ClusterUpstream::watch_dropped_pools`]).
    dropped_tx: tokio::sync::watch::Sender<u64>,
}

impl ClusterUpstream {
    /// Starts the topology task; the map is empty until the first refresh succeeds.
    pub fn start(
        base: ConnSettings,
        seeds: Vec<Addr>,
        connections: usize,
        refresh_every: Duration,
        read_from: ReadFrom,
        status: Arc<UpstreamStatus>,
        shutdown: CancellationToken,
    ) -> Arc<ClusterUpstream> {
        let c = Arc::new(ClusterUpstream {
            base,
            connections,
            seeds,
            map: RwLock::new(Arc::new(SlotMap::new())),
            nodes: Mutex::new(HashMap::default()),
            refresh: Notify::new(),
            status,
            shutdown,
            read_from,
            epoch: std::sync::atomic::AtomicU64::new(0),
            epoch_tx: tokio::sync::watch::Sender::new(0),
            dropped_tx: tokio::sync::watch::Sender::new(0),
        });
        tokio::spawn(refresh_loop(c.clone(), refresh_every));
        c
    }

    /// Whether reads go to masters only (the local cache is only used then: it is kept
    /// coherent by the masters' invalidations).
    pub fn reads_from_masters(&self) -> bool {
        self.read_from == ReadFrom::Master
    }

    /// Changes whenever the slot map changes (a refresh found another map, or a MOVED).
    pub fn epoch(&self) -> u64 {
        self.epoch.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Wakes up when [`ClusterUpstream::epoch`] changes, to follow the set of masters.
    pub fn watch_epoch(&self) -> tokio::sync::watch::Receiver<u64> {
        self.epoch_tx.subscribe()
    }

    /// Wakes up when a refresh let go of the pool of a node that left the cluster or changed
    /// role. Its connections' tasks end once no handle is left: whoever keeps one (a
    /// client's routes) is to let it go.
    pub fn watch_dropped_pools(&self) -> tokio::sync::watch::Receiver<u64> {
        self.dropped_tx.subscribe()
    }

    fn bump_epoch(&self) {
        let e = self
            .epoch
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            .wrapping_add(1);
        self.epoch_tx.send_replace(e);
    }

    /// Waits until a refresh filled the slot map, for at most `within`: true if it did.
    pub async fn wait_for_map(&self, within: Duration) -> bool {
        // Subscribed before looking, so a map installed in between is not missed.
        let mut epochs = self.watch_epoch();
        let known = || self.map().covered() > 0;
        let filled = async {
            while !known() {
                if epochs.changed().await.is_err() {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(within, filled).await;
        known()
    }

    /// The current slot map.
    pub fn map(&self) -> Arc<SlotMap> {
        self.map.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Asks for a topology refresh soon (after a MOVED, CLUSTERDOWN or connection failure).
    pub fn request_refresh(&self) {
        self.refresh.notify_one();
    }

    /// Applies a MOVED redirection to the map at once, before the refresh confirms it.
    pub fn apply_moved(&self, slot: u16, addr: &Addr) {
        let mut guard = self.map.write().unwrap_or_else(|p| p.into_inner());
        let mut map = (**guard).clone();
        map.apply_moved(slot, addr);
        *guard = Arc::new(map);
        drop(guard);
        self.bump_epoch();
        self.request_refresh();
    }

    /// The shared connection to `addr` a client with this id uses.
    pub fn conn_for(&self, addr: &Addr, proto: Proto, client_id: u64) -> UpstreamConn {
        let pool = {
            let mut nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
            // Looked up before the entry API, which would copy the address every time.
            match nodes.get(addr) {
                Some(pool) => pool.clone(),
                None => nodes
                    .entry(addr.clone())
                    .or_insert_with(|| Arc::new(self.pool(addr)))
                    .clone(),
            }
        };
        let list = match proto {
            Proto::Resp2 => &pool.resp2,
            Proto::Resp3 => &pool.resp3,
        };
        list[(client_id % list.len() as u64) as usize].clone()
    }

    /// The node a read-only command for `slot` goes to, per `read_from`: a replica chosen by
    /// client id (the master when the shard has no online replica), or the master.
    pub fn read_node(&self, slot: u16, client_id: u64) -> Option<Addr> {
        let map = self.map();
        let shard = map.shard(slot)?;
        if self.read_from == ReadFrom::Master {
            return Some(shard.master.addr.clone());
        }
        let online: Vec<&Addr> = shard
            .replicas
            .iter()
            .filter(|r| r.health == crate::cluster::Health::Online)
            .map(|r| &r.addr)
            .collect();
        let pick = |list: &[&Addr]| list[(client_id % list.len() as u64) as usize].clone();
        match self.read_from {
            ReadFrom::Master => Some(shard.master.addr.clone()),
            ReadFrom::Replica if !online.is_empty() => Some(pick(&online)),
            ReadFrom::Replica => Some(shard.master.addr.clone()),
            ReadFrom::Any => {
                let mut all = online;
                all.push(&shard.master.addr);
                Some(pick(&all))
            }
        }
    }

    /// The shared connection a client with this id uses for a request on `slot`: to its
    /// master, or (`read`, a read-only command) to the node [`ClusterUpstream::read_node`]
    /// picks. Nothing is copied on the common path (the master, or reads from masters).
    pub fn slot_conn(
        &self,
        slot: u16,
        read: bool,
        proto: Proto,
        client_id: u64,
    ) -> Option<UpstreamConn> {
        if read && self.read_from != ReadFrom::Master {
            let addr = self.read_node(slot, client_id)?;
            return Some(self.conn_for(&addr, proto, client_id));
        }
        let map = self.map();
        let master = &map.shard(slot)?.master.addr;
        Some(self.conn_for(master, proto, client_id))
    }

    /// Whether `addr` is a replica in the current map (its connections send READONLY).
    fn is_replica(&self, addr: &Addr) -> bool {
        self.map()
            .shards()
            .iter()
            .any(|s| s.replicas.iter().any(|r| &r.addr == addr))
    }

    /// The master serving `slot`, if the map knows one.
    pub fn master_of(&self, slot: u16) -> Option<Addr> {
        self.map().master(slot).map(|n| n.addr.clone())
    }

    /// Every master, in a stable order (for whole-keyspace commands and SCAN cursors).
    pub fn masters(&self) -> Vec<Addr> {
        let mut m: Vec<Addr> = self.map().masters().map(|n| n.addr.clone()).collect();
        m.sort();
        m.dedup();
        m
    }

    /// Every node serving slots, masters and their replicas, in a stable order (for
    /// settings, which each node keeps for itself).
    pub fn nodes(&self) -> Vec<Addr> {
        let map = self.map();
        let mut all: Vec<Addr> = map
            .shards()
            .iter()
            .flat_map(|s| std::iter::once(&s.master).chain(&s.replicas))
            .map(|n| n.addr.clone())
            .collect();
        all.sort();
        all.dedup();
        all
    }

    /// A node for commands that name no key: the first master, else the first seed.
    pub fn any_node(&self) -> Addr {
        self.masters()
            .into_iter()
            .next()
            .or_else(|| self.seeds.first().cloned())
            .unwrap_or_else(|| Addr::new(self.base.addr.clone(), 6379))
    }

    fn pool(&self, addr: &Addr) -> NodePool {
        let readonly = self.is_replica(addr);
        let make = |proto| {
            (0..self.connections)
                .map(|_| {
                    let settings = ConnSettings {
                        addr: addr.to_string(),
                        proto,
                        readonly,
                        ..self.base.clone()
                    };
                    UpstreamConn::spawn(
                        settings,
                        self.status.clone(),
                        self.shutdown.child_token(),
                        None,
                    )
                })
                .collect()
        };
        NodePool {
            resp2: make(Proto::Resp2),
            resp3: make(Proto::Resp3),
            readonly,
        }
    }

    /// Asks the known masters, then the seeds, for the topology; the first answer wins.
    async fn fetch(&self) -> Result<SlotMap, String> {
        let mut candidates = self.masters();
        candidates.extend(self.seeds.iter().cloned());
        let mut last = "no node to ask".to_string();
        for addr in candidates {
            match self.fetch_from(&addr).await {
                Ok(map) if map.covered() > 0 => return Ok(map),
                Ok(_) => last = format!("{addr}: no slots assigned"),
                Err(e) => last = format!("{addr}: {e}"),
            }
        }
        Err(last)
    }

    async fn fetch_from(&self, addr: &Addr) -> Result<SlotMap, String> {
        // A stalled node is passed over for the next within `connect_timeout`.
        let settings = ConnSettings {
            addr: addr.to_string(),
            proto: Proto::Resp2,
            ..self.base.clone()
        }
        .background();
        let mut stream = dial::open(&settings, &self.status).await?;
        let deadline = settings.connect_timeout;
        let shards = tokio::time::timeout(deadline, ask(&mut stream, &[b"CLUSTER", b"SHARDS"]))
            .await
            .map_err(|_| "CLUSTER SHARDS timed out".to_string())??;
        let tls = self.base.access.current().tls.is_some();
        match SlotMap::from_shards_reply_for(&shards, &addr.host, tls) {
            Ok(map) => Ok(map),
            // Before Redis 7.0 there is no CLUSTER SHARDS.
            Err(crate::cluster::TopologyError::ErrorReply(_)) => {
                let slots =
                    tokio::time::timeout(deadline, ask(&mut stream, &[b"CLUSTER", b"SLOTS"]))
                        .await
                        .map_err(|_| "CLUSTER SLOTS timed out".to_string())??;
                SlotMap::from_slots_reply(&slots, &addr.host).map_err(|e| e.to_string())
            }
            Err(e) => Err(e.to_string()),
        }
    }

    fn install(&self, map: SlotMap) {
        let changed = *self.map() != map;
        if changed {
            info!(
                masters = map.masters().count(),
                covered = map.covered(),
                "cluster topology updated"
            );
        }
        *self.map.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(map);
        // Announced once the new map is in place, so watchers read the new masters; and
        // before the pools below are dropped, so a client's routes of the old map, checked
        // against the epoch at each request, no longer ask for a pool of a node that left
        // (which would make one anew).
        if changed {
            self.bump_epoch();
        }
        // Pools of nodes that are gone, or changed role (their READONLY state would be
        // wrong), are dropped; their tasks end when unused.
        let map = self.map();
        let role = |a: &Addr| -> Option<bool> {
            map.shards().iter().find_map(|s| {
                if &s.master.addr == a {
                    Some(false)
                } else if s.replicas.iter().any(|r| &r.addr == a) {
                    Some(true)
                } else {
                    None
                }
            })
        };
        let mut nodes = self.nodes.lock().unwrap_or_else(|p| p.into_inner());
        let before = nodes.len();
        nodes.retain(|a, pool| role(a) == Some(pool.readonly));
        let dropped = nodes.len() < before;
        drop(nodes);
        if dropped {
            self.dropped_tx.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}

/// Sends one command and returns its whole reply.
async fn ask(stream: &mut Stream, args: &[&[u8]]) -> Result<Bytes, String> {
    let mut req = BytesMut::new();
    encode_request(args, &mut req);
    stream.write_all(&req).await.map_err(|e| e.to_string())?;
    stream.flush().await.map_err(|e| e.to_string())?;
    let mut buf = BytesMut::with_capacity(16 * 1024);
    let mut scanner = ReplyScanner::new();
    loop {
        if let Some(f) = scanner.next_frame(&buf).map_err(|e| e.to_string())? {
            return Ok(buf.split_to(f.end).freeze());
        }
        if buf.len() > 64 * 1024 * 1024 {
            return Err("topology reply too large".into());
        }
        if stream.read_buf(&mut buf).await.map_err(|e| e.to_string())? == 0 {
            return Err("connection closed".into());
        }
    }
}

async fn refresh_loop(c: Arc<ClusterUpstream>, every: Duration) {
    loop {
        match c.fetch().await {
            Ok(map) => c.install(map),
            Err(e) => {
                warn!(cause = %e, "cluster topology refresh failed");
                c.status.disconnected(&e);
            }
        }
        // A failed or empty map is retried quickly; a good one at the regular pace, or as
        // soon as someone reports it stale (at most every 100 ms).
        let pause = if c.map().covered() == 0 {
            Duration::from_millis(200)
        } else {
            every
        };
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = c.refresh.notified() => {
                debug!("cluster topology refresh requested");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            _ = c.shutdown.cancelled() => return,
        }
    }
}
