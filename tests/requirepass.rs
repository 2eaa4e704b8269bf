//! `CONFIG SET requirepass` through corral: the same scripts run against one Redis directly
//! and against another behind corral, replies compared byte for byte. Redis starts asking new
//! clients for the password at once; corral must too, and keep reaching Redis itself: its
//! own new upstream connections need the new password.

mod common;

use common::{Options, RawClient, RedisPair, check, show, tagged};

/// Sets a password, uses it on new clients (and on new dedicated upstream connections:
/// MULTI, BLPOP), changes it again in one write with an AUTH after it, and clears it.
const SCRIPT: &[&str] = &[
    "A: AUTH s3cret",
    "A: CONFIG SET requirepass s3cret",
    "A: SET k v",
    "A: AUTH wrong",
    "A: AUTH s3cret",
    "B: GET k #noauth",
    "B: MULTI",
    "B: AUTH default s3cret",
    "B: MULTI",
    "B: INCR n",
    "B: EXEC #exec",
    "B: BLPOP nolist 0.01",
    "A: CONFIG SET requirepass other ; AUTH other ; AUTH s3cret",
    "C: AUTH other",
    "C: EVAL \"return redis.call('get', KEYS[1])\" 1 k",
    "E: GET k #before",
    "C: CONFIG SET requirepass \"\"",
    "D: GET k",
    "D: MULTI",
    "D: EXEC",
    "D: AUTH default anything",
    // E connected while a password was set and never authenticated: let in once it is
    // cleared, asked again once one is set.
    "E: GET k #cleared",
    "D: CONFIG SET requirepass again",
    "E: GET k",
    "D: CONFIG SET requirepass \"\"",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_set_requirepass_is_followed_as_redis_follows_it() {
    let pair = RedisPair::start().await;
    for resp3 in [false, true] {
        let [_, corral] = check(pair.sides(), "requirepass", SCRIPT, Options::resp(resp3)).await;
        // Not only the same as Redis: the password was really asked for, and the
        // transaction on a new upstream connection ran.
        let noauth = tagged(&corral, "noauth");
        assert!(noauth.starts_with(b"-NOAUTH"), "{}", show(noauth));
        let exec = tagged(&corral, "exec");
        assert!(exec.starts_with(b"*1\r\n:"), "{}", show(exec));
        assert!(tagged(&corral, "before").starts_with(b"-NOAUTH"));
        assert_eq!(show(tagged(&corral, "cleared")), show(b"$1\r\nv\r\n"));
    }
}

/// Clients setting the password at the same time: whichever Redis ran last is the one
/// corral keeps, for its clients and for its own new upstream connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_password_changes_end_on_the_one_redis_kept() {
    let pair = RedisPair::start().await;
    let mut admin = RawClient::connect(pair.behind).await.expect("redis");
    for round in 0..20 {
        // All connected (and so authenticated) before any sets a password.
        let mut clients = Vec::new();
        for _ in 0..4 {
            let mut c = RawClient::connect(pair.proxy.addr).await.expect("connect");
            assert_eq!(c.cmd("PING").await, b"+PONG\r\n");
            clients.push(c);
        }
        let mut sets = Vec::new();
        for (i, mut c) in clients.into_iter().enumerate() {
            sets.push(tokio::spawn(async move {
                c.cmd(&format!("CONFIG SET requirepass p{round}-{i}")).await
            }));
        }
        for set in sets {
            assert_eq!(set.await.expect("task"), b"+OK\r\n");
        }
        // The password Redis kept, asked of Redis itself.
        let kept = admin.cmd("CONFIG GET requirepass").await;
        let kept = String::from_utf8_lossy(&kept);
        let kept = kept.lines().nth(4).expect("CONFIG GET reply").to_string();
        let mut fresh = RawClient::connect(pair.proxy.addr).await.expect("connect");
        assert_eq!(
            fresh.cmd(&format!("AUTH {kept}")).await,
            b"+OK\r\n",
            "round {round}"
        );
        // A new upstream connection authenticates with it.
        assert_eq!(fresh.cmd("MULTI").await, b"+OK\r\n", "round {round}");
        assert_eq!(fresh.cmd("EXEC").await, b"*0\r\n", "round {round}");
        let clear = fresh
            .request(&[b"CONFIG", b"SET", b"requirepass", b""])
            .await;
        assert_eq!(clear, b"+OK\r\n");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requirepass_inside_multi_is_refused_and_the_transaction_aborted() {
    let pair = RedisPair::start().await;
    let mut c = RawClient::connect(pair.proxy.addr).await.expect("connect");
    assert_eq!(c.cmd("MULTI").await, b"+OK\r\n");
    assert_eq!(
        show(&c.cmd("CONFIG SET requirepass s3cret").await),
        show(
            b"-ERR 'config|set' is not supported by corral: not with requirepass inside MULTI\r\n"
        )
    );
    assert!(c.cmd("EXEC").await.starts_with(b"-EXECABORT"));
    // A password corral's upstream URL could not hold.
    let binary = c
        .request(&[b"CONFIG", b"SET", b"requirepass", b"\xff\xfe"])
        .await;
    assert_eq!(
        show(&binary),
        show(b"-ERR CONFIG SET 'requirepass' through corral takes a UTF-8 password\r\n")
    );
    // Nothing changed: a new client needs no password.
    let mut fresh = RawClient::connect(pair.proxy.addr).await.expect("connect");
    assert_eq!(fresh.cmd("PING").await, b"+PONG\r\n");
    assert_eq!(fresh.cmd("MULTI").await, b"+OK\r\n");
    assert_eq!(fresh.cmd("EXEC").await, b"*0\r\n");
}
