//! Pools of Redis's own ACL users (pass-through): clients of one user share a few upstream
//! connections authenticated as that user; nothing of one user ever runs on another user's
//! (or a default client's) connection; pools are bounded and closed when idle; Redis dropping
//! or refusing a user's connections closes that user's clients.

mod common;

use std::time::Duration;

use common::{Options, RawClient, client_list, connect, field, poll_until, show, steps, sync_cmd};

type Pair = common::RedisPair;

/// alice may use `a:*` keys only, bob `b:*` only; both may run anything else.
const USERS: &[&[&str]] = &[
    &[
        "ACL", "SETUSER", "alice", "on", ">a-pass", "+@all", "~a:*", "&a:*",
    ],
    &[
        "ACL", "SETUSER", "bob", "on", ">b-pass", "+@all", "~b:*", "&b:*",
    ],
];

async fn start_with(tweak: impl FnOnce(&mut corral::Config)) -> Pair {
    let pair = Pair::start_with(tweak).await;
    pair.on_both(|port| {
        for user in USERS {
            assert_eq!(sync_cmd(port, user), b"+OK\r\n", "{user:?}");
        }
    });
    pair
}

/// The connections Redis (behind corral) has authenticated as `user`, besides the asking one.
async fn upstream_conns_of(pair: &Pair, user: &str) -> usize {
    client_list(pair.behind)
        .await
        .iter()
        .filter(|l| field(l, "user") == Some(user))
        .count()
}

/// One line of corral's INFO proxy section, as a number.
async fn info_n(c: &mut RawClient, name: &str) -> u64 {
    let info = c.cmd("INFO proxy").await;
    let text = String::from_utf8_lossy(&info);
    let prefix = format!("{name}:");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

/// A client of corral authenticated as `user`.
async fn as_user(pair: &Pair, user: &str, pass: &str) -> RawClient {
    let mut c = connect(pair.proxy.addr).await;
    let r = c
        .request(&[b"AUTH", user.as_bytes(), pass.as_bytes()])
        .await;
    assert_eq!(r, b"+OK\r\n", "AUTH {user}: {}", show(&r));
    c
}

#[tokio::test]
async fn clients_of_one_user_share_a_few_connections() {
    let pair = start_with(|c| c.auth.user_connections = 2).await;
    let mut clients = Vec::new();
    for i in 0..20 {
        let mut c = as_user(&pair, "alice", "a-pass").await;
        let set = format!("SET a:{i} v{i}");
        assert_eq!(c.cmd(&set).await, b"+OK\r\n");
        clients.push(c);
    }
    for (i, c) in clients.iter_mut().enumerate() {
        let v = format!("v{i}");
        let want = format!("${}\r\n{v}\r\n", v.len());
        assert_eq!(c.cmd(&format!("GET a:{i}")).await, want.as_bytes());
        assert_eq!(c.cmd("ACL WHOAMI").await, b"$5\r\nalice\r\n");
    }
    // The connections the AUTHs were checked on close; what stays is the pool's own.
    let p = &pair;
    poll_until(
        Duration::from_secs(10),
        "alice's pool alone",
        || async move { (upstream_conns_of(p, "alice").await == 2).then_some(()) },
    )
    .await;
    let mut admin = connect(pair.proxy.addr).await;
    assert_eq!(info_n(&mut admin, "upstream_user_pools").await, 1);
    assert_eq!(info_n(&mut admin, "upstream_user_pool_clients").await, 20);
    pair.proxy.stop().await;
}

/// Sends `lines` in one write on both clients and checks that corral's replies are Redis's.
async fn same_pipeline(who: &str, c: &mut RawClient, d: &mut RawClient, lines: &[String]) {
    let mut bytes = Vec::new();
    for l in lines {
        let w = common::words(l);
        let args: Vec<&[u8]> = w.iter().map(Vec::as_slice).collect();
        bytes.extend(common::encode(&args));
    }
    c.send(&bytes).await;
    d.send(&bytes).await;
    for l in lines {
        let (got, want) = (c.read_reply().await, d.read_reply().await);
        assert_eq!(show(&got), show(&want), "{who}: {l}");
    }
}

#[tokio::test]
async fn two_users_pipelining_at_once_keep_their_own_permissions() {
    let pair = start_with(|c| c.auth.user_connections = 1).await;
    // Several clients per user, each with a direct twin on the other Redis.
    let mut tasks = Vec::new();
    for n in 0..6 {
        let (user, pass, mine, theirs) = match n % 2 {
            0 => ("alice", "a-pass", "a", "b"),
            _ => ("bob", "b-pass", "b", "a"),
        };
        let mut c = as_user(&pair, user, pass).await;
        let mut d = connect(pair.direct).await;
        assert_eq!(
            d.request(&[b"AUTH", user.as_bytes(), pass.as_bytes()])
                .await,
            b"+OK\r\n"
        );
        tasks.push(tokio::spawn(async move {
            for i in 0..30 {
                let lines = [
                    format!("SET {mine}:{n}:{i} {user}"),
                    format!("GET {theirs}:{n}:{i}"),
                    "ACL WHOAMI".to_string(),
                    format!("GET {mine}:{n}:{i}"),
                    format!("SET {theirs}:{n}:{i} {user}"),
                    format!("EXISTS {mine}:{n}:{i} {theirs}:{n}:{i}"),
                ];
                same_pipeline(user, &mut c, &mut d, &lines).await;
            }
        }));
    }
    for t in tasks {
        t.await.expect("client task");
    }
    // Redis saw every denial as the user who made it: no command of alice's ran as bob or
    // the other way round (a write to the other user's keys would have succeeded there).
    let keys = sync_cmd(pair.behind.port(), &["KEYS", "*"]);
    let text = String::from_utf8_lossy(&keys);
    for key in text.lines().filter(|l| l.contains(':')) {
        let v = sync_cmd(pair.behind.port(), &["GET", key]);
        let owner = if key.starts_with("a:") {
            "alice"
        } else {
            "bob"
        };
        assert_eq!(
            show(&v),
            show(format!("${}\r\n{owner}\r\n", owner.len()).as_bytes()),
            "{key}"
        );
    }
    // One shared connection per user, each authenticated as its user (once the connections
    // the AUTHs were checked on are closed).
    let p = &pair;
    poll_until(
        Duration::from_secs(10),
        "one connection per user",
        || async move {
            let n = (
                upstream_conns_of(p, "alice").await,
                upstream_conns_of(p, "bob").await,
            );
            (n == (1, 1)).then_some(())
        },
    )
    .await;
    pair.proxy.stop().await;
}

#[tokio::test]
async fn default_clients_never_use_a_users_connection() {
    let pair = start_with(|_| {}).await;
    // Users leave idle connections behind (transactions, blocking commands, scripts).
    let mut alice = as_user(&pair, "alice", "a-pass").await;
    for _ in 0..3 {
        assert_eq!(alice.cmd("MULTI").await, b"+OK\r\n");
        assert_eq!(alice.cmd("ACL WHOAMI").await, b"+QUEUED\r\n");
        assert_eq!(alice.cmd("EXEC").await, b"*1\r\n$5\r\nalice\r\n");
        assert_eq!(alice.cmd("BLPOP a:l 0.01").await, b"*-1\r\n");
    }
    // Default clients, interleaved with alice's, always run as default.
    for _ in 0..5 {
        let mut c = connect(pair.proxy.addr).await;
        assert_eq!(c.cmd("ACL WHOAMI").await, b"$7\r\ndefault\r\n");
        assert_eq!(c.cmd("MULTI").await, b"+OK\r\n");
        assert_eq!(c.cmd("ACL WHOAMI").await, b"+QUEUED\r\n");
        assert_eq!(c.cmd("EXEC").await, b"*1\r\n$7\r\ndefault\r\n");
        assert_eq!(c.cmd("BLPOP b:l 0.01").await, b"*-1\r\n");
        let check = c
            .request(&[b"EVAL", b"return redis.acl_check_cmd('get','b:1')", b"0"])
            .await;
        assert_eq!(check, b":1\r\n", "a script ran as a user: {}", show(&check));
        assert_eq!(alice.cmd("ACL WHOAMI").await, b"$5\r\nalice\r\n");
    }
    pair.proxy.stop().await;
}

#[tokio::test]
async fn transactions_blocking_commands_and_scripts_run_as_the_user() {
    let pair = start_with(|_| {}).await;
    let script = [
        "A: AUTH alice a-pass",
        "A: MULTI",
        "A: ACL WHOAMI",
        "A: GET b:1",
        "A: SET a:1 x",
        "A: EXEC",
        "A: WATCH a:1",
        "A: WATCH b:1",
        "A: UNWATCH",
        "A: BLPOP b:list 0",
        "A: BLPOP a:list 0.01",
        "A> BLPOP a:list 0",
        "B: AUTH bob b-pass",
        "B: LPUSH a:list v",
        "C: LPUSH a:list v",
        "A<",
        "A: EVAL \"return redis.call('get','b:1')\" 0",
        "A: EVAL \"return redis.acl_check_cmd('get','a:1')\" 0",
        "A: SELECT 1",
        "A: ACL WHOAMI",
        "A: GET b:1",
        "A: SELECT 0",
        "A: CLIENT TRACKING ON",
        "A: GET b:1",
        "A: ACL WHOAMI",
        "A: CLIENT TRACKING OFF",
    ];
    common::compare(
        pair.sides(),
        "user-stateful",
        &steps(&script),
        Options::resp(false),
    )
    .await;
    pair.proxy.stop().await;
}

#[tokio::test]
async fn an_idle_pool_is_closed() {
    let pair = start_with(|c| c.auth.user_pool_idle_ms = 200).await;
    let mut alice = as_user(&pair, "alice", "a-pass").await;
    assert_eq!(alice.cmd("SET a:1 v").await, b"+OK\r\n");
    assert_eq!(alice.cmd("MULTI").await, b"+OK\r\n");
    assert_eq!(alice.cmd("EXEC").await, b"*0\r\n");
    assert!(upstream_conns_of(&pair, "alice").await > 0);
    drop(alice);
    let p = &pair;
    poll_until(
        Duration::from_secs(10),
        "alice's pool closed",
        || async move { (upstream_conns_of(p, "alice").await == 0).then_some(()) },
    )
    .await;
    let mut admin = connect(pair.proxy.addr).await;
    assert_eq!(info_n(&mut admin, "upstream_user_pools").await, 0);
    // A new client makes a new pool.
    let mut again = as_user(&pair, "alice", "a-pass").await;
    assert_eq!(again.cmd("GET a:1").await, b"$1\r\nv\r\n");
    pair.proxy.stop().await;
}

#[tokio::test]
async fn past_the_pool_limit_auth_gets_a_clear_error() {
    let pair = start_with(|c| {
        c.auth.max_user_pools = 1;
        c.auth.user_pool_idle_ms = 100;
    })
    .await;
    let mut alice = as_user(&pair, "alice", "a-pass").await;
    let mut bob = connect(pair.proxy.addr).await;
    assert_eq!(
        show(&bob.cmd("AUTH bob b-pass").await),
        show(b"-ERR too many Redis ACL user pools in use (auth.max_user_pools)\r\n")
    );
    assert_eq!(bob.cmd("ACL WHOAMI").await, b"$7\r\ndefault\r\n");
    // Another client of the same user shares the pool; other clients are unaffected.
    let mut alice2 = as_user(&pair, "alice", "a-pass").await;
    assert_eq!(alice2.cmd("ACL WHOAMI").await, b"$5\r\nalice\r\n");
    assert_eq!(alice.cmd("ACL WHOAMI").await, b"$5\r\nalice\r\n");
    // A wrong password is still Redis's own answer, not the limit.
    let wrong = bob.cmd("AUTH alice nope").await;
    assert!(wrong.starts_with(b"-WRONGPASS"), "{}", show(&wrong));
    // Once alice's clients left and her pool closed, bob gets one.
    drop((alice, alice2));
    let addr = pair.proxy.addr;
    poll_until(Duration::from_secs(10), "a pool freed", || async move {
        let mut c = connect(addr).await;
        (c.cmd("AUTH bob b-pass").await == b"+OK\r\n").then_some(())
    })
    .await;
    pair.proxy.stop().await;
}

#[tokio::test]
async fn a_deleted_user_or_changed_password_closes_its_clients() {
    let pair = start_with(|_| {}).await;
    let behind = pair.behind.port();
    let mut alice = as_user(&pair, "alice", "a-pass").await;
    let mut bob = as_user(&pair, "bob", "b-pass").await;
    assert_eq!(alice.cmd("SET a:1 v").await, b"+OK\r\n");
    assert_eq!(bob.cmd("SET b:1 v").await, b"+OK\r\n");
    // A changed password leaves live connections alone, as in Redis...
    let r = sync_cmd(behind, &["ACL", "SETUSER", "bob", "resetpass", ">b-new"]);
    assert_eq!(r, b"+OK\r\n");
    assert_eq!(bob.cmd("GET b:1").await, b"$1\r\nv\r\n");
    // ...but a new connection with the old password is refused: the client gets an error
    // (never runs as anyone else) and is closed, to AUTH again.
    let r = bob.try_request(&[b"MULTI"]).await;
    if let Ok(r) = &r {
        assert!(r.starts_with(b"-"), "MULTI ran: {}", show(r));
    }
    assert!(bob.is_closed().await, "bob still open");
    let mut again = connect(pair.proxy.addr).await;
    assert!(
        again
            .cmd("AUTH bob b-pass")
            .await
            .starts_with(b"-WRONGPASS")
    );
    assert_eq!(again.cmd("AUTH bob b-new").await, b"+OK\r\n");
    assert_eq!(again.cmd("MULTI").await, b"+OK\r\n");
    // A deleted user: Redis kills its connections; corral closes its clients.
    assert_eq!(sync_cmd(behind, &["ACL", "DELUSER", "alice"]), b":1\r\n");
    assert!(alice.is_closed().await, "alice still open");
    let mut other = connect(pair.proxy.addr).await;
    assert!(
        other
            .cmd("AUTH alice a-pass")
            .await
            .starts_with(b"-WRONGPASS")
    );
    assert_eq!(other.cmd("ACL WHOAMI").await, b"$7\r\ndefault\r\n");
    pair.proxy.stop().await;
}

#[tokio::test]
async fn subscriptions_are_made_as_the_user() {
    let pair = start_with(|_| {}).await;
    for resp3 in [false, true] {
        let script = [
            "A: AUTH alice a-pass",
            "A: SUBSCRIBE b:ch",
            "A: SUBSCRIBE a:ch a:ch2",
            "A: PSUBSCRIBE b:*",
            "A: PSUBSCRIBE a:*",
            "B: AUTH bob b-pass",
            "B: PUBLISH a:ch hi",
            "C: PUBLISH a:ch hello",
            "A<",
            "A<",
            "C: PUBSUB NUMSUB a:ch a:ch2",
            "A: PING",
            "A: UNSUBSCRIBE a:ch",
            "A: PUNSUBSCRIBE",
            "A: UNSUBSCRIBE",
            "A: ACL WHOAMI",
        ];
        let opts = Options::resp(resp3);
        common::compare(pair.sides(), "user-pubsub", &steps(&script), opts).await;
    }
    // The subscriptions were made upstream on a connection authenticated as alice.
    let mut alice = as_user(&pair, "alice", "a-pass").await;
    assert_eq!(
        alice.cmd("SUBSCRIBE a:x").await,
        b"*3\r\n$9\r\nsubscribe\r\n$3\r\na:x\r\n:1\r\n"
    );
    let list = client_list(pair.behind).await;
    assert!(
        list.iter()
            .any(|l| field(l, "user") == Some("alice") && field(l, "sub") == Some("1")),
        "{list:#?}"
    );
    // A user who may not run MULTI cannot have its subscriptions checked: a clear error, and
    // nothing of the check is left on the user's connections.
    let setuser = [
        "ACL", "SETUSER", "nomulti", "on", ">n-pass", "+@all", "-multi", "~*", "&*",
    ];
    assert_eq!(sync_cmd(pair.behind.port(), &setuser), b"+OK\r\n");
    let mut nomulti = as_user(&pair, "nomulti", "n-pass").await;
    for _ in 0..2 {
        assert_eq!(
            show(&nomulti.cmd("SUBSCRIBE ch").await),
            show(
                b"-ERR corral has Redis check a Redis ACL user's (un)subscribe inside \
                MULTI/DISCARD, which this user may not run\r\n"
            )
        );
        assert_eq!(nomulti.cmd("SET k v").await, b"+OK\r\n");
    }
    // Subscriptions made as alice outlive the client's stay as alice (as in Redis), and
    // keep alice's pool open for it.
    let mut r3 = common::client_in(pair.proxy.addr, true).await;
    assert_eq!(r3.cmd("AUTH alice a-pass").await, b"+OK\r\n");
    assert!(r3.cmd("SUBSCRIBE a:kept").await.starts_with(b">3"));
    assert_eq!(r3.cmd("AUTH default x").await, b"+OK\r\n");
    assert_eq!(r3.cmd("ACL WHOAMI").await, b"$7\r\ndefault\r\n");
    // alice, nomulti, and r3 through its subscriptions.
    let mut admin = connect(pair.proxy.addr).await;
    assert_eq!(info_n(&mut admin, "upstream_user_pool_clients").await, 3);
    assert_eq!(admin.cmd("PUBLISH a:kept m").await, b":1\r\n");
    assert_eq!(
        show(&r3.read_reply().await),
        show(b">3\r\n$7\r\nmessage\r\n$6\r\na:kept\r\n$1\r\nm\r\n")
    );
    // A RESP3 client subscribed as default keeps those subscriptions apart after an AUTH.
    let mut c = common::client_in(pair.proxy.addr, true).await;
    assert!(c.cmd("SUBSCRIBE a:y").await.starts_with(b">3"));
    assert_eq!(c.cmd("AUTH alice a-pass").await, b"+OK\r\n");
    let r = c.cmd("SUBSCRIBE a:z").await;
    assert!(
        r.starts_with(b"-ERR this client has subscriptions made as another user"),
        "{}",
        show(&r)
    );
    assert!(c.cmd("UNSUBSCRIBE").await.starts_with(b">3"));
    assert!(c.cmd("SUBSCRIBE a:z").await.starts_with(b">3"));
    pair.proxy.stop().await;
}
