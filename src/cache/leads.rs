//! Bare reads: the plain GETs of keys that are not cached, sent in the client's own batch
//! ([`Lead`]), which concurrent GETs of the same key join.
//!
//! Nearly every miss is one, and most are never joined (a key read once), so registering one
//! must cost little: the map is keyed by the key's hash, already computed for the sketch, and
//! a key of up to 30 bytes is kept inline ([`ShortKey`]), so a bare read allocates nothing. The key
//! is still compared in full: a GET joins only a read of its own key. A GET whose hash is
//! taken by a read of another key in flight (64-bit hashes: practically never) is sent
//! without being joinable.
//!
//! When a second GET arrives, it creates the [`Fill`] the others wait on and puts it in the
//! `joined` map by the read's id as well, where the read finds it even after an invalidation
//! unlinked the read from this map (its waiters are still owed the result).

use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::DashMap;

use super::coherence::Core;
use super::flight::Fill;
use super::short_key::ShortKey;
use crate::error::UpstreamError;
use crate::upstream::JobResult;

/// The bare reads in flight, by the hash of their key.
pub(super) type Leads = DashMap<u64, Slot, BuildHasherDefault<PassThrough>>;

/// Hashes a `u64` key to itself: the map's keys are hashes already.
#[derive(Debug, Default)]
pub(super) struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is used for the map's keys; fold anything else anyway.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// One bare read in flight.
#[derive(Debug)]
pub(super) struct Slot {
    /// The read's id, unique in the process: it completes only its own slot.
    pub(super) id: u64,
    pub(super) started: Instant,
    key: ShortKey,
    /// The waiters' fill, once a second GET joined (also in `Core::joined`).
    pub(super) joined: Option<Arc<Fill>>,
}

impl Slot {
    pub(super) fn new(id: u64, started: Instant, key: &[u8]) -> Slot {
        Slot {
            id,
            started,
            key: ShortKey::new(key),
            joined: None,
        }
    }

    /// The key read.
    pub(super) fn key(&self) -> &[u8] {
        self.key.bytes()
    }

    /// Whether this is a read of `key`.
    pub(super) fn is_for(&self, key: &[u8]) -> bool {
        self.key.bytes() == key
    }

    /// Whether a GET arriving `now` may wait for this read (see `Fill::joinable`).
    pub(super) fn joinable(&self, now: Instant, bound: Duration) -> bool {
        now.saturating_duration_since(self.started) < bound
    }
}

/// A plain GET that concurrent GETs of the same key wait for.
#[derive(Debug)]
pub struct Lead {
    core: Arc<Core>,
    /// The key's hash, which names its slot in `leads`.
    hash: u64,
    id: u64,
    done: bool,
}

impl Lead {
    /// The read `id` of the key with this hash, registered in `core`'s `leads`.
    pub(super) fn new(core: Arc<Core>, hash: u64, id: u64) -> Lead {
        Lead {
            core,
            hash,
            id,
            done: false,
        }
    }

    /// The read's id, for [`crate::cache::Cache::rejoin`].
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Shares the GET's reply (one RESP frame), or its failure, with the waiters.
    pub fn complete(mut self, reply: JobResult) {
        self.done = true;
        self.core.complete_lead(self.hash, self.id, reply);
    }

    /// Ends a lead nobody joined (the common case), whose reply is then not needed: `None`.
    /// A joined lead is returned, to be [`Lead::complete`]d with its reply.
    pub fn finish_unjoined(mut self) -> Option<Lead> {
        if self.core.unlink_lead(self.hash, self.id) {
            self.done = true;
            return None;
        }
        Some(self)
    }
}

impl Drop for Lead {
    /// A read dropped unsent (shutdown) must not leave waiters hanging.
    fn drop(&mut self) {
        if !self.done {
            let r = Err(UpstreamError::ShuttingDown);
            self.core.complete_lead(self.hash, self.id, r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::short_key::INLINE;
    use super::*;

    #[test]
    fn keys_compare_in_full_inline_or_not() {
        let now = Instant::now();
        let long = vec![b'k'; 100];
        for key in [&b""[..], b"k", &[b'x'; INLINE], &long] {
            let slot = Slot::new(1, now, key);
            assert!(slot.is_for(key));
            let mut other = key.to_vec();
            other.push(b'!');
            assert!(!slot.is_for(&other));
        }
        assert!(!Slot::new(1, now, b"ab").is_for(b"ac"));
    }
}
