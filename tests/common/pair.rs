//! Two identical Redis servers, one reached directly and one behind corral.

use std::net::SocketAddr;

use corral::Config;

use super::proxy::TestProxy;
use super::script::Side;
use super::server::RedisServer;

/// Two identical Redis servers: one reached directly, one behind corral. Scripts run on both
/// sides are compared byte for byte.
pub struct RedisPair {
    /// Redis reached directly.
    pub direct: SocketAddr,
    /// corral, in front of `behind`.
    pub proxy: TestProxy,
    /// The Redis behind corral (asked directly about its clients).
    pub behind: SocketAddr,
    _servers: (RedisServer, RedisServer),
}

impl RedisPair {
    /// Both servers with default settings, corral with its defaults.
    pub async fn start() -> RedisPair {
        Self::start_with(|_| {}).await
    }

    /// Both servers with default settings, corral's configuration adjusted by `tweak`.
    pub async fn start_with(tweak: impl FnOnce(&mut Config)) -> RedisPair {
        Self::start_servers_with(&[], tweak).await
    }

    /// Both servers started with `server_args`, corral's configuration adjusted by `tweak`.
    pub async fn start_servers_with(
        server_args: &[&str],
        tweak: impl FnOnce(&mut Config),
    ) -> RedisPair {
        let a = RedisServer::start_with(server_args);
        let b = RedisServer::start_with(server_args);
        let proxy = TestProxy::start_with(&b.url(), tweak).await;
        RedisPair {
            direct: a.addr(),
            behind: b.addr(),
            proxy,
            _servers: (a, b),
        }
    }

    /// Runs `f` on both servers (before corral's clients arrive): users, scripts, settings.
    pub fn on_both(&self, f: impl Fn(u16)) {
        f(self._servers.0.port);
        f(self._servers.1.port);
    }

    /// Restarts the Redis behind corral on its port, with empty data.
    pub fn restart_behind(&mut self) {
        self._servers.1.restart();
    }

    /// The two sides of a script: Redis directly, and the other Redis through corral.
    pub fn sides(&self) -> [Side; 2] {
        [
            Side {
                name: "redis",
                entry: self.direct,
                server: self.direct,
            },
            Side {
                name: "corral",
                entry: self.proxy.addr,
                server: self.behind,
            },
        ]
    }
}
