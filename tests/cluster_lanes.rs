//! Tracking lanes and shared connections follow the cluster topology: a master that joins
//! gets a lane, and a master that leaves the cluster leaves no lane, no connection and no
//! reconnect loop behind, even while a client that sent it requests idles.

mod common;

use std::time::Duration;

use common::{Deadline, RawClient, RedisCluster, bulk, corral_stats, reply_text, sync_cmd};
use corral::cluster::key_slot;

/// The lane lines of `CORRAL CACHE STATS`: (node, state).
async fn lanes(c: &mut RawClient) -> Vec<(String, String)> {
    let stats = corral_stats(c).await;
    let mut v: Vec<(String, String)> = stats
        .iter()
        .filter(|(k, _)| k.starts_with("cache_lane") && k[10..].parse::<u32>().is_ok())
        .map(|(_, v)| {
            let field = |name: &str| {
                v.split(',')
                    .find_map(|f| f.strip_prefix(name))
                    .unwrap_or_default()
                    .to_string()
            };
            (field("node="), field("state="))
        })
        .collect();
    v.sort();
    v
}

/// Polls the lane report until `done` holds (up to 20 s).
async fn wait_lanes(
    c: &mut RawClient,
    what: &str,
    done: impl Fn(&[(String, String)]) -> bool,
) -> Vec<(String, String)> {
    let deadline = Deadline::new(Duration::from_secs(20), what).every(Duration::from_millis(50));
    loop {
        let l = lanes(c).await;
        if done(&l) {
            return l;
        }
        deadline.pause_seeing(&l).await;
    }
}

/// Clients of the node at `port` with the tracking flag: corral's lanes.
fn tracking_clients(port: u16) -> usize {
    reply_text(&sync_cmd(port, &["CLIENT", "LIST"]))
        .lines()
        .filter(|l| l.contains("flags=t"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lanes_come_and_go_with_the_masters() {
    let mut cluster = RedisCluster::start(3, 0);
    let (proxy, mut c) = common::ready_cluster_proxy(&cluster, |cfg| {
        cfg.cluster.refresh_ms = 300;
    })
    .await;
    let node = |p: u16| format!("127.0.0.1:{p}");
    let masters: Vec<String> = cluster.master_ports().into_iter().map(node).collect();
    let all_on = |l: &[(String, String)], want: &[String]| {
        l.len() == want.len() && l.iter().all(|(n, s)| want.contains(n) && s == "on")
    };
    wait_lanes(&mut c, "a lane per master", |l| all_on(l, &masters)).await;
    assert_eq!(
        common::corral_stats(&mut c).await["cache_tracking"],
        "on",
        "every lane up"
    );

    // A new master with one (empty) slot gets a lane of its own.
    let new = cluster.add_master();
    let slot = 4242;
    let owner = cluster.master_for_slot(slot);
    cluster.move_empty_slot(slot, new);
    let mut with_new = masters.clone();
    with_new.push(node(new));
    wait_lanes(&mut c, "a lane for the new master", |l| {
        all_on(l, &with_new)
    })
    .await;
    assert_eq!(tracking_clients(new), 1, "one lane on the new master");

    // It gives the slot back and leaves the cluster, but keeps running: corral drops its
    // lane, and does not reconnect to it.
    cluster.move_empty_slot(slot, owner);
    let removed = cluster.remove_master(new);
    wait_lanes(&mut c, "the removed master's lane dropped", |l| {
        all_on(l, &masters)
    })
    .await;
    let what = "corral's lane to leave the removed node";
    let deadline = Deadline::new(Duration::from_secs(10), what).every(Duration::from_millis(50));
    while tracking_clients(removed.port) > 0 {
        deadline.pause().await;
    }
    // Long enough for a reconnect loop to show up again (backoff starts at 50 ms).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(tracking_clients(removed.port), 0, "a lane came back");
    assert!(all_on(&lanes(&mut c).await, &masters));
    let others = reply_text(&sync_cmd(removed.port, &["CLIENT", "LIST"]))
        .lines()
        .count();
    eprintln!("connections left on the removed node (incl. this CLIENT LIST): {others}");
    proxy.stop().await;
}

/// The connections the node at `port` has, but the one asking.
fn connections_but_this(port: u16) -> Vec<String> {
    reply_text(&sync_cmd(port, &["CLIENT", "LIST"]))
        .lines()
        .filter(|l| !l.contains("cmd=client|list"))
        .map(str::to_string)
        .collect()
}

/// A key of `slot`.
fn key_of(slot: u16) -> String {
    (0..1_000_000)
        .map(|i| format!("k:{i}"))
        .find(|k| key_slot(k.as_bytes()) == slot)
        .expect("a key for every slot within a million names")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_that_leaves_is_let_go_while_a_client_that_used_it_idles() {
    let mut cluster = RedisCluster::start(3, 0);
    let (proxy, mut c) = common::ready_cluster_proxy(&cluster, |cfg| {
        cfg.cluster.refresh_ms = 300;
    })
    .await;
    let masters = cluster.master_ports().len();
    let new = cluster.add_master();
    let slot = 4242;
    let owner = cluster.master_for_slot(slot);
    cluster.move_empty_slot(slot, new);
    wait_lanes(&mut c, "corral to see the new master", |l| {
        l.len() == masters + 1
    })
    .await;
    // A client whose plain requests for the slot went to the new master through its own
    // routes, then idles from here on.
    let key = key_of(slot);
    let mut idle = RawClient::connect(proxy.addr).await.expect("connect");
    // The nodes may still disagree on the slot for a moment (CLUSTERDOWN).
    let deadline = Deadline::new(Duration::from_secs(20), "the moved slot to take a write")
        .every(Duration::from_millis(50));
    loop {
        let r = idle.request(&[b"SET", key.as_bytes(), b"v"]).await;
        if r == b"+OK\r\n" {
            break;
        }
        deadline.pause_seeing(&common::show(&r)).await;
    }
    assert_eq!(idle.request(&[b"GET", key.as_bytes()]).await, bulk("v"));
    assert_eq!(
        sync_cmd(new, &["GET", &key]),
        bulk("v"),
        "written on the new master"
    );
    assert_eq!(sync_cmd(new, &["DEL", &key]), b":1\r\n");

    cluster.move_empty_slot(slot, owner);
    let removed = cluster.remove_master(new);
    wait_lanes(&mut c, "the removed master's lane dropped", |l| {
        l.len() == masters
    })
    .await;
    let what = "corral's connections to leave the removed node";
    let deadline = Deadline::new(Duration::from_secs(10), what).every(Duration::from_millis(50));
    loop {
        let left = connections_but_this(removed.port);
        if left.is_empty() {
            break;
        }
        deadline.pause_seeing(&left).await;
    }
    // Long enough for a reconnect loop to show up again (backoff starts at 50 ms).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(connections_but_this(removed.port), Vec::<String>::new());
    // The idle client goes on, on the slot's master again.
    assert_eq!(
        idle.request(&[b"SET", key.as_bytes(), b"w"]).await,
        b"+OK\r\n"
    );
    assert_eq!(idle.request(&[b"GET", key.as_bytes()]).await, bulk("w"));
    assert_eq!(
        sync_cmd(owner, &["GET", &key]),
        bulk("w"),
        "written on its master"
    );
    proxy.stop().await;
}
