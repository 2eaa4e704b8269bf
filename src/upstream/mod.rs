//! Connections to the upstream Redis: a few shared pipelined connections per protocol version
//! and database, each client pinned to one of them so its requests reach Redis in the order it
//! sent them; and dedicated connections for clients whose state cannot be shared
//! (transactions, blocking commands).
//!
//! Files: `conn.rs` the handle clients send jobs through, `task.rs` the task that keeps one
//! connection up (connect, backoff), `link.rs` the live connection (write jobs, hand replies
//! back), `health.rs` its liveness checks, `dial.rs` opening one connection (socket and
//! handshake, TLS included), `job.rs` what is sent and where replies go, `settings.rs`
//! per-connection settings, `access.rs` the credentials and TLS setup every connection shares
//! (replaced on reload), `status.rs` what is known about the upstream, `cluster.rs` the
//! cluster, `users.rs` the pools of Redis's own ACL users (pass-through).

mod access;
pub mod cluster;
mod conn;
mod dial;
mod handshake;
mod health;
mod job;
mod link;
pub mod routes;
mod settings;
mod status;
mod task;
mod users;
mod waiter;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_util::sync::CancellationToken;

pub use access::{Access, UpstreamAccess};
pub use conn::UpstreamConn;
pub use dial::Stream;
pub use job::{Job, JobResult, LinkObserver, PartHook, Reply, ReplyTo, STREAM_PART};
pub use settings::{ConnSettings, Health};
pub use status::{ScriptRun, UpstreamStatus};
pub use users::{Secret, UserLease, UserPool, UserPools};

use crate::config::{Config, UpstreamTarget};
use crate::error::replies;
use crate::resp::Proto;

/// Idle dedicated connections kept for reuse, per protocol and database. Scripts take one per
/// concurrent caller, so this is sized to keep a busy EVALSHA workload from reconnecting.
const MAX_IDLE_DEDICATED: usize = 64;

/// Connections are grouped by protocol and database.
type PoolKey = (Proto, u32);

/// An idle dedicated connection and the route of its push frames.
type IdleConn = (UpstreamConn, Arc<PushRoute>);

/// The connections to one upstream server.
#[derive(Debug)]
pub struct Upstream {
    base: ConnSettings,
    connections: usize,
    shutdown: CancellationToken,
    /// Shared pools for database 0, RESP2 and RESP3: the hot path, no lock.
    resp2: Vec<UpstreamConn>,
    resp3: Vec<UpstreamConn>,
    /// Shared pools for other databases, made on first use.
    other_dbs: Mutex<HashMap<PoolKey, Arc<[UpstreamConn]>>>,
    idle: Mutex<HashMap<(String, Proto, u32), Vec<IdleConn>>>,
    dedicated: Arc<Semaphore>,
    /// Clients with CLIENT TRACKING on, and redirection targets (`max_tracking_clients`).
    tracking: Arc<Semaphore>,
    /// Health and version, shared with INFO and the admin endpoint.
    pub status: Arc<UpstreamStatus>,
    /// Per-request deadline.
    pub request_timeout: Option<Duration>,
    /// The cluster, in cluster mode. The shared pools above then point at the first seed and
    /// serve only requests that cannot be routed by slot.
    pub cluster: Option<Arc<cluster::ClusterUpstream>>,
    /// Pools of connections authenticated as Redis's own ACL users (pass-through).
    pub users: Arc<UserPools>,
}

/// A connection reserved for one client; it counts against `max_dedicated` until dropped.
#[derive(Debug)]
pub struct Dedicated {
    /// The connection.
    pub conn: UpstreamConn,
    addr: String,
    proto: Proto,
    db: u32,
    /// Where the connection's push frames go (CLIENT TRACKING invalidations).
    pub pushes: Arc<PushRoute>,
    /// `None` for an out-of-band connection, which does not count against the limit.
    _permit: Option<OwnedSemaphorePermit>,
    /// The Redis ACL user's pool it was taken from (and goes back to); `None`: corral's own
    /// upstream user.
    owner: Option<Arc<UserPool>>,
}

impl Dedicated {
    /// The node the connection goes to.
    pub fn addr(&self) -> &str {
        &self.addr
    }
}

/// A dedicated connection's push frames go to the observer set here, if any: its client's
/// own, while that client has CLIENT TRACKING on.
#[derive(Debug, Default)]
pub struct PushRoute {
    to: Mutex<Option<Arc<dyn LinkObserver>>>,
}

impl PushRoute {
    /// Sends later push frames to `to` (`None`: drop them).
    pub fn set(&self, to: Option<Arc<dyn LinkObserver>>) {
        *self.to.lock().unwrap_or_else(|e| e.into_inner()) = to;
    }

    fn get(&self) -> Option<Arc<dyn LinkObserver>> {
        self.to.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

impl LinkObserver for PushRoute {
    fn up(&self, _tracking: bool) {}

    fn down(&self, cause: &str) {
        if let Some(o) = self.get() {
            o.down(cause);
        }
    }

    fn push(&self, frame: &[u8]) {
        if let Some(o) = self.get() {
            o.push(frame);
        }
    }

    fn push_inline(&self, frame: &[u8], out: &mut bytes::BytesMut) -> bool {
        self.get().is_some_and(|o| o.push_inline(frame, out))
    }

    fn take_pending(&self, out: &mut bytes::BytesMut) {
        if let Some(o) = self.get() {
            o.take_pending(out);
        }
    }
}

impl Upstream {
    /// Starts `upstream.connections` connection tasks for each protocol to `target`, each
    /// made with `base` settings (see [`ConnSettings::new`]).
    pub fn start(
        cfg: &Config,
        target: &UpstreamTarget,
        base: ConnSettings,
        shutdown: &CancellationToken,
    ) -> Upstream {
        let status = Arc::new(UpstreamStatus::default());
        let users = UserPools::start(
            &cfg.auth,
            base.clone(),
            status.clone(),
            shutdown.child_token(),
        );
        let mut up = Upstream {
            base,
            connections: cfg.upstream.connections,
            shutdown: shutdown.clone(),
            resp2: Vec::new(),
            resp3: Vec::new(),
            other_dbs: Mutex::new(HashMap::new()),
            idle: Mutex::new(HashMap::new()),
            dedicated: Arc::new(Semaphore::new(cfg.upstream.max_dedicated)),
            tracking: Arc::new(Semaphore::new(cfg.upstream.max_tracking_clients)),
            status,
            request_timeout: cfg.request_timeout(),
            cluster: None,
            users,
        };
        if cfg.cluster.enabled() {
            let seeds = target
                .seeds
                .iter()
                .filter_map(|u| crate::cluster::Addr::parse(&u.addr))
                .collect();
            up.cluster = Some(cluster::ClusterUpstream::start(
                up.base.clone(),
                seeds,
                cfg.upstream.connections,
                Duration::from_millis(cfg.cluster.refresh_ms),
                cfg.cluster.read_from,
                up.status.clone(),
                shutdown.child_token(),
            ));
        }
        up.resp2 = up.pool(Proto::Resp2, 0);
        up.resp3 = up.pool(Proto::Resp3, 0);
        up
    }

    /// The address of the upstream (the first seed in cluster mode), for INFO and logs.
    pub fn addr(&self) -> &str {
        &self.base.addr
    }

    /// Whether connections to the upstream use TLS (`rediss://`).
    pub fn is_tls(&self) -> bool {
        self.base.access.current().tls.is_some()
    }

    fn pool(&self, proto: Proto, db: u32) -> Vec<UpstreamConn> {
        (0..self.connections)
            .map(|_| self.spawn(&self.base.addr, proto, db, true))
            .collect()
    }

    fn spawn(&self, addr: &str, proto: Proto, db: u32, reconnect: bool) -> UpstreamConn {
        self.spawn_observed(addr, proto, db, reconnect, None)
    }

    fn spawn_observed(
        &self,
        addr: &str,
        proto: Proto,
        db: u32,
        reconnect: bool,
        observer: Option<Arc<dyn LinkObserver>>,
    ) -> UpstreamConn {
        let settings = ConnSettings {
            addr: addr.to_string(),
            proto,
            db,
            reconnect,
            ..self.base.clone()
        };
        UpstreamConn::spawn(
            settings,
            self.status.clone(),
            self.shutdown.child_token(),
            observer,
        )
    }

    /// A place among the clients with CLIENT TRACKING on (or redirection targets), held
    /// until dropped.
    ///
    /// # Errors
    /// `upstream.max_tracking_clients` places are taken.
    pub fn tracking_permit(&self) -> Result<OwnedSemaphorePermit, &'static str> {
        self.tracking
            .clone()
            .try_acquire_owned()
            .map_err(|_| replies::TOO_MANY_TRACKING.text())
    }

    /// A RESP3 connection of its own whose push frames go to `observer` (not reconnecting:
    /// Redis knows it by its id): the target of CLIENT TRACKING ... REDIRECT.
    pub fn push_sink(&self, observer: Arc<dyn LinkObserver>) -> UpstreamConn {
        self.spawn_observed(&self.base.addr, Proto::Resp3, 0, false, Some(observer))
    }

    /// The shared database-0 connection a client with this id uses for this protocol.
    pub fn conn(&self, proto: Proto, client_id: u64) -> &UpstreamConn {
        let pool = match proto {
            Proto::Resp2 => &self.resp2,
            Proto::Resp3 => &self.resp3,
        };
        // `start` always creates at least one connection (validated config).
        &pool[(client_id % pool.len() as u64) as usize]
    }

    /// The shared connection for a client in database `db`, authenticated as `user`'s pool
    /// (a Redis ACL user) or as corral's upstream user.
    pub fn conn_db(
        &self,
        user: Option<&UserPool>,
        proto: Proto,
        db: u32,
        client_id: u64,
    ) -> UpstreamConn {
        if let Some(user) = user {
            return user.conn_db(proto, db, client_id);
        }
        if db == 0 {
            return self.conn(proto, client_id).clone();
        }
        let pool = {
            let mut dbs = self.other_dbs.lock().unwrap_or_else(|e| e.into_inner());
            dbs.entry((proto, db))
                .or_insert_with(|| self.pool(proto, db).into())
                .clone()
        };
        pool[(client_id % pool.len() as u64) as usize].clone()
    }

    /// A connection for one client alone, to the node at `addr` (cluster mode) or the
    /// configured upstream, authenticated as `user` (a Redis ACL user's pool) or as corral's
    /// upstream user, reused from that user's idle ones when possible.
    ///
    /// # Errors
    /// `upstream.max_dedicated` connections are in use.
    pub fn dedicated_to(
        &self,
        user: Option<&Arc<UserPool>>,
        addr: Option<&str>,
        proto: Proto,
        db: u32,
    ) -> Result<Dedicated, &'static str> {
        let permit = self
            .dedicated
            .clone()
            .try_acquire_owned()
            .map_err(|_| replies::TOO_MANY_DEDICATED.text())?;
        Ok(self.take_dedicated(user, addr, proto, db, Some(permit)))
    }

    /// A connection for one request that must reach Redis at once whatever the other
    /// connections wait for (SCRIPT KILL, FUNCTION KILL, SHUTDOWN). It does not count against
    /// `upstream.max_dedicated`: a kill is most needed when scripts hold every dedicated
    /// connection. Each client has at most one in flight, so `max_clients` bounds them.
    pub fn out_of_band(&self, user: Option<&Arc<UserPool>>, proto: Proto, db: u32) -> Dedicated {
        self.take_dedicated(user, None, proto, db, None)
    }

    /// An idle dedicated connection to `addr` (default: the upstream) of `user`, or a new one.
    fn take_dedicated(
        &self,
        user: Option<&Arc<UserPool>>,
        addr: Option<&str>,
        proto: Proto,
        db: u32,
        permit: Option<OwnedSemaphorePermit>,
    ) -> Dedicated {
        if let Some(user) = user {
            // User pools exist in standalone mode only: `addr` is the upstream's.
            let (conn, pushes) = user.take_dedicated(proto, db);
            return Dedicated {
                conn,
                addr: self.base.addr.clone(),
                proto,
                db,
                pushes,
                _permit: permit,
                owner: Some(user.clone()),
            };
        }
        let addr = addr.unwrap_or(&self.base.addr).to_string();
        let key = (addr.clone(), proto, db);
        let reused = {
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            let list = idle.entry(key).or_default();
            std::iter::from_fn(|| list.pop()).find(|(c, _)| !c.is_dead())
        };
        let (conn, pushes) = reused.unwrap_or_else(|| {
            let pushes = Arc::new(PushRoute::default());
            let observer: Arc<dyn LinkObserver> = pushes.clone();
            let conn = self.spawn_observed(&addr, proto, db, false, Some(observer));
            (conn, pushes)
        });
        Dedicated {
            conn,
            addr,
            proto,
            db,
            pushes,
            _permit: permit,
            owner: None,
        }
    }

    /// A plain connection, handshaken (HELLO, AUTH, SELECT) as `user` or corral's upstream
    /// user, but not managed: for MONITOR, whose stream of replies is relayed as it is.
    ///
    /// # Errors
    /// The connection or handshake failed or timed out.
    pub async fn raw(
        &self,
        user: Option<&UserPool>,
        proto: Proto,
        db: u32,
    ) -> Result<Stream, String> {
        let settings = match user {
            Some(user) => user.settings(proto, db),
            None => ConnSettings {
                proto,
                db,
                ..self.base.clone()
            },
        };
        dial::open(&settings, &self.status).await
    }

    /// Returns a dedicated connection whose state is clean (no transaction, no watched keys,
    /// not blocked) for reuse; anything else should simply be dropped, which closes it.
    pub fn release(&self, d: Dedicated) {
        if d.conn.is_dead() {
            return;
        }
        // Back to its own user's pool: a connection authenticated as a Redis ACL user never
        // serves anyone else.
        if let Some(owner) = &d.owner {
            owner.release(d.proto, d.db, d.conn, d.pushes);
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = idle.entry((d.addr, d.proto, d.db)).or_default();
        if list.len() < MAX_IDLE_DEDICATED {
            d.pushes.set(None);
            list.push((d.conn, d.pushes));
        }
    }
}
