//! One client connection: read pipelined requests, route each, write replies in request order.
//!
//! Each round parses every complete request in the read buffer. Consecutive forwarded requests
//! become one job on the client's upstream connection; local replies are produced on the spot.
//! The round's replies are then collected in request order (see `slot.rs`) and written with
//! one write. With the cache on, GETs are looked up or coalesced and writes invalidate.

use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::slot::Slot;
use super::{Shared, corral, info};
use crate::cache::{Cache, Lookup, Value};
use crate::commands::{self, Access, Local, LocalCtx, Outcome, Route, Session};
use crate::resp::reply::{self, Encoder};
use crate::resp::request::encode_request;
use crate::resp::{Args, Limits, Parsed, RequestParser};
use crate::upstream::UpstreamConn;

/// Most requests handled in one round; bounds the replies buffered per client.
const MAX_PER_ROUND: usize = 1024;
/// Stop adding to a round once this many request bytes are queued for the upstream.
const MAX_ROUND_BYTES: usize = 1024 * 1024;
const READ_CHUNK: usize = 16 * 1024;

pub(super) struct Conn {
    pub(super) shared: Arc<Shared>,
    pub(super) session: Session,
    parser: RequestParser,
    rbuf: BytesMut,
    pub(super) wbuf: BytesMut,
    /// Scratch space for local replies, split off into `Slot::Ready`.
    local: BytesMut,
    /// Forwarded requests not yet handed to the upstream.
    batch: BytesMut,
    batch_count: u32,
    /// Writes in this round and batch, for the cache.
    writes: Writes,
    pub(super) slots: Vec<Slot>,
    pub(super) closing: bool,
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
        writes: Writes::default(),
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
    /// A cache hit or a read to wait for, queued after the batch so far.
    Slot(Slot),
    /// An MGET partly answered from the cache; `req` fetches the rest (empty if none).
    MGet {
        parts: Vec<Option<Value>>,
        req: Bytes,
    },
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
        self.writes.in_round = false;
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
                Pending::Slot(slot) => {
                    self.flush_batch().await;
                    self.slots.push(slot);
                }
                Pending::MGet { parts, req } => {
                    self.flush_batch().await;
                    let proto = self.session.proto;
                    let rx = if req.is_empty() {
                        None
                    } else {
                        let conn = self.shared.upstream.conn(proto, self.session.id);
                        Some(conn.send(req, 1).await)
                    };
                    self.slots.push(Slot::MGet { parts, rx, proto });
                }
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
            Route::Forward(access) => {
                if let Some(cache) = &self.shared.cache {
                    let conn = self
                        .shared
                        .upstream
                        .conn(self.session.proto, self.session.id);
                    if let Some(p) = cache_step(cache, conn, &mut self.writes, access, &args) {
                        return p;
                    }
                }
                if inline {
                    let argv: Vec<&[u8]> = args.iter().collect();
                    encode_request(&argv, &mut self.batch);
                } else {
                    self.batch.extend_from_slice(frame);
                }
                self.batch_count += 1;
                Pending::Batched
            }
            Route::Corral => {
                self.shared.metrics.local_commands.inc();
                Pending::Ready(corral::execute(&args, &self.shared, self.session.proto))
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
        self.slots.push(Slot::Upstream {
            rx,
            count,
            proto,
            writes: std::mem::take(&mut self.writes.keys),
            writes_all: std::mem::take(&mut self.writes.all),
        });
    }
}

/// Writes seen by a connection, as the cache needs them.
#[derive(Default)]
struct Writes {
    /// This round forwarded a write: later GETs in it must not be served from the cache or
    /// coalesced, or they could miss the write.
    in_round: bool,
    /// Keys written by the current batch, invalidated again once it is acknowledged.
    keys: Vec<Bytes>,
    /// The current batch holds a command that may change every key.
    all: bool,
}

/// The cache's part in a forwarded command: a GET is looked up (and becomes the returned
/// slot); a write invalidates its keys now, and records them to invalidate again once it is
/// acknowledged.
fn cache_step(
    cache: &Cache,
    conn: &UpstreamConn,
    writes: &mut Writes,
    access: Access,
    args: &Args<'_>,
) -> Option<Pending> {
    match access {
        Access::Get if args.len() == 2 && !writes.in_round => {
            let key = args.get(1)?;
            Some(Pending::Slot(match cache.get(key, conn) {
                Lookup::Hit(v) => Slot::Value(v),
                Lookup::Wait(rx) => Slot::Fill(rx),
            }))
        }
        Access::MGet if args.len() > 1 && !writes.in_round => {
            let parts = cache.get_many(args.iter().skip(1));
            let missing: Vec<&[u8]> = args
                .iter()
                .skip(1)
                .zip(&parts)
                .filter_map(|(k, p)| p.is_none().then_some(k))
                .collect();
            if missing.len() == parts.len() {
                // Nothing cached: forward the MGET as it is.
                return None;
            }
            let mut req = BytesMut::new();
            if !missing.is_empty() {
                let mut argv: Vec<&[u8]> = Vec::with_capacity(missing.len() + 1);
                argv.push(b"MGET");
                argv.extend(missing);
                encode_request(&argv, &mut req);
            }
            Some(Pending::MGet {
                parts,
                req: req.freeze(),
            })
        }
        Access::Get | Access::MGet | Access::Read => None,
        Access::Write => {
            writes.in_round = true;
            let mut buf = [0u8; 24];
            let name = args
                .get(0)
                .and_then(|n| commands::table::upper(n, &mut buf));
            commands::keys::write_keys(name.unwrap_or_default(), args, |k| {
                cache.invalidate_for_write(k);
                writes.keys.push(Bytes::copy_from_slice(k));
            });
            None
        }
        Access::All => {
            writes.in_round = true;
            cache.flush();
            writes.all = true;
            None
        }
    }
}
