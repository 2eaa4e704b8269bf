//! One client connection: read pipelined requests, route each, write replies in request order.
//!
//! Each round parses every complete request in the read buffer. Consecutive forwarded requests
//! become one job on the client's upstream connection; local replies are produced on the spot.
//! The round's replies are then collected in request order and written with one write.

use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::Shared;
use super::info;
use crate::commands::{self, Local, LocalCtx, Outcome, Route, Session};
use crate::error::UpstreamError;
use crate::resp::reply::{self, Encoder};
use crate::resp::request::encode_request;
use crate::resp::{Limits, Parsed, Proto, RequestParser};
use crate::upstream::JobResult;

/// Most requests handled in one round; bounds the replies buffered per client.
const MAX_PER_ROUND: usize = 1024;
/// Stop adding to a round once this many request bytes are queued for the upstream.
const MAX_ROUND_BYTES: usize = 1024 * 1024;
const READ_CHUNK: usize = 16 * 1024;

/// A reply, or replies, still to be written, in request order.
enum Slot {
    /// Produced locally.
    Ready(Bytes),
    /// `count` replies from the upstream connection of protocol `proto`.
    Upstream {
        rx: oneshot::Receiver<JobResult>,
        count: u32,
        proto: Proto,
    },
    /// An INFO reply to extend with the proxy section.
    Info {
        rx: oneshot::Receiver<JobResult>,
        proto: Proto,
        with_proxy: bool,
    },
}

struct Conn {
    shared: Arc<Shared>,
    session: Session,
    parser: RequestParser,
    rbuf: BytesMut,
    wbuf: BytesMut,
    /// Scratch space for local replies, split off into `Slot::Ready`.
    local: BytesMut,
    /// Forwarded requests not yet handed to the upstream.
    batch: BytesMut,
    batch_count: u32,
    slots: Vec<Slot>,
    closing: bool,
}

/// Serves one client until it disconnects, sends QUIT, breaks the protocol, or shutdown.
///
/// # Errors
/// An I/O error on the client socket.
pub async fn run(
    mut stream: TcpStream,
    id: u64,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
) -> std::io::Result<()> {
    let addr = stream.peer_addr()?;
    let laddr = stream.local_addr()?;
    let l = &shared.cfg.limits;
    let limits = Limits {
        max_bulk_len: l.proto_max_bulk_len,
        max_multibulk_len: l.max_multibulk_len,
        max_inline_len: l.max_inline_len,
    };
    let authenticated = shared.cfg.requirepass.get().is_none();
    let mut c = Conn {
        session: Session::new(id, addr, laddr, authenticated),
        parser: RequestParser::new(limits),
        rbuf: BytesMut::with_capacity(READ_CHUNK),
        wbuf: BytesMut::with_capacity(READ_CHUNK),
        local: BytesMut::new(),
        batch: BytesMut::new(),
        batch_count: 0,
        slots: Vec::new(),
        closing: false,
        shared,
    };
    loop {
        let wants_input = c.dispatch().await;
        if !c.slots.is_empty() {
            c.collect().await;
            stream.write_all(&c.wbuf).await?;
            c.wbuf.clear();
        }
        if c.closing {
            return Ok(());
        }
        if !wants_input {
            continue;
        }
        if c.rbuf.len() >= c.shared.cfg.limits.client_query_buffer_limit {
            warn!(
                len = c.rbuf.len(),
                "closing client that reached max query buffer length"
            );
            c.shared.metrics.protocol_errors.inc();
            return Ok(());
        }
        let want = c
            .parser
            .needed()
            .saturating_sub(c.rbuf.len())
            .max(READ_CHUNK);
        c.rbuf.reserve(want);
        let n = tokio::select! {
            r = stream.read_buf(&mut c.rbuf) => r?,
            _ = shutdown.cancelled() => return Ok(()),
        };
        if n == 0 {
            return Ok(());
        }
    }
}

/// What a routed request still needs after the synchronous part.
enum Pending {
    /// Appended to the batch: nothing more to do.
    Batched,
    /// A reply to queue after the batch so far.
    Ready(Bytes),
    /// An INFO request to send on its own.
    Info { req: Bytes, with_proxy: bool },
}

impl Conn {
    /// Parses and routes the complete requests in the read buffer. Returns true when it
    /// stopped for lack of input, false when requests are left for another round.
    async fn dispatch(&mut self) -> bool {
        let mut off = 0;
        let mut handled = 0;
        let mut wants_input = false;
        while !self.closing {
            if handled == MAX_PER_ROUND || self.batch.len() >= MAX_ROUND_BYTES {
                break;
            }
            let parsed = match self
                .parser
                .parse(&self.rbuf[off..], self.session.authenticated)
            {
                Ok(Some(p)) => p,
                Ok(None) => {
                    wants_input = true;
                    break;
                }
                Err(e) => {
                    debug!(error = %e.0, "protocol error");
                    self.shared.metrics.protocol_errors.inc();
                    self.push_ready(Bytes::from(e.to_reply())).await;
                    self.closing = true;
                    break;
                }
            };
            let (len, inline) = match parsed {
                Parsed::Empty { len } => {
                    off += len;
                    continue;
                }
                Parsed::Multibulk { len } => (len, false),
                Parsed::Inline { len } => (len, true),
            };
            handled += 1;
            let proto_before = self.session.proto;
            match self.route(off, len, inline) {
                Pending::Batched => {}
                Pending::Ready(bytes) => self.push_ready(bytes).await,
                Pending::Info { req, with_proxy } => {
                    self.flush_batch().await;
                    let proto = self.session.proto;
                    let conn = self.shared.upstream.conn(proto, self.session.id);
                    let rx = conn.send(req, 1).await;
                    self.slots.push(Slot::Info {
                        rx,
                        proto,
                        with_proxy,
                    });
                }
            }
            off += len;
            if self.session.proto != proto_before {
                // Later requests go to another upstream connection: let everything sent so far
                // complete first, so Redis sees them in the client's order.
                break;
            }
        }
        self.rbuf.advance(off);
        self.flush_batch().await;
        self.shared.metrics.commands.inc_by(handled as u64);
        wants_input
    }

    /// Routes the request at `rbuf[off..off + len]`: forwards are appended to the batch, local
    /// commands run at once.
    fn route(&mut self, off: usize, len: usize, inline: bool) -> Pending {
        let frame = &self.rbuf[off..off + len];
        let args = self.parser.args(frame);
        let route = commands::classify(&args);
        let allowed_unauthenticated = matches!(
            route,
            Route::Local(Local::Auth | Local::Hello | Local::Quit | Local::Reset)
        );
        if !self.session.authenticated && !allowed_unauthenticated {
            return Pending::Ready(Bytes::from_static(reply::NOAUTH));
        }
        match route {
            Route::Forward => {
                if inline {
                    let argv: Vec<&[u8]> = args.iter().collect();
                    encode_request(&argv, &mut self.batch);
                } else {
                    self.batch.extend_from_slice(frame);
                }
                self.batch_count += 1;
                Pending::Batched
            }
            Route::Info => {
                let mut req = BytesMut::new();
                let argv: Vec<&[u8]> = args.iter().collect();
                encode_request(&argv, &mut req);
                Pending::Info {
                    req: req.freeze(),
                    with_proxy: info::wants_proxy_section(&args),
                }
            }
            Route::Local(cmd) => {
                let version = self.shared.upstream.status.version();
                let ctx = LocalCtx {
                    requirepass: self.shared.cfg.requirepass.get(),
                    version: version.as_deref().unwrap_or(crate::VERSION),
                };
                self.shared.metrics.local_commands.inc();
                let outcome =
                    commands::local::execute(cmd, &args, &mut self.session, &ctx, &mut self.local);
                if outcome == Outcome::Close {
                    self.closing = true;
                }
                Pending::Ready(self.local.split().freeze())
            }
            Route::Unsupported { name, why } => {
                self.shared.metrics.local_commands.inc();
                let mut e = Encoder {
                    proto: self.session.proto,
                    out: &mut self.local,
                };
                e.error(&reply::unsupported(name, why));
                Pending::Ready(self.local.split().freeze())
            }
        }
    }

    /// Queues a local reply after everything routed before it.
    async fn push_ready(&mut self, bytes: Bytes) {
        self.flush_batch().await;
        self.slots.push(Slot::Ready(bytes));
    }

    /// Hands the pending forwarded requests to the upstream as one job.
    async fn flush_batch(&mut self) {
        if self.batch_count == 0 {
            return;
        }
        let bytes = self.batch.split().freeze();
        let count = std::mem::take(&mut self.batch_count);
        let proto = self.session.proto;
        let conn = self.shared.upstream.conn(proto, self.session.id);
        let rx = conn.send(bytes, count).await;
        self.slots.push(Slot::Upstream { rx, count, proto });
    }

    /// Waits for every slot in order and appends its bytes to the write buffer.
    async fn collect(&mut self) {
        let mut slots = std::mem::take(&mut self.slots);
        for slot in slots.drain(..) {
            match slot {
                Slot::Ready(b) => self.wbuf.extend_from_slice(&b),
                Slot::Upstream { rx, count, proto } => match self.wait(rx, proto).await {
                    Ok(b) => self.wbuf.extend_from_slice(&b),
                    Err(e) => self.upstream_error(&e, count),
                },
                Slot::Info {
                    rx,
                    proto,
                    with_proxy,
                } => match self.wait(rx, proto).await {
                    Ok(b) if with_proxy => {
                        let section = info::proxy_section(&self.shared);
                        info::append_section(&b, &section, &mut self.wbuf);
                    }
                    Ok(b) => self.wbuf.extend_from_slice(&b),
                    Err(e) => self.upstream_error(&e, 1),
                },
            }
            let limit = self.shared.cfg.limits.client_output_buffer_limit;
            if limit > 0 && self.wbuf.len() > limit {
                warn!(limit, "closing client over the output buffer limit");
                self.wbuf.clear();
                self.closing = true;
                break;
            }
        }
        // Keep the allocation for the next round.
        self.slots = slots;
        self.slots.clear();
    }

    async fn wait(&self, rx: oneshot::Receiver<JobResult>, proto: Proto) -> JobResult {
        let conn = self.shared.upstream.conn(proto, self.session.id);
        let result = match self.shared.upstream.request_timeout {
            Some(d) => match timeout(d, rx).await {
                Ok(r) => r,
                Err(_) => {
                    conn.reset();
                    return Err(UpstreamError::Timeout {
                        addr: conn.addr().to_string(),
                    });
                }
            },
            None => rx.await,
        };
        result.unwrap_or(Err(UpstreamError::ShuttingDown))
    }

    fn upstream_error(&mut self, e: &UpstreamError, count: u32) {
        self.shared.metrics.upstream_errors.inc_by(u64::from(count));
        let reply = e.to_reply();
        for _ in 0..count {
            self.wbuf.extend_from_slice(&reply);
        }
    }
}
