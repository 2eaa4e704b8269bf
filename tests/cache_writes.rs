//! The local cache against writes made directly on Redis (DESIGN.md R3): a direct write,
//! expiry, flushes, an upstream restart, a killed tracking connection, an overflowing
//! tracking table, SWAPDB, scripts writing undeclared keys.
//!
//! Latencies are measured and printed (run with `--nocapture`), never asserted.

mod common;

use std::time::{Duration, Instant};

use common::*;

const OK: &[u8] = b"+OK\r\n";
const NIL: &[u8] = b"$-1\r\n";

// ---- 3. writes made directly on Redis ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_write_replaces_a_cached_value() {
    let (_redis, proxy, mut direct, mut c) = start().await;
    assert_eq!(direct.cmd("SET k old").await, OK);
    make_cached(&mut c, "k", &bulk("old")).await;
    // Repeated GETs are served locally.
    let hits = Stats::of(&mut c).await.n("cache_hits");
    stays(&mut c, "k", &bulk("old"), 20).await;
    assert!(Stats::of(&mut c).await.n("cache_hits") >= hits + 20);

    assert_eq!(direct.cmd("SET k new").await, OK);
    let (took, stale) = get_until(
        &mut c,
        "k",
        &bulk("new"),
        &[&bulk("old")],
        false,
        Duration::from_secs(2),
    )
    .await;
    eprintln!("direct SET visible through corral after {took:?} ({stale} stale GETs)");
    stays(&mut c, "k", &bulk("new"), 1000).await;
    proxy.stop().await;
}

/// Write acked directly by Redis → first GET through corral that returns the new value,
/// 200 times on a freshly cached key each time. Prints p50/p99; asserts only correctness.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidation_latency_of_direct_writes() {
    let (_redis, proxy, mut direct, mut c) = start().await;
    let mut lat = Vec::new();
    let mut stale_total = 0;
    // For comparison: one GET round trip through corral on a cache hit.
    let mut rtt = Vec::new();
    for i in 0..200 {
        let key = format!("lat:{i}");
        assert_eq!(direct.cmd(&format!("SET {key} old")).await, OK);
        make_cached(&mut c, &key, &bulk("old")).await;
        let t = Instant::now();
        assert_eq!(get(&mut c, &key).await, bulk("old"));
        rtt.push(t.elapsed());
        assert_eq!(direct.cmd(&format!("SET {key} new")).await, OK);
        let (took, stale) = get_until(
            &mut c,
            &key,
            &bulk("new"),
            &[&bulk("old")],
            false,
            Duration::from_secs(2),
        )
        .await;
        lat.push(took);
        stale_total += stale;
        stays(&mut c, &key, &bulk("new"), 20).await;
    }
    lat.sort();
    rtt.sort();
    eprintln!(
        "invalidation latency (direct SET acked -> corral GET returns new), 200 runs: \
         p50 {:?} p99 {:?} max {:?}; stale GETs after the ack: {stale_total}; \
         cache-hit GET round trip p50 {:?} p99 {:?}",
        pct(&lat, 0.5),
        pct(&lat, 0.99),
        lat[lat.len() - 1],
        pct(&rtt, 0.5),
        pct(&rtt, 0.99)
    );
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_keys_with_a_ttl_expire() {
    let (_redis, proxy, mut direct, mut c) = start().await;

    // A TTL set with the value.
    assert_eq!(direct.cmd("SET ttl:a v PX 300").await, OK);
    make_cached(&mut c, "ttl:a", &bulk("v")).await;
    let (took, _) = get_until(
        &mut c,
        "ttl:a",
        NIL,
        &[&bulk("v")],
        false,
        Duration::from_secs(3),
    )
    .await;
    eprintln!("key with PX 300 read nil through corral after {took:?} more");
    stays(&mut c, "ttl:a", NIL, 100).await;

    // A TTL added directly to a cached key that had none.
    assert_eq!(direct.cmd("SET ttl:b v").await, OK);
    make_cached(&mut c, "ttl:b", &bulk("v")).await;
    assert_eq!(direct.cmd("PEXPIRE ttl:b 200").await, int(1));
    get_until(
        &mut c,
        "ttl:b",
        NIL,
        &[&bulk("v")],
        false,
        Duration::from_secs(3),
    )
    .await;
    stays(&mut c, "ttl:b", NIL, 100).await;
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_flushes_empty_the_cache() {
    let (_redis, proxy, mut direct, mut c) = start().await;
    for flush in ["FLUSHALL", "FLUSHDB", "FLUSHALL ASYNC", "FLUSHDB SYNC"] {
        let keys: Vec<String> = (0..5).map(|i| format!("flush:{i}")).collect();
        for k in &keys {
            assert_eq!(direct.cmd(&format!("SET {k} v")).await, OK);
            // From the second round on the key is cached as nil: allow the invalidation its
            // moment in flight.
            get_until(&mut c, k, &bulk("v"), &[NIL], false, Duration::from_secs(2)).await;
            make_cached(&mut c, k, &bulk("v")).await;
        }
        assert_eq!(direct.cmd(flush).await, OK);
        for k in &keys {
            get_until(&mut c, k, NIL, &[&bulk("v")], false, Duration::from_secs(2)).await;
            stays(&mut c, k, NIL, 50).await;
        }
    }
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_restart_with_other_data_is_not_served_stale() {
    let mut redis = RedisServer::start();
    let proxy = TestProxy::start_with(&redis.url(), |cfg| {
        cfg.upstream.reconnect_max_ms = 200;
    })
    .await;
    let mut c = connect(proxy.addr).await;
    {
        let mut direct = connect(redis.addr()).await;
        assert_eq!(direct.cmd("SET k old").await, OK);
    }
    make_cached(&mut c, "k", &bulk("old")).await;
    redis.kill();
    redis.restart();
    let mut direct = connect(redis.addr()).await;
    assert_eq!(direct.cmd("SET k new").await, OK);
    // While corral reconnects it may answer with errors, never with the old value (nor nil:
    // the new value was written before this first GET).
    let (took, waited) = get_until(
        &mut c,
        "k",
        &bulk("new"),
        &[],
        true,
        Duration::from_secs(10),
    )
    .await;
    eprintln!(
        "after an upstream restart corral served the new value after {took:?} ({waited} error replies)"
    );
    stays(&mut c, "k", &bulk("new"), 100).await;
    // And it caches again afterwards.
    make_cached(&mut c, "k", &bulk("new")).await;
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_tracking_connection_flushes_and_recovers() {
    let (_redis, proxy, mut direct, mut c) = start().await;
    assert_eq!(direct.cmd("SET k old").await, OK);
    make_cached(&mut c, "k", &bulk("old")).await;
    let before = Stats::of(&mut c).await;
    assert_eq!(before.text("cache_tracking"), "on");
    assert!(before.n("cache_entries") >= 1);
    let lane = tracking_client_id(&mut direct)
        .await
        .expect("a client with tracking flag t in CLIENT LIST");

    // Kill the lane and write in the same breath: Redis will not tell the dead lane about the
    // write, so only the flush on reconnect keeps corral from serving "old".
    let mut req = encode(&[b"CLIENT", b"KILL", b"ID", lane.as_bytes()]);
    req.extend_from_slice(&encode(&[b"SET", b"k", b"new"]));
    direct.send(&req).await;
    assert_eq!(direct.read_reply().await, int(1), "CLIENT KILL ID {lane}");
    assert_eq!(direct.read_reply().await, OK);

    let (took, stale) = get_until(
        &mut c,
        "k",
        &bulk("new"),
        &[&bulk("old")],
        true,
        Duration::from_secs(5),
    )
    .await;
    eprintln!(
        "after killing the tracking connection: new value after {took:?} ({stale} stale/error GETs)"
    );
    stays(&mut c, "k", &bulk("new"), 1000).await;

    // The lane comes back under a new id, everything cached before was dropped, and caching
    // and invalidation work again.
    let deadline = Instant::now() + Duration::from_secs(5);
    let new_lane = loop {
        match tracking_client_id(&mut direct).await {
            Some(id) if id != lane => break id,
            _ => assert!(Instant::now() < deadline, "no new tracking lane"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let after = Stats::of(&mut c).await;
    assert_eq!(after.text("cache_tracking"), "on");
    assert!(
        after.n("cache_flushes") > before.n("cache_flushes"),
        "losing the lane must flush: {:?}",
        after.0
    );
    make_cached(&mut c, "k", &bulk("new")).await;
    assert_eq!(direct.cmd("SET k newer").await, OK);
    get_until(
        &mut c,
        "k",
        &bulk("newer"),
        &[&bulk("new")],
        false,
        Duration::from_secs(2),
    )
    .await;
    stays(&mut c, "k", &bulk("newer"), 100).await;
    eprintln!("tracking lane {lane} killed, replaced by {new_lane}");
    proxy.stop().await;
}

/// Redis forgets keys beyond `tracking-table-max-keys` and sends invalidations for them:
/// everything cached must still follow direct writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracking_table_overflow_keeps_coherence() {
    let redis = RedisServer::start_with(&["--tracking-table-max-keys", "10"]);
    let proxy = TestProxy::start(&redis.url()).await;
    let mut direct = connect(redis.addr()).await;
    let mut c = connect(proxy.addr).await;
    let keys: Vec<String> = (0..50).map(|i| format!("tt:{i}")).collect();
    for k in &keys {
        assert_eq!(direct.cmd(&format!("SET {k} old")).await, OK);
        // Warm without insisting on a hit: the table overflow may evict it at once.
        for _ in 0..6 {
            assert_eq!(get(&mut c, k).await, bulk("old"));
        }
    }
    for k in &keys {
        assert_eq!(direct.cmd(&format!("SET {k} new")).await, OK);
    }
    for k in &keys {
        get_until(
            &mut c,
            k,
            &bulk("new"),
            &[&bulk("old")],
            false,
            Duration::from_secs(2),
        )
        .await;
        stays(&mut c, k, &bulk("new"), 20).await;
    }
    proxy.stop().await;
}

/// `SWAPDB` run directly on Redis changes what every key of db 0 holds, but Redis (7.0) sends
/// tracking clients no invalidation for it, so corral keeps serving db 0's old values until
/// `max_age_ms` (60 s by default). Through corral SWAPDB flushes the cache; directly it can't.
/// (db 1 is written before the key is cached: Redis tracks keys by name in every db, so a
/// later write to `k` in db 1 would itself invalidate db 0's `k` and hide the problem.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "limitation: Redis sends no tracking invalidation for a direct SWAPDB; corral serves the swapped-out value for up to max_age_ms"]
async fn direct_swapdb_is_seen() {
    let (_redis, proxy, mut direct, mut c) = start().await;
    assert_eq!(direct.cmd("SELECT 1").await, OK);
    assert_eq!(direct.cmd("SET k db1").await, OK);
    assert_eq!(direct.cmd("SELECT 0").await, OK);
    assert_eq!(direct.cmd("SET k db0").await, OK);
    make_cached(&mut c, "k", &bulk("db0")).await;
    assert_eq!(direct.cmd("SWAPDB 0 1").await, OK);
    assert_eq!(direct.cmd("GET k").await, bulk("db1"), "Redis itself");
    get_until(
        &mut c,
        "k",
        &bulk("db1"),
        &[&bulk("db0")],
        false,
        Duration::from_secs(2),
    )
    .await;
    proxy.stop().await;
}

/// SWAPDB through corral inside a transaction: Redis sends no invalidation for it, so EXEC
/// flushes the cache once acknowledged, as SWAPDB sent alone does. The GET right after EXEC
/// reads the swapped-in value, whichever database the transaction swapped from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn swapdb_inside_multi_through_corral_is_seen() {
    let (_redis, proxy, mut direct, mut c) = start().await;
    assert_eq!(direct.cmd("SELECT 1").await, OK);
    assert_eq!(direct.cmd("SET k db1").await, OK);
    assert_eq!(direct.cmd("SELECT 0").await, OK);
    assert_eq!(direct.cmd("SET k db0").await, OK);
    make_cached(&mut c, "k", &bulk("db0")).await;
    for cmd in ["MULTI", "SWAPDB 0 1", "EXEC"] {
        c.cmd(cmd).await;
    }
    assert_eq!(show(&c.cmd("GET k").await), show(&bulk("db1")));
    make_cached(&mut c, "k", &bulk("db1")).await;
    let swap_back = ["MULTI", "SELECT 1", "SWAPDB 1 0", "SELECT 0", "EXEC"];
    let sent: Vec<u8> = swap_back
        .iter()
        .chain(&["GET k"])
        .flat_map(|line| encode_line(line))
        .collect();
    // Pipelined with the transaction too.
    c.send(&sent).await;
    for _ in swap_back {
        c.read_reply().await;
    }
    assert_eq!(show(&c.read_reply().await), show(&bulk("db0")));
    proxy.stop().await;
}

/// DEBUG RELOAD replaces the dataset (here with what was saved before the last write), and
/// DEBUG POPULATE makes keys it does not name: a GET pipelined right after either reads what
/// Redis holds then, not the cache's entry from before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_reload_and_populate_are_seen_by_the_next_get() {
    let redis = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    let proxy = TestProxy::start(&redis.url()).await;
    let (mut direct, mut c) = (connect(redis.addr()).await, connect(proxy.addr).await);
    for round in 0..5 {
        assert_eq!(direct.cmd("SET k saved").await, OK);
        assert_eq!(direct.cmd("SAVE").await, OK);
        assert_eq!(direct.cmd("SET k later").await, OK);
        get_until(
            &mut c,
            "k",
            &bulk("later"),
            &[&bulk("saved")],
            false,
            Duration::from_secs(2),
        )
        .await;
        make_cached(&mut c, "k", &bulk("later")).await;
        c.send(&[encode_line("DEBUG RELOAD NOSAVE"), encode_line("GET k")].concat())
            .await;
        assert_eq!(c.read_reply().await, OK);
        assert_eq!(
            show(&c.read_reply().await),
            show(&bulk("saved")),
            "round {round}"
        );

        let key = format!("key:{round}");
        make_cached(&mut c, &key, NIL).await;
        let populate = format!("DEBUG POPULATE {}", round + 1);
        c.send(&[encode_line(&populate), encode_line(&format!("GET {key}"))].concat())
            .await;
        assert_eq!(c.read_reply().await, OK);
        let value = format!("value:{round}");
        assert_eq!(
            show(&c.read_reply().await),
            show(&bulk(&value)),
            "round {round}"
        );
    }
    proxy.stop().await;
}

/// A key written after every few reads: each entry serves a few hits, too few to repay its
/// fill, so after a few such entries the key is no longer filled (`cache/churn.rs`), and
/// every read still sees the last write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_written_every_few_reads_stops_being_filled() {
    let redis = RedisServer::start();
    let proxy = TestProxy::start(&redis.url()).await;
    let mut c = connect(proxy.addr).await;
    let mut fills_at = Vec::new();
    for i in 0..40 {
        let v = format!("v{i}");
        assert_eq!(c.request(&[b"SET", b"k", v.as_bytes()]).await, OK);
        for _ in 0..10 {
            assert_eq!(get(&mut c, "k").await, bulk(&v));
        }
        fills_at.push(Stats::of(&mut c).await.n("cache_fills"));
    }
    assert!(fills_at[9] > 0, "the key was filled at first: {fills_at:?}");
    assert_eq!(
        fills_at[39], fills_at[19],
        "filled again after 20 short-lived entries: {fills_at:?}"
    );
    proxy.stop().await;
}

/// A script that writes a key it does not declare in KEYS: corral cannot see which key it
/// writes, so only Redis's invalidation push (racing the EVAL reply) removes the entry, and
/// a GET sent right after the EVAL reply can still be answered from the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lua_write_to_an_undeclared_key_is_read_back() {
    let redis = RedisServer::start();
    let proxy = TestProxy::start(&redis.url()).await;
    let mut stale = 0;
    for i in 0..300 {
        // A connection of its own for each key: one that got a key cached, wrote it and read
        // it back, over and over, hits about one GET in eight, too few to stay warm, and a
        // cool connection counts only a sample of its GETs of a fresh key (`cache_cool.rs`).
        let mut c = connect(proxy.addr).await;
        let key = format!("undeclared:{i}");
        assert_eq!(c.cmd(&format!("SET {key} old")).await, OK);
        make_cached(&mut c, &key, &bulk("old")).await;
        let script = format!("redis.call('SET', '{key}', 'new')");
        assert_eq!(c.request(&[b"EVAL", script.as_bytes(), b"0"]).await, NIL);
        if get(&mut c, &key).await != bulk("new") {
            stale += 1;
        }
    }
    assert_eq!(stale, 0, "stale GETs right after EVAL in 300 tries");
    proxy.stop().await;
}

/// The admission rule (reads estimate ≥ 2 × writes estimate) with 4-bit counters caps reads
/// at 15, while one write through corral counts 2 (invalidated before forwarding and on the
/// reply) plus 1 for Redis's invalidation push. So after 3 writes a key is never cached
/// again, however often it is read, until the write sketch halves (after 10 × its width of
/// write increments: 2.6 M with the default max_bytes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_key_written_now_and_then_stays_cached() {
    let redis = RedisServer::start();
    let proxy = TestProxy::start(&redis.url()).await;
    let mut c = connect(proxy.addr).await;
    for i in 0..5 {
        let v = format!("v{i}");
        assert_eq!(c.request(&[b"SET", b"k", v.as_bytes()]).await, OK);
        for _ in 0..200 {
            assert_eq!(get(&mut c, "k").await, bulk(&v));
        }
    }
    let before = Stats::of(&mut c).await.n("cache_hits");
    stays(&mut c, "k", &bulk("v4"), 100).await;
    let after = Stats::of(&mut c).await;
    assert!(
        after.n("cache_hits") > before,
        "read 1000 times, written 5 times, and not cached: {:?}",
        after.0
    );
    proxy.stop().await;
}

/// `read_barrier`: a GET sent through corral as soon as a direct write's `+OK` arrived never
/// reads the value the write replaced (without the barrier, about half such reads did:
/// README), and cached keys are still served locally. Plain GETs pass the barrier at their
/// round's start; an MGET, and an inline GET the look ahead does not read, at the request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_barrier_closes_the_direct_write_race() {
    let redis = RedisServer::start();
    let proxy = TestProxy::start_with(&redis.url(), |c| c.cache.read_barrier = true).await;
    let mut direct = connect(redis.addr()).await;
    let mut c = connect(proxy.addr).await;
    let mut stale = 0;
    // 50 of each form: many more direct writes of keys just cached and the cache stops
    // admitting them (`churn.rs`).
    for i in 0..150 {
        let key = format!("barrier:{i}");
        assert_eq!(direct.cmd(&format!("SET {key} old")).await, OK);
        make_cached(&mut c, &key, &bulk("old")).await;
        assert_eq!(direct.cmd(&format!("SET {key} new")).await, OK);
        let fresh = match i % 3 {
            0 => get(&mut c, &key).await == bulk("new"),
            1 => c.request(&[b"MGET", key.as_bytes()]).await == b"*1\r\n$3\r\nnew\r\n",
            _ => {
                c.send(format!("GET {key}\r\n").as_bytes()).await;
                c.read_reply().await == bulk("new")
            }
        };
        stale += usize::from(!fresh);
    }
    eprintln!("stale reads right after a direct write: {stale} of 150");
    assert_eq!(stale, 0);
    let stats = Stats::of(&mut c).await;
    assert!(stats.n("cache_barriers") > 0, "{:?}", stats.0);
    assert_eq!(stats.n("cache_barrier_failures"), 0, "{:?}", stats.0);
    proxy.stop().await;
}
