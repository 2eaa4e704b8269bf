//! Cluster mode against a real Redis Cluster (3 masters + 3 replicas): routing by slot,
//! multi-key commands split across slots, whole-keyspace commands, CROSSSLOT, SCAN, the
//! single-node CLUSTER view, and a master failover — all through corral as if it were one
//! Redis.

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::{RawClient, RedisCluster, RedisServer, TestProxy, sync_cmd};
use corral::cluster::key_slot;

async fn proxy_for(cluster: &RedisCluster) -> TestProxy {
    let seeds = cluster.seeds();
    TestProxy::start_with(&seeds[0], |cfg| {
        cfg.cluster.seeds = seeds.clone();
        cfg.cluster.refresh_ms = 500;
        cfg.upstream.request_timeout_ms = 2_000;
    })
    .await
}

/// Waits until corral knows the whole slot map (CLUSTER INFO through corral says ok).
async fn wait_ready(c: &mut RawClient) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let info = c.cmd("CLUSTER INFO").await;
        if String::from_utf8_lossy(&info).contains("cluster_state:ok") {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "corral never saw the cluster as ok"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn bulk(v: &str) -> Vec<u8> {
    format!("${}\r\n{v}\r\n", v.len()).into_bytes()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_over_all_slots_land_on_their_owner_and_multi_key_commands_match_redis() {
    let mut cluster = RedisCluster::start(3, 1);
    let proxy = proxy_for(&cluster).await;
    let mut c = RawClient::connect(proxy.addr).await.unwrap();
    wait_ready(&mut c).await;

    // 1,000 keys over all slots, written and read back through corral, each found on the
    // master that owns its slot.
    for i in 0..1000 {
        let (k, v) = (format!("key:{i}"), format!("v{i}"));
        assert_eq!(
            c.request(&[b"SET", k.as_bytes(), v.as_bytes()]).await,
            b"+OK\r\n"
        );
    }
    for i in (0..1000).step_by(7) {
        let (k, v) = (format!("key:{i}"), format!("v{i}"));
        assert_eq!(c.request(&[b"GET", k.as_bytes()]).await, bulk(&v));
        let owner = cluster.master_for_slot(key_slot(k.as_bytes()));
        assert_eq!(sync_cmd(owner, &["GET", &k]), bulk(&v), "{k} on its owner");
    }

    // Multi-key commands across slots give what one Redis gives.
    let single = RedisServer::start();
    let mut direct = RawClient::connect(single.addr()).await.unwrap();
    let lines = [
        "MSET a 1 b 2 c 3 {a}x 4",
        "MGET a b nokey c {a}x",
        "EXISTS a b nokey c a",
        "TOUCH a b nokey",
        "DEL a nokey b",
        "MGET a b c",
        "UNLINK c {a}x",
        "MGET a b c {a}x",
        "MSET a 1",
        "DBSIZE",
    ];
    for line in lines {
        let d = direct.cmd(line).await;
        let p = c.cmd(line).await;
        if line == "DBSIZE" {
            // The cluster also holds the 1,000 keys above.
            assert_eq!(p, format!(":{}\r\n", 1000 + 1).into_bytes(), "{line}");
            continue;
        }
        assert_eq!(
            String::from_utf8_lossy(&p),
            String::from_utf8_lossy(&d),
            "{line}"
        );
    }

    // Atomic multi-key commands need one slot, as in Redis Cluster.
    let crossslot = b"-CROSSSLOT Keys in request don't hash to the same slot\r\n".to_vec();
    for line in [
        "MSETNX x 1 y 2",
        "RENAME key:1 key:2",
        "SUNIONSTORE d s1 s2",
    ] {
        assert_eq!(c.cmd(line).await, crossslot, "{line}");
    }
    assert_eq!(c.cmd("MSETNX {t}x 1 {t}y 2").await, b":1\r\n");
    assert_eq!(c.cmd("RENAME {t}x {t}z").await, b"+OK\r\n");

    // One node owning every slot, as cluster-aware clients see corral.
    let slots = c.cmd("CLUSTER SLOTS").await;
    assert!(
        slots.starts_with(b"*1\r\n*3\r\n:0\r\n:16383\r\n"),
        "{slots:?}"
    );
    assert_eq!(c.cmd("CLUSTER KEYSLOT foo").await, b":12182\r\n");
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scan_returns_every_key_exactly_once_and_keys_unions_masters() {
    let cluster = RedisCluster::start(3, 1);
    let proxy = proxy_for(&cluster).await;
    let mut c = RawClient::connect(proxy.addr).await.unwrap();
    wait_ready(&mut c).await;
    let n = 500;
    for i in 0..n {
        let k = format!("scan:{i}");
        c.request(&[b"SET", k.as_bytes(), b"x"]).await;
    }
    let mut seen = HashSet::new();
    let mut cursor = "0".to_string();
    let mut rounds = 0;
    loop {
        let reply = c
            .request(&[
                b"SCAN",
                cursor.as_bytes(),
                b"MATCH",
                b"scan:*",
                b"COUNT",
                b"50",
            ])
            .await;
        let text = String::from_utf8_lossy(&reply).into_owned();
        let mut lines = text.split("\r\n");
        assert_eq!(lines.next(), Some("*2"), "{text}");
        lines.next(); // $len of the cursor
        cursor = lines.next().unwrap_or("0").to_string();
        for l in lines.filter(|l| l.starts_with("scan:")) {
            seen.insert(l.to_string());
        }
        rounds += 1;
        assert!(rounds < 10_000, "SCAN did not finish");
        if cursor == "0" {
            break;
        }
    }
    assert_eq!(
        seen.len(),
        n,
        "a full SCAN through corral returns every key"
    );
    let keys = c.cmd("KEYS scan:*").await;
    assert!(keys.starts_with(format!("*{n}\r\n").as_bytes()));
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_is_replaced_and_its_keys_are_readable_again() {
    let mut cluster = RedisCluster::start(3, 1);
    let proxy = proxy_for(&cluster).await;
    let mut c = RawClient::connect(proxy.addr).await.unwrap();
    wait_ready(&mut c).await;
    for i in 0..200 {
        let k = format!("fo:{i}");
        c.request(&[b"SET", k.as_bytes(), b"v"]).await;
    }
    // Let the replicas catch up before the master dies.
    for m in cluster.master_ports() {
        sync_cmd(m, &["WAIT", "1", "2000"]);
    }
    let victim = cluster.master_for_slot(key_slot(b"fo:0"));
    let started = Instant::now();
    cluster.kill_node(victim);
    // Errors are allowed while the cluster fails over; hangs are not (each request is
    // bounded by the request timeout).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = c.cmd("GET fo:0").await;
        if r == b"$1\r\nv\r\n" {
            break;
        }
        assert!(Instant::now() < deadline, "key never readable again: {r:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!(
        "failover: keys readable through corral {:?} after the kill",
        started.elapsed()
    );
    for i in 0..200 {
        let k = format!("fo:{i}");
        assert_eq!(
            c.request(&[b"GET", k.as_bytes()]).await,
            b"$1\r\nv\r\n",
            "{k}"
        );
    }
    proxy.stop().await;
}
