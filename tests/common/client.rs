//! Raw clients: bytes in, reply bytes out exactly as received, split by [`resp_len`].

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream as StdStream};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::resp::{encode, encode_line, resp_len, show, words};

/// Connects a raw client, failing the test if it cannot.
pub async fn connect(addr: SocketAddr) -> RawClient {
    RawClient::connect(addr).await.expect("connect")
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

    /// Reads exactly one reply (10 s deadline per read) and returns its bytes.
    pub async fn read_reply(&mut self) -> Vec<u8> {
        self.try_read_reply().await.expect("read reply")
    }

    /// [`RawClient::read_reply`], returning what went wrong instead of panicking.
    pub async fn try_read_reply(&mut self) -> std::io::Result<Vec<u8>> {
        read_frame(&mut self.stream, &mut self.buf).await
    }

    /// Sends one request and returns its reply bytes.
    pub async fn request(&mut self, args: &[&[u8]]) -> Vec<u8> {
        self.try_request(args).await.expect("request")
    }

    /// [`RawClient::request`], returning what went wrong instead of panicking.
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

    /// Sends the first command of a redis-cli-like line (quotes and escapes understood, see
    /// `parse_commands`); returns the reply bytes.
    pub async fn call(&mut self, line: &str) -> Vec<u8> {
        self.send(&encode_line(line)).await;
        self.read_reply().await
    }

    /// True when the server closed the connection (reads EOF within 5 s).
    pub async fn is_closed(&mut self) -> bool {
        self.rest_until_closed().await.1
    }

    /// Everything still to be read (buffered or arriving) until the server closes the
    /// connection, and whether it did close within 5 s of the last byte.
    pub async fn rest_until_closed(&mut self) -> (Vec<u8>, bool) {
        let mut rest = std::mem::take(&mut self.buf);
        loop {
            rest.reserve(64 * 1024);
            let read = self.stream.read_buf(&mut rest);
            match tokio::time::timeout(Duration::from_secs(5), read).await {
                Ok(Ok(0)) | Ok(Err(_)) => return (rest, true),
                Ok(Ok(_)) => continue,
                Err(_) => return (rest, false),
            }
        }
    }

    /// Writes `bytes` in pieces of `chunk` bytes while reading `n` replies concurrently, so
    /// neither side waits for the other: a pipeline whose replies outgrow the socket buffers
    /// cannot deadlock on the client's side.
    pub async fn pipeline(&mut self, bytes: &[u8], chunk: usize, n: usize) -> Vec<Vec<u8>> {
        let replies = self.try_pipeline(bytes, chunk, n).await;
        replies.unwrap_or_else(|(i, e)| panic!("reply {i} of {n}: {e}"))
    }

    /// [`RawClient::pipeline`], returning which reply failed and why instead of panicking.
    pub async fn try_pipeline(
        &mut self,
        bytes: &[u8],
        chunk: usize,
        n: usize,
    ) -> Result<Vec<Vec<u8>>, (usize, std::io::Error)> {
        let (mut rd, mut wr) = self.stream.split();
        let buf = &mut self.buf;
        let write = async {
            for piece in bytes.chunks(chunk.max(1)) {
                wr.write_all(piece).await?;
            }
            Ok::<(), std::io::Error>(())
        };
        let read = async {
            let mut out = Vec::with_capacity(n);
            for i in 0..n {
                out.push(read_frame(&mut rd, buf).await.map_err(|e| (i, e))?);
            }
            Ok(out)
        };
        let (written, read) = tokio::join!(write, read);
        let out = read?;
        written.map_err(|e| (n, e))?;
        Ok(out)
    }

    /// Reads `n` replies.
    pub async fn read_replies(&mut self, n: usize) -> Vec<Vec<u8>> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(self.read_reply().await);
        }
        out
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

/// Reads one reply from `rd`, buffering in `buf` (10 s deadline per read).
async fn read_frame(
    rd: &mut (impl AsyncRead + Unpin),
    buf: &mut Vec<u8>,
) -> std::io::Result<Vec<u8>> {
    loop {
        if let Some(n) = resp_len(buf) {
            return Ok(buf.drain(..n).collect());
        }
        // Straight into the heap buffer: a stack chunk held across the await would make every
        // request future 64 KB, and a test's future lives on the 2 MB test-thread stack.
        buf.reserve(64 * 1024);
        let n = match tokio::time::timeout(Duration::from_secs(10), rd.read_buf(buf)).await {
            Ok(r) => r?,
            Err(_) => {
                let msg = format!("no reply within 10 s; partial {}", show(buf));
                return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, msg));
            }
        };
        if n == 0 {
            let msg = format!("connection closed; partial {}", show(buf));
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, msg));
        }
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
        if let Some(n) = resp_len(&buf) {
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

/// The lines of `CLIENT LIST` from the server at `addr`, asked on a new connection (listed
/// too); `None` if the server cannot be asked.
pub async fn try_client_list(addr: SocketAddr) -> Option<Vec<String>> {
    let mut c = RawClient::connect(addr).await.ok()?;
    let list = c.try_request(&[b"CLIENT", b"LIST"]).await.ok()?;
    let text = String::from_utf8_lossy(&list).into_owned();
    Some(text.lines().map(str::to_string).collect())
}

/// [`try_client_list`], failing the test if the server cannot be asked.
pub async fn client_list(addr: SocketAddr) -> Vec<String> {
    let list = try_client_list(addr).await;
    list.unwrap_or_else(|| panic!("CLIENT LIST on {addr} failed"))
}

/// corral's `# Proxy` INFO field `name`.
pub async fn info_field(c: &mut RawClient, name: &str) -> String {
    let info = super::resp::reply_text(&c.cmd("INFO proxy").await);
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .unwrap_or_else(|| panic!("no {name} in {info}"))
        .trim()
        .to_string()
}

/// The `name=value` field of a CLIENT LIST line.
pub fn field<'a>(line: &'a str, name: &str) -> Option<&'a str> {
    line.split(' ')
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
}

/// The port of a CLIENT LIST line's `addr=` field: the client's side of its connection.
pub fn addr_port(line: &str) -> Option<u16> {
    field(line, "addr")?.rsplit(':').next()?.parse().ok()
}
