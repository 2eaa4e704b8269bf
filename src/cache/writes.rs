//! What a write through corral does to the cache: its keys invalidated before it is
//! forwarded, held while it is out (`unacked.rs`), and invalidated again once acknowledged.

use super::{Cache, Unacked};

impl Cache {
    /// A write through corral to `key` is about to be forwarded: counted against the key's
    /// admission (see `Admission::record_write`), held in `unacked` until its
    /// acknowledgement has been applied (`unacked.rs`), and the key invalidated.
    pub fn write_coming(&self, key: &[u8], unacked: &mut Unacked) {
        self.write_coming_hashed(key, self.hash(key), unacked);
    }

    /// [`Cache::write_coming`] of a key whose [`Cache::hash`] is `hash`.
    // Always: called, its prologue and epilogue cost 20 instructions per SET.
    #[inline(always)]
    pub fn write_coming_hashed(&self, key: &[u8], hash: u64, unacked: &mut Unacked) {
        let core = &self.core;
        core.admission.record_write(hash);
        // Before the invalidation: a read that fills the store after it sees the hold.
        unacked.hold(&core.unacked, hash);
        if core.invalidate_hashed(key, hash, false) {
            core.stats.local_invalidations.inc();
        }
    }

    /// A write through corral that may change every key (FLUSHALL, SWAPDB, a transaction
    /// naming more keys than corral keeps) is about to be forwarded: every key held in
    /// `unacked` until its acknowledgement has been applied (a read that ran before it must
    /// not fill the store after a client read what it left), and the cache flushed.
    pub fn write_coming_all(&self, unacked: &mut Unacked) {
        unacked.hold_all(&self.core.unacked);
        self.flush();
    }

    /// A mark to take before a write's first invalidation ([`Cache::write_coming`]), for
    /// its second ([`Cache::invalidate_for_write`]).
    pub fn write_mark(&self) -> u64 {
        self.core.epochs.mark()
    }

    /// Whether a read may have been registered since `mark`: if not, no key written after
    /// it needs [`Cache::invalidate_for_write`].
    pub fn reads_since(&self, mark: u64) -> bool {
        self.core.epochs.any_since(mark)
    }

    /// A write through corral to `key` was acknowledged: its key is invalidated again if a
    /// read of it may have been registered since `mark` (see `epochs.rs`). A mark of 0
    /// invalidates every key any read was ever registered for. The write's hold is released
    /// after this, never before: a read it unlinks must not be joined meanwhile.
    pub fn invalidate_for_write(&self, key: &[u8], mark: u64) {
        if self.core.invalidate_acked(key, mark) {
            self.core.stats.local_invalidations.inc();
        }
    }
}
