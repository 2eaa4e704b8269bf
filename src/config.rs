//! Configuration: a TOML file (see `conf/corral.toml`) with defaults for every field.
//! The config is validated once at startup and then shared read-only as `Arc<Config>`.

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::error::ConfigError;
use crate::upstream::UpstreamUrl;

/// The whole configuration of one corral process.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Address clients connect to.
    pub listen: String,
    /// Address of the HTTP admin endpoint (`/healthz`, `/metrics`); empty disables it.
    pub admin: String,
    /// Password clients must give with AUTH or HELLO before anything else; empty disables it.
    pub requirepass: Secret,
    /// Log filter (`error`, `warn`, `info`, `debug`, `trace` or a `tracing` directive).
    pub log_level: String,
    /// Worker threads: 1 (the default) runs everything on one thread with no cross-thread
    /// wake-ups, which measured best when the proxy shares a few cores with Redis and its
    /// clients; 0 means one per CPU core, for machines where corral itself is the bottleneck.
    pub threads: usize,
    /// Most clients connected at once; further connections get an error and are closed.
    pub max_clients: usize,
    /// How long shutdown waits for in-flight requests before giving up.
    pub shutdown_grace_ms: u64,
    /// Where requests go.
    pub upstream: UpstreamConfig,
    /// Bounds on what one client may send.
    pub limits: LimitsConfig,
    /// Local cache and read coalescing.
    pub cache: CacheConfig,
    /// Redis Cluster upstream (instead of `upstream.url`).
    pub cluster: ClusterConfig,
}

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
    /// Deadline for establishing (and authenticating) one upstream connection.
    pub connect_timeout_ms: u64,
    /// Deadline for the reply to a request on a shared connection; 0 waits forever. Dedicated
    /// connections (scripts, transactions, blocking commands) wait as long as Redis takes.
    pub request_timeout_ms: u64,
    /// First delay between reconnection attempts; doubles up to `reconnect_max_ms`.
    pub reconnect_min_ms: u64,
    /// Largest delay between reconnection attempts.
    pub reconnect_max_ms: u64,
    /// Most connections reserved for single clients at once (transactions, blocking
    /// commands, scripts, clients authenticated as a Redis ACL user); further transactions and blocking commands get an error, further
    /// scripts use the shared connections.
    pub max_dedicated: usize,
    /// Run a script or function on a dedicated connection (for the rest of its client's
    /// round) until it is known to finish quickly, so a long one never holds up other
    /// clients; `false` keeps every script on the shared connections.
    pub isolate_scripts: bool,
    /// Most clients with CLIENT TRACKING on at once, each holding a dedicated connection
    /// (counted in `max_dedicated` too), plus the REDIRECT targets' connections.
    pub max_tracking_clients: usize,
}

/// Per-client limits, named after the Redis settings they mirror.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Largest bulk string in a request (`proto-max-bulk-len`).
    pub proto_max_bulk_len: usize,
    /// Most arguments in one request.
    pub max_multibulk_len: usize,
    /// Longest inline (telnet-style) request line.
    pub max_inline_len: usize,
    /// Most unparsed request bytes buffered for one client (`client-query-buffer-limit`).
    pub client_query_buffer_limit: usize,
    /// Most reply bytes waiting to be written to one client; 0 means no limit.
    pub client_output_buffer_limit: usize,
}

/// The local hot-key cache and GET coalescing.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CacheConfig {
    /// Turns the local cache and coalescing on or off (`--no-cache` turns them off).
    pub enabled: bool,
    /// Memory budget of the local cache: keys, values and per-entry overhead.
    pub max_bytes: u64,
    /// Frequency estimate (1..=15, in a decaying window) at which a key counts as hot and is
    /// cached locally.
    pub hot_threshold: u8,
    /// Values larger than this are never cached (big keys).
    pub max_value_bytes: usize,
    /// Longest time an entry is served without a refresh, even for keys without a TTL.
    pub max_age_ms: u64,
    /// Entry lifetime when the upstream cannot track keys (no `CLIENT TRACKING`).
    pub fallback_ttl_ms: u64,
    /// XFetch β: larger refreshes hot entries earlier before they expire; 0 disables refresh.
    pub refresh_beta: f64,
    /// Quiet time after which a tracking lane (and any other long-lived upstream connection:
    /// shared, pub/sub) is sent a PING.
    pub lane_check_ms: u64,
    /// How long a lane's PING, or an outstanding fill, may go unanswered before the lane is
    /// reset and its entries dropped; other long-lived connections are replaced when their
    /// PING goes unanswered this long. `lane_check_ms + lane_deadline_ms` bounds how long a
    /// cached value can outlive a write acknowledged by Redis while the lane is silently dead.
    pub lane_deadline_ms: u64,
}

/// A password: shown as `MASKED` in logs and debug output.
#[derive(Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(pub String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("MASKED")
    }
}

impl Secret {
    /// The password, or `None` when none is set.
    pub fn get(&self) -> Option<&str> {
        (!self.0.is_empty()).then_some(self.0.as_str())
    }
}

impl Default for Config {
    fn default() -> Self {
        Config {
            listen: "127.0.0.1:6380".into(),
            admin: String::new(),
            requirepass: Secret::default(),
            log_level: "info".into(),
            threads: 1,
            max_clients: 10_000,
            shutdown_grace_ms: 5_000,
            upstream: UpstreamConfig::default(),
            limits: LimitsConfig::default(),
            cache: CacheConfig::default(),
            cluster: ClusterConfig::default(),
        }
    }
}

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
        }
    }
}

impl UpstreamConfig {
    /// The upstream address without credentials, for logs.
    pub fn url_for_log(&self) -> String {
        UpstreamUrl::parse(&self.url)
            .map(|u| u.addr)
            .unwrap_or_default()
    }
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            proto_max_bulk_len: 512 * 1024 * 1024,
            max_multibulk_len: i32::MAX as usize,
            max_inline_len: 64 * 1024,
            client_query_buffer_limit: 1024 * 1024 * 1024,
            client_output_buffer_limit: 0,
        }
    }
}

impl Default for CacheConfig {
    fn default() -> Self {
        CacheConfig {
            enabled: true,
            max_bytes: 256 * 1024 * 1024,
            hot_threshold: 4,
            max_value_bytes: 512 * 1024,
            max_age_ms: 60_000,
            fallback_ttl_ms: 1_000,
            refresh_beta: 1.0,
            lane_check_ms: 500,
            lane_deadline_ms: 500,
        }
    }
}

impl Config {
    /// Parses a TOML document and validates it.
    ///
    /// # Errors
    /// A syntax error, an unknown field, or a value that fails [`Config::validate`].
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads and parses a TOML file.
    ///
    /// # Errors
    /// The file cannot be read, or [`Config::from_toml`] fails.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
            path: path.display().to_string(),
            cause: e.to_string(),
        })?;
        Config::from_toml(&text)
    }

    /// Checks values that parse but make no sense; the error names the field.
    ///
    /// # Errors
    /// The first invalid field found.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let invalid = |field: &'static str, why: &str| ConfigError::Invalid {
            field,
            why: why.to_string(),
        };
        self.listen
            .parse::<SocketAddr>()
            .map_err(|e| invalid("listen", &e.to_string()))?;
        if !self.admin.is_empty() {
            self.admin
                .parse::<SocketAddr>()
                .map_err(|e| invalid("admin", &e.to_string()))?;
        }
        UpstreamUrl::parse(&self.upstream.url).map_err(|e| invalid("upstream.url", &e))?;
        for seed in &self.cluster.seeds {
            UpstreamUrl::parse(seed).map_err(|e| invalid("cluster.seeds", &e))?;
        }
        if self.cluster.enabled() && self.cluster.refresh_ms == 0 {
            return Err(invalid("cluster.refresh_ms", "must be positive"));
        }
        if self.upstream.connections == 0 || self.upstream.connections > 64 {
            return Err(invalid("upstream.connections", "must be 1 to 64"));
        }
        if self.upstream.connect_timeout_ms == 0 {
            return Err(invalid("upstream.connect_timeout_ms", "must be positive"));
        }
        if self.upstream.reconnect_min_ms == 0
            || self.upstream.reconnect_max_ms < self.upstream.reconnect_min_ms
        {
            return Err(invalid(
                "upstream.reconnect_min_ms",
                "must be positive and at most reconnect_max_ms",
            ));
        }
        if self.max_clients == 0 {
            return Err(invalid("max_clients", "must be positive"));
        }
        let l = &self.limits;
        if l.proto_max_bulk_len < 1024 {
            return Err(invalid(
                "limits.proto_max_bulk_len",
                "must be at least 1024",
            ));
        }
        if l.max_inline_len < 1024 {
            return Err(invalid("limits.max_inline_len", "must be at least 1024"));
        }
        if l.max_multibulk_len == 0 {
            return Err(invalid("limits.max_multibulk_len", "must be positive"));
        }
        if l.client_query_buffer_limit < l.max_inline_len {
            return Err(invalid(
                "limits.client_query_buffer_limit",
                "must be at least max_inline_len",
            ));
        }
        let c = &self.cache;
        if c.hot_threshold == 0 || c.hot_threshold > 15 {
            return Err(invalid("cache.hot_threshold", "must be 1 to 15"));
        }
        if c.max_bytes < 1024 * 1024 {
            return Err(invalid("cache.max_bytes", "must be at least 1 MiB"));
        }
        if c.max_age_ms == 0 || c.fallback_ttl_ms == 0 {
            return Err(invalid(
                "cache.max_age_ms",
                "max_age_ms and fallback_ttl_ms must be positive",
            ));
        }
        if !(0.0..=100.0).contains(&c.refresh_beta) {
            return Err(invalid("cache.refresh_beta", "must be 0 to 100"));
        }
        if c.lane_check_ms < 10 || c.lane_check_ms > 3_600_000 {
            return Err(invalid("cache.lane_check_ms", "must be 10 to 3600000"));
        }
        if c.lane_deadline_ms < 10 || c.lane_deadline_ms > 3_600_000 {
            return Err(invalid("cache.lane_deadline_ms", "must be 10 to 3600000"));
        }
        Ok(())
    }

    /// The parsed upstream URL (valid after [`Config::validate`]).
    ///
    /// # Errors
    /// The URL does not parse.
    pub fn upstream_url(&self) -> Result<UpstreamUrl, ConfigError> {
        // In cluster mode the first seed gives the address to start from and the credentials.
        let (field, url) = match self.cluster.seeds.first() {
            Some(seed) => ("cluster.seeds", seed),
            None => ("upstream.url", &self.upstream.url),
        };
        UpstreamUrl::parse(url).map_err(|why| ConfigError::Invalid { field, why })
    }

    /// Deadline for one upstream connect.
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.upstream.connect_timeout_ms)
    }

    /// Liveness checks of the long-lived upstream connections (tracking lanes, shared and
    /// pub/sub connections).
    pub fn health(&self) -> crate::upstream::Health {
        crate::upstream::Health {
            check: Duration::from_millis(self.cache.lane_check_ms),
            deadline: Duration::from_millis(self.cache.lane_deadline_ms),
            strict: false,
        }
    }

    /// How long a cached value may outlive an acknowledged write while its tracking lane is
    /// silently dead: one check interval plus one deadline.
    pub fn stale_window(&self) -> Duration {
        self.health().window()
    }

    /// Deadline for one forwarded request, `None` for no deadline.
    pub fn request_timeout(&self) -> Option<Duration> {
        (self.upstream.request_timeout_ms > 0)
            .then(|| Duration::from_millis(self.upstream.request_timeout_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_document_gives_defaults() {
        let cfg = Config::from_toml("").unwrap();
        assert_eq!(cfg.listen, "127.0.0.1:6380");
        assert_eq!(cfg.upstream.url, "redis://127.0.0.1:6379");
        assert!(cfg.cache.enabled);
    }

    #[test]
    fn unknown_field_is_rejected() {
        let err = Config::from_toml("listne = \"x\"").unwrap_err();
        assert!(err.to_string().contains("listne"), "{err}");
    }

    #[test]
    fn invalid_value_names_the_field() {
        let err = Config::from_toml("[upstream]\nconnections = 0").unwrap_err();
        assert!(err.to_string().contains("upstream.connections"), "{err}");
    }

    #[test]
    fn secret_is_masked_in_debug() {
        let cfg = Config::from_toml("requirepass = \"hunter2\"").unwrap();
        assert!(!format!("{cfg:?}").contains("hunter2"));
        assert_eq!(cfg.requirepass.get(), Some("hunter2"));
    }

    #[test]
    fn shipped_example_config_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("conf/corral.toml");
        Config::load(&path).unwrap();
    }
}
