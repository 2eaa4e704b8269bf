//! Configuration: a TOML file (see `conf/corral.toml`) with defaults for every field.
//! The config is validated once at startup and then shared read-only as `Arc<Config>`.

use std::fmt;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::acl::{Guard, GuardConfig, UserSpec, Users};
use crate::error::ConfigError;
use crate::tls::ListenTls;

mod upstream;
mod url;

pub use upstream::{ClusterConfig, Health, ReadFrom, UpstreamConfig, UpstreamTarget};
pub use url::{UpstreamUrl, host_of};

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
    /// The TLS listener for clients, beside the plain one (`[tls]`, `--tls-listen`).
    pub tls: ListenTls,
    /// corral's own users (`[[users]]`), checked by corral; `requirepass` is `default`.
    pub users: Vec<UserSpec>,
    /// What happens to AUTH for users corral does not know.
    pub auth: AuthConfig,
    /// Commands refused or renamed for every client (`[commands]`).
    pub commands: GuardConfig,
}

/// `[auth]`: AUTH and HELLO AUTH for users not in `[[users]]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// `true` (the default): AUTH as a user other than `default` and not in `[[users]]` is
    /// checked by Redis, and the client's commands then run on upstream connections
    /// authenticated as that user (Redis's own ACL users, passed through). `false`: such an
    /// AUTH fails with WRONGPASS, as for a user Redis does not know.
    pub passthrough: bool,
    /// Most pools of Redis ACL users open at once: one per user and password that clients
    /// authenticated with. An AUTH needing one more gets an error.
    pub max_user_pools: usize,
    /// Shared pipelined connections of a user's pool per protocol and database in use.
    pub user_connections: usize,
    /// A user's pool is closed once it had no client for this long.
    pub user_pool_idle_ms: u64,
}

impl Default for AuthConfig {
    fn default() -> Self {
        AuthConfig {
            passthrough: true,
            max_user_pools: 64,
            user_connections: 2,
            user_pool_idle_ms: 60_000,
        }
    }
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
    /// Lowest the admission bar comes while the cache serves at least half the GETs
    /// (1..=15; at or over `hot_threshold` the bar stays at `hot_threshold`).
    pub hot_threshold_min: u8,
    /// Lets the read sketch count over a window eight times longer, in a table eight times
    /// larger (allocated at start), while the cache serves most GETs and few keys are
    /// written, so that a skewed load's tail is cached too.
    pub long_window: bool,
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
    /// Before a round of a client's GETs is answered from the cache, waits for a PING on the
    /// tracking lanes, so that a write acknowledged by Redis (direct ones too) before the
    /// GETs were sent is never read back stale (`cache/barrier.rs`).
    pub read_barrier: bool,
    /// How often the hottest keys the cache served are touched on Redis (`TOUCH`), so that
    /// an LRU or LFU `maxmemory-policy` sees them used; 0 turns it off (`cache/touch.rs`).
    pub touch_ms: u64,
    /// Renews the tracking lanes once Redis is estimated to track this many keys for them
    /// and the store holds few (`cache/renew.rs`); 0 never does.
    pub lane_renew_keys: u64,
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
            tls: ListenTls::default(),
            users: Vec::new(),
            auth: AuthConfig::default(),
            commands: GuardConfig::default(),
        }
    }
}

impl Default for LimitsConfig {
    fn default() -> Self {
        // Redis's request limits, stated once with the parser that enforces them.
        let redis = crate::resp::Limits::default();
        LimitsConfig {
            proto_max_bulk_len: redis.max_bulk_len,
            max_multibulk_len: redis.max_multibulk_len,
            max_inline_len: redis.max_inline_len,
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
            hot_threshold: 6,
            hot_threshold_min: 2,
            long_window: true,
            max_value_bytes: 512 * 1024,
            max_age_ms: 60_000,
            fallback_ttl_ms: 1_000,
            refresh_beta: 1.0,
            lane_check_ms: 500,
            lane_deadline_ms: 500,
            read_barrier: false,
            touch_ms: 250,
            lane_renew_keys: 65_536,
        }
    }
}

impl Config {
    /// Parses a TOML document and validates it.
    ///
    /// # Errors
    /// A syntax error, an unknown field, or a value that fails [`Config::validate`].
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let cfg: Config =
            toml::from_str(text).map_err(|e| ConfigError::Parse(parse_error(text, &e)))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads and parses a TOML file.
    ///
    /// # Errors
    /// The file cannot be read, or [`Config::from_toml`] fails.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let cfg = Config::read(path)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Reads and parses a TOML file without [`Config::validate`]: for a caller that applies
    /// overrides (command-line flags) first and validates the result.
    ///
    /// # Errors
    /// The file cannot be read, does not parse, or has unknown fields.
    pub fn read(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read {
            path: path.display().to_string(),
            cause: e.to_string(),
        })?;
        toml::from_str(&text).map_err(|e| ConfigError::Parse(parse_error(&text, &e)))
    }

    /// Checks values that parse but make no sense, and returns the upstream the config
    /// names: the one place upstream URLs are parsed. The error names the field.
    ///
    /// # Errors
    /// The first invalid field found.
    pub fn validate(&self) -> Result<UpstreamTarget, ConfigError> {
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
        let target = UpstreamTarget::parse(&self.upstream, &self.cluster)?;
        self.upstream.validate()?;
        self.tls.validate().map_err(|e| tls_invalid("tls", &e))?;
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
        let a = &self.auth;
        if a.user_connections == 0 || a.user_connections > 64 {
            return Err(invalid("auth.user_connections", "must be 1 to 64"));
        }
        if a.user_pool_idle_ms == 0 {
            return Err(invalid("auth.user_pool_idle_ms", "must be positive"));
        }
        let c = &self.cache;
        if c.hot_threshold == 0 || c.hot_threshold > 15 {
            return Err(invalid("cache.hot_threshold", "must be 1 to 15"));
        }
        if c.hot_threshold_min == 0 || c.hot_threshold_min > 15 {
            return Err(invalid("cache.hot_threshold_min", "must be 1 to 15"));
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
        if c.touch_ms != 0 && !(10..=3_600_000).contains(&c.touch_ms) {
            return Err(invalid(
                "cache.touch_ms",
                "must be 0 (off) or 10 to 3600000",
            ));
        }
        self.acl()?;
        Ok(target)
    }

    /// corral's users and command guard, compiled from `[[users]]`, `requirepass` and
    /// `[commands]`.
    ///
    /// # Errors
    /// A user or a command entry that does not compile (the error names it, never a password).
    pub fn acl(&self) -> Result<(Users, Guard), ConfigError> {
        let invalid = |field: &'static str, why: String| ConfigError::Invalid { field, why };
        if self.users.iter().any(|u| u.name == "default") {
            // `requirepass` is the default user: one place for its password.
            return Err(invalid(
                "users",
                "'default' is requirepass's user and cannot be a [[users]] entry".into(),
            ));
        }
        let users =
            Users::new(&self.users, self.requirepass.get()).map_err(|e| invalid("users", e))?;
        let guard = Guard::new(&self.commands).map_err(|e| invalid("commands", e))?;
        Ok((users, guard))
    }

    /// `upstream.hold_writes_at` as set, else `upstream::HOLD_WRITES_AT`. Holding a write
    /// while many requests are out lets the requests of every client arriving meanwhile go
    /// out as one write. Without the cache, Zipf GETs from 50 clients 16 deep went from
    /// 0.65M to 0.88M requests/s with it (corral's CPU per request 0.47 → 0.39 µs, Redis's
    /// unchanged). With the cache serving many GETs a round sends Redis only its misses, so
    /// unless the bar is set the cache lowers it to 1 while it serves (see
    /// [`Config::holds_follow_cache`] and `cache/holds.rs`).
    pub fn hold_writes_at(&self) -> usize {
        self.upstream
            .hold_writes_at
            .unwrap_or(upstream::HOLD_WRITES_AT)
    }

    /// Whether the cache lowers the bar writes are held at: `upstream.hold_writes_at` is unset.
    pub fn holds_follow_cache(&self) -> bool {
        self.upstream.hold_writes_at.is_none()
    }

    /// Deadline for one upstream connect.
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.upstream.connect_timeout_ms)
    }

    /// Liveness checks of the long-lived upstream connections (tracking lanes, shared and
    /// pub/sub connections).
    pub fn health(&self) -> Health {
        Health {
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

/// A TOML error as its message and line, without the excerpt of the file `toml` would quote:
/// the line may hold a password (`upstream.url`, `requirepass`), and the error is logged.
fn parse_error(text: &str, e: &toml::de::Error) -> String {
    let message = e.message().trim_end();
    match e.span() {
        Some(span) => {
            let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
            format!("line {line}: {message}")
        }
        None => message.to_string(),
    }
}

/// A TLS settings error as a config error naming `field`, without the field repeated (the
/// TLS module's messages start with their section).
fn tls_invalid(field: &'static str, e: &crate::tls::TlsError) -> ConfigError {
    let text = e.to_string();
    let mut why = text.as_str();
    // `tls: tls.listen: ...`, `tls: upstream.tls: ...`: every leading section name goes.
    while let Some(rest) = [field, "tls"]
        .iter()
        .find_map(|p| why.strip_prefix(p).and_then(|t| t.strip_prefix(": ")))
    {
        why = rest;
    }
    ConfigError::Invalid {
        field,
        why: why.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_document_gives_defaults() {
        let cfg = Config::from_toml("").unwrap();
        let target = cfg.validate().unwrap();
        assert!(!target.tls && !cfg.tls.enabled());
        // The admin endpoint is off unless configured (and then on the address given).
        assert_eq!(cfg.admin, "");
        assert_eq!(target.primary.addr, "127.0.0.1:6379");
        assert_eq!(cfg.listen, "127.0.0.1:6380");
        assert_eq!(cfg.upstream.url, "redis://127.0.0.1:6379");
        assert!(cfg.cache.enabled);
    }

    #[test]
    fn writes_are_held_at_the_bar_set_and_left_to_the_cache_only_when_unset() {
        let cfg = Config::from_toml("").unwrap();
        assert_eq!(cfg.hold_writes_at(), upstream::HOLD_WRITES_AT);
        assert!(cfg.holds_follow_cache());
        let set = Config::from_toml("[upstream]\nhold_writes_at = 7\n").unwrap();
        assert_eq!(set.hold_writes_at(), 7);
        assert!(!set.holds_follow_cache());
        let off = Config::from_toml("[upstream]\nhold_writes_at = 0\n").unwrap();
        assert_eq!(off.hold_writes_at(), 0);
        assert!(!off.holds_follow_cache());
    }

    #[test]
    fn the_least_admission_bar_is_1_to_15() {
        for bad in [0, 16] {
            let err =
                Config::from_toml(&format!("[cache]\nhot_threshold_min = {bad}\n")).unwrap_err();
            assert!(err.to_string().contains("cache.hot_threshold_min"), "{err}");
        }
        for good in [1, 15] {
            let cfg = Config::from_toml(&format!("[cache]\nhot_threshold_min = {good}\n"));
            assert_eq!(cfg.map(|c| c.cache.hot_threshold_min).ok(), Some(good));
        }
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
    fn parse_errors_name_the_line_but_never_quote_it() {
        let err = Config::from_toml("log_level = \"info\"\nrequirepass = \"hunter2").unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("line 2") && !text.contains("hunter2"),
            "{text}"
        );
    }

    #[test]
    fn secret_is_masked_in_debug() {
        let cfg = Config::from_toml("requirepass = \"hunter2\"").unwrap();
        assert!(!format!("{cfg:?}").contains("hunter2"));
        assert_eq!(cfg.requirepass.get(), Some("hunter2"));
    }

    #[test]
    fn tls_sections_parse_and_are_checked() {
        let cfg = Config::from_toml(
            "[upstream]\nurl = \"rediss://db:6380\"\n[upstream.tls]\nca_file = \"ca.pem\"\n\
             [tls]\nlisten = \"127.0.0.1:6381\"\ncert_file = \"s.pem\"\nkey_file = \"s.key\"",
        )
        .unwrap();
        assert!(cfg.validate().unwrap().tls);
        assert!(cfg.tls.enabled());
        let err = Config::from_toml("[tls]\nlisten = \"127.0.0.1:6381\"").unwrap_err();
        assert!(err.to_string().contains("cert_file"), "{err}");
        let err =
            Config::from_toml("[tls]\ncert_file = \"s.pem\"\nkey_file = \"s.key\"").unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid config: tls: certificates are set but no listen address \
             (tls.listen or --tls-listen)"
        );
        let mixed = "[cluster]\nseeds = [\"rediss://a:1\", \"redis://b:2\"]";
        let err = Config::from_toml(mixed).unwrap_err();
        assert!(err.to_string().contains("cluster.seeds"), "{err}");
    }

    #[test]
    fn users_and_commands_are_checked_at_load() {
        let ok = "[[users]]\nname = \"app\"\npassword = \"s3cret\"\nrules = \"+@read ~cache:*\"\n\
                  [commands]\ndeny = [\"FLUSHALL\", \"SCRIPT FLUSH\"]\nrename = { CONFIG = \"CFG_X\" }\n\
                  [auth]\npassthrough = false\n";
        let cfg = Config::from_toml(ok).unwrap();
        assert!(!cfg.auth.passthrough);
        let (users, guard) = cfg.acl().unwrap();
        assert!(users.authenticate(b"app", b"s3cret").is_some());
        assert!(!guard.is_empty());
        assert!(Config::from_toml("").unwrap().auth.passthrough);
        let bad = [
            "[[users]]\nname = \"app\"\npassword = \"s3cret\"\nrules = \"+nosuch|sub\"",
            "[[users]]\nname = \"app\"\npassword = \"s3cret\"\nrules = \"%R~x\"",
            "[[users]]\nname = \"default\"\npassword = \"s3cret\"",
            "[commands]\ndeny = [\"NOSUCH\"]",
            "[commands]\nrename = { CONFIG = \"GET\" }",
        ];
        for text in bad {
            let err = Config::from_toml(text).unwrap_err().to_string();
            assert!(!err.contains("s3cret"), "{err}");
            assert!(err.contains("users") || err.contains("commands"), "{err}");
        }
    }

    #[test]
    fn shipped_example_config_parses() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("conf/corral.toml");
        Config::load(&path).unwrap();
    }
}
