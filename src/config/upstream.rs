//! The upstream part of the configuration: where requests go (`[upstream]`, `[cluster]`),
//! how connections to it are made and checked, and the target those settings name, parsed.

use std::time::Duration;

use serde::Deserialize;

use super::url::UpstreamUrl;
use crate::error::ConfigError;
use crate::tls::UpstreamTls;

/// A Redis Cluster upstream.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// `redis://[user[:pass]@]host:port` of some cluster nodes; non-empty turns cluster mode
    /// on. Credentials are taken from the first.
    pub seeds: Vec<String>,
    /// Topology refresh period (it is also refreshed at once on redirections and failures).
    pub refresh_ms: u64,
    /// Where read-only commands go: masters only (default), replicas (falling back to the
    /// master when a shard has none), or any node of the shard.
    pub read_from: ReadFrom,
}

/// Which nodes serve read-only commands in cluster mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReadFrom {
    /// Masters only: reads see every acknowledged write.
    #[default]
    Master,
    /// Replicas (READONLY): offloads masters; reads may lag writes by the replication delay.
    Replica,
    /// Master and replicas, spread by client.
    Any,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            seeds: Vec::new(),
            refresh_ms: 5_000,
            read_from: ReadFrom::Master,
        }
    }
}

impl ClusterConfig {
    /// True when corral fronts a cluster.
    pub fn enabled(&self) -> bool {
        !self.seeds.is_empty()
    }
}

/// The upstream Redis and how corral talks to it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamConfig {
    /// `redis://[user[:pass]@]host:port` of the upstream server.
    pub url: String,
    /// Shared pipelined connections per protocol version (RESP2, RESP3).
    pub connections: usize,
    /// Deadline for connecting one upstream connection (TCP and TLS); Redis's handshake after
    /// it waits as a request does (`request_timeout_ms`, never less than this; 0, as long as
    /// Redis takes).
    pub connect_timeout_ms: u64,
    /// Deadline for the reply to a request on a shared connection; 0 waits forever. Dedicated
    /// connections (scripts, transactions, blocking commands) wait as long as Redis takes.
    pub request_timeout_ms: u64,
    /// First delay between reconnection attempts; doubles up to `reconnect_max_ms`.
    pub reconnect_min_ms: u64,
    /// Largest delay between reconnection attempts.
    pub reconnect_max_ms: u64,
    /// Most connections reserved for single clients at once (transactions, blocking
    /// commands, scripts, an AUTH as a Redis ACL user while Redis checks it, including those of
    /// Redis users' pools); further transactions and blocking commands get an error, further
    /// scripts use the shared connections.
    pub max_dedicated: usize,
    /// Run a script or function on a dedicated connection (for the rest of its client's
    /// round) until it is known to finish quickly, so a long one never holds up other
    /// clients; `false` keeps every script on the shared connections.
    pub isolate_scripts: bool,
    /// Most clients with CLIENT TRACKING on at once, each holding a dedicated connection
    /// (counted in `max_dedicated` too), plus the REDIRECT targets' connections.
    pub max_tracking_clients: usize,
    /// Requests a shared connection may have written and not yet answered before its next
    /// write waits for replies (0: never wait). Unset: `HOLD_WRITES_AT`, lowered while the
    /// cache (if on) serves many GETs (see `Config::hold_writes_at`).
    pub hold_writes_at: Option<usize>,
    /// How TLS connections to a `rediss://` upstream (and every cluster node) are verified.
    pub tls: UpstreamTls,
}

/// `upstream.hold_writes_at` when unset: more than one 16-deep pipeline's requests, and more
/// than 50 clients sending one request each can have on one of two connections, so
/// unpipelined clients are never held.
pub const HOLD_WRITES_AT: usize = 48;

impl Default for UpstreamConfig {
    fn default() -> Self {
        UpstreamConfig {
            url: "redis://127.0.0.1:6379".into(),
            connections: 2,
            connect_timeout_ms: 1_000,
            request_timeout_ms: 5_000,
            reconnect_min_ms: 50,
            reconnect_max_ms: 2_000,
            max_dedicated: 1024,
            isolate_scripts: true,
            max_tracking_clients: 256,
            hold_writes_at: None,
            tls: UpstreamTls::default(),
        }
    }
}

/// How a long-lived connection is checked for life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Health {
    /// Quiet time (no byte from the upstream, nothing outstanding) before corral sends a PING.
    pub check: Duration,
    /// How long a PING may go unanswered (no byte at all arrives) before the connection counts
    /// as dead.
    pub deadline: Duration,
    /// Outstanding requests are held to the same bound as a PING: dead once nothing arrived
    /// for `check` and then `deadline` more while something is outstanding. For the cache's
    /// tracking lanes, whose requests are tiny fills and whose silence could hide missed
    /// invalidations; shared connections leave their requests to the request timeout, since
    /// a client's slow command is not a dead connection.
    pub strict: bool,
}

impl Health {
    /// The longest a dead connection can go unnoticed after its last sign of life.
    pub fn window(&self) -> Duration {
        self.check + self.deadline
    }
}

/// The upstream a valid config names, its URLs parsed ([`super::Config::validate`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UpstreamTarget {
    /// Where the shared connections go, with the credentials every connection uses:
    /// `upstream.url`, or the first of `cluster.seeds` in cluster mode.
    pub primary: UpstreamUrl,
    /// The cluster seed nodes; empty unless in cluster mode.
    pub seeds: Vec<UpstreamUrl>,
    /// Connections use TLS: the URL (or, in cluster mode, every seed) is `rediss://`.
    pub tls: bool,
}

impl UpstreamTarget {
    /// Parses `upstream.url` and `cluster.seeds` (all of them, cluster mode or not, so that a
    /// bad value is reported even where it is not used yet).
    ///
    /// # Errors
    /// The field of the first URL that does not parse.
    pub fn parse(up: &UpstreamConfig, cluster: &ClusterConfig) -> Result<Self, ConfigError> {
        let invalid = |field| move |why| ConfigError::Invalid { field, why };
        let url = UpstreamUrl::parse(&up.url).map_err(invalid("upstream.url"))?;
        let seeds = cluster
            .seeds
            .iter()
            .map(|s| UpstreamUrl::parse(s).map_err(invalid("cluster.seeds")))
            .collect::<Result<Vec<_>, _>>()?;
        if cluster.enabled() && cluster.refresh_ms == 0 {
            return Err(ConfigError::Invalid {
                field: "cluster.refresh_ms",
                why: "must be positive".into(),
            });
        }
        // One connector and one scheme for every node: a cluster is TLS throughout or not.
        if seeds.iter().any(|s| s.tls != seeds[0].tls) {
            return Err(ConfigError::Invalid {
                field: "cluster.seeds",
                why: "mixes redis:// and rediss:// seeds; a cluster is TLS throughout or not"
                    .into(),
            });
        }
        let primary = seeds.first().cloned().unwrap_or(url);
        Ok(UpstreamTarget {
            tls: primary.tls,
            primary,
            seeds,
        })
    }
}

impl UpstreamConfig {
    /// Checks the connection settings; the error names the field.
    ///
    /// # Errors
    /// The first invalid field found.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |field: &'static str, why: &str| ConfigError::Invalid {
            field,
            why: why.to_string(),
        };
        self.tls
            .validate()
            .map_err(|e| super::tls_invalid("upstream.tls", &e))?;
        if self.connections == 0 || self.connections > 64 {
            return Err(invalid("upstream.connections", "must be 1 to 64"));
        }
        if self.connect_timeout_ms == 0 {
            return Err(invalid("upstream.connect_timeout_ms", "must be positive"));
        }
        if self.reconnect_min_ms == 0 || self.reconnect_max_ms < self.reconnect_min_ms {
            return Err(invalid(
                "upstream.reconnect_min_ms",
                "must be positive and at most reconnect_max_ms",
            ));
        }
        Ok(())
    }
}
