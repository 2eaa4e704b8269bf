//! Connections to the upstream Redis: a few shared pipelined connections per protocol version,
//! each client pinned to one of them so its requests reach Redis in the order it sent them.

mod conn;
mod handshake;
mod status;
mod url;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

pub use conn::{ConnSettings, Job, JobResult, LinkObserver, ReplyTo, UpstreamConn};
pub use status::UpstreamStatus;
pub use url::UpstreamUrl;

use crate::config::Config;
use crate::error::ConfigError;
use crate::resp::Proto;

/// The shared connections to one upstream server.
#[derive(Debug)]
pub struct Upstream {
    resp2: Vec<UpstreamConn>,
    resp3: Vec<UpstreamConn>,
    /// Health and version, shared with INFO and the admin endpoint.
    pub status: Arc<UpstreamStatus>,
    /// Per-request deadline.
    pub request_timeout: Option<Duration>,
}

impl Upstream {
    /// Starts `upstream.connections` connection tasks for each protocol.
    ///
    /// # Errors
    /// The upstream URL in `cfg` is invalid.
    pub fn start(cfg: &Config, shutdown: &CancellationToken) -> Result<Upstream, ConfigError> {
        let status = Arc::new(UpstreamStatus::default());
        let base = Self::settings(cfg)?;
        let pool = |proto| {
            (0..cfg.upstream.connections)
                .map(|_| {
                    let settings = ConnSettings {
                        proto,
                        ..base.clone()
                    };
                    UpstreamConn::spawn(settings, status.clone(), shutdown.child_token(), None)
                })
                .collect::<Vec<_>>()
        };
        Ok(Upstream {
            resp2: pool(Proto::Resp2),
            resp3: pool(Proto::Resp3),
            status,
            request_timeout: cfg.request_timeout(),
        })
    }

    /// Connection settings from the config (RESP2, no tracking).
    ///
    /// # Errors
    /// The upstream URL in `cfg` is invalid.
    pub fn settings(cfg: &Config) -> Result<ConnSettings, ConfigError> {
        let url = cfg.upstream_url()?;
        Ok(ConnSettings {
            addr: url.addr,
            user: url.user,
            password: url.password,
            proto: Proto::Resp2,
            connect_timeout: cfg.connect_timeout(),
            backoff_min: Duration::from_millis(cfg.upstream.reconnect_min_ms),
            backoff_max: Duration::from_millis(cfg.upstream.reconnect_max_ms),
            tracking: false,
        })
    }

    /// The connection a client with this id uses for this protocol.
    pub fn conn(&self, proto: Proto, client_id: u64) -> &UpstreamConn {
        let pool = match proto {
            Proto::Resp2 => &self.resp2,
            Proto::Resp3 => &self.resp3,
        };
        // `start` always creates at least one connection (validated config).
        &pool[(client_id % pool.len() as u64) as usize]
    }
}
