//! The cache's share of GETs served, looked at every [`EVERY`]: what the shared connections'
//! hold (`holds.rs`), the admission bar (`bar.rs`) and the read sketch's window
//! (`window.rs`) follow.

use std::time::Duration;

use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;

use super::stats::Stats;

/// How often the share of GETs served is looked at.
const EVERY: Duration = Duration::from_millis(250);

/// GETs looked at (or skipped) and GETs served from the store, counted since start.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Seen {
    gets: u64,
    served: u64,
}

impl Seen {
    /// What the counters say now.
    pub(super) fn of(stats: &Stats) -> Seen {
        let hits = stats.hits.get();
        Seen {
            // Every GET not served locally is a miss, joined reads included.
            gets: hits + stats.misses.get() + stats.skipped.get(),
            served: hits,
        }
    }
}

/// Every [`EVERY`] until shutdown, tells `react` how many GETs the cache saw since the last
/// look and how many of them it served. Only hits count as served: a joined read waits for
/// Redis like a forwarded one.
pub(super) async fn watch(
    seen: impl Fn() -> Seen,
    mut react: impl FnMut(u64, u64),
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(EVERY);
    // After a stall (a busy worker thread), one look takes in all that happened meanwhile:
    // in bursts, the looks right after it would each see a few GETs, and move the bar on them.
    tick.set_missed_tick_behavior(MissedTickBehavior::Skip);
    let mut last = Seen::default();
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let now = seen();
                react(now.gets - last.gets, now.served - last.served);
                last = now;
            }
            () = shutdown.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    type Told = Arc<Mutex<Vec<(u64, u64)>>>;

    /// A `watch` of fresh stats, noting what each look is told.
    fn watched() -> (
        Arc<Stats>,
        Told,
        CancellationToken,
        tokio::task::JoinHandle<()>,
    ) {
        let stats = Arc::new(Stats::default());
        let told = Told::default();
        let shutdown = CancellationToken::new();
        let (counted, noted) = (stats.clone(), told.clone());
        let task = tokio::spawn(watch(
            move || Seen::of(&counted),
            move |gets, served| noted.lock().unwrap().push((gets, served)),
            shutdown.clone(),
        ));
        (stats, told, shutdown, task)
    }

    /// On paused time: each sleep lets exactly the ticks due run.
    #[tokio::test(start_paused = true)]
    async fn each_look_is_told_what_happened_since_the_last() {
        let (stats, told, shutdown, task) = watched();
        tokio::time::sleep(EVERY / 2).await;
        stats.misses.inc_by(100);
        stats.hits.inc_by(50);
        stats.skipped.inc_by(10);
        tokio::time::sleep(EVERY).await;
        stats.coalesced.inc_by(60);
        stats.misses.inc_by(60);
        tokio::time::sleep(EVERY).await;
        shutdown.cancel();
        task.await.unwrap();
        let told = told.lock().unwrap().clone();
        assert_eq!(
            told,
            [(0, 0), (160, 50), (60, 0)],
            "joined reads are not served"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn after_a_stall_one_look_takes_in_all_of_it() {
        let (stats, told, shutdown, task) = watched();
        tokio::time::sleep(EVERY / 2).await;
        stats.misses.inc_by(100);
        stats.hits.inc_by(300);
        // Three looks' time passes at once, as while the thread was busy.
        tokio::time::advance(EVERY * 3).await;
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        shutdown.cancel();
        task.await.unwrap();
        let told = told.lock().unwrap().clone();
        assert_eq!(told, [(0, 0), (400, 300)], "no looks at nothing in a row");
    }
}
