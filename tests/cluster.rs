//! Cluster mode against a real Redis Cluster (3 masters + 3 replicas): routing by slot,
//! multi-key commands split across slots, whole-keyspace commands, CROSSSLOT, SCAN, the
//! single-node CLUSTER view, and a master failover — all through corral as if it were one
//! Redis.

mod common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::{Deadline, RawClient, RedisCluster, RedisServer, bulk, reply_text, show, sync_cmd};
use corral::cluster::key_slot;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_over_all_slots_land_on_their_owner_and_multi_key_commands_match_redis() {
    let mut cluster = RedisCluster::start(3, 1);
    let (proxy, mut c) = common::ready_cluster_proxy(&cluster, |_| {}).await;

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
        // A key without its value, across slots: refused whole, nothing written.
        "MSET a 2 b",
        "MSET d 1 b 2 e",
        "MGET a b d e",
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
    let mut cluster = RedisCluster::start(3, 1);
    let (proxy, mut c) = common::ready_cluster_proxy(&cluster, |_| {}).await;
    // A keyspace smaller than COUNT comes whole in one call, cursor 0, as from one Redis,
    // though its keys are on several masters (each done master hands over to the next).
    assert_eq!(c.cmd("SCAN 0").await, b"*2\r\n$1\r\n0\r\n*0\r\n", "empty");
    let small: Vec<String> = (0..6).map(|i| format!("small:{i}")).collect();
    let owners: HashSet<u16> = small
        .iter()
        .map(|k| cluster.master_for_slot(key_slot(k.as_bytes())))
        .collect();
    assert!(owners.len() > 1, "the keys are on one master");
    for k in &small {
        c.request(&[b"SET", k.as_bytes(), b"x"]).await;
    }
    let text = String::from_utf8_lossy(&c.cmd("SCAN 0").await).into_owned();
    assert!(text.starts_with("*2\r\n$1\r\n0\r\n*6\r\n"), "{text}");
    let listed: HashSet<&str> = text
        .split("\r\n")
        .filter(|l| l.starts_with("small:"))
        .collect();
    assert_eq!(listed.len(), small.len(), "{text}");
    // COUNT 2: a page stops at two keys or more, the rest comes in later calls.
    let text = String::from_utf8_lossy(&c.cmd("SCAN 0 COUNT 2").await).into_owned();
    assert!(!text.starts_with("*2\r\n$1\r\n0\r\n"), "{text}");
    c.cmd("DEL small:0 small:1 small:2 small:3 small:4 small:5")
        .await;
    let n = 500;
    for i in 0..n {
        let k = format!("scan:{i}");
        c.request(&[b"SET", k.as_bytes(), b"x"]).await;
    }
    let mut seen = HashSet::new();
    let mut returned = 0;
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
            returned += 1;
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
    assert_eq!(returned, n, "a key returned twice");
    let keys = c.cmd("KEYS scan:*").await;
    assert!(keys.starts_with(format!("*{n}\r\n").as_bytes()));
    // Cursors Redis reads as the largest one: the scan is over, as on Redis; not a number: the
    // error Redis gives.
    for cursor in ["-1", "18446744073709551615"] {
        let got = c.cmd(&format!("SCAN {cursor}")).await;
        assert_eq!(got, b"*2\r\n$1\r\n0\r\n*0\r\n", "SCAN {cursor}");
    }
    assert_eq!(c.cmd("SCAN x").await, b"-ERR invalid cursor\r\n");
    assert_eq!(
        c.cmd("SCAN").await,
        b"-ERR wrong number of arguments for 'scan' command\r\n"
    );
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_is_replaced_and_its_keys_are_readable_again() {
    let mut cluster = RedisCluster::start(3, 1);
    let (proxy, mut c) = common::ready_cluster_proxy(&cluster, |_| {}).await;
    for i in 0..200 {
        let k = format!("fo:{i}");
        c.request(&[b"SET", k.as_bytes(), b"v"]).await;
    }
    let victim = cluster.master_for_slot(key_slot(b"fo:0"));
    // Keyspace events of a key of the victim's shard, set on every node through corral (the
    // replica too, once the topology lists it) and subscribed once, before the kill.
    let replica = cluster.replicas_of(victim)[0];
    keyspace_events_on(&mut c, replica).await;
    let mut events = RawClient::connect(proxy.addr).await.unwrap();
    events.cmd("SUBSCRIBE __keyspace@0__:fo:0").await;
    // Let the victim's replica catch up before it dies, or the keys die with it. WAIT on a
    // connection of its own would wait for none of these writes (it counts only its own
    // connection's), so the replication offsets are compared.
    let caught_up = Deadline::new(Duration::from_secs(30), "the replica to catch up")
        .every(Duration::from_millis(50));
    loop {
        let info = reply_text(&sync_cmd(victim, &["INFO", "replication"]));
        if replica_caught_up(&info) {
            break;
        }
        caught_up.pause_seeing(info).await;
    }
    let started = Instant::now();
    cluster.kill_node(victim);
    // Errors are allowed while the cluster fails over; hangs are not (each request is
    // bounded by the request timeout).
    let deadline = Deadline::new(Duration::from_secs(30), "the key to be readable again")
        .every(Duration::from_millis(100));
    loop {
        let r = c.cmd("GET fo:0").await;
        if r == b"$1\r\nv\r\n" {
            break;
        }
        deadline.pause_seeing(show(&r)).await;
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
    // The promoted replica publishes the key's events now: corral subscribed there when the
    // topology changed.
    let deadline = Deadline::new(Duration::from_secs(10), "an event from the new master")
        .every(Duration::from_millis(50));
    while !events.has_pending_reply() {
        c.cmd("SET fo:0 w").await;
        deadline.pause().await;
    }
    assert_eq!(
        events.read_reply().await,
        b"*3\r\n$7\r\nmessage\r\n$19\r\n__keyspace@0__:fo:0\r\n$3\r\nset\r\n"
    );
    proxy.stop().await;
}

/// Turns on keyspace events for strings (`K$`) with a CONFIG SET through corral, which sets
/// every node it lists, until `replica` has it: a replica is listed once it is online.
async fn keyspace_events_on(c: &mut RawClient, replica: u16) {
    let deadline = Deadline::new(Duration::from_secs(10), "the replica to take the setting")
        .every(Duration::from_millis(100));
    loop {
        assert_eq!(
            c.cmd("CONFIG SET notify-keyspace-events K$").await,
            b"+OK\r\n"
        );
        let got = sync_cmd(replica, &["CONFIG", "GET", "notify-keyspace-events"]);
        if got.ends_with(b"$2\r\n$K\r\n") {
            return;
        }
        deadline.pause_seeing(show(&got)).await;
    }
}

/// Whether a master's `INFO replication` shows a replica online at the master's offset.
fn replica_caught_up(info: &str) -> bool {
    let field = |line: &str, name: &str| {
        line.split(',')
            .find_map(|kv| kv.strip_prefix(name))
            .map(str::to_string)
    };
    let Some(offset) = info
        .lines()
        .find_map(|l| l.trim().strip_prefix("master_repl_offset:"))
    else {
        return false;
    };
    info.lines().filter(|l| l.starts_with("slave")).any(|l| {
        field(l, "state=").as_deref() == Some("online")
            && field(l, "offset=").as_deref() == Some(offset.trim())
    })
}

// ---- Clients as they are, the CLUSTER view in use, whole-keyspace commands, topology
// changes. ----

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

/// `per` keys named `{prefix}:N` for each master, with the master's port: every shard gets
/// some.
fn keys_per_master(
    cluster: &mut RedisCluster,
    prefix: &str,
    per: usize,
) -> Vec<(u16, Vec<String>)> {
    let port = cluster.master_ports()[0];
    let nodes = RedisCluster::cluster_nodes(port);
    let mut out: Vec<(u16, Vec<String>)> = cluster
        .master_ports()
        .into_iter()
        .map(|p| (p, Vec::new()))
        .collect();
    for i in 0..100_000 {
        if out.iter().all(|(_, k)| k.len() >= per) {
            return out;
        }
        let key = format!("{prefix}:{i}");
        let slot = key_slot(key.as_bytes());
        let owner = nodes
            .iter()
            .find(|n| n.is_master() && n.slots.iter().any(|&(a, b)| (a..=b).contains(&slot)))
            .map(|n| n.port)
            .expect("every slot has a master");
        let entry = out
            .iter_mut()
            .find(|(p, _)| *p == owner)
            .expect("owner is a master");
        if entry.1.len() < per {
            entry.1.push(key);
        }
    }
    panic!("could not find {per} keys for every master");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cli_with_and_without_cluster_mode_reads_and_writes_every_shard() {
    let mut cluster = RedisCluster::start(3, 0);
    let (proxy, _c) = common::ready_cluster_proxy(&cluster, |_| {}).await;
    let port = proxy.addr.port().to_string();
    let shards = keys_per_master(&mut cluster, "cli", 3);

    for (flags, tag) in [
        (vec!["-p", port.as_str()], "plain"),
        (vec!["-c", "-p", port.as_str()], "c"),
    ] {
        // One command per invocation, on keys of every shard.
        for (owner, keys) in &shards {
            for k in keys {
                let key = format!("{tag}:{k}");
                let value = format!("{tag}-{owner}");
                let mut args = flags.clone();
                args.extend(["SET", key.as_str(), value.as_str()]);
                assert_eq!(
                    common::run_tool("redis-cli", &args, b"").await.trim(),
                    "OK",
                    "{tag}: SET {key}"
                );
                let mut args = flags.clone();
                args.extend(["GET", key.as_str()]);
                assert_eq!(
                    common::run_tool("redis-cli", &args, b"").await.trim(),
                    value,
                    "{tag}: GET {key}"
                );
                assert_eq!(
                    sync_cmd(
                        cluster.master_for_slot(key_slot(key.as_bytes())),
                        &["GET", &key]
                    ),
                    bulk(&value),
                    "{tag}: {key} on its owner"
                );
            }
        }
        // Many commands on one connection, read from stdin; a multi-key command across shards.
        let all: Vec<String> = shards
            .iter()
            .flat_map(|(_, k)| k.iter().map(|k| format!("{tag}:{k}")))
            .collect();
        let mut script = String::new();
        for k in &all {
            script.push_str(&format!("SET {k} s-{k}\n"));
        }
        script.push_str(&format!("MGET {}\n", all.join(" ")));
        script.push_str(&format!("DEL {}\n", all.join(" ")));
        script.push_str("CLUSTER KEYSLOT foo\n");
        let out = common::run_tool("redis-cli", &flags, script.as_bytes()).await;
        let mut want: Vec<String> = all.iter().map(|_| "OK".to_string()).collect();
        want.extend(all.iter().map(|k| format!("s-{k}")));
        want.push(all.len().to_string());
        want.push("12182".to_string());
        assert_eq!(
            out.lines().collect::<Vec<_>>(),
            want,
            "{tag}: piped commands"
        );
    }
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_py_plain_client_pipelines_keys_across_shards() {
    common::require_redis_py();
    let mut cluster = RedisCluster::start(3, 0);
    let (proxy, _c) = common::ready_cluster_proxy(&cluster, |_| {}).await;
    let shards = keys_per_master(&mut cluster, "py", 20);
    let keys: Vec<String> = shards.iter().flat_map(|(_, k)| k.clone()).collect();

    // redis.Redis (not RedisCluster): one connection to corral, as to a single Redis.
    let script = r#"
import sys, redis
port, keys = int(sys.argv[1]), sys.argv[2:]
r = redis.Redis(port=port, decode_responses=True)
p = r.pipeline(transaction=False)
for i, k in enumerate(keys):
    p.set(k, f"v{i}")
    p.get(k)
    p.incr(k + ":n")
out = p.execute()
assert out == [x for i in range(len(keys)) for x in (True, f"v{i}", 1)], out
assert r.mget(keys + ["py:missing"]) == [f"v{i}" for i in range(len(keys))] + [None]
assert r.exists(*keys) == len(keys)
assert r.delete(*[k + ":n" for k in keys]) == len(keys)
assert r.dbsize() == len(keys), r.dbsize()
assert sorted(r.scan_iter(match="py:*", count=7)) == sorted(keys)
assert sorted(r.keys("py:*")) == sorted(keys)
info = r.cluster("info")
assert info["cluster_state"] == "ok", info
print("ok")
"#;
    let mut args = vec!["-c", script, &proxy.addr.port().to_string()]
        .into_iter()
        .map(String::from)
        .collect::<Vec<_>>();
    args.extend(keys.iter().cloned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_eq!(common::run_tool("python3", &args, b"").await.trim(), "ok");
    for (i, k) in keys.iter().enumerate() {
        let owner = cluster.master_for_slot(key_slot(k.as_bytes()));
        assert_eq!(
            sync_cmd(owner, &["GET", k]),
            bulk(format!("v{i}")),
            "{k} on its owner"
        );
    }
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resp3_client_gets_maps_and_nulls_as_from_one_redis() {
    let mut cluster = RedisCluster::start(3, 0);
    let (proxy, mut c) = common::ready_cluster_proxy(&cluster, |_| {}).await;
    let single = RedisServer::start();
    let mut direct = RawClient::connect(single.addr()).await.unwrap();
    for client in [&mut c, &mut direct] {
        client.send(&common::encode(&[b"HELLO", b"3"])).await;
        let hello = client.read_reply().await;
        assert!(hello.starts_with(b"%"), "HELLO 3: {}", common::show(&hello));
    }
    let shards = keys_per_master(&mut cluster, "r3", 1);
    let keys: Vec<&str> = shards.iter().map(|(_, k)| k[0].as_str()).collect();
    let mut lines = Vec::new();
    for k in &keys {
        lines.push(format!("HSET {k}:h a 1 b 2"));
        lines.push(format!("HGETALL {k}:h"));
        lines.push(format!("SET {k} v"));
        lines.push(format!("SADD {k}:s x"));
        lines.push(format!("SMEMBERS {k}:s"));
        lines.push(format!("GET {k}:missing"));
        lines.push(format!("ZADD {k}:z 1.5 m"));
        lines.push(format!("ZSCORE {k}:z m"));
    }
    let all = keys.join(" ");
    lines.push(format!("MGET {all} nokey"));
    lines.push("DBSIZE".to_string());
    for line in &lines {
        for client in [&mut c, &mut direct] {
            let w = common::words(line);
            let args: Vec<&[u8]> = w.iter().map(Vec::as_slice).collect();
            client.send(&common::encode(&args)).await;
        }
        let p = c.read_reply().await;
        let d = direct.read_reply().await;
        assert_eq!(common::show(&p), common::show(&d), "{line}");
    }
    // A map really: the field count of the HGETALL reply.
    c.send(&common::encode(&[
        b"HGETALL",
        format!("{}:h", keys[0]).as_bytes(),
    ]))
    .await;
    assert!(c.read_reply().await.starts_with(b"%2\r\n"));
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eval_runs_on_the_slot_of_its_keys_and_refuses_keys_across_slots() {
    let mut cluster = RedisCluster::start(3, 0);
    let (proxy, mut c) = common::ready_cluster_proxy(&cluster, |_| {}).await;
    let script = "return {redis.call('INCR', KEYS[1]), redis.call('INCRBY', KEYS[2], ARGV[1])}";
    let reply = c
        .request(&[b"EVAL", script.as_bytes(), b"2", b"{e}a", b"{e}b", b"5"])
        .await;
    assert_eq!(reply, b"*2\r\n:1\r\n:5\r\n");
    let owner = cluster.master_for_slot(key_slot(b"{e}"));
    assert_eq!(sync_cmd(owner, &["GET", "{e}b"]), bulk("5"));

    // Keys in different slots: refused like Redis Cluster does, and nothing ran.
    let reply = c
        .request(&[b"EVAL", script.as_bytes(), b"2", b"ea", b"eb", b"5"])
        .await;
    assert_eq!(
        reply,
        b"-CROSSSLOT Keys in request don't hash to the same slot\r\n".to_vec()
    );
    for k in ["ea", "eb"] {
        let o = cluster.master_for_slot(key_slot(k.as_bytes()));
        assert_eq!(sync_cmd(o, &["EXISTS", k]), b":0\r\n", "{k}");
    }

    // SCRIPT LOAD reaches every master, so EVALSHA works for keys of every shard.
    let sha = c.request(&[b"SCRIPT", b"LOAD", script.as_bytes()]).await;
    let sha = String::from_utf8_lossy(&sha)
        .lines()
        .nth(1)
        .expect("sha")
        .to_string();
    for (owner, keys) in keys_per_master(&mut cluster, "sha", 1) {
        let (a, b) = (format!("{{{}}}a", keys[0]), format!("{{{}}}b", keys[0]));
        let reply = c
            .request(&[
                b"EVALSHA",
                sha.as_bytes(),
                b"2",
                a.as_bytes(),
                b.as_bytes(),
                b"2",
            ])
            .await;
        assert_eq!(reply, b"*2\r\n:1\r\n:2\r\n", "EVALSHA on :{owner}");
        assert_eq!(sync_cmd(owner, &["GET", &b]), bulk("2"));
    }
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushall_empties_every_master() {
    let mut cluster = RedisCluster::start(3, 0);
    let (proxy, mut c) = common::ready_cluster_proxy(&cluster, |_| {}).await;
    for i in 0..300 {
        let k = format!("fl:{i}");
        c.request(&[b"SET", k.as_bytes(), b"x"]).await;
    }
    let masters = cluster.master_ports();
    for &m in &masters {
        assert_ne!(sync_cmd(m, &["DBSIZE"]), b":0\r\n", "keys on :{m} before");
    }
    assert_eq!(c.cmd("DBSIZE").await, b":300\r\n");
    assert_eq!(c.cmd("FLUSHALL").await, b"+OK\r\n");
    for &m in &masters {
        assert_eq!(
            sync_cmd(m, &["DBSIZE"]),
            b":0\r\n",
            "DBSIZE on :{m} after FLUSHALL"
        );
    }
    assert_eq!(c.cmd("DBSIZE").await, b":0\r\n");
    assert_eq!(c.cmd("GET fl:0").await, b"$-1\r\n");
    proxy.stop().await;
}

/// Requests sent the moment corral listens are served once it has the slot map, not
/// refused CLUSTERDOWN: the seed is reached through a relay that delays every byte by
/// 200 ms, so the first map takes several times that to arrive.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_sent_before_the_first_slot_map_wait_for_it() {
    let cluster = RedisCluster::start(3, 0);
    let seed: std::net::SocketAddr = cluster.seeds()[0]
        .trim_start_matches("redis://")
        .parse()
        .expect("seed address");
    let relay =
        common::Relay::start_with(seed, common::Fault::Delay(Duration::from_millis(200))).await;
    let proxy = common::TestProxy::spawn_with(&relay.url(), |cfg| {
        cfg.cluster.seeds = vec![relay.url()];
        // The wait is bounded by twice this: far above the relay's delays, on a slow machine too.
        cfg.upstream.connect_timeout_ms = 5_000;
    })
    .await;
    let mut c = RawClient::connect(proxy.addr).await.expect("connect");
    let started = Instant::now();
    assert_eq!(c.cmd("SET early v").await, b"+OK\r\n");
    assert_eq!(c.cmd("GET early").await, bulk("v"));
    eprintln!("first reply after {:?}", started.elapsed());
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn randomkey_finds_the_keys_of_whichever_master_holds_them() {
    let mut cluster = RedisCluster::start(3, 0);
    let (proxy, mut c) = common::ready_cluster_proxy(&cluster, |_| {}).await;
    assert_eq!(c.cmd("RANDOMKEY").await, b"$-1\r\n", "empty cluster");
    // Every master in turn is the only one with keys.
    for (owner, keys) in keys_per_master(&mut cluster, "rk", 3) {
        for k in &keys {
            assert_eq!(c.request(&[b"SET", k.as_bytes(), b"x"]).await, b"+OK\r\n");
        }
        for &m in &cluster.master_ports() {
            let want: &[u8] = if m == owner { b":3\r\n" } else { b":0\r\n" };
            assert_eq!(sync_cmd(m, &["DBSIZE"]), want, "DBSIZE of :{m}");
        }
        for _ in 0..5 {
            let r = c.cmd("RANDOMKEY").await;
            assert!(
                keys.iter().any(|k| r == bulk(k)),
                "RANDOMKEY with keys only on :{owner}: {}",
                common::show(&r)
            );
        }
        assert_eq!(c.cmd("FLUSHALL").await, b"+OK\r\n");
    }
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_failover_is_followed_without_redirections_or_lost_writes() {
    let mut cluster = RedisCluster::start(3, 1);
    let (proxy, mut c) = common::ready_cluster_proxy(&cluster, |_| {}).await;
    let old = cluster.master_for_slot(key_slot(b"{fo}"));
    let replica = cluster.replicas_of(old)[0];
    let shards = keys_per_master(&mut cluster, "mf", 2);
    let others: Vec<String> = shards.iter().flat_map(|(_, k)| k.clone()).collect();
    // Keyspace events of a key on the shard that fails over: set on every node through
    // corral (the replica too, once the topology lists it), subscribed once.
    keyspace_events_on(&mut c, replica).await;
    let mut events = RawClient::connect(proxy.addr).await.unwrap();
    events.cmd("SUBSCRIBE __keyspace@0__:{fo}:x").await;

    // A client writing through corral before, during and after the failover.
    let done = Arc::new(AtomicBool::new(false));
    let progress = Arc::new(AtomicI64::new(0));
    let writer = {
        let (addr, done, progress) = (proxy.addr, done.clone(), progress.clone());
        tokio::spawn(async move {
            let mut w = RawClient::connect(addr).await.expect("connect");
            let (mut acks, mut after, mut bad) = (0i64, 0, Vec::new());
            for i in 0..100_000u64 {
                let r = w.request(&[b"INCR", b"{fo}:ctr"]).await;
                if r == format!(":{}\r\n", acks + 1).into_bytes() {
                    acks += 1;
                    progress.store(acks, Ordering::Relaxed);
                } else {
                    bad.push(format!("INCR {{fo}}:ctr -> {}", common::show(&r)));
                }
                let k = &others[i as usize % others.len()];
                let r = w
                    .request(&[b"SET", k.as_bytes(), i.to_string().as_bytes()])
                    .await;
                if r != b"+OK\r\n" {
                    bad.push(format!("SET {k} -> {}", common::show(&r)));
                }
                if bad.len() > 20 {
                    break;
                }
                if done.load(Ordering::Relaxed) {
                    after += 1;
                    if after >= 200 {
                        break;
                    }
                }
                if i == 99_999 {
                    bad.push("the failover never finished".into());
                }
            }
            (acks, bad)
        })
    };
    // Some writes before the failover.
    let deadline = Deadline::new(Duration::from_secs(10), "the writer to make progress")
        .every(Duration::from_millis(10));
    while progress.load(Ordering::Relaxed) < 100 {
        deadline.pause().await;
    }
    let before = progress.load(Ordering::Relaxed);
    let mut cluster = tokio::task::spawn_blocking(move || {
        cluster.failover(replica, None);
        cluster
    })
    .await
    .expect("failover");
    let at_done = progress.load(Ordering::Relaxed);
    done.store(true, Ordering::Relaxed);
    let (acks, bad) = tokio::time::timeout(Duration::from_secs(60), writer)
        .await
        .expect("writer did not finish")
        .expect("writer panicked");
    eprintln!(
        "manual failover: {before} INCRs before, {} during, {} after",
        at_done - before,
        acks - at_done
    );
    assert!(bad.is_empty(), "replies during a manual failover: {bad:?}");
    assert_eq!(
        cluster.master_for_slot(key_slot(b"{fo}")),
        replica,
        "promoted"
    );
    assert_eq!(
        sync_cmd(replica, &["GET", "{fo}:ctr"]),
        bulk(acks.to_string()),
        "acknowledged INCRs on the new master"
    );
    // Still going through the same corral, no restart.
    assert_eq!(c.cmd("SET {fo}:x 1").await, b"+OK\r\n");
    assert_eq!(sync_cmd(replica, &["GET", "{fo}:x"]), bulk("1"));
    // The new master's events reach the subscriber, once each when corral's topology has
    // settled: none then through the old master, a replica now (which publishes the writes
    // it replicates; while the topology still lists it as a master, an event may come twice).
    const EVENT: &[u8] = b"*3\r\n$7\r\nmessage\r\n$21\r\n__keyspace@0__:{fo}:x\r\n$3\r\nset\r\n";
    let deadline = Deadline::new(Duration::from_secs(10), "one event per write, 3 in a row")
        .every(Duration::from_millis(50));
    let mut in_a_row = 0;
    while in_a_row < 3 {
        assert_eq!(c.cmd("SET {fo}:x 2").await, b"+OK\r\n");
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut n = 0;
        while events.has_pending_reply() {
            assert_eq!(events.read_reply().await, EVENT);
            n += 1;
        }
        in_a_row = if n == 1 { in_a_row + 1 } else { 0 };
        if in_a_row < 3 {
            deadline.pause_seeing(format!("{n} events")).await;
        }
    }
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_a_master_is_down_requests_get_prompt_errors_not_hangs() {
    let mut cluster = RedisCluster::start(3, 0);
    let (proxy, mut c) = common::ready_cluster_proxy(&cluster, |_| {}).await;
    let shards = keys_per_master(&mut cluster, "dn", 2);
    for (_, keys) in &shards {
        for k in keys {
            assert_eq!(c.request(&[b"SET", k.as_bytes(), b"v"]).await, b"+OK\r\n");
        }
    }
    let victim = shards[0].0;
    cluster.kill_node(victim);

    // No replica to take over: the victim's keys fail at once, and the others once the
    // cluster declares itself down. Every request is answered within the client's read
    // deadline (10 s), with a value or one of the two errors.
    let mut slowest = Duration::ZERO;
    let (mut upstream_errors, mut clusterdown) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut rounds = 0;
    loop {
        for (owner, keys) in &shards {
            for k in keys {
                let started = Instant::now();
                let r = c
                    .try_request(&[b"GET", k.as_bytes()])
                    .await
                    .unwrap_or_else(|e| panic!("GET {k} while :{victim} is down: {e}"));
                slowest = slowest.max(started.elapsed());
                if r.starts_with(b"-ERR upstream") {
                    upstream_errors += 1;
                } else if r.starts_with(b"-CLUSTERDOWN") {
                    clusterdown += 1;
                } else {
                    assert_ne!(
                        *owner,
                        victim,
                        "GET {k} of the dead master: {}",
                        common::show(&r)
                    );
                    assert_eq!(r, b"$1\r\nv\r\n", "GET {k}");
                }
            }
        }
        rounds += 1;
        // Until the live masters have also said the cluster is down, and a few rounds more.
        if clusterdown > 0 && rounds >= 5 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the cluster never went down ({rounds} rounds)"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(upstream_errors + clusterdown > 0);
    eprintln!(
        "master down: {rounds} rounds, {upstream_errors} upstream errors, {clusterdown} \
         CLUSTERDOWN, slowest reply {slowest:?}"
    );
    // INFO is what an operator asks now: the live masters' text, their keys counted.
    let info = c.cmd("INFO keyspace").await;
    assert_eq!(
        reply_text(&info),
        "# Keyspace\r\ndb0:keys=4,expires=0,avg_ttl=0\r\n",
        "{}",
        show(&info)
    );
    proxy.stop().await;
}

/// CONFIG SET, RESETSTAT and REWRITE go to every node, replicas too (Redis does not replicate
/// settings, and a replica may be promoted), with one reply as from one Redis: the first
/// error if a node refused, else the first reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_reach_every_node_replicas_too() {
    let mut cluster = RedisCluster::start(3, 1);
    for m in cluster.master_ports() {
        sync_cmd(m, &["SET", "warmup", "1"]);
        sync_cmd(m, &["WAIT", "1", "2000"]);
    }
    let (proxy, mut c) = common::ready_cluster_proxy(&cluster, |cfg| {
        cfg.cluster.refresh_ms = 200;
    })
    .await;
    let nodes = cluster.nodes();
    assert_eq!(nodes.len(), 6);
    let samples = |port: u16| sync_cmd(port, &["CONFIG", "GET", "maxmemory-samples"]);
    // The slot map lists a replica once it is online: until then it is not one of corral's
    // nodes, so the setting is sent again until every node has it.
    let deadline = Deadline::new(Duration::from_secs(10), "every node to take the setting")
        .every(Duration::from_millis(100));
    loop {
        assert_eq!(c.cmd("CONFIG SET maxmemory-samples 7").await, b"+OK\r\n");
        let seen: Vec<Vec<u8>> = nodes.iter().map(|&p| samples(p)).collect();
        if seen.iter().all(|s| s.ends_with(b"$1\r\n7\r\n")) {
            break;
        }
        deadline.pause_seeing(show(&seen.concat())).await;
    }
    assert_eq!(
        c.cmd("CONFIG GET maxmemory-samples").await,
        samples(nodes[0])
    );
    // A value Redis refuses: its own error, and no node changed.
    let direct = sync_cmd(nodes[0], &["CONFIG", "SET", "maxmemory-policy", "bogus"]);
    assert!(direct.starts_with(b"-ERR"), "{}", show(&direct));
    assert_eq!(c.cmd("CONFIG SET maxmemory-policy bogus").await, direct);
    for &p in &nodes {
        assert!(samples(p).ends_with(b"$1\r\n7\r\n"), ":{p}");
    }
    // Every node's statistics reset: its count of the CONFIG SETs above.
    assert_eq!(c.cmd("CONFIG RESETSTAT").await, b"+OK\r\n");
    for &p in &nodes {
        let stats = reply_text(&sync_cmd(p, &["INFO", "commandstats"]));
        assert!(!stats.contains("cmdstat_config|set:"), ":{p}: {stats}");
    }
    // A node's own addresses and files are not set on every node.
    for (setting, param) in [
        ("port 7000", "port"),
        (
            "maxmemory-samples 5 cluster-announce-ip 10.0.0.1",
            "cluster-announce-ip",
        ),
    ] {
        let refused = format!(
            "-ERR CONFIG SET '{param}' is not supported by corral in cluster mode: each node \
             keeps its own value\r\n"
        );
        assert_eq!(
            c.cmd(&format!("CONFIG SET {setting}")).await,
            refused.into_bytes()
        );
    }
    // corral could not follow a password some nodes took and others refused.
    let refused = c
        .cmd("CONFIG SET maxmemory-samples 5 requirepass s3cret")
        .await;
    assert!(
        refused.starts_with(
            b"-ERR CONFIG SET 'requirepass' is not supported by corral in cluster mode"
        ),
        "{}",
        show(&refused)
    );
    for &p in &nodes {
        assert!(samples(p).ends_with(b"$1\r\n7\r\n"), ":{p}");
        assert_eq!(sync_cmd(p, &["PING"]), b"+PONG\r\n", ":{p}");
    }
    proxy.stop().await;
}

/// INFO's keyspace section counts the keys of every master, as DBSIZE does: what one Redis
/// holding them all would say. The other sections are one node's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn info_keyspace_counts_every_master() {
    let mut cluster = RedisCluster::start(3, 0);
    let (proxy, mut c) = common::ready_cluster_proxy(&cluster, |_| {}).await;
    for i in 0..300 {
        let k = format!("ks:{i}");
        c.request(&[b"SET", k.as_bytes(), b"x"]).await;
        if i % 3 == 0 {
            c.request(&[b"EXPIRE", k.as_bytes(), b"1000"]).await;
        }
    }
    let masters = cluster.master_ports();
    let keys_of = |port: u16| {
        let text = reply_text(&sync_cmd(port, &["INFO", "keyspace"]));
        text.lines()
            .find_map(|l| l.strip_prefix("db0:keys="))
            .and_then(|v| v.split(',').next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    assert!(
        masters.iter().all(|&m| keys_of(m) > 0),
        "keys on every master"
    );
    for line in ["INFO keyspace", "INFO", "INFO all"] {
        let text = reply_text(&c.cmd(line).await);
        let db0 = text
            .lines()
            .find(|l| l.starts_with("db0:"))
            .unwrap_or_default();
        assert!(
            db0.starts_with("db0:keys=300,expires=100,avg_ttl="),
            "{line}: {db0}"
        );
        assert_eq!(text.contains("# Proxy"), line != "INFO keyspace", "{line}");
        assert_eq!(text.contains("# Server"), line != "INFO keyspace", "{line}");
    }
    // RESP3: a verbatim string, as Redis sends INFO there.
    let mut c3 = common::client_in(proxy.addr, true).await;
    let reply = c3.cmd("INFO keyspace").await;
    let text = String::from_utf8_lossy(&reply);
    assert!(text.starts_with('='), "{text}");
    assert!(
        text.contains("txt:# Keyspace\r\ndb0:keys=300,expires=100,"),
        "{text}"
    );
    // Other sections alone go to one node, as before.
    assert!(reply_text(&c.cmd("INFO server").await).contains("redis_version:"));
    assert_eq!(c.cmd("FLUSHALL").await, b"+OK\r\n");
    assert_eq!(reply_text(&c.cmd("INFO keyspace").await), "# Keyspace\r\n");
    proxy.stop().await;
}

/// A pipeline's large reply from one master reaches the client while another master still
/// holds the reply to a later request (CLIENT PAUSE WRITE parks it): a round's replies go out
/// as they are collected, not once its last job is answered, with the cache on and off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_reply_is_written_while_a_later_master_still_holds_its_reply() {
    let mut cluster = RedisCluster::start(3, 0);
    let keys = keys_per_master(&mut cluster, "held", 1);
    let (a, b) = (&keys[0], &keys[1]);
    let (ka, (port_b, kb)) = (&a.1[0], (b.0, &b.1[0]));
    let value = vec![b'v'; 1 << 20];
    for cache in [true, false] {
        let (proxy, mut c) = common::ready_cluster_proxy(&cluster, |cfg| {
            cfg.cache.enabled = cache;
            // The paused write must not time out meanwhile.
            cfg.upstream.request_timeout_ms = 60_000;
        })
        .await;
        assert_eq!(
            c.request(&[b"SET", ka.as_bytes(), &value]).await,
            b"+OK\r\n"
        );
        assert_eq!(
            sync_cmd(port_b, &["CLIENT", "PAUSE", "60000", "WRITE"]),
            b"+OK\r\n"
        );
        let mut pipe = common::encode(&[b"GET", ka.as_bytes()]);
        pipe.extend(common::encode(&[b"SET", kb.as_bytes(), b"x"]));
        c.send(&pipe).await;
        let got = c.read_reply().await;
        let paused = c.has_pending_reply();
        assert_eq!(sync_cmd(port_b, &["CLIENT", "UNPAUSE"]), b"+OK\r\n");
        assert!(
            got == bulk(&value),
            "cache {cache}: the GET's reply ({} bytes)",
            got.len()
        );
        assert!(!paused, "cache {cache}: the SET was answered while paused");
        assert_eq!(c.read_reply().await, b"+OK\r\n", "cache {cache}: the SET");
        proxy.stop().await;
    }
}
