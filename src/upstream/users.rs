//! Upstream connections authenticated as Redis's own ACL users (pass-through, see
//! `server/users.rs`): one pool per user and password, as PgBouncer keeps pools per user and
//! database. A pool holds a few shared pipelined connections per protocol and database, used
//! by every client of that user, and idle dedicated connections for the user's transactions,
//! blocking commands and scripts; nothing in it ever serves another user or a default client.
//!
//! Pools are bounded (`auth.max_user_pools`), closed after `auth.user_pool_idle_ms` without a
//! client, and revoked for good once Redis drops a live connection of theirs or refuses to
//! authenticate a new one (`ACL DELUSER`, `CLIENT KILL USER`, a changed password, a restart):
//! their clients are then closed, as Redis closes a killed client, and must AUTH again.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use sha2::{Digest, Sha256};
use tokio_util::sync::CancellationToken;

use super::settings::ConnSettings;
use super::status::UpstreamStatus;
use super::{IdleConn, PoolKey, PushRoute, UpstreamConn};
use crate::config::AuthConfig;
use crate::error::replies;
use crate::resp::Proto;

/// Idle dedicated connections kept per user pool, protocol and database: a user's
/// transactions reuse them, and few are kept so that an idle user holds few connections.
const MAX_IDLE_PER_USER: usize = 4;

/// A password a client gave, held only to authenticate its user's pool connections; never
/// printed (`Debug` masks it) and never a map key (pools are keyed by its digest).
#[derive(Clone)]
pub struct Secret(Bytes);

impl Secret {
    /// Wraps the password bytes of an AUTH.
    pub fn new(password: &[u8]) -> Secret {
        Secret(Bytes::copy_from_slice(password))
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("MASKED")
    }
}

/// A pool's identity: the user name and the SHA-256 digest of the password.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    user: Bytes,
    digest: [u8; 32],
}

impl Key {
    fn new(user: &[u8], password: &Secret) -> Key {
        Key {
            user: Bytes::copy_from_slice(user),
            digest: Sha256::digest(&password.0).into(),
        }
    }
}

/// Every user pool, bounded, with the settings new ones are made from.
#[derive(Debug)]
pub struct UserPools {
    pools: Mutex<HashMap<Key, Arc<UserPool>>>,
    base: ConnSettings,
    status: Arc<UpstreamStatus>,
    shutdown: CancellationToken,
    max: usize,
    connections: usize,
    idle_after: Duration,
}

impl UserPools {
    /// No pools yet; `base`: the upstream's connection settings, `shutdown` closes every
    /// pool's connections. Starts the task that closes idle pools.
    pub(super) fn start(
        cfg: &AuthConfig,
        base: ConnSettings,
        status: Arc<UpstreamStatus>,
        shutdown: CancellationToken,
    ) -> Arc<UserPools> {
        let pools = Arc::new(UserPools::new(cfg, base, status, shutdown.clone()));
        // Often enough that a pool outlives its timeout by a small fraction of it.
        let every = (pools.idle_after / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
        tokio::spawn(reap(Arc::downgrade(&pools), every, shutdown));
        pools
    }

    fn new(
        cfg: &AuthConfig,
        base: ConnSettings,
        status: Arc<UpstreamStatus>,
        shutdown: CancellationToken,
    ) -> UserPools {
        UserPools {
            pools: Mutex::new(HashMap::new()),
            base,
            status,
            shutdown,
            max: cfg.max_user_pools,
            connections: cfg.user_connections.max(1),
            idle_after: Duration::from_millis(cfg.user_pool_idle_ms),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Key, Arc<UserPool>>> {
        self.pools.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether `user` and `password` can be passed through at all (asked before Redis checks
    /// the AUTH). The pool limit is checked once Redis accepted them: a wrong password gets
    /// Redis's own error first.
    ///
    /// # Errors
    /// The name or password cannot be sent in a handshake: corral's refusal text.
    pub fn check(&self, user: &[u8], password: &Secret) -> Result<(), &'static str> {
        usable(user, password).map(|_| ())
    }

    /// A place for client `id` in the pool of `user` and `password` (made if needed), held
    /// until dropped; a revoked pool cancels `kill`. Called once Redis accepted the AUTH.
    ///
    /// # Errors
    /// As [`UserPools::check`], or `auth.max_user_pools` pools are open and none is theirs.
    pub fn lease(
        &self,
        user: &[u8],
        password: &Secret,
        id: u64,
        kill: CancellationToken,
    ) -> Result<UserLease, &'static str> {
        let (user, pass) = usable(user, password)?;
        let key = Key::new(user.as_bytes(), password);
        let mut pools = self.lock();
        let pool = match pools.get(&key) {
            Some(p) if !p.is_revoked() => p.clone(),
            _ => {
                if live(&pools) >= self.max {
                    return Err(replies::TOO_MANY_USER_POOLS.text());
                }
                let pool = self.new_pool(user, pass);
                if let Some(old) = pools.insert(key, pool.clone()) {
                    old.close();
                }
                pool
            }
        };
        // Counted before the map's lock is let go, so the reaper never closes it meanwhile.
        let lease = UserLease::new(pool, id, kill);
        drop(pools);
        Ok(lease)
    }

    fn new_pool(&self, user: &str, password: &str) -> Arc<UserPool> {
        let shutdown = self.shutdown.child_token();
        let revoked = CancellationToken::new();
        let settings = ConnSettings {
            user: Some(user.to_string()),
            password: Some(password.to_string()),
            revoked: Some(revoked.clone()),
            ..self.base.clone()
        };
        let pool = Arc::new(UserPool {
            user: Bytes::copy_from_slice(user.as_bytes()),
            settings,
            status: self.status.clone(),
            connections: self.connections,
            shared: Mutex::new(HashMap::new()),
            idle: Mutex::new(HashMap::new()),
            clients: Mutex::new(HashMap::new()),
            idle_since: Mutex::new(Instant::now()),
            revoked: revoked.clone(),
            shutdown: shutdown.clone(),
            hub: OnceLock::new(),
        });
        tokio::spawn(kill_on_revoke(Arc::downgrade(&pool), revoked, shutdown));
        pool
    }

    /// The pub/sub hubs of the pools that have one (see [`UserPool::hub`]).
    pub fn hubs(&self) -> Vec<Arc<dyn Any + Send + Sync>> {
        self.lock()
            .values()
            .filter_map(|p| p.hub.get().cloned())
            .collect()
    }

    /// Pools open now, and the clients they serve (INFO).
    pub fn counts(&self) -> (usize, usize) {
        let pools = self.lock();
        let clients = pools.values().map(|p| p.client_count()).sum();
        (pools.len(), clients)
    }

    /// Closes the pools without a client for `idle_after`, and revoked ones.
    fn reap_idle(&self) {
        let mut pools = self.lock();
        pools.retain(|_, p| {
            let idle = p.client_count() == 0 && p.idle_for() >= self.idle_after;
            let keep = !idle && !p.is_revoked();
            if !keep {
                p.close();
            }
            keep
        });
    }
}

/// The user name and password as the handshake sends them (HELLO AUTH takes text here).
fn usable<'a>(user: &'a [u8], password: &'a Secret) -> Result<(&'a str, &'a str), &'static str> {
    match (std::str::from_utf8(user), std::str::from_utf8(&password.0)) {
        (Ok(u), Ok(p)) => Ok((u, p)),
        _ => Err(replies::USER_NOT_UTF8.text()),
    }
}

/// Pools that count against the limit: revoked ones are on their way out.
fn live(pools: &HashMap<Key, Arc<UserPool>>) -> usize {
    pools.values().filter(|p| !p.is_revoked()).count()
}

/// Closes idle pools every `every` until shutdown or the pools are gone.
async fn reap(pools: Weak<UserPools>, every: Duration, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = shutdown.cancelled() => return,
        }
        match pools.upgrade() {
            Some(p) => p.reap_idle(),
            None => return,
        }
    }
}

/// Once the pool is revoked, kills its clients (see the module docs).
async fn kill_on_revoke(
    pool: Weak<UserPool>,
    revoked: CancellationToken,
    shutdown: CancellationToken,
) {
    tokio::select! {
        _ = revoked.cancelled() => {}
        _ = shutdown.cancelled() => return,
    }
    if let Some(pool) = pool.upgrade() {
        tracing::info!(user = %String::from_utf8_lossy(&pool.user), "Redis dropped or refused \
            a connection of this ACL user: closing its clients");
        for (kill, _) in pool
            .clients
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
        {
            kill.cancel();
        }
    }
}

/// The connections authenticated as one Redis ACL user (with one password).
#[derive(Debug)]
pub struct UserPool {
    user: Bytes,
    /// The upstream's settings with this user's credentials and revocation token.
    settings: ConnSettings,
    status: Arc<UpstreamStatus>,
    /// Shared connections per protocol and database.
    connections: usize,
    shared: Mutex<HashMap<PoolKey, Arc<[UpstreamConn]>>>,
    idle: Mutex<HashMap<PoolKey, Vec<IdleConn>>>,
    /// Each client's kill token, by client id.
    /// Each client's kill token and how many leases it holds, by client id.
    clients: Mutex<HashMap<u64, (CancellationToken, usize)>>,
    /// When the last client left (or the pool was made).
    idle_since: Mutex<Instant>,
    revoked: CancellationToken,
    /// Cancelled when the pool is closed: every connection of it stops.
    shutdown: CancellationToken,
    /// The user's pub/sub hub (a `pubsub::Router`, a layer above), made on first use.
    hub: OnceLock<Arc<dyn Any + Send + Sync>>,
}

impl UserPool {
    /// The user's name.
    pub fn user(&self) -> &Bytes {
        &self.user
    }

    /// Redis dropped a live connection of this user or refused a new one: nothing of it may
    /// be used any more.
    pub fn is_revoked(&self) -> bool {
        self.revoked.is_cancelled()
    }

    fn client_count(&self) -> usize {
        self.clients.lock().unwrap_or_else(|e| e.into_inner()).len()
    }

    fn idle_for(&self) -> Duration {
        self.idle_since
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .elapsed()
    }

    fn close(&self) {
        self.shutdown.cancel();
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).clear();
    }

    /// The shared connection of this user for client `client_id` in `proto` and `db`.
    pub(super) fn conn_db(&self, proto: Proto, db: u32, client_id: u64) -> UpstreamConn {
        let pool = {
            let mut shared = self.shared.lock().unwrap_or_else(|e| e.into_inner());
            shared
                .entry((proto, db))
                .or_insert_with(|| {
                    (0..self.connections)
                        .map(|_| self.spawn(proto, db, true, None))
                        .collect()
                })
                .clone()
        };
        // Never empty: `connections` is at least 1.
        pool[(client_id % pool.len() as u64) as usize].clone()
    }

    /// An idle dedicated connection of this user, or a new one, with its push route.
    pub(super) fn take_dedicated(&self, proto: Proto, db: u32) -> (UpstreamConn, Arc<PushRoute>) {
        let reused = {
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            let list = idle.entry((proto, db)).or_default();
            std::iter::from_fn(|| list.pop()).find(|(c, _)| !c.is_dead())
        };
        reused.unwrap_or_else(|| {
            let pushes = Arc::new(PushRoute::default());
            let conn = self.spawn(proto, db, false, Some(pushes.clone()));
            (conn, pushes)
        })
    }

    /// Keeps a clean dedicated connection for reuse by this user's clients.
    pub(super) fn release(
        &self,
        proto: Proto,
        db: u32,
        conn: UpstreamConn,
        pushes: Arc<PushRoute>,
    ) {
        if self.shutdown.is_cancelled() || self.is_revoked() {
            return;
        }
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let list = idle.entry((proto, db)).or_default();
        if list.len() < MAX_IDLE_PER_USER {
            pushes.set(None);
            list.push((conn, pushes));
        }
    }

    /// The user's pub/sub hub, made by `start` on first use from the user's RESP3 settings and
    /// a token cancelled when the pool closes: subscriptions of the user's clients are made
    /// upstream as the user, on connections of its own (the hub type lives in a layer above).
    pub fn hub(
        &self,
        start: impl FnOnce(
            ConnSettings,
            Arc<UpstreamStatus>,
            CancellationToken,
        ) -> Arc<dyn Any + Send + Sync>,
    ) -> Arc<dyn Any + Send + Sync> {
        self.hub
            .get_or_init(|| {
                start(
                    self.settings(Proto::Resp3, 0),
                    self.status.clone(),
                    self.shutdown.child_token(),
                )
            })
            .clone()
    }

    /// This user's settings for a connection in `proto` and `db`.
    pub(super) fn settings(&self, proto: Proto, db: u32) -> ConnSettings {
        ConnSettings {
            proto,
            db,
            ..self.settings.clone()
        }
    }

    fn spawn(
        &self,
        proto: Proto,
        db: u32,
        reconnect: bool,
        pushes: Option<Arc<PushRoute>>,
    ) -> UpstreamConn {
        let settings = ConnSettings {
            reconnect,
            ..self.settings(proto, db)
        };
        let observer = pushes.map(|p| p as Arc<dyn super::LinkObserver>);
        UpstreamConn::spawn(
            settings,
            self.status.clone(),
            self.shutdown.child_token(),
            observer,
        )
    }
}

/// A client's place in a user pool; the pool counts it (for the idle timeout) until dropped.
#[derive(Debug)]
pub struct UserLease {
    pool: Arc<UserPool>,
    id: u64,
}

impl UserLease {
    fn new(pool: Arc<UserPool>, id: u64, kill: CancellationToken) -> UserLease {
        let mut clients = pool.clients.lock().unwrap_or_else(|e| e.into_inner());
        clients.entry(id).or_insert((kill, 0)).1 += 1;
        drop(clients);
        UserLease { pool, id }
    }

    /// The pool this client is served from.
    pub fn pool(&self) -> &Arc<UserPool> {
        &self.pool
    }

    /// Another lease of the same client on the same pool, for what outlives the client's
    /// stay as the user (its subscriptions on the user's hub, after an AUTH as someone else):
    /// the pool stays open, and a revocation still closes the client.
    pub fn share(&self) -> UserLease {
        let clients = self.pool.clients.lock().unwrap_or_else(|e| e.into_inner());
        let kill = clients.get(&self.id).map(|(k, _)| k.clone());
        drop(clients);
        UserLease::new(self.pool.clone(), self.id, kill.unwrap_or_default())
    }
}

impl Drop for UserLease {
    fn drop(&mut self) {
        let mut clients = self.pool.clients.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, n)) = clients.get_mut(&self.id) {
            *n -= 1;
            if *n == 0 {
                clients.remove(&self.id);
            }
        }
        if clients.is_empty() {
            *self
                .pool
                .idle_since
                .lock()
                .unwrap_or_else(|e| e.into_inner()) = Instant::now();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_are_keyed_by_digest_and_never_show_the_password() {
        let a = Key::new(b"alice", &Secret::new(b"pw-1"));
        assert_eq!(a, Key::new(b"alice", &Secret::new(b"pw-1")));
        assert_ne!(a, Key::new(b"alice", &Secret::new(b"pw-2")));
        assert_ne!(a, Key::new(b"bob", &Secret::new(b"pw-1")));
        let shown = format!("{a:?} {:?}", Secret::new(b"pw-1"));
        assert!(!shown.contains("pw-1"), "{shown}");
    }

    /// Pools reaped as soon as they have no client (`reap_idle` is called by hand).
    fn pools(max: usize) -> UserPools {
        let cfg = crate::config::Config::default();
        let url = crate::config::UpstreamUrl::parse("redis://127.0.0.1:1").unwrap();
        let access = super::super::access::UpstreamAccess::new(Default::default());
        let base = ConnSettings::new(&cfg, &url, Arc::new(access));
        let auth = AuthConfig {
            max_user_pools: max,
            user_pool_idle_ms: 0,
            ..AuthConfig::default()
        };
        UserPools::new(&auth, base, Default::default(), CancellationToken::new())
    }

    #[tokio::test]
    async fn pools_are_shared_bounded_and_reaped_once_idle() {
        let pools = pools(1);
        let pw = Secret::new(b"pw");
        let kill = CancellationToken::new();
        let a1 = pools.lease(b"alice", &pw, 1, kill.clone()).unwrap();
        let a2 = pools.lease(b"alice", &pw, 2, kill.clone()).unwrap();
        assert!(Arc::ptr_eq(a1.pool(), a2.pool()));
        assert_eq!(pools.counts(), (1, 2));
        let refused = pools.lease(b"bob", &pw, 3, kill.clone()).map(|_| ());
        assert_eq!(refused, Err(replies::TOO_MANY_USER_POOLS.text()));
        // Another password is another pool.
        assert!(
            pools
                .lease(b"alice", &Secret::new(b"other"), 4, kill.clone())
                .is_err()
        );
        pools.reap_idle();
        assert_eq!(pools.counts(), (1, 2), "a pool with clients is kept");
        // A shared lease (subscriptions kept after an AUTH as someone else) counts the same
        // client once, and keeps the pool open after the client's own lease is gone.
        let kept = a1.share();
        assert_eq!(pools.counts(), (1, 2));
        drop((a1, a2));
        pools.reap_idle();
        assert_eq!(pools.counts(), (1, 1));
        drop(kept);
        pools.reap_idle();
        assert_eq!(pools.counts(), (0, 0));
        assert!(pools.lease(b"bob", &pw, 3, kill).is_ok());
    }

    #[tokio::test]
    async fn a_revoked_pool_kills_its_clients_and_is_replaced() {
        let pools = pools(1);
        let pw = Secret::new(b"pw");
        let (k1, k2) = (CancellationToken::new(), CancellationToken::new());
        let a = pools.lease(b"alice", &pw, 1, k1.clone()).unwrap();
        let other = pools.lease(b"alice", &pw, 2, k2.clone()).unwrap();
        drop(other);
        a.pool().revoked.cancel();
        tokio::time::timeout(Duration::from_secs(10), k1.cancelled())
            .await
            .unwrap();
        assert!(!k2.is_cancelled(), "a client that left is not killed");
        // A new AUTH gets a new pool even at the limit: the revoked one does not count.
        let b = pools
            .lease(b"alice", &pw, 3, CancellationToken::new())
            .unwrap();
        assert!(!Arc::ptr_eq(a.pool(), b.pool()) && !b.pool().is_revoked());
    }

    #[test]
    fn binary_credentials_are_refused() {
        assert!(usable(b"alice", &Secret::new(b"ok")).is_ok());
        assert_eq!(
            usable(b"alice", &Secret::new(b"\xff")),
            Err(replies::USER_NOT_UTF8.text())
        );
    }
}
