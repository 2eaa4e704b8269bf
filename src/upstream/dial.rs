//! Making one upstream connection: dial the node (TCP, then TLS for a `rediss://` upstream),
//! run the handshake (HELLO, AUTH, SELECT, READONLY, CLIENT TRACKING), and register its local
//! address for MONITOR. [`dial`] is the only place a socket to a node is opened.

use std::sync::Arc;
use std::time::Instant;

use tokio::net::TcpStream;
use tokio::time::timeout;

use super::access::Access;
use super::handshake;
use super::settings::ConnSettings;
use super::status::UpstreamStatus;
use crate::config::host_of;
use crate::tls::{self, UpstreamTlsConnector};

/// A connection to an upstream node, as `dial` makes it: plain TCP or TLS.
pub use crate::tls::Stream;

/// Opens a socket to the node at `addr` (`host:port`), set up for request/reply traffic, and
/// runs the TLS handshake over it when `tls` is given (the certificate checked against the
/// host of `addr` unless `upstream.tls.server_name` is set). The caller's deadline covers both.
///
/// # Errors
/// The connect or the TLS handshake failed.
pub async fn dial(addr: &str, tls: Option<&UpstreamTlsConnector>) -> Result<Stream, String> {
    let stream = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    // Pipelined requests are written in batches already; Nagle would only add latency.
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    match tls {
        None => Ok(Stream::Plain(stream)),
        Some(tls) => tls::connect(stream, tls, host_of(addr))
            .await
            .map_err(|e| e.to_string()),
    }
}

/// Connects and runs the handshake, each within its deadline (see [`connect`]).
///
/// # Errors
/// The connect, the handshake or a deadline failed.
pub async fn open(s: &ConnSettings, status: &UpstreamStatus) -> Result<Stream, String> {
    let (stream, _, _) = connect(s, status).await?;
    // Not managed here: no longer registered once handed over (it is MONITOR's relay).
    if let Ok(a) = stream.local_addr() {
        status.remove_conn(a);
    }
    Ok(stream)
}

/// Connects (TCP, TLS) within `connect_timeout` and runs the handshake within
/// `handshake_timeout`; returns the stream, whether tracking is on, and the
/// server's client id for the connection. A refusal (credentials, TLS) is recorded in
/// `status` and its cause says what to fix.
pub(super) async fn connect(
    s: &ConnSettings,
    status: &UpstreamStatus,
) -> Result<(Stream, bool, Option<u64>), String> {
    if let Some(revoked) = &s.revoked {
        return user_connect(s, status, revoked).await;
    }
    let access = s.access.current();
    let started = Instant::now();
    match connect_once(s, &access, status).await {
        Ok(up) => {
            status.connect_succeeded(started);
            Ok(up)
        }
        // Credentials replaced (a reload) while this attempt ran: its refusal says nothing
        // of the new ones, and recorded after a success with them it would be reported
        // again. The retry uses the new ones.
        Err(e) if !Arc::ptr_eq(&access, &s.access.current()) => Err(e),
        Err(e) => Err(status.connect_failed(e)),
    }
}

/// [`connect`] for a Redis ACL user's connection: never after the user's connections were
/// revoked, and a refusal revokes them (Redis no longer accepts the password the client
/// gave: it changed, or the user was deleted or disabled).
async fn user_connect(
    s: &ConnSettings,
    status: &UpstreamStatus,
    revoked: &tokio_util::sync::CancellationToken,
) -> Result<(Stream, bool, Option<u64>), String> {
    if revoked.is_cancelled() {
        return Err(crate::error::replies::USER_REVOKED.into());
    }
    let r = connect_once(s, &s.access.current(), status).await;
    if let Err(e) = &r
        && super::status::refusal(e).is_some_and(|what| what.starts_with("authentication"))
    {
        revoked.cancel();
    }
    r
}

async fn connect_once(
    s: &ConnSettings,
    access: &Access,
    status: &UpstreamStatus,
) -> Result<(Stream, bool, Option<u64>), String> {
    let mut stream = timeout(s.connect_timeout, dial(&s.addr, access.tls.as_ref()))
        .await
        .map_err(|_| String::from("connect timed out"))??;
    // Known to MONITOR from before the handshake, whose commands are corral's own; the
    // guard forgets it if the handshake fails or is abandoned (its deadline).
    let mut registered = stream.local_addr().ok().map(|a| {
        status.add_conn(a, s.internal);
        ConnRegistration { status, addr: a }
    });
    // Credentials of this connection's own, else the upstream's current ones.
    let (user, password) = match &s.password {
        Some(p) => (s.user.as_deref(), Some(p.as_str())),
        None => (access.user.as_deref(), access.password.as_deref()),
    };
    let handshake = async {
        let greeting = handshake::hello(&mut stream, s.proto, user, password)
            .await?
            .unwrap_or_default();
        if let Some(v) = &greeting.version {
            status.set_version(v);
        }
        if s.db != 0 {
            handshake::select(&mut stream, s.proto, s.db).await?;
        }
        if s.readonly {
            handshake::readonly(&mut stream, s.proto).await?;
        }
        let tracking = s.tracking && handshake::tracking_on(&mut stream, s.proto).await?;
        Ok::<_, String>((tracking, greeting.id))
    };
    let (tracking, id) = match s.handshake_timeout {
        Some(d) => timeout(d, handshake)
            .await
            .map_err(|_| String::from("handshake timed out"))??,
        None => handshake.await?,
    };
    // Up: the caller forgets the address when the connection closes.
    if let Some(r) = registered.take() {
        std::mem::forget(r);
    }
    Ok((stream, tracking, id))
}

/// Forgets a connection's address (see [`UpstreamStatus::add_conn`]) when dropped.
struct ConnRegistration<'a> {
    status: &'a UpstreamStatus,
    addr: std::net::SocketAddr,
}

impl Drop for ConnRegistration<'_> {
    fn drop(&mut self) {
        self.status.remove_conn(self.addr);
    }
}
