//! What one connection task needs to know: where to connect, how to authenticate, what to set
//! up after the handshake, how to reconnect and how to check the connection for life.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::access::UpstreamAccess;

pub use crate::config::Health;
use crate::config::{Config, UpstreamUrl};
use crate::resp::Proto;

/// Settings one connection task needs.
#[derive(Clone)]
pub struct ConnSettings {
    /// `host:port`.
    pub addr: String,
    /// Credentials and TLS shared by every connection to the upstream, replaced on reload:
    /// read at each connect.
    pub access: Arc<UpstreamAccess>,
    /// ACL user for AUTH/HELLO, for a connection that authenticates as someone other than the
    /// upstream URL's user (with `password`); `None` in the base settings.
    pub user: Option<String>,
    /// Password for AUTH/HELLO overriding `access`'s when set; `None` in the base settings,
    /// so the current (reloadable) credentials are used.
    pub password: Option<String>,
    /// Protocol spoken on this connection.
    pub proto: Proto,
    /// Deadline for the TCP connect and the TLS handshake.
    pub connect_timeout: Duration,
    /// Deadline for Redis's part of making a connection once connected (HELLO, AUTH, SELECT,
    /// READONLY, CLIENT TRACKING); `None` waits as long as Redis takes. A Redis stalled by a
    /// slow command, a script below its busy threshold or DEBUG SLEEP answers it late, as it
    /// answers any request: so it waits as a request does (`upstream.request_timeout_ms`,
    /// never less than `connect_timeout`; 0, as long as Redis takes), and a client's MULTI
    /// or blocking command waits out a stall as on Redis instead of failing. Connections made
    /// in the background (tracking lanes, pub/sub, topology fetches) use [`Self::background`].
    pub handshake_timeout: Option<Duration>,
    /// First reconnect delay.
    pub backoff_min: Duration,
    /// Largest reconnect delay.
    pub backoff_max: Duration,
    /// Turn on `CLIENT TRACKING` after the handshake (RESP3 only).
    pub tracking: bool,
    /// Database to SELECT after the handshake.
    pub db: u32,
    /// Reconnect after a failure. A dedicated (pinned) connection carries per-client state
    /// that a new connection would not have, so it fails for good instead.
    pub reconnect: bool,
    /// Send READONLY after the handshake: reads on a cluster replica.
    pub readonly: bool,
    /// Liveness checks; only for connections that reconnect (a dedicated connection may be
    /// inside MULTI, where a PING would be queued into the client's transaction).
    pub health: Option<Health>,
    /// corral's own connection, carrying no client's commands (a cache tracking lane): its
    /// local address is recorded in [`super::UpstreamStatus`] so MONITOR can leave its traffic out.
    pub internal: bool,
    /// Before writing a job, yield once so that other clients' ready jobs join the write (a
    /// shared connection). Off where requests must reach Redis as soon as they are queued:
    /// the pub/sub connection (an UNSUBSCRIBE must not fall behind a PUBLISH a client sends
    /// next) and dedicated connections (always off: see `Link::gather`).
    pub gather: bool,
    /// With `gather`: once this many requests are written and not yet answered, the next
    /// write waits for replies, and the requests queued meanwhile go out together (0: never
    /// wait). See `upstream.hold_writes_at`.
    pub hold_at: usize,
    /// A Redis ACL user's connection (`users.rs`): cancelled once Redis dropped a live
    /// connection of that user or refused to authenticate a new one; from then on no
    /// connection of the user is made again and a lost one is not reconnected. Its
    /// refusals are the user's, not corral's: they are not recorded as the upstream's.
    pub revoked: Option<CancellationToken>,
    /// On a connection that reconnects: a request unanswered this long (from when it was
    /// queued, or from the last reply bytes that arrived for it or the requests before it)
    /// resets it, and every request in flight on it fails with a timeout, so a stuck Redis
    /// holds a shared connection's clients no longer than `upstream.request_timeout_ms`.
    /// Enforced by the connection's task, which times its oldest request only: a client
    /// waiting on it sets no timer of its own ([`super::UpstreamConn::times_out`]). `None`
    /// on connections whose waiters time out in their own way (tracking lanes, pub/sub).
    pub request_timeout: Option<Duration>,
}

/// By hand, so that a password never reaches a log line that prints the settings.
impl std::fmt::Debug for ConnSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnSettings")
            .field("addr", &self.addr)
            .field("access", &self.access)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "MASKED"))
            .field("proto", &self.proto)
            .field("tracking", &self.tracking)
            .field("db", &self.db)
            .field("reconnect", &self.reconnect)
            .field("readonly", &self.readonly)
            .field("internal", &self.internal)
            .finish_non_exhaustive()
    }
}

impl ConnSettings {
    /// The base settings for every connection to the upstream `url` names, with `access`'s
    /// credentials and TLS: RESP2, database 0, reconnecting, no tracking; callers change what
    /// differs with struct update syntax.
    pub fn new(cfg: &Config, url: &UpstreamUrl, access: Arc<UpstreamAccess>) -> ConnSettings {
        ConnSettings {
            addr: url.addr.clone(),
            access,
            user: None,
            password: None,
            proto: Proto::Resp2,
            connect_timeout: cfg.connect_timeout(),
            backoff_min: Duration::from_millis(cfg.upstream.reconnect_min_ms),
            backoff_max: Duration::from_millis(cfg.upstream.reconnect_max_ms),
            tracking: false,
            db: 0,
            reconnect: true,
            readonly: false,
            health: Some(cfg.health()),
            internal: false,
            gather: true,
            hold_at: cfg.hold_writes_at(),
            revoked: None,
            request_timeout: cfg.request_timeout(),
            handshake_timeout: cfg.request_timeout().map(|r| r.max(cfg.connect_timeout())),
        }
    }

    /// These settings for a connection made in the background (a tracking lane, pub/sub, a
    /// topology fetch): no request deadline of its own, and Redis's handshake within
    /// `connect_timeout`, so a stalled node is given up on and tried again, or another one
    /// asked, rather than waited for.
    pub fn background(self) -> ConnSettings {
        ConnSettings {
            request_timeout: None,
            handshake_timeout: Some(self.connect_timeout),
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::upstream::access::Access;

    #[test]
    fn debug_output_masks_every_password() {
        let cfg = Config::default();
        let url = UpstreamUrl::parse("redis://app:url-secret@127.0.0.1:6379").unwrap();
        let access = Access {
            user: url.user.clone(),
            password: url.password.clone(),
            tls: None,
        };
        let s = ConnSettings {
            user: Some("other".into()),
            password: Some("own-secret".into()),
            ..ConnSettings::new(&cfg, &url, Arc::new(UpstreamAccess::new(access)))
        };
        let shown = format!("{s:?}");
        assert!(
            !shown.contains("secret") && shown.contains("MASKED"),
            "{shown}"
        );
    }
}
