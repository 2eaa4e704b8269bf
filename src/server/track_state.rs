//! Where invalidation pushes of client-side caching go: each client's inbox, the sinks made
//! for REDIRECT targets, and the tracking state of a pinned client. The commands that change
//! them are in `tracking.rs`.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use dashmap::DashMap;
use tokio::sync::{OnceCell, OwnedSemaphorePermit};
use tokio_util::sync::CancellationToken;

use super::attention::Attention;
use crate::error::replies;
use crate::resp::digits::parse_int;
use crate::resp::encode::encode_request;
use crate::upstream::{LinkObserver, Upstream, UpstreamConn};

/// Most bytes of pushes waiting for one client before it is disconnected (Redis's default
/// pub/sub output buffer hard limit).
const INBOX_LIMIT: usize = 32 * 1024 * 1024;

/// Frames for one client that do not answer a request, written between its requests.
#[derive(Debug)]
pub(super) struct Inbox {
    pub(super) queue: Mutex<(VecDeque<Bytes>, usize)>,
    /// Shared by a client's inboxes: its connection loop waits on it.
    pub(super) attention: Arc<Attention>,
    /// Cancelled when the client does not keep up.
    pub(super) kill: CancellationToken,
}

impl Inbox {
    pub(super) fn new(attention: Arc<Attention>, kill: CancellationToken) -> Arc<Self> {
        Arc::new(Inbox {
            queue: Mutex::new((VecDeque::new(), 0)),
            attention,
            kill,
        })
    }

    fn put(&self, frame: Bytes) {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        if q.1 + frame.len() > INBOX_LIMIT {
            drop(q);
            tracing::warn!("closing client that does not read its invalidation messages");
            self.kill.cancel();
            return;
        }
        q.1 += frame.len();
        q.0.push_back(frame);
        drop(q);
        self.attention.pushed();
    }

    /// Takes every queued frame.
    pub(super) fn take(&self) -> Vec<Bytes> {
        let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        q.1 = 0;
        q.0.drain(..).collect()
    }
}

/// The pushes of a tracking client's own connection: kept in wire order with its replies,
/// or queued for the client when no reply is due.
#[derive(Debug)]
pub(super) struct OwnPushes {
    pub(super) inbox: Arc<Inbox>,
    /// (sink's upstream id, corral id) of the redirection, to rewrite `tracking-redir-broken`.
    pub(super) redirect: Mutex<Option<(u64, u64)>>,
}

const REDIR_BROKEN: &[u8] = b">2\r\n$21\r\ntracking-redir-broken\r\n:";

impl OwnPushes {
    /// The frame as the client must see it: a broken redirection names the corral id.
    fn client_view(&self, frame: &[u8]) -> Bytes {
        if let Some(rest) = frame.strip_prefix(REDIR_BROKEN)
            && let Some(id) = rest.strip_suffix(b"\r\n").and_then(parse_int)
            && let Some((up, mine)) = *self.redirect.lock().unwrap_or_else(|e| e.into_inner())
            && u64::try_from(id).is_ok_and(|id| id == up)
        {
            return Bytes::from(format!(">2\r\n$21\r\ntracking-redir-broken\r\n:{mine}\r\n"));
        }
        Bytes::copy_from_slice(frame)
    }
}

impl LinkObserver for OwnPushes {
    fn up(&self, _tracking: bool) {}

    fn down(&self, _cause: &str) {
        // Redis forgot what this client tracks: it must not keep a cache that nothing
        // invalidates any more. Closing the client makes its library drop that cache.
        self.inbox.kill.cancel();
    }

    fn push(&self, frame: &[u8]) {
        self.inbox.put(self.client_view(frame));
    }

    fn push_inline(&self, frame: &[u8], out: &mut BytesMut) -> bool {
        out.extend_from_slice(&self.client_view(frame));
        true
    }

    fn take_pending(&self, out: &mut BytesMut) {
        for f in self.inbox.take() {
            out.extend_from_slice(&f);
        }
    }
}

/// A redirection target's connection: every push on it is an invalidation for that client.
#[derive(Debug)]
pub(super) struct SinkPushes {
    pub(super) inbox: Arc<Inbox>,
    /// The connection came up: Redis knows it as the target.
    pub(super) was_up: AtomicBool,
}

impl LinkObserver for SinkPushes {
    fn up(&self, _tracking: bool) {
        self.was_up.store(true, Ordering::Relaxed);
    }

    fn down(&self, _cause: &str) {
        // Redis forgot the target with the connection, and the clients redirecting to it are
        // cut off (their redirection is broken): the target must not keep a cache that
        // nothing invalidates any more. Closing it makes its library drop that cache, as
        // Redis closing the target's own connection would.
        if self.was_up.load(Ordering::Relaxed) {
            self.inbox.kill.cancel();
        }
    }
    fn push(&self, frame: &[u8]) {
        self.inbox.put(Bytes::copy_from_slice(frame));
    }
}

/// The connection a redirection target gets, and its id in Redis once known.
#[derive(Debug)]
pub(super) struct Sink {
    pub(super) conn: UpstreamConn,
    pub(super) id: OnceCell<u64>,
    pub(super) _permit: OwnedSemaphorePermit,
}

/// Every client's inbox for redirected invalidations, and the sinks made for them.
#[derive(Debug, Default)]
pub(super) struct Registry {
    pub(super) inboxes: DashMap<u64, Arc<Inbox>>,
    pub(super) sinks: Mutex<HashMap<u64, Arc<Sink>>>,
}

impl Registry {
    /// Registers a client's inbox for invalidations redirected to it.
    pub(super) fn register(&self, id: u64, inbox: Arc<Inbox>) {
        self.inboxes.insert(id, inbox);
    }

    /// Forgets a client that disconnected; closing its sink tells Redis that clients
    /// redirecting to it lost their target.
    pub(super) fn remove(&self, id: u64) {
        self.inboxes.remove(&id);
        self.sinks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&id);
    }

    /// The upstream id Redis knows corral client `target` by, for REDIRECT.
    pub(super) async fn sink_id(&self, target: u64, upstream: &Upstream) -> Result<u64, String> {
        let Some(inbox) = self.inboxes.get(&target).map(|i| i.clone()) else {
            return Err(replies::REDIRECT_TARGET_MISSING.text().into());
        };
        let sink = {
            let mut sinks = self.sinks.lock().unwrap_or_else(|e| e.into_inner());
            match sinks.get(&target) {
                Some(s) if !s.conn.is_dead() => s.clone(),
                _ => {
                    let permit = upstream.tracking_permit()?;
                    let conn = upstream.push_sink(Arc::new(SinkPushes {
                        inbox,
                        was_up: AtomicBool::new(false),
                    }));
                    let s = Arc::new(Sink {
                        conn,
                        id: OnceCell::new(),
                        _permit: permit,
                    });
                    sinks.insert(target, s.clone());
                    s
                }
            }
        };
        let id = sink
            .id
            .get_or_try_init(|| async {
                let mut req = BytesMut::new();
                encode_request(&[b"CLIENT", b"ID"], &mut req);
                let rx = sink.conn.send(req.freeze(), 1).await;
                let reply = match upstream.request_timeout {
                    Some(d) => tokio::time::timeout(d, rx)
                        .await
                        .map_err(|_| "upstream timed out".to_string())?,
                    None => rx.await,
                };
                match reply {
                    Ok(Ok(b)) => crate::resp::int_value(&b)
                        .and_then(|n| u64::try_from(n).ok())
                        .ok_or_else(|| "unexpected CLIENT ID reply".to_string()),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(_) => Err("connection closed".to_string()),
                }
            })
            .await
            .copied();
        id.map_err(|cause| {
            let mut sinks = self.sinks.lock().unwrap_or_else(|e| e.into_inner());
            if sinks.get(&target).is_some_and(|s| Arc::ptr_eq(s, &sink)) {
                sinks.remove(&target);
            }
            replies::upstream_unavailable_for("CLIENT TRACKING REDIRECT", &cause)
        })
    }
}

/// Tracking state of a pinned client.
#[derive(Debug)]
pub(super) struct Tracking {
    pub(super) own: Arc<OwnPushes>,
    /// Redis confirmed CLIENT TRACKING ON (false while the first ON is on its way).
    pub(super) confirmed: bool,
    /// (corral id, upstream id) of the redirection target.
    pub(super) redirect: Option<(u64, u64)>,
    /// BCAST mode, for CLIENT LIST's flags.
    pub(super) bcast: bool,
    pub(super) _permit: OwnedSemaphorePermit,
}

/// What a CLIENT TRACKING ON/OFF sent upstream will change once Redis answers `+OK`.
#[derive(Debug)]
pub(super) struct Change {
    pub(super) on: bool,
    pub(super) redirect: Option<(u64, u64)>,
    pub(super) bcast: bool,
}
