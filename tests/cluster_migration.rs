//! Slot migration through corral: a slot moves from one master to another with the real
//! protocol (SETSLOT IMPORTING/MIGRATING, GETKEYSINSLOT + MIGRATE in batches, SETSLOT NODE)
//! while clients keep reading and writing its keys through corral. Clients never see a
//! redirection (corral follows ASK during the move and MOVED after it), no acknowledged write
//! is lost, and the keys end on the new owner.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::{RawClient, RedisCluster, SlotMigration, block_until, bulk, show, sync_cmd};
use corral::cluster::key_slot;

fn is_redirection(reply: &[u8]) -> bool {
    [&b"-MOVED"[..], b"-ASK", b"-TRYAGAIN", b"-CLUSTERDOWN"]
        .iter()
        .any(|p| reply.starts_with(p))
}

/// Waits (bounded) until every master agrees that `port` owns `slot`.
fn wait_owner(cluster: &mut RedisCluster, masters: &[u16], slot: u16, port: u16) {
    let what = format!("masters to agree that {port} owns slot {slot}");
    block_until(Duration::from_secs(20), &what, || {
        let agreed = masters.iter().all(|&m| {
            RedisCluster::cluster_nodes(m)
                .iter()
                .find(|n| n.slots.iter().any(|&(a, b)| (a..=b).contains(&slot)))
                .is_some_and(|n| n.port == port)
        });
        agreed && cluster.all_ok()
    });
}

const TASKS: usize = 8;
const PRELOADED: usize = 200;
/// Keys each client task writes (and rewrites) in the migrating slot.
const OWN_KEYS: usize = 40;
/// Iterations each task still runs once the slot has its new owner (so corral must follow
/// MOVED and learn the new map while clients keep going).
const AFTER: u64 = 100;

/// What one client task saw.
#[derive(Default)]
struct Seen {
    /// INCRs of the task's own counter that were acknowledged.
    own_acks: i64,
    /// INCRs of the shared counter that were acknowledged.
    shared_acks: i64,
    /// Last acknowledged value of each of the task's keys.
    last: HashMap<String, String>,
    /// Unexpected replies: (request, reply).
    bad: Vec<(String, String)>,
    /// Replies that were redirections.
    redirections: usize,
    iterations: u64,
}

async fn client_task(
    addr: std::net::SocketAddr,
    t: usize,
    ops: Arc<AtomicU64>,
    done: Arc<AtomicBool>,
    stop: Arc<AtomicBool>,
) -> Seen {
    let mut c = RawClient::connect(addr).await.expect("connect to corral");
    let mut seen = Seen::default();
    let counter = format!("{{mig}}:ctr:{t}");
    let mut after = 0;
    let mut i: u64 = 0;
    let check = |seen: &mut Seen, what: String, got: Vec<u8>, want: &[u8]| {
        if is_redirection(&got) {
            seen.redirections += 1;
        }
        if got != want && seen.bad.len() < 20 {
            seen.bad
                .push((what, String::from_utf8_lossy(&got).into_owned()));
        }
        got == want
    };
    // Bounded: the migration finishes (or the test fails) long before this.
    while i < 200_000 && !stop.load(Ordering::Relaxed) {
        let key = format!("{{mig}}:t{t}:k{}", i % OWN_KEYS as u64);
        let value = format!("t{t}-{i}");
        let r = c.request(&[b"SET", key.as_bytes(), value.as_bytes()]).await;
        if check(&mut seen, format!("SET {key} {value}"), r, b"+OK\r\n") {
            seen.last.insert(key.clone(), value.clone());
        }
        let r = c.request(&[b"GET", key.as_bytes()]).await;
        check(&mut seen, format!("GET {key}"), r, &bulk(&value));

        let j = (i as usize * 7 + t * 13) % PRELOADED;
        let pre = format!("{{mig}}:pre:{j}");
        let r = c.request(&[b"GET", pre.as_bytes()]).await;
        check(&mut seen, format!("GET {pre}"), r, &bulk(format!("pre{j}")));

        let want = format!(":{}\r\n", seen.own_acks + 1).into_bytes();
        let r = c.request(&[b"INCR", counter.as_bytes()]).await;
        if r.starts_with(b":") {
            // Acknowledged, whatever the value (a wrong value is reported by `check`).
            seen.own_acks += 1;
        }
        check(&mut seen, format!("INCR {counter}"), r, &want);

        let r = c.request(&[b"INCR", b"{mig}:shared"]).await;
        if r.starts_with(b":") {
            seen.shared_acks += 1;
        } else {
            // Never equal to an error reply: recorded as unexpected.
            check(&mut seen, "INCR {mig}:shared".into(), r, b":<n>\r\n");
        }

        ops.fetch_add(1, Ordering::Relaxed);
        i += 1;
        if done.load(Ordering::Relaxed) {
            after += 1;
            if after >= AFTER {
                break;
            }
        }
    }
    seen.iterations = i;
    seen
}

/// Waits (bounded) until the clients have done `more` more iterations in all, so every
/// migration step is taken while requests are in flight.
fn wait_ops(ops: &AtomicU64, more: u64) {
    let target = ops.load(Ordering::Relaxed) + more;
    let deadline = Instant::now() + Duration::from_secs(20);
    while ops.load(Ordering::Relaxed) < target {
        assert!(Instant::now() < deadline, "clients stopped making progress");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slot_migrated_under_load_loses_no_write_and_clients_see_no_redirection() {
    let mut cluster = RedisCluster::start(3, 0);
    let proxy = common::cluster_proxy(&cluster, |_| {}).await;
    let mut c = RawClient::connect(proxy.addr).await.unwrap();
    common::wait_cluster_ready(&mut c).await;

    let slot = key_slot(b"{mig}");
    let masters = cluster.master_ports();
    let src = cluster.master_for_slot(slot);
    let dst = *masters.iter().find(|&&p| p != src).expect("another master");

    for j in 0..PRELOADED {
        let (k, v) = (format!("{{mig}}:pre:{j}"), format!("pre{j}"));
        assert_eq!(
            c.request(&[b"SET", k.as_bytes(), v.as_bytes()]).await,
            b"+OK\r\n"
        );
    }
    assert_eq!(
        sync_cmd(src, &["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()]),
        format!(":{PRELOADED}\r\n").into_bytes(),
        "the preloaded keys are on the source"
    );

    let ops = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            tokio::spawn(client_task(
                proxy.addr,
                t,
                ops.clone(),
                done.clone(),
                stop.clone(),
            ))
        })
        .collect();

    // The migration, in a blocking thread, paced by the clients' progress.
    let migration = {
        let (ops, done) = (ops.clone(), done.clone());
        let masters = masters.clone();
        tokio::task::spawn_blocking(move || {
            wait_ops(&ops, 200);
            let m = SlotMigration::begin(slot, src, dst);
            wait_ops(&ops, 50);
            let deadline = Instant::now() + Duration::from_secs(30);
            let mut batches = 0;
            loop {
                let keys = m.keys_left(10);
                if keys.is_empty() {
                    break;
                }
                m.migrate(&keys);
                batches += 1;
                assert!(Instant::now() < deadline, "migration did not finish");
                wait_ops(&ops, 16);
            }
            wait_ops(&ops, 50);
            m.finish(&masters);
            done.store(true, Ordering::Relaxed);
            (m, batches)
        })
    };
    let joined = tokio::time::timeout(Duration::from_secs(60), migration).await;
    // Whatever happened, the client tasks must end.
    stop.store(
        joined.as_ref().map(|r| r.is_err()).unwrap_or(true),
        Ordering::Relaxed,
    );
    let mut seen = Vec::new();
    for t in tasks {
        seen.push(
            tokio::time::timeout(Duration::from_secs(60), t)
                .await
                .expect("client task did not end")
                .expect("client task panicked"),
        );
    }
    let (m, batches) = joined
        .expect("migration did not finish in 60 s")
        .expect("migration failed");
    eprintln!(
        "migrated slot {slot} from :{src} to :{dst} in {batches} MIGRATE batches; \
         {} client iterations",
        seen.iter().map(|s| s.iterations).sum::<u64>()
    );
    wait_owner(&mut cluster, &masters, slot, dst);

    // No client saw a redirection or any other unexpected reply.
    let redirections: usize = seen.iter().map(|s| s.redirections).sum();
    let bad: Vec<_> = seen.iter().flat_map(|s| s.bad.iter()).collect();
    assert_eq!(redirections, 0, "redirections reached clients: {bad:?}");
    assert!(bad.is_empty(), "unexpected replies: {bad:?}");
    for (t, s) in seen.iter().enumerate() {
        assert!(
            s.iterations >= AFTER,
            "task {t} ran only {} times",
            s.iterations
        );
    }

    // Every acknowledged write is on the new owner; nothing is left on the old one.
    for (t, s) in seen.iter().enumerate() {
        let counter = format!("{{mig}}:ctr:{t}");
        assert_eq!(
            sync_cmd(dst, &["GET", &counter]),
            bulk(s.own_acks.to_string()),
            "{counter}: acknowledged INCRs"
        );
        for (k, v) in &s.last {
            assert_eq!(sync_cmd(dst, &["GET", k]), bulk(v), "{k} on the new owner");
        }
    }
    let shared: i64 = seen.iter().map(|s| s.shared_acks).sum();
    assert_eq!(
        sync_cmd(dst, &["GET", "{mig}:shared"]),
        bulk(shared.to_string()),
        "shared counter: acknowledged INCRs of all clients"
    );
    for j in 0..PRELOADED {
        let k = format!("{{mig}}:pre:{j}");
        assert_eq!(sync_cmd(dst, &["GET", &k]), bulk(format!("pre{j}")), "{k}");
    }
    let expected = (PRELOADED + TASKS * OWN_KEYS + TASKS + 1) as i64;
    assert_eq!(
        m.count_on(dst),
        expected,
        "keys of the slot on the new owner"
    );
    assert_eq!(m.count_on(src), 0, "keys of the slot left on the old owner");

    // corral keeps serving the slot from its new owner.
    assert_eq!(c.cmd("GET {mig}:pre:0").await, bulk("pre0"));
    assert_eq!(c.cmd("SET {mig}:after x").await, b"+OK\r\n");
    assert_eq!(sync_cmd(dst, &["GET", "{mig}:after"]), bulk("x"));
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn during_a_migration_corral_follows_ask_for_moved_and_new_keys() {
    let mut cluster = RedisCluster::start(3, 0);
    let proxy = common::cluster_proxy(&cluster, |_| {}).await;
    let mut c = RawClient::connect(proxy.addr).await.unwrap();
    common::wait_cluster_ready(&mut c).await;

    let slot = key_slot(b"{ask}");
    let masters = cluster.master_ports();
    let src = cluster.master_for_slot(slot);
    let dst = *masters.iter().find(|&&p| p != src).expect("another master");
    for j in 0..20 {
        let line = format!("SET {{ask}}:{j} v{j}");
        assert_eq!(c.cmd(&line).await, b"+OK\r\n", "{line}");
    }
    assert_eq!(c.cmd("SET {ask}:n 10").await, b"+OK\r\n");

    let m = SlotMigration::begin(slot, src, dst);
    let moved: Vec<String> = (0..10).map(|j| format!("{{ask}}:{j}")).collect();
    m.migrate(&moved);
    m.migrate(&["{ask}:n".to_string()]);
    assert_eq!(m.count_on(dst), 11);
    assert_eq!(m.count_on(src), 10);
    // A plain client of the source is redirected for a moved key: the window is open.
    let direct = sync_cmd(src, &["GET", "{ask}:0"]);
    assert!(direct.starts_with(b"-ASK "), "{}", show(&direct));

    // Through corral: moved and not-yet-moved keys alike, no redirection.
    for j in 0..20 {
        let line = format!("GET {{ask}}:{j}");
        assert_eq!(c.cmd(&line).await, bulk(format!("v{j}")), "{line}");
    }
    // Writes to a moved key and to a new key go to the importing node (after ASKING).
    assert_eq!(c.cmd("INCR {ask}:n").await, b":11\r\n");
    assert_eq!(c.cmd("SET {ask}:new fresh").await, b"+OK\r\n");
    assert_eq!(c.cmd("GET {ask}:new").await, bulk("fresh"));
    assert_eq!(
        m.count_on(dst),
        12,
        "the new key was created on the importing node"
    );
    assert_eq!(c.cmd("DEL {ask}:1").await, b":1\r\n");
    assert_eq!(c.cmd("EXISTS {ask}:1").await, b":0\r\n");
    // A split MGET whose part for the migrating slot is answered with ASK.
    assert_eq!(
        show(&c.cmd("MGET {ask}:0 other:key").await),
        show(b"*2\r\n$2\r\nv0\r\n$-1\r\n")
    );
    // The same through a pipeline: a batch whose replies mix ASK and plain ones.
    let mut pipe = Vec::new();
    for j in 2..20 {
        pipe.extend(common::encode(&[b"GET", format!("{{ask}}:{j}").as_bytes()]));
    }
    let replies = c.pipeline(&pipe, 1 << 16, 18).await;
    for (j, r) in (2..20).zip(&replies) {
        assert_eq!(r, &bulk(format!("v{j}")), "pipelined GET {{ask}}:{j}");
    }

    // The rest of the move; then MOVED is followed as well.
    let rest = m.keys_left(100);
    m.migrate(&rest);
    m.finish(&masters);
    wait_owner(&mut cluster, &masters, slot, dst);
    for j in 2..20 {
        let line = format!("GET {{ask}}:{j}");
        assert_eq!(c.cmd(&line).await, bulk(format!("v{j}")), "{line}");
        let k = format!("{{ask}}:{j}");
        assert_eq!(
            sync_cmd(dst, &["GET", &k]),
            bulk(format!("v{j}")),
            "{k} on dst"
        );
    }
    assert_eq!(sync_cmd(dst, &["GET", "{ask}:n"]), bulk("11"));
    assert_eq!(sync_cmd(dst, &["GET", "{ask}:new"]), bulk("fresh"));
    assert_eq!(m.count_on(src), 0);
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_key_reads_of_a_slot_split_by_a_migration_are_answered() {
    let mut cluster = RedisCluster::start(3, 0);
    let proxy = common::cluster_proxy(&cluster, |_| {}).await;
    let mut c = RawClient::connect(proxy.addr).await.unwrap();
    common::wait_cluster_ready(&mut c).await;
    let slot = key_slot(b"{split}");
    let masters = cluster.master_ports();
    let src = cluster.master_for_slot(slot);
    let dst = *masters.iter().find(|&&p| p != src).expect("another master");
    assert_eq!(c.cmd("MSET {split}:a 1 {split}:b 2").await, b"+OK\r\n");
    let m = SlotMigration::begin(slot, src, dst);
    m.migrate(&["{split}:a".to_string()]);
    // Redis itself answers -TRYAGAIN here (one key on each node); corral already splits these
    // commands by slot without atomicity, so it can split them by key and follow ASK for each.
    assert_eq!(
        show(&c.cmd("MGET {split}:a {split}:b").await),
        show(b"*2\r\n$1\r\n1\r\n$1\r\n2\r\n")
    );
    assert_eq!(c.cmd("EXISTS {split}:a {split}:b").await, b":2\r\n");
    m.migrate(&["{split}:b".to_string()]);
    m.finish(&masters);
    proxy.stop().await;
}

/// A batch whose replies stream (large ones, reaching the client while Redis still holds a
/// later one: CLIENT PAUSE WRITE parks the batch's SET on the source) and whose later replies
/// are ASK redirections: the parts before go out at once, the redirections are followed, and
/// the client sees every reply in order and none of them a redirection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_batch_follows_redirections_after_its_first_parts() {
    let mut cluster = RedisCluster::start(3, 0);
    let proxy = common::cluster_proxy(&cluster, |cfg| {
        // GETs ride in the client's batch (with the cache on they are reads of its own).
        cfg.cache.enabled = false;
        cfg.upstream.request_timeout_ms = 60_000;
    })
    .await;
    let mut c = RawClient::connect(proxy.addr).await.unwrap();
    common::wait_cluster_ready(&mut c).await;

    let slot = key_slot(b"{big}");
    let masters = cluster.master_ports();
    let src = cluster.master_for_slot(slot);
    let dst = *masters.iter().find(|&&p| p != src).expect("another master");
    let value = |i: u8| vec![b'a' + i; 1 << 20];
    for i in 0..2u8 {
        let key = format!("{{big}}:{i}");
        let r = c.request(&[b"SET", key.as_bytes(), &value(i)]).await;
        assert_eq!(r, b"+OK\r\n");
    }
    for line in ["SET {big}:moved old", "SET {big}:2 two"] {
        assert_eq!(c.cmd(line).await, b"+OK\r\n", "{line}");
    }
    let m = SlotMigration::begin(slot, src, dst);
    m.migrate(&["{big}:moved".to_string()]);
    assert!(sync_cmd(src, &["GET", "{big}:moved"]).starts_with(b"-ASK "));

    assert_eq!(
        sync_cmd(src, &["CLIENT", "PAUSE", "60000", "WRITE"]),
        b"+OK\r\n"
    );
    let mut pipe = Vec::new();
    for line in [
        "GET {big}:0",
        "GET {big}:1",
        "SET {big}:2 held",
        "GET {big}:moved",
        "SET {big}:moved new",
        "GET {big}:2",
    ] {
        let w: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
        pipe.extend(common::encode(&w));
    }
    c.send(&pipe).await;
    let first = c.read_replies(2).await;
    let paused = c.has_pending_reply();
    assert_eq!(sync_cmd(src, &["CLIENT", "UNPAUSE"]), b"+OK\r\n");
    for (i, got) in first.iter().enumerate() {
        let want = bulk(value(i as u8));
        assert!(got == &want, "GET {{big}}:{i} ({} bytes)", got.len());
    }
    assert!(!paused, "the held SET was answered while paused");
    let rest = c.read_replies(4).await;
    let want: [&[u8]; 4] = [b"+OK\r\n", &bulk("old"), b"+OK\r\n", &bulk("held")];
    for (got, want) in rest.iter().zip(want) {
        assert_eq!(show(got), show(want));
    }
    assert_eq!(
        m.count_on(dst),
        1,
        "the moved key stayed on the importing node"
    );
    assert_eq!(c.cmd("GET {big}:moved").await, bulk("new"));
    assert_eq!(sync_cmd(src, &["GET", "{big}:2"]), bulk("held"));
    proxy.stop().await;
}

/// A pipeline over every master goes as one batch per node, each run of requests taking
/// its replies from its node's batch in request order. A redirection inside a run (ASK for
/// a migrated key) is followed for its request alone, and a write redirected so is read
/// back, from where it went, by the GETs after it. With the cache on, keys read in every
/// round (one per master) are hits riding between the forwarded requests of the runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_gathered_per_master_follows_redirections_inside_its_runs() {
    let mut cluster = RedisCluster::start(3, 0);
    let masters = cluster.master_ports();
    let mut keys = Vec::new();
    for &m in &masters {
        let key = (0..)
            .map(|i| format!("gathered:{i}"))
            .find(|k| cluster.master_for_slot(key_slot(k.as_bytes())) == m)
            .unwrap_or_default();
        keys.push(key);
    }
    let slot = key_slot(b"{mv}");
    let src = cluster.master_for_slot(slot);
    let dst = *masters.iter().find(|&&p| p != src).expect("another master");
    assert_eq!(sync_cmd(src, &["SET", "{mv}:a", "start"]), b"+OK\r\n");
    let m = SlotMigration::begin(slot, src, dst);
    m.migrate(&["{mv}:a".to_string()]);
    assert!(sync_cmd(src, &["GET", "{mv}:a"]).starts_with(b"-ASK "));

    // Read in every round, never written: cached once hot.
    let mut hot = Vec::new();
    for &m in &masters {
        let key = (0..)
            .map(|i| format!("hot:{i}"))
            .find(|k| cluster.master_for_slot(key_slot(k.as_bytes())) == m)
            .unwrap_or_default();
        assert_eq!(sync_cmd(m, &["SET", &key, &key]), b"+OK\r\n");
        hot.push(key);
    }
    for cache in [false, true] {
        let proxy = common::cluster_proxy(&cluster, |cfg| {
            cfg.cache.enabled = cache;
            cfg.cache.hot_threshold = 2;
        })
        .await;
        let mut c = RawClient::connect(proxy.addr).await.unwrap();
        common::wait_cluster_ready(&mut c).await;
        if cache {
            for key in &hot {
                common::make_cached_within(&mut c, key, &bulk(key), 100).await;
            }
        }
        let hits_before = if cache {
            common::stat_n(&mut c, "cache_hits").await
        } else {
            0
        };
        // The migrated key's value, as the last round (or the first proxy's) left it.
        let mut before = if cache { "false:3" } else { "start" }.to_string();
        for round in 0..4 {
            let mut pipe = Vec::new();
            let mut want: Vec<Vec<u8>> = Vec::new();
            let mut n = 0usize;
            let mut line = |l: String, reply: Vec<u8>| {
                let w: Vec<&[u8]> = l.split(' ').map(str::as_bytes).collect();
                pipe.extend(common::encode(&w));
                want.push(reply);
                // A hot key's GET after each request, each master's in turn.
                let h = &hot[n % hot.len()];
                pipe.extend(common::encode(&[b"GET", h.as_bytes()]));
                want.push(bulk(h));
                n += 1;
            };
            let value = |i: usize| format!("{cache}:{round}:{i}");
            for (i, k) in keys.iter().enumerate() {
                line(format!("SET {k} {}", value(i)), b"+OK\r\n".to_vec());
            }
            line("GET {mv}:a".into(), bulk(&before));
            for (i, k) in keys.iter().enumerate().rev() {
                line(format!("GET {k}"), bulk(value(i)));
            }
            let now = format!("{cache}:{round}");
            line(format!("SET {{mv}}:a {now}"), b"+OK\r\n".to_vec());
            line("GET {mv}:a".into(), bulk(&now));
            for (i, k) in keys.iter().enumerate() {
                line(format!("GET {k}"), bulk(value(i)));
                line("GET {mv}:a".into(), bulk(&now));
            }
            c.send(&pipe).await;
            let got = c.read_replies(want.len()).await;
            for (n, (got, want)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    show(got),
                    show(want),
                    "cache {cache}, round {round}, reply {n}"
                );
            }
            before = now;
        }
        assert_eq!(
            m.count_on(dst),
            1,
            "the moved key stayed on the importing node"
        );
        if cache {
            let hits = common::stat_n(&mut c, "cache_hits").await - hits_before;
            assert!(hits >= 40, "hot keys served from the cache: {hits}");
        }
        proxy.stop().await;
    }
}

/// A request corral adds to a node's batch without its slot (CLIENT CACHING without
/// tracking goes to Redis as it is) leaves the batch's list of retriable requests short: a
/// redirection later in that batch is then passed on, as on Redis, and never retried as
/// another request (it read the next key's value for it). The pipeline's last GET, for
/// another master, makes the batch one of a round gathered per node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redirection_after_a_request_without_a_slot_is_never_retried_as_another() {
    let mut cluster = RedisCluster::start(3, 0);
    let (proxy, mut c) = common::ready_cluster_proxy(&cluster, |cfg| {
        // The map is not refreshed while the test runs: the moved slot stays unknown.
        cfg.cluster.refresh_ms = 600_000;
        cfg.cache.enabled = false;
    })
    .await;
    let masters = cluster.master_ports();
    let (x, y, z) = (masters[0], masters[1], masters[2]);
    let mut on_x: Vec<String> = Vec::new();
    let mut on_y = String::new();
    for i in 0.. {
        let k = format!("slotless:{i}");
        let slot = key_slot(k.as_bytes());
        let owner = cluster.master_for_slot(slot);
        if owner == x && on_x.len() < 3 && on_x.iter().all(|o| key_slot(o.as_bytes()) != slot) {
            on_x.push(k);
        } else if owner == y && on_y.is_empty() {
            on_y = k;
        }
        if on_x.len() == 3 && !on_y.is_empty() {
            break;
        }
    }
    let (a, b, other) = (&on_x[0], &on_x[1], &on_x[2]);
    assert_eq!(c.cmd(&format!("SET {other} value")).await, b"+OK\r\n");
    // b's slot, empty, moves to another master behind corral's back.
    cluster.move_empty_slot(key_slot(b.as_bytes()), z);
    let mut pipe = Vec::new();
    for line in [
        format!("SET {a} 1"),
        "CLIENT CACHING yes".to_string(),
        format!("GET {b}"),
        format!("GET {other}"),
        format!("GET {on_y}"),
    ] {
        let w: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
        pipe.extend(common::encode(&w));
    }
    c.send(&pipe).await;
    let got = c.read_replies(5).await;
    assert_eq!(got[0], b"+OK\r\n");
    assert!(
        got[2] == b"$-1\r\n" || got[2].starts_with(b"-MOVED"),
        "GET {b}: {}",
        show(&got[2])
    );
    assert_eq!(got[3], bulk("value"), "GET {other}");
    assert_eq!(got[4], b"$-1\r\n", "GET {on_y}");
    proxy.stop().await;
}
