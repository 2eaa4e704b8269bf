//! corral in-process in front of a test upstream, and what tests ask of it besides RESP.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use corral::{Config, Listeners};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::client::RawClient;
use super::resp::show;

/// corral running in-process on an ephemeral port.
pub struct TestProxy {
    pub addr: SocketAddr,
    pub admin: Option<SocketAddr>,
    /// The config it started with (tests reload changed copies of it).
    pub config: Arc<Config>,
    /// Reloads the running proxy, as SIGHUP does the binary.
    pub reloader: corral::Reloader,
    shutdown: CancellationToken,
    handle: tokio::task::JoinHandle<corral::Result<()>>,
}

impl TestProxy {
    /// A proxy in front of `upstream_url` with default settings.
    pub async fn start(upstream_url: &str) -> TestProxy {
        Self::start_with(upstream_url, |_| {}).await
    }

    /// A proxy whose config is adjusted by `tweak` before start.
    pub async fn start_with(upstream_url: &str, tweak: impl FnOnce(&mut Config)) -> TestProxy {
        let proxy = Self::spawn_with(upstream_url, tweak).await;
        proxy.wait_upstream().await;
        proxy
    }

    /// Waits (up to 5 s) until a PING through the proxy reaches... the proxy, and a forwarded
    /// command gets a reply that is not an upstream error.
    async fn wait_upstream(&self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(mut c) = RawClient::connect(self.addr).await
                && let Ok(r) = c.try_request(&[b"EXISTS", b"__corral_probe__"]).await
                && !r.starts_with(b"-ERR upstream")
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Stops the proxy and waits for `run` to return.
    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.handle).await;
    }
}

impl TestProxy {
    /// Starts a proxy without waiting for its upstream, for tests where the upstream is down or
    /// refuses corral's credentials (`start_with` would spend its whole probe deadline there).
    pub async fn spawn_with(upstream_url: &str, tweak: impl FnOnce(&mut Config)) -> TestProxy {
        let mut cfg = Config::default();
        cfg.upstream.url = upstream_url.to_string();
        tweak(&mut cfg);
        let client = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = client.local_addr().expect("proxy addr");
        let admin_listener = TcpListener::bind("127.0.0.1:0").await.expect("bind admin");
        let admin = admin_listener.local_addr().ok();
        let shutdown = CancellationToken::new();
        let config = Arc::new(cfg);
        let reloader = corral::Reloader::default();
        let handle = tokio::spawn(corral::run_with(
            config.clone(),
            Listeners {
                client,
                admin: Some(admin_listener),
                tls: None,
            },
            shutdown.clone(),
            reloader.clone(),
        ));
        TestProxy {
            addr,
            admin,
            config,
            reloader,
            shutdown,
            handle,
        }
    }
}

/// A plain HTTP/1.0 GET; returns the status code and the body.
pub async fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: test\r\n\r\n").as_bytes())
        .await?;
    let mut resp = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut resp))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no HTTP response"))??;
    let text = String::from_utf8_lossy(&resp).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP response: {text:?}"));
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    Ok((status, body.to_string()))
}
