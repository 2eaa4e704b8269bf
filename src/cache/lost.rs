//! Keys whose tracked fills were in flight when their lane was lost, and when: which of them
//! is likely what broke it.
//!
//! A value over Redis's `client-output-buffer-limit` closes the connection its reply is on.
//! Filled over the lane again at its next miss, it would close the lane, and flush the
//! cache, each time. But a lane is also lost with many fills in flight for reasons of its
//! own (Redis restarted, the connection was killed), and shutting all their keys out of the
//! cache would leave the hottest keys uncached for a while after each restart. A key whose
//! fill was lost with a lane twice within [`REMEMBER`] is taken for the cause: it costs one
//! more reset to find, and a restart shuts nothing out.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::{Duration, Instant};

/// Slots, by key hash: 32 KiB. Two keys sharing one only makes a lost fill of one count
/// against the other.
const SLOTS: usize = 4096;
/// How long a lost fill counts against its key.
pub(super) const REMEMBER: Duration = Duration::from_secs(60);

/// When each slot's key last had a fill lost with its lane: milliseconds since `base`,
/// plus one (0: never).
#[derive(Debug)]
pub(super) struct LostFills {
    slots: Box<[AtomicU64]>,
    base: Instant,
}

impl Default for LostFills {
    fn default() -> Self {
        LostFills {
            slots: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
            base: Instant::now(),
        }
    }
}

impl LostFills {
    /// A fill of the key with this hash was lost with its lane, at `now`: returns whether a
    /// fill of it (or of a key in its slot) was lost with one before, within [`REMEMBER`].
    pub(super) fn lost(&self, hash: u64, now: Instant) -> bool {
        let at = now.saturating_duration_since(self.base).as_millis() as u64 + 1;
        let before = self.slots[(hash >> 20) as usize % SLOTS].swap(at, Relaxed);
        before != 0 && at.saturating_sub(before) <= REMEMBER.as_millis() as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_counts_once_lost_twice_within_the_window() {
        let lost = LostFills::default();
        let t = Instant::now();
        let (a, b) = (1u64 << 20, 2u64 << 20);
        assert!(!lost.lost(a, t), "a first loss");
        assert!(!lost.lost(b, t + Duration::from_secs(1)), "another key");
        assert!(lost.lost(a, t + Duration::from_secs(2)), "a second loss");
        // Past the window, a loss counts as a first again.
        assert!(!lost.lost(b, t + Duration::from_secs(1) + REMEMBER * 2));
    }
}
