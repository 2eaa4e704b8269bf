//! GETs answered from the cache, and SETs batched, before they are parsed: every rule the
//! usual path applies to a GET or a SET still holds when it comes right after a request that
//! changes it, in the same pipelined write.

mod common;

use common::*;

const OK: &[u8] = b"+OK\r\n";

/// corral and a client of it whose last round served a hit of `key` (value `value`), so
/// its next GETs may be answered before they are parsed.
async fn warm(key: &str, value: &str) -> (RedisServer, TestProxy, RawClient, RawClient) {
    let (redis, proxy, mut direct, mut c) = start().await;
    assert_eq!(direct.cmd(&format!("SET {key} {value}")).await, OK);
    make_cached(&mut c, key, &bulk(value)).await;
    stays(&mut c, key, &bulk(value), 3).await;
    (redis, proxy, direct, c)
}

/// corral with a `[[users]]` user `reader` (password `r-pass`) who may only read `cache:*`.
async fn with_reader() -> (RedisServer, TestProxy) {
    let redis = RedisServer::start();
    let proxy = TestProxy::start_with(&redis.url(), |c| {
        c.users = vec![corral::acl::UserSpec {
            name: "reader".into(),
            password: Some("r-pass".into()),
            password_sha256: None,
            rules: "+@read ~cache:*".into(),
        }];
    })
    .await;
    (redis, proxy)
}

/// corral with `[commands]` denying `deny` and renaming each `(name, new name)`.
async fn with_guard(deny: &[&str], rename: &[(&str, &str)]) -> (RedisServer, TestProxy) {
    let redis = RedisServer::start();
    let proxy = TestProxy::start_with(&redis.url(), |c| {
        c.commands = corral::acl::GuardConfig {
            deny: deny.iter().map(|d| d.to_string()).collect(),
            rename: rename
                .iter()
                .map(|(from, to)| (from.to_string(), to.to_string()))
                .collect(),
        };
    })
    .await;
    (redis, proxy)
}

/// The requests, as one write, and their `n` replies.
async fn pipelined(c: &mut RawClient, requests: &[&[&[u8]]], n: usize) -> Vec<Vec<u8>> {
    let bytes: Vec<u8> = requests.iter().flat_map(|r| encode(r)).collect();
    c.pipeline(&bytes, bytes.len(), n).await
}

/// A GET after another read of its key forwarded earlier in the same pipelined write
/// (STRLEN, EXISTS, GETRANGE, TYPE, or a read-only script, which may read keys it does not
/// declare) goes to Redis behind it: a hit could be older than what that read saw. Another
/// key's read leaves it to the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_after_another_read_of_its_key_in_the_pipeline_is_not_served_locally() {
    let (_redis, proxy, _direct, mut c) = warm("k", "v").await;
    let script: &[u8] = b"return redis.call('get', 'k')";
    let reads: [&[&[u8]]; 6] = [
        &[b"STRLEN", b"k"],
        &[b"EXISTS", b"other", b"k"],
        &[b"GETRANGE", b"k", b"0", b"-1"],
        &[b"TYPE", b"k"],
        &[b"EVAL_RO", script, b"0"],
        &[b"EVAL_RO", script, b"1", b"other"],
    ];
    for read in reads {
        let hits = Stats::of(&mut c).await.n("cache_hits");
        let got = pipelined(&mut c, &[&[b"GET", b"k"], read, &[b"GET", b"k"]], 3).await;
        assert_eq!([&got[0], &got[2]], [&bulk("v"), &bulk("v")]);
        assert_eq!(
            Stats::of(&mut c).await.n("cache_hits"),
            hits + 1,
            "{}: only the first GET is a hit",
            show(&read.concat())
        );
        stays(&mut c, "k", &bulk("v"), 2).await;
    }
    let hits = Stats::of(&mut c).await.n("cache_hits");
    let got = pipelined(&mut c, &[&[b"STRLEN", b"other"], &[b"GET", b"k"]], 2).await;
    assert_eq!(got[1], bulk("v"));
    assert_eq!(Stats::of(&mut c).await.n("cache_hits"), hits + 1);
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_earlier_in_the_pipeline_is_read_back() {
    let (_redis, proxy, _direct, mut c) = warm("k", "old").await;
    let hits = Stats::of(&mut c).await.n("cache_hits");
    stays(&mut c, "k", &bulk("old"), 2).await;
    let got = pipelined(
        &mut c,
        &[&[b"GET", b"k"], &[b"SET", b"k", b"new"], &[b"GET", b"k"]],
        3,
    )
    .await;
    assert_eq!(got, vec![bulk("old"), OK.to_vec(), bulk("new")]);
    assert!(Stats::of(&mut c).await.n("cache_hits") >= hits + 3);
    stays(&mut c, "k", &bulk("new"), 5).await;
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_inside_multi_is_queued() {
    let (_redis, proxy, _direct, mut c) = warm("k", "v").await;
    let got = pipelined(
        &mut c,
        &[&[b"GET", b"k"], &[b"MULTI"], &[b"GET", b"k"], &[b"EXEC"]],
        4,
    )
    .await;
    let exec = [b"*1\r\n".as_slice(), &bulk("v")].concat();
    assert_eq!(
        got,
        vec![bulk("v"), OK.to_vec(), b"+QUEUED\r\n".to_vec(), exec]
    );
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_reply_off_and_skip_silence_hits() {
    let (_redis, proxy, _direct, mut c) = warm("k", "v").await;
    let got = pipelined(
        &mut c,
        &[
            &[b"GET", b"k"],
            &[b"CLIENT", b"REPLY", b"OFF"],
            &[b"GET", b"k"],
            &[b"CLIENT", b"REPLY", b"ON"],
            &[b"CLIENT", b"REPLY", b"SKIP"],
            &[b"GET", b"k"],
            &[b"ECHO", b"after"],
        ],
        3,
    )
    .await;
    assert_eq!(got, vec![bulk("v"), OK.to_vec(), bulk("after")]);
    assert!(!c.has_pending_reply(), "a silenced GET was answered");
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_after_select_reads_the_selected_database() {
    // The front holds database 0's entries only.
    let (_redis, proxy, mut direct, mut c) = warm("k", "zero").await;
    assert_eq!(direct.cmd("SELECT 1").await, OK);
    assert_eq!(direct.cmd("SET k one").await, OK);
    let got = pipelined(
        &mut c,
        &[&[b"GET", b"k"], &[b"SELECT", b"1"], &[b"GET", b"k"]],
        3,
    )
    .await;
    assert_eq!(got, vec![bulk("zero"), OK.to_vec(), bulk("one")]);
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_list_names_a_get_or_set_as_the_last_command() {
    let (_redis, proxy, _direct, mut c) = warm("k", "v").await;
    // A round with a hit (so the next is warm) that ends with another command.
    let got = pipelined(&mut c, &[&[b"GET", b"k"], &[b"CLIENT", b"ID"]], 2).await;
    assert_eq!(got[0], bulk("v"));
    let id = String::from_utf8_lossy(&got[1])
        .trim_start_matches(':')
        .trim()
        .to_string();
    let last_cmd = || async {
        let line = client_list(proxy.addr)
            .await
            .into_iter()
            .find(|l| field(l, "id") == Some(id.as_str()))
            .expect("the client in CLIENT LIST");
        field(&line, "cmd").map(str::to_string)
    };
    assert_eq!(get(&mut c, "k").await, bulk("v"));
    assert_eq!(last_cmd().await.as_deref(), Some("get"));
    assert_eq!(c.request(&[b"SET", b"k", b"w"]).await, OK);
    assert_eq!(last_cmd().await.as_deref(), Some("set"));
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_read_as_redis_replies_in_both_protocols() {
    let (redis, proxy, mut direct, mut stats) = start().await;
    assert_eq!(direct.cmd("SET k v").await, OK);
    for resp3 in [false, true] {
        let mut c = client_in(proxy.addr, resp3).await;
        let mut d = client_in(redis.addr(), resp3).await;
        for key in ["k", "missing"] {
            let want = d.request(&[b"GET", key.as_bytes()]).await;
            let before = Stats::of(&mut stats).await.n("cache_hits");
            // Enough GETs for the key to be admitted, then rounds of hits.
            for _ in 0..40 {
                assert_eq!(get(&mut c, key).await, want, "GET {key}, RESP3 {resp3}");
            }
            let req: &[&[u8]] = &[b"GET", key.as_bytes()];
            let got = pipelined(&mut c, &[req; 8], 8).await;
            assert!(got.iter().all(|g| *g == want), "RESP3 {resp3}: {got:?}");
            assert!(Stats::of(&mut stats).await.n("cache_hits") >= before + 20);
        }
    }
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_after_subscribe_in_resp2_is_refused_as_by_redis() {
    let (redis, proxy, _direct, mut c) = warm("k", "v").await;
    let requests: &[&[&[u8]]] = &[&[b"GET", b"k"], &[b"SUBSCRIBE", b"ch"], &[b"GET", b"k"]];
    let mut d = connect(redis.addr()).await;
    let want = pipelined(&mut d, requests, 3).await;
    assert!(want[2].starts_with(b"-ERR"), "{}", show(&want[2]));
    assert_eq!(pipelined(&mut c, requests, 3).await, want);
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_after_auth_as_a_restricted_user_is_checked() {
    let (redis, proxy) = with_reader().await;
    let mut direct = connect(redis.addr()).await;
    assert_eq!(direct.cmd("SET secret v").await, OK);
    let mut c = connect(proxy.addr).await;
    make_cached(&mut c, "secret", &bulk("v")).await;
    stays(&mut c, "secret", &bulk("v"), 3).await;
    let got = pipelined(
        &mut c,
        &[
            &[b"GET", b"secret"],
            &[b"AUTH", b"reader", b"r-pass"],
            &[b"GET", b"secret"],
        ],
        3,
    )
    .await;
    assert_eq!(got[..2], [bulk("v"), OK.to_vec()]);
    assert!(got[2].starts_with(b"-NOPERM"), "{}", show(&got[2]));
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renamed_get_is_unknown_by_its_old_name() {
    let (redis, proxy) = with_guard(&[], &[("GET", "MYGET")]).await;
    let mut direct = connect(redis.addr()).await;
    assert_eq!(direct.cmd("SET k v").await, OK);
    let mut c = connect(proxy.addr).await;
    // Warmed by its new name: rounds of hits, then the old name right after one.
    let hits = Stats::of(&mut c).await.n("cache_hits");
    for _ in 0..40 {
        assert_eq!(c.request(&[b"MYGET", b"k"]).await, bulk("v"));
    }
    assert!(Stats::of(&mut c).await.n("cache_hits") > hits);
    for _ in 0..3 {
        assert_eq!(c.request(&[b"MYGET", b"k"]).await, bulk("v"));
    }
    let got = pipelined(&mut c, &[&[b"MYGET", b"k"], &[b"GET", b"k"]], 2).await;
    assert_eq!(got[0], bulk("v"));
    assert!(
        got[1].starts_with(b"-ERR unknown command"),
        "{}",
        show(&got[1])
    );
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_or_set_with_a_string_over_the_bulk_limit_is_refused() {
    let redis = RedisServer::start();
    let proxy = TestProxy::start_with(&redis.url(), |c| {
        c.limits.proto_max_bulk_len = 1024;
    })
    .await;
    let (over, at_limit) = (vec![b'k'; 1025], vec![b'k'; 1024]);
    // Each whole request in one write: it is complete when first looked at.
    for request in [
        &[&b"GET"[..], &over][..],
        &[b"SET", b"k", &over],
        &[b"SET", &over, b"v"],
    ] {
        let got = send_until_closed(proxy.addr, &encode(request)).await;
        assert_eq!(got, b"-ERR Protocol error: invalid bulk length\r\n");
    }
    let mut c = connect(proxy.addr).await;
    assert_eq!(c.request(&[b"GET", &at_limit]).await, b"$-1\r\n");
    assert_eq!(c.request(&[b"SET", b"k", &at_limit]).await, OK);
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_over_the_multibulk_limit_is_refused() {
    let redis = RedisServer::start();
    let proxy = TestProxy::start_with(&redis.url(), |c| {
        c.limits.max_multibulk_len = 1;
    })
    .await;
    let got = send_until_closed(proxy.addr, &encode(&[b"GET", b"k"])).await;
    assert_eq!(got, b"-ERR Protocol error: invalid multibulk length\r\n");
    proxy.stop().await;
}

// Plain SETs skip the parser too, under the same conditions as GETs and SET itself neither
// renamed nor refused: every rule the usual path applies to a SET still holds.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renamed_set_is_unknown_by_its_old_name() {
    let (redis, proxy) = with_guard(&[], &[("SET", "MYSET")]).await;
    let mut direct = connect(redis.addr()).await;
    assert_eq!(direct.cmd("SET k v").await, OK);
    let mut c = connect(proxy.addr).await;
    make_cached(&mut c, "k", &bulk("v")).await;
    let got = pipelined(
        &mut c,
        &[
            &[b"GET", b"k"],
            &[b"SET", b"k", b"old-name"],
            &[b"MYSET", b"k", b"new-name"],
            &[b"GET", b"k"],
        ],
        4,
    )
    .await;
    assert_eq!(got[0], bulk("v"));
    assert!(
        got[1].starts_with(b"-ERR unknown command"),
        "{}",
        show(&got[1])
    );
    assert_eq!(got[2..], [OK.to_vec(), bulk("new-name")]);
    assert_eq!(direct.cmd("GET k").await, bulk("new-name"));
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denied_set_is_refused_and_not_sent() {
    let (redis, proxy) = with_guard(&["set"], &[]).await;
    let mut direct = connect(redis.addr()).await;
    assert_eq!(direct.cmd("SET k v").await, OK);
    let mut c = connect(proxy.addr).await;
    make_cached(&mut c, "k", &bulk("v")).await;
    let got = pipelined(
        &mut c,
        &[&[b"GET", b"k"], &[b"SET", b"k", b"x"], &[b"GET", b"k"]],
        3,
    )
    .await;
    assert!(got[1].starts_with(b"-"), "{}", show(&got[1]));
    assert_eq!([&got[0], &got[2]], [&bulk("v"), &bulk("v")]);
    assert_eq!(direct.cmd("GET k").await, bulk("v"));
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_after_auth_as_a_restricted_user_is_checked() {
    let (redis, proxy) = with_reader().await;
    let mut c = connect(proxy.addr).await;
    let got = pipelined(
        &mut c,
        &[
            &[b"SET", b"cache:a", b"1"],
            &[b"AUTH", b"reader", b"r-pass"],
            &[b"SET", b"cache:a", b"2"],
        ],
        3,
    )
    .await;
    assert_eq!(got[..2], [OK.to_vec(), OK.to_vec()]);
    assert!(got[2].starts_with(b"-NOPERM"), "{}", show(&got[2]));
    let mut direct = connect(redis.addr()).await;
    assert_eq!(direct.cmd("GET cache:a").await, bulk("1"));
    proxy.stop().await;
}
