//! Stateful commands in cluster mode: transactions pinned to the node of their keys (MULTI
//! answered by corral until the first queued command names the node), WATCH, blocking
//! commands on the key's node, and pub/sub through any node.

mod common;

use std::time::Duration;

use common::{Deadline, RawClient, RedisCluster, show};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_run_on_the_node_of_their_keys() {
    let cluster = RedisCluster::start(3, 0);
    let (proxy, mut c) = common::ready_cluster_proxy(&cluster, |_| {}).await;
    // One slot: runs atomically on its node, replies as Redis gives them.
    assert_eq!(c.cmd("MULTI").await, b"+OK\r\n");
    assert_eq!(c.cmd("SET {u1}a 1").await, b"+QUEUED\r\n");
    assert_eq!(c.cmd("INCR {u1}a").await, b"+QUEUED\r\n");
    assert_eq!(c.cmd("GET {u1}a").await, b"+QUEUED\r\n");
    assert_eq!(c.cmd("EXEC").await, b"*3\r\n+OK\r\n:2\r\n$1\r\n2\r\n");
    // Pipelined in one write, as client libraries send transactions.
    c.send(b"MULTI\r\nINCR {u2}n\r\nINCR {u2}n\r\nEXEC\r\n")
        .await;
    for want in [
        &b"+OK\r\n"[..],
        b"+QUEUED\r\n",
        b"+QUEUED\r\n",
        b"*2\r\n:1\r\n:2\r\n",
    ] {
        assert_eq!(c.read_reply().await, want);
    }
    // Nothing queued; DISCARD; nesting; EXEC without MULTI.
    assert_eq!(c.cmd("MULTI").await, b"+OK\r\n");
    assert_eq!(c.cmd("EXEC").await, b"*0\r\n");
    assert_eq!(c.cmd("MULTI").await, b"+OK\r\n");
    assert_eq!(
        c.cmd("MULTI").await,
        b"-ERR MULTI calls can not be nested\r\n"
    );
    assert_eq!(c.cmd("DISCARD").await, b"+OK\r\n");
    assert_eq!(c.cmd("EXEC").await, b"-ERR EXEC without MULTI\r\n");
    // WATCH inside MULTI is refused and the transaction goes on, as in Redis.
    assert_eq!(c.cmd("MULTI").await, b"+OK\r\n");
    for watch in ["WATCH a", "WATCH a b"] {
        assert_eq!(
            c.cmd(watch).await,
            b"-ERR WATCH inside MULTI is not allowed\r\n",
            "{watch}"
        );
    }
    assert_eq!(c.cmd("EXEC").await, b"*0\r\n");
    // WATCH aborts when another client writes the watched key.
    let mut other = RawClient::connect(proxy.addr).await.unwrap();
    assert_eq!(c.cmd("WATCH {u3}w").await, b"+OK\r\n");
    assert_eq!(other.cmd("SET {u3}w x").await, b"+OK\r\n");
    assert_eq!(c.cmd("MULTI").await, b"+OK\r\n");
    assert_eq!(c.cmd("SET {u3}w y").await, b"+QUEUED\r\n");
    assert_eq!(c.cmd("EXEC").await, b"*-1\r\n");
    assert_eq!(other.cmd("GET {u3}w").await, b"$1\r\nx\r\n");
    // Keys in different slots cannot share a transaction: Redis Cluster's errors.
    assert_eq!(
        c.cmd("WATCH a b").await,
        b"-CROSSSLOT Keys in request don't hash to the same slot\r\n"
    );
    assert_eq!(c.cmd("UNWATCH").await, b"+OK\r\n");
    // What spans every master would see or change one master only in a transaction: it is
    // refused, and EXEC fails as after any command refused while queueing. Before the first
    // queued command (MULTI still corral's) and after it (MULTI sent to the node).
    const ABORT: &[u8] = b"-EXECABORT Transaction discarded because of previous errors.\r\n";
    let refused = |name: &str| {
        format!(
            "-ERR '{name}' is not supported by corral: not inside MULTI in cluster mode, \
             where a transaction runs on one master\r\n"
        )
        .into_bytes()
    };
    assert_eq!(c.cmd("SET {u4}kept 1").await, b"+OK\r\n");
    assert_eq!(c.cmd("MULTI").await, b"+OK\r\n");
    assert_eq!(c.cmd("FLUSHALL").await, refused("flushall"));
    assert_eq!(c.cmd("SET {u4}a 1").await, b"+QUEUED\r\n");
    assert_eq!(c.cmd("EXEC").await, ABORT);
    assert_eq!(c.cmd("MULTI").await, b"+OK\r\n");
    assert_eq!(c.cmd("SET {u4}a 1").await, b"+QUEUED\r\n");
    for (cmd, name) in [
        ("DBSIZE", "dbsize"),
        ("KEYS *", "keys"),
        ("SCAN 0", "scan"),
        ("CONFIG SET maxmemory-samples 6", "config|set"),
    ] {
        assert_eq!(c.cmd(cmd).await, refused(name), "{cmd}");
    }
    assert_eq!(c.cmd("EXEC").await, ABORT);
    assert_eq!(c.cmd("GET {u4}a").await, b"$-1\r\n");
    assert_eq!(c.cmd("GET {u4}kept").await, b"$1\r\n1\r\n");
    // Outside a transaction they go to every master, watching or not (`a`, `b` and `c` are
    // on three masters: one of them is the master keyless commands go to).
    assert_eq!(c.cmd("DBSIZE").await, b":4\r\n");
    for key in ["a", "b", "c"] {
        assert_eq!(c.cmd(&format!("WATCH {key}")).await, b"+OK\r\n");
        assert_eq!(c.cmd("DBSIZE").await, b":4\r\n", "watching {key}");
        assert_eq!(c.cmd("UNWATCH").await, b"+OK\r\n");
    }
    assert_eq!(c.cmd("MULTI").await, b"+OK\r\n");
    assert_eq!(
        c.cmd("PUBSUB SHARDNUMSUB a b").await,
        refused("pubsub|shardnumsub")
    );
    assert_eq!(c.cmd("DISCARD").await, b"+OK\r\n");
    proxy.stop().await;
}

/// Client libraries send WATCH, their reads and the transaction in one write. WATCH pins the
/// client to its key's master: what follows for that master goes there, behind it, and what
/// is for other masters is routed as usual. `a`, `b`, `c` and `d` are on slots 15495, 3300,
/// 7365 and 11298: `a` and `d` on one master, `b` and `c` on two others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_and_a_transaction_in_one_write_behave_as_on_redis() {
    let cluster = RedisCluster::start(3, 0);
    let (proxy, mut c) = common::ready_cluster_proxy(&cluster, |_| {}).await;
    let expect = async |c: &mut RawClient, sent: &[u8], want: &[&[u8]]| {
        c.send(sent).await;
        for (i, w) in want.iter().enumerate() {
            assert_eq!(
                show(&c.read_reply().await),
                show(w),
                "reply {i} to {}",
                show(sent)
            );
        }
    };
    // The client's own write of the watched key fails its EXEC.
    expect(
        &mut c,
        b"WATCH a\r\nGET a\r\nSET a x\r\nMULTI\r\nSET a mine\r\nEXEC\r\nGET a\r\n",
        &[
            b"+OK\r\n",
            b"$-1\r\n",
            b"+OK\r\n",
            b"+OK\r\n",
            b"+QUEUED\r\n",
            b"*-1\r\n",
            b"$1\r\nx\r\n",
        ],
    )
    .await;
    // A read of another master's key between WATCH and MULTI: the transaction still runs on
    // the watched key's master.
    expect(
        &mut c,
        b"WATCH a\r\nGET b\r\nMULTI\r\nSET a 1\r\nGET a\r\nEXEC\r\n",
        &[
            b"+OK\r\n",
            b"$-1\r\n",
            b"+OK\r\n",
            b"+QUEUED\r\n",
            b"+QUEUED\r\n",
            b"*2\r\n+OK\r\n$1\r\n1\r\n",
        ],
    )
    .await;
    // A second WATCH: of a key on the same master it joins the first; of another master's
    // key it is refused as keys of two slots in one WATCH are, and the first still holds. In
    // MULTI, Redis's refusal.
    expect(
        &mut c,
        b"WATCH a\r\nWATCH d\r\nWATCH b\r\nMULTI\r\nWATCH b\r\nSET a 2\r\nEXEC\r\n",
        &[
            b"+OK\r\n",
            b"+OK\r\n",
            b"-CROSSSLOT Keys in request don't hash to the same slot\r\n",
            b"+OK\r\n",
            b"-ERR WATCH inside MULTI is not allowed\r\n",
            b"+QUEUED\r\n",
            b"*1\r\n+OK\r\n",
        ],
    )
    .await;
    let mut writer = common::connect(proxy.addr).await;
    expect(
        &mut c,
        b"WATCH a\r\nWATCH d\r\nWATCH b\r\n",
        &[
            b"+OK\r\n",
            b"+OK\r\n",
            b"-CROSSSLOT Keys in request don't hash to the same slot\r\n",
        ],
    )
    .await;
    expect(&mut writer, b"SET d other\r\n", &[b"+OK\r\n"]).await;
    expect(
        &mut c,
        b"MULTI\r\nSET a 3\r\nEXEC\r\nGET a\r\n",
        &[b"+OK\r\n", b"+QUEUED\r\n", b"*-1\r\n", b"$1\r\n2\r\n"],
    )
    .await;
    // No watch is left behind on a connection other clients get.
    let mut other = common::connect(proxy.addr).await;
    for _ in 0..6 {
        expect(
            &mut other,
            b"WATCH d\r\nMULTI\r\nSET d 1\r\nEXEC\r\n",
            &[b"+OK\r\n", b"+OK\r\n", b"+QUEUED\r\n", b"*1\r\n+OK\r\n"],
        )
        .await;
    }
    // A transaction whose first command a cluster refuses (CROSSSLOT) fails whole, as a
    // node fails it: nothing queued after it runs.
    expect(
        &mut c,
        b"MULTI\r\nMSET b 2 c 3\r\nSET d 4\r\nEXEC\r\nMGET b c d\r\n",
        &[
            b"+OK\r\n",
            b"-CROSSSLOT Keys in request don't hash to the same slot\r\n",
            b"+QUEUED\r\n",
            b"-EXECABORT Transaction discarded because of previous errors.\r\n",
            b"*3\r\n$-1\r\n$-1\r\n$1\r\n1\r\n",
        ],
    )
    .await;
    expect(
        &mut c,
        b"MULTI\r\nMSET b 2 c 3\r\nEXEC\r\n",
        &[
            b"+OK\r\n",
            b"-CROSSSLOT Keys in request don't hash to the same slot\r\n",
            b"-EXECABORT Transaction discarded because of previous errors.\r\n",
        ],
    )
    .await;
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blocking_pops_wait_on_the_keys_node() {
    let cluster = RedisCluster::start(3, 0);
    let (proxy, mut c) = common::ready_cluster_proxy(&cluster, |_| {}).await;
    let mut pusher = RawClient::connect(proxy.addr).await.unwrap();
    c.send(&common::encode(&[b"BLPOP", b"queue", b"0"])).await;
    // The pop is blocked: other requests through corral are served meanwhile.
    assert_eq!(pusher.cmd("SET other 1").await, b"+OK\r\n");
    assert_eq!(pusher.cmd("RPUSH queue job").await, b":1\r\n");
    assert_eq!(c.read_reply().await, b"*2\r\n$5\r\nqueue\r\n$3\r\njob\r\n");
    assert_eq!(c.cmd("BLPOP queue 0.1").await, b"*-1\r\n");
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscribers_get_messages_published_anywhere() {
    let cluster = RedisCluster::start(3, 0);
    let (proxy, mut publisher) = common::ready_cluster_proxy(&cluster, |_| {}).await;
    let mut sub = RawClient::connect(proxy.addr).await.unwrap();
    assert_eq!(
        sub.cmd("SUBSCRIBE news").await,
        b"*3\r\n$9\r\nsubscribe\r\n$4\r\nnews\r\n:1\r\n"
    );
    // PUBLISH is propagated through the cluster bus, whichever node gets it.
    publisher.cmd("PUBLISH news hello").await;
    assert_eq!(
        sub.read_reply().await,
        b"*3\r\n$7\r\nmessage\r\n$4\r\nnews\r\n$5\r\nhello\r\n"
    );
    proxy.stop().await;
}

/// Each node publishes its own keys' events, which Redis Cluster does not propagate: a
/// subscription that may receive them is made on every master, and each event (and each
/// PUBLISH, which every node gets) reaches the subscriber once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keyspace_notifications_come_from_every_master_once() {
    let mut cluster = RedisCluster::start(3, 0);
    let (proxy, mut c) = common::ready_cluster_proxy(&cluster, |_| {}).await;
    let quiet = async |sub: &mut RawClient, what: &str| {
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!sub.has_pending_reply(), "{what} delivered twice");
    };
    let mut all = RawClient::connect(proxy.addr).await.unwrap();
    assert_eq!(
        all.cmd("PSUBSCRIBE *").await,
        b"*3\r\n$10\r\npsubscribe\r\n$1\r\n*\r\n:1\r\n"
    );
    c.cmd("PUBLISH news hello").await;
    assert_eq!(
        all.read_reply().await,
        b"*4\r\n$8\r\npmessage\r\n$1\r\n*\r\n$4\r\nnews\r\n$5\r\nhello\r\n"
    );
    quiet(&mut all, "a PUBLISH").await;
    // CONFIG SET reaches every node, so every master publishes its keys' events.
    assert_eq!(
        c.cmd("CONFIG SET notify-keyspace-events E$").await,
        b"+OK\r\n"
    );
    let mut sub = RawClient::connect(proxy.addr).await.unwrap();
    assert_eq!(
        sub.cmd("SUBSCRIBE __keyevent@0__:set").await,
        b"*3\r\n$9\r\nsubscribe\r\n$18\r\n__keyevent@0__:set\r\n:1\r\n"
    );
    let keys: Vec<String> = (0..30).map(|i| format!("ev:{i}")).collect();
    let owners: std::collections::HashSet<u16> = keys
        .iter()
        .map(|k| cluster.master_for_slot(corral::cluster::key_slot(k.as_bytes())))
        .collect();
    assert_eq!(owners.len(), 3, "the keys span every master");
    for k in &keys {
        assert_eq!(c.cmd(&format!("SET {k} v")).await, b"+OK\r\n");
    }
    let event = |k: &str| {
        format!(
            "*3\r\n$7\r\nmessage\r\n$18\r\n__keyevent@0__:set\r\n${}\r\n{k}\r\n",
            k.len()
        )
    };
    let pevent = |k: &str| {
        format!(
            "*4\r\n$8\r\npmessage\r\n$1\r\n*\r\n$18\r\n__keyevent@0__:set\r\n${}\r\n{k}\r\n",
            k.len()
        )
    };
    for (client, of) in [
        (&mut sub, &event as &dyn Fn(&str) -> String),
        (&mut all, &pevent),
    ] {
        let mut got: Vec<String> = Vec::new();
        for _ in &keys {
            got.push(show(&client.read_reply().await));
        }
        got.sort();
        let mut want: Vec<String> = keys.iter().map(|k| show(of(k).as_bytes())).collect();
        want.sort();
        assert_eq!(got, want);
        quiet(client, "an event").await;
    }
    // A master's notification hub is a connection of its own, ended once no subscription
    // needs it (a master other than the seed corral's main hub is on).
    let seed = cluster.nodes()[0];
    let master = *owners.iter().find(|&&m| m != seed).unwrap_or(&seed);
    let conns = || {
        String::from_utf8_lossy(&common::sync_cmd(master, &["CLIENT", "LIST"]))
            .lines()
            .count()
    };
    let with_hub = conns();
    drop((sub, all));
    let deadline = Deadline::new(Duration::from_secs(10), "the master's hub to close")
        .every(Duration::from_millis(50));
    while conns() != with_hub - 1 {
        deadline.pause().await;
    }
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_go_to_replicas_when_asked() {
    let mut cluster = RedisCluster::start(3, 1);
    // Replicas report themselves as loading until they replicated something: write first.
    for m in cluster.master_ports() {
        common::sync_cmd(m, &["SET", "warmup", "1"]);
        common::sync_cmd(m, &["WAIT", "1", "2000"]);
    }
    let (proxy, mut c) = common::ready_cluster_proxy(&cluster, |cfg| {
        cfg.cluster.refresh_ms = 200;
        cfg.cluster.read_from = corral::config::ReadFrom::Replica;
    })
    .await;
    let key = "{r}k";
    let slot = corral::cluster::key_slot(key.as_bytes());
    let master = cluster.master_for_slot(slot);
    let replica = cluster.replicas_of(master)[0];
    common::sync_cmd(replica, &["CONFIG", "RESETSTAT"]);
    assert_eq!(c.cmd(&format!("SET {key} v")).await, b"+OK\r\n");
    common::sync_cmd(master, &["WAIT", "1", "2000"]);
    // The topology refresh marks the replica online once it has replicated; reads then go
    // there (with READONLY), writes still to the master.
    let deadline = Deadline::new(Duration::from_secs(10), "a GET to reach the replica")
        .every(Duration::from_millis(50));
    loop {
        assert_eq!(c.cmd(&format!("GET {key}")).await, b"$1\r\nv\r\n");
        let stats = String::from_utf8_lossy(&common::sync_cmd(replica, &["INFO", "commandstats"]))
            .into_owned();
        if stats.contains("cmdstat_get:calls=") {
            break;
        }
        deadline.pause_seeing(stats).await;
    }
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shard_subscriptions_follow_their_slot() {
    let mut cluster = RedisCluster::start(3, 0);
    let (proxy, mut publisher) = common::ready_cluster_proxy(&cluster, |_| {}).await;
    let mut sub = RawClient::connect(proxy.addr).await.unwrap();
    assert_eq!(
        sub.cmd("SSUBSCRIBE sch").await,
        b"*3\r\n$10\r\nssubscribe\r\n$3\r\nsch\r\n:1\r\n"
    );
    let message = b"*3\r\n$8\r\nsmessage\r\n$3\r\nsch\r\n$2\r\nhi\r\n";
    assert_eq!(publisher.cmd("SPUBLISH sch hi").await, b":1\r\n");
    assert_eq!(sub.read_reply().await, message);
    // Shard channels on three masters (slots 15495, 3300, 7365) are all listed.
    let mut others = RawClient::connect(proxy.addr).await.unwrap();
    others.cmd("SSUBSCRIBE a").await;
    others.cmd("SSUBSCRIBE b").await;
    others.cmd("SSUBSCRIBE c").await;
    let listed = publisher.cmd("PUBSUB SHARDCHANNELS").await;
    let mut names: Vec<String> = String::from_utf8_lossy(&listed)
        .split("\r\n")
        .filter(|l| !l.is_empty() && !l.starts_with(['*', '$']))
        .map(String::from)
        .collect();
    names.sort();
    assert_eq!(names, ["a", "b", "c", "sch"], "{}", show(&listed));
    // Each is counted on its master, in the order asked, with each of corral's subscribers
    // (Redis counts corral's one subscription) and a subscriber of the node's own.
    let mut second = RawClient::connect(proxy.addr).await.unwrap();
    second.cmd("SSUBSCRIBE a").await;
    let a_master = cluster.master_for_slot(corral::cluster::key_slot(b"a"));
    let mut direct = common::connect(format!("127.0.0.1:{a_master}").parse().unwrap()).await;
    direct.cmd("SSUBSCRIBE a").await;
    assert_eq!(
        show(&publisher.cmd("PUBSUB SHARDNUMSUB c a zz b").await),
        show(b"*8\r\n$1\r\nc\r\n:1\r\n$1\r\na\r\n:3\r\n$2\r\nzz\r\n:0\r\n$1\r\nb\r\n:1\r\n")
    );
    assert_eq!(
        publisher.cmd("PUBSUB SHARDNUMSUB a").await,
        b"*2\r\n$1\r\na\r\n:3\r\n"
    );
    drop((second, direct));

    // Move the channel's slot to another master: Redis drops the shard subscription on the
    // old owner; corral subscribes again on the new one, without the client noticing.
    let slot = corral::cluster::key_slot(b"sch");
    let src = cluster.master_for_slot(slot);
    let masters = cluster.master_ports();
    let dst = *masters.iter().find(|&&p| p != src).unwrap();
    let id = |p: u16| common::reply_text(&common::sync_cmd(p, &["CLUSTER", "MYID"]));
    let (src_id, dst_id, s) = (id(src), id(dst), slot.to_string());
    common::sync_cmd(dst, &["CLUSTER", "SETSLOT", &s, "IMPORTING", &src_id]);
    common::sync_cmd(src, &["CLUSTER", "SETSLOT", &s, "MIGRATING", &dst_id]);
    let others = masters.iter().copied().filter(|&p| p != src && p != dst);
    for p in [dst, src].into_iter().chain(others) {
        common::sync_cmd(p, &["CLUSTER", "SETSLOT", &s, "NODE", &dst_id]);
    }
    // Publish until the new owner has corral's subscription (bounded), then the message
    // arrives as before.
    let deadline = Deadline::new(Duration::from_secs(15), "the shard subscription to move")
        .every(Duration::from_millis(50));
    loop {
        let n = common::sync_cmd(dst, &["SPUBLISH", "sch", "hi"]);
        if n == b":1\r\n" {
            break;
        }
        deadline.pause_seeing(show(&n)).await;
    }
    assert_eq!(sub.read_reply().await, message);
    assert_eq!(sub.cmd("PING").await, b"*2\r\n$4\r\npong\r\n$0\r\n\r\n");
    proxy.stop().await;
}
