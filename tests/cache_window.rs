//! The admission sketch's long window: taken while the cache serves most GETs and few keys
//! are written, left as soon as writes come, and never taken with `long_window = false`.

mod common;

use std::time::Duration;

use common::*;

/// GETs of the one key `hot` in a pipeline of `n`: once it is cached, all hits.
async fn hot_gets(c: &mut RawClient, n: usize) {
    let reqs: Vec<u8> = (0..n).flat_map(|_| encode(&[b"GET", b"hot"])).collect();
    let replies = c.pipeline(&reqs, 64 * 1024, n).await;
    assert!(
        replies.iter().all(|r| r == b"$1\r\nv\r\n"),
        "GET hot answers v"
    );
}

/// A pipeline of `n` requests: GETs of `hot`, and every fourth a SET of a key of its own.
async fn written_gets(c: &mut RawClient, round: usize, n: usize) {
    let mut reqs = Vec::new();
    for i in 0..n {
        if i % 4 == 0 {
            reqs.extend(encode(&[b"SET", format!("w:{round}:{i}").as_bytes(), b"x"]));
        } else {
            reqs.extend(encode(&[b"GET", b"hot"]));
        }
    }
    c.pipeline(&reqs, 64 * 1024, n).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_long_window_follows_a_served_read_only_load_and_leaves_when_writes_come() {
    let redis = RedisServer::start();
    let grows = TestProxy::start(&redis.url()).await;
    let fixed = TestProxy::start_with(&redis.url(), |c| c.cache.long_window = false).await;
    let mut direct = connect(redis.addr()).await;
    assert_eq!(direct.cmd("SET hot v").await, b"+OK\r\n");
    let (mut a, mut b) = (connect(grows.addr).await, connect(fixed.addr).await);
    for c in [&mut a, &mut b] {
        assert_eq!(stat(c, "cache_admission_window").await, "short");
        make_cached(c, "hot", b"$1\r\nv\r\n").await;
    }
    // Every GET a hit, no write: the window grows after eight looks of 250 ms.
    let deadline = Deadline::new(Duration::from_secs(20), "the long window").every(Duration::ZERO);
    while stat(&mut a, "cache_admission_window").await != "long" {
        hot_gets(&mut a, 2_000).await;
        hot_gets(&mut b, 2_000).await;
        deadline.pause().await;
    }
    assert_eq!(
        stat(&mut b, "cache_admission_window").await,
        "short",
        "long_window = false: the same load left it short"
    );
    // A write per three GETs: back to the short window at the next look.
    let deadline =
        Deadline::new(Duration::from_secs(20), "the short window again").every(Duration::ZERO);
    let mut round = 0;
    while stat(&mut a, "cache_admission_window").await != "short" {
        written_gets(&mut a, round, 2_000).await;
        round += 1;
        deadline.pause().await;
    }
    grows.stop().await;
    fixed.stop().await;
}
