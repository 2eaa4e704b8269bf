//! State shared by every client connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use super::clients;
use super::track_state;
use crate::acl::{Guard, Users};
use crate::cache::Cache;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::pubsub::Router;
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
    pub(super) tracking: track_state::Registry,
    /// corral's own users (`[[users]]`) and `default`.
    pub(super) users: Users,
    /// Commands refused or renamed for every client (`[commands]`).
    pub(super) guard: Guard,
    pub(super) next_id: AtomicU64,
    pub(super) client_count: AtomicUsize,
}

impl Shared {
    /// Shared state for a server in front of `upstream`.
    pub fn new(
        cfg: Arc<Config>,
        upstream: Upstream,
        cache: Option<Cache>,
        pubsub: Arc<Router>,
        metrics: Arc<Metrics>,
        (users, guard): (Users, Guard),
    ) -> Self {
        Shared {
            cfg,
            upstream,
            cache,
            pubsub,
            metrics,
            started: Instant::now(),
            clients: clients::Registry::default(),
            tracking: track_state::Registry::default(),
            users,
            guard,
            next_id: AtomicU64::new(1),
            client_count: AtomicUsize::new(0),
        }
    }

    /// Clients connected now.
    pub fn clients(&self) -> usize {
        self.client_count.load(Ordering::Relaxed)
    }
}
