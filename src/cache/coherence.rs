//! The store and the reads in flight, kept coherent with Redis. Coherence rests on three
//! rules; this file keeps the second, [`super::lane`] the first and the third:
//!
//! 1. The lane's replies and Redis's invalidation pushes share one FIFO and are applied by the
//!    lane's own task, in wire order: a fill inserts before the push that invalidates it is
//!    applied, never after.
//! 2. An invalidation (a push, or a write through corral before it is forwarded and again when
//!    it is acknowledged) removes the key's in-flight reads (`fills`, `leads`): a fill can no
//!    longer insert, and later GETs cannot join either ([`Core::invalidate`],
//!    [`Core::insert_if_current`]).
//! 3. Losing the lane, or (re)connecting it, flushes everything: invalidations may have been
//!    missed. A lane that goes silent counts as lost within `lane_check_ms + lane_deadline_ms`.

use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use dashmap::mapref::entry::Entry as MapEntry;

use super::admission::Admission;
use super::entry::{self, Entry};
use super::epochs::ReadEpochs;
use super::flight::Fill;
use super::leads::{Leads, Slot};
use super::lone::Lone;
use super::lost::LostFills;
use super::presence::{Counts, Held, Presence};
use super::recent::RecentReads;
use super::renew::Renewal;
use super::stats::Stats;
use super::store::Store;
use super::tracking::Tracking;
use super::unacked::UnackedTable;
use super::value::{self, GetReply, Value};
use crate::error::UpstreamError;
use crate::upstream::JobResult;

/// A key of `fills`: one allocation, and clones only count references (a fresh `Bytes` copy
/// allocates again on its first clone).
pub(super) type Key = Arc<[u8]>;

/// Everything the cache's connections and lanes share.
#[derive(Debug)]
pub(super) struct Core {
    pub(super) store: Store,
    /// What of each key the store and the maps of reads in flight (`fills`, `leads`) hold,
    /// counted by hash: a key at zero has nothing in any of them.
    pub(super) presence: Arc<Presence>,
    /// Tracked fills, and plain reads sent from here, in flight: the read each key's GETs
    /// join.
    pub(super) fills: DashMap<Key, Arc<Fill>, foldhash::fast::RandomState>,
    /// Bare plain reads in flight (`leads.rs`), by the key's hash.
    pub(super) leads: Leads,
    /// Cold GETs forwarded lately, so a second one soon after is joinable.
    pub(super) recent: RecentReads,
    /// Whether the reads GETs lead are left alone lately (`lone.rs`).
    pub(super) lone: Lone,
    /// When the lanes are due for a renewal (`renew.rs`).
    pub(super) renewal: Renewal,
    /// Keys whose fills were lost with their lane lately.
    pub(super) lost: LostFills,
    /// When reads were last registered, by key hash (a write's second invalidation).
    pub(super) epochs: ReadEpochs,
    /// Writes through corral not yet acknowledged, by key hash: their keys are neither
    /// filled nor joined.
    pub(super) unacked: Arc<UnackedTable>,
    /// Joined bare reads by lead id: where a lead finds its waiters even after an
    /// invalidation unlinked it from `leads` (they are still owed the result).
    pub(super) joined: DashMap<u64, Arc<Fill>, foldhash::fast::RandomState>,
    pub(super) admission: Arc<Admission>,
    pub(super) stats: Stats,
    pub(super) max_value: usize,
    pub(super) max_age: Duration,
    pub(super) fallback_ttl: Duration,
    /// A GET joins an in-flight read only if it was sent less than this long ago.
    pub(super) join_bound: Duration,
}

impl Core {
    /// Removes `key` and its in-flight reads. Order matters: the reads are unlinked first, so
    /// they cannot insert after the store removal. `unseen` is true for an invalidation
    /// corral did not cause (a push from Redis): only then does an entry removed before its
    /// first hit count as a wasted fill; a write through corral has already counted itself.
    pub(super) fn invalidate(&self, key: &[u8], unseen: bool) -> bool {
        self.invalidate_hashed(key, self.admission.hash(key), unseen)
    }

    /// [`Core::invalidate`] with the key's hash already computed.
    #[inline]
    pub(super) fn invalidate_hashed(&self, key: &[u8], hash: u64, unseen: bool) -> bool {
        // Nearly every write is of a key with nothing here, and most of the rest of a key
        // with an entry but no read in flight.
        let counts = self.presence.counts(hash);
        counts.any() && self.invalidate_held(key, hash, counts, unseen)
    }

    /// [`Core::invalidate_hashed`] for a key that may have something here.
    fn invalidate_held(&self, key: &[u8], hash: u64, counts: Counts, unseen: bool) -> bool {
        let mut unlinked = false;
        if counts.read() {
            let lead = self.remove_lead(hash, |s| s.is_for(key));
            let fill = self.fills.remove(key).is_some();
            if fill {
                self.presence.remove(hash, Held::Read);
            }
            unlinked = fill || lead;
        }
        // Even with no entry counted above: a read unlinked here may have completed into one
        // since.
        let removed = self.store.remove(key);
        if let Some(e) = &removed {
            let hits = e.hits();
            if unseen && hits == 0 {
                self.admission.record_write(hash);
            }
            self.admission.entry_ended(hash, hits);
        }
        unlinked || removed.is_some()
    }

    /// The second invalidation of a write through corral, once Redis acknowledged it: only
    /// if a read of the key may have been registered since `mark` (see `epochs.rs`).
    pub(super) fn invalidate_acked(&self, key: &[u8], mark: u64) -> bool {
        let hash = self.admission.hash(key);
        self.epochs.since(hash, mark) && self.invalidate_hashed(key, hash, false)
    }

    /// Drops every entry and in-flight read.
    pub(super) fn flush(&self) {
        // Uncounted as they are removed, under their shard's lock, so a little before they
        // are gone: a write that finds a count already down skips what this removes anyway,
        // and no read can complete or be joined through the locked shard meanwhile.
        self.fills.retain(|k, _| {
            self.presence.remove(self.admission.hash(k), Held::Read);
            false
        });
        self.leads.retain(|&hash, _| {
            self.presence.remove(hash, Held::Read);
            false
        });
        self.store.clear();
        self.stats.flushes.inc();
    }

    /// A tracked fill finished (runs on the lane task, in wire order with invalidations).
    pub(super) fn complete_fill(&self, key: &Key, fill: &Arc<Fill>, r: JobResult) {
        // Parsed in place: the reply to a short string is copied into the entry alone.
        let parsed = match &r {
            Ok(bytes) => {
                value::parse_fill_reply(bytes).map_err(|cause| UpstreamError::BadReply { cause })
            }
            Err(e) => Err(e.clone()),
        };
        let result = match parsed {
            Ok((pttl, reply)) => Ok(self.insert_if_current(key, fill, pttl, reply)),
            Err(e) => {
                // The lane broke with this reply due, and the reply may be what broke it
                // (`lost.rs`): a key lost with its lane twice lately is read as a cold key's
                // for a while (`Churn::shut`), as a value over `max_value_bytes` is.
                if fill.lane.is_some()
                    && matches!(e, UpstreamError::ConnectionLost { .. })
                    && self
                        .lost
                        .lost(self.admission.hash(key), std::time::Instant::now())
                {
                    self.admission.oversized(self.admission.hash(key));
                }
                self.remove_fill(key, fill);
                Err(e)
            }
        };
        fill.publish(result);
    }

    /// A lead's plain GET finished. Unjoined (the common case) it only leaves the map: no
    /// waiter, so its reply is not even parsed. Joined, its waiters get the reply.
    pub(super) fn complete_lead(&self, hash: u64, id: u64, r: JobResult) {
        let mut joined = true;
        // Not found: unlinked by an invalidation, a flush or a newer read, and its waiters,
        // if any, are in `joined`.
        self.remove_lead(hash, |s| {
            joined = s.id != id || s.joined.is_some();
            s.id == id
        });
        if joined && let Some((_, fill)) = self.joined.remove(&id) {
            share(&fill, r);
        }
    }

    /// Removes the lead `id` if nobody joined it: then nobody waits for its reply.
    pub(super) fn unlink_lead(&self, hash: u64, id: u64) -> bool {
        self.remove_lead(hash, |s| s.id == id && s.joined.is_none())
    }

    /// Removes the key's bare read if `pred` holds for it, uncounting it.
    fn remove_lead(&self, hash: u64, pred: impl FnOnce(&Slot) -> bool) -> bool {
        let removed = self.leads.remove_if(&hash, |_, s| pred(s)).is_some();
        if removed {
            self.presence.remove(hash, Held::Read);
        }
        removed
    }

    /// Removes `fill` from `fills` if it is still the key's read, uncounting it.
    fn remove_fill(&self, key: &[u8], fill: &Arc<Fill>) {
        if self
            .fills
            .remove_if(key, |_, f| Arc::ptr_eq(f, fill))
            .is_some()
        {
            self.presence.remove(self.admission.hash(key), Held::Read);
        }
    }

    /// A plain GET sent from here finished: share it, keep nothing.
    pub(super) fn complete_read(&self, key: &[u8], fill: &Arc<Fill>, r: JobResult) {
        self.remove_fill(key, fill);
        share(fill, r);
    }

    /// Stores the value read if `fill` is still the key's current read, i.e. no invalidation
    /// came since it was sent. Returns the value, for the fill's waiters: the entry itself
    /// when one was stored.
    fn insert_if_current(&self, key: &Key, fill: &Arc<Fill>, pttl: i64, reply: GetReply) -> Value {
        let tracking = fill.lane.as_ref().map_or(Tracking::Down, |l| l.tracking());
        let hash = self.admission.hash(key);
        let cacheable = match reply {
            GetReply::Error(_) => false,
            v if v.size() > self.max_value => {
                self.stats.oversized.inc();
                self.admission.oversized(hash);
                false
            }
            _ => tracking != Tracking::Down,
        };
        // The key's TTL counts from when Redis ran the read, which is after `started`.
        let drawn = entry::drawn_life(self.max_age);
        let mut life = drawn;
        if pttl >= 0 {
            life = life.min(Duration::from_millis(pttl as u64));
        }
        if tracking == Tracking::Fallback {
            life = life.min(self.fallback_ttl);
        }
        // Only corral's own bound ends it: refreshed ahead while it is still read.
        let by_age = life == drawn;
        // A value too long to go inline in an entry is copied now, before the map's lock is
        // taken: a copy of up to `max_value_bytes` under it would hold up the invalidations
        // of every key in its shard. A short one is copied into the entry alone.
        let owned = (!Entry::holds_inline(reply)).then(|| reply.to_value());
        let mut stored = None;
        if let MapEntry::Occupied(o) = self.fills.entry(key.clone())
            && Arc::ptr_eq(o.get(), fill)
        {
            // Under the map's lock: a write held after this look removes the entry (its first
            // invalidation waits for the lock), and while one is held the read may have run
            // before it (`unacked.rs`).
            if cacheable && !life.is_zero() && !self.unacked.held(hash) {
                let delta = fill.started.elapsed();
                let expires = fill.started + life;
                let (delta, window) = if by_age {
                    self.admission.age_refresh(delta, life)
                } else {
                    (delta, self.admission.refresh_window(delta))
                };
                let entry = match &owned {
                    Some(v) => Entry::new(key, v.clone(), expires, delta, window),
                    None => Entry::from_reply(key, reply, expires, delta, window),
                };
                self.store.insert_hashed(hash, entry.clone());
                self.stats.inserts.inc();
                stored = Some(entry);
            }
            o.remove();
            // After the entry was counted: the key's count never passes through zero.
            self.presence.remove(hash, Held::Read);
        }
        match stored {
            Some(entry) => Value::Cached(entry),
            None => owned.unwrap_or_else(|| reply.to_value()),
        }
    }

    /// A core with small bounds, for unit tests.
    #[cfg(test)]
    pub(super) fn for_test() -> Core {
        Core::for_test_with(Admission::new(1024, 2, 1.0))
    }

    /// A core with small bounds and `admission`, for unit tests.
    #[cfg(test)]
    pub(super) fn for_test_with(admission: Admission) -> Core {
        let admission = Arc::new(admission);
        let presence = Arc::new(Presence::default());
        Core {
            store: Store::new(1 << 20, presence.clone(), admission.hasher()),
            presence,
            fills: DashMap::default(),
            leads: Leads::default(),
            recent: RecentReads::default(),
            lone: Lone::default(),
            renewal: Renewal::new(65_536),
            lost: LostFills::default(),
            epochs: ReadEpochs::default(),
            unacked: Arc::default(),
            joined: DashMap::default(),
            admission,
            stats: Stats::default(),
            max_value: 1024,
            max_age: Duration::from_secs(60),
            fallback_ttl: Duration::from_secs(1),
            join_bound: Duration::from_secs(5),
        }
    }
}

/// Gives a plain GET's reply, or its failure, to the read's waiters.
fn share(fill: &Fill, r: JobResult) {
    let result = r.and_then(|bytes| {
        Value::from_get_reply(&bytes).ok_or_else(|| UpstreamError::BadReply {
            cause: format!(
                "unexpected GET reply {:?}",
                String::from_utf8_lossy(&bytes[..bytes.len().min(64)])
            ),
        })
    });
    fill.publish(result);
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use bytes::Bytes;

    use super::super::flight::FillRx;
    use super::super::tracking::LaneState;
    use super::*;

    /// Whether a lookup of `key` now finds an entry.
    fn cached(c: &Core, key: &[u8]) -> bool {
        c.store
            .get(key, c.admission.hash(key), Instant::now(), true, 0)
            .is_some()
    }

    fn lane_on() -> Arc<LaneState> {
        Arc::new(LaneState::new("test", Tracking::On))
    }

    fn fill(c: &Core, key: &'static [u8]) -> Arc<Fill> {
        fill_on(c, key, lane_on())
    }

    fn fill_on(c: &Core, key: &'static [u8], lane: Arc<LaneState>) -> Arc<Fill> {
        let f = Fill::new(Key::from(key), Instant::now(), Some(lane), None);
        add_fill(c, Key::from(key), c.admission.hash(key), f.clone());
        f
    }

    /// Puts `fill` in `fills` as the read of `key`, whose hash is `hash`, counted first.
    fn add_fill(c: &Core, key: Key, hash: u64, fill: Arc<Fill>) {
        c.presence.add(hash, Held::Read);
        if c.fills.insert(key, fill).is_some() {
            c.presence.remove(hash, Held::Read);
        }
    }

    const REPLY: &[u8] = b":-1\r\n$1\r\nv\r\n";

    #[test]
    fn fill_inserts_when_nothing_intervened() {
        let c = Core::for_test();
        let f = fill(&c, b"k");
        let rx = f.waiter();
        c.complete_fill(&Key::from(&b"k"[..]), &f, Ok(Bytes::from_static(REPLY)));
        assert!(cached(&c, b"k"));
        assert!(c.fills.is_empty());
        assert_eq!(rx.peek(), Some(&Ok(Value::bulk(b"v"))));
    }

    #[test]
    fn a_fill_of_a_long_value_is_stored_and_answered_whole() {
        // Too long to go inline in its entry (see `Entry::holds_inline`): a value of its own.
        let c = Core::for_test();
        let long = vec![b'x'; 100];
        let reply = [&b":-1\r\n$100\r\n"[..], &long, b"\r\n"].concat();
        let f = fill(&c, b"k");
        let rx = f.waiter();
        c.complete_fill(&Key::from(&b"k"[..]), &f, Ok(Bytes::from(reply)));
        assert!(cached(&c, b"k"));
        assert_eq!(rx.peek(), Some(&Ok(Value::bulk(&long))));
        // A fill that is no longer the key's read answers its waiters the same, stores nothing.
        let f = fill(&c, b"j");
        let rx = f.waiter();
        let _newer = fill(&c, b"j");
        let reply = [&b":-1\r\n$100\r\n"[..], &long, b"\r\n"].concat();
        c.complete_fill(&Key::from(&b"j"[..]), &f, Ok(Bytes::from(reply)));
        assert!(!cached(&c, b"j"));
        assert_eq!(rx.peek(), Some(&Ok(Value::bulk(&long))));
    }

    /// Fills `key`, serves `hits` from its entry, then has a write end it: `lives` times.
    fn lives(c: &Core, key: &'static [u8], hits: usize, lives: usize) {
        for _ in 0..lives {
            let f = fill(c, key);
            c.complete_fill(&Key::from(key), &f, Ok(Bytes::from_static(REPLY)));
            let hash = c.admission.hash(key);
            for _ in 0..hits {
                let e = c.store.get(key, hash, Instant::now(), true, 0);
                e.expect("the entry is cached").mark_hit();
            }
            assert!(c.invalidate(key, false));
        }
    }

    #[test]
    fn a_key_whose_entries_writes_end_young_is_no_longer_admitted() {
        let hot = |c: &Core| c.admission.hot(15, c.admission.hash(b"k"));
        let c = Core::for_test();
        assert!(hot(&c));
        lives(&c, b"k", 3, 4);
        assert!(!hot(&c), "four fills of three hits each");
        let c = Core::for_test();
        lives(&c, b"k", 100, 50);
        assert!(hot(&c), "entries that served a hundred hits");
        // Entries not ended by a write (evicted, expired, flushed) say nothing of it.
        let c = Core::for_test();
        for _ in 0..10 {
            let f = fill(&c, b"k");
            c.complete_fill(&Key::from(&b"k"[..]), &f, Ok(Bytes::from_static(REPLY)));
            c.flush();
        }
        assert!(hot(&c));
    }

    #[test]
    fn fill_after_invalidation_does_not_insert_but_answers_waiters() {
        let c = Core::for_test();
        let f = fill(&c, b"k");
        let rx = f.waiter();
        c.invalidate(b"k", true);
        c.complete_fill(&Key::from(&b"k"[..]), &f, Ok(Bytes::from_static(REPLY)));
        assert!(!cached(&c, b"k"));
        assert!(rx.peek().is_some());
    }

    #[test]
    fn superseded_fill_does_not_remove_the_new_one() {
        let c = Core::for_test();
        let old = fill(&c, b"k");
        c.invalidate(b"k", true);
        let new = fill(&c, b"k");
        c.complete_fill(&Key::from(&b"k"[..]), &old, Ok(Bytes::from_static(REPLY)));
        assert!(!cached(&c, b"k"));
        assert!(Arc::ptr_eq(&c.fills.get(&b"k"[..]).unwrap(), &new));
    }

    #[test]
    fn oversized_errors_and_untracked_values_are_not_cached() {
        let c = Core::for_test();
        let big = format!(":-1\r\n$2000\r\n{}\r\n", "x".repeat(2000));
        let f = fill(&c, b"big");
        c.complete_fill(&Key::from(&b"big"[..]), &f, Ok(Bytes::from(big)));
        assert!((c.store.len() == 0));
        let f = fill(&c, b"e");
        let err = b":-1\r\n-WRONGTYPE x\r\n";
        c.complete_fill(&Key::from(&b"e"[..]), &f, Ok(Bytes::from_static(err)));
        assert!((c.store.len() == 0));
        let f = fill_on(&c, b"k", Arc::new(LaneState::new("test", Tracking::Down)));
        c.complete_fill(&Key::from(&b"k"[..]), &f, Ok(Bytes::from_static(REPLY)));
        assert!((c.store.len() == 0));
    }

    const GET_REPLY: &[u8] = b"$1\r\nv\r\n";

    /// A bare read of `key`, as `lookup` registers it; returns the key's hash.
    fn lead(c: &Core, key: &[u8], id: u64) -> u64 {
        let hash = c.admission.hash(key);
        c.presence.add(hash, Held::Read);
        if c.leads
            .insert(hash, Slot::new(id, Instant::now(), key))
            .is_some()
        {
            c.presence.remove(hash, Held::Read);
        }
        hash
    }

    /// What a second GET does to a lead: the `Fill` its waiters share.
    fn join(c: &Core, key: &'static [u8]) -> FillRx {
        let hash = c.admission.hash(key);
        let mut slot = c.leads.get_mut(&hash).expect("a lead in flight");
        c.join_lead(&mut slot, None)
    }

    #[test]
    fn an_unjoined_lead_leaves_nothing_behind() {
        let c = Core::for_test();
        let hash = lead(&c, b"k", 7);
        assert!(c.unlink_lead(hash, 7));
        assert!(c.leads.is_empty() && c.joined.is_empty());
    }

    #[test]
    fn a_joined_lead_answers_its_waiters_even_after_an_invalidation() {
        let c = Core::for_test();
        let hash = lead(&c, b"k", 7);
        let rx = join(&c, b"k");
        // Joined: it needs its reply.
        assert!(!c.unlink_lead(hash, 7));
        c.invalidate(b"k", true);
        assert!(c.leads.is_empty());
        // A GET after the write starts its own read, which the old one must not answer.
        lead(&c, b"k", 8);
        c.complete_lead(hash, 7, Ok(Bytes::from_static(GET_REPLY)));
        assert_eq!(rx.peek(), Some(&Ok(Value::bulk(b"v"))));
        assert_eq!(c.leads.get(&hash).map(|s| s.id), Some(8));
        assert!(c.joined.is_empty());
    }

    #[test]
    fn a_lead_that_fails_passes_the_failure_to_its_waiters() {
        let c = Core::for_test();
        let hash = lead(&c, b"k", 7);
        let rx = join(&c, b"k");
        c.complete_lead(hash, 7, Err(UpstreamError::ShuttingDown));
        assert!(matches!(rx.peek(), Some(Err(UpstreamError::ShuttingDown))));
        assert!(c.leads.is_empty() && c.joined.is_empty());
    }

    #[test]
    fn an_invalidation_unlinks_only_a_read_of_its_own_key() {
        let c = Core::for_test();
        // A read of "k" in the slot of "other"'s hash, as if the two hashes were equal.
        let hash = c.admission.hash(b"other");
        c.presence.add(hash, Held::Read);
        c.leads.insert(hash, Slot::new(7, Instant::now(), b"k"));
        c.invalidate(b"other", true);
        assert!(c.leads.contains_key(&hash));
        c.invalidate(b"k", true);
        lead(&c, b"k", 8);
        c.invalidate(b"k", true);
        assert!(!c.leads.contains_key(&c.admission.hash(b"k")));
    }

    #[test]
    fn a_read_registered_between_a_writes_two_invalidations_is_unlinked_by_the_second() {
        let c = Core::for_test();
        let mark = c.epochs.mark();
        c.invalidate(b"k", false);
        // A GET after the write was forwarded starts a read of its own.
        let f = fill(&c, b"k");
        c.epochs.registered(c.admission.hash(b"k"));
        assert!(c.invalidate_acked(b"k", mark));
        c.complete_fill(&Key::from(&b"k"[..]), &f, Ok(Bytes::from_static(REPLY)));
        assert!(!cached(&c, b"k"));
        // With no read registered since its mark, a write's second pass finds nothing to do.
        let mark = c.epochs.mark();
        assert!(!c.invalidate_acked(b"k", mark));
    }

    /// A fill registered while `write` holds its key fills nothing (the read may have run
    /// before the write), but answers its waiters; once `write` is released, the next fill
    /// does.
    fn fills_nothing_while(c: &Core, write: super::super::Unacked) {
        let f = fill(c, b"k");
        let rx = f.waiter();
        c.complete_fill(&Key::from(&b"k"[..]), &f, Ok(Bytes::from_static(REPLY)));
        assert!(!cached(c, b"k") && c.fills.is_empty());
        assert_eq!(rx.peek(), Some(&Ok(Value::bulk(b"v"))));
        drop(write);
        let f = fill(c, b"k");
        c.complete_fill(&Key::from(&b"k"[..]), &f, Ok(Bytes::from_static(REPLY)));
        assert!(cached(c, b"k"));
    }

    /// A fill registered after a write's first invalidation fills nothing while the write is
    /// unacknowledged, whether it holds its key or every key (FLUSHALL).
    #[test]
    fn a_fill_completed_before_a_writes_acknowledgement_fills_nothing() {
        let c = Core::for_test();
        let mut write = super::super::Unacked::default();
        write.hold(&c.unacked, c.admission.hash(b"k"));
        c.invalidate(b"k", false);
        fills_nothing_while(&c, write);
        let c = Core::for_test();
        let mut write = super::super::Unacked::default();
        write.hold_all(&c.unacked);
        c.flush();
        fills_nothing_while(&c, write);
    }

    /// A fill whose tracking connection broke with its reply due shuts its key out of
    /// admission (the reply may be what broke it); one that timed out, or a plain read, does
    /// not.
    #[test]
    fn a_fill_that_lost_its_lane_twice_shuts_its_key_out() {
        let c = Core::for_test();
        let lost = || UpstreamError::ConnectionLost {
            addr: "test".into(),
            cause: "closed by upstream".into(),
        };
        let timeout = || UpstreamError::Timeout {
            addr: "test".into(),
        };
        // Once is what a restart does to every fill in flight; twice lately, the key is
        // taken for what broke the lane. A timeout, or a plain read's loss, never counts.
        type Case = (&'static [u8], bool, fn() -> UpstreamError, [bool; 2]);
        let cases: [Case; 3] = [
            (b"lost", true, lost, [false, true]),
            (b"slow", true, timeout, [false, false]),
            (b"plain", false, lost, [false, false]),
        ];
        for (key, on_lane, error, shut) in cases {
            let hash = c.admission.hash(key);
            for shut in shut {
                let lane = on_lane.then(lane_on);
                let f = Fill::new(Key::from(key), Instant::now(), lane, None);
                add_fill(&c, Key::from(key), hash, f.clone());
                assert!(c.admission.hot(15, hash));
                c.complete_fill(&Key::from(key), &f, Err(error()));
                assert_eq!(
                    !c.admission.hot(15, hash),
                    shut,
                    "{}",
                    String::from_utf8_lossy(key)
                );
                assert!(c.fills.is_empty());
            }
        }
    }

    /// Every way a fill, a bare read or an entry leaves is uncounted once, so the counts
    /// return to zero; while a key has an entry, its count is never zero.
    #[test]
    fn presence_counts_follow_what_enters_and_leaves() {
        let c = Core::for_test();
        // Values large enough that the 1 MiB store evicts.
        let reply = Bytes::from(format!(":-1\r\n$900\r\n{}\r\n", "x".repeat(900)));
        let later = Instant::now() + Duration::from_secs(3600);
        let keys: Vec<Vec<u8>> = (0..10_000).map(|i| format!("k{i}").into_bytes()).collect();
        for (i, key) in keys.iter().enumerate() {
            let hash = c.admission.hash(key);
            let k = Key::from(key.as_slice());
            let f = Fill::new(k.clone(), Instant::now(), Some(lane_on()), None);
            add_fill(&c, k.clone(), hash, f.clone());
            match i % 6 {
                0 => c.complete_fill(&k, &f, Ok(reply.clone())),
                1 => c.complete_fill(&k, &f, Err(UpstreamError::ShuttingDown)),
                2 => {
                    c.invalidate(key, true);
                    c.complete_fill(&k, &f, Ok(reply.clone()));
                }
                3 => {
                    c.complete_fill(&k, &f, Ok(reply.clone()));
                    c.invalidate(key, false);
                }
                4 => {
                    // Filled twice: the second entry replaces the first.
                    c.complete_fill(&k, &f, Ok(reply.clone()));
                    let again = Fill::new(k.clone(), Instant::now(), Some(lane_on()), None);
                    add_fill(&c, k.clone(), hash, again.clone());
                    c.complete_fill(&k, &again, Ok(reply.clone()));
                    // Found expired by a lookup an hour later.
                    c.store.get(key, hash, later, false, 0);
                }
                _ => {
                    c.complete_read(&k, &f, Ok(Bytes::from_static(GET_REPLY)));
                    let id = i as u64;
                    lead(&c, &keys[i - 5], id);
                    match i % 3 {
                        0 => c.complete_lead(
                            hash_of(&c, &keys[i - 5]),
                            id,
                            Err(UpstreamError::ShuttingDown),
                        ),
                        1 => assert!(c.unlink_lead(hash_of(&c, &keys[i - 5]), id)),
                        _ => {}
                    }
                }
            }
            for key in [key, &keys[i - i % 6]] {
                if c.store.contains(key) {
                    assert!(c.presence.counts(c.admission.hash(key)).entry(), "{key:?}");
                }
            }
        }
        assert!(c.store.evictions() > 0);
        assert!(!c.presence.is_clear(), "entries and leads are left");
        c.flush();
        assert!(c.presence.is_clear());
    }

    fn hash_of(c: &Core, key: &[u8]) -> u64 {
        c.admission.hash(key)
    }

    #[test]
    fn entries_filled_together_do_not_expire_together() {
        let c = Core::for_test();
        let keys: Vec<&'static [u8]> = (0..64)
            .map(|i| &*Box::leak(format!("k{i}").into_bytes().into_boxed_slice()))
            .collect();
        let started = Instant::now();
        for key in &keys {
            let f = fill(&c, key);
            c.complete_fill(&Key::from(*key), &f, Ok(Bytes::from_static(REPLY)));
        }
        let ends = Instant::now();
        let mut expiries: Vec<Instant> = keys
            .iter()
            .map(|k| {
                let e = c.store.get(k, hash_of(&c, k), Instant::now(), false, 0);
                e.map(|e| e.expires())
            })
            .collect::<Option<_>>()
            .unwrap_or_default();
        assert_eq!(expiries.len(), keys.len(), "every fill stored");
        // None outlives `max_age` from its fill, none ends before three quarters of it...
        for e in &expiries {
            assert!(*e >= started + c.max_age * 3 / 4 && *e <= ends + c.max_age);
        }
        // ...and they are spread over that quarter, not one instant.
        expiries.sort();
        assert!(expiries[63] - expiries[0] > c.max_age / 8);
    }

    #[test]
    fn only_entries_max_age_bounds_are_refreshed_well_ahead() {
        let c = Core::for_test();
        let scale_of = |key: &'static [u8], reply: &'static [u8]| {
            let f = fill(&c, key);
            c.complete_fill(&Key::from(key), &f, Ok(Bytes::from_static(reply)));
            let e = c.store.get(key, hash_of(&c, key), Instant::now(), false, 0);
            e.map(|e| e.delta())
        };
        // No TTL in Redis: a 128th of a life of 45-60 s.
        let aged = scale_of(b"aged", REPLY).unwrap_or_default();
        assert!(aged >= c.max_age * 3 / 4 / 128, "{aged:?}");
        // A TTL shorter than the life drawn: the fill's own time, far under a millisecond.
        let ttl = scale_of(b"ttl", b":5000\r\n$1\r\nv\r\n");
        assert!(
            ttl.is_some_and(|d| d < Duration::from_millis(100)),
            "{ttl:?}"
        );
    }

    #[test]
    fn ttl_bounds_entry_life() {
        let c = Core::for_test();
        let f = fill(&c, b"k");
        let r = b":0\r\n$1\r\nv\r\n";
        c.complete_fill(&Key::from(&b"k"[..]), &f, Ok(Bytes::from_static(r)));
        assert!(!cached(&c, b"k"));
    }
}
