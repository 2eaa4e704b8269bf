//! One in-flight upstream read that concurrent GETs of a key share (singleflight), and the
//! waiter's side of it. A plain read starts bare (`leads.rs`): a [`Fill`] exists only once a
//! second GET joins it, or for a tracked fill.

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use super::tracking::LaneState;
use super::value::Value;
use crate::error::UpstreamError;
use crate::upstream::UpstreamConn;

/// What a waiter eventually receives: the GET result or why there is none.
pub type FillResult = Result<Value, UpstreamError>;

// From 1: no lead has id 0.
static THREADS: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's next lead id: the thread's number in the high bits, a count below, so
    /// ids are unique without a shared counter touched by every miss.
    static NEXT_LEAD: Cell<u64> = Cell::new(THREADS.fetch_add(1, Ordering::Relaxed) << 40);
}

/// A lead id no other read in this process has.
pub(super) fn lead_id() -> u64 {
    NEXT_LEAD.with(|n| {
        let id = n.get();
        n.set(id + 1);
        id
    })
}

/// One in-flight upstream read that waiters share.
#[derive(Debug)]
pub(super) struct Fill {
    /// Set once; waiters are woken through `notify`. (A `watch` channel allocates far more
    /// per read, and there is one read per miss.)
    result: OnceLock<FillResult>,
    notify: Notify,
    /// The key read: for a waiter that has to read it again itself (a redirection, a lost
    /// lane), so that waiters need no copy of their own.
    key: Arc<[u8]>,
    pub(super) started: Instant,
    /// The tracking lane the read went over (`None` for plain coalesced reads).
    pub(super) lane: Option<Arc<LaneState>>,
    /// The connection the read was sent on (`None` only in unit tests).
    via: Option<UpstreamConn>,
}

impl Fill {
    pub(super) fn new(
        key: Arc<[u8]>,
        started: Instant,
        lane: Option<Arc<LaneState>>,
        via: Option<UpstreamConn>,
    ) -> Arc<Fill> {
        Arc::new(Fill {
            result: OnceLock::new(),
            notify: Notify::new(),
            key,
            started,
            lane,
            via,
        })
    }

    /// Publishes the result once (later calls are ignored) and wakes the waiters.
    pub(super) fn publish(&self, r: FillResult) {
        if self.result.set(r).is_ok() {
            self.notify.notify_waiters();
        }
    }

    /// Whether a GET arriving `now` may wait for this read rather than start its own: not
    /// if it was sent `bound` or longer ago (stuck behind a dead connection, say).
    pub(super) fn joinable(&self, now: Instant, bound: Duration) -> bool {
        now.saturating_duration_since(self.started) < bound
    }

    pub(super) fn waiter(self: &Arc<Self>) -> FillRx {
        FillRx(self.clone())
    }
}

/// Where a waiter gets the result of a shared read. A clone waits for the same read.
#[derive(Debug, Clone)]
pub struct FillRx(Arc<Fill>);

impl FillRx {
    /// Waits for the result, and lends it: every waiter reads the one result, where a copy
    /// each cost two locked updates of its value's reference count.
    pub async fn wait(&self) -> &FillResult {
        loop {
            let notified = self.0.notify.notified();
            if let Some(r) = self.0.result.get() {
                return r;
            }
            notified.await;
        }
    }

    /// The result, if it arrived.
    pub fn peek(&self) -> Option<&FillResult> {
        self.0.result.get()
    }

    /// The key read.
    pub fn key(&self) -> &[u8] {
        &self.0.key
    }

    /// Whether the read is a tracked fill over a tracking lane (not the client's own GET).
    pub fn tracked(&self) -> bool {
        self.0.lane.is_some()
    }

    /// The waiter gave up after the request timeout: a lane fill that late means the lane is
    /// not answering, so it is reset (its entries dropped). The error names the node the read
    /// was sent to.
    pub fn timed_out(&self) -> UpstreamError {
        let Some(via) = &self.0.via else {
            return UpstreamError::Timeout {
                addr: "(unknown)".into(),
            };
        };
        if self.tracked() {
            via.reset();
        }
        UpstreamError::Timeout {
            addr: via.addr().to_string(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_older_than_the_bound_are_not_joined() {
        let bound = Duration::from_secs(5);
        let fresh = Fill::new(Arc::from(&b"k"[..]), Instant::now(), None, None);
        assert!(fresh.joinable(Instant::now(), bound));
        let later = Instant::now() + Duration::from_secs(6);
        assert!(!fresh.joinable(later, bound));
    }

    #[test]
    fn lead_ids_are_unique_across_threads() {
        let mine: Vec<u64> = (0..100).map(|_| lead_id()).collect();
        let theirs = std::thread::spawn(|| (0..100).map(|_| lead_id()).collect::<Vec<u64>>())
            .join()
            .unwrap();
        let all: std::collections::HashSet<u64> = mine.iter().chain(&theirs).copied().collect();
        assert_eq!(all.len(), 200);
    }
}
