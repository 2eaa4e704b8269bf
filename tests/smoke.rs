//! The harness itself and the most basic path: a command forwarded and one answered locally.

mod common;

use common::{RawClient, RedisServer, TestProxy};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwards_and_answers_locally() {
    let redis = RedisServer::start();
    let proxy = TestProxy::start(&redis.url()).await;
    let mut c = RawClient::connect(proxy.addr).await.unwrap();
    assert_eq!(c.cmd("SET k v").await, b"+OK\r\n");
    assert_eq!(c.cmd("GET k").await, b"$1\r\nv\r\n");
    assert_eq!(c.cmd("PING").await, b"+PONG\r\n");
    let mut direct = RawClient::connect(redis.addr()).await.unwrap();
    assert_eq!(direct.cmd("GET k").await, b"$1\r\nv\r\n");
    proxy.stop().await;
}
