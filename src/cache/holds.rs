//! Whether shared upstream connections hold writes (`ConnSettings::hold_at`), by what the
//! cache serves. Holding gathers the requests of more clients into each write, which pays
//! while corral forwards nearly every GET: GETs of cold keys, 50 clients 16 deep, went from
//! 0.60-0.68M to 0.74-0.75M requests/s with the cache on. Where the cache served many GETs
//! (Zipf GET, 90/10 mix) the same hold cost 3-12% of the throughput, so it is off while it
//! does.
//!
//! Only hits count as served: a hit is answered at once unless a held write holds up the
//! reply it rides behind, where a joined read waits for Redis like a forwarded one. On the
//! 90/10 mix, whose joins (6% of GETs) and hits (3%) together passed the bar, holding
//! writes again took corral from 0.52-0.55M to 0.63-0.71M requests/s (0.78-0.85M with
//! `--no-cache` in the same rounds).

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::stats::Stats;
use crate::upstream::UpstreamStatus;

/// How often the share of GETs served is looked at.
const EVERY: Duration = Duration::from_millis(250);
/// Writes may be held while the cache hits under one GET in this many.
const HOLD_RATE: u64 = 16;

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

/// Whether writes may be held after a period in which the cache saw `gets` GETs and served
/// `served` of them: when it served under one in [`HOLD_RATE`] (where most connections are
/// cool, say), or saw none.
fn may_hold(gets: u64, served: u64) -> bool {
    gets == 0 || served.saturating_mul(HOLD_RATE) < gets
}

/// Turns holding on and off as the cache's share of GETs served (`seen`) moves, until
/// shutdown.
pub(super) async fn steer(
    seen: impl Fn() -> Seen,
    status: Arc<UpstreamStatus>,
    shutdown: CancellationToken,
) {
    let mut tick = tokio::time::interval(EVERY);
    let mut last = Seen::default();
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let now = seen();
                let on = may_hold(now.gets - last.gets, now.served - last.served);
                status.set_holds_writes(on);
                last = now;
            }
            () = shutdown.cancelled() => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_are_held_only_while_the_cache_serves_few_gets() {
        assert!(may_hold(0, 0), "no GETs: nothing to lose");
        assert!(may_hold(1000, 0));
        assert!(may_hold(1600, 99));
        assert!(!may_hold(1600, 100), "one in 16 served");
        assert!(!may_hold(1000, 370), "the 90/10 mix");
        assert!(!may_hold(1000, 700), "Zipf GET");
    }

    /// On paused time: each sleep lets exactly the ticks due run.
    #[tokio::test(start_paused = true)]
    async fn the_switch_follows_the_counters() {
        let stats = Arc::new(Stats::default());
        let status = Arc::new(UpstreamStatus::default());
        let shutdown = CancellationToken::new();
        let counted = stats.clone();
        let task = tokio::spawn(steer(
            move || Seen::of(&counted),
            status.clone(),
            shutdown.clone(),
        ));
        for _ in 0..3 {
            stats.misses.inc_by(100);
            stats.hits.inc_by(100);
            tokio::time::sleep(EVERY).await;
        }
        assert!(!status.holds_writes(), "half the GETs served");
        for _ in 0..3 {
            stats.misses.inc_by(100);
            tokio::time::sleep(EVERY).await;
        }
        assert!(status.holds_writes(), "none served since");
        for _ in 0..3 {
            stats.misses.inc_by(100);
            stats.coalesced.inc_by(60);
            tokio::time::sleep(EVERY).await;
        }
        assert!(status.holds_writes(), "joined reads wait for Redis too");
        shutdown.cancel();
        task.await.unwrap();
    }
}
