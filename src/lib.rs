//! corral: a drop-in caching proxy for Redis.
//!
//! Clients speak RESP2 or RESP3 to corral as they would to Redis. Requests are answered locally
//! where forwarding would be wrong (connection state such as HELLO, AUTH, CLIENT SETNAME) and
//! otherwise forwarded, pipelined, over a few shared upstream connections. GETs are coalesced
//! per key and hot keys are served from a local cache kept coherent with `CLIENT TRACKING`.
//! Layers, bottom up: [`resp`] (bytes and frames), [`commands`] (routing and per-client
//! state), [`upstream`] (connections), [`cache`] (local cache, coalescing, tracking lane),
//! [`server`] (accept loop and client connections).
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod acl;
pub mod admin;
pub mod cache;
pub mod cluster;
pub mod commands;
pub mod config;
pub mod error;
pub mod metrics;
pub mod pubsub;
pub mod resp;
pub mod server;
pub mod tls;
pub mod upstream;

use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{info, warn};

pub use config::Config;
pub use error::{Error, Result};

/// corral's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The sockets a server serves on, bound by the caller (tests bind ephemeral ports).
#[derive(Debug)]
pub struct Listeners {
    /// Client (RESP) listener.
    pub client: TcpListener,
    /// Admin HTTP listener, if enabled.
    pub admin: Option<TcpListener>,
}

/// Runs corral until `shutdown` is cancelled, then stops accepting, lets connections finish
/// the request they are on within `shutdown_grace_ms`, and returns.
///
/// # Errors
/// The configuration is invalid.
pub async fn run(
    cfg: Arc<Config>,
    listeners: Listeners,
    shutdown: CancellationToken,
) -> Result<()> {
    let target = cfg.validate()?;
    let acl = cfg.acl()?;
    // Every upstream connection (shared, dedicated, cache lanes, pub/sub) starts from these.
    let base = upstream::ConnSettings::new(&cfg, &target.primary);
    // Upstream connections outlive client connections during the drain, so in-flight requests
    // can complete; they get their own token, cancelled last.
    let upstream_token = CancellationToken::new();
    let upstream = upstream::Upstream::start(&cfg, &target, base.clone(), &upstream_token);
    let mut metrics = metrics::Metrics::default();
    metrics.count_upstream_connects(upstream.status.connects_counter());
    let cache = if cfg.cache.enabled {
        let status = upstream.status.clone();
        let c = cache::Cache::start(
            &cfg,
            base.clone(),
            status,
            upstream_token.child_token(),
            upstream.cluster.clone(),
        );
        c.register(metrics.registry_mut());
        Some(c)
    } else {
        None
    };
    let hub = pubsub::Router::start(
        base,
        upstream.status.clone(),
        upstream_token.child_token(),
        upstream.cluster.clone(),
    );
    let shared = Arc::new(server::Shared::new(
        cfg.clone(),
        upstream,
        cache,
        hub,
        Arc::new(metrics),
        acl,
    ));
    if let Some(admin) = listeners.admin {
        tokio::spawn(admin::serve(admin, shared.clone(), upstream_token.clone()));
    }
    let tracker = TaskTracker::new();
    if let Ok(addr) = listeners.client.local_addr() {
        info!(listen = %addr, upstream = %target.primary.addr, "corral ready");
    }
    server::serve(listeners.client, shared, shutdown, tracker.clone()).await;
    tracker.close();
    let grace = Duration::from_millis(cfg.shutdown_grace_ms);
    if tokio::time::timeout(grace, tracker.wait()).await.is_err() {
        warn!(
            remaining = tracker.len(),
            "shutdown grace period over, dropping connections"
        );
    }
    upstream_token.cancel();
    info!("corral stopped");
    Ok(())
}
