//! Pipelining through corral: many clients with long mixed pipelines (local, forwarded, refused
//! and INFO requests interleaved) get every reply in order; requests split at any byte boundary
//! are reassembled; replies larger than the socket buffers do not deadlock.

mod common;

use std::time::Duration;

use common::{RawClient, RedisServer, TestProxy, bulk, bulk_array, encode, int, show};
use tokio::io::AsyncWriteExt;

/// What one reply must be.
enum Expect {
    Exact(Vec<u8>),
    /// An error reply containing this text: corral's refusals, whose wording is its own.
    ErrorContaining(&'static str),
    /// A bulk string containing every `yes` and none of the `no` strings (INFO).
    BulkWith {
        yes: &'static [&'static str],
        no: &'static [&'static str],
    },
}

impl Expect {
    fn check(&self, got: &[u8], what: &str) {
        let text = String::from_utf8_lossy(got);
        let ok = match self {
            Expect::Exact(want) => got == want.as_slice(),
            Expect::ErrorContaining(s) => got.starts_with(b"-ERR ") && text.contains(s),
            Expect::BulkWith { yes, no } => {
                got.starts_with(b"$")
                    && yes.iter().all(|s| text.contains(s))
                    && !no.iter().any(|s| text.contains(s))
            }
        };
        assert!(ok, "{what}: got {}", show(got));
    }
}

/// A pipeline and the replies it must produce, in order.
#[derive(Default)]
struct Script {
    bytes: Vec<u8>,
    names: Vec<String>,
    expect: Vec<Expect>,
}

impl Script {
    fn push(&mut self, args: &[&str], expect: Expect) {
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        self.bytes.extend_from_slice(&encode(&args));
        self.names.push(
            args.iter()
                .map(|a| String::from_utf8_lossy(a))
                .collect::<Vec<_>>()
                .join(" "),
        );
        self.expect.push(expect);
    }

    fn check(&self, replies: &[Vec<u8>], who: &str) {
        assert_eq!(replies.len(), self.expect.len());
        for (i, (got, want)) in replies.iter().zip(&self.expect).enumerate() {
            want.check(got, &format!("{who}, request {i} ({})", self.names[i]));
        }
    }
}

/// Client `c`'s pipeline: `rounds` rounds over its own keys, so every reply is known exactly.
/// `unknown` is what the real server answers to `NOSUCHCMD x`.
fn mixed_script(c: usize, rounds: usize, unknown: &[u8]) -> Script {
    let key = |k: &str| format!("pipe:{c}:{k}");
    let (s_key, n_key, l_key, h_key) = (key("str"), key("n"), key("list"), key("hash"));
    let mut s = Script::default();
    let mut list: Vec<String> = Vec::new();
    let mut hash: Vec<(String, String)> = Vec::new();
    for r in 0..rounds {
        let v = format!("v{c}-{r}");
        s.push(&["SET", &s_key, &v], Expect::Exact(b"+OK\r\n".to_vec()));
        s.push(&["GET", &s_key], Expect::Exact(bulk(&v)));
        s.push(&["INCR", &n_key], Expect::Exact(int(r as i64 + 1)));
        s.push(&["PING"], Expect::Exact(b"+PONG\r\n".to_vec()));
        s.push(&["LPUSH", &l_key, &v], Expect::Exact(int(r as i64 + 1)));
        list.insert(0, v.clone());
        s.push(
            &["LRANGE", &l_key, "0", "2"],
            Expect::Exact(bulk_array(&list[..list.len().min(3)])),
        );
        s.push(&["ECHO", &v], Expect::Exact(bulk(&v)));
        // Four fields, so HSET both adds and overwrites; a small hash keeps insertion order.
        let field = format!("f{}", r % 4);
        let added = match hash.iter_mut().find(|(f, _)| *f == field) {
            Some(entry) => {
                entry.1 = v.clone();
                0
            }
            None => {
                hash.push((field.clone(), v.clone()));
                1
            }
        };
        s.push(&["HSET", &h_key, &field, &v], Expect::Exact(int(added)));
        let flat: Vec<&str> = hash
            .iter()
            .flat_map(|(f, v)| [f.as_str(), v.as_str()])
            .collect();
        s.push(&["HGETALL", &h_key], Expect::Exact(bulk_array(&flat)));
        s.push(&["PING", &v], Expect::Exact(bulk(&v)));
        match r % 10 {
            2 => s.push(&["NOSUCHCMD", "x"], Expect::Exact(unknown.to_vec())),
            // A transaction in the middle of the pipeline: pinned to a dedicated connection,
            // queued, then run at EXEC; later requests go back to the shared connection.
            5 => {
                s.push(&["MULTI"], Expect::Exact(b"+OK\r\n".to_vec()));
                s.push(&["GET", &s_key], Expect::Exact(b"+QUEUED\r\n".to_vec()));
                s.push(&["PING"], Expect::Exact(b"+QUEUED\r\n".to_vec()));
                let mut exec = b"*2\r\n".to_vec();
                exec.extend(bulk(&v));
                exec.extend_from_slice(b"+PONG\r\n");
                s.push(&["EXEC"], Expect::Exact(exec));
                // Tracking pins the client to a connection of its own until OFF.
                s.push(
                    &["CLIENT", "TRACKING", "ON"],
                    Expect::Exact(b"+OK\r\n".to_vec()),
                );
                s.push(&["GET", &s_key], Expect::Exact(bulk(&v)));
                s.push(
                    &["CLIENT", "TRACKING", "OFF"],
                    Expect::Exact(b"+OK\r\n".to_vec()),
                );
                s.push(
                    &["CLIENT", "NO-TOUCH", "ON"],
                    Expect::ErrorContaining("no-touch"),
                );
            }
            7 => s.push(
                &["INFO"],
                Expect::BulkWith {
                    yes: &["redis_version:", "# Proxy\r\n", "corral_version:"],
                    no: &[],
                },
            ),
            8 => s.push(
                &["INFO", "server"],
                Expect::BulkWith {
                    yes: &["redis_version:"],
                    no: &["# Proxy"],
                },
            ),
            _ => {}
        }
    }
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_clients_with_mixed_pipelines_get_every_reply_in_order() {
    mixed_pipelines_in_order(|_| {}).await;
}

/// Shared connections hold writes with the cache off (48 requests out, reached by these
/// pipelines): what waits in corral still goes out, in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_pipelines_keep_their_order_while_writes_are_held() {
    mixed_pipelines_in_order(|c| c.cache.enabled = false).await;
    // A bar of one request holds after every write, with the cache on too.
    mixed_pipelines_in_order(|c| c.upstream.hold_writes_at = Some(1)).await;
}

async fn mixed_pipelines_in_order(tweak: impl FnOnce(&mut corral::config::Config)) {
    let redis = RedisServer::start();
    let proxy = TestProxy::start_with(&redis.url(), tweak).await;
    // The unknown-command error is Redis's own text; corral must pass it through unchanged.
    let mut direct = RawClient::connect(redis.addr()).await.unwrap();
    let unknown = direct.cmd("NOSUCHCMD x").await;
    assert!(
        unknown.starts_with(b"-ERR unknown command"),
        "{}",
        show(&unknown)
    );

    let tasks: Vec<_> = (0..50)
        .map(|c| {
            let script = mixed_script(c, 40, &unknown);
            let addr = proxy.addr;
            tokio::spawn(async move {
                let mut client = RawClient::connect(addr).await.unwrap();
                // One to three writes per client, cut at arbitrary byte offsets.
                let chunk = script.bytes.len() / (1 + c % 3) + 1;
                let replies = client
                    .pipeline(&script.bytes, chunk, script.expect.len())
                    .await;
                script.check(&replies, &format!("client {c}"));
                // Nothing extra arrives after the last expected reply.
                assert_eq!(client.cmd("PING").await, b"+PONG\r\n");
                script.expect.len()
            })
        })
        .collect();
    let mut total = 0;
    for t in tasks {
        total += t.await.expect("client task");
    }
    assert!(total > 50 * 400, "only {total} requests");
    // The forwarded writes really reached the upstream.
    assert_eq!(direct.cmd("GET pipe:49:n").await, bulk("40"));
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_split_byte_by_byte_are_reassembled() {
    let redis = RedisServer::start();
    let proxy = TestProxy::start(&redis.url()).await;
    let mut c = RawClient::connect(proxy.addr).await.unwrap();
    // Multibulk, inline, local and forwarded requests, every byte in its own write.
    let mut bytes = encode(&[b"SET", b"split:k", b"hello\r\nworld"]);
    bytes.extend_from_slice(b"PING\r\n");
    bytes.extend_from_slice(b"GET split:k\r\n");
    bytes.extend_from_slice(&encode(&[b"ECHO", b"bytes"]));
    bytes.extend_from_slice(&encode(&[b"APPEND", b"split:k", b"!"]));
    for b in &bytes {
        c.send(std::slice::from_ref(b)).await;
        // Let corral read each byte on its own rather than all at once.
        tokio::task::yield_now().await;
    }
    assert_eq!(
        c.read_replies(5).await,
        vec![
            b"+OK\r\n".to_vec(),
            b"+PONG\r\n".to_vec(),
            bulk("hello\r\nworld"),
            bulk("bytes"),
            int(13),
        ]
    );
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_value_written_in_small_pieces_round_trips() {
    let redis = RedisServer::start();
    let proxy = TestProxy::start(&redis.url()).await;
    let mut c = RawClient::connect(proxy.addr).await.unwrap();
    // 1.5 MB of non-repeating bytes (all 256 values) so any misplaced chunk shows.
    let value: Vec<u8> = (0..1_500_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
        .collect();
    let req = encode(&[b"SET", b"big", &value]);
    let replies = c.pipeline(&req, 1000, 1).await;
    assert_eq!(replies[0], b"+OK\r\n");
    let get = encode(&[b"GET", b"big"]);
    let replies = c.pipeline(&get, 3, 1).await;
    assert!(replies[0] == bulk(&value), "GET big: {}", show(&replies[0]));
    let mut direct = RawClient::connect(redis.addr()).await.unwrap();
    assert_eq!(direct.cmd("STRLEN big").await, int(1_500_000));
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_larger_than_socket_buffers_do_not_deadlock() {
    let redis = RedisServer::start();
    let proxy = TestProxy::start(&redis.url()).await;
    let mut c = RawClient::connect(proxy.addr).await.unwrap();
    let value: Vec<u8> = (0..10 * 1024).map(|i| b'a' + (i % 26) as u8).collect();
    assert_eq!(c.request(&[b"SET", b"ten-kb", &value]).await, b"+OK\r\n");
    // 5,000 GETs (about 100 KB of requests, 50 MB of replies), with PINGs every 500 so local
    // replies must be kept in place between large forwarded ones.
    let n = 5_000;
    let mut bytes = Vec::new();
    for i in 0..n {
        if i % 500 == 0 {
            bytes.extend_from_slice(&encode(&[b"PING"]));
        }
        bytes.extend_from_slice(&encode(&[b"GET", b"ten-kb"]));
    }
    let total = n + n / 500;
    // A deadlock shows as a read timeout inside `pipeline` (no reply for 10 s).
    let replies = c.pipeline(&bytes, 16 * 1024, total).await;
    let want = bulk(&value);
    for (i, r) in replies.iter().enumerate() {
        if i % 501 == 0 {
            assert_eq!(r, b"+PONG\r\n", "reply {i}");
        } else {
            assert!(*r == want, "reply {i}: {}", show(r));
        }
    }
    assert_eq!(c.cmd("PING").await, b"+PONG\r\n");
    proxy.stop().await;
}

/// A client that sends a whole pipeline before it reads any reply (a blocking `sendall`, as
/// redis-py's pipelines do), larger than the socket buffers both ways: corral reads on while
/// its replies wait, as Redis does, so neither side waits for the other for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_sent_whole_before_any_reply_is_read_completes() {
    let redis = RedisServer::start();
    let proxy = TestProxy::start(&redis.url()).await;
    let mut c = RawClient::connect(proxy.addr).await.unwrap();
    // About 25 MB each way.
    let (n, payload) = (6_000, vec![b'p'; 4096]);
    let bytes: Vec<u8> = (0..n).flat_map(|_| encode(&[b"ECHO", &payload])).collect();
    // Not a timing assertion: a deadlock never ends, and this bounds the wait for it.
    let sent = tokio::time::timeout(Duration::from_secs(30), c.stream.write_all(&bytes)).await;
    assert!(sent.is_ok(), "corral stopped reading the pipeline");
    let want = bulk(&payload);
    for i in 0..n {
        let r = c.read_reply().await;
        assert!(r == want, "reply {i}: {}", show(&r));
    }
    assert_eq!(c.cmd("PING").await, b"+PONG\r\n");
    proxy.stop().await;
}

/// A value of `len` bytes, different at every offset and from `seed` to `seed`.
fn value(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| b'a' + ((i + seed as usize) % 26) as u8)
        .collect()
}

/// A pipeline of large values mixed with short replies, errors, writes and a local reply,
/// sent in one write: corral hands the large replies to the client in parts as they arrive, and what the
/// client receives is Redis's bytes, reply for reply, in both protocols, with the cache on and
/// off. With the cache on, a short key is served from the cache between the large replies,
/// GETs of a key read again join the first (or lead reads others may join), and their
/// replies are written in place as the parts arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_of_large_values_matches_redis_byte_for_byte() {
    let redis = RedisServer::start();
    let mut setup = RawClient::connect(redis.addr()).await.unwrap();
    let sizes = [300 * 1024, 700 * 1024, 1_200_000, 100];
    for (i, len) in sizes.iter().enumerate() {
        let key = format!("big:{i}");
        let v = value(i as u8, *len);
        assert_eq!(
            setup.request(&[b"SET", key.as_bytes(), &v]).await,
            b"+OK\r\n"
        );
    }
    let field = value(7, 400 * 1024);
    assert_eq!(setup.request(&[b"HSET", b"h", b"f", &field]).await, int(1));
    let requests: &[&[&[u8]]] = &[
        &[b"SET", b"w", b"1"],
        &[b"GET", b"big:0"],
        &[b"GET", b"big:3"],
        &[b"INCR", b"w"],
        &[b"LLEN", b"big:1"],
        &[b"GET", b"big:1"],
        &[b"GET", b"missing"],
        &[b"GET", b"big:2"],
        &[b"STRLEN", b"big:2"],
        &[b"PING"],
        &[b"GET", b"big:0"],
        &[b"HGETALL", b"h"],
        &[b"GET", b"big:2"],
        &[b"GET", b"big:2"],
        &[b"GET", b"w"],
        &[b"EXISTS", b"big:1"],
    ];
    let bytes: Vec<u8> = requests.iter().flat_map(|r| encode(r)).collect();
    for cache in [true, false] {
        let proxy = TestProxy::start_with(&redis.url(), |cfg| cfg.cache.enabled = cache).await;
        if cache {
            // The short value served from the cache, between the large forwarded replies.
            let mut warm = RawClient::connect(proxy.addr).await.unwrap();
            common::make_cached(&mut warm, "big:3", &bulk(value(3, 100))).await;
        }
        for resp3 in [false, true] {
            let mut direct = common::client_in(redis.addr(), resp3).await;
            let want = direct.pipeline(&bytes, bytes.len(), requests.len()).await;
            // Twice: the second round reads keys read just before, which the cache leads.
            for round in 0..2 {
                let mut c = common::client_in(proxy.addr, resp3).await;
                let got = c.pipeline(&bytes, bytes.len(), requests.len()).await;
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        g == w,
                        "cache {cache}, resp3 {resp3}, round {round}, reply {i}: {} against {}",
                        show(&g[..g.len().min(64)]),
                        show(&w[..w.len().min(64)])
                    );
                }
                assert_eq!(got.len(), want.len());
                assert_eq!(c.cmd("PING").await, b"+PONG\r\n");
            }
        }
        proxy.stop().await;
    }
}
