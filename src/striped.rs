//! A counter that threads increment without sharing a cache line: one stripe per thread
//! (threads beyond the first `STRIPES - 1` share the last one), summed when read.
//!
//! Counters bumped on every request (the cache's hits and misses, commands received) were
//! single atomics: each increment on one core took the line from the other, and those
//! locked adds cost about a tenth of what the cache added to a cold GET. A thread with a
//! stripe of its own adds without a lock, too: a locked add waits for every store before it
//! to complete, cache misses included. Reads (a scrape, INFO) are rare and may sum.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use prometheus_client::metrics::counter::{Atomic, Counter};

/// Stripes per counter: more than the worker threads of a usual deployment.
const STRIPES: usize = 16;
/// The stripe every thread after the first `STRIPES - 1` shares.
const SHARED: usize = STRIPES - 1;

/// Which stripe threads are given next.
static NEXT: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    static STRIPE: usize = NEXT.fetch_add(1, Ordering::Relaxed).min(SHARED);
}

/// One stripe, alone on its cache lines (two, as the CPU may fetch lines in pairs).
#[derive(Debug, Default)]
#[repr(align(128))]
pub(crate) struct Stripe(pub(crate) AtomicU64);

/// A stripe for each thread: index it with [`own_stripe`], or add to it with [`add`].
pub(crate) type Stripes = Box<[Stripe; STRIPES]>;

/// The calling thread's stripe index. The first `STRIPES - 1` threads to ask have one of
/// their own, which no other thread writes; the rest share the last.
fn stripe() -> usize {
    STRIPE.with(|s| *s)
}

/// The calling thread's stripe index if no other thread writes that stripe.
pub(crate) fn own_stripe() -> Option<usize> {
    Some(stripe()).filter(|&i| i != SHARED)
}

/// Adds `v` to the calling thread's stripe of `stripes`, returning its previous value.
pub(crate) fn add(stripes: &Stripes, v: u64) -> u64 {
    let Some(i) = own_stripe() else {
        return stripes[SHARED].0.fetch_add(v, Ordering::Relaxed);
    };
    // Only this thread writes its stripe, so a plain load and store lose nothing.
    let cell = &stripes[i].0;
    let old = cell.load(Ordering::Relaxed);
    cell.store(old.wrapping_add(v), Ordering::Relaxed);
    old
}

/// The striped counter. As a [`prometheus_client`] counter's atomic, `inc` and `inc_by`
/// return the calling thread's stripe's previous value, not the total: nothing reads it.
#[derive(Debug, Default)]
pub struct Striped(Stripes);

impl Atomic<u64> for Striped {
    fn inc(&self) -> u64 {
        self.inc_by(1)
    }

    fn inc_by(&self, v: u64) -> u64 {
        add(&self.0, v)
    }

    fn get(&self) -> u64 {
        self.0.iter().map(|s| s.0.load(Ordering::Relaxed)).sum()
    }
}

/// A Prometheus counter over a [`Striped`] atomic.
pub type StripedCounter = Counter<u64, Striped>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn increments_from_many_threads_all_count() {
        let c = StripedCounter::default();
        std::thread::scope(|s| {
            for _ in 0..(STRIPES + 3) {
                s.spawn(|| {
                    for _ in 0..1000 {
                        c.inc();
                    }
                    c.inc_by(5);
                });
            }
        });
        assert_eq!(c.get(), (STRIPES as u64 + 3) * 1005);
    }
}
