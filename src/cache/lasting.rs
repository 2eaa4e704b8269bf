//! Whether the entries the cache fills lately last: how a connection whose GETs start fills
//! is told to be reading a new set of keys the cache will hold (a restart, a new working
//! set), where counting all its GETs gets them cached sooner, from one reading keys that
//! writes keep taking back out (`churn.rs`), where it only refills them more often.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::Relaxed};
use std::time::Duration;

/// How often the counts are looked at: the slow start this shortens lasts seconds, and a
/// change of workload shows in writes within a few hundred milliseconds.
pub(super) const LOOK: Duration = Duration::from_millis(250);

/// Tracked fills started and entries a write ended young, since the last look.
#[derive(Debug)]
pub(super) struct Lasting {
    fills: AtomicU32,
    young: AtomicU32,
    /// What the last look with fills found. An empty cache's fills are taken to last.
    last: AtomicBool,
}

impl Default for Lasting {
    fn default() -> Self {
        Lasting {
            fills: AtomicU32::new(0),
            young: AtomicU32::new(0),
            last: AtomicBool::new(true),
        }
    }
}

impl Lasting {
    /// A tracked fill started; returns whether fills lately last.
    pub(super) fn filled(&self) -> bool {
        self.fills.fetch_add(1, Relaxed);
        self.last()
    }

    /// Whether fills lately last, as the last look with fills found.
    pub(super) fn last(&self) -> bool {
        self.last.load(Relaxed)
    }

    /// A write ended an entry before it repaid its fill (`churn::PAYS`).
    pub(super) fn ended_young(&self) {
        self.young.fetch_add(1, Relaxed);
    }

    /// Fills last while writes end young fewer than half as many entries as fills start. A
    /// period with no fill leaves the answer as it was.
    pub(super) fn look(&self) {
        let fills = self.fills.swap(0, Relaxed);
        let young = self.young.swap(0, Relaxed);
        if fills > 0 {
            self.last
                .store(u64::from(young) * 2 < u64::from(fills), Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fills_last_until_writes_end_half_of_them_young() {
        let l = Lasting::default();
        assert!(l.last.load(Relaxed), "an empty cache's fills last");
        for _ in 0..11 {
            l.filled();
        }
        for _ in 0..6 {
            l.ended_young();
        }
        l.look();
        assert!(!l.last.load(Relaxed), "6 of 11 ended young");
        l.look();
        assert!(
            !l.last.load(Relaxed),
            "a period with no fill keeps the answer"
        );
        for _ in 0..4 {
            l.filled();
        }
        l.ended_young();
        l.look();
        assert!(l.last.load(Relaxed), "1 of 4 ended young");
    }
}
