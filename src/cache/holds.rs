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

use crate::upstream::UpstreamStatus;

/// While the cache hits one GET in this many or more, shared connections hold at
/// [`SERVING_BAR`].
const HOLD_RATE: u64 = 16;
/// The bar shared connections hold their writes at while the cache serves many GETs.
const SERVING_BAR: usize = 1;

/// Whether connections keep their own bar after a period in which the cache saw `gets` GETs
/// and served `served` of them: when it served under one in [`HOLD_RATE`] (where most
/// connections are cool, say), or saw none.
fn own_bar(gets: u64, served: u64) -> bool {
    gets == 0 || served.saturating_mul(HOLD_RATE) < gets
}

/// Caps the connections' bar at [`SERVING_BAR`], or lifts the cap, after a period in which
/// the cache saw `gets` GETs and served `served` of them (`served.rs`).
pub(super) fn follow(status: &UpstreamStatus, gets: u64, served: u64) {
    let own = own_bar(gets, served);
    status.cap_hold_bar(if own { None } else { Some(SERVING_BAR) });
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

    #[test]
    fn the_cap_follows_the_share_served() {
        let status = UpstreamStatus::default();
        follow(&status, 200, 100);
        assert_eq!(status.hold_bar(48), SERVING_BAR, "half the GETs served");
        follow(&status, 100, 0);
        assert_eq!(status.hold_bar(48), 48, "none served since");
    }
}
