//! A Redis Cluster of real servers, and corral in front of it.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::client::{RawClient, sync_cmd, try_sync_cmd};
use super::cluster_node::{NodeLine, SlotMigration, node_id, parse_cluster_nodes};
use super::proxy::TestProxy;
use super::resp::{reply_text, show};
use super::server::{RedisServer, free_port};
use super::wait::block_until;

/// A Redis Cluster of real `redis-server` processes on ephemeral loopback ports, each with its
/// own temporary directory; all killed and their directories removed on drop.
pub struct RedisCluster {
    pub servers: Vec<RedisServer>,
    pub masters: usize,
    pub replicas_per_master: usize,
}

impl RedisCluster {
    /// Starts `masters * (1 + replicas_per_master)` nodes, joins them with
    /// `redis-cli --cluster create`, and waits (up to 30 s) until every live node reports
    /// `cluster_state:ok` and every replica is attached and synced.
    pub fn start(masters: usize, replicas_per_master: usize) -> RedisCluster {
        let total = masters * (1 + replicas_per_master);
        let servers = (0..total).map(|_| Self::spawn_node()).collect();
        let mut cluster = RedisCluster {
            servers,
            masters,
            replicas_per_master,
        };
        let addrs: Vec<String> = cluster
            .nodes()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args([
                "--cluster-replicas",
                &replicas_per_master.to_string(),
                "--cluster-yes",
            ])
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        cluster.wait_healthy(Duration::from_secs(30));
        cluster
    }

    /// One cluster-enabled node. The cluster bus gets its own free port (the default,
    /// port + 10000, may be taken or past 65535); a clash on either port means a retry.
    fn spawn_node() -> RedisServer {
        Self::spawn_node_with(&[])
    }

    /// [`RedisCluster::spawn_node`] with extra arguments.
    fn spawn_node_with(more: &[&str]) -> RedisServer {
        for _ in 0..10 {
            let bus = free_port();
            let mut extra: Vec<String> = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                // Relative to the node's own --dir, which is named after its port.
                "nodes.conf",
                "--cluster-node-timeout",
                "1000",
                "--cluster-port",
                &bus.to_string(),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            extra.extend(more.iter().map(|s| s.to_string()));
            let port = free_port();
            if port != bus
                && let Some(s) = RedisServer::spawn_on(port, &extra)
            {
                return s;
            }
        }
        panic!("could not start a cluster node after 10 tries");
    }

    /// Client ports of all nodes, killed or not, in start order.
    pub fn nodes(&self) -> Vec<u16> {
        self.servers.iter().map(|s| s.port).collect()
    }

    /// Ports of nodes still running.
    pub fn live_nodes(&mut self) -> Vec<u16> {
        self.servers
            .iter_mut()
            .filter_map(|s| s.is_running().then_some(s.port))
            .collect()
    }

    /// `redis://` URLs of all nodes, to use as seeds.
    pub fn seeds(&self) -> Vec<String> {
        self.servers.iter().map(RedisServer::url).collect()
    }

    /// `CLUSTER NODES` as seen by the node at `port`.
    pub fn cluster_nodes(port: u16) -> Vec<NodeLine> {
        parse_cluster_nodes(&reply_text(&sync_cmd(port, &["CLUSTER", "NODES"])))
    }

    /// Port of the master serving `slot`, as a live node sees it.
    pub fn master_for_slot(&mut self, slot: u16) -> u16 {
        self.master_for_slot_opt(slot)
            .unwrap_or_else(|| panic!("no master serves slot {slot}"))
    }

    /// Port of the healthy master serving `slot`, if a live node knows one.
    pub fn master_for_slot_opt(&mut self, slot: u16) -> Option<u16> {
        let port = *self.live_nodes().first()?;
        let nodes = parse_cluster_nodes(&reply_text(
            &try_sync_cmd(port, &["CLUSTER", "NODES"]).ok()?,
        ));
        nodes
            .iter()
            .find(|n| {
                n.is_master()
                    && !n.is_troubled()
                    && n.slots.iter().any(|&(a, b)| (a..=b).contains(&slot))
            })
            .map(|n| n.port)
    }

    /// Ports of the nodes that currently are masters serving slots.
    pub fn master_ports(&mut self) -> Vec<u16> {
        let port = *self.live_nodes().first().expect("no live node");
        let mut v: Vec<u16> = Self::cluster_nodes(port)
            .iter()
            .filter(|n| n.is_master() && !n.is_troubled() && !n.slots.is_empty())
            .map(|n| n.port)
            .collect();
        v.sort_unstable();
        v
    }

    /// Ports of the replicas of the master at `master_port`.
    pub fn replicas_of(&mut self, master_port: u16) -> Vec<u16> {
        let nodes = Self::cluster_nodes(master_port);
        let id = nodes
            .iter()
            .find(|n| n.flags.iter().any(|f| f == "myself"))
            .map(|n| n.id.clone())
            .expect("myself in CLUSTER NODES");
        nodes
            .iter()
            .filter(|n| n.is_replica() && n.master_id == id)
            .map(|n| n.port)
            .collect()
    }

    /// Kills the node at `port` (SIGKILL). Its data dir goes with the cluster.
    pub fn kill_node(&mut self, port: u16) {
        let s = self
            .servers
            .iter_mut()
            .find(|s| s.port == port)
            .unwrap_or_else(|| panic!("no node on port {port}"));
        s.kill();
    }

    /// Promotes the replica at `replica_port` with `CLUSTER FAILOVER` (or `FAILOVER FORCE` /
    /// `TAKEOVER` as `mode`, for a dead master) and waits until the cluster is ok with it as
    /// a master.
    pub fn failover(&mut self, replica_port: u16, mode: Option<&str>) {
        let mut args = vec!["CLUSTER", "FAILOVER"];
        args.extend(mode);
        let r = sync_cmd(replica_port, &args);
        assert_eq!(r, b"+OK\r\n", "CLUSTER FAILOVER: {}", show(&r));
        block_until(
            Duration::from_secs(30),
            &format!("failover to {replica_port}"),
            || {
                let promoted = Self::cluster_nodes(replica_port)
                    .iter()
                    .any(|n| n.port == replica_port && n.is_master() && !n.slots.is_empty());
                promoted && self.all_ok()
            },
        );
        // The old master turns into a replica of the new one.
        self.wait_healthy(Duration::from_secs(30));
    }

    /// Starts one more node and joins it as a master without slots (CLUSTER MEET), waiting
    /// until every node sees it connected. Give it a slot ([`RedisCluster::move_empty_slot`])
    /// before waiting for health: a master without slots is not counted. It stays a master
    /// when it loses its slots (no replica migration), ready for [`RedisCluster::remove_master`].
    pub fn add_master(&mut self) -> u16 {
        let node = Self::spawn_node_with(&["--cluster-allow-replica-migration", "no"]);
        let port = node.port;
        let first = *self.live_nodes().first().expect("no live node");
        // The bus port is not port + 10000 here: MEET must be told it.
        let nodes = reply_text(&sync_cmd(first, &["CLUSTER", "NODES"]));
        let bus = nodes
            .lines()
            .find(|l| l.contains("myself"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|a| a.split(['@', ',']).nth(1))
            .expect("bus port in CLUSTER NODES")
            .to_string();
        let r = sync_cmd(
            port,
            &["CLUSTER", "MEET", "127.0.0.1", &first.to_string(), &bus],
        );
        assert_eq!(r, b"+OK\r\n", "CLUSTER MEET: {}", show(&r));
        self.servers.push(node);
        self.masters += 1;
        block_until(
            Duration::from_secs(30),
            &format!("new node {port} to join"),
            || {
                self.live_nodes().into_iter().all(|p| {
                    Self::cluster_nodes(p)
                        .iter()
                        .any(|n| n.port == port && n.connected && !n.is_troubled())
                })
            },
        );
        port
    }

    /// Moves `slot`, which must hold no keys, to the master at `dst` (IMPORTING/MIGRATING,
    /// then SETSLOT NODE on every master, the target first), and waits until every live node
    /// agrees.
    pub fn move_empty_slot(&mut self, slot: u16, dst: u16) {
        let src = self.master_for_slot(slot);
        let migration = SlotMigration::begin(slot, src, dst);
        let port = *self.live_nodes().first().expect("no live node");
        let masters: Vec<u16> = Self::cluster_nodes(port)
            .iter()
            .filter(|n| n.is_master())
            .map(|n| n.port)
            .collect();
        migration.finish(&masters);
        let what = format!("slot {slot} to move to {dst}");
        block_until(Duration::from_secs(30), &what, || {
            self.live_nodes().into_iter().all(|p| {
                Self::cluster_nodes(p)
                    .iter()
                    .any(|n| n.port == dst && n.slots.iter().any(|&(a, b)| (a..=b).contains(&slot)))
            })
        });
    }

    /// Takes the master at `port`, which must serve no slots, out of the cluster: every other
    /// node forgets it and it forgets them (CLUSTER RESET), so gossip cannot bring it back.
    /// The node keeps running, alone; it is returned to the caller.
    pub fn remove_master(&mut self, port: u16) -> RedisServer {
        let id = node_id(port);
        let at = self
            .servers
            .iter()
            .position(|s| s.port == port)
            .unwrap_or_else(|| panic!("no node on port {port}"));
        let node = self.servers.remove(at);
        self.masters -= 1;
        for p in self.live_nodes() {
            let r = sync_cmd(p, &["CLUSTER", "FORGET", &id]);
            assert_eq!(r, b"+OK\r\n", "CLUSTER FORGET on {p}: {}", show(&r));
        }
        let r = sync_cmd(port, &["CLUSTER", "RESET", "HARD"]);
        assert_eq!(r, b"+OK\r\n", "CLUSTER RESET on {port}: {}", show(&r));
        self.wait_healthy(Duration::from_secs(30));
        node
    }

    /// Whether every live node says `cluster_state:ok`.
    pub fn all_ok(&mut self) -> bool {
        self.live_nodes().into_iter().all(|p| {
            try_sync_cmd(p, &["CLUSTER", "INFO"])
                .map(|r| reply_text(&r).contains("cluster_state:ok"))
                .unwrap_or(false)
        })
    }

    /// Waits until every live node is ok and sees all live nodes connected, the expected
    /// number of masters with slots, and every live replica attached (`master_link_status:up`).
    /// Killed nodes are left out, so this also waits out a failover.
    pub fn wait_healthy(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        let mut last = String::new();
        while Instant::now() < deadline {
            match self.health_problem() {
                None => return,
                Some(p) => last = p,
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("cluster not healthy after {limit:?}: {last}");
    }

    fn health_problem(&mut self) -> Option<String> {
        let live = self.live_nodes();
        let total = live.len();
        for p in live {
            let info = match try_sync_cmd(p, &["CLUSTER", "INFO"]) {
                Ok(r) => reply_text(&r),
                Err(e) => return Some(format!("{p}: {e}")),
            };
            if !info.contains("cluster_state:ok") {
                return Some(format!("{p}: cluster_state not ok"));
            }
            let nodes = Self::cluster_nodes(p);
            let good = nodes
                .iter()
                .filter(|n| n.connected && !n.is_troubled())
                .count();
            let masters = nodes
                .iter()
                .filter(|n| n.is_master() && !n.slots.is_empty())
                .count();
            let replicas = nodes
                .iter()
                .filter(|n| n.is_replica() && !n.is_troubled())
                .count();
            if good != total || masters != self.masters || replicas != total - self.masters {
                return Some(format!(
                    "{p} sees {good}/{total} good nodes, {masters} masters, {replicas} replicas"
                ));
            }
            let myself = nodes
                .iter()
                .find(|n| n.flags.iter().any(|f| f == "myself"))?;
            if myself.is_replica() {
                let repl = reply_text(&sync_cmd(p, &["INFO", "replication"]));
                if !repl.contains("master_link_status:up") {
                    return Some(format!("replica {p} not attached"));
                }
            }
        }
        None
    }
}

// ---- corral in front of a test cluster ----

/// corral in front of `cluster` (topology refreshed every 500 ms, 2 s request timeout), with
/// `tweak` applied to its config last.
pub async fn cluster_proxy(
    cluster: &RedisCluster,
    tweak: impl FnOnce(&mut corral::Config),
) -> TestProxy {
    let seeds = cluster.seeds();
    TestProxy::start_with(&seeds[0], |cfg| {
        cfg.cluster.seeds = seeds.clone();
        cfg.cluster.refresh_ms = 500;
        cfg.upstream.request_timeout_ms = 2_000;
        tweak(cfg);
    })
    .await
}

/// Waits until corral knows the whole slot map (CLUSTER INFO through corral says ok).
pub async fn wait_cluster_ready(c: &mut RawClient) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !String::from_utf8_lossy(&c.cmd("CLUSTER INFO").await).contains("cluster_state:ok") {
        assert!(
            Instant::now() < deadline,
            "corral never saw the cluster as ok"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// [`cluster_proxy`] plus a client connected once the cluster is ready through it.
pub async fn ready_cluster_proxy(
    cluster: &RedisCluster,
    tweak: impl FnOnce(&mut corral::Config),
) -> (TestProxy, RawClient) {
    let proxy = cluster_proxy(cluster, tweak).await;
    let mut c = RawClient::connect(proxy.addr)
        .await
        .expect("connect to corral");
    wait_cluster_ready(&mut c).await;
    (proxy, c)
}
