//! corral: a drop-in caching proxy for Redis.
//!
//! Clients speak RESP2 or RESP3 to corral as they would to Redis. Requests are answered locally
//! where forwarding would be wrong (connection state such as HELLO, AUTH, CLIENT SETNAME) and
//! otherwise forwarded, pipelined, over a few shared upstream connections. GETs are coalesced
//! per key and hot keys are served from a local cache kept coherent with `CLIENT TRACKING`.
//! Layers, bottom up (each imports only the layers before it; `docs/ARCHITECTURE.md` has the
//! map): [`error`], [`resp`] (bytes and frames), [`commands`] (what a request is),
//! [`cluster`], [`acl`] and [`config`], [`upstream`] (connections), [`cache`] (local cache,
//! coalescing, tracking lanes) and [`pubsub`], [`server`] (accept loop and client
//! connections), [`admin`].
//!
//! No `unsafe` code but three places, each allowed on its item with its reason: the CPU
//! prefetch hint in `prefetch.rs`, the global allocator's calls into mimalloc in [`heap`],
//! and in `huge.rs` the cache's tables mapped on huge pages and the process's huge-page
//! setting (`prctl`).
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod acl;
pub mod admin;
pub mod cache;
pub mod cluster;
pub mod commands;
pub mod config;
pub mod error;
pub mod heap;
mod huge;
pub mod metrics;
mod prefetch;
pub mod pubsub;
pub mod reload;
pub mod resp;
pub mod server;
pub mod striped;
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
pub use heap::Heap;
pub use huge::{HeapPages, keep_heap_off_huge_pages};
pub use reload::Reloader;

/// corral's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The sockets a server serves on, bound by the caller (tests bind ephemeral ports).
#[derive(Debug)]
pub struct Listeners {
    /// Client (RESP) listener.
    pub client: TcpListener,
    /// Admin HTTP listener, if enabled.
    pub admin: Option<TcpListener>,
    /// TLS client listener; `None` with `[tls]` set binds `tls.listen` itself.
    pub tls: Option<TcpListener>,
}

/// Runs corral until `shutdown` is cancelled, then stops accepting, lets connections finish
/// the request they are on within `shutdown_grace_ms`, and returns.
///
/// # Errors
/// The configuration is invalid, or a file it names (certificates) cannot be used.
pub async fn run(
    cfg: Arc<Config>,
    listeners: Listeners,
    shutdown: CancellationToken,
) -> Result<()> {
    run_with(cfg, listeners, shutdown, Reloader::default()).await
}

/// [`run`], reloadable through `reloader` (see [`reload`]).
///
/// # Errors
/// As [`run`].
pub async fn run_with(
    cfg: Arc<Config>,
    listeners: Listeners,
    shutdown: CancellationToken,
    reloader: Reloader,
) -> Result<()> {
    let target = cfg.validate()?;
    let access = Arc::new(upstream::UpstreamAccess::new(
        upstream::Access::from_config(&cfg, &target)?,
    ));
    let acceptor = tls_acceptor(&cfg)?;
    let tls_listener = match (listeners.tls, &acceptor) {
        (Some(l), Some(_)) => Some(l),
        (None, Some(_)) => Some(bind(&cfg.tls.listen).await?),
        (_, None) => None,
    };
    let requirepass = Arc::new(acl::DefaultPassword::new(cfg.requirepass.get()));
    reloader.attach(reload::Live {
        started: cfg.clone(),
        access: access.clone(),
        acceptor: acceptor.clone(),
        requirepass: requirepass.clone(),
        applied: std::sync::Mutex::new(cfg.clone()),
    });
    let acl = cfg.acl()?;
    // Every upstream connection (shared, dedicated, cache lanes, pub/sub) starts from these.
    let base = upstream::ConnSettings::new(&cfg, &target.primary, access.clone());
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
        server::Auth::new(requirepass, access),
    ));
    if let Some(admin) = listeners.admin {
        tokio::spawn(admin::serve(admin, shared.clone(), upstream_token.clone()));
    }
    tokio::spawn(give_back_while_idle(
        shared.metrics.clone(),
        upstream_token.child_token(),
    ));
    tokio::spawn(server::reroute_on_dropped_pools(
        shared.clone(),
        upstream_token.child_token(),
    ));
    if let Some(cluster) = &shared.upstream.cluster {
        // Until corral has the slot map, every request would get CLUSTERDOWN: clients that
        // connect meanwhile wait in the listen backlog instead, for as long as one try at a
        // seed may take (its connect, then its handshake). A cluster still out of reach
        // then is answered CLUSTERDOWN until it is reached.
        let within = cfg.connect_timeout() * 2;
        let known = tokio::select! {
            known = cluster.wait_for_map(within) => known,
            () = shutdown.cancelled() => false,
        };
        if !known && !shutdown.is_cancelled() {
            warn!(
                waited_ms = within.as_millis() as u64,
                "no slot map from the cluster yet: accepting clients, whose requests get CLUSTERDOWN until there is one"
            );
        }
    }
    let tracker = TaskTracker::new();
    if let Ok(addr) = listeners.client.local_addr() {
        let tls_listen = tls_listener.as_ref().and_then(|l| l.local_addr().ok());
        info!(listen = %addr, tls_listen = ?tls_listen, upstream = %target.primary.addr,
              upstream_tls = target.tls, "corral ready");
    }
    let tls = tls_listener.zip(acceptor);
    accept_all(listeners.client, tls, shared, shutdown, tracker.clone()).await;
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

/// Once every [`heap::GIVE_BACK_EVERY`] in which no client sent a request, has the allocator
/// hand back to the system what was freed ([`heap::give_back`]), on the thread this task runs
/// on: with the default single thread, all of corral's heap but its blocking threads'. An
/// idle process would otherwise keep what a burst freed (mimalloc purges only as a thread
/// allocates or frees). Under load mimalloc purges on its own, and a forced collect there
/// only holds up the thread: one took 17 ms, when a load's switch from Zipf GETs to the 90/10
/// mix had the cache drop most of its entries within a second. Until `stop`.
async fn give_back_while_idle(metrics: Arc<metrics::Metrics>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(heap::GIVE_BACK_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut seen = metrics.commands.get();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = stop.cancelled() => return,
        }
        let now = metrics.commands.get();
        if now == seen {
            heap::give_back();
        }
        seen = now;
    }
}

/// Runs the accept loops, plain and TLS, until `shutdown`.
async fn accept_all(
    plain: TcpListener,
    tls: Option<(TcpListener, Arc<tls::TlsAcceptorHandle>)>,
    shared: Arc<server::Shared>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) {
    let plain_loop = server::serve(
        plain,
        None,
        shared.clone(),
        shutdown.clone(),
        tracker.clone(),
    );
    match tls {
        Some((listener, acceptor)) => {
            let tls_loop = server::serve(listener, Some(acceptor), shared, shutdown, tracker);
            tokio::join!(plain_loop, tls_loop);
        }
        None => plain_loop.await,
    }
}

/// The TLS listener's certificates, read now, when `[tls]` is set.
fn tls_acceptor(cfg: &Config) -> Result<Option<Arc<tls::TlsAcceptorHandle>>> {
    if !cfg.tls.enabled() {
        return Ok(None);
    }
    let handle = tls::TlsAcceptorHandle::try_new(&cfg.tls).map_err(|e| {
        Error::Config(error::ConfigError::Invalid {
            field: "tls",
            why: e.to_string(),
        })
    })?;
    Ok(Some(Arc::new(handle)))
}

async fn bind(addr: &str) -> Result<TcpListener> {
    TcpListener::bind(addr).await.map_err(|cause| Error::Io {
        what: format!("cannot listen on {addr}"),
        cause,
    })
}
