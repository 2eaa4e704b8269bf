//! Writes through corral that Redis may have run but corral has not seen acknowledged, counted
//! by key hash: while a key has one, no read of it fills the store or is joined.
//!
//! A write's first invalidation (before it is forwarded) unlinks the key's reads in flight
//! and its entry, but a read registered after it, sent over another connection, may still run
//! in Redis before the write. Its value is then older than the write's, and older than what
//! a client reading the key from Redis after the write was told. The write's second
//! invalidation, once it is acknowledged, unlinks such a read; until then a hit on the entry
//! it filled, or a GET joining it, would give that client the key's value from before a
//! value it already read: its reads of the key would go back. So a write holds its key's
//! slot from before its first invalidation until its acknowledgement has been applied, and
//! a key whose slot is held is neither filled ([`super::coherence::Core`]) nor joined
//! ([`super::read`]): its GETs go to Redis, which runs them in order. Keys sharing a slot
//! only lose their fills and joins while the other's write is out. A write that may change
//! every key (FLUSHALL, SWAPDB, a transaction of more keys than corral keeps) holds them all.

use std::sync::Arc;
use std::sync::atomic::AtomicU32;
use std::sync::atomic::Ordering::{Relaxed, SeqCst};

/// Slots: 64 KiB. At -P 16 with 50 clients writing, about 800 writes are out at once, so a
/// key's slot is held by another key's write about one time in 20 at worst.
const SLOTS: usize = 16_384;
const _: () = assert!(SLOTS.is_power_of_two());
/// Room a batch's holds take at its first.
const FIRST_HOLDS: usize = 16;

/// Counts of unacknowledged writes by slot of key hashes.
#[derive(Debug)]
pub(super) struct UnackedTable {
    slots: Box<[AtomicU32]>,
    /// Unacknowledged writes that may change every key: each holds every slot.
    all: AtomicU32,
    /// Set for a table made on a current-thread runtime (`threads = 1`, the default): every
    /// hold, release and look then runs on that runtime's one thread (client connections,
    /// the lanes' fills; no blocking task touches the table), where program order is the
    /// only order, so a count changes by a plain load and store. A locked add waits for
    /// every store before it to complete, cache misses included: on SETs at -P 16 (perf,
    /// `redis-benchmark -t set -r 1000000`), `write_one` and the release took 36-39 ns per
    /// SET with locked adds and 23-26 without, of corral's 610-690.
    one_thread: Option<Owner>,
}

impl Default for UnackedTable {
    fn default() -> Self {
        UnackedTable {
            slots: (0..SLOTS).map(|_| AtomicU32::new(0)).collect(),
            all: AtomicU32::new(0),
            one_thread: None,
        }
    }
}

/// The thread a one-thread table's counts change on, checked in debug builds.
#[derive(Debug)]
struct Owner {
    #[cfg(debug_assertions)]
    thread: std::thread::ThreadId,
}

impl Owner {
    fn current() -> Owner {
        Owner {
            #[cfg(debug_assertions)]
            thread: std::thread::current().id(),
        }
    }

    fn check(&self) {
        #[cfg(debug_assertions)]
        debug_assert_eq!(
            self.thread,
            std::thread::current().id(),
            "a one-thread table's count changed on another thread"
        );
    }
}

impl UnackedTable {
    /// A table for the runtime it is made on (see [`UnackedTable::one_thread`]).
    pub(super) fn for_this_runtime() -> UnackedTable {
        let one_thread = tokio::runtime::Handle::try_current()
            .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread);
        UnackedTable {
            one_thread: one_thread.then(Owner::current),
            ..UnackedTable::default()
        }
    }

    /// Adds `delta` to `count`, wrapping as atomic adds do (a release adds the negation).
    fn add(&self, count: &AtomicU32, delta: u32) {
        match &self.one_thread {
            Some(owner) => {
                owner.check();
                count.store(count.load(Relaxed).wrapping_add(delta), Relaxed);
            }
            None => {
                count.fetch_add(delta, SeqCst);
            }
        }
    }

    fn slot(&self, hash: u64) -> &AtomicU32 {
        // The high bits, apart from `epochs.rs`'s: the low ones pick slots in `recent`,
        // `leads` and `written`.
        &self.slots[(hash >> 40) as usize % SLOTS]
    }

    /// Asks the CPU to load the slot of the key with this hash, which its write will hold: a
    /// cache miss on nearly every SET of the 90/10 mix otherwise (four fifths of the samples
    /// perf put in the SET's quick path, at -P 16).
    pub(super) fn prefetch(&self, hash: u64) {
        crate::prefetch::read(self.slot(hash));
    }

    /// A write of the key with this hash is about to be invalidated and forwarded. `SeqCst`
    /// on several threads (on one, program order): a fill that completes under its map's
    /// lock either sees the hold, or completed before the write's first invalidation, which
    /// then removes its entry.
    fn hold(&self, hash: u64) {
        self.add(self.slot(hash), 1);
    }

    fn release(&self, hash: u64) {
        self.add(self.slot(hash), 1u32.wrapping_neg());
    }

    /// Whether a write of a key with this hash (or one sharing its slot), or of every key,
    /// is out.
    pub(super) fn held(&self, hash: u64) -> bool {
        self.slot(hash).load(SeqCst) != 0 || self.all.load(SeqCst) != 0
    }
}

/// The writes one batch (or one transaction, or one blocking command) holds: released once
/// its acknowledgement has been applied, or when it is dropped (the client gone, the
/// transaction discarded), so no slot stays held. With a cache started on a current-thread
/// runtime, holds are taken, released and dropped on that runtime's thread only (see
/// `UnackedTable::one_thread`): never hand one to another thread.
#[derive(Debug, Default)]
pub struct Unacked {
    table: Option<Arc<UnackedTable>>,
    hashes: Vec<u64>,
    /// Holds of every slot.
    all: u32,
}

impl Unacked {
    /// Holds the slot of `hash` in `table` until released.
    #[inline]
    pub(super) fn hold(&mut self, table: &Arc<UnackedTable>, hash: u64) {
        table.hold(hash);
        if self.table.is_none() {
            self.table = Some(table.clone());
            // A pipeline's worth: grown from nothing, it was reallocated three times.
            self.hashes.reserve(FIRST_HOLDS);
        }
        self.hashes.push(hash);
    }

    /// Holds every slot of `table` until released, as a write that may change every key.
    pub(super) fn hold_all(&mut self, table: &Arc<UnackedTable>) {
        table.add(&table.all, 1);
        if self.table.is_none() {
            self.table = Some(table.clone());
        }
        self.all += 1;
    }

    /// Releases every slot held, keeping the room for the next batch's.
    pub fn release(&mut self) {
        if let Some(table) = &self.table {
            self.hashes.drain(..).for_each(|h| table.release(h));
            if self.all > 0 {
                table.add(&table.all, std::mem::take(&mut self.all).wrapping_neg());
            }
        }
    }

    /// Takes over what `other` holds.
    pub fn append(&mut self, other: &mut Unacked) {
        if self.table.is_none() {
            self.table = other.table.clone();
        }
        self.hashes.append(&mut other.hashes);
        self.all += std::mem::take(&mut other.all);
    }

    /// Whether none is.
    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty() && self.all == 0
    }
}

impl Drop for Unacked {
    fn drop(&mut self) {
        self.release();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_slot_is_held_until_every_write_holding_it_is_released_or_dropped() {
        let table = Arc::new(UnackedTable::default());
        let (a, b) = (1u64 << 40, 2u64 << 40);
        let mut first = Unacked::default();
        first.hold(&table, a);
        first.hold(&table, a);
        let mut second = Unacked::default();
        second.hold(&table, b);
        assert!(table.held(a) && table.held(b) && !table.held(3 << 40));
        first.release();
        assert!(!table.held(a) && first.is_empty());
        // Handed over, then dropped with its new holder.
        first.append(&mut second);
        assert!(second.is_empty() && table.held(b));
        drop(second);
        assert!(table.held(b));
        drop(first);
        assert!(!table.held(b));
    }

    #[test]
    fn a_hold_of_every_slot_holds_any_key_until_released_or_dropped() {
        let table = Arc::new(UnackedTable::default());
        let mut all = Unacked::default();
        all.hold_all(&table);
        assert!(!all.is_empty());
        assert!((0..64u64).all(|i| table.held(i << 40)));
        all.release();
        assert!(all.is_empty() && !table.held(5 << 40));
        // Handed over with a key's hold, and dropped with its new holder.
        let mut other = Unacked::default();
        other.hold_all(&table);
        let mut holder = Unacked::default();
        holder.hold(&table, 1 << 40);
        holder.append(&mut other);
        assert!(other.is_empty());
        drop(other);
        assert!(table.held(7 << 40));
        drop(holder);
        assert!(!table.held(7 << 40) && !table.held(1 << 40));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_table_made_on_one_thread_counts_holds_the_same_way() {
        let table = Arc::new(UnackedTable::for_this_runtime());
        assert!(table.one_thread.is_some());
        let (a, b) = (1u64 << 40, 2u64 << 40);
        let mut first = Unacked::default();
        first.hold(&table, a);
        first.hold(&table, a);
        let mut second = Unacked::default();
        second.hold(&table, a);
        second.hold_all(&table);
        assert!(table.held(a) && table.held(b));
        second.release();
        assert!(table.held(a) && !table.held(b));
        drop(first);
        assert!(!table.held(a));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_table_made_on_several_threads_takes_locked_adds() {
        assert!(UnackedTable::for_this_runtime().one_thread.is_none());
        assert!(UnackedTable::default().one_thread.is_none());
    }
}
