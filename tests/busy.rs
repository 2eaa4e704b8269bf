//! A busy Redis through corral: long scripts and functions, the commands that end them
//! (SCRIPT KILL, FUNCTION KILL, SHUTDOWN NOSAVE), PING while Redis is busy, and replies nested
//! as deeply as a Lua script can make them. Whatever one client's script does, the other
//! clients of the same shared upstream connection must see what they would see on Redis
//! itself: `-BUSY` at once while it runs, then normal service, never a lost connection.
//!
//! The proxies here have one shared upstream connection per protocol, so every client of a
//! test shares it with the client running the script.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{
    Deadline, RawClient, RedisServer, Reply, TestProxy, assert_same, bulk, client_in, encode,
    poll_until, show,
};

/// Bounds every wait for Redis to change state.
const LIMIT: Duration = Duration::from_secs(10);

/// A Lua table that contains itself: Redis converts it until Lua's stack runs out, nearly
/// 8,000 levels deep, then ends the innermost array with `-ERR reached lua stack limit`.
const RECURSIVE: &str = "local a = {}; local b = {a}; a[1] = b; return a";

/// A valid table 5,000 levels deep with a string at the bottom.
const DEEP: &str = "local t = {} local c = t for i = 1, 5000 do local n = {} c[1] = n c = n end \
                    c[1] = 'bottom' return t";

const SPIN: &str = "while true do end";

/// A script that keeps Redis silent about 1.5 s, below its BUSY threshold (5 s).
const SLOW: &str = "local t = redis.call('TIME') local s = t[1] * 1000000 + t[2] \
                    while true do t = redis.call('TIME') \
                    if t[1] * 1000000 + t[2] - s > 1500000 then break end end return 1";

const SPIN_LIBRARY: &str =
    "#!lua name=busylib\nredis.register_function('spin', function() while true do end end)";

/// A proxy with one shared connection per protocol, adjusted by `tweak`.
async fn proxy(redis: &RedisServer, tweak: impl FnOnce(&mut corral::config::Config)) -> TestProxy {
    TestProxy::start_with(&redis.url(), |cfg| {
        cfg.upstream.connections = 1;
        tweak(cfg);
    })
    .await
}

/// Waits until corral's cache reports tracking on (`CORRAL CACHE STATS`, answered by corral
/// even while Redis is busy).
async fn wait_tracking(c: &mut RawClient, what: &str) {
    let deadline = Deadline::new(LIMIT, what);
    while common::stat(c, "cache_tracking").await != "on" {
        deadline.pause().await;
    }
}

/// Polls `line` on `c` (Redis directly) until its reply says BUSY.
async fn wait_busy(c: &mut RawClient, line: &str) {
    let deadline = Deadline::new(LIMIT, "Redis to report BUSY");
    while !c.cmd(line).await.starts_with(b"-BUSY") {
        deadline.pause().await;
    }
}

// ---- deep replies ----

/// The deep replies, and a bystander's pipelined GETs sent while they are in flight on the
/// same shared connection. Returns every reply, in order.
async fn deep_session(entry: SocketAddr, resp3: bool) -> Vec<Vec<u8>> {
    let mut a = client_in(entry, resp3).await;
    let mut b = client_in(entry, resp3).await;
    let mut out = vec![b.cmd("SET deep:k v").await];
    for script in [RECURSIVE, DEEP] {
        a.send(&encode(&[b"EVAL", script.as_bytes(), b"0"])).await;
        let gets: Vec<u8> = (0..50).flat_map(|_| encode(&[b"GET", b"deep:k"])).collect();
        b.send(&gets).await;
        out.push(a.read_reply().await);
        for _ in 0..50 {
            out.push(b.read_reply().await);
        }
        // Both connections are still good.
        out.push(a.cmd("PING").await);
        out.push(b.cmd("GET deep:k").await);
    }
    out
}

async fn deep_replies_pass_whole(tweak: fn(&mut corral::config::Config)) {
    let redis = RedisServer::start();
    let proxy = proxy(&redis, tweak).await;
    for resp3 in [false, true] {
        let want = deep_session(redis.addr(), resp3).await;
        let got = deep_session(proxy.addr, resp3).await;
        // The recursive reply really is nested far deeper than the old limit of 128.
        assert!(
            want[1].starts_with(&b"*1\r\n".repeat(7_000)),
            "resp3 {resp3}"
        );
        let label = |v: Vec<Vec<u8>>| -> Vec<Reply> {
            let replies = v.into_iter().enumerate();
            replies
                .map(|(i, r)| Reply::new(format!("reply {i}"), r))
                .collect()
        };
        assert_same(&format!("resp3 {resp3}"), &label(want), &label(got));
    }
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_replies_pass_byte_for_byte() {
    deep_replies_pass_whole(|_| {}).await;
}

/// With no dedicated connection to spare, the script and its deep reply ride the shared
/// connection itself: the reply must not break it for the bystander.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deep_replies_on_the_shared_connection_spare_its_other_clients() {
    deep_replies_pass_whole(|cfg| {
        cfg.upstream.max_dedicated = 0;
        cfg.cache.enabled = false;
    })
    .await;
}

// ---- busy scripts ----

/// How a long-running script is started and ended.
#[derive(Clone, Copy)]
struct Spin {
    /// Loads what the call needs, if anything.
    setup: Option<&'static [&'static str]>,
    call: &'static [&'static str],
    kill: &'static [&'static str],
    /// The kill that does not apply to this kind of script (Redis answers it with BUSY).
    wrong_kill: &'static [&'static str],
}

const EVAL_SPIN: Spin = Spin {
    setup: None,
    call: &["EVAL", SPIN, "0"],
    kill: &["SCRIPT", "KILL"],
    wrong_kill: &["FUNCTION", "KILL"],
};

const FCALL_SPIN: Spin = Spin {
    setup: Some(&["FUNCTION", "LOAD", "REPLACE", SPIN_LIBRARY]),
    call: &["FCALL", "spin", "0"],
    kill: &["FUNCTION", "KILL"],
    wrong_kill: &["SCRIPT", "KILL"],
};

fn args<'a>(words: &'a [&'a str]) -> Vec<&'a [u8]> {
    words.iter().map(|w| w.as_bytes()).collect()
}

/// One session around a busy script: A runs it; B and C (on A's shared connection through
/// corral) keep asking; D has a transaction open; C ends the script. Returns every reply
/// with a label. `outlive` is waited while the script runs, to let it run past corral's
/// request timeout. Reads are EXISTS, not GET: a key hot enough for corral's cache would be
/// served locally while Redis is busy (a documented difference).
async fn busy_session(entry: SocketAddr, resp3: bool, spin: Spin, outlive: Duration) -> Vec<Reply> {
    let mut out = Vec::new();
    let mut a = client_in(entry, resp3).await;
    let mut b = client_in(entry, resp3).await;
    let mut c = client_in(entry, resp3).await;
    let mut d = client_in(entry, resp3).await;
    out.push(Reply::new("B: SET", b.cmd("SET busy:k v").await));
    if let Some(setup) = spin.setup {
        out.push(Reply::new("B: setup", b.request(&args(setup)).await));
    }
    out.push(Reply::new("D: MULTI", d.cmd("MULTI").await));
    out.push(Reply::new("D: INCR", d.cmd("INCR busy:n").await));

    a.send(&encode(&args(spin.call))).await;
    // Redis answers -BUSY once the script has run past busy-reply-threshold.
    let deadline = Deadline::new(LIMIT, "Redis to report BUSY");
    let busy = loop {
        let r = b.cmd("EXISTS busy:k").await;
        if r.starts_with(b"-BUSY") {
            break r;
        }
        assert_eq!(r, b":1\r\n", "before BUSY");
        deadline.pause().await;
    };
    out.push(Reply::new("B: EXISTS while busy", busy));
    tokio::time::sleep(outlive).await;
    out.push(Reply::new("B: PING while busy", b.cmd("PING").await));
    out.push(Reply::new(
        "C: EXISTS while busy",
        c.cmd("EXISTS busy:k").await,
    ));
    out.push(Reply::new("D: INCR while busy", d.cmd("INCR busy:n").await));
    out.push(Reply::new("D: EXEC while busy", d.cmd("EXEC").await));
    out.push(Reply::new(
        "C: the other kill",
        c.request(&args(spin.wrong_kill)).await,
    ));
    out.push(Reply::new("C: kill", c.request(&args(spin.kill)).await));
    out.push(Reply::new("A: killed", a.read_reply().await));
    out.push(Reply::new("A: PING", a.cmd("PING").await));
    out.push(Reply::new("B: GET after", b.cmd("GET busy:k").await));
    out.push(Reply::new("B: PING after", b.cmd("PING").await));
    out.push(Reply::new("C: PING after", c.cmd("PING").await));
    out.push(Reply::new(
        "D: no longer in MULTI",
        d.cmd("PING asdf").await,
    ));
    out.push(Reply::new("D: GET n", d.cmd("GET busy:n").await));
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_script_answers_others_with_busy_and_dies_by_kill_as_on_redis() {
    let redis = RedisServer::start_with(&["--busy-reply-threshold", "50"]);
    // A request timeout far below the script's run time: a script's client waits for it
    // regardless, and nothing is reset meanwhile.
    let proxy = proxy(&redis, |cfg| cfg.upstream.request_timeout_ms = 200).await;
    for spin in [EVAL_SPIN, FCALL_SPIN] {
        for resp3 in [false, true] {
            let what = format!("{} resp3={resp3}", spin.call[0]);
            let want = busy_session(redis.addr(), resp3, spin, Duration::ZERO).await;
            let got = busy_session(proxy.addr, resp3, spin, Duration::from_millis(600)).await;
            assert_same(&what, &want, &got);
        }
    }
    proxy.stop().await;
}

/// With scripts kept on the shared connections (`isolate_scripts = false`), the requests
/// behind a long script wait (Redis does not read them while the script runs): SCRIPT KILL
/// must still reach Redis, out of band, and everything behind the script then completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_reaches_redis_when_the_shared_connection_is_stuck_behind_the_script() {
    let redis = RedisServer::start_with(&["--busy-reply-threshold", "50"]);
    let proxy = proxy(&redis, |cfg| {
        cfg.upstream.isolate_scripts = false;
        cfg.upstream.request_timeout_ms = 0;
        cfg.cache.enabled = false;
    })
    .await;
    let mut a = client_in(proxy.addr, false).await;
    let mut b = client_in(proxy.addr, false).await;
    let mut c = client_in(proxy.addr, false).await;
    assert_eq!(b.cmd("SET busy:k v").await, b"+OK\r\n");
    a.send(&encode(&[b"EVAL", SPIN.as_bytes(), b"0"])).await;
    // Wait until the script is busy, asking Redis directly.
    let mut direct = RawClient::connect(redis.addr()).await.unwrap();
    wait_busy(&mut direct, "GET busy:k").await;
    // Queued behind the script on the shared connection.
    b.send(&encode(&[b"GET", b"busy:k"])).await;
    assert_eq!(c.cmd("SCRIPT KILL").await, b"+OK\r\n");
    let killed = a.read_reply().await;
    assert!(
        killed.starts_with(b"-ERR Script killed by user with SCRIPT KILL"),
        "{}",
        show(&killed)
    );
    assert_eq!(b.read_reply().await, bulk("v"));
    assert_eq!(a.cmd("GET busy:k").await, bulk("v"));
    proxy.stop().await;
}

/// A script that runs long enough for corral to find its tracking lane silent and make it
/// again: Redis answers nothing until the script passes `busy-reply-threshold`, then the new
/// lane's HELLO and, to its CLIENT TRACKING ON, -BUSY. That says nothing of tracking: once the
/// script is killed the cache tracks again, rather than falling back to TTLs for good (where
/// a direct write would be read back stale for up to `fallback_ttl_ms`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lane_made_while_a_script_runs_tracks_again_once_it_ends() {
    let redis = RedisServer::start_with(&["--busy-reply-threshold", "600"]);
    let proxy = proxy(&redis, |cfg| {
        cfg.cache.lane_check_ms = 50;
        cfg.cache.lane_deadline_ms = 50;
    })
    .await;
    let mut c = client_in(proxy.addr, false).await;
    wait_tracking(&mut c, "tracking on at start").await;
    let mut spinner = RawClient::connect(redis.addr()).await.unwrap();
    spinner
        .send(&encode(&[b"EVAL", SPIN.as_bytes(), b"0"]))
        .await;
    let mut direct = RawClient::connect(redis.addr()).await.unwrap();
    wait_busy(&mut direct, "GET busy:k").await;
    // Lane made again meanwhile (silent past 100 ms), its handshake answered past 600 ms.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(direct.cmd("SCRIPT KILL").await, b"+OK\r\n");
    spinner.read_reply().await;
    wait_tracking(&mut c, "tracking on again after the script").await;
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_nosave_reaches_a_busy_redis_and_closes_like_redis() {
    let redis = RedisServer::start_with(&["--busy-reply-threshold", "50"]);
    let proxy = proxy(&redis, |cfg| {
        cfg.upstream.max_dedicated = 0;
        cfg.upstream.request_timeout_ms = 0;
        cfg.cache.enabled = false;
    })
    .await;
    let mut a = client_in(proxy.addr, false).await;
    let mut c = client_in(proxy.addr, false).await;
    a.send(&encode(&[b"EVAL", SPIN.as_bytes(), b"0"])).await;
    let mut direct = RawClient::connect(redis.addr()).await.unwrap();
    wait_busy(&mut direct, "PING").await;
    // Redis closes the connection of a SHUTDOWN that succeeds, without a reply.
    c.send(&encode(&[b"SHUTDOWN", b"NOSAVE"])).await;
    let mut rest = Vec::new();
    let closed = tokio::time::timeout(
        LIMIT,
        tokio::io::AsyncReadExt::read_to_end(&mut c.stream, &mut rest),
    )
    .await
    .expect("corral to close the SHUTDOWN client's connection");
    assert!(closed.is_ok() && rest.is_empty(), "{}", show(&rest));
    poll_until(LIMIT, "Redis to exit", || async {
        tokio::net::TcpStream::connect(redis.addr())
            .await
            .is_err()
            .then_some(())
    })
    .await;
    // The script's client learns that its connection is gone.
    let lost = a.read_reply().await;
    assert!(lost.starts_with(b"-ERR upstream "), "{}", show(&lost));
    proxy.stop().await;
}

/// A script that keeps Redis silent for longer than the health-check window, but shorter than
/// its BUSY threshold: clients of Redis simply wait, and so must corral's. The idle shared
/// connection's health-check PING goes unanswered meanwhile, like every other connection to
/// Redis: a busy node, not a half-open connection, so corral keeps the connection and the
/// request queued behind the PING gets its reply when the script ends (not `timed out`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_script_below_the_busy_threshold_delays_others_without_errors() {
    let redis = RedisServer::start();
    let proxy = proxy(&redis, |cfg| {
        cfg.cache.lane_check_ms = 200;
        cfg.cache.lane_deadline_ms = 200;
    })
    .await;
    let mut a = client_in(proxy.addr, false).await;
    let mut b = client_in(proxy.addr, false).await;
    assert_eq!(b.cmd("SET slow:k v").await, b"+OK\r\n");
    a.send(&encode(&[b"EVAL", SLOW.as_bytes(), b"0"])).await;
    // Past the shared connection's check (200 ms idle) and the PING's deadline (200 ms).
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(b.cmd("GET slow:k").await, bulk("v"));
    assert_eq!(a.read_reply().await, b":1\r\n");
    proxy.stop().await;
}

/// A request that needs a connection of its own (MULTI here) while Redis is stalled below
/// its busy threshold: Redis answers the connection's handshake when the stall ends, as it
/// answers any request then, so the transaction runs as on Redis, past the connect timeout
/// (1 s; the stall is about 1.5 s), where corral once failed it (`connect timed out`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_begun_during_a_stall_waits_it_out() {
    let redis = RedisServer::start();
    let proxy = proxy(&redis, |_| {}).await;
    let mut a = client_in(proxy.addr, false).await;
    let mut b = client_in(proxy.addr, false).await;
    a.send(&encode(&[b"EVAL", SLOW.as_bytes(), b"0"])).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    b.send(b"MULTI\r\nSET stall:k v\r\nEXEC\r\nGET stall:k\r\n")
        .await;
    for want in [
        &b"+OK\r\n"[..],
        b"+QUEUED\r\n",
        b"*1\r\n+OK\r\n",
        b"$1\r\nv\r\n",
    ] {
        assert_eq!(show(&b.read_reply().await), show(want));
    }
    assert_eq!(a.read_reply().await, b":1\r\n");
    proxy.stop().await;
}

/// CLIENT PAUSE WRITE parks a client at its first write, on Redis the client's own connection.
/// Through corral a paused write must not park a shared upstream connection: other clients'
/// reads (here queued on the one shared connection) are answered during the pause, as on
/// Redis, and the write completes when the pause ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_write_holds_up_only_its_own_client() {
    let redis = RedisServer::start();
    let proxy = proxy(&redis, |_| {}).await;
    let mut admin = client_in(proxy.addr, false).await;
    let mut writer = client_in(proxy.addr, false).await;
    let mut reader = client_in(proxy.addr, true).await;
    assert_eq!(admin.cmd("SET pause:k old").await, b"+OK\r\n");
    // Longer than request_timeout_ms (5 s): a read stuck behind the write would fail.
    assert_eq!(admin.cmd("CLIENT PAUSE 20000 WRITE").await, b"+OK\r\n");
    writer.send(&encode(&[b"SET", b"pause:k", b"new"])).await;
    let mut direct = RawClient::connect(redis.addr()).await.unwrap();
    let deadline = Deadline::new(LIMIT, "the write to be paused on Redis");
    while !show(&direct.cmd("INFO clients").await).contains("blocked_clients:1") {
        deadline.pause().await;
    }
    assert_eq!(reader.cmd("GET pause:k").await, bulk("old"));
    assert_eq!(reader.cmd("EXISTS pause:k").await, b":1\r\n");
    assert_eq!(admin.cmd("CLIENT UNPAUSE").await, b"+OK\r\n");
    assert_eq!(writer.read_reply().await, b"+OK\r\n");
    assert_eq!(reader.cmd("GET pause:k").await, bulk("new"));
    proxy.stop().await;
}
