//! Stateful commands through corral against real Redis: transactions, blocking commands,
//! scripts and functions, databases, and per-connection state (CLIENT REPLY/LIST/KILL,
//! MONITOR, RESET).
//!
//! Most tests are scripts: a few clients (A, B, C...) take turns, and the same script runs
//! against one Redis directly and against a second, identical Redis through corral. Every
//! reply must be the same bytes, in RESP2 and RESP3, one request per write and pipelined.
//! What a script cannot compare (corral's own CLIENT LIST, upstream connections left behind,
//! MONITOR lines with times in them) is checked against corral alone.
//!
//! Scripts run with the harness's runner (`tests/common/compare.rs`), each side wiped first.
//! Script lines:
//! - `A: CMD args ; CMD args` sends the commands in one write and reads one reply each;
//!   `=> name` at the end saves the reply's payload (bulk content or integer) for a later
//!   `@name` argument; `#tag` marks the (last) reply for a test's own assertions, and `#any`
//!   makes only its type compared (for ids).
//! - `A> CMD args` sends a command that must block: the step waits until the server (Redis
//!   itself, on either side) counts one more blocked client. `A<` reads its replies later.
//! - `A~ CMD ; CMD` sends commands whose replies may be suppressed (CLIENT REPLY), then a
//!   marker `ECHO`, and compares everything received up to the marker's reply.
//! - `A: !closed` checks that the server closed A's connection.
//! - `@addr:X` is client X's address as the server sees it.

mod common;

use std::time::{Duration, Instant};

use common::{
    Deadline, Mode, Options, RawClient, Reply, blocked_clients, bulk, connect, contains, encode,
    field, payload, poll_until, show, stat_n, tagged,
};
use tokio::task::JoinSet;

/// Bounds every wait for a server-side state change.
const LIMIT: Duration = Duration::from_secs(10);

type Pair = common::RedisPair;

/// Script options: each side wiped first, clients' requests written as `mode` says.
fn opts(resp3: bool, mode: Mode) -> Options {
    Options {
        mode,
        wipe: true,
        ..Options::resp(resp3)
    }
}

/// Runs `script` on both sides; returns corral's replies.
async fn check(pair: &Pair, name: &str, script: &[&str], resp3: bool, mode: Mode) -> Vec<Reply> {
    let [_, proxied] = common::check(pair.sides(), name, script, opts(resp3, mode)).await;
    proxied
}

/// Runs each named script in RESP2 and RESP3.
async fn check_all(pair: &Pair, scripts: &[(&str, &[&str])], mode: Mode) {
    common::check_all(pair.sides(), scripts, opts(false, mode)).await;
}

/// The text of a bulk (`$`) or verbatim (`=`, `txt:` prefix) reply.
fn text_of(reply: &[u8]) -> String {
    let text = payload(reply).filter(|_| matches!(reply[0], b'$' | b'='));
    String::from_utf8_lossy(&text.unwrap_or_else(|| panic!("not a string reply: {}", show(reply))))
        .into_owned()
}

/// The server's `CLIENT LIST TYPE normal` lines, without the asking connection's own.
async fn normal_clients(admin: &mut RawClient) -> Vec<String> {
    let me = String::from_utf8_lossy(&admin.call("CLIENT ID").await).into_owned();
    let me = format!("id={} ", me.trim_start_matches(':').trim());
    text_of(&admin.call("CLIENT LIST TYPE normal").await)
        .lines()
        .filter(|l| !l.starts_with(&me))
        .map(str::to_string)
        .collect()
}

// ---- 1. transactions ----

const TX_SCRIPTS: &[(&str, &[&str])] = &[
    (
        "success",
        &[
            "A: MULTI",
            "A: SET tx:a 1",
            "A: INCR tx:a",
            "A: GET tx:a",
            "A: PING",
            "A: ECHO inside",
            "A: EXEC",
            "A: GET tx:a",
            // Back to normal: a second transaction on the same client.
            "A: MULTI ; INCR tx:a ; EXEC",
        ],
    ),
    (
        "queued errors abort EXEC",
        &[
            "A: MULTI",
            "A: SET tx:b 1",
            "A: NOSUCHCOMMAND x",
            "A: EXEC",
            "A: GET tx:b",
            "A: MULTI",
            "A: SET tx:b 2",
            "A: GET",
            "A: SET tx:b",
            "A: EXEC",
            "A: GET tx:b",
        ],
    ),
    (
        "runtime error inside EXEC",
        &[
            "A: SET tx:c notanumber",
            "A: MULTI",
            "A: INCR tx:c",
            "A: SET tx:d ok",
            "A: LPUSH tx:c x",
            "A: EXEC",
            "A: GET tx:d",
        ],
    ),
    (
        "discard",
        &[
            "A: MULTI",
            "A: SET tx:e x",
            "A: DISCARD",
            "A: GET tx:e",
            "A: EXEC",
            "A: DISCARD",
            "A: DISCARD extra",
            "A: EXEC",
        ],
    ),
    (
        "nested MULTI and WATCH inside MULTI",
        &[
            "A: MULTI",
            "A: MULTI",
            "A: SET tx:f 1",
            "A: WATCH tx:f",
            "A: EXEC",
            "A: GET tx:f",
            "A: MULTI extra",
            "A: WATCH",
        ],
    ),
    (
        "WATCH aborted by another client",
        &[
            "A: WATCH tx:h",
            "A: GET tx:h",
            "B: SET tx:h theirs",
            "A: MULTI",
            "A: SET tx:h mine",
            "A: EXEC #abort",
            "A: GET tx:h",
            // The aborted transaction forgot the watch: the next one succeeds.
            "A: MULTI",
            "A: SET tx:h mine",
            "A: EXEC",
            "B: GET tx:h",
        ],
    ),
    (
        "WATCH then UNWATCH",
        &[
            "A: WATCH tx:i tx:i2",
            "B: SET tx:i theirs",
            "A: UNWATCH",
            "A: MULTI",
            "A: SET tx:i mine",
            "A: EXEC #unwatched",
            "B: GET tx:i",
            // A watch nobody breaks.
            "A: WATCH tx:j",
            "A: MULTI",
            "A: INCR tx:j",
            "A: EXEC",
        ],
    ),
    (
        "others see queued writes only after EXEC",
        &[
            "B: SET tx:k old",
            "A: MULTI",
            "A: SET tx:k new",
            "B: GET tx:k",
            "B: GET tx:k",
            "A: EXEC",
            "B: GET tx:k",
        ],
    ),
    (
        // Whole transactions in one write each (every family runs fully pipelined in
        // `every_family_pipelined_matches_redis`).
        "transactions in one write",
        &[
            "A: SET txp:c notanumber",
            "A: MULTI ; SET txp:a 1 ; INCR txp:a ; GET txp:a ; EXEC",
            "A: MULTI ; SET txp:b 1 ; NOSUCHCOMMAND x ; GET ; EXEC",
            "A: MULTI ; INCR txp:c ; SET txp:d ok ; EXEC",
            "A: MULTI ; SET txp:e x ; DISCARD",
            "A: EXEC ; DISCARD",
            "A: MULTI ; MULTI ; WATCH txp:f ; SET txp:f 1 ; EXEC",
            "A: WATCH txp:h ; GET txp:h",
            "B: SET txp:h theirs",
            "A: MULTI ; SET txp:h mine ; EXEC #pabort",
            "A: WATCH txp:i",
            "B: SET txp:i theirs",
            "A: UNWATCH ; MULTI ; SET txp:i mine ; EXEC",
            "A: GET txp:a ; GET txp:b ; GET txp:d ; GET txp:e ; GET txp:h ; GET txp:i",
        ],
    ),
    (
        "a hot key written in a transaction",
        &[
            "A: SET tx:hot v1",
            "B: GET tx:hot",
            "B: GET tx:hot",
            "B: GET tx:hot",
            "B: GET tx:hot",
            "B: GET tx:hot",
            "B: GET tx:hot",
            "A: MULTI",
            "A: SET tx:hot v2",
            "A: EXEC",
            "B: GET tx:hot",
            "A: GET tx:hot",
            "A: WATCH tx:hot",
            "A: MULTI",
            "A: DEL tx:hot",
            "A: EXEC",
            "B: GET tx:hot",
        ],
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_match_redis() {
    let pair = Pair::start().await;
    check_all(&pair, TX_SCRIPTS, Mode::OneByOne).await;
    // The comparisons above would also pass if both sides did something else than meant:
    // pin down the replies that show WATCH working.
    let watch = TX_SCRIPTS
        .iter()
        .find(|(n, _)| n.starts_with("WATCH aborted"));
    let unwatch = TX_SCRIPTS.iter().find(|(n, _)| n.starts_with("WATCH then"));
    for resp3 in [false, true] {
        let (name, script) = watch.expect("script");
        let r = check(&pair, name, script, resp3, Mode::OneByOne).await;
        let nil: &[u8] = if resp3 { b"_\r\n" } else { b"*-1\r\n" };
        assert_eq!(show(tagged(&r, "abort")), show(nil), "aborted EXEC");
        let (name, script) = TX_SCRIPTS
            .iter()
            .find(|(n, _)| *n == "transactions in one write")
            .expect("script");
        let r = check(&pair, name, script, resp3, Mode::OneByOne).await;
        assert_eq!(
            show(tagged(&r, "pabort")),
            show(nil),
            "aborted pipelined EXEC"
        );
        let (name, script) = unwatch.expect("script");
        let r = check(&pair, name, script, resp3, Mode::Pipelined).await;
        assert_eq!(show(tagged(&r, "unwatched")), show(b"*1\r\n+OK\r\n"));
    }
    pair.proxy.stop().await;
}

// ---- 2. blocking commands ----

const BLOCKING_SCRIPTS: &[(&str, &[&str])] = &[
    (
        "lists",
        &[
            "A> BLPOP bl:l 0",
            "B: RPUSH bl:l v1 v2",
            "A< #blpop",
            "B: LRANGE bl:l 0 -1",
            // Served at once, and timing out.
            "A: BLPOP bl:l 0.2",
            "A: BLPOP bl:none 0.2",
            "A: BRPOP bl:none bl:none2 0.1",
            "A> BRPOP bl:r 0",
            "B: LPUSH bl:r x",
            "A<",
            "A> BLMOVE bl:src bl:dst LEFT RIGHT 0",
            "B: RPUSH bl:src m",
            "A<",
            "B: LRANGE bl:dst 0 -1",
            "A> BRPOPLPUSH bl:src2 bl:dst 0",
            "B: RPUSH bl:src2 n",
            "A<",
            "A> BLMPOP 0 2 bl:m1 bl:m2 LEFT COUNT 2",
            "B: RPUSH bl:m2 a b c",
            "A<",
            "A: BLMPOP 0.1 1 bl:none RIGHT",
            // Errors are immediate.
            "A: BLPOP bl:l -1",
            "A: BLPOP bl:l notanumber",
            "A: BLPOP",
            "B: SET bl:str x",
            "A: BLPOP bl:str 0",
        ],
    ),
    (
        "sorted sets",
        &[
            "A> BZPOPMIN bl:z 0",
            "B: ZADD bl:z 1.5 m",
            "A<",
            "A> BZPOPMAX bl:z2 0",
            "B: ZADD bl:z2 2 n 3 o",
            "A<",
            "A> BZMPOP 0 1 bl:z3 MIN COUNT 5",
            "B: ZADD bl:z3 1 a 2 b",
            "A<",
            "A: BZPOPMIN bl:none 0.1",
        ],
    ),
    (
        "streams",
        &[
            "A> XREAD BLOCK 0 STREAMS bl:s $",
            "B: XADD bl:s 1-1 f v",
            "A<",
            "A: XREAD BLOCK 100 STREAMS bl:s2 $",
            "A: XREAD BLOCK 0 STREAMS bl:s 0",
            "A: XGROUP CREATE bl:s3 g $ MKSTREAM",
            "A> XREADGROUP GROUP g c BLOCK 0 STREAMS bl:s3 >",
            "B: XADD bl:s3 1-1 f v",
            "A<",
            "A: WAIT 0 0",
            "A: WAIT 1 50",
        ],
    ),
    (
        "requests pipelined after a blocked one wait for it",
        &[
            "A> BLPOP bl:p 0 ; GET bl:after ; PING",
            "B: SET bl:after yes",
            "B: RPUSH bl:p x",
            "A<",
        ],
    ),
    (
        "two blocked clients are served in order",
        &[
            "A> BLPOP bl:q 0",
            "C> BLPOP bl:q 0",
            "B: RPUSH bl:q 1 2",
            "A<",
            "C<",
        ],
    ),
    (
        "blocking commands in transactions",
        &[
            // Inside MULTI nothing blocks.
            "A: MULTI",
            "A: BLPOP bl:none 0",
            "A: XREAD BLOCK 0 STREAMS bl:nos $",
            "A: EXEC",
            // While watching, a blocking command runs on the pinned connection.
            "A: WATCH bl:w",
            "A> BLPOP bl:w2 0",
            "B: RPUSH bl:w2 x",
            "A<",
            "A: MULTI",
            "A: SET bl:w mine",
            "A: EXEC",
        ],
    ),
    (
        "client unblock",
        &[
            // corral's id for A, Redis's on the direct side: only the type is compared.
            "A: CLIENT ID => a #any",
            "A> BLPOP bl:u 0",
            "B: CLIENT UNBLOCK @a",
            "A<",
            "A> BRPOP bl:u 0",
            "B: CLIENT UNBLOCK @a TIMEOUT",
            "A<",
            "A> BLMOVE bl:u bl:u2 LEFT RIGHT 0",
            "B: CLIENT UNBLOCK @a ERROR",
            "A<",
            "A> XREAD BLOCK 0 STREAMS bl:us $",
            "B: client unblock @a error",
            "A<",
            // A itself is not blocked now; nor is B; no client has that id.
            "B: CLIENT UNBLOCK @a",
            "B: CLIENT ID => b #any",
            "B: CLIENT UNBLOCK @b ERROR",
            "B: CLIENT UNBLOCK 987654",
            "B: CLIENT UNBLOCK -1",
            // Redis's own errors.
            "B: CLIENT UNBLOCK asd",
            "B: CLIENT UNBLOCK @a FOO",
            "B: CLIENT UNBLOCK",
            "B: CLIENT UNBLOCK 1 2 3",
            // A still works, on a blocking command that ends normally too.
            "A> BLPOP bl:u 0",
            "B: RPUSH bl:u x",
            "A<",
        ],
    ),
    (
        "blocking commands in scripts do not block",
        &[
            "A: EVAL \"return redis.call('BLPOP', KEYS[1], 0)\" 1 bl:none",
            "A: RPUSH bl:e x",
            "A: EVAL \"return redis.call('BLPOP', KEYS[1], 0)\" 1 bl:e",
        ],
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_commands_match_redis() {
    let pair = Pair::start().await;
    check_all(&pair, BLOCKING_SCRIPTS, Mode::OneByOne).await;
    let r = check(&pair, "lists", BLOCKING_SCRIPTS[0].1, false, Mode::OneByOne).await;
    assert_eq!(
        show(tagged(&r, "blpop")),
        show(b"*2\r\n$4\r\nbl:l\r\n$2\r\nv1\r\n")
    );
    pair.proxy.stop().await;
}

/// A BLPOP waits while 100 other clients work through corral; every one of them is
/// answered before the BLPOP is served by a later push.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocked_client_holds_up_nobody() {
    let pair = Pair::start().await;
    let mut admin = connect(pair.behind).await;
    for resp3 in [false, true] {
        let mut blocker = common::client_in(pair.proxy.addr, resp3).await;
        blocker.send(&encode(&[b"BLPOP", b"busy", b"0"])).await;
        poll_until(LIMIT, "the BLPOP to block", || {
            let server = pair.behind;
            async move {
                let mut a = connect(server).await;
                (blocked_clients(&mut a).await == 1).then_some(())
            }
        })
        .await;

        let mut workers = JoinSet::new();
        for i in 0..100 {
            let addr = pair.proxy.addr;
            workers.spawn(async move {
                let mut c = common::client_in(addr, resp3).await;
                let key = format!("busy:{i}");
                for j in 0..10 {
                    let v = format!("v{j}");
                    let set = c.request(&[b"SET", key.as_bytes(), v.as_bytes()]).await;
                    assert_eq!(show(&set), show(b"+OK\r\n"), "client {i} SET");
                    let get = c.request(&[b"GET", key.as_bytes()]).await;
                    assert_eq!(show(&get), show(&bulk(&v)), "client {i} GET");
                }
            });
        }
        let mut done = 0;
        while let Some(r) = workers.join_next().await {
            r.expect("a worker failed");
            done += 1;
        }
        assert_eq!(done, 100);

        // All answered while the BLPOP is still waiting, on Redis and on the client's side.
        assert_eq!(blocked_clients(&mut admin).await, 1, "BLPOP still blocked");
        assert!(
            !blocker.has_pending_reply(),
            "BLPOP answered before the push"
        );
        let mut pusher = common::client_in(pair.proxy.addr, resp3).await;
        assert_eq!(
            show(&pusher.request(&[b"RPUSH", b"busy", b"x"]).await),
            show(b":1\r\n")
        );
        assert_eq!(
            show(&blocker.read_reply().await),
            show(b"*2\r\n$4\r\nbusy\r\n$1\r\nx\r\n"),
            "BLPOP served by the push"
        );
    }
    pair.proxy.stop().await;
}

/// Polls Redis B's normal connections (without the asking one) until `done` holds for
/// their CLIENT LIST lines; panics with the lines after [`LIMIT`].
async fn wait_lines(admin: &mut RawClient, what: &str, done: impl Fn(&[String]) -> bool) {
    let deadline = Deadline::new(LIMIT, what);
    loop {
        let lines = normal_clients(admin).await;
        if done(&lines) {
            return;
        }
        deadline.pause_seeing(&lines).await;
    }
}

/// A client that goes away while blocked takes its upstream connection with it, whether it
/// disconnects or is killed with CLIENT KILL; a served blocking command may leave its
/// connection idle for reuse, but never more than one for sequential commands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_while_blocked_leaves_no_upstream_connection() {
    let pair = Pair::start().await;
    let mut admin = connect(pair.behind).await;
    // Both protocols' shared connections in use before counting.
    for resp3 in [false, true] {
        let mut c = common::client_in(pair.proxy.addr, resp3).await;
        let r = c.call("GET warm").await;
        assert!(r == b"$-1\r\n" || r == b"_\r\n", "GET warm: {}", show(&r));
    }
    let baseline = normal_clients(&mut admin).await.len();
    let is_blpop = |l: &str| field(l, "cmd") == Some("blpop");

    for (round, resp3) in [(0, false), (1, true), (2, false)] {
        let mut blocked = common::client_in(pair.proxy.addr, resp3).await;
        let id = blocked.call("CLIENT ID").await;
        let id = String::from_utf8_lossy(&id[1..id.len() - 2]).into_owned();
        blocked.send(&encode(&[b"BLPOP", b"gone:list", b"0"])).await;
        let blpops = |lines: &[String]| lines.iter().filter(|l| is_blpop(l)).count();
        wait_lines(
            &mut admin,
            "one more upstream connection, in BLPOP",
            |lines| lines.len() == baseline + 1 && blpops(lines) == 1,
        )
        .await;
        if round == 1 {
            // Killed by another corral client.
            let mut killer = common::client_in(pair.proxy.addr, false).await;
            let r = killer.call(&format!("CLIENT KILL ID {id}")).await;
            assert_eq!(
                show(&r),
                show(b":1\r\n"),
                "CLIENT KILL ID of the blocked client"
            );
            assert!(blocked.is_closed().await, "killed client still connected");
        } else {
            drop(blocked);
        }
        // A dedicated connection left blocked upstream would be a leak (it stays in BLPOP
        // until someone pushes, then pops an element for nobody).
        wait_lines(
            &mut admin,
            "the blocked client's upstream connection to close",
            |lines| lines.len() == baseline && blpops(lines) == 0,
        )
        .await;
    }

    // Served blocking commands, one after another: at most one connection kept for reuse.
    let mut c = connect(pair.proxy.addr).await;
    for i in 0..5 {
        c.call("RPUSH served:list x").await;
        let r = c.call("BLPOP served:list 0").await;
        assert_eq!(
            show(&r),
            show(b"*2\r\n$11\r\nserved:list\r\n$1\r\nx\r\n"),
            "#{i}"
        );
    }
    let now = normal_clients(&mut admin).await.len();
    assert!(
        now <= baseline + 1,
        "5 sequential BLPOPs left {} extra upstream connections",
        now - baseline
    );
    pair.proxy.stop().await;
}

/// A client that disconnects inside MULTI or while watching leaves no transaction behind on
/// the upstream: its pinned connection is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_mid_transaction_leaves_no_upstream_connection() {
    let pair = Pair::start().await;
    let mut admin = connect(pair.behind).await;
    let mut warm = connect(pair.proxy.addr).await;
    warm.call("GET warm").await;
    let baseline = normal_clients(&mut admin).await.len();
    let in_multi = |l: &String| field(l, "flags").is_some_and(|f| f.contains('x'));
    for (name, lines) in [
        ("MULTI", &["MULTI", "SET gone:k 1"][..]),
        ("WATCH", &["WATCH gone:k"][..]),
    ] {
        let mut c = connect(pair.proxy.addr).await;
        for line in lines {
            let r = c.call(line).await;
            assert!(
                r == b"+OK\r\n" || r == b"+QUEUED\r\n",
                "{line}: {}",
                show(&r)
            );
        }
        wait_lines(&mut admin, "the pinned connection", |l| {
            l.len() == baseline + 1 && (name != "MULTI" || l.iter().any(in_multi))
        })
        .await;
        drop(c);
        wait_lines(&mut admin, "the pinned connection to close", |l| {
            l.len() == baseline && !l.iter().any(in_multi)
        })
        .await;
    }
    // The queued SET never ran.
    let r = warm.call("EXISTS gone:k").await;
    assert_eq!(show(&r), show(b":0\r\n"));
    pair.proxy.stop().await;
}

// ---- 3. scripts and functions ----

/// FUNCTION LOAD of a library with one read-only function, and of one with a writing
/// function (a library's functions, and FUNCTION LIST/DUMP of several libraries, come in
/// hash-table order, which differs between two servers: one function each, one library
/// dumped).
macro_rules! load_lib_r {
    () => {
        "A: FUNCTION LOAD \"#!lua name=libr\nredis.register_function{function_name='myget', \
         callback=function(k, a) return redis.call('GET', k[1]) end, flags={'no-writes'}}\""
    };
}
macro_rules! load_lib_w {
    () => {
        "A: FUNCTION LOAD \"#!lua name=libw\nredis.register_function('myset', \
         function(k, a) return redis.call('SET', k[1], a[1]) end)\""
    };
}

const SCRIPTING_SCRIPTS: &[(&str, &[&str])] = &[
    (
        "eval",
        &[
            "A: EVAL \"return redis.call('SET', KEYS[1], ARGV[1])\" 1 sc:k v1",
            "A: EVAL \"return redis.call('GET', KEYS[1])\" 1 sc:k",
            "A: EVAL \"return {1, 'two', {3, false}, 4.5}\" 0",
            "A: EVAL \"return redis.error_reply('custom failure')\" 0",
            "A: EVAL \"return redis.call('INCR', KEYS[1])\" 1 sc:k",
            "A: EVAL \"return redis.pcall('INCR', KEYS[1])\" 1 sc:k",
            "A: EVAL \"syntax error here\" 0",
            "A: HSET sc:h f v",
            "A: ZADD sc:z 2.5 m",
            "A: EVAL \"redis.setresp(3); return redis.call('HGETALL', KEYS[1])\" 1 sc:h",
            "A: EVAL \"redis.setresp(3); return redis.call('ZSCORE', KEYS[1], 'm')\" 1 sc:z",
            "A: EVAL \"return redis.call('HGETALL', KEYS[1])\" 1 sc:h",
            "A: SCRIPT LOAD \"return ARGV[1]\" => sha",
            "A: EVALSHA @sha 0 hello",
            "A: EVALSHA_RO @sha 0 ro",
            "A: SCRIPT EXISTS @sha 0000000000000000000000000000000000000000",
            "A: EVAL_RO \"return redis.call('GET', KEYS[1])\" 1 sc:k",
            "A: EVAL_RO \"return redis.call('SET', KEYS[1], 'x')\" 1 sc:k",
            "A: MULTI",
            "A: EVALSHA @sha 0 queued",
            "A: EVAL \"return redis.call('INCRBY', KEYS[1], 2)\" 1 sc:n",
            "A: EXEC",
            "A: SCRIPT FLUSH",
            "A: SCRIPT EXISTS @sha",
            "A: EVALSHA @sha 0",
            "A: EVALSHA nosuchsha 0",
            "B: GET sc:k",
        ],
    ),
    (
        "functions",
        &[
            load_lib_r!(),
            "A: FUNCTION DUMP => dump",
            load_lib_w!(),
            "A: FCALL myset 1 fn:k fv",
            "A: FCALL myget 1 fn:k",
            "A: FCALL_RO myget 1 fn:k",
            "A: FCALL_RO myset 1 fn:k x",
            "A: FCALL nosuch 0",
            "A: FUNCTION LIST LIBRARYNAME libr",
            "A: FUNCTION LIST LIBRARYNAME libw WITHCODE",
            "A: FUNCTION STATS",
            load_lib_r!(),
            "A: MULTI",
            "A: FCALL myset 1 fn:k2 queued",
            "A: FCALL_RO myget 1 fn:k2",
            "A: EXEC",
            "A: FUNCTION DELETE libw",
            "A: FUNCTION DELETE libw",
            "A: FUNCTION FLUSH",
            "A: FUNCTION LIST",
            "A: FCALL myget 1 fn:k",
            "A: FUNCTION RESTORE @dump",
            "B: FCALL_RO myget 1 fn:k",
            "A: FUNCTION RESTORE @dump",
            "A: FUNCTION RESTORE @dump REPLACE",
            "A: FUNCTION RESTORE notadump",
            "A: FUNCTION STATS",
            "A: FUNCTION LIST WITHCODE",
            "A: FUNCTION FLUSH SYNC",
            "A: FUNCTION STATS",
        ],
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_and_functions_match_redis() {
    let pair = Pair::start().await;
    check_all(&pair, SCRIPTING_SCRIPTS, Mode::OneByOne).await;
    pair.proxy.stop().await;
}

// ---- 4. databases ----

const DB_SCRIPTS: &[(&str, &[&str])] = &[
    (
        "isolation, MOVE and SWAPDB",
        &[
            "A: SELECT 1",
            "A: SET db:k a",
            "B: SELECT 2",
            "B: SET db:k b",
            "A: GET db:k",
            "B: GET db:k",
            "C: GET db:k",
            "A: MOVE db:k 3",
            "A: GET db:k",
            "D: SELECT 3",
            "D: GET db:k",
            "A: SET db:k a2",
            "C: SWAPDB 1 2",
            "A: GET db:k",
            "B: GET db:k",
            "A: DBSIZE ; B: DBSIZE",
            "C: DBSIZE",
            // Out of range or malformed: an error, and the client stays where it was.
            "A: SELECT 99",
            "A: SELECT -1",
            "A: SELECT x",
            "A: SELECT",
            "A: GET db:k",
            // Back to 0, and a pipelined switch: requests after SELECT use the new db.
            "A: SELECT 0 ; GET db:k ; SELECT 2 ; GET db:k ; SELECT 1",
            "A: GET db:k",
            // RESET returns to database 0.
            "B: RESET",
            "B: GET db:k",
        ],
    ),
    (
        "SELECT queued in MULTI: replies",
        &[
            "A: SELECT 1",
            "A: SET db:m one",
            "B: SELECT 2",
            "B: SET db:m two",
            "A: MULTI",
            "A: SELECT 2",
            "A: GET db:m",
            "A: EXEC",
            // Both sides back in the same database whatever EXEC left.
            "A: SELECT 1",
            "A: GET db:m",
        ],
    ),
    (
        "SELECT queued in MULTI: the database afterwards",
        &[
            "A: SELECT 1",
            "A: SET db:m one",
            "B: SELECT 2",
            "B: SET db:m two",
            "A: MULTI",
            "A: SELECT 2",
            "A: GET db:m",
            "A: EXEC",
            // EXEC ran the SELECT: Redis leaves the client in database 2.
            "A: GET db:m #after",
            "A: DBSIZE",
            "A: MULTI",
            "A: SELECT 99",
            "A: GET db:m",
            "A: EXEC",
            "A: GET db:m",
        ],
    ),
    (
        "a db-0 hot key is not served to other databases",
        &[
            "A: SELECT 1",
            "A: SET db:hot one",
            "C: SET db:hot zero",
            "C: GET db:hot",
            "C: GET db:hot",
            "C: GET db:hot",
            "C: GET db:hot",
            "C: GET db:hot",
            "C: GET db:hot",
            "A: GET db:hot #db1",
            "A: MGET db:hot db:hot",
            "A: SET db:hot uno",
            "C: GET db:hot",
            // SWAPDB through corral swaps what db 0 holds.
            "B: SWAPDB 0 1",
            "C: GET db:hot",
            "A: GET db:hot",
            "B: SWAPDB 1 0",
            "C: GET db:hot",
        ],
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn databases_match_redis() {
    // Every key hot at once, so the db-0 GETs fill the cache.
    let pair = Pair::start_with(|c| c.cache.hot_threshold = 1).await;
    check_all(&pair, &DB_SCRIPTS[..2], Mode::OneByOne).await;
    let mut stats = connect(pair.proxy.addr).await;
    let hits_before = stat_n(&mut stats, "cache_hits").await;
    for resp3 in [false, true] {
        let (name, script) = DB_SCRIPTS[3];
        let r = check(&pair, name, script, resp3, Mode::OneByOne).await;
        assert_eq!(show(tagged(&r, "db1")), show(&bulk("one")));
    }
    // Otherwise the script did not test the cache at all.
    assert!(
        stat_n(&mut stats, "cache_hits").await > hits_before,
        "no GET of db:hot was answered from the cache"
    );
    pair.proxy.stop().await;
}

/// Redis runs a SELECT queued in MULTI at EXEC, and the client stays in that database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn select_inside_multi_moves_the_client_like_redis() {
    let pair = Pair::start().await;
    check_all(&pair, &DB_SCRIPTS[2..3], Mode::OneByOne).await;
    pair.proxy.stop().await;
}

// ---- 5. connection state ----

const CONN_SCRIPTS: &[(&str, &[&str])] = &[
    (
        "CLIENT REPLY",
        &[
            "A~ CLIENT REPLY SKIP ; SET cr:a 1 ; GET cr:a",
            "A~ CLIENT REPLY OFF ; SET cr:b 2 ; GET cr:b ; INCR cr:b ; CLIENT REPLY ON ; GET cr:b",
            "A~ CLIENT REPLY SKIP ; CLIENT REPLY SKIP ; PING ; PING",
            "A~ CLIENT REPLY OFF ; CLIENT REPLY SKIP ; PING ; CLIENT REPLY ON ; PING",
            "A~ CLIENT REPLY SKIP ; MULTI ; SET cr:c 1 ; EXEC ; GET cr:c",
            "A~ CLIENT REPLY SKIP ; BLPOP cr:none 0.1 ; PING",
            "A~ CLIENT REPLY OFF ; GET cr:a ; GET cr:a ; GET cr:a ; CLIENT REPLY ON ; GET cr:a",
            "A~ CLIENT REPLY SKIP ; SELECT 1 ; GET cr:a ; SELECT 0",
            "A~ CLIENT REPLY OFF ; NOSUCHCOMMAND ; CLIENT REPLY ON",
            "A~ CLIENT REPLY FOO ; CLIENT REPLY ; CLIENT REPLY ON extra",
            // ON right after SKIP cancels the skip: its own +OK is sent.
            "A~ CLIENT REPLY SKIP ; CLIENT REPLY ON ; PING",
        ],
    ),
    (
        "CLIENT KILL",
        &[
            "B: CLIENT ID => idb #any",
            "A: CLIENT KILL ID @idb",
            "B: !closed",
            "A: CLIENT KILL ID @idb",
            "C: PING",
            "A: CLIENT KILL ADDR @addr:C",
            "C: !closed",
            "D: PING",
            "A: CLIENT KILL @addr:D",
            "D: !closed",
            "A: CLIENT KILL 127.0.0.1:1",
            "A: CLIENT KILL ADDR 127.0.0.1:1 SKIPME yes",
            "A: CLIENT KILL ID 0",
            "A: CLIENT KILL ID x",
            "A: CLIENT KILL FOO bar",
            "A: CLIENT KILL ID 1 SKIPME maybe",
            "A: CLIENT KILL",
            "A: client kill id 10 wrong_arg",
            "A: CLIENT KILL ID -1",
            "A: CLIENT KILL TYPE wrong_type",
            "A: CLIENT KILL USER wrong_user",
            "A: CLIENT KILL USER default ADDR 127.0.0.1:1",
            "A: CLIENT ID => ida #any",
            "A: CLIENT KILL ID @ida",
            "A: CLIENT KILL ID @ida SKIPME yes",
            "A: CLIENT KILL ADDR @addr:A",
            "A: PING",
            "A: CLIENT KILL ID @ida SKIPME no",
            "A: !closed",
        ],
    ),
    (
        "CLIENT NO-EVICT",
        &[
            "A: CLIENT NO-EVICT on",
            "A: CLIENT NO-EVICT off",
            "A: CLIENT NO-EVICT maybe",
            "A: CLIENT NO-EVICT",
        ],
    ),
    (
        "RESET inside MULTI",
        &[
            "A: MULTI",
            "A: SET rs:k x",
            "A: RESET",
            "A: EXEC",
            "A: GET rs:k",
            "A: SELECT 1",
            "A: SET rs:db one",
            "A: RESET",
            "A: GET rs:db",
        ],
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connection_state_matches_redis() {
    let pair = Pair::start().await;
    check_all(&pair, CONN_SCRIPTS, Mode::OneByOne).await;
    pair.proxy.stop().await;
}

/// RESET must clear what MULTI and WATCH left on the upstream connection (corral returns
/// that connection to its idle pool, where the next MULTI, WATCH or blocking command of any
/// client picks it up), and turn replies back on.
const RESET_SCRIPTS: &[(&str, &[&str])] = &[
    (
        "RESET clears WATCH",
        &[
            "A: WATCH rs:w",
            "A: RESET",
            "B: SET rs:w theirs",
            "A: MULTI",
            "A: SET rs:w mine",
            "A: EXEC",
        ],
    ),
    (
        "RESET leaves no MULTI for the next client",
        &[
            "A: MULTI",
            "A: SET rs:x 1",
            "A: RESET",
            "B: BLPOP rs:none 0.05",
            "C: MULTI",
            "C: SET rs:y 2",
            "C: EXEC",
            "C: GET rs:x",
        ],
    ),
    (
        "RESET leaves no WATCH for the next client",
        &[
            "A: WATCH rs:v",
            "A: RESET",
            "C: SET rs:v other",
            "B: MULTI",
            "B: SET rs:v b",
            "B: EXEC",
        ],
    ),
    (
        "RESET pipelined inside MULTI",
        &["A: MULTI ; SET rs:p 1 ; RESET ; GET rs:p ; EXEC"],
    ),
    (
        "RESET turns replies back on",
        &["A~ CLIENT REPLY OFF ; RESET ; PING"],
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_clears_transactions_like_redis() {
    let pair = Pair::start().await;
    check_all(&pair, RESET_SCRIPTS, Mode::OneByOne).await;
    pair.proxy.stop().await;
}

/// CLIENT LIST through corral lists corral's own clients (ids from CLIENT ID, names from
/// CLIENT SETNAME, the addresses corral sees), not the upstream's connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_list_shows_corrals_clients() {
    let pair = Pair::start().await;
    let mut admin = connect(pair.behind).await;
    let mut direct = connect(pair.direct).await;
    for resp3 in [false, true] {
        let mut a = common::client_in(pair.proxy.addr, resp3).await;
        let mut b = common::client_in(pair.proxy.addr, resp3).await;
        let mut ids = Vec::new();
        for (c, name) in [(&mut a, "alpha"), (&mut b, "beta")] {
            let r = c.call(&format!("CLIENT SETNAME {name}")).await;
            assert_eq!(show(&r), show(b"+OK\r\n"));
            let id = c.call("CLIENT ID").await;
            ids.push(String::from_utf8_lossy(&id[1..id.len() - 2]).into_owned());
        }
        let addrs = [
            a.stream.local_addr().unwrap(),
            b.stream.local_addr().unwrap(),
        ];
        // The same reply type as Redis gives (bulk in RESP2, verbatim in RESP3).
        if resp3 {
            direct.call("HELLO 3").await;
        }
        let redis_type = direct.call("CLIENT LIST").await[0];

        // Earlier clients (the proxy's readiness probe, the other protocol's round) may take
        // a moment to be noticed gone.
        let lines = {
            let deadline = Instant::now() + LIMIT;
            loop {
                let r = a.call("CLIENT LIST").await;
                assert_eq!(r[0], redis_type, "CLIENT LIST reply type: {}", show(&r));
                let text = text_of(&r);
                let lines: Vec<String> = text.lines().map(str::to_string).collect();
                if lines.len() == 2 {
                    break lines;
                }
                assert!(Instant::now() < deadline, "CLIENT LIST: {text}");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        };
        for (i, name) in ["alpha", "beta"].iter().enumerate() {
            let line = lines
                .iter()
                .find(|l| field(l, "id") == Some(ids[i].as_str()))
                .unwrap_or_else(|| panic!("no id={} in {lines:#?}", ids[i]));
            assert_eq!(field(line, "name"), Some(*name), "{line}");
            assert_eq!(
                field(line, "addr"),
                Some(addrs[i].to_string().as_str()),
                "{line}"
            );
            let resp = if resp3 { "3" } else { "2" };
            assert_eq!(field(line, "resp"), Some(resp), "{line}");
        }
        // None of them is one of the upstream's connections. A connection is both its ends:
        // on loopback the kernel may give corral's upstream connection the same local port
        // as a test client's, since they go to different servers.
        let ends = |l: &str| {
            (
                field(l, "addr").unwrap_or_default().to_string(),
                field(l, "laddr").unwrap_or_default().to_string(),
            )
        };
        let upstream: Vec<(String, String)> = normal_clients(&mut admin)
            .await
            .iter()
            .map(|l| ends(l))
            .collect();
        for l in &lines {
            assert_eq!(
                field(l, "laddr"),
                Some(pair.proxy.addr.to_string().as_str()),
                "{l}"
            );
            let mine = ends(l);
            assert!(!upstream.contains(&mine), "upstream's {mine:?} listed");
        }

        // Filters, and state shown: database, in-MULTI.
        let only_b = text_of(&a.call(&format!("CLIENT LIST ID {}", ids[1])).await);
        assert_eq!(only_b.lines().count(), 1, "{only_b}");
        assert_eq!(field(&only_b, "name"), Some("beta"));
        assert_eq!(
            text_of(&a.call("CLIENT LIST TYPE normal").await)
                .lines()
                .count(),
            2
        );
        assert_eq!(text_of(&a.call("CLIENT LIST TYPE pubsub").await), "");
        b.call("SELECT 2").await;
        b.call("MULTI").await;
        // corral publishes a client's state right after writing its reply, so another
        // client may briefly see the previous state: poll.
        let deadline = Instant::now() + LIMIT;
        loop {
            let line = text_of(&a.call(&format!("CLIENT LIST ID {}", ids[1])).await);
            let in_multi = field(&line, "flags").is_some_and(|f| f.contains('x'));
            if field(&line, "db") == Some("2") && in_multi {
                break;
            }
            assert!(Instant::now() < deadline, "want db=2 and flags x: {line}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(show(&b.call("DISCARD").await), show(b"+OK\r\n"));
    }
    pair.proxy.stop().await;
}

/// CLIENT LIST's `cmd=` and `flags=` are each client's own, as Redis shows them: the last
/// command a client sent, `P` while subscribed, `b` while blocked, `x` in MULTI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_list_shows_each_clients_command_and_flags() {
    let pair = Pair::start().await;
    let mut direct = connect(pair.direct).await;
    for resp3 in [false, true] {
        let mut a = common::client_in(pair.proxy.addr, resp3).await;
        let mut sub = common::client_in(pair.proxy.addr, resp3).await;
        let mut blocked = common::client_in(pair.proxy.addr, resp3).await;
        let mut multi = common::client_in(pair.proxy.addr, resp3).await;
        let mut idle = common::client_in(pair.proxy.addr, resp3).await;
        let mut ids = Vec::new();
        for c in [&mut sub, &mut blocked, &mut multi, &mut idle] {
            let id = c.call("CLIENT ID").await;
            ids.push(String::from_utf8_lossy(&id[1..id.len() - 2]).into_owned());
        }
        sub.call("SUBSCRIBE cl:ch").await;
        blocked.send(&encode(&[b"BLPOP", b"cl:none", b"0"])).await;
        multi.call("MULTI").await;
        multi.call("CONFIG GET maxmemory").await;
        idle.call("GET cl:k").await;
        // What Redis shows for clients in the same states (its own ids differ).
        let want = [
            ("P", "subscribe"),
            ("b", "blpop"),
            ("x", "config|get"),
            ("N", "get"),
        ];
        let mut admin = connect(pair.direct).await;
        let mut d = connect(pair.direct).await;
        d.call("SUBSCRIBE cl:ch").await;
        let line = text_of(&admin.call("CLIENT LIST TYPE pubsub").await);
        assert_eq!(
            (field(&line, "flags"), field(&line, "cmd")),
            (Some(want[0].0), Some(want[0].1)),
            "redis: {line}"
        );
        // corral publishes a client's state right after writing its reply, and a blocked
        // client's once its command is sent: poll.
        for (i, (flags, cmd)) in want.iter().enumerate() {
            let deadline = Instant::now() + LIMIT;
            loop {
                let line = text_of(&a.call(&format!("CLIENT LIST ID {}", ids[i])).await);
                if field(&line, "flags") == Some(flags) && field(&line, "cmd") == Some(cmd) {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "want flags={flags} cmd={cmd}: {line}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        // The caller's own line names the CLIENT LIST it is running, like CLIENT INFO.
        let me = text_of(&a.call("CLIENT LIST").await);
        let mine = text_of(&a.call("CLIENT INFO").await);
        let my_id = field(&mine, "id").unwrap_or_default().to_string();
        let my_line = me
            .lines()
            .find(|l| field(l, "id") == Some(my_id.as_str()))
            .unwrap_or_else(|| panic!("no id={my_id} in {me}"));
        assert_eq!(field(my_line, "cmd"), Some("client|list"), "{my_line}");
        assert_eq!(field(&mine, "cmd"), Some("client|info"), "{mine}");
        // The query buffer holds the running command, as in Redis; others' are empty.
        let redis_info = text_of(&direct.call("CLIENT INFO").await);
        assert_eq!(field(&mine, "qbuf"), field(&redis_info, "qbuf"), "{mine}");
        assert_eq!(
            field(my_line, "qbuf"),
            field(&redis_info, "qbuf"),
            "{my_line}"
        );
        for l in me
            .lines()
            .filter(|l| field(l, "id") != Some(my_id.as_str()))
        {
            assert_eq!(field(l, "qbuf"), Some("0"), "{l}");
        }
        // An unknown command is `NULL`, as in Redis.
        let r = idle.call("NOSUCHCOMMAND").await;
        let want_err = direct.call("NOSUCHCOMMAND").await;
        assert_eq!(show(&r), show(&want_err));
        let deadline = Instant::now() + LIMIT;
        loop {
            let line = text_of(&a.call(&format!("CLIENT LIST ID {}", ids[3])).await);
            if field(&line, "cmd") == Some("NULL") {
                break;
            }
            assert!(Instant::now() < deadline, "want cmd=NULL: {line}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        multi.call("DISCARD").await;
        let mut pusher = connect(pair.proxy.addr).await;
        pusher.call("RPUSH cl:none x").await;
        blocked.read_reply().await;
        direct = connect(pair.direct).await;
    }
    pair.proxy.stop().await;
}

/// MONITOR through corral: the monitoring client sees what other corral clients run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_sees_other_clients_commands() {
    let pair = Pair::start().await;
    let mut admin = connect(pair.behind).await;
    let mut direct = connect(pair.direct).await;
    for resp3 in [false, true] {
        let mut m = common::client_in(pair.proxy.addr, resp3).await;
        if resp3 {
            direct.call("HELLO 3").await;
        }
        let want = direct.call("MONITOR").await;
        assert_eq!(show(&m.call("MONITOR").await), show(&want));
        let mut w = common::client_in(pair.proxy.addr, resp3).await;
        w.call("SELECT 1").await;
        let key = format!("mon:key{}", u8::from(resp3));
        let r = w.call(&format!("SET {key} value")).await;
        assert_eq!(show(&r), show(b"+OK\r\n"));
        let needle = format!("\"SET\" \"{key}\" \"value\"");
        let deadline = Instant::now() + LIMIT;
        let line = loop {
            let r = m.read_reply().await;
            assert_eq!(r[0], b'+', "monitor line: {}", show(&r));
            if contains(&r, needle.as_bytes()) {
                break r;
            }
            assert!(Instant::now() < deadline, "no {needle} seen");
        };
        // Run in database 1, as the client chose.
        assert!(contains(&line, b" [1 "), "{}", show(&line));
        // The monitor's upstream connection goes away with it.
        drop(m);
        wait_lines(&mut admin, "the MONITOR connection to close", |l| {
            !l.iter()
                .any(|l| field(l, "flags").is_some_and(|f| f.contains('O')))
        })
        .await;
        direct = connect(pair.direct).await;
    }
    pair.proxy.stop().await;
}

/// MONITOR shows the commands corral's clients run, and nothing of corral's own traffic: the
/// cache's tracking lane (cache fills of hot keys, the PING that follows a script), the
/// handshake of a new upstream connection. The trace is the same with the cache on and off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn monitor_leaves_out_corrals_own_connections() {
    let pair = Pair::start().await;
    let mut m = connect(pair.proxy.addr).await;
    assert_eq!(show(&m.call("MONITOR").await), show(b"+OK\r\n"));
    let mut w = connect(pair.proxy.addr).await;
    // A transaction opens a dedicated connection, whose handshake (HELLO) is corral's own:
    // the monitor sees the transaction's commands first, as with Redis.
    for line in ["MULTI", "SET mon:t 1", "EXEC"] {
        w.call(line).await;
    }
    for want in ["\"MULTI\"", "\"SET\" \"mon:t\" \"1\"", "\"EXEC\""] {
        let got = String::from_utf8_lossy(&m.read_reply().await).into_owned();
        assert!(got.contains(want), "want {want}, got {got}");
    }
    w.call("SET mon:hot v").await;
    // Hot enough for the cache: later reads are filled on the lane (PTTL, GET).
    for _ in 0..20 {
        assert_eq!(show(&w.call("GET mon:hot").await), show(&bulk("v")));
    }
    let hits = stat_n(&mut w, "cache_hits").await;
    assert!(hits > 0, "the cache served none of the GETs");
    // A script: corral syncs the lane with a PING before replying.
    w.call("EVAL \"return redis.call('SET', KEYS[1], 'w')\" 1 mon:hot")
        .await;
    w.call("SET mon:end x").await;
    let deadline = Instant::now() + LIMIT;
    loop {
        let r = m.read_reply().await;
        let line = String::from_utf8_lossy(&r).into_owned();
        assert!(line.starts_with('+'), "monitor line: {line}");
        for internal in [
            "\"PING\"",
            "\"PTTL\"",
            "\"MULTI\"",
            "\"EXEC\"",
            "\"TRACKING\"",
        ] {
            assert!(
                !line.contains(internal),
                "corral's own command shown: {line}"
            );
        }
        if line.contains("\"mon:end\"") {
            break;
        }
        assert!(Instant::now() < deadline, "no mon:end seen");
    }
    pair.proxy.stop().await;
}

// ---- 6. refused commands ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_commands_say_so() {
    let pair = Pair::start().await;
    for resp3 in [false, true] {
        let mut c = common::client_in(pair.proxy.addr, resp3).await;
        for (line, name) in [
            ("CLIENT NO-TOUCH ON", "client|no-touch"),
            ("SYNC", "sync"),
            ("PSYNC ? -1", "psync"),
        ] {
            let r = c.call(line).await;
            let text = String::from_utf8_lossy(&r);
            assert!(
                text.starts_with("-ERR ")
                    && text.contains("not supported by corral")
                    && text.contains(&format!("'{name}'"))
                    && text.ends_with("\r\n")
                    && text.matches("\r\n").count() == 1,
                "{line}: {}",
                show(&r)
            );
        }
        // The connection is still an ordinary one.
        assert_eq!(show(&c.call("SET ref:k v").await), show(b"+OK\r\n"));
        assert_eq!(show(&c.call("GET ref:k").await), show(&bulk("v")));
    }
    pair.proxy.stop().await;
}

// ---- pipelined ----

/// Every family's scripts again, each client's consecutive requests in one write: requests
/// going to the shared connection and to a pinned or blocking one then share a write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_family_pipelined_matches_redis() {
    let pair = Pair::start().await;
    for scripts in [
        TX_SCRIPTS,
        BLOCKING_SCRIPTS,
        SCRIPTING_SCRIPTS,
        &DB_SCRIPTS[..2],
        CONN_SCRIPTS,
    ] {
        check_all(&pair, scripts, Mode::Pipelined).await;
    }
    pair.proxy.stop().await;
}

/// Requests written before MULTI, WATCH or a blocking command, in the same write, must run
/// before it, and requests after EXEC after it. Each pattern is repeated: a reordering is a
/// race between two upstream connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_pipelined_around_a_pinned_connection_keep_their_order() {
    let pair = Pair::start().await;
    let mut script = Vec::new();
    for i in 0..20 {
        script.push(format!("A: SET ord:a{i} 1 ; MULTI ; INCR ord:a{i} ; EXEC"));
        script.push(format!(
            "A: SET ord:w{i} 1 ; WATCH ord:w{i} ; MULTI ; INCR ord:w{i} ; EXEC"
        ));
        script.push(format!(
            "A: RPUSH ord:l{i} x ; DEL ord:l{i} ; BLPOP ord:l{i} 0.01"
        ));
        script.push(format!(
            "A: MULTI ; SET ord:e{i} 1 ; EXEC ; INCR ord:e{i} ; GET ord:e{i}"
        ));
        script.push(format!(
            "A: SET ord:s{i} 1 ; SCRIPT FLUSH ; MULTI ; EXEC ; GET ord:s{i}"
        ));
    }
    let script: Vec<&str> = script.iter().map(String::as_str).collect();
    check(&pair, "pipelined ordering", &script, false, Mode::OneByOne).await;
    pair.proxy.stop().await;
}

/// CLIENT UNBLOCK of a client whose blocking command is its first, on a dedicated connection
/// made for it just then: corral names that connection's id on Redis, learnt once it is up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_unblock_reaches_a_client_blocked_on_a_fresh_connection() {
    for how in ["", " TIMEOUT", " ERROR"] {
        let pair = Pair::start().await;
        let behind = pair.behind;
        let mut a = connect(pair.proxy.addr).await;
        let id = String::from_utf8_lossy(&a.cmd("CLIENT ID").await)
            .trim_start_matches(':')
            .trim()
            .to_string();
        a.send(&encode(&[b"BLPOP", b"fresh", b"0"])).await;
        poll_until(LIMIT, "Redis to hold the BLPOP", || async {
            let mut redis = connect(behind).await;
            (blocked_clients(&mut redis).await == 1).then_some(())
        })
        .await;
        let mut b = connect(pair.proxy.addr).await;
        assert_eq!(
            b.cmd(&format!("CLIENT UNBLOCK {id}{how}")).await,
            b":1\r\n",
            "{how}"
        );
        let want: &[u8] = if how == " ERROR" {
            b"-UNBLOCKED client unblocked via CLIENT UNBLOCK\r\n"
        } else {
            b"*-1\r\n"
        };
        assert_eq!(show(&a.read_reply().await), show(want), "{how}");
        pair.proxy.stop().await;
    }
}

/// Commands that change the client itself (its user, protocol, name, reply mode) are refused
/// inside MULTI, and EXEC fails, rather than change only the dedicated connection EXEC runs
/// them on (a documented difference from Redis, which applies them at EXEC). The client goes
/// on as before: same user, protocol and replies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_changing_the_client_are_refused_inside_multi() {
    let pair = Pair::start().await;
    let mut c = connect(pair.proxy.addr).await;
    for (cmd, name) in [
        ("AUTH default x", "auth"),
        ("HELLO 3", "hello"),
        ("CLIENT REPLY OFF", "client|reply"),
        ("CLIENT SETNAME nm", "client|setname"),
    ] {
        assert_eq!(c.cmd("MULTI").await, b"+OK\r\n", "{cmd}");
        let r = c.cmd(cmd).await;
        let want = format!("-ERR '{name}' is not supported by corral");
        assert!(r.starts_with(want.as_bytes()), "{cmd}: {}", show(&r));
        assert!(c.cmd("EXEC").await.starts_with(b"-EXECABORT"), "{cmd}");
        // Still RESP2, replying, as `default`, unnamed.
        assert_eq!(c.cmd("SET w x").await, b"+OK\r\n", "{cmd}");
        assert_eq!(c.cmd("HGETALL nohash").await, b"*0\r\n", "{cmd}");
        assert_eq!(c.cmd("ACL WHOAMI").await, bulk("default"), "{cmd}");
        assert_eq!(c.cmd("CLIENT GETNAME").await, b"$-1\r\n", "{cmd}");
    }
    pair.proxy.stop().await;
}

/// The replies to requests read together are written together, as Redis writes them, even
/// when corral runs them in two rounds (a MULTI takes a connection of its own): ioredis
/// reconnects on an error reply and drops the replies not read with it, so its pipeline of a
/// failing SADD then MULTI ... EXEC lost the transaction's replies when they came apart
/// (180 of 200 such pipelines through corral did).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_to_requests_read_together_are_written_together() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let redis = common::RedisServer::start();
    let proxy = common::TestProxy::start(&redis.url()).await;
    let mut c = connect(proxy.addr).await;
    assert_eq!(show(&c.cmd("SET foo bar").await), show(b"+OK\r\n"));
    let mut pipeline = Vec::new();
    for cmd in [
        &[&b"SADD"[..], b"foo", b"a"][..],
        &[b"MULTI"],
        &[b"GET", b"foo"],
        &[b"INCR", b"i"],
        &[b"EXEC"],
    ] {
        pipeline.extend(encode(cmd));
    }
    let mut split = 0;
    for i in 0..50 {
        let mut s = tokio::net::TcpStream::connect(proxy.addr)
            .await
            .expect("connect");
        s.write_all(&pipeline).await.expect("write");
        let want = format!(
            "-WRONGTYPE Operation against a key holding the wrong kind of value\r\n\
             +OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n$3\r\nbar\r\n:{}\r\n",
            i + 1
        );
        let mut got = Vec::new();
        let mut reads = 0;
        while got.len() < want.len() {
            let mut buf = [0u8; 1024];
            let n = s.read(&mut buf).await.expect("read");
            assert!(n > 0, "closed");
            got.extend_from_slice(&buf[..n]);
            reads += 1;
        }
        assert_eq!(show(&got), show(want.as_bytes()));
        split += usize::from(reads > 1);
    }
    assert_eq!(
        split, 0,
        "pipelines whose replies came in more than one read"
    );
    proxy.stop().await;
}

/// Replies held for the next round (see the test above) still go out before a blocking
/// command in it blocks, as Redis writes them before it blocks the client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_before_a_blocking_command_are_written_before_it_blocks() {
    let redis = common::RedisServer::start();
    let proxy = common::TestProxy::start(&redis.url()).await;
    let mut c = connect(proxy.addr).await;
    let mut pipeline = encode(&[b"SET", b"held", b"1"]);
    pipeline.extend(encode(&[b"BLPOP", b"held:list", b"0"]));
    c.send(&pipeline).await;
    let ok = tokio::time::timeout(LIMIT, c.read_reply()).await;
    assert_eq!(
        show(&ok.expect("the SET's reply while BLPOP blocks")),
        show(b"+OK\r\n")
    );
    let mut other = connect(proxy.addr).await;
    assert_eq!(show(&other.cmd("LPUSH held:list x").await), show(b":1\r\n"));
    let popped = c.read_reply().await;
    assert_eq!(show(&popped), show(b"*2\r\n$9\r\nheld:list\r\n$1\r\nx\r\n"));
    proxy.stop().await;
}
