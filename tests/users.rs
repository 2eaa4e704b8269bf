//! Redis's own ACL users through corral: users made on Redis with ACL SETUSER authenticate
//! through corral (AUTH, HELLO AUTH) and get exactly Redis's permissions and errors. The same
//! sequences run against one Redis directly and against a second one, with the same users,
//! behind corral; replies are byte-compared.

mod common;

use common::{Options, Step, connect, make_cached, show, stat_n, sync_cmd};

/// Users made on both servers: a restricted one, and two that may only use their own keys.
const USERS: &[&[&str]] = &[
    &[
        "ACL",
        "SETUSER",
        "bob",
        "on",
        ">123",
        "+@scripting",
        "+set",
        "+get",
        "+multi",
        "+exec",
        "+acl|whoami",
        "~x*",
    ],
    &["ACL", "SETUSER", "alice", "on", ">a-pass", "+@all", "~a*"],
    &["ACL", "SETUSER", "carol", "on", ">c-pass", "+@all", "~c*"],
];

type Pair = common::RedisPair;

/// A pair whose two servers both have [`USERS`].
async fn start_with(tweak: impl FnOnce(&mut corral::Config)) -> Pair {
    let pair = Pair::start_with(tweak).await;
    pair.on_both(|port| {
        for user in USERS {
            let r = sync_cmd(port, user);
            assert_eq!(r, b"+OK\r\n", "{user:?}: {}", show(&r));
        }
    });
    pair
}

async fn start() -> Pair {
    start_with(|_| {}).await
}

/// Runs `script` (one request per element) on a new client of Redis and one of corral with
/// the harness's runner; every reply must be the same bytes (HELLO's id masked). Returns
/// corral's replies.
async fn same(pair: &Pair, script: &[&[&[u8]]]) -> Vec<Vec<u8>> {
    let steps: Vec<Step> = script
        .iter()
        .map(|req| Step::call('A', req.iter().map(|a| a.to_vec()).collect()))
        .collect();
    let [_, proxied] = common::compare(pair.sides(), "users", &steps, Options::resp(false)).await;
    proxied.into_iter().map(|r| r.bytes).collect()
}

#[tokio::test]
async fn acl_user_gets_redis_own_replies_and_errors() {
    let pair = start().await;
    let replies = same(
        &pair,
        &[
            &[b"AUTH", b"bob", b"wrong"],
            &[b"ACL", b"WHOAMI"],
            &[b"AUTH", b"nobody", b"123"],
            &[b"AUTH", b"bob", b"123"],
            &[b"ACL", b"WHOAMI"],
            &[b"SET", b"x1", b"v"],
            &[b"GET", b"x1"],
            // Denied key, denied command, denied command without keys.
            &[b"SET", b"y1", b"v"],
            &[b"GET", b"y1"],
            &[b"HSET", b"x2", b"f", b"v"],
            &[b"PING"],
            &[b"ECHO", b"hi"],
            &[b"DBSIZE"],
            // Scripts and transactions run as the user too.
            &[
                b"EVAL",
                b"return redis.acl_check_cmd('set','xx',1)",
                b"1",
                b"xx",
            ],
            &[
                b"EVAL",
                b"return redis.acl_check_cmd('hset','xx','f',1)",
                b"1",
                b"xx",
            ],
            &[b"EVAL", b"return redis.call('get','yy')", b"0"],
            &[b"MULTI"],
            &[b"SET", b"x3", b"v"],
            &[b"GET", b"y3"],
            &[b"EXEC"],
            // A failed AUTH leaves the client as it was.
            &[b"AUTH", b"alice", b"wrong"],
            &[b"ACL", b"WHOAMI"],
            // Another user: the same client switches.
            &[b"AUTH", b"alice", b"a-pass"],
            &[b"ACL", b"WHOAMI"],
            &[b"SET", b"x4", b"v"],
            &[b"SET", b"a4", b"v"],
        ],
    )
    .await;
    // The errors are Redis's, not corral's paraphrase.
    assert!(
        replies[0].starts_with(b"-WRONGPASS"),
        "{}",
        show(&replies[0])
    );
    assert!(replies[7].starts_with(b"-NOPERM"), "{}", show(&replies[7]));
    assert!(replies[9].starts_with(b"-NOPERM"), "{}", show(&replies[9]));
    assert_eq!(replies[4], b"$3\r\nbob\r\n");
    assert_eq!(replies[23], b"$5\r\nalice\r\n");
    pair.proxy.stop().await;
}

#[tokio::test]
async fn pipelined_requests_after_auth_run_as_the_new_user() {
    let pair = start().await;
    let script = [
        "ACL WHOAMI",
        "AUTH bob 123",
        "ACL WHOAMI",
        "GET y1",
        "AUTH alice wrong",
        "ACL WHOAMI",
        "AUTH default x",
        "ACL WHOAMI",
        "GET y1",
        "AUTH alice a-pass",
        "GET y1",
        "ACL WHOAMI",
    ];
    let mut bytes = Vec::new();
    for l in script {
        let w = common::words(l);
        let args: Vec<&[u8]> = w.iter().map(Vec::as_slice).collect();
        bytes.extend(common::encode(&args));
    }
    let mut direct = connect(pair.direct).await;
    let mut proxied = connect(pair.proxy.addr).await;
    direct.send(&bytes).await;
    proxied.send(&bytes).await;
    for l in script {
        let want = direct.read_reply().await;
        assert_eq!(show(&proxied.read_reply().await), show(&want), "{l}");
    }
    pair.proxy.stop().await;
}

#[tokio::test]
async fn a_lost_user_connection_closes_the_client() {
    let pair = start().await;
    let mut bob = connect(pair.proxy.addr).await;
    assert_eq!(bob.cmd("AUTH bob 123").await, b"+OK\r\n");
    assert_eq!(bob.cmd("SET x1 v").await, b"+OK\r\n");
    // bob's pool connection (and maybe the one his AUTH was checked on, still closing).
    let killed = sync_cmd(pair.behind.port(), &["CLIENT", "KILL", "USER", "bob"]);
    assert!(
        killed.starts_with(b":") && killed != b":0\r\n",
        "{}",
        show(&killed)
    );
    // Requests already on their way may get an upstream error; none runs as another user,
    // and the client is closed.
    for _ in 0..50 {
        match bob.try_request(&[b"SET", b"y1", b"v"]).await {
            Ok(r) => assert!(r.starts_with(b"-"), "ran after the kill: {}", show(&r)),
            Err(_) => break,
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(bob.is_closed().await, "client still open");
    pair.proxy.stop().await;
}

#[tokio::test]
async fn hello_auth_as_user() {
    let pair = start().await;
    let replies = same(
        &pair,
        &[
            &[b"HELLO", b"3", b"AUTH", b"bob", b"wrong"],
            &[b"HELLO", b"3", b"AUTH", b"bob", b"123", b"SETNAME", b"bobs"],
            &[b"ACL", b"WHOAMI"],
            &[b"GET", b"y1"],
            &[b"SET", b"x1", b"v"],
            &[b"GET", b"x1"],
        ],
    )
    .await;
    assert!(
        replies[0].starts_with(b"-WRONGPASS"),
        "{}",
        show(&replies[0])
    );
    assert!(replies[1].starts_with(b"%7\r\n"), "{}", show(&replies[1]));
    assert!(replies[3].starts_with(b"-NOPERM"), "{}", show(&replies[3]));

    // The HELLO reply's id is the one corral gives the client everywhere else.
    let mut c = connect(pair.proxy.addr).await;
    let hello = c.request(&[b"HELLO", b"2", b"AUTH", b"bob", b"123"]).await;
    let id = c.request(&[b"CLIENT", b"ID"]).await;
    let id = std::str::from_utf8(&id[1..id.len() - 2]).expect("id");
    assert!(
        common::contains(&hello, format!("$2\r\nid\r\n:{id}\r\n").as_bytes()),
        "{} vs CLIENT ID {id}",
        show(&hello)
    );
    // SETNAME applies to the name corral keeps for the client (CLIENT GETNAME is answered by
    // corral, not checked against the user's ACL: documented).
    let mut named = connect(pair.proxy.addr).await;
    let r = named
        .request(&[
            b"HELLO", b"3", b"AUTH", b"alice", b"a-pass", b"SETNAME", b"al",
        ])
        .await;
    assert!(r.starts_with(b"%7\r\n"), "{}", show(&r));
    assert_eq!(named.cmd("CLIENT GETNAME").await, b"$2\r\nal\r\n");
    // CLIENT LIST shows the user, as Redis does.
    let list = c.request(&[b"CLIENT", b"INFO"]).await;
    assert!(common::contains(&list, b" user=bob "), "{}", show(&list));
    pair.proxy.stop().await;
}

#[tokio::test]
async fn two_users_never_share_a_connection() {
    let pair = start().await;
    let mut alice = connect(pair.proxy.addr).await;
    let mut carol = connect(pair.proxy.addr).await;
    assert_eq!(alice.cmd("AUTH alice a-pass").await, b"+OK\r\n");
    assert_eq!(carol.cmd("AUTH carol c-pass").await, b"+OK\r\n");
    let mut direct_alice = connect(pair.direct).await;
    let mut direct_carol = connect(pair.direct).await;
    assert_eq!(direct_alice.cmd("AUTH alice a-pass").await, b"+OK\r\n");
    assert_eq!(direct_carol.cmd("AUTH carol c-pass").await, b"+OK\r\n");
    // Interleaved, and pipelined so that both users' requests are in flight together.
    for i in 0..20 {
        for (c, d, mine, theirs, me) in [
            (&mut alice, &mut direct_alice, "a", "c", "alice"),
            (&mut carol, &mut direct_carol, "c", "a", "carol"),
        ] {
            let lines = [
                format!("SET {mine}{i} {me}"),
                format!("GET {theirs}{i}"),
                "ACL WHOAMI".to_string(),
                format!("GET {mine}{i}"),
            ];
            let mut bytes = Vec::new();
            for l in &lines {
                let w = common::words(l);
                let args: Vec<&[u8]> = w.iter().map(Vec::as_slice).collect();
                bytes.extend(common::encode(&args));
            }
            c.send(&bytes).await;
            d.send(&bytes).await;
            for l in &lines {
                let got = c.read_reply().await;
                let want = d.read_reply().await;
                assert_eq!(show(&got), show(&want), "{me}: {l}");
            }
        }
    }
    // A write by one user is seen by the other only through Redis's own permission check.
    assert!(alice.cmd("GET c3").await.starts_with(b"-NOPERM"));
    assert_eq!(carol.cmd("ACL WHOAMI").await, b"$5\r\ncarol\r\n");
    pair.proxy.stop().await;
}

#[tokio::test]
async fn cached_hot_key_is_not_served_to_a_user_who_may_not_read_it() {
    let pair = start().await;
    let mut default = connect(pair.proxy.addr).await;
    assert_eq!(default.cmd("SET secret v").await, b"+OK\r\n");
    make_cached(&mut default, "secret", b"$1\r\nv\r\n").await;
    let mut direct = connect(pair.direct).await;
    assert_eq!(direct.cmd("AUTH bob 123").await, b"+OK\r\n");
    let want = direct.cmd("GET secret").await;
    assert!(want.starts_with(b"-NOPERM"), "{}", show(&want));
    let mut bob = connect(pair.proxy.addr).await;
    assert_eq!(bob.cmd("AUTH bob 123").await, b"+OK\r\n");
    let hits = stat_n(&mut default, "cache_hits").await;
    assert_eq!(show(&bob.cmd("GET secret").await), show(&want));
    assert_eq!(
        show(&bob.cmd("MGET secret").await),
        show(&direct.cmd("MGET secret").await)
    );
    assert_eq!(
        stat_n(&mut default, "cache_hits").await,
        hits,
        "bob's read hit the cache"
    );
    // The user's writes still invalidate the cache for everyone else.
    assert_eq!(bob.cmd("SET x9 old").await, b"+OK\r\n");
    make_cached(&mut default, "x9", b"$3\r\nold\r\n").await;
    assert_eq!(bob.cmd("SET x9 new").await, b"+OK\r\n");
    assert_eq!(default.cmd("GET x9").await, b"$3\r\nnew\r\n");
    pair.proxy.stop().await;
}

#[tokio::test]
async fn back_to_default_and_reset_close_the_users_connection() {
    let pair = start().await;
    // A user's connection never serves another client: after users came and went
    // (disconnected, RESET, back to default), transactions and scripts (on dedicated
    // connections, reused from the idle pool) still run as default.
    for _ in 0..5 {
        let mut c = connect(pair.proxy.addr).await;
        assert_eq!(c.cmd("AUTH bob 123").await, b"+OK\r\n");
        assert_eq!(c.cmd("GET x1").await, b"$-1\r\n");
    }
    same(
        &pair,
        &[
            &[b"AUTH", b"bob", b"123"],
            &[b"GET", b"y1"],
            // The default user has no password here: any password authenticates it.
            &[b"AUTH", b"default", b"anything"],
            &[b"ACL", b"WHOAMI"],
            &[b"GET", b"y1"],
            &[b"AUTH", b"bob", b"123"],
            &[b"GET", b"y1"],
            &[b"RESET"],
            &[b"ACL", b"WHOAMI"],
            &[b"GET", b"y1"],
        ],
    )
    .await;
    for _ in 0..5 {
        let mut c = connect(pair.proxy.addr).await;
        assert_eq!(c.cmd("MULTI").await, b"+OK\r\n");
        assert_eq!(c.cmd("ACL WHOAMI").await, b"+QUEUED\r\n");
        assert_eq!(c.cmd("EXEC").await, b"*1\r\n$7\r\ndefault\r\n");
        let check = c
            .request(&[
                b"EVAL",
                b"return redis.acl_check_cmd('hset','yy','f','1')",
                b"0",
            ])
            .await;
        assert_eq!(check, b":1\r\n", "a script ran as a user: {}", show(&check));
    }
    pair.proxy.stop().await;
}

#[tokio::test]
async fn subscribe_as_a_user_gets_redis_own_channel_errors() {
    let pair = start().await;
    // alice has no channel permissions (Redis 7's `acl-pubsub-default resetchannels`).
    same(
        &pair,
        &[
            &[b"AUTH", b"alice", b"a-pass"],
            &[b"SUBSCRIBE", b"ch"],
            &[b"PSUBSCRIBE", b"c*"],
            &[b"PUBLISH", b"ch", b"m"],
            &[b"ACL", b"WHOAMI"],
            // bob may not even run SUBSCRIBE (nor DISCARD, which corral's check uses).
            &[b"AUTH", b"bob", b"123"],
            &[b"SUBSCRIBE", b"ch"],
            &[b"UNSUBSCRIBE"],
            &[b"SET", b"x1", b"v"],
        ],
    )
    .await;
    pair.proxy.stop().await;
}

/// corral answers CLIENT LIST/KILL/NO-EVICT and CORRAL itself, and cannot check a Redis user's
/// ACL for them: a user gets Redis's own NOPERM, byte for byte where Redis denies them too,
/// and never a view of (or a kill of) corral's other clients.
#[tokio::test]
async fn users_cannot_run_corrals_admin_commands() {
    let pair = start().await;
    same(
        &pair,
        &[
            &[b"AUTH", b"bob", b"123"],
            &[b"CLIENT", b"LIST"],
            &[b"CLIENT", b"KILL", b"ID", b"1"],
            &[b"client", b"no-evict", b"on"],
        ],
    )
    .await;
    // alice may run anything on Redis, but corral's own admin commands stay `default`'s.
    let mut c = connect(pair.proxy.addr).await;
    assert_eq!(c.request(&[b"AUTH", b"alice", b"a-pass"]).await, b"+OK\r\n");
    assert_eq!(
        show(&c.request(&[b"CLIENT", b"LIST"]).await),
        show(b"-NOPERM this user has no permissions to run the 'client|list' command\r\n")
    );
    assert_eq!(
        show(&c.request(&[b"CORRAL", b"HOTKEYS"]).await),
        show(b"-NOPERM this user has no permissions to run the 'corral' command\r\n")
    );
    // CLIENT commands about the caller itself still work.
    assert!(c.request(&[b"CLIENT", b"ID"]).await.starts_with(b":"));
    pair.proxy.stop().await;
}

/// A Redis user may be denied PING: corral's checks of that user's idle connections must not
/// be PINGs, or each one is a `-NOPERM` in Redis's error statistics (which Redis's own suite
/// asserts on, "Consistent eval error reporting", after a test that made such a user).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_checks_of_a_users_connections_cause_no_errors_on_redis() {
    let pair = Pair::start_with(|c| c.cache.lane_check_ms = 20).await;
    let setuser = [
        "ACL", "SETUSER", "noping", "on", ">np", "+@all", "-ping", "allkeys",
    ];
    assert_eq!(sync_cmd(pair.behind.port(), &setuser), b"+OK\r\n");
    assert_eq!(
        sync_cmd(pair.behind.port(), &["CONFIG", "RESETSTAT"]),
        b"+OK\r\n"
    );
    let mut c = connect(pair.proxy.addr).await;
    assert_eq!(c.cmd("AUTH noping np").await, b"+OK\r\n");
    assert_eq!(c.cmd("SET np:k v").await, b"+OK\r\n");
    // The connection that ran the SET, checked while idle: its last command is the probe.
    let list = common::client_list(pair.behind).await;
    let shared = list
        .iter()
        .find(|l| {
            common::field(l, "user") == Some("noping") && common::field(l, "cmd") == Some("set")
        })
        .and_then(|l| common::field(l, "id"))
        .map(String::from)
        .unwrap_or_else(|| panic!("no connection of noping ran the SET: {list:#?}"));
    common::poll_until(
        std::time::Duration::from_secs(10),
        "the user's idle connection to be checked",
        || async {
            let list = common::client_list(pair.behind).await;
            list.iter()
                .any(|l| {
                    common::field(l, "id") == Some(&shared)
                        && common::field(l, "cmd").is_some_and(|c| c != "set")
                })
                .then_some(())
        },
    )
    .await;
    let errors = sync_cmd(pair.behind.port(), &["INFO", "errorstats"]);
    assert!(
        !String::from_utf8_lossy(&errors).contains("errorstat_"),
        "{}",
        show(&errors)
    );
}

/// MONITOR as a Redis ACL user runs as that user: refused with Redis's own `-NOPERM` to a
/// user without it (the client then goes on as before), and a stream of Redis's commands to
/// one with it.
#[tokio::test]
async fn monitor_as_a_user_is_checked_by_redis() {
    let pair = start().await;
    pair.on_both(|port| {
        let r = sync_cmd(
            port,
            &[
                "ACL", "SETUSER", "nomon", "on", ">p", "+@read", "+@write", "+ping", "~*",
            ],
        );
        assert_eq!(r, b"+OK\r\n", "{}", show(&r));
    });
    let replies = same(
        &pair,
        &[
            &[b"AUTH", b"nomon", b"p"],
            &[b"MONITOR"],
            &[b"SET", b"m1", b"v"],
            &[b"GET", b"m1"],
            &[b"PING"],
        ],
    )
    .await;
    assert!(replies[1].starts_with(b"-NOPERM"), "{}", show(&replies[1]));
    // A user who may: the stream, with other clients' commands in it.
    let mut m = connect(pair.proxy.addr).await;
    assert_eq!(show(&m.cmd("AUTH alice a-pass").await), show(b"+OK\r\n"));
    assert_eq!(show(&m.cmd("MONITOR").await), show(b"+OK\r\n"));
    let mut other = connect(pair.proxy.addr).await;
    assert_eq!(
        show(&other.cmd("SET a-monitored v").await),
        show(b"+OK\r\n")
    );
    let seen = async { while !common::contains(&m.read_reply().await, b"\"a-monitored\"") {} };
    let limit = std::time::Duration::from_secs(10);
    assert!(
        tokio::time::timeout(limit, seen).await.is_ok(),
        "SET not monitored"
    );
    pair.proxy.stop().await;
}
