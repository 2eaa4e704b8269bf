//! Tracking lanes follow the cluster topology: a master that joins gets a lane, and a master
//! that leaves the cluster leaves no lane (and no reconnect loop) behind.

mod common;

use std::time::Duration;

use common::{Deadline, RawClient, RedisCluster, corral_stats, reply_text, sync_cmd};

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
