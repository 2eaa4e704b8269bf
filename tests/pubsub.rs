//! Pub/sub through corral against real Redis: corral answers (P|S)(UN)SUBSCRIBE from shared
//! upstream subscriptions (one RESP3 connection, one subscription per channel or pattern)
//! and fans messages out to its clients.
//!
//! Deterministic sequences are scripts run against one Redis directly and against a second,
//! identical Redis through corral, with the harness's runner (`tests/common/compare.rs`);
//! every reply and message must be the same bytes, in RESP2 and RESP3. Script lines:
//! - `A: CMD args` sends a command and reads its replies: one per argument for the
//!   (P|S)(UN)SUBSCRIBE family (at least one), else one. `#any` at the end compares only
//!   the reply's type.
//! - `A! CMD args` sends a command and reads nothing (CLIENT REPLY OFF/SKIP have no reply).
//! - `A<` reads one frame nobody asked for (a message).
//! - `A: !closed` checks that the server closed A's connection.
//!
//! Every client still open at the end sends a PING: a message delivered once too often (or
//! to a client that should not get it) shows up there as a difference.
//!
//! The other tests drive corral alone and check Redis's side of it directly (one upstream
//! subscriber whatever the number of clients), ordering, slow subscribers, an upstream
//! restart and keyspace notifications.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{
    Deadline, Options, RawClient, Reply, aggregate, bulk, connect, encode, encode_line, field, int,
    int_of, poll_until, reply_text, show,
};

/// Bounds every wait for a state change.
const LIMIT: Duration = Duration::from_secs(10);

// ---- clients and frames ----

/// A pub/sub frame as Redis sends it: a push in RESP3, an array in RESP2, of bulk strings.
fn frame(resp3: bool, parts: &[&[u8]]) -> Vec<u8> {
    aggregate(if resp3 { b'>' } else { b'*' }, parts)
}

/// A `subscribe`-style confirmation: verb, name, count.
fn confirmation(resp3: bool, verb: &str, name: &str, count: i64) -> Vec<u8> {
    let mut out = frame(resp3, &[verb.as_bytes(), name.as_bytes()]);
    out[1] = b'3';
    out.extend_from_slice(&int(count));
    out
}

/// Subscribes `c` (`SUBSCRIBE`, `PSUBSCRIBE` or `SSUBSCRIBE`) to one name, checking the
/// confirmation's bytes.
async fn subscribe(c: &mut RawClient, resp3: bool, cmd: &str, name: &str, count: i64) {
    let r = c.call(&format!("{cmd} {name}")).await;
    let verb = cmd.to_ascii_lowercase();
    assert_eq!(show(&r), show(&confirmation(resp3, &verb, name, count)));
}

/// The number of subscribers Redis itself counts for `channel` (`PUBSUB NUMSUB`).
async fn numsub(server: &mut RawClient, channel: &str) -> i64 {
    let r = server.call(&format!("PUBSUB NUMSUB {channel}")).await;
    let head = [b"*2\r\n".as_slice(), &bulk(channel), b":"].concat();
    let n = r
        .strip_prefix(head.as_slice())
        .and_then(|rest| std::str::from_utf8(rest).ok())
        .and_then(|rest| rest.trim_end().parse().ok());
    n.unwrap_or_else(|| panic!("PUBSUB NUMSUB {channel}: {}", show(&r)))
}

/// PUBLISHes on `c` and returns the receiver count it reports.
async fn publish(c: &mut RawClient, channel: &str, payload: &str) -> i64 {
    let r = c
        .request(&[b"PUBLISH", channel.as_bytes(), payload.as_bytes()])
        .await;
    int_of(&r).unwrap_or_else(|| panic!("PUBLISH {channel}: {}", show(&r)))
}

/// The payload of a RESP2 `message` frame on `channel`, or a panic naming what came instead.
fn message_payload(got: &[u8], channel: &str) -> Vec<u8> {
    let head = [b"*3\r\n".as_slice(), &bulk("message"), &bulk(channel)].concat();
    let body = got
        .strip_prefix(head.as_slice())
        .unwrap_or_else(|| panic!("not a message on {channel}: {}", show(got)));
    let eol = body.windows(2).position(|w| w == b"\r\n").expect("header");
    body[eol + 2..body.len() - 2].to_vec()
}

/// corral's clients' addresses, from CLIENT LIST through corral.
async fn corral_client_addrs(proxy: SocketAddr) -> Vec<String> {
    let mut c = connect(proxy).await;
    let list = reply_text(&c.call("CLIENT LIST").await);
    list.lines()
        .filter_map(|l| field(l, "addr"))
        .map(str::to_string)
        .collect()
}

// ---- scripts ----

type Pair = common::RedisPair;

/// Runs `script` on both sides (the harness's runner, a PING from every client still open at
/// the end) and asserts that every reply is the same bytes. Returns (Redis's, corral's).
async fn check(pair: &Pair, name: &str, script: &[&str], resp3: bool) -> [Vec<Reply>; 2] {
    let opts = Options {
        end_ping: true,
        ..Options::resp(resp3)
    };
    common::check(pair.sides(), name, script, opts).await
}

// ---- 1. scripts compared with Redis ----

const SCRIPTS: &[(&str, &[&str])] = &[
    (
        "counts in confirmations",
        &[
            "A: SUBSCRIBE a b",
            // Already subscribed: the count stays.
            "A: SUBSCRIBE a",
            "A: PSUBSCRIBE p*",
            // Shard channels are counted apart from channels and patterns.
            "A: SSUBSCRIBE s",
            "A: SSUBSCRIBE s2 s",
            "A: UNSUBSCRIBE a",
            "A: UNSUBSCRIBE nosuch",
            "A: PUNSUBSCRIBE p*",
            "A: SUNSUBSCRIBE s",
            // One subscription left of each kind: argument-less forms name it.
            "A: UNSUBSCRIBE",
            "A: SUNSUBSCRIBE",
            // Nothing left: a nil name.
            "A: PUNSUBSCRIBE",
            "A: UNSUBSCRIBE",
            "A: SUNSUBSCRIBE",
            // Out of subscribed mode.
            "A: GET k",
        ],
    ),
    (
        "unsubscribing without subscriptions",
        &[
            "A: UNSUBSCRIBE",
            "A: PUNSUBSCRIBE",
            "A: SUNSUBSCRIBE",
            "A: UNSUBSCRIBE x y",
            "A: PUNSUBSCRIBE x*",
            "A: SUNSUBSCRIBE x",
            "A: GET k",
        ],
    ),
    (
        "wrong arity",
        &[
            "A: SUBSCRIBE",
            "A: PSUBSCRIBE",
            "A: SSUBSCRIBE",
            "A: GET k",
            "A: SUBSCRIBE c",
            "A: SUBSCRIBE",
            "A: PSUBSCRIBE",
            "A: SSUBSCRIBE",
            "A: UNSUBSCRIBE c",
        ],
    ),
    (
        "subscribed mode",
        &[
            "A: SUBSCRIBE c",
            "A: GET k",
            "A: get k",
            "A: SET k v",
            "A: ECHO x",
            "A: PING",
            "A: PING hello",
            "A: PSUBSCRIBE d*",
            "A: UNSUBSCRIBE c",
            // Still subscribed, to a pattern.
            "A: GET k",
            "A: PING",
            "A: PUNSUBSCRIBE d*",
            "A: SSUBSCRIBE e",
            // A shard channel alone is subscribed mode too.
            "A: GET k",
            "A: PING x",
            "A: SUNSUBSCRIBE e",
            "A: PING",
            "A: PING hello",
            "A: GET k",
        ],
    ),
    (
        "QUIT while subscribed",
        &[
            "A: SUBSCRIBE c",
            "A: PSUBSCRIBE c*",
            "A: QUIT",
            "A: !closed",
        ],
    ),
    (
        "RESET while subscribed",
        &[
            "A: SUBSCRIBE c",
            "A: PSUBSCRIBE c*",
            "A: SSUBSCRIBE cs",
            "A: RESET",
            "A: GET k",
            // Nobody is subscribed any more: RESET's reply came once Redis had dropped
            // corral's upstream subscriptions, so the count is Redis's 0.
            "B: PUBLISH c gone",
            "B: PUBSUB NUMSUB c",
            "B: PUBSUB NUMPAT",
            "A: PING",
        ],
    ),
    (
        "messages delivered",
        &[
            "A: SUBSCRIBE a b",
            "A: PSUBSCRIBE p*",
            "A: SSUBSCRIBE s",
            "B: PUBLISH a hello",
            "A<",
            "B: PUBLISH pq \"two words\"",
            "A<",
            "B: SPUBLISH s sharded",
            "A<",
            "B: PUBLISH zz nobody",
            "A: UNSUBSCRIBE a",
            // Delivered to nobody: A's confirmation came once Redis had dropped corral's
            // upstream subscription, so the count is 0, as Redis says.
            "B: PUBLISH a dropped",
            "B: PUBLISH b still",
            "A<",
            "C: SUBSCRIBE b",
            "C: PSUBSCRIBE b*",
            // Three receivers (A, C, C's pattern): corral counts its own subscribers, as
            // Redis counts its clients.
            "B: PUBLISH b both",
            "A<",
            // A channel subscriber gets `message`, then a pattern subscriber `pmessage`.
            "C<",
            "C<",
            "B: PUBSUB NUMSUB b zz",
            "B: PUBLISH \"p\r\nbinary\" \"\x00\r\n\"",
            "A<",
        ],
    ),
    (
        "counts with many subscribers",
        &[
            "A: SUBSCRIBE ch",
            "B: SUBSCRIBE ch other",
            "C: PSUBSCRIBE c*",
            "D: PSUBSCRIBE c*",
            "H: PSUBSCRIBE *h",
            "E: SSUBSCRIBE sh",
            "F: SSUBSCRIBE sh",
            // Redis counts one per client subscription: A, B, C, D, H.
            "G: PUBLISH ch x",
            "A<",
            "B<",
            "C<",
            "D<",
            "H<",
            "G: PUBLISH cz y",
            "C<",
            "D<",
            "G: PUBLISH other z",
            "B<",
            "G: SPUBLISH sh s",
            "E<",
            "F<",
            "G: PUBSUB NUMSUB ch other none",
            "G: PUBSUB SHARDNUMSUB sh none",
            "G: PUBSUB NUMPAT",
            "G: PUBSUB CHANNELS o*",
            "G: PUBSUB SHARDCHANNELS",
            // The last subscriber of a channel or pattern leaves: no count is left behind.
            // (An argument-less UNSUBSCRIBE names its channels in hash order: not compared.)
            "B: UNSUBSCRIBE #any",
            "B< #any",
            "G: PUBLISH other z",
            "D: PUNSUBSCRIBE",
            "H: PUNSUBSCRIBE",
            "G: PUBLISH ch x",
            "A<",
            "C<",
            "G: PUBSUB NUMPAT",
            "E: SUNSUBSCRIBE sh",
            "G: SPUBLISH sh s",
            "F<",
            "F: SUNSUBSCRIBE",
            "G: SPUBLISH sh s",
            "G: PUBSUB SHARDNUMSUB sh",
        ],
    ),
    (
        "confirmations and messages with CLIENT REPLY OFF",
        &[
            // Redis sends (un)subscribe confirmations and messages as pushes, which CLIENT
            // REPLY does not silence, in RESP2 too.
            "A! CLIENT REPLY OFF",
            "A: SUBSCRIBE channel",
            "A: PSUBSCRIBE ch*",
            "A! CLIENT REPLY OFF",
            "B: PUBLISH channel hello",
            "A<",
            "A<",
            "A! CLIENT REPLY OFF",
            "A: UNSUBSCRIBE channel",
            "A: PUNSUBSCRIBE ch*",
            "A: CLIENT REPLY ON",
            "A! CLIENT REPLY SKIP",
            "A: PSUBSCRIBE *",
            "B: CONFIG SET notify-keyspace-events KA",
            "B: SET foo bar",
            "A<",
            "A: PUNSUBSCRIBE *",
            "B: CONFIG SET notify-keyspace-events \"\"",
        ],
    ),
    (
        "publish after UNSUBSCRIBE without arguments",
        &[
            "A: SUBSCRIBE chan1 chan2 chan3",
            "A: UNSUBSCRIBE #any",
            "A< #any",
            "A< #any",
            "B: PUBLISH chan1 hello",
            "B: PUBLISH chan2 hello",
            "B: PUBLISH chan3 hello",
            "A: PSUBSCRIBE chan*",
            "A: PUNSUBSCRIBE",
            "B: PUBLISH chan1 hello",
            "B: PUBSUB NUMPAT",
        ],
    ),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_match_redis() {
    let pair = Pair::start().await;
    for (name, script) in SCRIPTS {
        for resp3 in [false, true] {
            check(&pair, name, script, resp3).await;
        }
    }
    pair.proxy.stop().await;
}

/// RESP2 subscribed mode, where Redis checks a command's existence and arity before the
/// subscribed-mode rule, and names subcommands as `container|sub`.
const SUBSCRIBED_ERROR_SCRIPTS: &[(&str, &[&str])] = &[(
    "errors in subscribed mode",
    &[
        "A: SUBSCRIBE c",
        "A: NOSUCHCOMMAND x",
        // Not `GET` without a key: Redis reports its arity before the subscribed-mode rule,
        // and corral has no arity table for forwarded commands (a documented difference).
        "A: PING a b",
        "A: CONFIG GET maxmemory",
        "A: CLIENT GETNAME",
        "A: UNSUBSCRIBE c",
    ],
)];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribed_mode_errors_match_redis() {
    let pair = Pair::start().await;
    for (name, script) in SUBSCRIBED_ERROR_SCRIPTS {
        for resp3 in [false, true] {
            check(&pair, name, script, resp3).await;
        }
    }
    pair.proxy.stop().await;
}

// ---- 2. many subscribers, one upstream subscription ----

/// The `CLIENT LIST TYPE pubsub` lines of a server.
async fn pubsub_clients(server: &mut RawClient) -> usize {
    reply_text(&server.call("CLIENT LIST TYPE pubsub").await)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_subscribers_share_one_upstream_subscription() {
    const CLIENTS: usize = 1000;
    const MESSAGES: usize = 20;
    let pair = Pair::start().await;
    let mut redis = connect(pair.behind).await;
    let mut subs = Vec::with_capacity(CLIENTS);
    for _ in 0..CLIENTS {
        let mut c = connect(pair.proxy.addr).await;
        c.send(&encode(&[b"SUBSCRIBE", b"many"])).await;
        subs.push(c);
    }
    // Every confirmation, once everyone asked: the first waits for Redis, the others join.
    for c in &mut subs {
        let r = c.read_reply().await;
        assert_eq!(show(&r), show(&confirmation(false, "subscribe", "many", 1)));
    }
    assert_eq!(numsub(&mut redis, "many").await, 1, "Redis's subscribers");
    assert_eq!(
        pubsub_clients(&mut redis).await,
        1,
        "Redis's pub/sub clients"
    );

    let mut publisher = connect(pair.proxy.addr).await;
    for i in 0..MESSAGES {
        // Through corral, PUBLISH counts every subscriber, as Redis would.
        assert_eq!(
            publish(&mut publisher, "many", &format!("m{i}")).await,
            CLIENTS as i64
        );
    }
    for (n, c) in subs.iter_mut().enumerate() {
        for i in 0..MESSAGES {
            let got = c.read_reply().await;
            let want = frame(false, &[b"message", b"many", format!("m{i}").as_bytes()]);
            assert_eq!(show(&got), show(&want), "subscriber {n}, message {i}");
        }
        assert!(
            !c.has_pending_reply(),
            "subscriber {n}: more than {MESSAGES}"
        );
    }

    // The last one to leave ends the upstream subscription.
    drop(subs);
    poll_until(LIMIT, "Redis to count no subscriber", || async {
        let mut redis = connect(pair.behind).await;
        (numsub(&mut redis, "many").await == 0).then_some(())
    })
    .await;
    pair.proxy.stop().await;
}

// ---- 3. patterns and shard channels ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patterns_and_shard_channels_deliver_redis_frames() {
    let pair = Pair::start().await;
    let mut redis = connect(pair.behind).await;
    for resp3 in [false, true] {
        let mut p = common::client_in(pair.proxy.addr, resp3).await;
        subscribe(&mut p, resp3, "PSUBSCRIBE", "news.*", 1).await;
        let mut s = common::client_in(pair.proxy.addr, resp3).await;
        subscribe(&mut s, resp3, "SSUBSCRIBE", "shard", 1).await;

        // Published directly on Redis: what corral relays is what Redis sent it.
        let r = redis.call("PUBLISH news.x payload").await;
        assert_eq!(show(&r), show(&int(1)));
        let got = p.read_reply().await;
        let want = frame(resp3, &[b"pmessage", b"news.*", b"news.x", b"payload"]);
        assert_eq!(show(&got), show(&want));
        // Not a match for the pattern: nothing for p (the PING shows it).
        assert_eq!(
            show(&redis.call("PUBLISH news payload").await),
            show(&int(0))
        );

        let r = redis.call("SPUBLISH shard payload").await;
        assert_eq!(show(&r), show(&int(1)));
        let got = s.read_reply().await;
        assert_eq!(
            show(&got),
            show(&frame(resp3, &[b"smessage", b"shard", b"payload"]))
        );
        // A shard channel is not a channel: PUBLISH does not reach it.
        assert_eq!(show(&redis.call("PUBLISH shard x").await), show(&int(0)));

        let pong: &[u8] = if resp3 {
            b"+PONG\r\n"
        } else {
            b"*2\r\n$4\r\npong\r\n$0\r\n\r\n"
        };
        assert_eq!(show(&p.call("PING").await), show(pong));
        assert_eq!(show(&s.call("PING").await), show(pong));
    }
    pair.proxy.stop().await;
}

// ---- 4. RESP3 pushes between replies ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resp3_pushes_interleave_with_replies_in_order() {
    const ROUNDS: usize = 50;
    const KEYS_PER_ROUND: usize = 10;
    const MESSAGES_PER_ROUND: usize = 5;
    let pair = Pair::start().await;
    let mut a = common::client_in(pair.proxy.addr, true).await;
    subscribe(&mut a, true, "SUBSCRIBE", "feed", 1).await;
    let mut b = connect(pair.proxy.addr).await;

    let (mut replies, mut pushes) = (Vec::new(), Vec::new());
    let mut expected = Vec::new();
    let mut counter = 0;
    for round in 0..ROUNDS {
        let mut batch = Vec::new();
        for k in 0..KEYS_PER_ROUND {
            let (key, value) = (format!("il:{round}:{k}"), format!("v{round}.{k}"));
            batch.extend(encode(&[b"SET", key.as_bytes(), value.as_bytes()]));
            batch.extend(encode(&[b"GET", key.as_bytes()]));
            batch.extend(encode(&[b"INCR", b"il:counter"]));
            counter += 1;
            expected.extend([b"+OK\r\n".to_vec(), bulk(&value), int(counter)]);
        }
        // B's messages and A's pipeline are in flight at the same time.
        let publishing = async {
            for m in 0..MESSAGES_PER_ROUND {
                let n = round * MESSAGES_PER_ROUND + m;
                assert_eq!(publish(&mut b, "feed", &format!("p{n}")).await, 1);
            }
        };
        let pipelining = async {
            a.send(&batch).await;
            while replies.len() < expected.len() {
                let f = a.read_reply().await;
                if f.starts_with(b">") {
                    &mut pushes
                } else {
                    &mut replies
                }
                .push(f);
            }
        };
        tokio::join!(publishing, pipelining);
    }
    let total = ROUNDS * MESSAGES_PER_ROUND;
    while pushes.len() < total {
        let f = a.read_reply().await;
        assert!(
            f.starts_with(b">"),
            "a reply nobody asked for: {}",
            show(&f)
        );
        pushes.push(f);
    }
    for (i, (got, want)) in replies.iter().zip(&expected).enumerate() {
        assert_eq!(show(got), show(want), "reply {i}");
    }
    for (n, got) in pushes.iter().enumerate() {
        let want = frame(true, &[b"message", b"feed", format!("p{n}").as_bytes()]);
        assert_eq!(show(got), show(&want), "push {n}");
    }
    // Nothing more: no message twice, no reply left over.
    assert_eq!(show(&a.call("PING").await), show(b"+PONG\r\n"));
    pair.proxy.stop().await;
}

// ---- 5. confirmations follow Redis's ----

/// Right after a client sees its confirmation, a message published directly on Redis must
/// reach it: corral may only confirm once Redis has confirmed its own subscription. Two
/// clients subscribe at once each time, so the second may join a subscription still pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_published_after_the_confirmation_is_delivered() {
    let pair = Pair::start().await;
    let mut redis = connect(pair.behind).await;
    let mut a = common::client_in(pair.proxy.addr, false).await;
    let mut c = common::client_in(pair.proxy.addr, true).await;
    // Per client: channels and patterns, and shard channels (counted apart).
    let (mut plain, mut shard) = (0, 0);
    for i in 0..100 {
        let (cmd, name, publish_cmd, channel) = match i % 3 {
            0 => ("SUBSCRIBE", format!("ord{i}"), "PUBLISH", format!("ord{i}")),
            1 => (
                "PSUBSCRIBE",
                format!("ord{i}.*"),
                "PUBLISH",
                format!("ord{i}.x"),
            ),
            _ => (
                "SSUBSCRIBE",
                format!("ord{i}"),
                "SPUBLISH",
                format!("ord{i}"),
            ),
        };
        let count = if cmd == "SSUBSCRIBE" {
            shard += 1;
            shard
        } else {
            plain += 1;
            plain
        };
        a.send(&encode_line(&format!("{cmd} {name}"))).await;
        c.send(&encode_line(&format!("{cmd} {name}"))).await;
        let verb = cmd.to_ascii_lowercase();
        for (who, resp3) in [(&mut a, false), (&mut c, true)] {
            let r = who.read_reply().await;
            let want = confirmation(resp3, &verb, &name, count);
            assert_eq!(show(&r), show(&want), "round {i}");
        }
        let r = redis.call(&format!("{publish_cmd} {channel} m{i}")).await;
        assert_eq!(
            show(&r),
            show(&int(1)),
            "round {i}: {cmd} {name} not in place"
        );
        for (who, resp3) in [(&mut a, false), (&mut c, true)] {
            let got = who.read_reply().await;
            let mut parts: Vec<&[u8]> = match cmd {
                "SUBSCRIBE" => vec![b"message"],
                "PSUBSCRIBE" => vec![b"pmessage", name.as_bytes()],
                _ => vec![b"smessage"],
            };
            let payload = format!("m{i}");
            parts.extend([channel.as_bytes(), payload.as_bytes()]);
            assert_eq!(show(&got), show(&frame(resp3, &parts)), "round {i}");
        }
    }
    pair.proxy.stop().await;
}

/// (Un)subscribes pipelined together reach Redis together: each waits for Redis's
/// confirmation before it is answered, but the next one is not held back for it, since both
/// go to Redis in order on the hub's connection (a client subscribing to many names, one
/// command each, waits one round trip, not one per name). Redis's replies on the hub's
/// connection are held by a relay until Redis shows every subscription in place; the
/// confirmations then come in order. Anything else the client sent after them still waits
/// for them: a PUBLISH behind them counts the new subscriptions.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_subscribes_reach_redis_without_waiting_for_each_other() {
    let redis = common::RedisServer::start();
    let relay = common::Relay::start(redis.addr()).await;
    let proxy = common::TestProxy::start_with(&relay.url(), |cfg| {
        // Held replies must not look like a dead connection, nor time out.
        cfg.cache.lane_check_ms = 600_000;
        cfg.cache.lane_deadline_ms = 600_000;
        cfg.upstream.request_timeout_ms = 600_000;
    })
    .await;
    let mut direct = connect(redis.addr()).await;
    let mut first = connect(proxy.addr).await;
    subscribe(&mut first, false, "SUBSCRIBE", "warm", 1).await;
    let hub = relay
        .find_client(redis.addr(), |l| l.contains(" sub=1 "))
        .await;
    let mut kept = Vec::new();
    for (round, resp3) in [false, true].into_iter().enumerate() {
        let mut c = common::client_in(proxy.addr, resp3).await;
        let (a, b, pat) = (
            format!("a{round}"),
            format!("b{round}"),
            format!("p{round}.*"),
        );
        relay.set_fault(hub, common::Fault::HoldReplies);
        let mut sent = encode_line(&format!("SUBSCRIBE {a}"));
        sent.extend(encode_line(&format!("PSUBSCRIBE {pat}")));
        sent.extend(encode_line(&format!("SUBSCRIBE {b}")));
        sent.extend(encode_line(&format!("PUBLISH {a} hello")));
        c.send(&sent).await;
        poll_until(LIMIT, "every subscription to reach Redis", || async {
            let mut direct = connect(redis.addr()).await;
            let subs = numsub(&mut direct, &a).await + numsub(&mut direct, &b).await;
            let pats = int_of(&direct.call("PUBSUB NUMPAT").await);
            (subs == 2 && pats == Some(1 + round as i64)).then_some(())
        })
        .await;
        assert!(
            !c.has_pending_reply(),
            "round {round}: confirmed before Redis did"
        );
        // (RESP2's subscribed mode refused round 0's PUBLISH before it went anywhere.)
        assert_eq!(
            publish_calls(&mut direct).await,
            0,
            "round {round}: the PUBLISH went before the confirmations"
        );
        relay.set_fault(hub, common::Fault::Pass);
        let want = [
            confirmation(resp3, "subscribe", &a, 1),
            confirmation(resp3, "psubscribe", &pat, 2),
            confirmation(resp3, "subscribe", &b, 3),
        ];
        for w in &want {
            assert_eq!(show(&c.read_reply().await), show(w), "round {round}");
        }
        if resp3 {
            // The PUBLISH ran after the subscriptions: it counts this client, and the
            // message comes to it (just before or after the reply).
            let got = [c.read_reply().await, c.read_reply().await];
            let message = frame(true, &[b"message", a.as_bytes(), b"hello"]);
            let shown: Vec<String> = got.iter().map(|r| show(r)).collect();
            assert!(got.contains(&int(1)), "PUBLISH's count: {shown:?}");
            assert!(got.contains(&message), "the message: {shown:?}");
        } else {
            // RESP2's subscribed mode refuses it, as it does once subscribed.
            let got = show(&c.read_reply().await);
            assert!(got.contains("-ERR Can't execute 'publish'"), "{got}");
        }
        kept.push(c);
    }
    proxy.stop().await;
}

/// How many PUBLISH commands Redis ran (`INFO commandstats`).
async fn publish_calls(server: &mut RawClient) -> usize {
    let stats = reply_text(&server.call("INFO commandstats").await);
    stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_publish:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The last subscriber of a name leaves as a new one arrives, on another connection, many
/// times over: whichever of the two reaches corral first, Redis ends up subscribed once the
/// newcomer has its confirmation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newcomer_as_the_last_one_leaves_stays_subscribed() {
    const ROUNDS: usize = 200;
    let pair = Pair::start().await;
    let mut redis = connect(pair.behind).await;
    let mut old = common::client_in(pair.proxy.addr, false).await;
    subscribe(&mut old, false, "PSUBSCRIBE", "turn.*", 1).await;
    for round in 0..ROUNDS {
        let mut new = common::client_in(pair.proxy.addr, false).await;
        // Both at once: the leaver's close and the newcomer's PSUBSCRIBE.
        new.send(&encode_line("PSUBSCRIBE turn.*")).await;
        drop(old);
        let r = new.read_reply().await;
        let want = confirmation(false, "psubscribe", "turn.*", 1);
        assert_eq!(show(&r), show(&want), "round {round}");
        let r = redis.call(&format!("PUBLISH turn.x m{round}")).await;
        assert_eq!(show(&r), show(&int(1)), "round {round}: Redis lost corral");
        let got = new.read_reply().await;
        let payload = format!("m{round}");
        let want = frame(
            false,
            &[b"pmessage", b"turn.*", b"turn.x", payload.as_bytes()],
        );
        assert_eq!(show(&got), show(&want), "round {round}");
        old = new;
    }
    pair.proxy.stop().await;
}

/// One SUBSCRIBE of more channels than the hub connection queues at once (4,096): every
/// one is in place upstream once confirmed, and one UNSUBSCRIBE ends them all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_subscribe_of_ten_thousand_channels_makes_them_all() {
    const CHANNELS: usize = 10_000;
    let pair = Pair::start().await;
    let mut redis = connect(pair.behind).await;
    let mut c = connect(pair.proxy.addr).await;
    let names: Vec<String> = (0..CHANNELS).map(|i| format!("wide{i}")).collect();
    let mut args: Vec<&[u8]> = vec![b"SUBSCRIBE"];
    args.extend(names.iter().map(|n| n.as_bytes()));
    c.send(&encode(&args)).await;
    for (i, name) in names.iter().enumerate() {
        let r = c.read_reply().await;
        let want = confirmation(false, "subscribe", name, i as i64 + 1);
        assert_eq!(show(&r), show(&want));
    }
    let r = redis.call("PUBSUB NUMSUB wide0 wide9999").await;
    let want = [
        b"*4\r\n".as_slice(),
        &bulk("wide0"),
        &int(1),
        &bulk("wide9999"),
        &int(1),
    ]
    .concat();
    assert_eq!(show(&r), show(&want), "Redis's subscribers");
    assert_eq!(publish(&mut redis, "wide9999", "last").await, 1);
    assert_eq!(message_payload(&c.read_reply().await, "wide9999"), b"last");

    c.send(&encode(&[b"UNSUBSCRIBE"])).await;
    for _ in 0..CHANNELS {
        c.read_reply().await;
    }
    assert_eq!(
        show(&redis.call("PUBSUB NUMSUB wide9999").await),
        show(&[b"*2\r\n".as_slice(), &bulk("wide9999"), &int(0)].concat())
    );
    pair.proxy.stop().await;
}

/// RESP3: SUBSCRIBE, a PUBLISH to the channel and UNSUBSCRIBE in one write. The PUBLISH
/// reaches the subscription, as on Redis: it counts it and its message is delivered, before
/// the unsubscribe confirmation. (Redis sends the message before the PUBLISH's reply; corral
/// may send it just after: a push between replies.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_between_subscribe_and_unsubscribe_in_one_write_is_delivered() {
    let pair = Pair::start().await;
    let mut c = common::client_in(pair.proxy.addr, true).await;
    for i in 0..20 {
        let ch = format!("self{i}");
        let mut bytes = encode(&[b"SUBSCRIBE", ch.as_bytes()]);
        bytes.extend(encode(&[b"PUBLISH", ch.as_bytes(), b"x"]));
        bytes.extend(encode(&[b"UNSUBSCRIBE", ch.as_bytes()]));
        bytes.extend(encode(&[b"PING"]));
        c.send(&bytes).await;
        let got: Vec<Vec<u8>> = vec![
            c.read_reply().await,
            c.read_reply().await,
            c.read_reply().await,
            c.read_reply().await,
            c.read_reply().await,
        ];
        let message = frame(true, &[b"message", ch.as_bytes(), b"x"]);
        let mut middle = [got[1].clone(), got[2].clone()];
        middle.sort();
        let mut want = [message, int(1)];
        want.sort();
        assert_eq!(
            show(&got[0]),
            show(&confirmation(true, "subscribe", &ch, 1))
        );
        assert_eq!(
            middle.map(|m| show(&m)),
            want.map(|m| show(&m)),
            "round {i}"
        );
        assert_eq!(
            show(&got[3]),
            show(&confirmation(true, "unsubscribe", &ch, 0))
        );
        assert_eq!(show(&got[4]), show(b"+PONG\r\n"));
    }
    pair.proxy.stop().await;
}

/// RESP2: a message published (and counted) just before its only subscriber unsubscribes
/// comes before the unsubscribe confirmation, as on Redis; never lost, nor after it, where it
/// would read as the reply to the client's next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_published_before_an_unsubscribe_comes_before_its_reply() {
    let pair = Pair::start().await;
    let mut publisher = connect(pair.proxy.addr).await;
    for i in 0..200 {
        let ch = format!("leave{i}");
        let mut b = connect(pair.proxy.addr).await;
        subscribe(&mut b, false, "SUBSCRIBE", &ch, 1).await;
        assert_eq!(publish(&mut publisher, &ch, "x").await, 1);
        let mut bytes = encode(&[b"UNSUBSCRIBE", ch.as_bytes()]);
        bytes.extend(encode(&[b"GET", b"nokey"]));
        b.send(&bytes).await;
        // Redis sent the message on corral's subscription before the PUBLISH's reply, and
        // so before it confirms the unsubscribe that ends that subscription.
        let message = frame(false, &[b"message", ch.as_bytes(), b"x"]);
        assert_eq!(show(&b.read_reply().await), show(&message), "round {i}");
        let unsubscribed = confirmation(false, "unsubscribe", &ch, 0);
        assert_eq!(
            show(&b.read_reply().await),
            show(&unsubscribed),
            "round {i}"
        );
        assert_eq!(show(&b.read_reply().await), show(b"$-1\r\n"), "round {i}");
    }
    pair.proxy.stop().await;
}

/// RESP2: a subscriber that leaves a channel another client keeps gets, before its
/// unsubscribe reply, every message Redis published before it unsubscribed, as on Redis:
/// corral's upstream subscription stays, and messages still on their way in are not lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_leaving_a_shared_channel_gets_what_was_published_before() {
    let pair = Pair::start().await;
    let mut publisher = connect(pair.behind).await;
    let (mut a, mut b) = (
        connect(pair.proxy.addr).await,
        connect(pair.proxy.addr).await,
    );
    subscribe(&mut b, false, "SUBSCRIBE", "shared", 1).await;
    for round in 0..100 {
        subscribe(&mut a, false, "SUBSCRIBE", "shared", 1).await;
        // A burst published directly on Redis, all answered (corral's subscription counted
        // each) before A unsubscribes: some may still be on their way to corral.
        let burst: Vec<u8> = (0..20)
            .flat_map(|i| encode(&[b"PUBLISH", b"shared", format!("{round}-{i}").as_bytes()]))
            .collect();
        publisher.send(&burst).await;
        for _ in 0..20 {
            assert_eq!(publisher.read_reply().await, b":1\r\n");
        }
        a.send(&encode(&[b"UNSUBSCRIBE", b"shared"])).await;
        for i in 0..20 {
            let message = frame(
                false,
                &[b"message", b"shared", format!("{round}-{i}").as_bytes()],
            );
            assert_eq!(show(&a.read_reply().await), show(&message), "round {round}");
        }
        let unsubscribed = confirmation(false, "unsubscribe", "shared", 0);
        assert_eq!(
            show(&a.read_reply().await),
            show(&unsubscribed),
            "round {round}"
        );
    }
    pair.proxy.stop().await;
}

/// (P|S)SUBSCRIBE inside MULTI is refused, and EXEC fails as after any refused command:
/// run by EXEC, it would subscribe the client's dedicated upstream connection, not the
/// client (a documented difference from Redis, which subscribes the client at EXEC).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribe_inside_multi_is_refused_and_exec_fails() {
    let pair = Pair::start().await;
    let mut redis = connect(pair.behind).await;
    for cmd in ["SUBSCRIBE", "PSUBSCRIBE", "SSUBSCRIBE", "UNSUBSCRIBE"] {
        let mut c = connect(pair.proxy.addr).await;
        assert_eq!(show(&c.call("MULTI").await), show(b"+OK\r\n"));
        let r = c.call(&format!("{cmd} inmulti")).await;
        let want = format!("-ERR '{}' is not supported by corral", cmd.to_lowercase());
        assert!(r.starts_with(want.as_bytes()), "{cmd}: {}", show(&r));
        let r = c.call("EXEC").await;
        assert!(r.starts_with(b"-EXECABORT"), "{cmd}: EXEC {}", show(&r));
        assert_eq!(show(&c.call("PING").await), show(b"+PONG\r\n"), "{cmd}");
    }
    assert_eq!(numsub(&mut redis, "inmulti").await, 0);
    pair.proxy.stop().await;
}

// ---- 6. bursts and slow subscribers ----

/// A burst of 30,000 small messages, published in one pipeline directly on Redis, reaches a
/// subscriber that reads as they come whole, as Redis delivers it: corral's queue is counted
/// in bytes (`QUEUE_BYTES`), not in messages.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_read_as_it_comes_is_delivered_whole() {
    const MESSAGES: usize = 30_000;
    let pair = Pair::start().await;
    let mut c = connect(pair.proxy.addr).await;
    subscribe(&mut c, false, "SUBSCRIBE", "burst", 1).await;
    let reader = tokio::spawn(async move {
        for i in 0..MESSAGES {
            let got = c.read_reply().await;
            assert_eq!(message_payload(&got, "burst"), format!("m{i}").as_bytes());
        }
    });
    let bytes: Vec<u8> = (0..MESSAGES)
        .flat_map(|i| encode(&[b"PUBLISH", b"burst", format!("m{i}").as_bytes()]))
        .collect();
    let mut redis = connect(pair.behind).await;
    for r in redis.pipeline(&bytes, 64 * 1024, MESSAGES).await {
        assert_eq!(show(&r), show(&int(1)));
    }
    reader.await.expect("every message, in order");
    pair.proxy.stop().await;
}

/// Messages published per batch in [`Flood`].
const BATCH: usize = 500;

/// Two subscribers of `flood` through corral: `fast` reads everything, `slow` never reads.
/// Messages (1 KB) are published directly on Redis in batches, each read by the fast
/// subscriber before the next, so it is never more than a batch behind corral's queue.
struct Flood {
    pair: Pair,
    redis: RawClient,
    fast: RawClient,
    slow: RawClient,
    slow_addr: String,
    published: usize,
}

impl Flood {
    async fn start() -> Flood {
        let pair = Pair::start().await;
        let mut fast = common::client_in(pair.proxy.addr, false).await;
        subscribe(&mut fast, false, "SUBSCRIBE", "flood", 1).await;
        let mut slow = common::client_in(pair.proxy.addr, false).await;
        subscribe(&mut slow, false, "SUBSCRIBE", "flood", 1).await;
        let slow_addr = slow.stream.local_addr().expect("addr").to_string();
        let redis = connect(pair.behind).await;
        Flood {
            pair,
            redis,
            fast,
            slow,
            slow_addr,
            published: 0,
        }
    }

    fn payload(i: usize) -> Vec<u8> {
        format!("{i:06}{}", "x".repeat(1018)).into_bytes()
    }

    /// Publishes one batch and checks the fast subscriber got all of it, in order.
    async fn batch(&mut self) {
        let range = self.published..self.published + BATCH;
        let mut bytes = Vec::new();
        for i in range.clone() {
            bytes.extend(encode(&[b"PUBLISH", b"flood", &Self::payload(i)]));
        }
        for r in self.redis.pipeline(&bytes, 64 * 1024, BATCH).await {
            assert_eq!(show(&r), show(&int(1)), "corral is Redis's one subscriber");
        }
        for i in range {
            let got = message_payload(&self.fast.read_reply().await, "flood");
            assert!(got == Self::payload(i), "fast subscriber, message {i}");
        }
        self.published += BATCH;
    }

    async fn slow_listed(&self) -> bool {
        let addrs = corral_client_addrs(self.pair.proxy.addr).await;
        addrs.contains(&self.slow_addr)
    }

    /// corral answers, the fast subscriber still gets messages, Redis still counts one.
    async fn check_healthy(&mut self) {
        let mut other = connect(self.pair.proxy.addr).await;
        assert_eq!(show(&other.call("PING").await), show(b"+PONG\r\n"));
        assert_eq!(publish(&mut self.redis, "flood", "last").await, 1);
        let got = message_payload(&self.fast.read_reply().await, "flood");
        assert_eq!(show(&got), show(b"last"));
        assert_eq!(numsub(&mut self.redis, "flood").await, 1);
    }
}

/// A subscriber that stopped reading holds up nobody on its channel, well past corral's
/// queue (`QUEUE_BYTES`, 32 MB) plus what the sockets hold.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_subscriber_holds_up_nobody() {
    let mut f = Flood::start().await;
    while f.published < 60_000 {
        f.batch().await;
    }
    f.check_healthy().await;
    f.pair.proxy.stop().await;
}

/// A subscriber that never reads is disconnected once it is more than the queue behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_subscriber_is_disconnected() {
    let mut f = Flood::start().await;
    // Publishing stops once the slow subscriber is gone, or at 80 MB.
    while f.published < 160 * BATCH && f.slow_listed().await {
        f.batch().await;
    }
    let deadline = Deadline::new(LIMIT, "corral to disconnect the slow subscriber");
    while f.slow_listed().await {
        deadline.pause().await;
    }
    // Closed, not just forgotten: what the sockets held, then the end.
    assert!(f.slow.is_closed().await, "slow subscriber still connected");
    f.check_healthy().await;
    f.pair.proxy.stop().await;
}

// ---- 7. upstream restart ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_get_messages_again_after_an_upstream_restart() {
    let mut pair = Pair::start().await;
    let mut a = common::client_in(pair.proxy.addr, false).await;
    subscribe(&mut a, false, "SUBSCRIBE", "r", 1).await;
    let mut c = common::client_in(pair.proxy.addr, true).await;
    subscribe(&mut c, true, "PSUBSCRIBE", "r*", 1).await;
    let expect = |resp3: bool, payload: &str| match resp3 {
        false => frame(false, &[b"message", b"r", payload.as_bytes()]),
        true => frame(true, &[b"pmessage", b"r*", b"r", payload.as_bytes()]),
    };
    let mut redis = connect(pair.behind).await;
    assert_eq!(publish(&mut redis, "r", "before").await, 2);
    for (who, resp3) in [(&mut a, false), (&mut c, true)] {
        assert_eq!(
            show(&who.read_reply().await),
            show(&expect(resp3, "before"))
        );
    }

    pair.restart_behind();
    // Messages published before corral subscribed again are lost (as for any subscriber of
    // a restarted Redis); a PUBLISH's count says when both subscriptions are back.
    let upstream = pair.behind;
    poll_until(LIMIT, "corral to subscribe again", || async move {
        let mut redis = RawClient::connect(upstream).await.ok()?;
        (publish(&mut redis, "r", "probe").await == 2).then_some(())
    })
    .await;
    let mut redis = connect(upstream).await;
    assert_eq!(publish(&mut redis, "r", "after").await, 2);
    for (who, resp3) in [(&mut a, false), (&mut c, true)] {
        // Any probe that made it, then the message published after recovery.
        loop {
            let got = who.read_reply().await;
            if got == expect(resp3, "after") {
                break;
            }
            assert_eq!(show(&got), show(&expect(resp3, "probe")));
        }
    }
    // Still connected and subscribed.
    let r = a.call("PING").await;
    assert_eq!(show(&r), show(b"*2\r\n$4\r\npong\r\n$0\r\n\r\n"));
    assert_eq!(show(&c.call("PING").await), show(b"+PONG\r\n"));
    // New subscriptions are made on the new connection too.
    let mut d = common::client_in(pair.proxy.addr, false).await;
    subscribe(&mut d, false, "SUBSCRIBE", "r2", 1).await;
    assert_eq!(publish(&mut redis, "r2", "fresh").await, 2, "r2 and r*");
    let want = frame(false, &[b"message", b"r2", b"fresh"]);
    assert_eq!(show(&d.read_reply().await), show(&want));
    pair.proxy.stop().await;
}

// ---- 8. keyspace notifications ----

const KEYSPACE_SCRIPT: &[&str] = &[
    "A: PSUBSCRIBE __keyspace@0__:ks*",
    "B: SET ks:k v",
    "A<",
    // Reads notify nothing.
    "B: GET ks:k",
    "B: EXPIRE ks:k 100",
    "A<",
    "B: DEL ks:k",
    "A<",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyspace_notifications_reach_pattern_subscribers() {
    let pair = Pair::start().await;
    for server in [pair.direct, pair.behind] {
        let mut c = connect(server).await;
        let r = c.call("CONFIG SET notify-keyspace-events KEA").await;
        assert_eq!(show(&r), show(b"+OK\r\n"));
    }
    for resp3 in [false, true] {
        let [_, proxied] = check(&pair, "keyspace", KEYSPACE_SCRIPT, resp3).await;
        let got: Vec<&[u8]> = proxied
            .iter()
            .filter(|r| r.label == "A<")
            .map(|r| r.bytes.as_slice())
            .collect();
        let want: Vec<Vec<u8>> = ["set", "expire", "del"]
            .iter()
            .map(|event| {
                let parts: [&[u8]; 4] = [
                    b"pmessage",
                    b"__keyspace@0__:ks*",
                    b"__keyspace@0__:ks:k",
                    event.as_bytes(),
                ];
                frame(resp3, &parts)
            })
            .collect();
        let want: Vec<&[u8]> = want.iter().map(Vec::as_slice).collect();
        assert_eq!(got, want);
    }
    pair.proxy.stop().await;
}
