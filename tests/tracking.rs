//! Client-side caching through corral (CLIENT TRACKING) against real Redis: the same scripts
//! run against one Redis directly and against a second one through corral, and every reply
//! and invalidation a client receives must be the same bytes, in the same order. Also: the
//! pinned connections are released, the bound holds, and a real client library's
//! client-side cache (redis-rs `cache-aio`) sees direct writes through corral.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::{
    Deadline, Options, Reply, client_list, connect, contains, encode_line, field, mask_hello_id,
    poll_until, show,
};

/// Bounds every wait for a server-side state change.
const LIMIT: Duration = Duration::from_secs(10);

type Pair = common::RedisPair;

/// Masks what necessarily differs between two servers: HELLO's id and the redirection id in
/// TRACKINGINFO (checked separately through corral).
fn mask(reply: &[u8]) -> Vec<u8> {
    let reply = mask_hello_id(reply);
    let key = b"redirect\r\n:";
    let Some(at) = reply.windows(key.len()).position(|w| w == key) else {
        return reply;
    };
    let start = at + key.len();
    let end = start + reply[start..].iter().position(|&b| b == b'\r').unwrap_or(0);
    if &reply[start..end] == b"-1" || &reply[start..end] == b"0" {
        return reply;
    }
    [&reply[..start], b"<id>", &reply[end..]].concat()
}

/// Runs `script` directly and through corral with the harness's runner; what the clients
/// receive must be the same bytes, in order. Returns Redis's side.
///
/// Clients T and X connect through the side's entry, and a `:` step reads frames up to the
/// command's reply, invalidation pushes that come first included; `X<` reads one frame
/// (a redirected invalidation); `#any` compares only the reply's type (an id). W runs
/// commands directly on the side's Redis (a write by another application; it must succeed).
/// `H: key` reads `key` through the entry many times so corral's cache holds it.
async fn same_on_both(p: &Pair, script: &[&str]) -> Vec<Reply> {
    let mut lines = Vec::new();
    for line in script {
        match line.strip_prefix("H: ") {
            Some(key) => lines.extend((0..64).map(|_| format!("H: GET {key}"))),
            None => lines.push(line.to_string()),
        }
    }
    let lines: Vec<&str> = lines.iter().map(String::as_str).collect();
    let opts = Options {
        pushes_first: true,
        direct: "W",
        mask,
        ..Options::resp(false)
    };
    let [direct, _] = common::check(p.sides(), "tracking", &lines, opts).await;
    for w in direct.iter().filter(|r| r.label.starts_with("W:")) {
        assert!(
            !w.bytes.starts_with(b"-"),
            "{}: {}",
            w.label,
            show(&w.bytes)
        );
    }
    direct
}

/// How many of `replies` are invalidation pushes.
fn invalidations(replies: &[Reply]) -> usize {
    replies
        .iter()
        .filter(|r| contains(&r.bytes, b"invalidate"))
        .count()
}

/// `CLIENT LIST` lines of `server` that have CLIENT TRACKING on (`t` flag).
async fn tracking_conns(server: SocketAddr) -> usize {
    let list = client_list(server).await;
    let tracking = |l: &&String| field(l, "flags").is_some_and(|f| f.contains('t'));
    list.iter().filter(tracking).count()
}

/// corral's own upstream connections (shared pools, the cache's tracking lane) connect in the
/// background after start: waits until the lane tracks and the count of connections on Redis
/// holds still, then returns (tracking connections, connections).
async fn settled(p: &Pair) -> (usize, usize) {
    poll_until(LIMIT, "corral's upstream connections to settle", || async {
        let mut c = connect(p.proxy.addr).await;
        let stats = common::corral_stats(&mut c).await;
        drop(c);
        if stats.get("cache_tracking").map(String::as_str) != Some("on") {
            return None;
        }
        let before = (tracking_conns(p.behind).await, conns(p.behind).await);
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let after = (tracking_conns(p.behind).await, conns(p.behind).await);
        (before == after).then_some(after)
    })
    .await
}

/// Connections open on `server` (CLIENT LIST lines, the asking one included).
async fn conns(server: SocketAddr) -> usize {
    let list = client_list(server).await;
    list.iter().filter(|l| l.starts_with("id=")).count()
}

#[tokio::test]
async fn resp3_invalidations_arrive_where_redis_puts_them() {
    let p = Pair::start().await;
    let t = same_on_both(
        &p,
        &[
            "W: SET k v0",
            // corral's cache holds k: the tracking client's read must still reach Redis.
            "H: k",
            "T: HELLO 3",
            "T: CLIENT TRACKING ON",
            "T: GET k",
            "W: SET k v1",
            // The push came while T was idle; it precedes the next reply.
            "T: EXISTS k",
            "T: GET k",
            // T's own write: Redis sends the push right after the write's reply.
            "T: SET k v2",
            "T: GET k",
            "T: MGET k other",
            "W: DEL k other",
            "T: CLIENT TRACKINGINFO",
            "T: CLIENT GETREDIR",
            "W: FLUSHALL",
            "T: EXISTS k",
        ],
    )
    .await;
    assert!(invalidations(&t) >= 4, "{t:#?}");
}

/// A tracking client's write of a key it read, then PING or ECHO, in one write: Redis sends
/// the write's reply, the invalidation, then the PING's reply; through corral the same.
#[tokio::test]
async fn a_ping_after_a_tracked_write_comes_after_its_invalidation() {
    let p = Pair::start().await;
    let push = b">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nk\r\n".to_vec();
    for (write, then, reply) in [
        ("DEL k", "PING", b"+PONG\r\n".to_vec()),
        ("SET k v", "ECHO hi", b"$2\r\nhi\r\n".to_vec()),
    ] {
        let mut c = common::client_in(p.proxy.addr, true).await;
        assert_eq!(show(&c.call("SET k v0").await), show(b"+OK\r\n"));
        assert_eq!(show(&c.call("CLIENT TRACKING ON").await), show(b"+OK\r\n"));
        assert_eq!(show(&c.call("GET k").await), show(b"$2\r\nv0\r\n"));
        let mut bytes = encode_line(write);
        bytes.extend(encode_line(then));
        c.send(&bytes).await;
        let got = [
            c.read_reply().await,
            c.read_reply().await,
            c.read_reply().await,
        ];
        let first = if write == "DEL k" {
            b":1\r\n".to_vec()
        } else {
            b"+OK\r\n".to_vec()
        };
        assert_eq!(
            got.map(|g| show(&g)),
            [&first, &push, &reply].map(|w| show(w)),
            "{write}; {then}"
        );
    }
    p.proxy.stop().await;
}

#[tokio::test]
async fn optin_tracks_only_reads_after_caching_yes() {
    let p = Pair::start().await;
    let t = same_on_both(
        &p,
        &[
            "T: HELLO 3",
            "T: CLIENT CACHING YES",
            "T: CLIENT TRACKING ON OPTIN",
            "T: GET a",
            "T: CLIENT CACHING YES",
            "T: GET b",
            "W: SET a 1",
            "W: SET b 1",
            "T: EXISTS a",
            "T: CLIENT TRACKING OFF",
            "T: CLIENT TRACKING ON OPTOUT",
            "T: CLIENT CACHING NO",
            "T: GET c",
            "T: GET d",
            "W: MSET c 1 d 1",
            "T: EXISTS c",
            "T: CLIENT TRACKINGINFO",
        ],
    )
    .await;
    assert_eq!(invalidations(&t), 2, "{t:#?}");
}

#[tokio::test]
async fn bcast_with_prefixes_and_noloop() {
    let p = Pair::start().await;
    same_on_both(
        &p,
        &[
            "T: HELLO 3",
            "T: CLIENT TRACKING ON BCAST PREFIX a: PREFIX b: NOLOOP",
            "W: SET a:1 x",
            "W: SET c:1 x",
            "T: EXISTS a:1",
            "T: SET b:1 mine",
            "W: SET b:2 theirs",
            "T: EXISTS b:2",
            "T: CLIENT TRACKINGINFO",
            // Redis refuses to switch modes while tracking is on.
            "T: CLIENT TRACKING ON",
            "T: CLIENT TRACKING OFF",
            "W: SET a:3 x",
            "T: EXISTS a:3",
        ],
    )
    .await;
}

#[tokio::test]
async fn resp2_redirect_to_a_subscribed_corral_client() {
    let p = Pair::start().await;
    let t = same_on_both(
        &p,
        &[
            "X: CLIENT ID => X #any",
            "X: SUBSCRIBE __redis__:invalidate",
            "T: CLIENT TRACKING ON REDIRECT @X",
            "T: GET k",
            "T: CLIENT GETREDIR #any",
            "T: CLIENT TRACKINGINFO",
            "W: SET k 1",
            "X<",
            "T: MGET k j",
            "W: MSET k 2 j 2",
            "X<",
            "X<",
            "W: FLUSHALL",
            "X<",
            "T: CLIENT TRACKING ON REDIRECT 999999",
            "T: CLIENT TRACKING OFF",
            "T: CLIENT GETREDIR",
            "T: CLIENT TRACKINGINFO",
        ],
    )
    .await;
    assert_eq!(t.iter().filter(|r| r.label == "X<").count(), 4, "{t:#?}");

    // Through corral GETREDIR names X by the id corral gave it.
    let mut x = connect(p.proxy.addr).await;
    let x_id = x.request(&[b"CLIENT", b"ID"]).await;
    let id = String::from_utf8_lossy(&x_id[1..]).trim().to_string();
    let mut t = connect(p.proxy.addr).await;
    assert_eq!(
        t.cmd(&format!("CLIENT TRACKING ON REDIRECT {id}")).await,
        b"+OK\r\n"
    );
    assert_eq!(t.cmd("CLIENT GETREDIR").await, x_id);
    let info = t.cmd("CLIENT TRACKINGINFO").await;
    assert!(
        contains(&info, format!("redirect\r\n:{id}\r\n").as_bytes()),
        "{}",
        show(&info)
    );
}

/// CLIENT TRACKING OFF from a client without tracking: Redis still checks that a REDIRECT
/// names a connected client, and which error comes first. corral sent its own client id,
/// which Redis knew as some other connection or not at all.
#[tokio::test]
async fn tracking_off_without_tracking_checks_its_redirect_as_redis_does() {
    let p = Pair::start().await;
    same_on_both(
        &p,
        &[
            "X: CLIENT ID => X #any",
            "T: CLIENT TRACKING OFF REDIRECT @X",
            "T: CLIENT TRACKING OFF REDIRECT 999999",
            "T: CLIENT TRACKING OFF REDIRECT @X REDIRECT @X",
            "T: CLIENT TRACKING OFF REDIRECT 999999 BOGUS",
            "T: CLIENT TRACKING OFF BOGUS REDIRECT 999999",
            "T: CLIENT TRACKING OFF REDIRECT notanumber",
            "T: GET k",
        ],
    )
    .await;
}

/// Redis drops the connection corral made for a redirection target (CLIENT KILL): the
/// target's invalidations are gone with it, so corral closes the target, as Redis closes a
/// client whose connection it kills; its library then drops the cache that nothing would
/// invalidate any more. Left open, it heard nothing of later writes.
#[tokio::test]
async fn a_redirection_target_whose_connection_is_lost_is_closed() {
    let p = Pair::start().await;
    let mut x = connect(p.proxy.addr).await;
    let x_id = x.cmd("CLIENT ID").await;
    let id = String::from_utf8_lossy(&x_id[1..]).trim().to_string();
    x.cmd("SUBSCRIBE __redis__:invalidate").await;
    let before = client_list(p.behind).await;
    let mut t = connect(p.proxy.addr).await;
    let on = t.cmd(&format!("CLIENT TRACKING ON REDIRECT {id}")).await;
    assert_eq!(on, b"+OK\r\n");
    t.cmd("GET r").await;
    // The target's connection: the one made for the redirection that is not tracking.
    let after = client_list(p.behind).await;
    let ids: Vec<&str> = before.iter().filter_map(|l| field(l, "id")).collect();
    let sink = after
        .iter()
        .filter(|l| field(l, "id").is_some_and(|i| !ids.contains(&i)))
        .find(|l| field(l, "flags") == Some("N") && field(l, "cmd") != Some("client|list"))
        .and_then(|l| field(l, "id"))
        .unwrap_or_else(|| panic!("no target connection in {after:?}"));
    let mut w = connect(p.behind).await;
    assert_eq!(w.cmd(&format!("CLIENT KILL ID {sink}")).await, b":1\r\n");
    assert!(x.is_closed().await, "the target stays open");
}

/// CLIENT TRACKING OFF and ON in one pipeline (or a refused ON, then ON): the last one
/// holds, as on Redis, and the client gets the invalidations of what it reads after.
#[tokio::test]
async fn tracking_off_and_on_in_one_pipeline_leaves_it_on() {
    let p = Pair::start().await;
    let invalidate = b">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nk\r\n";
    for (side, first) in [
        (p.direct, "CLIENT TRACKING ON"),
        (p.proxy.addr, "CLIENT TRACKING ON"),
        (p.direct, "PING"),
        (p.proxy.addr, "PING"),
    ] {
        let server = if side == p.direct { p.direct } else { p.behind };
        let mut t = connect(side).await;
        t.cmd("HELLO 3").await;
        t.cmd(first).await;
        let pipeline = if first == "PING" {
            // A refused ON (BCAST with overlapping prefixes), then a valid one.
            [
                "CLIENT TRACKING ON BCAST PREFIX a PREFIX ab",
                "CLIENT TRACKING ON",
            ]
        } else {
            ["CLIENT TRACKING OFF", "CLIENT TRACKING ON"]
        };
        t.send(&[encode_line(pipeline[0]), encode_line(pipeline[1])].concat())
            .await;
        t.read_reply().await;
        assert_eq!(t.read_reply().await, b"+OK\r\n");
        t.cmd("GET k").await;
        let mut w = connect(server).await;
        assert_eq!(w.cmd("SET k x").await, b"+OK\r\n");
        assert_eq!(
            show(&t.read_reply().await),
            show(invalidate),
            "{side} {first}"
        );
        assert_eq!(t.cmd("PING").await, b"+PONG\r\n");
    }
}

#[tokio::test]
async fn resp3_redirect_and_broken_redirect() {
    let p = Pair::start().await;
    for side in [(p.direct, p.direct), (p.proxy.addr, p.behind)] {
        let (entry, server) = side;
        let mut x = connect(entry).await;
        x.cmd("HELLO 3").await;
        let x_id = x.cmd("CLIENT ID").await;
        let id = String::from_utf8_lossy(&x_id[1..]).trim().to_string();
        let mut t = connect(entry).await;
        t.cmd("HELLO 3").await;
        assert_eq!(
            t.cmd(&format!("CLIENT TRACKING ON REDIRECT {id}")).await,
            b"+OK\r\n"
        );
        t.cmd("GET r").await;
        let mut w = connect(server).await;
        w.cmd("SET r 1").await;
        assert_eq!(
            x.read_reply().await,
            b">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nr\r\n",
            "{side:?}"
        );
        // The target leaves: the next invalidation tells T, naming the target's id.
        drop(x);
        t.cmd("GET r").await;
        let want = format!(">2\r\n$21\r\ntracking-redir-broken\r\n:{id}\r\n");
        let deadline = Deadline::new(LIMIT, "tracking-redir-broken");
        loop {
            let mut w = connect(server).await;
            w.cmd("SET r 2").await;
            t.send(&encode_line("EXISTS r")).await;
            let first = t.read_reply().await;
            if first == b":1\r\n" {
                // The target's connection is not closed yet: track r again and retry.
                t.cmd("GET r").await;
                deadline.pause().await;
                continue;
            }
            assert_eq!(first, want.as_bytes(), "{side:?}");
            while t.read_reply().await != b":1\r\n" {}
            break;
        }
    }
}

#[tokio::test]
async fn tracking_inside_multi_and_reset() {
    let p = Pair::start().await;
    same_on_both(
        &p,
        &[
            "T: HELLO 3",
            "T: MULTI",
            "T: CLIENT TRACKING ON",
            "T: GET m",
            "T: EXEC",
            "W: SET m 1",
            "T: EXISTS m",
            "T: RESET",
            "T: HELLO 3",
            "T: GET m",
            "W: SET m 2",
            "T: EXISTS m",
        ],
    )
    .await;
}

#[tokio::test]
async fn hello_switches_protocol_while_tracking() {
    let p = Pair::start().await;
    same_on_both(
        &p,
        &[
            "T: HELLO 3",
            "T: CLIENT TRACKING ON",
            "T: GET h",
            "T: HELLO 2",
            "T: HGETALL h",
            // RESP2 without a redirection: Redis sends the invalidation nowhere.
            "W: SET h 1",
            "T: EXISTS h",
            "T: HELLO 3",
            "T: GET h",
            "W: SET h 2",
            "T: EXISTS h",
            "T: CLIENT TRACKINGINFO",
        ],
    )
    .await;
}

#[tokio::test]
async fn off_reset_and_disconnect_release_the_upstream_connection() {
    let p = Pair::start().await;
    let (base, open) = settled(&p).await;
    let mut t = connect(p.proxy.addr).await;
    t.cmd("HELLO 3").await;
    assert_eq!(t.cmd("CLIENT TRACKING ON").await, b"+OK\r\n");
    assert_eq!(tracking_conns(p.behind).await, base + 1);
    // corral's own CLIENT LIST shows the flag.
    let me = t.cmd("CLIENT INFO").await;
    assert!(contains(&me, b" flags=t "), "{}", show(&me));

    assert_eq!(t.cmd("CLIENT TRACKING OFF").await, b"+OK\r\n");
    poll_until(LIMIT, "OFF to release the connection", || async {
        (tracking_conns(p.behind).await == base && conns(p.behind).await == open).then_some(())
    })
    .await;

    assert_eq!(t.cmd("CLIENT TRACKING ON BCAST").await, b"+OK\r\n");
    assert_eq!(tracking_conns(p.behind).await, base + 1);
    let me = t.cmd("CLIENT INFO").await;
    assert!(contains(&me, b" flags=tB "), "{}", show(&me));
    let reset = t.cmd("RESET").await;
    assert_eq!(reset, b"+RESET\r\n");
    poll_until(LIMIT, "RESET to release the connection", || async {
        (tracking_conns(p.behind).await == base).then_some(())
    })
    .await;

    t.cmd("HELLO 3").await;
    assert_eq!(t.cmd("CLIENT TRACKING ON").await, b"+OK\r\n");
    assert_eq!(tracking_conns(p.behind).await, base + 1);
    drop(t);
    poll_until(LIMIT, "a disconnect to release the connection", || async {
        (tracking_conns(p.behind).await == base && conns(p.behind).await == open).then_some(())
    })
    .await;

    // A redirection target's connection goes when the target disconnects.
    let mut x = connect(p.proxy.addr).await;
    let id = String::from_utf8_lossy(&x.cmd("CLIENT ID").await[1..])
        .trim()
        .to_string();
    let mut t = connect(p.proxy.addr).await;
    t.cmd(&format!("CLIENT TRACKING ON REDIRECT {id}")).await;
    // The target's sink and the tracking client's connection (a closed asking connection of
    // an earlier count may still be listed for a moment).
    poll_until(
        LIMIT,
        "the two connections of a redirected client",
        || async { (conns(p.behind).await == open + 2).then_some(()) },
    )
    .await;
    drop(x);
    drop(t);
    poll_until(
        LIMIT,
        "the redirection target's connection to close",
        || async { (conns(p.behind).await == open).then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn redirect_inside_multi_is_refused() {
    let p = Pair::start().await;
    let mut t = connect(p.proxy.addr).await;
    let id = String::from_utf8_lossy(&t.cmd("CLIENT ID").await[1..])
        .trim()
        .to_string();
    assert_eq!(t.cmd("MULTI").await, b"+OK\r\n");
    let refused = t.cmd(&format!("CLIENT TRACKING ON REDIRECT {id}")).await;
    assert_eq!(
        refused,
        b"-ERR CLIENT TRACKING with REDIRECT inside MULTI is not supported by corral\r\n"
    );
    assert_eq!(t.cmd("EXEC").await, b"*0\r\n");
}

#[tokio::test]
async fn tracking_clients_are_bounded() {
    let p = Pair::start_with(|c| c.upstream.max_tracking_clients = 1).await;
    let mut a = connect(p.proxy.addr).await;
    let mut b = connect(p.proxy.addr).await;
    assert_eq!(a.cmd("CLIENT TRACKING ON").await, b"+OK\r\n");
    let refused = b.cmd("CLIENT TRACKING ON").await;
    assert!(
        refused.starts_with(b"-ERR too many clients with CLIENT TRACKING on"),
        "{}",
        show(&refused)
    );
    // Still a normal client.
    assert_eq!(b.cmd("SET x 1").await, b"+OK\r\n");
    assert_eq!(a.cmd("CLIENT TRACKING OFF").await, b"+OK\r\n");
    assert_eq!(b.cmd("CLIENT TRACKING ON").await, b"+OK\r\n");
}

/// redis-rs's own client-side cache (RESP3, CLIENT TRACKING) through corral: after a write
/// made directly on Redis, the cached read returns the new value.
#[tokio::test]
async fn redis_rs_client_side_cache_sees_direct_writes() {
    use redis::AsyncCommands;
    let p = Pair::start().await;
    let mut w = connect(p.behind).await;
    w.cmd("SET cached v1").await;
    let url = format!("{}/?protocol=resp3", p.proxy.url());
    let client = redis::Client::open(url).expect("client");
    let config =
        redis::AsyncConnectionConfig::new().set_cache_config(redis::caching::CacheConfig::new());
    let mut con = client
        .get_multiplexed_async_connection_with_config(&config)
        .await
        .expect("connect through corral");
    let v: String = con.get("cached").await.expect("get");
    assert_eq!(v, "v1");
    let v: String = con.get("cached").await.expect("get");
    assert_eq!(v, "v1");
    let stats = con.get_cache_statistics().expect("cache statistics");
    assert_eq!((stats.hit, stats.miss), (1, 1), "the second read is a hit");

    w.cmd("SET cached v2").await;
    poll_until(LIMIT, "the cached read to see the direct write", || {
        let mut con = con.clone();
        async move {
            let v: String = con.get("cached").await.expect("get");
            (v == "v2").then_some(())
        }
    })
    .await;
    let stats = con.get_cache_statistics().expect("cache statistics");
    assert!(stats.invalidate >= 1, "{stats:?}");
}

/// INFO's `tracking_clients` counts the clients a client can see: not corral's own cache
/// lane (which Redis counts too).
#[tokio::test]
async fn info_tracking_clients_leaves_out_corrals_cache_lane() {
    let p = Pair::start().await;
    let mut t = connect(p.proxy.addr).await;
    poll_until(LIMIT, "the cache's tracking lane", || async {
        let mut c = connect(p.proxy.addr).await;
        contains(&c.cmd("INFO cache").await, b"cache_tracking:on").then_some(())
    })
    .await;
    assert!(contains(
        &t.cmd("INFO clients").await,
        b"tracking_clients:0\r\n"
    ));
    assert_eq!(t.cmd("CLIENT TRACKING ON").await, b"+OK\r\n");
    let info = t.cmd("INFO").await;
    assert!(
        contains(&info, b"tracking_clients:1\r\n"),
        "{}",
        show(&info)
    );
    let mut direct = connect(p.behind).await;
    let redis = direct.cmd("INFO clients").await;
    assert!(
        contains(&redis, b"tracking_clients:2\r\n"),
        "{}",
        show(&redis)
    );

    // RESP3: an invalidation that comes before INFO's reply is written first, and the reply
    // is still corral's (with its own sections).
    assert!(t.cmd("HELLO 3").await.starts_with(b"%"));
    t.cmd("GET i").await;
    direct.cmd("SET i 1").await;
    t.send(&encode_line("INFO")).await;
    assert_eq!(
        t.read_reply().await,
        b">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\ni\r\n"
    );
    let info = t.read_reply().await;
    assert!(
        contains(&info, b"tracking_clients:1\r\n") && contains(&info, b"# Proxy"),
        "{}",
        show(&info)
    );
}

/// A tracking client's reads bypass corral's cache (so Redis tracks them), and its writes
/// still invalidate that cache for every other client.
#[tokio::test]
async fn tracking_clients_and_corrals_cache() {
    let p = Pair::start().await;
    let mut a = connect(p.proxy.addr).await;
    let mut t = connect(p.proxy.addr).await;
    assert_eq!(a.cmd("SET hot v0").await, b"+OK\r\n");
    poll_until(LIMIT, "corral's cache to hold the hot key", || async {
        let mut a = connect(p.proxy.addr).await;
        for _ in 0..64 {
            a.cmd("GET hot").await;
        }
        let stats = a.cmd("CORRAL CACHE STATS").await;
        (!contains(&stats, b"cache_entries:0\r\n")).then_some(())
    })
    .await;
    t.cmd("HELLO 3").await;
    assert_eq!(t.cmd("CLIENT TRACKING ON").await, b"+OK\r\n");
    assert_eq!(t.cmd("GET hot").await, b"$2\r\nv0\r\n");
    assert_eq!(t.cmd("SET hot v1").await, b"+OK\r\n");
    // Redis tracked T's read: its own write invalidates it.
    assert_eq!(
        t.read_reply().await,
        b">2\r\n$10\r\ninvalidate\r\n*1\r\n$3\r\nhot\r\n"
    );
    assert_eq!(a.cmd("GET hot").await, b"$2\r\nv1\r\n");
}
