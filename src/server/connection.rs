//! One client connection's I/O: read requests, run a round over them (`round.rs`), write the
//! replies in request order; between rounds, write pub/sub messages and tracking pushes as
//! they come.

use std::future::{Future, poll_fn};
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;
use tracing::warn;

use super::attention::Signal;
use super::client::{Conn, READ_CHUNK};
use super::shared::Shared;
use super::subscriber::encode_message;
use crate::tls::Stream;

/// Serves one client until it disconnects, sends QUIT, breaks the protocol, or shutdown.
///
/// # Errors
/// An I/O error on the client socket.
pub async fn run(
    mut stream: Stream,
    id: u64,
    shared: Arc<Shared>,
    kill: CancellationToken,
) -> std::io::Result<()> {
    let addr = stream.peer_addr()?;
    let laddr = stream.local_addr()?;
    let _registered = Registered(shared.clone(), id);
    let mut c = Conn::new(id, addr, laddr, shared, kill.clone());
    c.attention.watch(kill.clone());
    // Ends the kill's watcher with the client.
    let _ended = kill.drop_guard();
    loop {
        let wants_input = c.dispatch().await;
        c.publish_session();
        if !c.replies.is_empty() {
            c.collect(&mut stream).await;
            if c.is_gone() {
                return Ok(());
            }
        }
        // Cache hits with nothing pending before them were encoded during the round. While
        // requests already read wait for the next round (this one ended before a MULTI or a
        // blocking command, say), its replies wait too, up to `HOLD_REPLIES` bytes: Redis
        // writes the replies to what it read in one write, and some clients act on where a
        // write ends (ioredis reconnects on an error before reading the rest).
        let limit = c.shared.cfg.limits.client_output_buffer_limit;
        let hold = if limit == 0 {
            HOLD_REPLIES
        } else {
            HOLD_REPLIES.min(limit / 2)
        };
        let more = !wants_input && !c.closing && !c.monitor && c.wbuf.len() < hold;
        if !c.wbuf.is_empty() && !more {
            let open = c.send_replies(&mut stream).await?;
            c.wbuf.clear();
            if !open {
                return Ok(());
            }
        }
        c.after_round();
        if c.monitor {
            // It relays until the client leaves, never waiting for input: routes kept here
            // would hold their connections as long (see `Signal::Rerouted`).
            c.routes = None;
            if c.relay_monitor(&mut stream).await? {
                return Ok(());
            }
            // Redis refused it: the client goes on.
            c.monitor = false;
        }
        if c.closing {
            return Ok(());
        }
        if !wants_input || std::mem::take(&mut c.read_ahead) {
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
        if !c.wait_input(&mut stream).await? {
            return Ok(());
        }
    }
}

/// Most reply bytes held for the next round's (see `run`); half the client output buffer
/// limit if that is less, so held replies never count a client over it.
const HOLD_REPLIES: usize = 64 * 1024;

/// Writes `buf` whole and flushes it: TLS may otherwise keep encrypted bytes it could not
/// write yet until the next write, which may never come (plain TCP has nothing to flush).
pub(super) async fn send(stream: &mut Stream, buf: &[u8]) -> std::io::Result<()> {
    stream.write_all(buf).await?;
    stream.flush().await
}

/// Removes the client from the registry when its task ends, however it ends.
struct Registered(Arc<Shared>, u64);

impl Drop for Registered {
    fn drop(&mut self) {
        self.0.clients.remove(self.1);
        // Nobody waits for the upstream unsubscribes: the client is gone.
        drop(self.0.pubsub.remove(self.1));
        self.0.tracking.remove(self.1);
    }
}

impl Conn {
    /// Writes the round's replies (`wbuf`). A client that sends a long pipeline in one go and
    /// reads only once it is all sent (redis-py's `execute`, a blocking `sendall`) does not
    /// read them yet: while the socket takes no more, its next requests are read meanwhile
    /// (up to `client_query_buffer_limit`, for the next rounds), as Redis goes on reading a
    /// client whose replies wait. Else each would wait for the other for ever. False when
    /// the client closed its side meanwhile: like Redis, corral then drops it.
    pub(super) async fn send_replies(&mut self, stream: &mut Stream) -> std::io::Result<bool> {
        // Nearly always the socket takes it all at once.
        let written = {
            let mut write = pin!(stream.write(&self.wbuf));
            poll_fn(|cx| Poll::Ready(write.as_mut().poll(cx))).await
        };
        let rest = match written {
            Poll::Ready(n) => &self.wbuf[n?..],
            Poll::Pending => &self.wbuf[..],
        };
        if rest.is_empty() {
            stream.flush().await?;
            return Ok(true);
        }
        let limit = self.shared.cfg.limits.client_query_buffer_limit;
        let (mut rd, mut wr) = tokio::io::split(&mut *stream);
        let mut write = pin!(async {
            wr.write_all(rest).await?;
            wr.flush().await
        });
        let rbuf = &mut self.rbuf;
        let mut open = true;
        loop {
            let room = open && rbuf.len() < limit;
            if room && rbuf.capacity() - rbuf.len() < READ_CHUNK / 4 {
                rbuf.reserve(READ_CHUNK);
            }
            tokio::select! {
                biased;
                r = &mut write => {
                    r?;
                    break;
                }
                n = rd.read_buf(rbuf), if room => match n {
                    Ok(0) | Err(_) => open = false,
                    Ok(_) => self.read_ahead = true,
                },
            }
        }
        Ok(open)
    }

    /// Waits until requests arrive, or pushes or pub/sub messages were written meanwhile.
    /// False when the client is gone (closed its side, or `kill` was cancelled).
    async fn wait_input(&mut self, stream: &mut Stream) -> std::io::Result<bool> {
        let want = self
            .parser
            .needed()
            .saturating_sub(self.rbuf.len())
            .max(READ_CHUNK);
        self.rbuf.reserve(want);
        let attention = &*self.attention;
        let signal = match &mut self.subs {
            None => tokio::select! {
                biased;
                s = attention.wait() => s,
                r = stream.read_buf(&mut self.rbuf) => return Ok(r? != 0),
            },
            // Subscribed: messages are written as they come, between requests.
            Some(subs) => tokio::select! {
                r = stream.read_buf(&mut self.rbuf) => return Ok(r? != 0),
                msg = subs.rx.recv() => {
                    let Some(msg) = msg else { return Ok(false) };
                    // A message of a subscription the client has since left is not written:
                    // after its unsubscribe reply it would read as the reply to its next
                    // request (RESP2). One the hub delivered before that reply was written
                    // before it (see `collect`).
                    if subs.wants(&msg) {
                        encode_message(&msg, self.session.proto, &mut self.wbuf);
                    }
                    while self.wbuf.len() < 64 * 1024 {
                        match subs.rx.try_recv() {
                            Some(m) if subs.wants(&m) => {
                                encode_message(&m, self.session.proto, &mut self.wbuf);
                            }
                            Some(_) => {}
                            None => break,
                        }
                    }
                    if self.wbuf.is_empty() {
                        return Ok(true);
                    }
                    // A subscriber that stops reading must not pin this task: the hub
                    // cancels `kill` once its queue is full.
                    tokio::select! {
                        r = send(stream, &self.wbuf) => r?,
                        _ = self.kill.cancelled() => return Ok(false),
                    }
                    self.wbuf.clear();
                    return Ok(true);
                }
                s = attention.wait() => s,
            },
        };
        match signal {
            Signal::Killed => Ok(false),
            Signal::Rerouted => {
                self.routes = None;
                Ok(true)
            }
            Signal::Pushed => {
                self.write_inbox(stream).await?;
                Ok(true)
            }
        }
    }

    /// Writes the pushes waiting in this client's inboxes (CLIENT TRACKING), between
    /// requests.
    async fn write_inbox(&mut self, stream: &mut Stream) -> std::io::Result<()> {
        self.take_inbox();
        if self.wbuf.is_empty() {
            return Ok(());
        }
        // A client that stops reading must not pin this task: its inbox is bounded and
        // cancels `kill` when full.
        tokio::select! {
            r = send(stream, &self.wbuf) => r?,
            _ = self.kill.cancelled() => {}
        }
        self.wbuf.clear();
        Ok(())
    }
}
