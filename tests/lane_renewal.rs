//! The tracking lane renewed once Redis tracks, for it, many keys the cache no longer holds:
//! writes of those keys no longer send the cache invalidations, and a direct write still
//! reaches a key cached on the new lane.

mod common;

use std::time::Duration;

use common::{
    RawClient, RedisServer, Stats, TestProxy, bulk, connect, encode, get_until, make_cached,
    reply_text, tracking_client_id,
};

const OK: &[u8] = b"+OK\r\n";
/// Keys filled: past the 65,536 keys tracked that a renewal needs at least.
const KEYS: usize = 72_000;
/// 1 KiB values in a 1 MiB store: it holds under 1,024 entries, one per 64 keys tracked.
const VALUE: usize = 1024;

/// Writes `KEYS` keys of `VALUE` bytes on Redis directly, in pipelined chunks.
async fn preload(direct: &mut RawClient) {
    let value = vec![b'v'; VALUE];
    for chunk in (0..KEYS).collect::<Vec<_>>().chunks(1000) {
        let mut req = Vec::new();
        for i in chunk {
            req.extend(encode(&[b"SET", format!("k:{i}").as_bytes(), &value]));
        }
        let replies = direct.pipeline(&req, req.len(), chunk.len()).await;
        assert!(replies.iter().all(|r| r == OK), "preload failed");
    }
}

/// Redis's count of keys it tracks for clients (`INFO stats`).
async fn tracked_on_redis(direct: &mut RawClient) -> u64 {
    let info = reply_text(&direct.cmd("INFO stats").await);
    info.lines()
        .find_map(|l| l.strip_prefix("tracking_total_keys:"))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(u64::MAX)
}

/// Reads every key as the test's comment says, in pipelined chunks.
async fn read_all(c: &mut RawClient) {
    for chunk in (0..KEYS).collect::<Vec<_>>().chunks(250) {
        for times in [4, 1, 1] {
            let mut req = Vec::new();
            for i in chunk {
                for _ in 0..times {
                    req.extend(encode(&[b"GET", format!("k:{i}").as_bytes()]));
                }
            }
            let replies = c.pipeline(&req, req.len(), times * chunk.len()).await;
            assert!(replies.iter().all(|r| r.len() > VALUE), "a GET failed");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lane_that_tracks_many_keys_the_store_let_go_is_renewed() {
    let redis = RedisServer::start();
    let proxy = TestProxy::start_with(&redis.url(), |cfg| {
        cfg.cache.max_bytes = 1024 * 1024;
        cfg.cache.hot_threshold = 1;
    })
    .await;
    let mut direct = connect(redis.addr()).await;
    let mut c = connect(proxy.addr).await;
    preload(&mut direct).await;
    let lane = tracking_client_id(&mut direct).await;
    // Each key read four times in a row (a read led and joined: the key is counted above
    // the sketch's noise floor, which so many keys raise), then once (filled over the lane)
    // and once more (a hit, which keeps the connection looking its keys up), while the
    // store's bound evicts all but the last thousand or so. Keys the sketch's halving let
    // fall under the bar are filled in a later pass.
    let mut passes = 0;
    while Stats::of(&mut c).await.n("cache_fills") < 70_000 {
        passes += 1;
        assert!(passes <= 6, "the keys were not filled");
        read_all(&mut c).await;
    }
    let s = Stats::wait(&mut c, "a renewal of the lane", |s| {
        s.n("cache_lane_renewals") >= 1 && s.text("cache_tracking") == "on"
    })
    .await;
    eprintln!(
        "passes {passes} fills {} entries {} renewals {} resets {}",
        s.n("cache_fills"),
        s.n("cache_entries"),
        s.n("cache_lane_renewals"),
        s.n("cache_lane_resets")
    );
    assert!(s.n("cache_fills") >= 65_536, "{:?}", s.0);
    assert_eq!(
        s.n("cache_lane_resets"),
        0,
        "a renewal is no fault: {:?}",
        s.0
    );
    let renewed = tracking_client_id(&mut direct).await;
    assert!(
        renewed.is_some() && renewed != lane,
        "{lane:?} → {renewed:?}"
    );
    // A key cached on the new lane.
    assert_eq!(direct.cmd("SET fresh old").await, OK);
    make_cached(&mut c, "fresh", &bulk("old")).await;
    // Redis no longer sends the old connection's keys: direct writes of keys filled before
    // the renewal, and not read since, invalidate nothing. Redis drops them from its table
    // as they are written (`tracking_total_keys` falls).
    let before = tracked_on_redis(&mut direct).await;
    let invalidated = Stats::of(&mut c).await.n("cache_invalidations");
    for i in 0..1000 {
        assert_eq!(direct.cmd(&format!("SET k:{i} new")).await, OK);
    }
    let after = tracked_on_redis(&mut direct).await;
    eprintln!("Redis tracked {before} keys, {after} after 1000 writes");
    assert!(
        before > 1000 && after <= before - 1000,
        "{before} → {after}"
    );
    // Coherent on the new lane; its push comes after any the writes before made.
    assert_eq!(direct.cmd("SET fresh new").await, OK);
    let limit = Duration::from_secs(5);
    get_until(&mut c, "fresh", &bulk("new"), &[&bulk("old")], false, limit).await;
    let s = Stats::of(&mut c).await;
    assert_eq!(s.n("cache_invalidations"), invalidated + 1, "{:?}", s.0);
    proxy.stop().await;
}
