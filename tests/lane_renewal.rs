//! The tracking lane renewed once Redis tracks, for it, many keys the cache no longer holds:
//! writes of those keys no longer send the cache invalidations, and a direct write still
//! reaches a key cached on the new lane.

mod common;

use std::time::Duration;

use common::{
    Deadline, RawClient, RedisServer, Stats, TestProxy, bulk, connect, encode, get_until,
    make_cached, reply_text, tracking_client_id,
};

const OK: &[u8] = b"+OK\r\n";
/// Keys to fill: Redis must track well over `RENEW_KEYS` of them.
const KEYS: usize = 16_000;
/// `[cache] lane_renew_keys` for the test.
const RENEW_KEYS: u64 = 8_192;

/// SETs `keys` to `value` on Redis directly, in pipelined chunks.
async fn preload(direct: &mut RawClient, keys: &[String], value: &[u8]) {
    for chunk in keys.chunks(1000) {
        let mut req = Vec::new();
        for k in chunk {
            req.extend(encode(&[b"SET", k.as_bytes(), value]));
        }
        let replies = direct.pipeline(&req, req.len(), chunk.len()).await;
        assert!(replies.iter().all(|r| r == OK), "preload failed");
    }
}

/// Reads each key four times in a row (a read led and joined: the key is counted above the
/// sketch's noise floor, which so many keys raise), then once (filled over the lane if
/// admitted) and once more (a hit, which keeps the connection looking its keys up).
async fn read_all(c: &mut RawClient, keys: &[String]) {
    for chunk in keys.chunks(250) {
        for times in [4, 1, 1] {
            let mut req = Vec::new();
            for k in chunk {
                for _ in 0..times {
                    req.extend(encode(&[b"GET", k.as_bytes()]));
                }
            }
            let replies = c.pipeline(&req, req.len(), times * chunk.len()).await;
            assert!(replies.iter().all(|r| r[0] == b'$'), "a GET failed");
        }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lane_that_tracks_many_keys_the_store_let_go_is_renewed() {
    let redis = RedisServer::start();
    let proxy = TestProxy::start_with(&redis.url(), |cfg| {
        cfg.cache.max_bytes = 1024 * 1024;
        cfg.cache.hot_threshold = 1;
        cfg.cache.lane_renew_keys = RENEW_KEYS;
        cfg.cache.max_age_ms = 1000;
        cfg.cache.refresh_beta = 0.0;
    })
    .await;
    let mut direct = connect(redis.addr()).await;
    let mut c = connect(proxy.addr).await;
    let small: Vec<String> = (0..KEYS).map(|i| format!("k:{i}")).collect();
    preload(&mut direct, &small, b"v").await;
    let lane = tracking_client_id(&mut direct).await;
    assert!(lane.is_some(), "no tracking lane on Redis");
    // Keys filled until Redis tracks more than the bar. The store holds hundreds of them
    // meanwhile, over one per 64 tracked: no renewal yet.
    let mut passes = 0;
    while tracked_on_redis(&mut direct).await < RENEW_KEYS * 3 / 2 {
        passes += 1;
        assert!(passes <= 8, "the keys were not filled");
        read_all(&mut c, &small).await;
    }
    let s = Stats::of(&mut c).await;
    assert_eq!(s.n("cache_lane_renewals"), 0, "renewed too soon: {:?}", s.0);
    assert!(s.n("cache_entries") > 200, "{:?}", s.0);
    // Every entry past `max_age_ms`: MGETs find them expired and drop them (an MGET's
    // misses fill nothing), and Redis still tracks the thousands of keys the store let go.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    for chunk in small.chunks(500) {
        let mut args: Vec<&[u8]> = vec![b"MGET"];
        args.extend(chunk.iter().map(|k| k.as_bytes()));
        assert_eq!(c.request(&args).await[0], b'*');
    }
    let s = Stats::wait(&mut c, "a renewal of the lane", |s| {
        s.n("cache_lane_renewals") == 1 && s.text("cache_tracking") == "on"
    })
    .await;
    eprintln!(
        "passes {passes} fills {} entries {} resets {}",
        s.n("cache_fills"),
        s.n("cache_entries"),
        s.n("cache_lane_resets")
    );
    assert_eq!(
        s.n("cache_lane_resets"),
        0,
        "a renewal is no fault: {:?}",
        s.0
    );
    let deadline = Deadline::new(Duration::from_secs(10), "the old lane to close");
    while tracking_client_id(&mut direct).await == lane {
        deadline.pause().await;
    }
    // A key cached on the new lane.
    assert_eq!(direct.cmd("SET fresh old").await, OK);
    make_cached(&mut c, "fresh", &bulk("old")).await;
    // Redis no longer sends the old connection's keys: direct writes of keys it tracked
    // for it invalidate nothing. Redis drops each from its table as it is written, so its
    // count falls: the keys were tracked.
    let before = tracked_on_redis(&mut direct).await;
    let invalidated = Stats::of(&mut c).await.n("cache_invalidations");
    for k in &small[..2000] {
        assert_eq!(direct.cmd(&format!("SET {k} new")).await, OK);
    }
    let after = tracked_on_redis(&mut direct).await;
    eprintln!("Redis tracked {before} keys, {after} after 2000 writes");
    assert!(after + 1000 <= before, "{before} → {after}");
    // Coherent on the new lane; its push comes after any the writes before made.
    assert_eq!(direct.cmd("SET fresh new").await, OK);
    let limit = Duration::from_secs(5);
    get_until(&mut c, "fresh", &bulk("new"), &[&bulk("old")], false, limit).await;
    let s = Stats::of(&mut c).await;
    assert_eq!(s.n("cache_invalidations"), invalidated + 1, "{:?}", s.0);
    assert_eq!(s.n("cache_lane_renewals"), 1, "{:?}", s.0);
    proxy.stop().await;
}
