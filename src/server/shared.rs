//! State shared by every client connection.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use super::clients;
use super::track_state;
use crate::acl::{DefaultPassword, Guard, Users};
use crate::cache::Cache;
use crate::config::Config;
use crate::metrics::Metrics;
use crate::pubsub::Router;
use crate::upstream::{Upstream, UpstreamAccess};

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
    /// The `default` user's password, and what upstream connections authenticate with.
    pub(super) auth: Auth,
}

/// The passwords a `CONFIG SET requirepass` through corral changes (see [`Shared::new`]).
#[derive(Debug)]
pub struct Auth {
    /// The `default` user's password, which clients give corral.
    pub(super) requirepass: Arc<DefaultPassword>,
    /// What upstream connections authenticate with.
    pub(super) upstream: Arc<UpstreamAccess>,
    /// Held from sending a `CONFIG SET requirepass` until its reply is followed: one at a
    /// time, so corral follows them in the order Redis ran them (two in flight on two
    /// connections could be answered, and followed, the other way round).
    pub(super) changing: Arc<tokio::sync::Mutex<()>>,
}

impl Auth {
    /// The client-side password and the upstream access a server starts with.
    pub fn new(requirepass: Arc<DefaultPassword>, upstream: Arc<UpstreamAccess>) -> Auth {
        Auth {
            requirepass,
            upstream,
            changing: Arc::default(),
        }
    }
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
        auth: Auth,
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
            auth,
        }
    }

    /// Redis accepted a `CONFIG SET requirepass` sent through corral: as on Redis, clients
    /// now authenticate with `password` (none if empty), and so do corral's new upstream
    /// connections when corral authenticates as `default` (its old password no longer would).
    pub(super) fn follow_requirepass(&self, password: Option<&str>) {
        self.auth.requirepass.set(password);
        let upstream = self.auth.upstream.follow_default_password(password);
        tracing::info!(
            upstream,
            "requirepass changed through corral: clients authenticate with the new password"
        );
    }

    /// Clients connected now.
    pub fn clients(&self) -> usize {
        self.client_count.load(Ordering::Relaxed)
    }
}
