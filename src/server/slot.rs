//! Replies waiting to be written: each request of a round leaves a slot, and slots are
//! resolved strictly in request order.

use bytes::Bytes;
use tokio::sync::oneshot;
use tokio::time::timeout;
use tracing::warn;

use super::connection::Conn;
use super::{info, mget};
use crate::cache::{FillResult, FillRx, Value};
use crate::error::UpstreamError;
use crate::resp::Proto;
use crate::upstream::JobResult;

/// A reply, or replies, still to be written, in request order.
pub(super) enum Slot {
    /// Produced locally.
    Ready(Bytes),
    /// A cache hit, encoded in the client's protocol when written.
    Value(Value),
    /// A coalesced or cache-filling read to wait for.
    Fill(FillRx),
    /// `count` replies from the upstream connection of protocol `proto`.
    Upstream {
        rx: oneshot::Receiver<JobResult>,
        count: u32,
        proto: Proto,
        /// Keys these requests write: invalidated again once acknowledged, so a read that
        /// raced the write cannot leave a stale entry behind.
        writes: Vec<Bytes>,
        writes_all: bool,
    },
    /// An MGET with some values from the cache: `rx` brings the others, as one MGET reply
    /// for the `None` parts in order.
    MGet {
        parts: Vec<Option<Value>>,
        rx: Option<oneshot::Receiver<JobResult>>,
        proto: Proto,
    },
    /// An INFO reply to extend with corral's sections.
    Info {
        rx: oneshot::Receiver<JobResult>,
        proto: Proto,
        with_proxy: bool,
    },
}

impl Conn {
    /// Waits for every slot in order and appends its bytes to the write buffer.
    pub(super) async fn collect(&mut self) {
        let mut slots = std::mem::take(&mut self.slots);
        for slot in slots.drain(..) {
            match slot {
                Slot::Ready(b) => self.wbuf.extend_from_slice(&b),
                Slot::Value(v) => v.encode(self.session.proto, &mut self.wbuf),
                Slot::Fill(rx) => match self.wait_fill(rx).await {
                    Ok(v) => v.encode(self.session.proto, &mut self.wbuf),
                    Err(e) => self.upstream_error(&e, 1),
                },
                Slot::Upstream {
                    rx,
                    count,
                    proto,
                    writes,
                    writes_all,
                } => {
                    let result = self.wait(rx, proto).await;
                    // Whatever the outcome, the write may have run.
                    if let Some(cache) = &self.shared.cache {
                        for k in &writes {
                            cache.invalidate_for_write(k);
                        }
                        if writes_all {
                            cache.flush();
                        }
                    }
                    match result {
                        Ok(b) => self.wbuf.extend_from_slice(&b),
                        Err(e) => self.upstream_error(&e, count),
                    }
                }
                Slot::MGet { parts, rx, proto } => {
                    let fetched = match rx {
                        Some(rx) => match self.wait(rx, proto).await {
                            Ok(b) => Some(b),
                            Err(e) => {
                                self.upstream_error(&e, 1);
                                continue;
                            }
                        },
                        None => None,
                    };
                    mget::merge(
                        &parts,
                        fetched.as_deref(),
                        self.session.proto,
                        &mut self.wbuf,
                    );
                }
                Slot::Info {
                    rx,
                    proto,
                    with_proxy,
                } => match self.wait(rx, proto).await {
                    Ok(b) if with_proxy => {
                        let sections = info::proxy_sections(&self.shared);
                        info::append_section(&b, &sections, &mut self.wbuf);
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

    async fn wait_fill(&self, mut rx: FillRx) -> FillResult {
        let wait = async {
            match rx.wait_for(Option::is_some).await {
                Ok(r) => r.clone().unwrap_or(Err(UpstreamError::ShuttingDown)),
                // The read was dropped unanswered: its connection is shutting down.
                Err(_) => Err(UpstreamError::ShuttingDown),
            }
        };
        match self.shared.upstream.request_timeout {
            Some(d) => timeout(d, wait).await.unwrap_or_else(|_| {
                Err(UpstreamError::Timeout {
                    addr: self
                        .shared
                        .upstream
                        .conn(self.session.proto, self.session.id)
                        .addr()
                        .to_string(),
                })
            }),
            None => wait.await,
        }
    }

    fn upstream_error(&mut self, e: &UpstreamError, count: u32) {
        self.shared.metrics.upstream_errors.inc_by(u64::from(count));
        let reply = e.to_reply();
        for _ in 0..count {
            self.wbuf.extend_from_slice(&reply);
        }
    }
}
