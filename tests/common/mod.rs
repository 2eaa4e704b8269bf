//! Test harness: real `redis-server` processes on ephemeral loopback ports, corral running
//! in-process, and a raw RESP client that returns reply bytes exactly as received.
#![allow(dead_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener as StdListener, TcpStream as StdStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use corral::{Config, Listeners};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// A `redis-server` child process, killed on drop.
pub struct RedisServer {
    pub port: u16,
    child: Child,
    dir: PathBuf,
    extra: Vec<String>,
}

fn free_port() -> u16 {
    // Redis treats --port 0 as "no TCP", so pick a free port ourselves.
    let l = StdListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
    l.local_addr().expect("local addr").port()
}

impl RedisServer {
    /// Starts a server with default test settings.
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// Starts a server with extra command-line arguments (e.g. `["--requirepass", "pw"]`).
    pub fn start_with(extra: &[&str]) -> RedisServer {
        let extra: Vec<String> = extra.iter().map(|s| s.to_string()).collect();
        for _ in 0..10 {
            let port = free_port();
            if let Some(s) = Self::spawn_on(port, &extra) {
                return s;
            }
        }
        panic!("could not start redis-server on a free port after 10 tries");
    }

    fn spawn_on(port: u16, extra: &[String]) -> Option<RedisServer> {
        let dir = std::env::temp_dir().join(format!("corral-test-{}-{port}", std::process::id()));
        std::fs::create_dir_all(&dir).ok()?;
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot run redis-server ({e}); install it: apt-get install -y redis-server")
            });
        let mut server = RedisServer {
            port,
            child,
            dir,
            extra: extra.to_vec(),
        };
        if server.wait_ready(Duration::from_secs(10)) {
            Some(server)
        } else {
            None
        }
    }

    fn wait_ready(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            if let Ok(mut s) = StdStream::connect(("127.0.0.1", self.port)) {
                let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
                let mut buf = [0u8; 64];
                // A loading or password-protected server still proves it is listening.
                if s.write_all(b"PING\r\n").is_ok() && matches!(s.read(&mut buf), Ok(n) if n > 0)
                {
                    return true;
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the server (SIGKILL) and waits for it to exit.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the server again on the same port (after `kill`), with empty data.
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(mut fresh) = Self::spawn_on(self.port, &self.extra) {
                std::mem::swap(&mut self.child, &mut fresh.child);
                // `fresh` now holds the dead process; keep its drop away from the shared dir.
                fresh.dir = PathBuf::new();
                return;
            }
            assert!(Instant::now() < deadline, "redis-server did not restart");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends a signal (e.g. "STOP", "CONT") to the server process.
    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.pid().to_string()])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        assert!(ok, "kill -{sig} failed");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .status();
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// corral running in-process on an ephemeral port.
pub struct TestProxy {
    pub addr: SocketAddr,
    pub admin: Option<SocketAddr>,
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
        let mut cfg = Config::default();
        cfg.upstream.url = upstream_url.to_string();
        tweak(&mut cfg);
        let client = TcpListener::bind("127.0.0.1:0").await.expect("bind proxy");
        let addr = client.local_addr().expect("proxy addr");
        let admin_listener = TcpListener::bind("127.0.0.1:0").await.expect("bind admin");
        let admin = admin_listener.local_addr().ok();
        let shutdown = CancellationToken::new();
        let handle = tokio::spawn(corral::run(
            Arc::new(cfg),
            Listeners {
                client,
                admin: Some(admin_listener),
            },
            shutdown.clone(),
        ));
        let proxy = TestProxy {
            addr,
            admin,
            shutdown,
            handle,
        };
        proxy.wait_upstream().await;
        proxy
    }

    /// Waits (up to 5 s) until a PING through the proxy reaches... the proxy, and a forwarded
    /// command gets a reply that is not an upstream error.
    async fn wait_upstream(&self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(mut c) = RawClient::connect(self.addr).await {
                if let Ok(r) = c.try_request(&[b"EXISTS", b"__corral_probe__"]).await {
                    if !r.starts_with(b"-ERR upstream") {
                        return;
                    }
                }
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

/// Encodes a request as a RESP array of bulk strings.
pub fn encode(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// Splits a command line on spaces into arguments.
pub fn words(line: &str) -> Vec<Vec<u8>> {
    line.split(' ').map(|w| w.as_bytes().to_vec()).collect()
}

/// Length of the first complete RESP2/RESP3 frame in `buf`, decoded by `redis-protocol` (an
/// implementation independent of corral's own scanner). Push frames count as frames.
pub fn frame_len(buf: &[u8]) -> Option<usize> {
    match redis_protocol::resp3::decode::complete::decode(buf) {
        Ok(Some((_, n))) => Some(n),
        Ok(None) => None,
        Err(e) => panic!("undecodable reply {:?}: {e}", String::from_utf8_lossy(buf)),
    }
}

/// A client that sends raw bytes and returns raw reply bytes.
pub struct RawClient {
    pub stream: TcpStream,
    buf: Vec<u8>,
}

impl RawClient {
    pub async fn connect(addr: SocketAddr) -> std::io::Result<RawClient> {
        let stream = TcpStream::connect(addr).await?;
        stream.set_nodelay(true)?;
        Ok(RawClient {
            stream,
            buf: Vec::new(),
        })
    }

    /// Sends raw bytes.
    pub async fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).await.expect("send");
    }

    /// Reads exactly one reply frame (10 s deadline) and returns its bytes.
    pub async fn read_reply(&mut self) -> Vec<u8> {
        self.try_read_reply().await.expect("read reply")
    }

    pub async fn try_read_reply(&mut self) -> std::io::Result<Vec<u8>> {
        let deadline = Duration::from_secs(10);
        loop {
            if let Some(n) = frame_len(&self.buf) {
                return Ok(self.buf.drain(..n).collect());
            }
            let mut chunk = [0u8; 65536];
            let n = tokio::time::timeout(deadline, self.stream.read(&mut chunk))
                .await
                .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no reply"))??;
            if n == 0 {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    format!("closed; partial {:?}", String::from_utf8_lossy(&self.buf)),
                ));
            }
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// Sends one request and returns its reply bytes.
    pub async fn request(&mut self, args: &[&[u8]]) -> Vec<u8> {
        self.try_request(args).await.expect("request")
    }

    pub async fn try_request(&mut self, args: &[&[u8]]) -> std::io::Result<Vec<u8>> {
        self.stream.write_all(&encode(args)).await?;
        self.try_read_reply().await
    }

    /// Sends a command given as a space-separated line; returns the reply bytes.
    pub async fn cmd(&mut self, line: &str) -> Vec<u8> {
        let w = words(line);
        let args: Vec<&[u8]> = w.iter().map(Vec::as_slice).collect();
        self.request(&args).await
    }

    /// True when the server closed the connection (reads EOF within 5 s).
    pub async fn is_closed(&mut self) -> bool {
        let mut chunk = [0u8; 1024];
        loop {
            match tokio::time::timeout(Duration::from_secs(5), self.stream.read(&mut chunk)).await
            {
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => continue,
                Err(_) => return false,
            }
        }
    }
}
