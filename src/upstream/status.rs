//! What is known about the upstream: reachable or not, why not, and its version.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Shared upstream health, read by INFO, HELLO and `/healthz`.
#[derive(Debug, Default)]
pub struct UpstreamStatus {
    connected: AtomicUsize,
    reconnects: AtomicU64,
    version: Mutex<Option<String>>,
    last_error: Mutex<Option<String>>,
    /// Local addresses of corral's live upstream connections, and whether each is internal
    /// (see `ConnSettings::internal`): for MONITOR.
    conns: Mutex<HashMap<SocketAddr, bool>>,
}

impl UpstreamStatus {
    /// A connection came up.
    pub fn connected(&self) {
        self.connected.fetch_add(1, Ordering::Relaxed);
        self.reconnects.fetch_add(1, Ordering::Relaxed);
    }

    /// Records why a connection attempt failed or a live connection was lost.
    pub fn disconnected(&self, cause: &str) {
        if let Ok(mut e) = self.last_error.lock() {
            *e = Some(cause.to_string());
        }
    }

    /// A live connection went down.
    pub fn lost(&self) {
        let _ = self
            .connected
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    /// Records the local address of one of corral's connections, from its TCP connect on
    /// (its handshake included); `internal` when it carries no client's commands.
    pub fn add_conn(&self, local: SocketAddr, internal: bool) {
        self.conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(local, internal);
    }

    /// Forgets a connection's address once it is closed.
    pub fn remove_conn(&self, local: SocketAddr) {
        self.conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&local);
    }

    /// Whether MONITOR should leave out command `cmd` (its name as MONITOR quotes it, without
    /// the quotes) run by the client at `addr` (`ip:port`, as MONITOR prints it): everything
    /// an internal connection of corral's runs, and the handshake (HELLO, AUTH) of any of
    /// corral's connections: corral answers its clients' HELLO and AUTH itself, so none of
    /// those lines stands for something a client did.
    pub fn monitor_hides(&self, addr: &str, cmd: &[u8]) -> bool {
        let Ok(a) = addr.parse::<SocketAddr>() else {
            return false;
        };
        let conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        match conns.get(&a) {
            Some(true) => true,
            Some(false) => cmd.eq_ignore_ascii_case(b"HELLO") || cmd.eq_ignore_ascii_case(b"AUTH"),
            None => false,
        }
    }

    /// Records the server version from the handshake.
    pub fn set_version(&self, v: &str) {
        if let Ok(mut cur) = self.version.lock()
            && cur.as_deref() != Some(v)
        {
            *cur = Some(v.to_string());
        }
    }

    /// The upstream server's version, once a handshake reported it.
    pub fn version(&self) -> Option<String> {
        self.version.lock().ok().and_then(|v| v.clone())
    }

    /// Live upstream connections.
    pub fn connected_count(&self) -> usize {
        self.connected.load(Ordering::Relaxed)
    }

    /// Successful connects since start.
    pub fn connects_total(&self) -> u64 {
        self.reconnects.load(Ordering::Relaxed)
    }

    /// The last connection error, if any.
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().ok().and_then(|e| e.clone())
    }
}
