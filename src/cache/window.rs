//! When the read sketch uses its long window (see `FrequencySketch::set_long`): while the
//! cache has served most GETs for a while and few keys are written, and not once either
//! stops.
//!
//! In the long window a key's counts outlive the 10 s tick that clears the keys read lately
//! (`lately.rs`), so a write to a key last read longer ago leaves its estimate: with at most
//! one key written per 64 GETs, few such writes come.

use std::sync::atomic::{AtomicU8, Ordering::Relaxed};

use super::bar::{LOWER_AT, RAISE_AT};

/// Looks in a row (see `served.rs`: 250 ms each) that must find most GETs served and few
/// written before the long window is taken: a load that the short window already serves,
/// not a burst of it.
const CALM_LOOKS: u8 = 8;
/// Most GETs served: at least one in this many. The bar's marks (`bar.rs`): the long window
/// is taken where the bar comes down, on a load the short window already serves, and never
/// on one whose GETs spread evenly over a large key space (about none served).
const SERVED_MOST: u64 = LOWER_AT;
/// The long window is left as soon as the cache serves fewer than one GET in this many: where
/// the bar goes back up, the load has changed.
const SERVED_LITTLE: u64 = RAISE_AT;
/// Few writes: at most one per this many GETs. A write resets its key's estimate and ends
/// its entry; where keys are read nine times per write (a 90/10 mix), the long window's
/// admissions were refilled more often than they served, and the mix ran at 0.62-0.67M
/// requests/s against 0.86-0.93M for 30 s after a read-only load.
const FEW_WRITES: u64 = 64;
/// The long window is left as soon as keys are written more than once per this many GETs.
const MANY_WRITES: u64 = 16;

/// Whether the long window may be taken, and the count of calm looks so far.
#[derive(Debug)]
pub(super) struct Window {
    allowed: bool,
    calm: AtomicU8,
}

impl Window {
    /// A window that moves to the long one only if `allowed` (`cache.long_window`).
    pub(super) fn new(allowed: bool) -> Window {
        Window {
            allowed,
            calm: AtomicU8::new(0),
        }
    }

    /// After a look that saw `gets` GETs, `served` of them served and `writes` keys written,
    /// with the long window in use or not (`long`): the window to use from now on.
    pub(super) fn follow(&self, long: bool, gets: u64, served: u64, writes: u64) -> bool {
        if !self.allowed {
            return false;
        }
        if gets == 0 {
            // Nothing to judge the share served by; writes alone (a write-only phase) end it.
            return long && writes == 0;
        }
        if long {
            let leave = served.saturating_mul(SERVED_LITTLE) < gets
                || writes.saturating_mul(MANY_WRITES) > gets;
            return !leave;
        }
        let calm =
            served.saturating_mul(SERVED_MOST) >= gets && writes.saturating_mul(FEW_WRITES) <= gets;
        let looks = if calm {
            self.calm.load(Relaxed).saturating_add(1)
        } else {
            0
        };
        if looks >= CALM_LOOKS {
            self.calm.store(0, Relaxed);
            return true;
        }
        self.calm.store(looks, Relaxed);
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_long_window_follows_only_a_calm_load_served_for_a_while() {
        let w = Window::new(true);
        for _ in 0..CALM_LOOKS - 1 {
            assert!(!w.follow(false, 1000, 600, 10));
        }
        assert!(!w.follow(false, 1000, 400, 10), "under half served");
        for _ in 0..CALM_LOOKS - 1 {
            assert!(
                !w.follow(false, 1000, 600, 10),
                "counted from the start again"
            );
        }
        assert!(!w.follow(false, 1000, 600, 20), "one write in 50 GETs");
        for _ in 0..CALM_LOOKS - 1 {
            assert!(!w.follow(false, 1000, 600, 10));
        }
        assert!(!w.follow(false, 0, 0, 0), "no GET: nothing to go by");
        assert!(w.follow(false, 1000, 600, 10), "calm for long enough");
    }

    #[test]
    fn the_long_window_is_left_at_once_when_writes_come_or_hits_go() {
        let w = Window::new(true);
        assert!(w.follow(true, 1000, 300, 60), "between the marks: kept");
        assert!(w.follow(true, 0, 0, 0), "no GET: kept");
        assert!(!w.follow(true, 0, 0, 5), "writes and no GET: left");
        assert!(!w.follow(true, 1000, 600, 70), "one write in 15 GETs");
        assert!(!w.follow(true, 1000, 240, 0), "under one GET in 4 served");
    }

    #[test]
    fn a_window_not_allowed_to_grow_never_does() {
        let w = Window::new(false);
        for _ in 0..CALM_LOOKS * 2 {
            assert!(!w.follow(false, 1000, 1000, 0));
        }
    }
}
