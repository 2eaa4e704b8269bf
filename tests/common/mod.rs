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

/// Connects a raw client, failing the test if it cannot.
pub async fn connect(addr: SocketAddr) -> RawClient {
    RawClient::connect(addr).await.expect("connect")
}

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
        let a = RedisServer::start();
        let b = RedisServer::start();
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

// ---- Helpers for the stateful-command tests (stateful.rs): a RESP scanner of its own, so
// replies that `frame_len`'s decoders reject (RESP2 nulls nested in arrays, RESP3 sets of
// maps) are still split correctly, and redis-cli-like command lines. ----

/// Length of the first complete reply in `buf` (RESP2 or RESP3), `None` if incomplete. An
/// attribute (`|`) belongs to the reply that follows it; a push (`>`) counts as a reply.
/// Iterative, with an explicit count of elements still owed per open aggregate, so a reply
/// nested as deeply as Redis allows cannot overflow the test thread's stack.
pub fn resp_len(buf: &[u8]) -> Option<usize> {
    let mut pos = 0;
    let mut open: Vec<i64> = Vec::new();
    loop {
        let kind = *buf.get(pos)?;
        let eol = pos + buf[pos..].windows(2).position(|w| w == b"\r\n")?;
        let line = &buf[pos + 1..eol];
        let number = || -> i64 {
            std::str::from_utf8(line)
                .ok()
                .and_then(|l| l.parse().ok())
                .unwrap_or_else(|| panic!("bad length in reply {}", show(&buf[pos..])))
        };
        let next = eol + 2;
        // Where this element's own bytes end, and how many elements it opens.
        let (end, children) = match kind {
            b'+' | b'-' | b':' | b',' | b'(' | b'#' | b'_' => (next, 0),
            b'$' | b'!' | b'=' => match usize::try_from(number()) {
                Ok(n) if buf.len() < next + n + 2 => return None,
                Ok(n) => (next + n + 2, 0),
                Err(_) => (next, 0), // $-1
            },
            b'*' | b'~' | b'>' => (next, number().max(0)),
            b'%' => (next, 2 * number().max(0)),
            b'|' => (next, 2 * number().max(0) + 1),
            _ => panic!("not a RESP reply: {}", show(&buf[pos..])),
        };
        pos = end;
        if children > 0 {
            open.push(children);
            continue;
        }
        // One element done: close every aggregate it completes.
        loop {
            match open.last_mut() {
                None => return Some(pos),
                Some(left) => {
                    *left -= 1;
                    if *left > 0 {
                        break;
                    }
                    open.pop();
                }
            }
        }
    }
}

impl RawClient {
    /// Reads one reply split by [`resp_len`] (10 s deadline per read).
    pub async fn read_resp(&mut self) -> Vec<u8> {
        self.try_read_resp().await.expect("read reply")
    }

    pub async fn try_read_resp(&mut self) -> std::io::Result<Vec<u8>> {
        loop {
            if let Some(n) = resp_len(&self.buf) {
                return Ok(self.buf.drain(..n).collect());
            }
            self.buf.reserve(64 * 1024);
            let read =
                tokio::time::timeout(Duration::from_secs(10), self.stream.read_buf(&mut self.buf));
            let n = match read.await {
                Ok(r) => r?,
                Err(_) => {
                    let msg = format!("no reply within 10 s; partial {}", show(&self.buf));
                    return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, msg));
                }
            };
            if n == 0 {
                let msg = format!("connection closed; partial {}", show(&self.buf));
                return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, msg));
            }
        }
    }

    /// True if reply bytes are already buffered or readable right now, without waiting.
    pub fn has_pending_reply(&mut self) -> bool {
        if !self.buf.is_empty() {
            return true;
        }
        let mut probe = [0u8; 1];
        match self.stream.try_read(&mut probe) {
            Ok(0) => true, // EOF is something too: not silently waiting
            Ok(_) => {
                self.buf.push(probe[0]);
                true
            }
            Err(_) => false, // WouldBlock (or an error, reported by the next read)
        }
    }
}

/// Blanks out the `id` field of a HELLO reply (a per-connection id that necessarily differs
/// between two servers).
pub fn mask_hello_id(reply: &[u8]) -> Vec<u8> {
    let key = b"$2\r\nid\r\n:";
    let Some(at) = reply.windows(key.len()).position(|w| w == key) else {
        return reply.to_vec();
    };
    let start = at + key.len();
    let end = start
        + reply[start..]
            .iter()
            .position(|&b| b == b'\r')
            .expect("id line end");
    [&reply[..start], b"<id>", &reply[end..]].concat()
}

/// Splits a redis-cli-like line into commands and arguments: arguments are separated by
/// spaces, commands by a `;` word, and "double quotes" group an argument, understanding the
/// escapes \n \r \t \" and \\.
pub fn parse_commands(line: &str) -> Vec<Vec<Vec<u8>>> {
    let mut cmds = vec![Vec::new()];
    let mut chars = line.chars().peekable();
    loop {
        while chars.peek() == Some(&' ') {
            chars.next();
        }
        let Some(&first) = chars.peek() else { break };
        let mut arg = String::new();
        if first == '"' {
            chars.next();
            loop {
                match chars.next() {
                    Some('"') => break,
                    Some('\\') => match chars.next() {
                        Some('n') => arg.push('\n'),
                        Some('r') => arg.push('\r'),
                        Some('t') => arg.push('\t'),
                        Some(c) => arg.push(c),
                        None => panic!("dangling escape in {line:?}"),
                    },
                    Some(c) => arg.push(c),
                    None => panic!("unbalanced quotes in {line:?}"),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c == ' ' {
                    break;
                }
                arg.push(c);
                chars.next();
            }
            if arg == ";" {
                cmds.push(Vec::new());
                continue;
            }
        }
        cmds.last_mut().expect("a command").push(arg.into_bytes());
    }
    cmds.retain(|c| !c.is_empty());
    cmds
}

// ---- Redis Cluster harness (cluster tests). ----

/// Sends one command on a fresh blocking connection to 127.0.0.1:`port` and returns the reply
/// bytes (5 s deadline).
pub fn try_sync_cmd(port: u16, args: &[&str]) -> std::io::Result<Vec<u8>> {
    let mut s = StdStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
    s.write_all(&encode(&args))?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 * 1024];
    loop {
        if let Some(n) = frame_len(&buf) {
            buf.truncate(n);
            return Ok(buf);
        }
        let n = s.read(&mut chunk)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// [`try_sync_cmd`], panicking on I/O errors.
pub fn sync_cmd(port: u16, args: &[&str]) -> Vec<u8> {
    try_sync_cmd(port, args).unwrap_or_else(|e| panic!("{args:?} to port {port}: {e}"))
}

/// The text of a bulk-string or simple-string reply (INFO, CLUSTER INFO, CLUSTER NODES).
pub fn reply_text(reply: &[u8]) -> String {
    match redis_protocol::resp2::decode::decode(reply) {
        Ok(Some((redis_protocol::resp2::types::OwnedFrame::BulkString(b), _)))
        | Ok(Some((redis_protocol::resp2::types::OwnedFrame::SimpleString(b), _))) => {
            String::from_utf8_lossy(&b).into_owned()
        }
        _ => panic!("not a string reply: {}", show(reply)),
    }
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone)]
pub struct NodeLine {
    pub id: String,
    pub port: u16,
    pub flags: Vec<String>,
    /// Master id for replicas, "-" for masters.
    pub master_id: String,
    pub connected: bool,
    /// Slot ranges served (inclusive), masters only; migration markers are left out.
    pub slots: Vec<(u16, u16)>,
}

impl NodeLine {
    pub fn is_master(&self) -> bool {
        self.flags.iter().any(|f| f == "master")
    }
    pub fn is_replica(&self) -> bool {
        self.flags.iter().any(|f| f == "slave")
    }
    /// Flagged failing, half-known, or still being introduced.
    pub fn is_troubled(&self) -> bool {
        self.flags
            .iter()
            .any(|f| matches!(f.as_str(), "fail" | "fail?" | "handshake" | "noaddr"))
    }
}

/// Parses `CLUSTER NODES` text (`id ip:port@bus[,hostname] flags master ping pong epoch link
/// slot...`).
pub fn parse_cluster_nodes(text: &str) -> Vec<NodeLine> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert!(f.len() >= 8, "bad CLUSTER NODES line {l:?}");
            let addr = f[1].split(['@', ',']).next().unwrap_or("");
            let port = addr
                .rsplit(':')
                .next()
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            let slots = f[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .map(|s| match s.split_once('-') {
                    Some((a, b)) => (a.parse().unwrap(), b.parse().unwrap()),
                    None => (s.parse().unwrap(), s.parse().unwrap()),
                })
                .collect();
            NodeLine {
                id: f[0].to_string(),
                port,
                flags: f[2].split(',').map(str::to_string).collect(),
                master_id: f[3].to_string(),
                connected: f[7] == "connected",
                slots,
            }
        })
        .collect()
}

/// A Redis Cluster of real `redis-server` processes on ephemeral loopback ports, each with its
/// own temporary directory; all killed and their directories removed on drop.
pub struct RedisCluster {
    pub servers: Vec<RedisServer>,
    pub masters: usize,
    pub replicas_per_master: usize,
}

impl RedisCluster {
    /// Starts `masters * (1 + replicas_per_master)` nodes, joins them with
    /// `redis-cli --cluster create`, and waits (up to 30 s) until every live node reports
    /// `cluster_state:ok` and every replica is attached and synced.
    pub fn start(masters: usize, replicas_per_master: usize) -> RedisCluster {
        let total = masters * (1 + replicas_per_master);
        let servers = (0..total).map(|_| Self::spawn_node()).collect();
        let mut cluster = RedisCluster {
            servers,
            masters,
            replicas_per_master,
        };
        let addrs: Vec<String> = cluster
            .nodes()
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args([
                "--cluster-replicas",
                &replicas_per_master.to_string(),
                "--cluster-yes",
            ])
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        cluster.wait_healthy(Duration::from_secs(30));
        cluster
    }

    /// One cluster-enabled node. The cluster bus gets its own free port (the default,
    /// port + 10000, may be taken or past 65535); a clash on either port means a retry.
    fn spawn_node() -> RedisServer {
        Self::spawn_node_with(&[])
    }

    /// [`RedisCluster::spawn_node`] with extra arguments.
    fn spawn_node_with(more: &[&str]) -> RedisServer {
        for _ in 0..10 {
            let bus = free_port();
            let mut extra: Vec<String> = [
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                // Relative to the node's own --dir, which is named after its port.
                "nodes.conf",
                "--cluster-node-timeout",
                "1000",
                "--cluster-port",
                &bus.to_string(),
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            extra.extend(more.iter().map(|s| s.to_string()));
            let port = free_port();
            if port != bus
                && let Some(s) = RedisServer::spawn_on(port, &extra)
            {
                return s;
            }
        }
        panic!("could not start a cluster node after 10 tries");
    }

    /// Client ports of all nodes, killed or not, in start order.
    pub fn nodes(&self) -> Vec<u16> {
        self.servers.iter().map(|s| s.port).collect()
    }

    /// Ports of nodes still running.
    pub fn live_nodes(&mut self) -> Vec<u16> {
        self.servers
            .iter_mut()
            .filter_map(|s| matches!(s.child.try_wait(), Ok(None)).then_some(s.port))
            .collect()
    }

    /// `redis://` URLs of all nodes, to use as seeds.
    pub fn seeds(&self) -> Vec<String> {
        self.servers.iter().map(RedisServer::url).collect()
    }

    /// `CLUSTER NODES` as seen by the node at `port`.
    pub fn cluster_nodes(port: u16) -> Vec<NodeLine> {
        parse_cluster_nodes(&reply_text(&sync_cmd(port, &["CLUSTER", "NODES"])))
    }

    /// Port of the master serving `slot`, as a live node sees it.
    pub fn master_for_slot(&mut self, slot: u16) -> u16 {
        self.master_for_slot_opt(slot)
            .unwrap_or_else(|| panic!("no master serves slot {slot}"))
    }

    /// Port of the healthy master serving `slot`, if a live node knows one.
    pub fn master_for_slot_opt(&mut self, slot: u16) -> Option<u16> {
        let port = *self.live_nodes().first()?;
        let nodes = parse_cluster_nodes(&reply_text(
            &try_sync_cmd(port, &["CLUSTER", "NODES"]).ok()?,
        ));
        nodes
            .iter()
            .find(|n| {
                n.is_master()
                    && !n.is_troubled()
                    && n.slots.iter().any(|&(a, b)| (a..=b).contains(&slot))
            })
            .map(|n| n.port)
    }

    /// Ports of the nodes that currently are masters serving slots.
    pub fn master_ports(&mut self) -> Vec<u16> {
        let port = *self.live_nodes().first().expect("no live node");
        let mut v: Vec<u16> = Self::cluster_nodes(port)
            .iter()
            .filter(|n| n.is_master() && !n.is_troubled() && !n.slots.is_empty())
            .map(|n| n.port)
            .collect();
        v.sort_unstable();
        v
    }

    /// Ports of the replicas of the master at `master_port`.
    pub fn replicas_of(&mut self, master_port: u16) -> Vec<u16> {
        let nodes = Self::cluster_nodes(master_port);
        let id = nodes
            .iter()
            .find(|n| n.flags.iter().any(|f| f == "myself"))
            .map(|n| n.id.clone())
            .expect("myself in CLUSTER NODES");
        nodes
            .iter()
            .filter(|n| n.is_replica() && n.master_id == id)
            .map(|n| n.port)
            .collect()
    }

    /// Kills the node at `port` (SIGKILL). Its data dir goes with the cluster.
    pub fn kill_node(&mut self, port: u16) {
        let s = self
            .servers
            .iter_mut()
            .find(|s| s.port == port)
            .unwrap_or_else(|| panic!("no node on port {port}"));
        s.kill();
    }

    /// Promotes the replica at `replica_port` with `CLUSTER FAILOVER` (or `FAILOVER FORCE` /
    /// `TAKEOVER` as `mode`, for a dead master) and waits until the cluster is ok with it as
    /// a master.
    pub fn failover(&mut self, replica_port: u16, mode: Option<&str>) {
        let mut args = vec!["CLUSTER", "FAILOVER"];
        args.extend(mode);
        let r = sync_cmd(replica_port, &args);
        assert_eq!(r, b"+OK\r\n", "CLUSTER FAILOVER: {}", show(&r));
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let promoted = Self::cluster_nodes(replica_port)
                .iter()
                .any(|n| n.port == replica_port && n.is_master() && !n.slots.is_empty());
            if promoted && self.all_ok() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "failover to {replica_port} did not finish"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        // The old master turns into a replica of the new one.
        self.wait_healthy(Duration::from_secs(30));
    }

    /// Starts one more node and joins it as a master without slots (CLUSTER MEET), waiting
    /// until every node sees it connected. Give it a slot ([`RedisCluster::move_empty_slot`])
    /// before waiting for health: a master without slots is not counted. It stays a master
    /// when it loses its slots (no replica migration), ready for [`RedisCluster::remove_master`].
    pub fn add_master(&mut self) -> u16 {
        let node = Self::spawn_node_with(&["--cluster-allow-replica-migration", "no"]);
        let port = node.port;
        let first = *self.live_nodes().first().expect("no live node");
        // The bus port is not port + 10000 here: MEET must be told it.
        let nodes = reply_text(&sync_cmd(first, &["CLUSTER", "NODES"]));
        let bus = nodes
            .lines()
            .find(|l| l.contains("myself"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|a| a.split(['@', ',']).nth(1))
            .expect("bus port in CLUSTER NODES")
            .to_string();
        let r = sync_cmd(
            port,
            &["CLUSTER", "MEET", "127.0.0.1", &first.to_string(), &bus],
        );
        assert_eq!(r, b"+OK\r\n", "CLUSTER MEET: {}", show(&r));
        self.servers.push(node);
        self.masters += 1;
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.live_nodes().into_iter().all(|p| {
            Self::cluster_nodes(p)
                .iter()
                .any(|n| n.port == port && n.connected && !n.is_troubled())
        }) {
            assert!(Instant::now() < deadline, "new node {port} never joined");
            std::thread::sleep(Duration::from_millis(50));
        }
        port
    }

    /// Moves `slot`, which must hold no keys, to the master at `dst` (IMPORTING/MIGRATING,
    /// then SETSLOT NODE on every master, the target first), and waits until every live node
    /// agrees.
    pub fn move_empty_slot(&mut self, slot: u16, dst: u16) {
        let src = self.master_for_slot(slot);
        let id = |p: u16| reply_text(&sync_cmd(p, &["CLUSTER", "MYID"]));
        let (src_id, dst_id, s) = (id(src), id(dst), slot.to_string());
        let ok = |r: Vec<u8>, what: &str| assert_eq!(r, b"+OK\r\n", "{what}: {}", show(&r));
        ok(
            sync_cmd(dst, &["CLUSTER", "SETSLOT", &s, "IMPORTING", &src_id]),
            "SETSLOT IMPORTING",
        );
        ok(
            sync_cmd(src, &["CLUSTER", "SETSLOT", &s, "MIGRATING", &dst_id]),
            "SETSLOT MIGRATING",
        );
        let mut order = vec![dst, src];
        let port = *self.live_nodes().first().expect("no live node");
        order.extend(
            Self::cluster_nodes(port)
                .iter()
                .filter(|n| n.is_master() && n.port != dst && n.port != src)
                .map(|n| n.port),
        );
        for p in order {
            let r = sync_cmd(p, &["CLUSTER", "SETSLOT", &s, "NODE", &dst_id]);
            ok(r, &format!("SETSLOT NODE on {p}"));
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while !self.live_nodes().into_iter().all(|p| {
            Self::cluster_nodes(p)
                .iter()
                .any(|n| n.port == dst && n.slots.iter().any(|&(a, b)| (a..=b).contains(&slot)))
        }) {
            assert!(
                Instant::now() < deadline,
                "slot {slot} never moved to {dst}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Takes the master at `port`, which must serve no slots, out of the cluster: every other
    /// node forgets it and it forgets them (CLUSTER RESET), so gossip cannot bring it back.
    /// The node keeps running, alone; it is returned to the caller.
    pub fn remove_master(&mut self, port: u16) -> RedisServer {
        let id = reply_text(&sync_cmd(port, &["CLUSTER", "MYID"]));
        let at = self
            .servers
            .iter()
            .position(|s| s.port == port)
            .unwrap_or_else(|| panic!("no node on port {port}"));
        let node = self.servers.remove(at);
        self.masters -= 1;
        for p in self.live_nodes() {
            let r = sync_cmd(p, &["CLUSTER", "FORGET", &id]);
            assert_eq!(r, b"+OK\r\n", "CLUSTER FORGET on {p}: {}", show(&r));
        }
        let r = sync_cmd(port, &["CLUSTER", "RESET", "HARD"]);
        assert_eq!(r, b"+OK\r\n", "CLUSTER RESET on {port}: {}", show(&r));
        self.wait_healthy(Duration::from_secs(30));
        node
    }

    /// Whether every live node says `cluster_state:ok`.
    pub fn all_ok(&mut self) -> bool {
        self.live_nodes().into_iter().all(|p| {
            try_sync_cmd(p, &["CLUSTER", "INFO"])
                .map(|r| reply_text(&r).contains("cluster_state:ok"))
                .unwrap_or(false)
        })
    }

    /// Waits until every live node is ok and sees all live nodes connected, the expected
    /// number of masters with slots, and every live replica attached (`master_link_status:up`).
    /// Killed nodes are left out, so this also waits out a failover.
    pub fn wait_healthy(&mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        let mut last = String::new();
        while Instant::now() < deadline {
            match self.health_problem() {
                None => return,
                Some(p) => last = p,
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("cluster not healthy after {limit:?}: {last}");
    }

    fn health_problem(&mut self) -> Option<String> {
        let live = self.live_nodes();
        let total = live.len();
        for p in live {
            let info = match try_sync_cmd(p, &["CLUSTER", "INFO"]) {
                Ok(r) => reply_text(&r),
                Err(e) => return Some(format!("{p}: {e}")),
            };
            if !info.contains("cluster_state:ok") {
                return Some(format!("{p}: cluster_state not ok"));
            }
            let nodes = Self::cluster_nodes(p);
            let good = nodes
                .iter()
                .filter(|n| n.connected && !n.is_troubled())
                .count();
            let masters = nodes
                .iter()
                .filter(|n| n.is_master() && !n.slots.is_empty())
                .count();
            let replicas = nodes
                .iter()
                .filter(|n| n.is_replica() && !n.is_troubled())
                .count();
            if good != total || masters != self.masters || replicas != total - self.masters {
                return Some(format!(
                    "{p} sees {good}/{total} good nodes, {masters} masters, {replicas} replicas"
                ));
            }
            let myself = nodes
                .iter()
                .find(|n| n.flags.iter().any(|f| f == "myself"))?;
            if myself.is_replica() {
                let repl = reply_text(&sync_cmd(p, &["INFO", "replication"]));
                if !repl.contains("master_link_status:up") {
                    return Some(format!("replica {p} not attached"));
                }
            }
        }
        None
    }
}

// ---- corral in front of a test cluster ----

/// corral in front of `cluster` (topology refreshed every 500 ms, 2 s request timeout), with
/// `tweak` applied to its config last.
pub async fn cluster_proxy(
    cluster: &RedisCluster,
    tweak: impl FnOnce(&mut corral::Config),
) -> TestProxy {
    let seeds = cluster.seeds();
    TestProxy::start_with(&seeds[0], |cfg| {
        cfg.cluster.seeds = seeds.clone();
        cfg.cluster.refresh_ms = 500;
        cfg.upstream.request_timeout_ms = 2_000;
        tweak(cfg);
    })
    .await
}

/// Waits until corral knows the whole slot map (CLUSTER INFO through corral says ok).
pub async fn wait_cluster_ready(c: &mut RawClient) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !String::from_utf8_lossy(&c.cmd("CLUSTER INFO").await).contains("cluster_state:ok") {
        assert!(
            Instant::now() < deadline,
            "corral never saw the cluster as ok"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// [`cluster_proxy`] plus a client connected once the cluster is ready through it.
pub async fn ready_cluster_proxy(
    cluster: &RedisCluster,
    tweak: impl FnOnce(&mut corral::Config),
) -> (TestProxy, RawClient) {
    let proxy = cluster_proxy(cluster, tweak).await;
    let mut c = RawClient::connect(proxy.addr)
        .await
        .expect("connect to corral");
    wait_cluster_ready(&mut c).await;
    (proxy, c)
}

// ---- external programs (redis-cli, python3) ----

/// Runs `program args`, feeding `stdin`; returns stdout, panicking with stderr if it fails.
pub async fn run_tool(program: &str, args: &[&str], stdin: &[u8]) -> String {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {program} ({e}); run scripts/deps.sh"));
    let mut input = child.stdin.take().expect("stdin");
    let stdin = stdin.to_vec();
    // Written from a task so a large input cannot block against unread output.
    let writer = tokio::spawn(async move {
        let _ = input.write_all(&stdin).await;
    });
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{program} {args:?} did not finish"))
        .expect("wait");
    writer.await.expect("stdin writer");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{program} {args:?} failed: {}\nstdout: {stdout}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// A raw client of `addr`, switched to RESP3 first when asked (HELLO's reply is checked only
/// for its type: scripts compare it themselves).
pub async fn client_in(addr: SocketAddr, resp3: bool) -> RawClient {
    let mut c = RawClient::connect(addr).await.expect("connect");
    if resp3 {
        let r = c.request(&[b"HELLO", b"3"]).await;
        assert!(r.starts_with(b"%"), "HELLO 3: {}", show(&r));
    }
    c
}

// ---- a fault-injecting TCP relay (Redis cannot half-open a connection by itself) ----

/// What the relay does to one flow's bytes, in both directions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Bytes pass as they come.
    Pass,
    /// Bytes are read and dropped: both sockets stay open and nothing is delivered, as when a
    /// NAT or firewall forgets the flow or the peer is half-dead.
    Blackhole,
    /// Every chunk is delivered this long after it was read (in order).
    Delay(Duration),
}

/// One relayed connection: the port its upstream side uses (what Redis shows as the client's
/// `addr` in CLIENT LIST) and its fault, shared with the pump tasks.
struct Flow {
    upstream_port: u16,
    fault: Arc<std::sync::Mutex<Fault>>,
}

/// A loopback TCP relay in front of `upstream`: point corral at [`Relay::url`], find a flow
/// by the port Redis sees (CLIENT LIST `addr=`), and tell the relay to blackhole or delay it.
/// New flows pass. Everything stops when the relay is dropped.
pub struct Relay {
    pub addr: SocketAddr,
    flows: Arc<std::sync::Mutex<Vec<Flow>>>,
    stop: CancellationToken,
}

impl Relay {
    /// Starts relaying connections to `upstream` (on the current tokio runtime).
    pub async fn start(upstream: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
        let addr = listener.local_addr().expect("relay addr");
        let flows: Arc<std::sync::Mutex<Vec<Flow>>> = Arc::default();
        let stop = CancellationToken::new();
        let (list, token) = (flows.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    a = listener.accept() => a,
                    _ = token.cancelled() => return,
                };
                let Ok((down, _)) = accepted else { continue };
                let Ok(up) = TcpStream::connect(upstream).await else {
                    continue;
                };
                let _ = (down.set_nodelay(true), up.set_nodelay(true));
                let upstream_port = up.local_addr().map(|a| a.port()).unwrap_or(0);
                let fault = Arc::new(std::sync::Mutex::new(Fault::Pass));
                list.lock().unwrap().push(Flow {
                    upstream_port,
                    fault: fault.clone(),
                });
                let (dr, dw) = down.into_split();
                let (ur, uw) = up.into_split();
                tokio::spawn(pump(dr, uw, fault.clone(), token.clone()));
                tokio::spawn(pump(ur, dw, fault, token.clone()));
            }
        });
        Relay { addr, flows, stop }
    }

    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Sets the fault of the flow whose upstream side uses `upstream_port`; panics if the
    /// relay has no such flow.
    pub fn set_fault(&self, upstream_port: u16, fault: Fault) {
        let flows = self.flows.lock().unwrap();
        let flow = flows
            .iter()
            .find(|f| f.upstream_port == upstream_port)
            .unwrap_or_else(|| panic!("the relay has no flow from port {upstream_port}"));
        *flow.fault.lock().unwrap() = fault;
    }

    /// The upstream-side ports of the relay's flows so far.
    pub fn flow_ports(&self) -> Vec<u16> {
        self.flows
            .lock()
            .unwrap()
            .iter()
            .map(|f| f.upstream_port)
            .collect()
    }

    /// The upstream-side port of a relayed client whose `CLIENT LIST` line on `redis`
    /// satisfies `pick` (e.g. `flags=t` for corral's tracking lane), polled for up to 10 s.
    pub async fn find_client(&self, redis: SocketAddr, pick: impl Fn(&str) -> bool) -> u16 {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let ours = self.flow_ports();
            let found = client_port(redis, |l| {
                pick(l)
                    && l.split(' ')
                        .find_map(|f| f.strip_prefix("addr="))
                        .and_then(|a| a.rsplit(':').next()?.parse::<u16>().ok())
                        .is_some_and(|p| ours.contains(&p))
            })
            .await;
            if let Some(p) = found {
                return p;
            }
            assert!(
                Instant::now() < deadline,
                "no such relayed client on {redis}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Sets the fault of every flow so far.
    pub fn set_fault_all(&self, fault: Fault) {
        for f in self.flows.lock().unwrap().iter() {
            *f.fault.lock().unwrap() = fault;
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// Moves bytes from `rd` to `wr` per the flow's fault. A reader task and a writer task joined
/// by a queue of (due time, bytes), so a delay holds bytes without holding up reading.
async fn pump(
    mut rd: tokio::net::tcp::OwnedReadHalf,
    mut wr: tokio::net::tcp::OwnedWriteHalf,
    fault: Arc<std::sync::Mutex<Fault>>,
    stop: CancellationToken,
) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(tokio::time::Instant, Vec<u8>)>();
    let writer = async move {
        while let Some((due, bytes)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if wr.write_all(&bytes).await.is_err() {
                return;
            }
        }
        let _ = wr.shutdown().await;
    };
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match rd.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let f = *fault.lock().unwrap();
            let now = tokio::time::Instant::now();
            let due = match f {
                Fault::Pass => now,
                Fault::Blackhole => continue,
                Fault::Delay(d) => now + d,
            };
            if tx.send((due, buf[..n].to_vec())).is_err() {
                return;
            }
        }
    };
    tokio::select! {
        _ = async { tokio::join!(reader, writer) } => {}
        _ = stop.cancelled() => {}
    }
}

/// The `addr=` port of the first client in `CLIENT LIST` (asked on `redis`) whose line
/// satisfies `pick`, e.g. `|l| l.contains("flags=t")` for corral's tracking lane.
pub async fn client_port(redis: SocketAddr, pick: impl Fn(&str) -> bool) -> Option<u16> {
    let mut c = RawClient::connect(redis).await.ok()?;
    let list = c.try_request(&[b"CLIENT", b"LIST"]).await.ok()?;
    let text = String::from_utf8_lossy(&list).into_owned();
    text.lines().filter(|l| pick(l)).find_map(|l| {
        let addr = l.split(' ').find_map(|f| f.strip_prefix("addr="))?;
        addr.rsplit(':').next()?.parse().ok()
    })
}

/// `CORRAL CACHE STATS` (or any flat name/value reply) as a map.
pub async fn corral_stats(c: &mut RawClient) -> std::collections::HashMap<String, String> {
    let reply = c.cmd("CORRAL CACHE STATS").await;
    let frame = match redis_protocol::resp3::decode::complete::decode(&reply) {
        Ok(Some((f, _))) => f,
        other => panic!("CORRAL CACHE STATS: {other:?} from {}", show(&reply)),
    };
    use redis_protocol::resp3::types::OwnedFrame as F;
    let items = match frame {
        F::Array { data, .. } => data,
        F::Map { data, .. } => data.into_iter().flat_map(|(k, v)| [k, v]).collect(),
        other => panic!("CORRAL CACHE STATS is not an array: {other:?}"),
    };
    let text = |f: &F| match f {
        F::BlobString { data, .. } => String::from_utf8_lossy(data).into_owned(),
        other => panic!("CORRAL CACHE STATS item {other:?}"),
    };
    items
        .chunks(2)
        .map(|kv| (text(&kv[0]), text(&kv[1])))
        .collect()
}
