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
                if s.write_all(b"PING\r\n").is_ok() && matches!(s.read(&mut buf), Ok(n) if n > 0) {
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
            .stderr(Stdio::null())
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
        // The RESP3 decoder rejects RESP2's null bulk string and null array (`$-1`, `*-1`).
        Err(e) => match redis_protocol::resp2::decode::decode(buf) {
            Ok(Some((_, n))) => Some(n),
            Ok(None) => None,
            Err(_) => panic!("undecodable reply {:?}: {e}", String::from_utf8_lossy(buf)),
        },
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
        read_frame(&mut self.stream, &mut self.buf).await
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
            match tokio::time::timeout(Duration::from_secs(5), self.stream.read(&mut chunk)).await {
                Ok(Ok(0)) | Ok(Err(_)) => return true,
                Ok(Ok(_)) => continue,
                Err(_) => return false,
            }
        }
    }
}

// ---- Helpers for the behaviour and fault-tolerance tests (pipeline, clients, upstream_faults,
// limits, binary). ----

/// A port that was free a moment ago, for processes that must be told a port (the corral binary).
pub fn unused_port() -> u16 {
    free_port()
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
        let handle = tokio::spawn(corral::run(
            Arc::new(cfg),
            Listeners {
                client,
                admin: Some(admin_listener),
            },
            shutdown.clone(),
        ));
        TestProxy {
            addr,
            admin,
            shutdown,
            handle,
        }
    }
}

/// RESP2 bulk string.
pub fn bulk(b: impl AsRef<[u8]>) -> Vec<u8> {
    let b = b.as_ref();
    let mut out = format!("${}\r\n", b.len()).into_bytes();
    out.extend_from_slice(b);
    out.extend_from_slice(b"\r\n");
    out
}

/// RESP integer.
pub fn int(n: i64) -> Vec<u8> {
    format!(":{n}\r\n").into_bytes()
}

/// RESP2 array of bulk strings.
pub fn bulk_array<S: AsRef<[u8]>>(items: &[S]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", items.len()).into_bytes();
    for i in items {
        out.extend_from_slice(&bulk(i));
    }
    out
}

/// Reads one reply frame from `rd`, buffering in `buf` (10 s deadline per read).
async fn read_frame(
    rd: &mut (impl tokio::io::AsyncRead + Unpin),
    buf: &mut Vec<u8>,
) -> std::io::Result<Vec<u8>> {
    loop {
        if let Some(n) = frame_len(buf) {
            return Ok(buf.drain(..n).collect());
        }
        // Straight into the heap buffer: a stack chunk held across the await would make every
        // request future 64 KB, and a test's future lives on the 2 MB test-thread stack.
        buf.reserve(64 * 1024);
        let n = tokio::time::timeout(Duration::from_secs(10), rd.read_buf(buf))
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no reply"))??;
        if n == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!("closed; partial {:?}", String::from_utf8_lossy(buf)),
            ));
        }
    }
}

impl RawClient {
    /// Writes `bytes` in pieces of `chunk` bytes while reading `n` replies concurrently, so
    /// neither side waits for the other: a pipeline whose replies outgrow the socket buffers
    /// cannot deadlock on the client's side.
    pub async fn pipeline(&mut self, bytes: &[u8], chunk: usize, n: usize) -> Vec<Vec<u8>> {
        let (mut rd, mut wr) = self.stream.split();
        let buf = &mut self.buf;
        let write = async {
            for piece in bytes.chunks(chunk.max(1)) {
                wr.write_all(piece).await.expect("pipeline write");
            }
        };
        let read = async {
            let mut out = Vec::with_capacity(n);
            for i in 0..n {
                match read_frame(&mut rd, buf).await {
                    Ok(r) => out.push(r),
                    Err(e) => panic!("reply {i} of {n}: {e}"),
                }
            }
            out
        };
        tokio::join!(write, read).1
    }

    /// Reads `n` replies.
    pub async fn read_replies(&mut self, n: usize) -> Vec<Vec<u8>> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(self.read_reply().await);
        }
        out
    }
}

/// Connects to `addr`, sends `bytes` (concurrently with reading, ignoring write errors: the
/// server may close before it has read everything) and returns all bytes received until the
/// server closes the connection. Panics if it is still open after 10 s.
pub async fn send_until_closed(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut stream = TcpStream::connect(addr).await.expect("connect");
    let (mut rd, mut wr) = stream.split();
    let write = async {
        let _ = wr.write_all(bytes).await;
    };
    let read = async {
        let mut got = Vec::new();
        loop {
            got.reserve(64 * 1024);
            match tokio::time::timeout(Duration::from_secs(10), rd.read_buf(&mut got)).await {
                Ok(Ok(0)) => return got,
                Ok(Ok(_)) => {}
                // A reset after the reply (unread request bytes at close) still means closed.
                Ok(Err(_)) => return got,
                Err(_) => panic!(
                    "{addr} did not close the connection; got {:?}",
                    String::from_utf8_lossy(&got)
                ),
            }
        }
    };
    tokio::join!(write, read).1
}

/// Calls `f` every 20 ms until it returns `Some`, and returns that; panics naming `what` after
/// `limit`. Used instead of sleeps wherever a test waits for something to happen.
pub async fn poll_until<T, F, Fut>(limit: Duration, what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
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

/// Shows reply bytes readably in assertion messages.
pub fn show(b: &[u8]) -> String {
    let s = String::from_utf8_lossy(b);
    if s.len() > 300 {
        let head: String = s.chars().take(300).collect();
        format!("{head:?}... ({} bytes)", b.len())
    } else {
        format!("{s:?}")
    }
}

/// Whether `needle` occurs in `hay`.
pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    needle.is_empty() || hay.windows(needle.len()).any(|w| w == needle)
}

/// A bound on a polling loop whose body needs `&mut` access (where [`poll_until`]'s closure
/// cannot): call [`Deadline::pause`] between attempts.
pub struct Deadline {
    end: Instant,
    what: &'static str,
}

impl Deadline {
    pub fn new(limit: Duration, what: &'static str) -> Deadline {
        Deadline {
            end: Instant::now() + limit,
            what,
        }
    }

    /// Panics if the deadline has passed, else waits 20 ms before the next attempt.
    pub async fn pause(&self) {
        assert!(
            Instant::now() < self.end,
            "timed out waiting for {}",
            self.what
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
