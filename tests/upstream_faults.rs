//! The upstream failing under corral: down from the start, killed and restarted, stalled by
//! SIGSTOP, refusing corral's credentials. Clients must get a prompt, clear error for every
//! forwarded request (one reply per request, in order), keep their local commands working, and
//! see service come back without reconnecting.

mod common;

use std::time::Duration;

use common::{
    Deadline, RawClient, RedisServer, TestProxy, bulk, contains, http_get, poll_until, show,
};

/// Generous bound for reconnection after the upstream comes back (backoff is at most 2 s).
const RECOVERY: Duration = Duration::from_secs(20);

/// Asserts that `reply` is corral's upstream error and mentions `what`.
fn assert_upstream_error(reply: &[u8], what: &str) {
    assert!(
        reply.starts_with(b"-ERR upstream ") && contains(reply, what.as_bytes()),
        "expected an upstream error mentioning {what:?}, got {}",
        show(reply)
    );
}

/// Sends `n` GETs and a PING in one write: every GET must get its own upstream error and the
/// PING its PONG, in order (a lost or doubled error reply would shift the PONG).
async fn assert_pipeline_fails_in_order(c: &mut RawClient, n: usize) {
    let mut bytes = Vec::new();
    for i in 0..n {
        bytes.extend_from_slice(&common::encode(&[b"GET", format!("k{i}").as_bytes()]));
    }
    bytes.extend_from_slice(&common::encode(&[b"PING"]));
    let replies = c.pipeline(&bytes, bytes.len(), n + 1).await;
    for r in &replies[..n] {
        assert_upstream_error(r, "");
    }
    assert_eq!(replies[n], b"+PONG\r\n");
}

/// Polls `SET key value` on `c` until it succeeds; only upstream errors may come before.
async fn wait_until_set_works(c: &mut RawClient, key: &str, value: &str) {
    let deadline = Deadline::new(RECOVERY, "the upstream to be usable again");
    loop {
        let r = c.request(&[b"SET", key.as_bytes(), value.as_bytes()]).await;
        if r == b"+OK\r\n" {
            return;
        }
        assert_upstream_error(&r, "");
        deadline.pause().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_down_at_start_fails_fast_then_recovers() {
    let mut redis = RedisServer::start();
    redis.kill();
    // Nothing listens on the upstream port now.
    let proxy = TestProxy::spawn_with(&redis.url(), |_| {}).await;
    let mut c = RawClient::connect(proxy.addr).await.unwrap();
    // The reply must arrive within the harness's read deadline: no waiting for the upstream.
    assert_upstream_error(&c.cmd("GET k").await, "unavailable");
    assert_upstream_error(&c.cmd("INFO").await, "unavailable");
    assert_eq!(c.cmd("PING").await, b"+PONG\r\n");
    assert_eq!(c.cmd("ECHO still-here").await, bulk("still-here"));
    assert_pipeline_fails_in_order(&mut c, 20).await;
    let admin = proxy.admin.expect("admin endpoint");
    let (status, body) = http_get(admin, "/healthz").await.unwrap();
    assert_eq!(status, 503, "{body}");

    redis.restart();
    wait_until_set_works(&mut c, "k", "v").await;
    assert_eq!(c.cmd("GET k").await, bulk("v"));
    poll_until(RECOVERY, "/healthz to report 200", || async {
        let (status, _) = http_get(admin, "/healthz").await.ok()?;
        (status == 200).then_some(())
    })
    .await;
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_killed_mid_session_errors_then_recovers_on_restart() {
    let mut redis = RedisServer::start();
    let proxy = TestProxy::start(&redis.url()).await;
    let mut c = RawClient::connect(proxy.addr).await.unwrap();
    assert_eq!(c.cmd("SET before kill").await, b"+OK\r\n");

    redis.kill();
    // Connection lost or unavailable, depending on whether corral noticed yet.
    assert_upstream_error(&c.cmd("GET before").await, "");
    assert_pipeline_fails_in_order(&mut c, 20).await;
    assert_eq!(c.cmd("PING").await, b"+PONG\r\n");

    redis.restart();
    // The same client connection recovers; the restarted server has no data.
    wait_until_set_works(&mut c, "after", "restart").await;
    assert_eq!(c.cmd("GET after").await, bulk("restart"));
    assert_eq!(c.cmd("GET before").await, b"$-1\r\n");
    // As does a client that connects now, on whichever upstream connection it is given.
    for _ in 0..4 {
        let mut fresh = RawClient::connect(proxy.addr).await.unwrap();
        wait_until_set_works(&mut fresh, "fresh", "yes").await;
    }
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_upstream_times_out_and_recovers_without_mixing_replies() {
    let redis = RedisServer::start();
    let proxy = TestProxy::start_with(&redis.url(), |cfg| {
        cfg.upstream.request_timeout_ms = 300;
        cfg.upstream.connect_timeout_ms = 300;
        // About the shared connections themselves: with the cache on, a repeated GET could
        // be answered through the cache's own connection while the client's is still
        // reconnecting, and "recovered" below would not mean what it says.
        cfg.cache.enabled = false;
    })
    .await;
    let mut c = RawClient::connect(proxy.addr).await.unwrap();
    assert_eq!(c.cmd("SET a 1").await, b"+OK\r\n");
    assert_eq!(c.cmd("SET b 2").await, b"+OK\r\n");

    redis.signal("STOP");
    // Redis will run this GET when it wakes, but its reply must never reach anyone.
    assert_upstream_error(&c.cmd("GET a").await, "timed out");
    // Other clients' local commands do not wait for the stalled upstream.
    let mut other = RawClient::connect(proxy.addr).await.unwrap();
    assert_eq!(other.cmd("PING").await, b"+PONG\r\n");
    assert_eq!(other.cmd("CLIENT SETNAME other").await, b"+OK\r\n");
    assert_upstream_error(&other.cmd("GET b").await, "");
    assert_eq!(other.cmd("PING").await, b"+PONG\r\n");

    redis.signal("CONT");
    // Until recovery only errors may come; after it, each GET gets its own key's value (a
    // late reply to the timed-out "GET a" would show up here as "1").
    for (client, key, want) in [(&mut c, "b", "2"), (&mut other, "a", "1")] {
        let deadline = Deadline::new(RECOVERY, "replies after SIGCONT");
        loop {
            let r = client.request(&[b"GET", key.as_bytes()]).await;
            if r == bulk(want) {
                break;
            }
            assert_upstream_error(&r, "");
            deadline.pause().await;
        }
    }
    for _ in 0..20 {
        assert_eq!(c.cmd("GET a").await, bulk("1"));
        assert_eq!(c.cmd("GET b").await, bulk("2"));
    }
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_password_comes_from_the_url() {
    let redis = RedisServer::start_with(&["--requirepass", "pw"]);
    for url in [
        format!("redis://:pw@127.0.0.1:{}", redis.port),
        format!("redis://default:pw@127.0.0.1:{}", redis.port),
    ] {
        let proxy = TestProxy::start(&url).await;
        let mut c = RawClient::connect(proxy.addr).await.unwrap();
        assert_eq!(c.cmd("SET k v").await, b"+OK\r\n", "{url}");
        assert_eq!(c.cmd("GET k").await, bulk("v"));
        // RESP3 connections authenticate too.
        assert!(c.cmd("HELLO 3").await.starts_with(b"%7\r\n"));
        assert_eq!(c.cmd("GET k").await, bulk("v"));
        proxy.stop().await;
    }

    // A wrong password or none at all: a clear error naming Redis's refusal, at once.
    for (url, why) in [
        (
            format!("redis://:wrong@127.0.0.1:{}", redis.port),
            "WRONGPASS",
        ),
        (redis.url(), "NOAUTH"),
    ] {
        let proxy = TestProxy::spawn_with(&url, |_| {}).await;
        let mut c = RawClient::connect(proxy.addr).await.unwrap();
        // The first request may race the first connection attempt; the cause follows it.
        let deadline = Deadline::new(RECOVERY, "the refusal to be reported");
        loop {
            let r = c.cmd("GET k").await;
            assert_upstream_error(&r, "");
            if contains(&r, why.as_bytes()) {
                assert_upstream_error(&r, "unavailable");
                break;
            }
            deadline.pause().await;
        }
        assert_eq!(c.cmd("PING").await, b"+PONG\r\n");
        proxy.stop().await;
    }
}

/// Redis drops the connection that holds a client's WATCH or MULTI (CLIENT KILL, an idle
/// `timeout`): Redis forgot the transaction with it, so corral closes the client, as Redis
/// closes a client whose connection it kills. Left open, the client went on as if the WATCH
/// held, and its MULTI/SET/EXEC ran unguarded (a lost update), or the rest of its queued
/// commands ran one by one outside the transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_whose_transaction_connection_is_lost_is_closed() {
    let redis = RedisServer::start();
    let proxy = TestProxy::start(&redis.url()).await;
    let mut direct = RawClient::connect(redis.addr()).await.unwrap();
    for (i, opening) in [&["WATCH k"][..], &["MULTI", "RPUSH q a"][..]]
        .into_iter()
        .enumerate()
    {
        assert_eq!(direct.cmd("SET k 10").await, b"+OK\r\n");
        let mut c = RawClient::connect(proxy.addr).await.unwrap();
        for line in opening {
            let r = c.cmd(line).await;
            assert!(
                r == b"+OK\r\n" || r == b"+QUEUED\r\n",
                "{line}: {}",
                show(&r)
            );
        }
        // corral's connection that ran the client's last command: its dedicated one.
        let last = opening[opening.len() - 1]
            .split(' ')
            .next()
            .unwrap()
            .to_lowercase();
        let list = common::client_list(redis.addr()).await;
        let line = list
            .iter()
            .find(|l| common::field(l, "cmd") == Some(&last))
            .unwrap_or_else(|| panic!("no connection ran {last}: {list:?}"));
        let id = common::field(line, "id").unwrap();
        assert_eq!(direct.cmd(&format!("CLIENT KILL ID {id}")).await, b":1\r\n");
        assert!(c.is_closed().await, "case {i}: the client stays open");
        // Nothing the client might still send runs.
        assert_eq!(direct.cmd("SET k 99").await, b"+OK\r\n");
        assert_eq!(show(&direct.cmd("GET k").await), show(&bulk("99")));
        assert_eq!(direct.cmd("EXISTS q").await, b":0\r\n");
    }
    proxy.stop().await;
}
