//! How much shared upstream connections hold writes (`ConnSettings::hold_at`), by what the
//! cache serves. Holding gathers the requests of more clients into each write: one write and
//! one read, for corral and for Redis, where each client's round would have made its own.
//! While corral forwards nearly every GET the connection's own bar (48 requests out) pays:
//! GETs of cold keys, 50 clients 16 deep, went from 0.60-0.68M to 0.74-0.75M requests/s with
//! the cache on.
//!
//! While the cache hits many GETs, a round sends Redis only its misses, a connection seldom
//! has 48 requests out, and each round's few misses went out on their own. With Zipf GETs 16
//! deep that took one upstream write per 42 client requests (against one per 250 with
//! `--no-cache`), four times the `epoll_wait`s, and corral's CPU per request to 1.4-1.7x
//! `--no-cache`'s. So while the cache hits one GET in [`HOLD_RATE`] or more, every
//! shared connection holds at [`SERVING_BAR`] instead: a write waits while any request
//! written before it is unanswered.
//!
//! Only hits count as served: a joined read waits for Redis like a forwarded one.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::stats::Stats;
use crate::upstream::UpstreamStatus;

/// How often the share of GETs served is looked at.
const EVERY: Duration = Duration::from_millis(250);
/// While the cache hits one GET in this many or more, shared connections hold at
/// [`SERVING_BAR`].
const HOLD_RATE: u64 = 16;
/// The bar shared connections hold their writes at while the cache serves many GETs.
const SERVING_BAR: usize = 1;

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

/// Whether connections keep their own bar after a period in which the cache saw `gets` GETs
/// and served `served` of them: when it served under one in [`HOLD_RATE`] (where most
/// connections are cool, say), or saw none.
fn own_bar(gets: u64, served: u64) -> bool {
    gets == 0 || served.saturating_mul(HOLD_RATE) < gets
}

/// Caps the connections' bar at [`SERVING_BAR`] and lifts the cap as the cache's share of
/// GETs served (`seen`) moves, until shutdown.
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
                let own = own_bar(now.gets - last.gets, now.served - last.served);
                status.cap_hold_bar(if own { None } else { Some(SERVING_BAR) });
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
    fn the_own_bar_holds_only_while_the_cache_serves_few_gets() {
        assert!(own_bar(0, 0), "no GETs");
        assert!(own_bar(1000, 0));
        assert!(own_bar(1600, 99));
        assert!(!own_bar(1600, 100), "one in 16 served");
        assert!(!own_bar(1000, 370), "the 90/10 mix");
        assert!(!own_bar(1000, 700), "Zipf GET");
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
        assert_eq!(status.hold_bar(48), SERVING_BAR, "half the GETs served");
        for _ in 0..3 {
            stats.misses.inc_by(100);
            tokio::time::sleep(EVERY).await;
        }
        assert_eq!(status.hold_bar(48), 48, "none served since");
        for _ in 0..3 {
            stats.misses.inc_by(100);
            stats.coalesced.inc_by(60);
            tokio::time::sleep(EVERY).await;
        }
        assert_eq!(status.hold_bar(48), 48, "joined reads wait for Redis too");
        shutdown.cancel();
        task.await.unwrap();
    }
}
