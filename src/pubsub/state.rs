//! What the hub knows: each topic's subscribers and whether Redis confirmed it, each
//! subscriber's queue and topics, and the upstream UNSUBSCRIBEs not confirmed yet. One lock
//! guards it all; it is taken briefly, never across an `.await`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Mutex, MutexGuard};

use bytes::Bytes;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::message::{Kind, Outbox};

#[derive(Debug, Default)]
pub(super) struct Topic {
    pub(super) subscribers: HashSet<u64>,
    pub(super) confirmed: bool,
    pub(super) waiters: Vec<oneshot::Sender<()>>,
}

#[derive(Debug)]
pub(super) struct Subscriber {
    pub(super) tx: Outbox,
    pub(super) kill: CancellationToken,
    pub(super) topics: HashSet<(Kind, Bytes)>,
}

/// An upstream UNSUBSCRIBE not confirmed yet: the waiter its confirmation wakes, and the
/// client whose unsubscribe sent it.
pub(super) type Leaving = (oneshot::Sender<()>, u64);

#[derive(Debug, Default)]
pub(super) struct State {
    pub(super) topics: HashMap<(Kind, Bytes), Topic>,
    pub(super) subscribers: HashMap<u64, Subscriber>,
    /// Upstream UNSUBSCRIBEs sent and not yet confirmed, per topic, in the order sent: each
    /// confirmation wakes the client whose unsubscribe ended the topic (its id beside it).
    /// Until then Redis still counts corral as a subscriber, and that client still gets the
    /// topic's messages: Redis sent them before the confirmation, and the client writes
    /// them before its unsubscribe reply.
    pub(super) unsubscribing: HashMap<(Kind, Bytes), VecDeque<Leaving>>,
    /// Clients that left a topic others keep, each until the PING sent after its
    /// unsubscribe comes back (see `Hub::part`): until then it still gets the topic's
    /// messages, which Redis may have sent before the unsubscribe.
    pub(super) parting: HashMap<(Kind, Bytes), Vec<u64>>,
}

impl State {
    /// Whether Redis counts corral as subscribed to `key` now, as far as corral knows.
    pub(super) fn upstream_has(&self, key: &(Kind, Bytes)) -> bool {
        self.topics.contains_key(key) || self.unsubscribing.get(key).is_some_and(|q| !q.is_empty())
    }

    /// Client `id`'s PING after it left `key` came back (see `State::parting`).
    pub(super) fn parted(&mut self, key: &(Kind, Bytes), id: u64) {
        if let Some(ids) = self.parting.get_mut(key) {
            if let Some(i) = ids.iter().position(|&p| p == id) {
                ids.swap_remove(i);
            }
            if ids.is_empty() {
                self.parting.remove(key);
            }
        }
    }

    /// Releases every client waiting for an upstream unsubscribe: the connection is gone,
    /// and Redis dropped its subscriptions with it.
    pub(super) fn release_unsubscribes(&mut self) {
        for (_, q) in self.unsubscribing.drain() {
            for (w, _) in q {
                let _ = w.send(());
            }
        }
    }
}

#[derive(Debug, Default)]
pub(super) struct Inner {
    state: Mutex<State>,
}

impl Inner {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Wakes the client waiting for the oldest unconfirmed UNSUBSCRIBE of `key`; false if none.
    pub(super) fn confirm_unsubscribe(&self, key: &(Kind, Bytes)) -> bool {
        let mut state = self.lock();
        let Some(q) = state.unsubscribing.get_mut(key) else {
            return false;
        };
        let waiter = q.pop_front();
        if q.is_empty() {
            state.unsubscribing.remove(key);
        }
        match waiter {
            Some((w, _)) => {
                let _ = w.send(());
                true
            }
            None => false,
        }
    }
}
