//! What a connection has written, as the cache needs to know it: keys written or read
//! earlier in the round (`noted.rs`: a later GET of one must not be served locally, or is
//! given the same read), keys to invalidate again once a batch is acknowledged, and the
//! writes queued in a MULTI; and the time the round's lookups are served at.

use std::hash::BuildHasher;

use super::noted::{Note, RoundNotes};
use super::pending::AfterAck;
use crate::cache::{Cache, Clock, FillRx, Unacked};

/// Most keys collected from the writes queued in one MULTI; past this, EXEC flushes the
/// whole cache once acknowledged instead (memory per client stays bounded).
pub(super) const MAX_TX_WRITE_KEYS: usize = 10_000;
/// A round's written keys keep at most this much capacity into the next round.
const KEEP_ROUND_CAPACITY: usize = 1024;
/// Bytes of keys an acknowledged batch's buffer may hold to be used again.
const KEEP_KEY_BYTES: usize = 64 * 1024;
/// Keys, and bytes of keys, a batch's written keys take room for at its first: a
/// pipeline's worth of short keys, where growing from nothing reallocated several times.
const FIRST_KEYS: usize = 16;
const FIRST_KEY_BYTES: usize = 256;

/// Writes seen by a connection, as the cache needs them.
#[derive(Default)]
pub(super) struct Writes {
    /// Hashes of the keys written or read earlier in this round, with what was done (see
    /// `noted.rs`): a later GET of a key written must not be served from the cache or
    /// coalesced, or it could miss the write. Hashes, not keys: recording one allocates
    /// nothing, and two keys sharing a hash only send a GET to Redis that could have been a
    /// hit. Indexed only when a GET asks and there are many, so a pipeline of one huge DEL
    /// and many GETs costs one lookup per GET, and a pipeline of SETs alone builds no index.
    notes: RoundNotes,
    /// This round forwarded a write whose keys are not known (a script, an unknown command)
    /// or that changes every key, or a read of keys it may not name (a read-only script):
    /// no later GET in it may be served locally.
    pub(super) round_all: bool,
    /// Keys written by the current batch, invalidated again once it is acknowledged.
    pub(super) keys: WrittenKeys,
    /// The cache's mark taken before the batch's first invalidation (`Cache::write_mark`);
    /// 0 once it holds keys invalidated before that (a transaction's).
    pub(super) mark: Option<u64>,
    /// The current batch holds a command that may change every key.
    pub(super) all: bool,
    /// The round's time, for the cache's lookups (see [`Clock`]).
    pub(super) clock: Clock,
    /// The current batch runs a script or function, which may write keys it did not declare:
    /// once it is acknowledged, wait for the tracking connection to deliver what Redis sent.
    pub(super) barrier: bool,
    /// Hashes keys as the cache does (`Cache::hasher`): a GET's or a SET's hash in hand is
    /// not computed again for `round_keys`.
    hasher: foldhash::fast::RandomState,
    /// Cluster mode: the cache's part in the request being routed, kept apart from the
    /// batch's until it is known which batch the request goes in ([`Writes::apart`]).
    routed: Option<BatchPart>,
}

/// The cache's part in a batch: what [`Writes`] keeps per batch, to run once it is
/// acknowledged.
#[derive(Default)]
pub(super) struct BatchPart {
    keys: WrittenKeys,
    mark: Option<u64>,
    all: bool,
    barrier: bool,
}

impl BatchPart {
    /// What is run once the batch is acknowledged: its keys invalidated again, the cache
    /// flushed if it may have changed every key. (A batch whose part waits for the lane,
    /// `barrier`, is never set aside: see `gather.rs`.)
    pub(super) fn into_after(self) -> AfterAck {
        AfterAck {
            writes: self.keys,
            write_mark: self.mark.unwrap_or(0),
            writes_all: self.all,
            ..AfterAck::default()
        }
    }

    fn is_empty(&self) -> bool {
        self.keys.len() == 0
            && self.keys.unacked.is_empty()
            && self.mark.is_none()
            && !self.all
            && !self.barrier
    }
}

impl Writes {
    /// A connection's writes, its keys hashed with `hasher` (the cache's, if any).
    pub(super) fn new(hasher: foldhash::fast::RandomState) -> Writes {
        Writes {
            hasher,
            ..Writes::default()
        }
    }

    /// A new round: nothing written in it yet.
    pub(super) fn new_round(&mut self) {
        self.notes.clear();
        self.round_all = false;
        self.clock.reset();
    }

    /// Notes a key of this round, by its hash, for [`Writes::touched`].
    fn note(&mut self, hash: u64) {
        self.notes.add(hash, Note::Forward);
    }

    /// A write of the current batch names `key`, whose [`Cache::hash`] is `hash`: kept to
    /// invalidate again once the batch is acknowledged, and written in this round.
    ///
    /// [`Cache::hash`]: crate::cache::Cache::hash
    pub(super) fn wrote(&mut self, key: &[u8], hash: u64) {
        self.keys.push(key);
        self.note(hash);
    }

    /// A GET of the key whose [`Cache::hash`] is `hash` was forwarded in the batch, looked up
    /// or skipped by a cool connection: Redis runs it once the batch is sent, after the
    /// round. A later GET of the key in the round must not be served before it, by a hit or
    /// by joining a read already in flight, whose values may be older than the one this GET
    /// will read: the client would see the key's value go back. It is forwarded too, as
    /// after a write. (A skipped GET's key had nothing here, but another client's read of it
    /// may start, and even complete into an entry, before the round's next GET of it.) The
    /// hash itself is kept, not only its bit: a cool round skips many GETs, and their bits
    /// alone would send most of its later GETs to Redis, hits among them.
    ///
    /// [`Cache::hash`]: crate::cache::Cache::hash
    pub(super) fn read_forwarded(&mut self, hash: u64) {
        self.note(hash);
    }

    /// A write of the current batch names `key` (`hash` its [`Cache::hash`]): its key
    /// invalidated now and held until the batch is acknowledged
    /// ([`Cache::write_coming_hashed`]), kept to invalidate again then, and written in this
    /// round.
    // Always: called, it cost a plain SET about 20 more instructions (callgrind).
    #[inline(always)]
    pub(super) fn write_coming(&mut self, cache: &Cache, key: &[u8], hash: u64) {
        cache.write_coming_hashed(key, hash, &mut self.keys.unacked);
        self.wrote(key, hash);
    }

    /// A GET of the key whose [`Cache::hash`] is `hash` waits on a read sent outside the
    /// batch (see `Writes::waiting`).
    ///
    /// [`Cache::hash`]: crate::cache::Cache::hash
    pub(super) fn waits_on(&mut self, hash: u64, rx: &FillRx) {
        self.notes.add(hash, Note::Joined(rx.clone()));
    }

    /// A GET of the key whose [`Cache::hash`] is `hash` leads the read `id` in the batch.
    ///
    /// [`Cache::hash`]: crate::cache::Cache::hash
    pub(super) fn leads(&mut self, hash: u64, id: u64) {
        self.notes.add(hash, Note::Led(id));
    }

    /// What an earlier request of the round did with the key whose [`Cache::hash`] is `hash`
    /// (see `noted.rs`): `Note::Forward` after a write or a GET forwarded (and after any
    /// write of keys not known), the read a GET joined or led, or `None`.
    ///
    /// [`Cache::hash`]: crate::cache::Cache::hash
    #[inline]
    pub(super) fn earlier(&mut self, hash: u64) -> Option<Note> {
        if self.round_all {
            return Some(Note::Forward);
        }
        self.notes.find(hash)
    }

    /// Whether a GET of this round waits on a read sent outside the batch.
    #[inline]
    pub(super) fn waiting(&self) -> bool {
        self.notes.joined_any()
    }

    /// Whether a GET of this round waits on a read of `key` sent outside the batch.
    pub(super) fn waits_for(&self, key: &[u8]) -> bool {
        self.notes.joined(self.hasher.hash_one(key))
    }

    /// The current batch's written keys.
    pub(super) fn take_keys(&mut self) -> WrittenKeys {
        std::mem::take(&mut self.keys)
    }

    /// Takes back an acknowledged batch's written keys, emptied, to hold the next batch's
    /// if none are held yet: a batch that writes then allocates no buffers of its own.
    /// Buffers grown past [`KEEP_ROUND_CAPACITY`] keys or [`KEEP_KEY_BYTES`] are let go.
    pub(super) fn recycle(&mut self, mut keys: WrittenKeys) {
        keys.clear();
        if self.keys.ends.capacity() == 0
            && keys.ends.capacity() <= KEEP_ROUND_CAPACITY
            && keys.bytes.capacity() <= KEEP_KEY_BYTES
        {
            self.keys = keys;
        }
    }

    /// Whether a request earlier in this round wrote, or read other than by a hit, the key
    /// whose [`Cache::hash`] is `hash` (see [`Writes::earlier`]).
    ///
    /// [`Cache::hash`]: crate::cache::Cache::hash
    #[inline]
    pub(super) fn touched(&mut self, hash: u64) -> bool {
        self.round_all || self.notes.find(hash).is_some()
    }

    /// [`Writes::touched`], the key hashed here.
    pub(super) fn touched_key(&mut self, key: &[u8]) -> bool {
        if !self.notes.any() {
            return self.round_all;
        }
        let hash = self.hasher.hash_one(key);
        self.touched(hash)
    }

    /// The current batch's part, taken (empty in its place).
    pub(super) fn take_part(&mut self) -> BatchPart {
        BatchPart {
            keys: std::mem::take(&mut self.keys),
            mark: self.mark.take(),
            all: std::mem::take(&mut self.all),
            barrier: std::mem::take(&mut self.barrier),
        }
    }

    /// Adds `part` to the current batch's: its keys and holds, and the earlier of the two
    /// marks (an earlier mark only invalidates more once acknowledged).
    pub(super) fn add_part(&mut self, mut part: BatchPart) {
        if self.keys.len() == 0 && self.keys.unacked.is_empty() {
            std::mem::swap(&mut self.keys, &mut part.keys);
        } else {
            self.keys.append(&mut part.keys);
        }
        self.mark = match (self.mark, part.mark) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.all |= part.all;
        self.barrier |= part.barrier;
    }

    /// Cluster mode: runs `step`, the cache's part in a request, with the current batch's
    /// part set aside, and keeps what it adds apart until the request is routed
    /// ([`Writes::join_routed`], [`Writes::drop_routed`]). A request for another node than
    /// the batch's sends the batch first: its writes' holds must go with its own batch, not
    /// be released when the earlier one is acknowledged (before Redis ran them), and a
    /// request corral answers itself (CROSSSLOT...) must not leave holds behind.
    pub(super) fn apart<T>(&mut self, step: impl FnOnce(&mut Writes) -> T) -> T {
        let batch = self.take_part();
        let out = step(self);
        let mine = self.take_part();
        self.add_part(batch);
        self.routed = (!mine.is_empty()).then_some(mine);
        out
    }

    /// The request [`Writes::apart`] kept apart joins the current batch (sent first if it
    /// was for another node).
    pub(super) fn join_routed(&mut self) {
        if let Some(part) = self.routed.take() {
            self.add_part(part);
        }
    }

    /// Whether the request [`Writes::apart`] kept apart waits for the lane once
    /// acknowledged (a script).
    pub(super) fn routed_barrier(&self) -> bool {
        self.routed.as_ref().is_some_and(|p| p.barrier)
    }

    /// The request [`Writes::apart`] kept apart is not forwarded: its holds are released.
    pub(super) fn drop_routed(&mut self) {
        self.routed = None;
    }

    /// An EXEC is being sent: the writes it runs are written in this round, their keys
    /// invalidated and held now ([`Writes::write_coming`]) and invalidated again once it is
    /// acknowledged, as the batch's own writes are.
    pub(super) fn exec(&mut self, cache: &Cache, tx: &mut TxWrites) {
        if std::mem::take(&mut tx.all) {
            self.round_all = true;
            self.all = true;
            cache.write_coming_all(&mut self.keys.unacked);
        } else if tx.keys.len() > 0 {
            self.mark.get_or_insert_with(|| cache.write_mark());
            for k in tx.keys.iter() {
                self.write_coming(cache, k, cache.hash(k));
            }
        }
        tx.keys.clear();
    }
}

/// Keys written by one batch, kept until Redis acknowledges it: their bytes end to end in
/// one buffer. A `Bytes` per key (cut from a shared block) cost a reference count taken
/// and dropped per key: about 15 ns of a SET's 440 with the cache on (perf, SET over 1M
/// keys at -P 16).
#[derive(Debug, Default)]
pub(super) struct WrittenKeys {
    bytes: Vec<u8>,
    /// Where each key ends in `bytes`.
    ends: Vec<usize>,
    /// The writes' holds on their keys (see [`Unacked`]): released when these are emptied
    /// for the next batch, or dropped.
    pub(super) unacked: Unacked,
}

impl WrittenKeys {
    /// Adds a key.
    pub(super) fn push(&mut self, key: &[u8]) {
        if self.ends.capacity() == 0 {
            self.ends.reserve(FIRST_KEYS);
            self.bytes.reserve(FIRST_KEY_BYTES.max(key.len()));
        }
        self.bytes.extend_from_slice(key);
        self.ends.push(self.bytes.len());
    }

    /// The keys, in the order they were added.
    pub(super) fn iter(&self) -> impl Iterator<Item = &[u8]> {
        let mut start = 0;
        self.ends.iter().map(move |&end| {
            let key = self.bytes.get(start..end).unwrap_or_default();
            start = end;
            key
        })
    }

    /// How many keys.
    pub(super) fn len(&self) -> usize {
        self.ends.len()
    }

    /// Takes over `other`'s keys and holds.
    pub(super) fn append(&mut self, other: &mut WrittenKeys) {
        other.iter().for_each(|k| self.push(k));
        self.unacked.append(&mut other.unacked);
        other.clear();
    }

    /// Empties it, its holds released, keeping its room.
    pub(super) fn clear(&mut self) {
        self.ends.clear();
        self.bytes.clear();
        self.unacked.release();
    }
}

/// Keys written by the commands queued in a MULTI, bounded by [`MAX_TX_WRITE_KEYS`]: EXEC
/// invalidates and holds them ([`Writes::exec`]); nothing is held before.
#[derive(Debug, Default)]
pub(super) struct TxWrites {
    keys: WrittenKeys,
    /// Too many keys to track: EXEC invalidates everything.
    all: bool,
}

impl TxWrites {
    /// A queued command may change every key (FLUSHALL, SWAPDB...): EXEC holds every key
    /// and flushes the cache, before it is sent and once it is acknowledged.
    pub(super) fn change_all(&mut self) {
        self.all = true;
        self.keys = WrittenKeys::default();
    }

    /// Adds the keys of one queued write. Past the bound they are let go: EXEC then holds
    /// every key and flushes the cache, as FLUSHALL does.
    pub(super) fn add(&mut self, keys: &mut WrittenKeys) {
        if self.all {
            return;
        }
        if self.keys.len() + keys.len() > MAX_TX_WRITE_KEYS {
            self.all = true;
            self.keys = WrittenKeys::default();
            return;
        }
        self.keys.append(keys);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(range: std::ops::Range<usize>) -> Vec<Vec<u8>> {
        range.map(|i| format!("k{i}").into_bytes()).collect()
    }

    /// Keys a write in this round names.
    fn written(w: &mut Writes, keys: &[Vec<u8>]) {
        for k in keys {
            w.note(w.hasher.hash_one(k));
        }
    }

    /// `key` written, hashed here.
    fn wrote(w: &mut Writes, key: &[u8]) {
        let hash = w.hasher.hash_one(key);
        w.wrote(key, hash);
    }

    fn of(keys: &[&[u8]]) -> WrittenKeys {
        let mut w = WrittenKeys::default();
        keys.iter().for_each(|k| w.push(k));
        w
    }

    #[test]
    fn written_keys_are_seen_scanned_or_indexed_until_the_next_round() {
        let mut w = Writes::default();
        written(&mut w, &keys(0..3));
        assert!(w.touched_key(b"k2") && !w.touched_key(b"k3"));
        // Past the scan limit the keys are indexed, and keys written after a lookup too.
        written(&mut w, &keys(3..40));
        assert!(w.touched_key(b"k39") && !w.touched_key(b"k40"));
        written(&mut w, &keys(40..41));
        assert!(w.touched_key(b"k40") && w.touched_key(b"k0"));
        w.new_round();
        assert!(!w.touched_key(b"k0") && !w.touched_key(b"k40"));
        written(&mut w, &keys(5..6));
        assert!(w.touched_key(b"k5") && !w.touched_key(b"k39"));
    }

    /// Keys hashed here and hashes handed in are the same, as long as they come from the
    /// hasher the writes were made with.
    #[test]
    fn keys_and_hashes_in_hand_agree() {
        let hasher = foldhash::fast::RandomState::default();
        let mut w = Writes::new(hasher.clone());
        w.wrote(b"a", hasher.hash_one(b"a"));
        wrote(&mut w, b"b");
        assert!(w.touched_key(b"a") && w.touched(hasher.hash_one(b"b")));
        assert!(!w.touched_key(b"c") && !w.touched(hasher.hash_one(b"c")));
        assert!(w.take_keys().iter().eq([&b"a"[..], b"b"]));
    }

    #[test]
    fn written_keys_come_back_as_they_went_in() {
        let long = vec![b'x'; 5000];
        let keys = [&b"a"[..], b"", b"key:1", &long, b"key:2"];
        let mut w = of(&keys);
        assert!(w.iter().eq(keys));
        let mut more = of(&[b"key:3"]);
        w.append(&mut more);
        assert!(w.iter().eq(keys.into_iter().chain([&b"key:3"[..]])));
        assert_eq!(more.iter().count(), 0);
        assert_eq!(WrittenKeys::default().iter().count(), 0);
    }

    #[test]
    fn a_forwarded_get_counts_as_touched_until_the_next_round() {
        let mut w = Writes::default();
        w.read_forwarded(42);
        assert!(w.touched(42));
        // Same bit, another hash; another bit.
        assert!(!w.touched(43) && !w.touched(1 << 63));
        w.new_round();
        assert!(!w.touched(42));
    }

    /// What a request routed in cluster mode adds is kept apart until it is routed: then it
    /// joins the batch it goes in (with the earlier of the two marks), or is let go.
    #[test]
    fn a_routed_requests_part_joins_its_batch_or_is_let_go() {
        let mut w = Writes::default();
        wrote(&mut w, b"a");
        w.mark = Some(5);
        w.apart(|w| {
            wrote(w, b"b");
            w.mark = Some(9);
            w.all = true;
        });
        // The batch's part is as it was.
        assert!(w.keys.iter().eq([&b"a"[..]]));
        assert_eq!((w.mark, w.all), (Some(5), false));
        // Sent in another batch: the first one goes without it.
        let first = w.take_keys();
        assert!(first.iter().eq([&b"a"[..]]));
        w.mark = None;
        w.join_routed();
        assert!(w.keys.iter().eq([&b"b"[..]]));
        assert_eq!((w.mark, w.all), (Some(9), true));
        // Joining a batch with an earlier mark keeps that one; a part let go adds nothing.
        w.mark = Some(3);
        w.apart(|w| {
            wrote(w, b"c");
            w.mark = Some(12);
        });
        w.join_routed();
        assert!(w.keys.iter().eq([&b"b"[..], b"c"]));
        assert_eq!(w.mark, Some(3));
        w.apart(|w| wrote(w, b"d"));
        w.drop_routed();
        w.join_routed();
        assert!(w.keys.iter().eq([&b"b"[..], b"c"]));
    }

    #[test]
    fn an_acknowledged_batchs_buffers_hold_the_next_batchs_keys() {
        let mut w = Writes::default();
        wrote(&mut w, b"a");
        let acked = w.take_keys();
        let room = acked.ends.as_ptr();
        w.recycle(acked);
        assert_eq!(w.keys.iter().count(), 0, "emptied");
        wrote(&mut w, b"b");
        assert!(w.keys.iter().eq([&b"b"[..]]));
        assert_eq!(w.keys.ends.as_ptr(), room, "the same buffer, not a new one");
        // Keys already held stay; buffers grown large are let go.
        w.recycle(of(&[b"c"]));
        assert!(w.keys.iter().eq([&b"b"[..]]));
        w.take_keys();
        w.recycle(of(&[&vec![b'k'; KEEP_KEY_BYTES + 1]]));
        assert_eq!(w.keys.bytes.capacity(), 0);
    }
}
