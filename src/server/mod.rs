//! The client-facing server: accept loops (plain and TLS), client limit, one task per
//! connection.

mod attention;
mod batch;
mod cache_reply;
mod cached;
mod client;
mod clients;
mod cluster_route;
mod cluster_view;
mod collect;
mod connection;
mod corral;
mod gate;
mod gather;
mod info;
mod merged;
mod mget;
mod noted;
mod password;
mod pending;
mod permit;
mod pin;
mod plan;
mod pubcount;
mod queue;
mod quick;
mod quick_routed;
mod redirects;
mod round;
mod route;
mod routed;
mod scan_walk;
mod segments;
mod shared;
mod stateful;
mod streamed;
mod subscribe;
mod subscriber;
mod track_state;
mod tracking;
mod user_auth;
mod user_pubsub;
mod users;
mod writes;

pub use shared::{Auth, Shared};

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, debug_span, error, info, warn};

use crate::tls::{Stream, TlsAcceptorHandle};

/// Decrements the client count when a connection task ends, however it ends.
struct ClientSlot(Arc<Shared>);

impl Drop for ClientSlot {
    fn drop(&mut self) {
        self.0.client_count.fetch_sub(1, Ordering::Relaxed);
        self.0.metrics.connected_clients.dec();
    }
}

/// Cluster mode: each time the cluster lets go of a node's connections (the node left, or
/// changed role), has every client drop its routes, which may hold some of them, until
/// `stop`. See `clients::Registry::reroute_all`.
pub async fn reroute_on_dropped_pools(shared: Arc<Shared>, stop: CancellationToken) {
    let Some(cluster) = &shared.upstream.cluster else {
        return;
    };
    let mut dropped = cluster.watch_dropped_pools();
    loop {
        tokio::select! {
            changed = dropped.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            () = stop.cancelled() => return,
        }
        shared.clients.reroute_all();
    }
}

/// How long a client of the TLS listener has to complete its handshake.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Accepts clients until `shutdown` is cancelled; with `tls`, each client's TLS handshake runs
/// first, in its own task. Connection tasks are spawned on `tracker` so the caller can wait for
/// them to finish. The plain and the TLS listener each run this loop and share `max_clients`.
pub async fn serve(
    listener: TcpListener,
    tls: Option<Arc<TlsAcceptorHandle>>,
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
            // A TLS client could not read a clear-text error: it is just closed.
            if tls.is_none() {
                tracker.spawn(async move {
                    let _ = stream
                        .write_all(crate::error::replies::MAX_CLIENTS.wire())
                        .await;
                });
            }
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
        let tls = tls.clone();
        tracker.spawn(
            async move {
                let _slot = slot;
                let stream = match tls {
                    None => Stream::Plain(stream),
                    Some(tls) => match handshake(&tls, stream, &conn_shared, &token).await {
                        Some(s) => s,
                        None => return,
                    },
                };
                if let Err(e) = connection::run(stream, id, conn_shared, token).await {
                    debug!(cause = %e, "connection closed with error");
                }
            }
            .instrument(span),
        );
    }
}

/// Runs a client's TLS handshake under [`TLS_HANDSHAKE_TIMEOUT`]; a failure is logged with
/// the peer's address and counted.
async fn handshake(
    tls: &TlsAcceptorHandle,
    tcp: TcpStream,
    shared: &Shared,
    shutdown: &CancellationToken,
) -> Option<Stream> {
    let peer = tcp.peer_addr().ok();
    let cause = tokio::select! {
        r = tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, tls.accept(tcp)) => match r {
            Ok(Ok(stream)) => return Some(stream),
            Ok(Err(e)) => e.to_string(),
            Err(_) => "tls handshake timed out".to_string(),
        },
        _ = shutdown.cancelled() => return None,
    };
    shared.metrics.tls_handshake_failures.inc();
    // INFO, not WARN: anyone can connect and fail, and the count is in the metrics.
    info!(client.addr = ?peer, %cause, "client TLS handshake failed");
    None
}
