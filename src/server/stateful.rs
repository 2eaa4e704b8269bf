//! Commands whose state a shared upstream connection cannot carry: transactions (the client is
//! pinned to a dedicated connection from MULTI or WATCH until EXEC, DISCARD or UNWATCH),
//! blocking commands (sent alone on a dedicated connection), SELECT (validated by the
//! upstream, then served by that database's shared connections) and MONITOR (a relay).

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::connection::Conn;
use super::slot::{AfterAck, Blocking, Slot};
use crate::commands::Tx;
use crate::resp::request::encode_request;
use crate::upstream::Dedicated;

/// A client pinned to a dedicated connection.
#[derive(Debug)]
pub(super) struct Pin {
    pub(super) ded: Dedicated,
    /// Between MULTI and EXEC/DISCARD (as far as corral can tell from the requests).
    pub(super) in_multi: bool,
    /// WATCH was sent outside MULTI and not yet cleared.
    pub(super) watching: bool,
    /// Something changed the connection's state beyond a transaction: do not reuse it.
    pub(super) dirty: bool,
    /// Keys written by commands queued in MULTI, invalidated again after EXEC.
    pub(super) tx_writes: Vec<Bytes>,
    /// Commands queued since MULTI.
    pub(super) queued: usize,
    /// SELECTs queued in MULTI: (database, position in the transaction). At EXEC the client
    /// moves to the last one that succeeded.
    pub(super) queued_selects: Vec<(u32, usize)>,
    /// CLIENT TRACKING is on (or on its way): the pin stays until it is turned off.
    pub(super) tracking: Option<super::tracking::Tracking>,
}

impl Pin {
    /// A pin to `ded` with no transaction state.
    pub(super) fn new(ded: Dedicated) -> Pin {
        Pin {
            ded,
            in_multi: false,
            watching: false,
            dirty: false,
            tx_writes: Vec::new(),
            queued: 0,
            queued_selects: Vec::new(),
            tracking: None,
        }
    }
}

impl Conn {
    /// MULTI/EXEC/DISCARD/WATCH/UNWATCH. MULTI and WATCH pin the client first; the others
    /// update the pin's state, and the pin is released after the round once nothing is left.
    pub(super) async fn transaction(&mut self, tx: Tx, req: Bytes, node: Option<String>) -> bool {
        if matches!(tx, Tx::Multi | Tx::Watch) && self.pin.is_none() {
            self.flush_batch().await;
            match self.shared.upstream.dedicated_to(
                node.as_deref(),
                self.session.proto,
                self.session.db,
            ) {
                Ok(ded) => self.pin = Some(Pin::new(ded)),
                Err(msg) => {
                    let mut out = BytesMut::from(&b"-"[..]);
                    out.extend_from_slice(msg.as_bytes());
                    out.extend_from_slice(b"\r\n");
                    self.push_ready(out.freeze()).await;
                    return false;
                }
            }
        }
        let mut ends = false;
        let mut exec_select = None;
        if let Some(pin) = &mut self.pin {
            match tx {
                Tx::Multi => {
                    if !pin.in_multi {
                        pin.queued = 0;
                        pin.queued_selects.clear();
                    }
                    pin.in_multi = true;
                }
                // WATCH inside MULTI is an error that changes nothing.
                Tx::Watch if !pin.in_multi => pin.watching = true,
                // EXEC and DISCARD end a transaction and forget watched keys; without MULTI
                // they are errors that change nothing.
                Tx::Exec | Tx::Discard if pin.in_multi => {
                    pin.in_multi = false;
                    pin.watching = false;
                    let selects = std::mem::take(&mut pin.queued_selects);
                    if tx == Tx::Exec && !selects.is_empty() {
                        exec_select = Some(selects);
                    }
                    ends = true;
                }
                Tx::Unwatch if !pin.in_multi => {
                    pin.watching = false;
                    ends = true;
                }
                _ => {}
            }
        }
        self.append(&req);
        if ends {
            // The connection is released after this round: what follows goes elsewhere and
            // must not overtake what was sent on it.
            self.exec_select = exec_select;
            self.flush_batch().await;
        }
        ends
    }

    /// A blocking command: alone on the pinned connection, or on a dedicated one of its own,
    /// so that it never holds up other clients. Ends the round: nothing after it may run
    /// before it returns.
    pub(super) async fn blocking(
        &mut self,
        req: Bytes,
        writes: Vec<Bytes>,
        node: Option<String>,
    ) -> bool {
        self.flush_batch().await;
        let dedicated = match &self.pin {
            Some(_) => None,
            None => match self.shared.upstream.dedicated_to(
                node.as_deref(),
                self.session.proto,
                self.session.db,
            ) {
                Ok(d) => Some(d),
                Err(msg) => {
                    let mut out = BytesMut::from(&b"-"[..]);
                    out.extend_from_slice(msg.as_bytes());
                    out.extend_from_slice(b"\r\n");
                    self.push_ready(out.freeze()).await;
                    return true;
                }
            },
        };
        let conn = match &dedicated {
            Some(d) => d.conn.clone(),
            None => self.target(),
        };
        let rx = conn.send(req, 1).await;
        self.push_slot(Slot::Upstream {
            rx,
            count: 1,
            conn,
            after: AfterAck {
                writes,
                ..AfterAck::default()
            },
            blocking: Some(Blocking { dedicated }),
        });
        true
    }

    /// SELECT: checked by the upstream on a database-0 connection as `SELECT n` followed by
    /// `SELECT 0` (sent together, so nothing else runs on that connection in between); on
    /// success the client's later requests use database `n`'s connections. When pinned, it
    /// goes to the pinned connection, which is then not reused.
    pub(super) async fn select(&mut self, db: Option<u32>, req: Bytes) -> bool {
        self.flush_batch().await;
        let (conn, bytes, count) = match &mut self.pin {
            Some(pin) => {
                pin.dirty = true;
                (pin.ded.conn.clone(), req, 1)
            }
            None => {
                let mut both = BytesMut::from(&req[..]);
                encode_request(&[b"SELECT", b"0"], &mut both);
                let conn = self
                    .shared
                    .upstream
                    .conn(self.session.proto, self.session.id);
                (conn.clone(), both.freeze(), 2)
            }
        };
        let rx = conn.send(bytes, count).await;
        self.push_slot(Slot::Select { rx, conn, db });
        true
    }

    /// Cluster mode: the first command after a deferred MULTI. Pins the client to `node`,
    /// sends the MULTI there followed by the command; the MULTI's `+OK` was already given.
    pub(super) async fn start_multi(&mut self, node: String, req: Bytes) -> bool {
        self.deferred_multi = false;
        self.flush_batch().await;
        match self
            .shared
            .upstream
            .dedicated_to(Some(&node), self.session.proto, self.session.db)
        {
            Ok(ded) => {
                self.pin = Some(Pin {
                    in_multi: true,
                    queued: 1,
                    ..Pin::new(ded)
                });
                let mut multi = BytesMut::new();
                encode_request(&[b"MULTI"], &mut multi);
                self.append(&multi);
                self.skip_first = true;
                self.append(&req);
                false
            }
            Err(msg) => {
                let mut out = BytesMut::from(&b"-"[..]);
                out.extend_from_slice(msg.as_bytes());
                out.extend_from_slice(b"\r\n");
                self.push_ready(out.freeze()).await;
                false
            }
        }
    }

    /// Releases (or drops) a dedicated connection once no transaction or tracking state is
    /// left on it.
    pub(super) fn release_pin_if_done(&mut self) {
        let done = self.pin_reset
            || self
                .pin
                .as_ref()
                .is_some_and(|p| !p.in_multi && !p.watching && p.tracking.is_none());
        if !done {
            return;
        }
        let reset = std::mem::take(&mut self.pin_reset);
        if let Some(mut pin) = self.pin.take() {
            // RESET turns tracking off: Redis forgets it when the connection closes.
            pin.stop_tracking();
            self.info_changed = true;
            // After RESET the connection may still be in MULTI or watching: close it.
            if !pin.dirty && !reset {
                self.shared.upstream.release(pin.ded);
            }
        }
    }

    /// MONITOR: the client's connection becomes a byte relay to a dedicated upstream
    /// connection that ran MONITOR, until either side closes.
    pub(super) async fn relay_monitor(&mut self, mut client: TcpStream) -> std::io::Result<()> {
        let mut upstream = match self
            .shared
            .upstream
            .raw(self.session.proto, self.session.db)
            .await
        {
            Ok(s) => s,
            Err(e) => {
                let msg = format!("-ERR upstream unavailable for MONITOR: {e}\r\n");
                client.write_all(msg.as_bytes()).await?;
                return Ok(());
            }
        };
        let mut first = BytesMut::new();
        encode_request(&[b"MONITOR"], &mut first);
        // Requests the client sent after MONITOR go to Redis in order.
        first.extend_from_slice(&self.rbuf);
        self.rbuf.clear();
        upstream.write_all(&first).await?;
        tokio::select! {
            r = tokio::io::copy_bidirectional(&mut client, &mut upstream) => r.map(|_| ()),
            _ = self.kill.cancelled() => Ok(()),
        }
    }
}
