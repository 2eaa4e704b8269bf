//! The client-facing server: accept loop, client limit, one task per connection.

mod cached;
mod clients;
mod cluster_view;
mod connection;
mod corral;
mod info;
mod mget;
mod pending;
mod pubcount;
mod routed;
mod stateful;
mod subscriber;
mod tracking;
mod users;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, debug_span, error, warn};

use crate::cache::Cache;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::pubsub::Router;
use crate::resp::reply;
use crate::upstream::Upstream;

/// State shared by all connections.
#[derive(Debug)]
pub struct Shared {
    /// Frozen configuration.
    pub cfg: Arc<Config>,
    /// Upstream connections.
    pub upstream: Upstream,
    /// Local cache and coalescing; `None` with `--no-cache`.
    pub cache: Option<Cache>,
    /// Shared pub/sub subscriptions.
    pub pubsub: Arc<Router>,
    /// Metrics registry.
    pub metrics: Arc<Metrics>,
    /// When the server started (INFO uptime).
    pub started: Instant,
    /// Connected clients, for CLIENT LIST and CLIENT KILL.
    pub clients: clients::Registry,
    /// Inboxes and redirection sinks of client-side caching (CLIENT TRACKING).
    tracking: tracking::Registry,
    next_id: AtomicU64,
    client_count: AtomicUsize,
}

impl Shared {
    /// Shared state for a server in front of `upstream`.
    pub fn new(
        cfg: Arc<Config>,
        upstream: Upstream,
        cache: Option<Cache>,
        pubsub: Arc<Router>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Shared {
            cfg,
            upstream,
            cache,
            pubsub,
            metrics,
            started: Instant::now(),
            clients: clients::Registry::default(),
            tracking: tracking::Registry::default(),
            next_id: AtomicU64::new(1),
            client_count: AtomicUsize::new(0),
        }
    }

    /// Clients connected now.
    pub fn clients(&self) -> usize {
        self.client_count.load(Ordering::Relaxed)
    }
}

/// Decrements the client count when a connection task ends, however it ends.
struct ClientSlot(Arc<Shared>);

impl Drop for ClientSlot {
    fn drop(&mut self) {
        self.0.client_count.fetch_sub(1, Ordering::Relaxed);
        self.0.metrics.connected_clients.dec();
    }
}

/// Accepts clients until `shutdown` is cancelled. Connection tasks are spawned on `tracker`
/// so the caller can wait for them to finish.
pub async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
) {
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = shutdown.cancelled() => return,
        };
        let (mut stream, addr) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Usually EMFILE: wait a little instead of spinning.
                error!(cause = %e, "failed to accept");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if shared.client_count.fetch_add(1, Ordering::Relaxed) >= shared.cfg.max_clients {
            shared.client_count.fetch_sub(1, Ordering::Relaxed);
            shared.metrics.rejected_connections.inc();
            warn!(client.addr = %addr, "max clients reached, refusing connection");
            tracker.spawn(async move {
                let _ = stream.write_all(reply::MAX_CLIENTS).await;
            });
            continue;
        }
        shared.metrics.connections.inc();
        shared.metrics.connected_clients.inc();
        let _ = stream.set_nodelay(true);
        let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
        let slot = ClientSlot(shared.clone());
        let span = debug_span!("client", id, client.addr = %addr);
        let token = shutdown.child_token();
        let conn_shared = shared.clone();
        tracker.spawn(
            async move {
                let _slot = slot;
                if let Err(e) = connection::run(stream, id, conn_shared, token).await {
                    debug!(cause = %e, "connection closed with error");
                }
            }
            .instrument(span),
        );
    }
}
