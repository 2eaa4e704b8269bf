//! The local cache in cluster mode: hot keys are read through the tracking connection of
//! their master and stay coherent with writes made directly on the cluster, across a
//! failover and a slot migration.

mod common;

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{
    Deadline, RawClient, RedisCluster, TestProxy, bulk, counter, encode, make_cached_within,
    reply_text, show, stat_n, sync_cmd,
};
use corral::cluster::key_slot;
use tokio::task::JoinSet;

async fn ready_proxy(cluster: &RedisCluster) -> (TestProxy, RawClient) {
    common::ready_cluster_proxy(cluster, |cfg| {
        cfg.cluster.refresh_ms = 300;
        cfg.cache.hot_threshold = 2;
    })
    .await
}

/// GETs `key` until it returns `want` (bounded); afterwards it must keep returning it.
async fn becomes(c: &mut RawClient, key: &str, want: &str) {
    let deadline = Deadline::new(Duration::from_secs(15), format!("{key} to become {want}"));
    loop {
        let got = c.cmd(&format!("GET {key}")).await;
        if got == bulk(want) {
            break;
        }
        deadline.pause_seeing(show(&got)).await;
    }
    for i in 0..200 {
        let start = Instant::now();
        assert_eq!(
            c.cmd(&format!("GET {key}")).await,
            bulk(want),
            "{key} went back"
        );
        note_if_slow(
            start.elapsed(),
            &format!("GET {key} #{i} after it became {want}"),
        );
    }
}

/// Writes a GET that took long to stderr past the test harness's capture, so that a run
/// which slows down but passes (or is killed) still shows which reads were slow. Nothing
/// here is a timing assertion: a slow GET is reported, not failed.
fn note_if_slow(took: Duration, what: &str) {
    if took >= Duration::from_millis(500) {
        let _ = writeln!(std::io::stderr(), "slow: {what} took {took:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_keys_are_cached_and_direct_writes_invalidate_them() {
    let mut cluster = RedisCluster::start(3, 0);
    let (proxy, mut c) = ready_proxy(&cluster).await;
    for i in 0..6 {
        let key = format!("hot:{i}");
        assert_eq!(c.cmd(&format!("SET {key} a")).await, b"+OK\r\n");
        make_cached_within(&mut c, &key, &bulk("a"), 100).await;
        // A write made directly on the key's master reaches corral as an invalidation.
        let owner = cluster.master_for_slot(key_slot(key.as_bytes()));
        assert_eq!(sync_cmd(owner, &["SET", &key, "b"]), b"+OK\r\n");
        becomes(&mut c, &key, "b").await;
        // And a write through corral is read back at once.
        assert_eq!(c.cmd(&format!("SET {key} c")).await, b"+OK\r\n");
        assert_eq!(c.cmd(&format!("GET {key}")).await, bulk("c"));
    }
    proxy.stop().await;
}

/// Hot keys served from the cache are touched on their own masters (`touch_ms`): to each
/// master its keys stay recently used (`OBJECT IDLETIME` at a second or less after 3 s of
/// GETs answered locally, where untouched they would count the 3 s since their fill).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_keys_served_locally_are_touched_on_their_masters() {
    let mut cluster = RedisCluster::start(3, 0);
    let (proxy, mut c) = ready_proxy(&cluster).await;
    // One key on each master.
    let mut keys: Vec<(String, u16)> = Vec::new();
    for i in 0.. {
        let key = format!("touched:{i}");
        let owner = cluster.master_for_slot(key_slot(key.as_bytes()));
        if keys.iter().all(|(_, o)| *o != owner) {
            keys.push((key, owner));
        }
        if keys.len() == 3 {
            break;
        }
    }
    for (key, _) in &keys {
        cached_on_master(&mut cluster, &mut c, key, "v").await;
    }
    let get: Vec<u8> = keys
        .iter()
        .flat_map(|(k, _)| encode(&[b"GET", k.as_bytes()]))
        .collect();
    let get = get.repeat(20);
    let read_for = async |c: &mut RawClient, d: Duration| {
        let until = Instant::now() + d;
        while Instant::now() < until {
            for reply in c.pipeline(&get, 60, 60).await {
                assert_eq!(reply, bulk("v"));
            }
        }
    };
    // A second first, for the slot map's first refresh (a new map flushes the cache).
    read_for(&mut c, Duration::from_secs(1)).await;
    let fills = stat_n(&mut c, "cache_fills").await;
    read_for(&mut c, Duration::from_secs(3)).await;
    let stats = common::corral_stats(&mut c).await;
    assert_eq!(
        stats.get("cache_fills").map(String::as_str),
        Some(fills.to_string().as_str()),
        "a key was filled again: {stats:?}"
    );
    assert!(stat_n(&mut c, "cache_touches").await >= 3);
    for (key, owner) in &keys {
        let idle = sync_cmd(*owner, &["OBJECT", "IDLETIME", key]);
        assert!(
            idle == b":0\r\n" || idle == b":1\r\n",
            "{key} on {owner}: idle {}",
            show(&idle)
        );
    }
    proxy.stop().await;
}

/// With the read barrier, a GET through corral right after a direct write on the key's
/// master reads the new value: the round waits for a PING on every master's lane.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_read_barrier_covers_every_masters_lane() {
    let mut cluster = RedisCluster::start(3, 0);
    let (proxy, mut c) = common::ready_cluster_proxy(&cluster, |cfg| {
        cfg.cache.hot_threshold = 2;
        cfg.cache.read_barrier = true;
    })
    .await;
    let mut stale = 0;
    for i in 0..60 {
        let key = format!("rb:{i}");
        let owner = cluster.master_for_slot(key_slot(key.as_bytes()));
        assert_eq!(sync_cmd(owner, &["SET", &key, "old"]), b"+OK\r\n");
        make_cached_within(&mut c, &key, &bulk("old"), 100).await;
        assert_eq!(sync_cmd(owner, &["SET", &key, "new"]), b"+OK\r\n");
        stale += usize::from(c.cmd(&format!("GET {key}")).await != bulk("new"));
    }
    assert_eq!(stale, 0, "stale reads right after a direct write");
    proxy.stop().await;
}

/// A GET of a key just turned hot waits on a read over its master's tracking connection; a
/// SET of the key right after it, in the same pipelined write, must not reach Redis first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_is_not_overtaken_by_a_set_after_it() {
    let mut cluster = RedisCluster::start(3, 0);
    let (proxy, mut c) = ready_proxy(&cluster).await;
    for i in 0..20 {
        let key = format!("gw:{i}");
        let owner = cluster.master_for_slot(key_slot(key.as_bytes()));
        assert_eq!(sync_cmd(owner, &["SET", &key, "old"]), b"+OK\r\n");
        let get = encode(&[b"GET", key.as_bytes()]);
        let warm = get.repeat(10);
        c.pipeline(&warm, warm.len(), 10).await;
        let mut req = get.clone();
        req.extend(encode(&[b"SET", key.as_bytes(), b"new"]));
        let got = c.pipeline(&req, req.len(), 2).await;
        assert_eq!(
            show(&got[0]),
            show(&bulk("old")),
            "{key}: the GET read the SET after it"
        );
        assert_eq!(show(&got[1]), show(b"+OK\r\n"), "{key}");
    }
    proxy.stop().await;
}

/// A blocking command that writes (BLMOVE) invalidates its keys when it is sent and holds
/// them until it returns, as a write in a batch does: no entry of them is served while it
/// blocks, and the GET after its reply reads what it wrote, not what the cache held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_write_invalidates_its_keys_when_sent() {
    let mut cluster = RedisCluster::start(3, 0);
    let (proxy, mut c) = ready_proxy(&cluster).await;
    let mut mover = common::connect(proxy.addr).await;
    let owner = cluster.master_for_slot(key_slot(b"{bl}src"));
    make_cached_within(&mut c, "{bl}dst", b"$-1\r\n", 100).await;
    let local = stat_n(&mut c, "cache_local_invalidations").await;
    mover
        .send(&encode(&[
            b"BLMOVE", b"{bl}src", b"{bl}dst", b"LEFT", b"LEFT", b"0",
        ]))
        .await;
    let deadline = Deadline::new(Duration::from_secs(10), "BLMOVE to block on Redis");
    while !show(&sync_cmd(owner, &["INFO", "clients"])).contains("blocked_clients:1") {
        deadline.pause().await;
    }
    assert!(stat_n(&mut c, "cache_local_invalidations").await > local);
    let hits = stat_n(&mut c, "cache_hits").await;
    for _ in 0..10 {
        assert_eq!(c.cmd("GET {bl}dst").await, b"$-1\r\n");
    }
    assert_eq!(
        stat_n(&mut c, "cache_hits").await,
        hits,
        "served while held"
    );
    assert_eq!(sync_cmd(owner, &["RPUSH", "{bl}src", "x"]), b":1\r\n");
    assert_eq!(mover.read_reply().await, bulk("x"));
    let got = c.cmd("GET {bl}dst").await;
    assert!(show(&got).contains("WRONGTYPE"), "{}", show(&got));
    proxy.stop().await;
}

/// A key served by another master than `key`'s.
fn key_on_another_master(cluster: &mut RedisCluster, key: &str) -> String {
    let owner = cluster.master_for_slot(key_slot(key.as_bytes()));
    (0..)
        .map(|i| format!("other:{i}"))
        .find(|k| cluster.master_for_slot(key_slot(k.as_bytes())) != owner)
        .unwrap_or_default()
}

/// Sets `key` to `value` on its master and GETs it through `c` until it is a cache hit;
/// returns the master's port.
async fn cached_on_master(
    cluster: &mut RedisCluster,
    c: &mut RawClient,
    key: &str,
    value: &str,
) -> u16 {
    let owner = cluster.master_for_slot(key_slot(key.as_bytes()));
    assert_eq!(sync_cmd(owner, &["SET", key, value]), b"+OK\r\n");
    make_cached_within(c, key, &bulk(value), 100).await;
    owner
}

/// A write pipelined behind one for another master goes in a batch of its own, and its key
/// stays held until that batch is acknowledged, not until the first one is: while its master
/// has not run it (paused), the key's fills, which read the old value, are not cached.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_for_another_master_is_held_until_its_own_batch_is_answered() {
    let mut cluster = RedisCluster::start(3, 0);
    let (proxy, mut c) = ready_proxy(&cluster).await;
    // RESP3: shared upstream connections are per protocol, so c's GETs below never queue
    // behind the writer's paused SET on one of them.
    let mut writer = common::connect(proxy.addr).await;
    assert!(writer.cmd("HELLO 3").await.starts_with(b"%"));
    let key = "held:b";
    let first = key_on_another_master(&mut cluster, key);
    let owner = cached_on_master(&mut cluster, &mut c, key, "old").await;
    // Bounded: if a GET below were queued behind the paused write, it would wait this long.
    assert_eq!(
        sync_cmd(owner, &["CLIENT", "PAUSE", "8000", "WRITE"]),
        b"+OK\r\n"
    );
    let mut both = encode(&[b"SET", first.as_bytes(), b"1"]);
    both.extend(encode(&[b"SET", key.as_bytes(), b"new"]));
    writer.send(&both).await;
    // Its replies are written together, once both came: the first write's run is seen on
    // its master instead.
    let first_owner = cluster.master_for_slot(key_slot(first.as_bytes()));
    let deadline = Deadline::new(Duration::from_secs(5), "both SETs to reach Redis");
    while sync_cmd(first_owner, &["GET", &first]) != bulk("1")
        || !show(&sync_cmd(owner, &["INFO", "clients"])).contains("blocked_clients:1")
    {
        deadline.pause().await;
    }
    let hits = stat_n(&mut c, "cache_hits").await;
    for _ in 0..10 {
        assert_eq!(c.cmd(&format!("GET {key}")).await, bulk("old"));
    }
    assert_eq!(
        stat_n(&mut c, "cache_hits").await,
        hits,
        "cached while held"
    );
    assert_eq!(sync_cmd(owner, &["CLIENT", "UNPAUSE"]), b"+OK\r\n");
    assert_eq!(writer.read_reply().await, b"+OK\r\n", "SET {first}");
    assert_eq!(writer.read_reply().await, b"+OK\r\n", "SET {key}");
    assert_eq!(c.cmd(&format!("GET {key}")).await, bulk("new"));
    proxy.stop().await;
}

/// A write corral refuses itself (CROSSSLOT) was never sent: it holds nothing afterwards,
/// and its keys are cached again while its client idles.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_refused_by_corral_leaves_no_hold_behind() {
    let mut cluster = RedisCluster::start(3, 0);
    let (proxy, mut c) = ready_proxy(&cluster).await;
    let mut idle = common::connect(proxy.addr).await;
    let key = "refused:a";
    let other = key_on_another_master(&mut cluster, key);
    let owner = cluster.master_for_slot(key_slot(key.as_bytes()));
    assert_eq!(sync_cmd(owner, &["SET", key, "v"]), b"+OK\r\n");
    let got = idle.cmd(&format!("RENAME {key} {other}")).await;
    assert!(show(&got).contains("CROSSSLOT"), "{}", show(&got));
    make_cached_within(&mut c, key, &bulk("v"), 100).await;
    proxy.stop().await;
}

/// MULTI waits for its first command to know its node: that command's writes are
/// invalidated and held at EXEC, as those queued after it are.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_write_of_a_transaction_is_invalidated_at_exec() {
    let mut cluster = RedisCluster::start(3, 0);
    let (proxy, mut c) = ready_proxy(&cluster).await;
    let mut tx = common::connect(proxy.addr).await;
    let key = "tx:first";
    cached_on_master(&mut cluster, &mut c, key, "v1").await;
    let local = stat_n(&mut c, "cache_local_invalidations").await;
    assert_eq!(tx.cmd("MULTI").await, b"+OK\r\n");
    assert_eq!(tx.cmd(&format!("SET {key} v2")).await, b"+QUEUED\r\n");
    assert_eq!(tx.cmd("EXEC").await, b"*1\r\n+OK\r\n");
    assert!(stat_n(&mut c, "cache_local_invalidations").await > local);
    assert_eq!(c.cmd(&format!("GET {key}")).await, bulk("v2"));
    proxy.stop().await;
}

/// A client pinned by WATCH has its requests for other nodes routed as usual; their writes
/// invalidate their keys when sent, as any client's do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watching_clients_write_to_another_node_is_invalidated_when_sent() {
    let mut cluster = RedisCluster::start(3, 0);
    let (proxy, mut c) = ready_proxy(&cluster).await;
    let mut w = common::connect(proxy.addr).await;
    let key = "watched:other";
    let watched = key_on_another_master(&mut cluster, key);
    cached_on_master(&mut cluster, &mut c, key, "v1").await;
    let local = stat_n(&mut c, "cache_local_invalidations").await;
    assert_eq!(w.cmd(&format!("WATCH {watched}")).await, b"+OK\r\n");
    assert_eq!(w.cmd(&format!("SET {key} v2")).await, b"+OK\r\n");
    assert!(stat_n(&mut c, "cache_local_invalidations").await > local);
    assert_eq!(c.cmd(&format!("GET {key}")).await, bulk("v2"));
    assert_eq!(w.cmd("UNWATCH").await, b"+OK\r\n");
    proxy.stop().await;
}

/// FLUSHALL names no key: sent to every master, it still flushes the cache and holds every
/// key until answered, so a GET pipelined behind it reads what it left, not the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_sent_to_every_master_empties_the_cache_when_sent() {
    let mut cluster = RedisCluster::start(3, 0);
    let (proxy, mut c) = ready_proxy(&cluster).await;
    let key = "flushed:k";
    cached_on_master(&mut cluster, &mut c, key, "v1").await;
    let mut both = encode(&[b"FLUSHALL"]);
    both.extend(encode(&[b"GET", key.as_bytes()]));
    let got = c.pipeline(&both, both.len(), 2).await;
    assert_eq!(
        [show(&got[0]), show(&got[1])],
        [show(b"+OK\r\n"), show(b"$-1\r\n")]
    );
    proxy.stop().await;
}

/// Counters on two masters, incremented by one client in pipelines that span both (so each
/// INCR after the first goes in a batch of its own) and now and then in a transaction, read
/// by others pipelined: no client's reads of a key go back, and the writer reads each key
/// at least at the value its acknowledged INCR returned. A load over the cluster's holds;
/// the tests above check each hold where it can be seen (with the holds of a write for
/// another master undone, this one still passed in 3 runs: the race is narrow).
///
/// Both counters are cached, and hit, before the load starts: once writes come, how many
/// reads the cache serves depends on timing (from 0 to over 1,000 hits from run to run:
/// keys written this often are soon shut out, `churn.rs`), and a load it never served would
/// prove nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_never_go_back_behind_writes_spanning_masters() {
    let mut cluster = RedisCluster::start(3, 0);
    let (proxy, mut w) = ready_proxy(&cluster).await;
    let keys = [
        "mono:a".to_string(),
        key_on_another_master(&mut cluster, "mono:a"),
    ];
    for key in &keys {
        assert_eq!(w.cmd(&format!("INCR {key}")).await, b":1\r\n");
        make_cached_within(&mut w, key, &bulk("1"), 100).await;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let mut readers = JoinSet::new();
    for depth in [1usize, 16] {
        let (addr, stop, keys) = (proxy.addr, stop.clone(), keys.clone());
        readers.spawn(async move {
            let mut c = common::connect(addr).await;
            let mut seen = [0i64; 2];
            let mut back = Vec::new();
            let mut round = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let order: Vec<usize> = (0..depth).map(|i| (round + i) % 2).collect();
                let bytes: Vec<u8> = order
                    .iter()
                    .flat_map(|&k| encode(&[b"GET", keys[k].as_bytes()]))
                    .collect();
                let replies = c.pipeline(&bytes, bytes.len(), depth).await;
                for (&k, r) in order.iter().zip(&replies) {
                    let v = counter(r);
                    if v < seen[k] {
                        back.push(format!(
                            "round {round}: {} read {v} after {}",
                            keys[k], seen[k]
                        ));
                    }
                    seen[k] = seen[k].max(v);
                }
                round += 1;
            }
            (depth, round, back)
        });
    }
    let mut failures = Vec::new();
    for i in 0..1500 {
        let (first, second) = if i % 2 == 0 { (0, 1) } else { (1, 0) };
        let mut req = encode(&[b"INCR", keys[first].as_bytes()]);
        req.extend(encode(&[b"INCR", keys[second].as_bytes()]));
        req.extend(encode(&[b"GET", keys[first].as_bytes()]));
        req.extend(encode(&[b"GET", keys[second].as_bytes()]));
        let got = w.pipeline(&req, req.len(), 4).await;
        let incr = |r: &[u8]| -> i64 {
            let t = String::from_utf8_lossy(r);
            t.trim_start_matches(':')
                .trim_end()
                .parse()
                .unwrap_or_else(|_| panic!("INCR: {t:?}"))
        };
        let (a, b) = (incr(&got[0]), incr(&got[1]));
        let (ra, rb) = (counter(&got[2]), counter(&got[3]));
        if ra < a || rb < b {
            failures.push(format!("pipeline {i}: INCR {a}, {b} then GET {ra}, {rb}"));
        }
        if i % 5 == 4 {
            assert_eq!(w.cmd("MULTI").await, b"+OK\r\n");
            let q = w.cmd(&format!("INCR {}", keys[first])).await;
            assert_eq!(q, b"+QUEUED\r\n");
            let r = w.cmd("EXEC").await;
            assert!(r.starts_with(b"*1\r\n:"), "EXEC: {}", show(&r));
            let v = incr(&r[4..]);
            let after = counter(&w.cmd(&format!("GET {}", keys[first])).await);
            if after < v {
                failures.push(format!("transaction {i}: INCR {v} then GET {after}"));
            }
        }
    }
    stop.store(true, Ordering::Relaxed);
    failures.extend(common::reads_gone_back(&mut readers).await);
    assert!(failures.is_empty(), "reads went back: {failures:#?}");
    eprintln!("{} hits in all", stat_n(&mut w, "cache_hits").await);
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_stays_coherent_across_a_failover() {
    let mut cluster = RedisCluster::start(3, 1);
    let (proxy, mut c) = ready_proxy(&cluster).await;
    let key = "fo:hot";
    assert_eq!(c.cmd(&format!("SET {key} old")).await, b"+OK\r\n");
    let master = cluster.master_for_slot(key_slot(key.as_bytes()));
    sync_cmd(master, &["WAIT", "1", "2000"]);
    make_cached_within(&mut c, key, &bulk("old"), 100).await;
    let replica = cluster.replicas_of(master)[0];
    cluster.kill_node(master);
    // Wait until the replica took over, then write the new value directly on it.
    let every = Duration::from_millis(100);
    let deadline = Deadline::new(Duration::from_secs(30), "the replica's promotion").every(every);
    while !sync_cmd(replica, &["ROLE"]).starts_with(b"*3\r\n$6\r\nmaster") {
        deadline.pause().await;
    }
    let what = "the promoted replica to accept writes";
    let deadline = Deadline::new(Duration::from_secs(30), what).every(every);
    while sync_cmd(replica, &["SET", key, "new"]) != b"+OK\r\n" {
        deadline.pause().await;
    }
    becomes(&mut c, key, "new").await;
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cache_stays_coherent_across_a_slot_migration() {
    let mut cluster = RedisCluster::start(3, 0);
    let (proxy, mut c) = ready_proxy(&cluster).await;
    // A missing key, cached as nil: moving its (empty) slot deletes nothing on the source, so
    // the source sends no invalidation; only corral's view of the topology can save it.
    let key = "mig:absent";
    let slot = key_slot(key.as_bytes());
    let mut cached = false;
    for _ in 0..100 {
        let before = stat_n(&mut c, "cache_hits").await;
        assert_eq!(c.cmd(&format!("GET {key}")).await, b"$-1\r\n");
        if stat_n(&mut c, "cache_hits").await > before {
            cached = true;
            break;
        }
    }
    assert!(cached, "the missing key was never served from the cache");
    let src = cluster.master_for_slot(slot);
    let masters = cluster.master_ports();
    let dst = *masters.iter().find(|&&p| p != src).unwrap();
    let id = |p: u16| reply_text(&sync_cmd(p, &["CLUSTER", "MYID"]));
    let (src_id, dst_id, s) = (id(src), id(dst), slot.to_string());
    assert_eq!(
        sync_cmd(dst, &["CLUSTER", "SETSLOT", &s, "IMPORTING", &src_id]),
        b"+OK\r\n"
    );
    assert_eq!(
        sync_cmd(src, &["CLUSTER", "SETSLOT", &s, "MIGRATING", &dst_id]),
        b"+OK\r\n"
    );
    let others = masters.iter().copied().filter(|&p| p != src && p != dst);
    for p in [dst, src].into_iter().chain(others) {
        assert_eq!(
            sync_cmd(p, &["CLUSTER", "SETSLOT", &s, "NODE", &dst_id]),
            b"+OK\r\n"
        );
    }
    // The new owner never told corral it tracks this key: a direct write there must still be
    // seen, once corral learnt of the move (a topology change flushes the cache).
    assert_eq!(sync_cmd(dst, &["SET", key, "new"]), b"+OK\r\n");
    becomes(&mut c, key, "new").await;
    // And it is cached again, now through the new owner's tracking connection.
    make_cached_within(&mut c, key, &bulk("new"), 100).await;
    assert_eq!(sync_cmd(dst, &["SET", key, "newer"]), b"+OK\r\n");
    becomes(&mut c, key, "newer").await;
    proxy.stop().await;
}

/// GETs of `key` from every client at once, all sent while the key's master is paused
/// (`CLIENT PAUSE 1000 ALL`, issued here; below `request_timeout_ms`): the clients back,
/// each with its reply.
async fn herd(clients: Vec<RawClient>, master: u16, key: &str) -> Vec<(RawClient, Vec<u8>)> {
    assert_eq!(
        sync_cmd(master, &["CLIENT", "PAUSE", "1000", "ALL"]),
        b"+OK\r\n"
    );
    let mut tasks = JoinSet::new();
    for mut c in clients {
        let line = format!("GET {key}");
        tasks.spawn(async move {
            let got = c.cmd(&line).await;
            (c, got)
        });
    }
    let mut out = Vec::new();
    while let Some(r) = tasks.join_next().await {
        out.push(r.expect("GET task"));
    }
    out
}

/// A stampede in cluster mode: GETs of one key from 50 clients while its master is paused
/// reach that master as one read (the first GET leads it in its batch, the others join it).
/// Then a stampede on a key whose slot is migrating and which has moved: the read corral
/// sends the source is answered ASK; the client whose GET led it gets the value through the
/// redirection, and those that joined it read the key themselves: every client gets the
/// value, none a redirection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stampede_reaches_the_master_once_and_follows_a_moved_key() {
    let mut cluster = RedisCluster::start(3, 0);
    let (proxy, _c) = ready_proxy(&cluster).await;
    let slot = key_slot(b"{herd}");
    let masters = cluster.master_ports();
    let src = cluster.master_for_slot(slot);
    let dst = *masters.iter().find(|&&p| p != src).expect("another master");
    assert_eq!(sync_cmd(src, &["SET", "{herd}:still", "here"]), b"+OK\r\n");
    assert_eq!(sync_cmd(src, &["SET", "{herd}:moved", "there"]), b"+OK\r\n");
    let mut clients = Vec::new();
    for _ in 0..50 {
        clients.push(RawClient::connect(proxy.addr).await.expect("connect"));
    }

    assert_eq!(sync_cmd(src, &["CONFIG", "RESETSTAT"]), b"+OK\r\n");
    let replies = herd(clients, src, "{herd}:still").await;
    let mut direct = RawClient::connect(([127, 0, 0, 1], src).into())
        .await
        .expect("src");
    let calls = common::redis_get_calls(&mut direct).await;
    assert!(
        (1..=2).contains(&calls),
        "50 GETs of one key reached its master as {calls} GETs"
    );
    let mut clients = Vec::new();
    for (c, got) in replies {
        assert_eq!(show(&got), show(&bulk("here")));
        clients.push(c);
    }

    let m = common::SlotMigration::begin(slot, src, dst);
    m.migrate(&["{herd}:moved".to_string()]);
    assert!(sync_cmd(src, &["GET", "{herd}:moved"]).starts_with(b"-ASK "));
    for (_, got) in herd(clients, src, "{herd}:moved").await {
        assert_eq!(show(&got), show(&bulk("there")));
    }
    let rest = m.keys_left(100);
    m.migrate(&rest);
    m.finish(&masters);
    proxy.stop().await;
}
