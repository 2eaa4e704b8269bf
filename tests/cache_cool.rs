//! A connection that reads mostly cold keys (a uniform key space, say) becomes cool: its
//! GETs of keys the cache has nothing of are forwarded uncounted, bar a sample. These tests
//! check what must not change for it: it still hits cached keys, joins reads in flight, and
//! becomes warm again once enough of its GETs hit.

mod common;

use std::time::{Duration, Instant};

use common::*;
use tokio::task::JoinSet;

const NIL: &[u8] = b"$-1\r\n";
/// More GETs than the window over which a connection's served share is judged (1024).
const COOLING_GETS: usize = 1500;
/// A window of GETs is 1,024: three of them, with a hit in four, hold at least two whole
/// windows with enough hits (to turn warm, and to stay so).
const WARMING_GETS: usize = 3 * 1024;

/// Sends `n` GETs of distinct keys that do not exist, in one pipeline; every reply is nil.
async fn cold_gets(c: &mut RawClient, tag: &str, n: usize) {
    let mut reqs = Vec::new();
    for i in 0..n {
        reqs.extend(encode(&[b"GET", format!("cold:{tag}:{i}").as_bytes()]));
    }
    let replies = c.pipeline(&reqs, 64 * 1024, n).await;
    assert!(replies.iter().all(|r| r == NIL), "cold GETs answer nil");
}

/// Sends `n` GETs in one pipeline, one in `every` of `hot` (whose value is `value`), the
/// rest of distinct keys that do not exist.
async fn mixed_gets(c: &mut RawClient, tag: &str, hot: &str, value: &[u8], every: usize, n: usize) {
    let mut reqs = Vec::new();
    for i in 0..n {
        let key = match i % every {
            0 => hot.to_string(),
            _ => format!("cold:{tag}:{i}"),
        };
        reqs.extend(encode(&[b"GET", key.as_bytes()]));
    }
    let replies = c.pipeline(&reqs, 64 * 1024, n).await;
    for (i, r) in replies.iter().enumerate() {
        let want = if i % every == 0 { value } else { NIL };
        assert_eq!(r, want, "GET {i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cool_connection_skips_cold_keys_and_still_hits_cached_ones() {
    let (_redis, proxy, mut direct, mut warm) = start().await;
    let mut cool = connect(proxy.addr).await;
    cold_gets(&mut cool, "a", COOLING_GETS).await;
    let before = Stats::of(&mut cool).await;
    assert!(
        before.n("cache_skipped") > 0,
        "{COOLING_GETS} cold GETs skipped none: {:?}",
        before.0
    );
    // The skipped GETs are not counted as lookups.
    assert!(before.n("cache_misses") < COOLING_GETS as u64);

    // More cold GETs: all but about one in sixteen are skipped.
    cold_gets(&mut cool, "b", 1000).await;
    let after = Stats::of(&mut cool).await;
    let skipped = after.n("cache_skipped") - before.n("cache_skipped");
    let looked_up = after.n("cache_misses") - before.n("cache_misses");
    assert_eq!(skipped + looked_up, 1000, "{:?}", after.0);
    assert!(skipped >= 800, "only {skipped} of 1000 cold GETs skipped");

    // A key another client made hot is a hit for the cool connection too.
    assert_eq!(direct.cmd("SET hot v").await, b"+OK\r\n");
    make_cached(&mut warm, "hot", b"$1\r\nv\r\n").await;
    let hits = stat_n(&mut cool, "cache_hits").await;
    assert_eq!(get(&mut cool, "hot").await, b"$1\r\nv\r\n");
    assert_eq!(stat_n(&mut cool, "cache_hits").await, hits + 1);

    // A hit now and then leaves it cool: its cold GETs are still skipped, bar a sample.
    let before = Stats::of(&mut cool).await;
    cold_gets(&mut cool, "c", 100).await;
    let after = Stats::of(&mut cool).await;
    assert!(
        after.n("cache_skipped") - before.n("cache_skipped") >= 60,
        "{:?}",
        after.0
    );

    // Windows of GETs one in four of which hit make it warm, and keep it so: every cold GET
    // is then looked up.
    mixed_gets(&mut cool, "d", "hot", b"$1\r\nv\r\n", 4, WARMING_GETS).await;
    let before = Stats::of(&mut cool).await;
    cold_gets(&mut cool, "e", 100).await;
    let after = Stats::of(&mut cool).await;
    assert_eq!(after.n("cache_skipped"), before.n("cache_skipped"));
    assert_eq!(after.n("cache_misses") - before.n("cache_misses"), 100);

    // A write directly on Redis still reaches the cool connection's next read.
    assert_eq!(direct.cmd("SET hot w").await, b"+OK\r\n");
    get_until(
        &mut cool,
        "hot",
        b"$1\r\nw\r\n",
        &[b"$1\r\nv\r\n"],
        false,
        Duration::from_secs(5),
    )
    .await;
    proxy.stop().await;
}

/// A read another client leads is joined by cool connections' GETs of its key: a key with a
/// read in flight is never skipped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cool_connections_join_a_read_in_flight() {
    const PAUSE_MS: u64 = 1000;
    let (_redis, proxy, mut direct, mut admin) = start().await;
    let mut cool = Vec::new();
    for i in 0..20 {
        let mut c = connect(proxy.addr).await;
        cold_gets(&mut c, &i.to_string(), COOLING_GETS).await;
        cool.push(c);
    }
    let mut leader = connect(proxy.addr).await;
    for attempt in 0..3 {
        let key = format!("joined:{attempt}");
        assert_eq!(direct.cmd(&format!("SET {key} v")).await, b"+OK\r\n");
        assert_eq!(direct.cmd("CONFIG RESETSTAT").await, b"+OK\r\n");
        let before = Stats::of(&mut admin).await;
        let pause = format!("CLIENT PAUSE {PAUSE_MS} ALL");
        assert_eq!(direct.cmd(&pause).await, b"+OK\r\n");
        let paused = Instant::now();
        // Two GETs in one round: the first is forwarded as a cold read, the second (a key
        // read again) leads a read others may join, which makes the key present.
        let req = encode(&[b"GET", key.as_bytes()]);
        leader.send(&[req.clone(), req].concat()).await;
        Stats::wait(&mut admin, "the leading GETs", |s| {
            s.n("cache_misses") >= before.n("cache_misses") + 2
        })
        .await;
        let mut tasks = JoinSet::new();
        for mut c in cool.drain(..) {
            let key = key.clone();
            tasks.spawn(async move {
                let got = get(&mut c, &key).await;
                (c, got)
            });
        }
        let n = tasks.len() as u64;
        let after = Stats::wait(&mut admin, "corral to receive every GET", |s| {
            s.n("cache_misses") + s.n("cache_skipped")
                >= before.n("cache_misses") + before.n("cache_skipped") + 2 + n
        })
        .await;
        let in_time = paused.elapsed() < Duration::from_millis(PAUSE_MS * 8 / 10);
        while let Some(r) = tasks.join_next().await {
            let (c, got) = r.expect("cool GET task");
            assert_eq!(got, b"$1\r\nv\r\n", "GET {key}");
            cool.push(c);
        }
        for _ in 0..2 {
            assert_eq!(
                leader.read_reply().await,
                b"$1\r\nv\r\n",
                "leader's GET {key}"
            );
        }
        if !in_time {
            eprintln!("{key}: GETs not all sent within the pause, retrying");
            continue;
        }
        // The leader's first GET leads too if the key's count is clear of the noise:
        // then its second joins it.
        let calls = redis_get_calls(&mut direct).await;
        assert!((1..=2).contains(&calls), "{calls} GETs reached Redis");
        let coalesced = after.n("cache_coalesced") - before.n("cache_coalesced");
        assert_eq!(
            coalesced,
            n + 2 - calls,
            "every cool GET joined: {:?}",
            after.0
        );
        assert_eq!(after.n("cache_skipped"), before.n("cache_skipped"));
        proxy.stop().await;
        return;
    }
    panic!("could not send the GETs within {PAUSE_MS} ms in 3 tries");
}

/// Shared connections hold writes at their own bar (`upstream.hold_writes_at`) while the cache
/// serves few GETs, and at a bar of one request out while it serves many; INFO shows the bar
/// in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_are_held_at_a_lower_bar_while_the_cache_serves_many_gets() {
    const FIELD: &str = "upstream_hold_writes_at";
    let (_redis, proxy, mut direct, mut c) = start().await;
    assert_eq!(info_field(&mut c, FIELD).await, "48", "nothing served yet");
    direct.cmd("SET hot v").await;
    make_cached(&mut c, "hot", b"$1\r\nv\r\n").await;
    let hits: Vec<u8> = (0..200).flat_map(|_| encode(&[b"GET", b"hot"])).collect();
    let deadline = Instant::now() + Duration::from_secs(10);
    while info_field(&mut c, FIELD).await != "1" {
        assert!(Instant::now() < deadline, "the bar never came down");
        c.pipeline(&hits, 64 * 1024, 200).await;
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut round = 0;
    while info_field(&mut c, FIELD).await != "48" {
        assert!(Instant::now() < deadline, "the own bar never came back");
        cold_gets(&mut c, &round.to_string(), 500).await;
        round += 1;
    }
    proxy.stop().await;
    // Without the cache, and with the bar set to 0.
    let redis = RedisServer::start();
    for (cache, bar, want) in [(false, None, "48"), (true, Some(0), "0")] {
        let proxy = TestProxy::start_with(&redis.url(), |cfg| {
            cfg.cache.enabled = cache;
            cfg.upstream.hold_writes_at = bar;
        })
        .await;
        let mut c = connect(proxy.addr).await;
        assert_eq!(info_field(&mut c, FIELD).await, want);
        proxy.stop().await;
    }
}
