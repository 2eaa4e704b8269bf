//! Half-open upstream connections, made with a fault-injecting relay between corral and Redis:
//! a tracking lane that goes silent (blackholed, delayed, or mid-fill) stops vouching for the
//! cache within the configured stale window, and shared and pub/sub connections are replaced
//! with their in-flight requests answered `timed out`, never left hanging. Also: a huge
//! write pipelined with many GETs does not hold up other clients.
//!
//! Durations are printed (run with `--nocapture`); the only timed assertion is the stale
//! window itself, against its configured bound with generous slack.

mod common;

use std::time::{Duration, Instant};

use common::{
    Deadline, Fault, RawClient, RedisServer, Relay, TestProxy, bulk, connect, corral_stats, encode,
    get_until, int, make_cached, show, stat, stat_n,
};

const OK: &[u8] = b"+OK\r\n";
/// Health settings for these tests: a PING after 200 ms of quiet, 300 ms to answer it.
const CHECK_MS: u64 = 200;
const DEADLINE_MS: u64 = 300;
/// Scheduling slack on a loaded 2-core machine: the window is 0.5 s, the bug was 30 s+.
const SLACK: Duration = Duration::from_secs(2);

fn window() -> Duration {
    Duration::from_millis(CHECK_MS + DEADLINE_MS)
}

/// Redis, a relay in front of it, and corral in front of the relay (one shared connection
/// per protocol, so each flow is easy to find), with `tweak` applied last.
async fn setup(tweak: impl FnOnce(&mut corral::Config)) -> (RedisServer, Relay, TestProxy) {
    let redis = RedisServer::start();
    let relay = Relay::start(redis.addr()).await;
    let proxy = TestProxy::start_with(&relay.url(), |cfg| {
        cfg.upstream.connections = 1;
        cfg.cache.hot_threshold = 2;
        cfg.cache.lane_check_ms = CHECK_MS;
        cfg.cache.lane_deadline_ms = DEADLINE_MS;
        tweak(cfg);
    })
    .await;
    (redis, relay, proxy)
}

/// Waits until the cache reports its lane up and tracking again.
async fn wait_tracking(c: &mut RawClient) {
    let deadline = Deadline::new(Duration::from_secs(10), "the tracking lane to come back");
    while stat(c, "cache_tracking").await != "on" {
        deadline.pause().await;
    }
}

/// GETs `key` through corral until it returns `want`; every earlier reply must be `old`.
/// Returns how long that took.
async fn stale_for(c: &mut RawClient, key: &str, old: &[u8], want: &[u8]) -> Duration {
    let limit = Duration::from_secs(30);
    get_until(c, key, want, &[old], false, limit).await.0
}

/// Key `k` = "old", cached through corral: returns a direct client, a client of corral, the
/// relay flow of the tracking lane, and the lane resets so far.
async fn cached_on_lane(
    redis: &RedisServer,
    relay: &Relay,
    proxy: &TestProxy,
) -> (RawClient, RawClient, u16, u64) {
    let mut direct = connect(redis.addr()).await;
    let mut c = connect(proxy.addr).await;
    assert_eq!(direct.cmd("SET k old").await, OK);
    make_cached(&mut c, "k", &bulk("old")).await;
    let lane = relay
        .find_client(redis.addr(), |l| l.contains("flags=t"))
        .await;
    let resets = stat_n(&mut c, "cache_lane_resets").await;
    (direct, c, lane, resets)
}

/// The tracking lane's flow gets `fault`; a value then written directly on Redis must stop
/// being served stale within the window, and corral must come back coherent.
async fn lane_fault_case(fault: Fault, what: &str) {
    let (redis, relay, proxy) = setup(|_| {}).await;
    let (mut direct, mut c, lane, resets) = cached_on_lane(&redis, &relay, &proxy).await;

    relay.set_fault(lane, fault);
    assert_eq!(direct.cmd("SET k new").await, OK);
    let stale = stale_for(&mut c, "k", &bulk("old"), &bulk("new")).await;
    eprintln!(
        "{what}: old value served for {stale:?} after the write (window {window:?})",
        window = window()
    );
    assert!(
        stale <= window() + SLACK,
        "{what}: stale for {stale:?}, window {:?}",
        window()
    );
    for _ in 0..200 {
        assert_eq!(c.cmd("GET k").await, bulk("new"), "{what}: went back");
    }

    // The lane was reset for not answering, and says so.
    wait_tracking(&mut c).await;
    let stats = corral_stats(&mut c).await;
    let n: u64 = stats["cache_lane_resets"].parse().unwrap();
    assert!(n > resets, "{what}: no lane reset counted: {stats:?}");
    assert!(
        stats["cache_lane0"].contains("state=on") && stats["cache_lane0"].contains("no reply"),
        "{what}: lane report {:?}",
        stats["cache_lane0"]
    );
    assert_eq!(
        stats["cache_stale_window_ms"],
        (CHECK_MS + DEADLINE_MS).to_string()
    );
    // (A delayed flow's old connection lingers on Redis until the relay delivered it all.)
    let old = format!(":{lane} ");
    relay
        .find_client(redis.addr(), |l| l.contains("flags=t") && !l.contains(&old))
        .await;

    // Coherent again: cached, and a direct write is seen through the new lane.
    make_cached(&mut c, "k", &bulk("new")).await;
    assert_eq!(direct.cmd("SET k newer").await, OK);
    let took = stale_for(&mut c, "k", &bulk("new"), &bulk("newer")).await;
    eprintln!("{what}: after recovery a direct write was seen after {took:?}");
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blackholed_lane_stops_vouching_within_the_window() {
    lane_fault_case(Fault::Blackhole, "blackholed lane").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_lane_stops_vouching_within_the_window() {
    // Held far longer than the deadline (and than window + slack): only the health check
    // can end the staleness in time.
    lane_fault_case(Fault::Delay(Duration::from_secs(5)), "delayed lane").await;
}

/// With the read barrier, a lane that stops answering vouches for nothing: the first GET
/// after a direct write already reads the new value (the barrier's PING unanswered within
/// the deadline, the cache is flushed and the round looks nothing up).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_read_barrier_on_a_blackholed_lane_serves_nothing_stale() {
    let (redis, relay, proxy) = setup(|cfg| cfg.cache.read_barrier = true).await;
    let (mut direct, mut c, lane, _) = cached_on_lane(&redis, &relay, &proxy).await;
    relay.set_fault(lane, Fault::Blackhole);
    assert_eq!(direct.cmd("SET k new").await, OK);
    let t = Instant::now();
    assert_eq!(c.cmd("GET k").await, bulk("new"));
    eprintln!("first GET after the write answered in {:?}", t.elapsed());
    for _ in 0..50 {
        assert_eq!(c.cmd("GET k").await, bulk("new"));
    }
    assert!(stat_n(&mut c, "cache_barrier_failures").await > 0);
    // Coherent again once a new lane is up.
    wait_tracking(&mut c).await;
    make_cached(&mut c, "k", &bulk("new")).await;
    assert_eq!(direct.cmd("SET k newer").await, OK);
    assert_eq!(c.cmd("GET k").await, bulk("newer"));
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fill_on_a_dead_lane_is_answered_uncached() {
    let (redis, relay, proxy) = setup(|_| {}).await;
    let (mut direct, mut c, lane, resets) = cached_on_lane(&redis, &relay, &proxy).await;
    relay.set_fault(lane, Fault::Blackhole);
    // A write through corral drops the entry and resets the key's estimate: the GETs after it
    // are plain reads until the key is hot again, and then one is a fill sent on the lane,
    // which is now silent.
    assert_eq!(c.cmd("SET k mid").await, OK);
    let fills = stat_n(&mut c, "cache_fills").await;
    let mut filled = None;
    for _ in 0..20 {
        let start = Instant::now();
        let got = c.cmd("GET k").await;
        assert_eq!(got, bulk("mid"), "{}", show(&got));
        if stat_n(&mut c, "cache_fills").await > fills {
            filled = Some(start.elapsed());
            break;
        }
    }
    let took = filled.expect("no GET of the key became a tracked fill");
    eprintln!("GET whose fill went to a dead lane answered after {took:?}");
    assert!(stat_n(&mut c, "cache_lane_resets").await > resets);
    wait_tracking(&mut c).await;
    make_cached(&mut c, "k", &bulk("mid")).await;
    assert_eq!(direct.cmd("SET k new").await, OK);
    stale_for(&mut c, "k", &bulk("mid"), &bulk("new")).await;
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_shared_connection_times_out_and_is_replaced() {
    let (redis, relay, proxy) = setup(|cfg| cfg.upstream.request_timeout_ms = 2_000).await;
    let mut c = connect(proxy.addr).await;
    assert_eq!(c.cmd("PING").await, b"+PONG\r\n");
    let shared = relay
        .find_client(redis.addr(), |l| l.contains("resp=2"))
        .await;

    // A request in flight on the blackholed connection gets an error, not a hang.
    relay.set_fault(shared, Fault::Blackhole);
    let start = Instant::now();
    let got = c.cmd("INCR n").await;
    eprintln!(
        "in-flight request on a half-open connection answered after {:?}",
        start.elapsed()
    );
    let want = format!("-ERR upstream {} timed out\r\n", relay.addr);
    assert_eq!(got, want.as_bytes(), "{}", show(&got));
    // A new connection serves later requests; the blackholed INCR never reached Redis.
    assert_eq!(c.cmd("INCR n").await, int(1));

    // An idle half-open connection is found by its PING and replaced without any client
    // request: its flow disappears from Redis.
    let old = format!(":{shared} ");
    let shared = relay
        .find_client(redis.addr(), |l| l.contains("resp=2") && !l.contains(&old))
        .await;
    relay.set_fault(shared, Fault::Blackhole);
    let start = Instant::now();
    let mut direct = connect(redis.addr()).await;
    loop {
        let list = String::from_utf8_lossy(&direct.cmd("CLIENT LIST").await).into_owned();
        if !list.contains(&format!(":{shared} ")) {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "never replaced");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let took = start.elapsed();
    eprintln!("idle half-open shared connection replaced after {took:?}");
    assert!(took <= window() + SLACK, "replaced after {took:?}");
    assert_eq!(c.cmd("INCR n").await, int(2));
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_open_pubsub_connection_is_replaced_and_messages_flow_again() {
    let (redis, relay, proxy) = setup(|cfg| cfg.upstream.request_timeout_ms = 2_000).await;
    let mut sub = connect(proxy.addr).await;
    let confirm = |ch: &str| {
        let mut r = b"*3\r\n".to_vec();
        r.extend(bulk("subscribe"));
        r.extend(bulk(ch));
        r.extend(int(1));
        r
    };
    assert_eq!(sub.cmd("SUBSCRIBE ch").await, confirm("ch"));
    let hub = relay
        .find_client(redis.addr(), |l| l.contains("sub=1"))
        .await;
    relay.set_fault(hub, Fault::Blackhole);
    let start = Instant::now();

    // A subscription made meanwhile is confirmed (once the connection is replaced, at the
    // latest after the request timeout), not left hanging.
    let mut sub2 = connect(proxy.addr).await;
    assert_eq!(sub2.cmd("SUBSCRIBE ch2").await, confirm("ch2"));

    // Messages flow again once the hub has a new connection and subscribed again.
    let mut direct = connect(redis.addr()).await;
    let message = |ch: &str, m: &str| {
        let mut r = b"*3\r\n".to_vec();
        r.extend(bulk("message"));
        r.extend(bulk(ch));
        r.extend(bulk(m));
        r
    };
    // (PUBLISH's count is no help: Redis still counts the blackholed connection.)
    let mut sent = Vec::new();
    let got = loop {
        let m = format!("m{}", sent.len());
        direct.cmd(&format!("PUBLISH ch {m}")).await;
        sent.push(message("ch", &m));
        if let Ok(r) = tokio::time::timeout(Duration::from_millis(50), sub.try_read_reply()).await {
            break r.expect("subscriber connection");
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "never resubscribed"
        );
    };
    let took = start.elapsed();
    eprintln!("half-open pub/sub connection replaced, subscriptions back after {took:?}");
    assert!(sent.contains(&got), "unexpected message {}", show(&got));
    assert_eq!(direct.cmd("PUBLISH ch2 hello").await, int(1));
    assert_eq!(sub2.read_reply().await, message("ch2", "hello"));
    proxy.stop().await;
}

/// Runs `f` on a thread and runtime of its own, so a test client's work (decoding megabytes
/// of replies) does not compete with the proxy for its worker threads.
fn on_own_thread<T: Send + 'static>(
    f: impl std::future::Future<Output = T> + Send + 'static,
) -> std::thread::JoinHandle<T> {
    std::thread::spawn(move || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("client runtime")
            .block_on(f)
    })
}

/// One client pipelines a huge write and many GETs; another client's PINGs keep being
/// answered (the delay is printed, not asserted) and every reply is right.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_write_pipelined_with_gets_does_not_starve_others() {
    let redis = RedisServer::start();
    let proxy = TestProxy::start(&redis.url()).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let pinger = {
        let stop = stop.clone();
        let addr = proxy.addr;
        on_own_thread(async move {
            let mut b = connect(addr).await;
            let mut worst = Duration::ZERO;
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let t = Instant::now();
                assert_eq!(b.cmd("PING").await, b"+PONG\r\n");
                worst = worst.max(t.elapsed());
                n += 1;
            }
            (worst, n)
        })
    };
    let heavy = on_own_thread(huge_pipelines(proxy.addr));
    tokio::task::spawn_blocking(move || heavy.join())
        .await
        .expect("join")
        .expect("the pipelining client failed");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (worst, n) = tokio::task::spawn_blocking(move || pinger.join())
        .await
        .expect("join")
        .expect("the pinging client failed");
    assert!(n > 0, "the other client's PINGs were never answered");
    eprintln!("another client's PING meanwhile: {n} answered, slowest {worst:?}");
    proxy.stop().await;
}

/// DEL of 50,000 keys then 1,000 GETs; MSET of 100,000 keys, GETs and an MGET of them, DEL
/// of them all, GETs and an MGET again; every reply checked.
async fn huge_pipelines(addr: std::net::SocketAddr) {
    let mut a = connect(addr).await;
    let mut setup = Vec::new();
    for i in 0..1000 {
        setup.extend(encode(&[
            b"SET",
            format!("o{i}").as_bytes(),
            format!("v{i}").as_bytes(),
        ]));
    }
    a.pipeline(&setup, 64 * 1024, 1000).await;
    let keys = |prefix: &str, n: usize| -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| format!("{prefix}{i}").into_bytes())
            .collect()
    };
    let cmd = |name: &[u8], args: &[Vec<u8>]| {
        let mut argv: Vec<&[u8]> = vec![name];
        argv.extend(args.iter().map(Vec::as_slice));
        encode(&argv)
    };
    let gets = |out: &mut Vec<u8>| {
        for i in 0..1000 {
            out.extend(encode(&[b"GET", format!("o{i}").as_bytes()]));
        }
    };
    let check_gets = |replies: &[Vec<u8>]| {
        for (i, r) in replies.iter().enumerate() {
            assert_eq!(r, &bulk(format!("v{i}")), "GET o{i}");
        }
    };

    let start = Instant::now();
    let mut p = cmd(b"DEL", &keys("d", 50_000));
    gets(&mut p);
    let r = a.pipeline(&p, 64 * 1024, 1001).await;
    assert_eq!(r[0], int(0));
    check_gets(&r[1..]);
    eprintln!("DEL 50k + 1,000 GETs: {:?}", start.elapsed());

    let start = Instant::now();
    let big = keys("b", 100_000);
    let mut mset: Vec<Vec<u8>> = Vec::with_capacity(200_000);
    for k in &big {
        mset.push(k.clone());
        mset.push(b"x".to_vec());
    }
    let mut p = cmd(b"MSET", &mset);
    for k in big.iter().step_by(100) {
        p.extend(encode(&[b"GET", k]));
    }
    p.extend(cmd(b"MGET", &big[..1000]));
    p.extend(cmd(b"DEL", &big));
    for k in big.iter().step_by(100) {
        p.extend(encode(&[b"GET", k]));
    }
    p.extend(cmd(b"MGET", &big[..1000]));
    gets(&mut p);
    let r = a
        .pipeline(&p, 64 * 1024, 1 + 1000 + 1 + 1 + 1000 + 1 + 1000)
        .await;
    assert_eq!(r[0], OK);
    assert!(
        r[1..1001].iter().all(|g| g == &bulk("x")),
        "GETs after MSET"
    );
    assert_eq!(
        r[1001],
        common::bulk_array(&vec!["x"; 1000]),
        "MGET after MSET"
    );
    assert_eq!(r[1002], int(100_000));
    assert!(
        r[1003..2003].iter().all(|g| g == b"$-1\r\n"),
        "GETs after DEL"
    );
    let mut nils = b"*1000\r\n".to_vec();
    for _ in 0..1000 {
        nils.extend_from_slice(b"$-1\r\n");
    }
    assert_eq!(r[2003], nils, "MGET after DEL");
    check_gets(&r[2004..]);
    eprintln!("MSET/DEL 100k with GETs and MGETs: {:?}", start.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_multi_with_more_keys_than_the_bound_flushes_at_exec() {
    let redis = RedisServer::start();
    let proxy = TestProxy::start_with(&redis.url(), |cfg| cfg.cache.hot_threshold = 2).await;
    let mut c = connect(proxy.addr).await;
    assert_eq!(c.cmd("SET k old").await, OK);
    make_cached(&mut c, "k", &bulk("old")).await;
    let flushes = stat_n(&mut c, "cache_flushes").await;
    assert_eq!(c.cmd("MULTI").await, OK);
    // 12,000 keys in a few commands: past the 10,000 corral keeps per transaction.
    for chunk in 0..12 {
        let keys: Vec<Vec<u8>> = (0..1000)
            .map(|i| format!("t{}", chunk * 1000 + i).into_bytes())
            .collect();
        let mut argv: Vec<&[u8]> = vec![b"DEL"];
        argv.extend(keys.iter().map(Vec::as_slice));
        assert_eq!(c.request(&argv).await, b"+QUEUED\r\n");
    }
    assert_eq!(c.cmd("SET k new").await, b"+QUEUED\r\n");
    let exec = c.cmd("EXEC").await;
    assert!(exec.starts_with(b"*13\r\n"), "{}", show(&exec));
    assert!(
        stat_n(&mut c, "cache_flushes").await > flushes,
        "EXEC of a transaction over the key bound must flush"
    );
    assert_eq!(c.cmd("GET k").await, bulk("new"));
    proxy.stop().await;
}

/// The stale window measured over 20 tries with the default settings (not run by default):
/// `cargo test --release --test lane_health -- --ignored --nocapture stale_window`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn stale_window_worst_case_over_20_tries() {
    let redis = RedisServer::start();
    let relay = Relay::start(redis.addr()).await;
    let proxy = TestProxy::start_with(&relay.url(), |cfg| {
        cfg.upstream.connections = 1;
        cfg.cache.hot_threshold = 2;
    })
    .await;
    let mut direct = connect(redis.addr()).await;
    let mut c = connect(proxy.addr).await;
    let mut worst = Duration::ZERO;
    for i in 0..20 {
        let (old, new) = (format!("v{i}"), format!("v{}", i + 1));
        assert_eq!(direct.cmd(&format!("SET k {old}")).await, OK);
        wait_tracking(&mut c).await;
        make_cached(&mut c, "k", &bulk(&old)).await;
        let lane = relay
            .find_client(redis.addr(), |l| l.contains("flags=t"))
            .await;
        relay.set_fault(lane, Fault::Blackhole);
        // A random point in the check cycle.
        tokio::time::sleep(Duration::from_millis(37 * i as u64 % 500)).await;
        assert_eq!(direct.cmd(&format!("SET k {new}")).await, OK);
        let stale = stale_for(&mut c, "k", &bulk(&old), &bulk(&new)).await;
        eprintln!("try {i}: stale for {stale:?}");
        worst = worst.max(stale);
    }
    let w = stat(&mut c, "cache_stale_window_ms").await;
    eprintln!("worst stale window over 20 tries: {worst:?} (configured cache_stale_window_ms {w})");
    proxy.stop().await;
}
