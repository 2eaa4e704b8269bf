//! The cluster test harness works against a real cluster, and corral's cluster groundwork
//! (slots, topology parsing, redirections, key positions) agrees with real servers.

mod common;

use common::*;
use std::time::Duration;

use corral::cluster::{Health, Redirect, SLOTS, SlotMap, key_slot};

#[test]
fn cluster_starts_and_follows_moved() {
    let mut cluster = RedisCluster::start(3, 1);
    assert_eq!(cluster.nodes().len(), 6);
    assert_eq!(cluster.seeds().len(), 6);
    assert!(
        cluster
            .seeds()
            .iter()
            .all(|s| s.starts_with("redis://127.0.0.1:"))
    );
    assert!(cluster.all_ok());
    let masters = cluster.master_ports();
    assert_eq!(masters.len(), 3);
    for &m in &masters {
        assert_eq!(cluster.replicas_of(m).len(), 1, "replicas of {m}");
    }

    // Our slot function agrees with CLUSTER KEYSLOT.
    let port = cluster.nodes()[0];
    for key in [
        "foo",
        "bar",
        "",
        "{user1000}.following",
        "{user1000}.followers",
        "foo{}{bar}",
        "foo{{bar}}zap",
        "{bar",
        "a{b}c",
        "{}",
        "}{",
        "key:12345",
        "ünïcode",
    ] {
        let r = sync_cmd(port, &["CLUSTER", "KEYSLOT", key]);
        assert_eq!(
            r,
            int(i64::from(key_slot(key.as_bytes()))),
            "slot of {key:?}"
        );
    }

    // A raw client following one MOVED ends up on the master the harness names.
    let slot = key_slot(b"foo");
    let owner = cluster.master_for_slot(slot);
    let other = *masters.iter().find(|&&m| m != owner).unwrap();
    let moved = sync_cmd(other, &["SET", "foo", "v1"]);
    let Some(Redirect::Moved { slot: s, addr }) = Redirect::parse(&moved) else {
        panic!("expected MOVED, got {}", show(&moved));
    };
    assert_eq!((s, addr.port), (slot, owner));
    assert_eq!(addr.host, "127.0.0.1");
    assert_eq!(sync_cmd(addr.port, &["SET", "foo", "v1"]), b"+OK\r\n");
    assert_eq!(sync_cmd(owner, &["GET", "foo"]), bulk("v1"));
    // Slots of a hash tag live together.
    let tagged = cluster.master_for_slot(key_slot(b"{foo}.x"));
    assert_eq!(tagged, owner);

    // Redis 7.0 reports a replica whose replication offset is still 0 as health "loading" in
    // CLUSTER SHARDS and leaves it out of CLUSTER SLOTS, even when it is attached and synced.
    // A write to every master moves the offsets; then all three views agree.
    for &m in &masters {
        let key = (0..)
            .map(|i| format!("warm{i}"))
            .find(|k| cluster.master_for_slot(key_slot(k.as_bytes())) == m)
            .unwrap();
        assert_eq!(sync_cmd(m, &["SET", &key, "1"]), b"+OK\r\n");
    }
    block_until(Duration::from_secs(20), "replicas to be online", || {
        let map = SlotMap::from_shards_reply(&sync_cmd(port, &["CLUSTER", "SHARDS"]), "127.0.0.1")
            .unwrap();
        let online = map
            .shards()
            .iter()
            .flat_map(|s| &s.replicas)
            .filter(|n| n.health == Health::Online)
            .count();
        online == 3
    });

    // Live CLUSTER SHARDS (RESP2 and RESP3) and CLUSTER SLOTS parse to the cluster's layout.
    let mut maps = vec![
        SlotMap::from_shards_reply(&sync_cmd(port, &["CLUSTER", "SHARDS"]), "127.0.0.1").unwrap(),
        SlotMap::from_slots_reply(&sync_cmd(port, &["CLUSTER", "SLOTS"]), "127.0.0.1").unwrap(),
    ];
    {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let mut c = RawClient::connect(([127, 0, 0, 1], port).into())
                .await
                .unwrap();
            c.request(&[b"HELLO", b"3"]).await;
            let r = c.request(&[b"CLUSTER", b"SHARDS"]).await;
            assert!(r.starts_with(b"*3\r\n%"), "not RESP3 maps: {}", show(&r));
            maps.push(SlotMap::from_shards_reply(&r, "127.0.0.1").unwrap());
        });
    }
    for map in &maps {
        assert_eq!(map.covered(), SLOTS, "{map:?}");
        let mut ports: Vec<u16> = map.masters().map(|n| n.addr.port).collect();
        ports.sort_unstable();
        assert_eq!(ports, masters);
        for slot in [0, 1, slot, 5460, 5461, 8000, 10922, 10923, 16383] {
            let m = map.master(slot).unwrap().addr.port;
            assert_eq!(m, cluster.master_for_slot(slot), "slot {slot}");
            let reps: Vec<u16> = map.replicas(slot).iter().map(|n| n.addr.port).collect();
            assert_eq!(reps, cluster.replicas_of(m), "replicas for slot {slot}");
        }
    }
}

#[test]
fn failover_after_killing_a_master() {
    let mut cluster = RedisCluster::start(3, 1);
    let slot = key_slot(b"foo");
    let owner = cluster.master_for_slot(slot);
    let replica = cluster.replicas_of(owner)[0];
    cluster.kill_node(owner);
    // The replica is promoted by the cluster itself once the master is marked failed
    // (node timeout 1 s); the harness waits for that with a deadline.
    block_until(Duration::from_secs(30), "an automatic failover", || {
        cluster.master_for_slot_opt(slot) == Some(replica) && cluster.all_ok()
    });
    cluster.wait_healthy(Duration::from_secs(30));
    let live = cluster.live_nodes()[0];
    let map =
        SlotMap::from_shards_reply(&sync_cmd(live, &["CLUSTER", "SHARDS"]), "127.0.0.1").unwrap();
    assert_eq!(map.master(slot).map(|n| n.addr.port), Some(replica));
    assert!(map.masters().all(|n| n.addr.port != owner));
    assert_eq!(map.covered(), SLOTS);

    // A manual failover in another shard swaps master and replica there.
    let other = *cluster
        .master_ports()
        .iter()
        .find(|&&m| m != replica)
        .unwrap();
    let other_replica = cluster.replicas_of(other)[0];
    let other_slot = (0..SLOTS as u16)
        .find(|&s| cluster.master_for_slot_opt(s) == Some(other))
        .unwrap();
    cluster.failover(other_replica, None);
    assert_eq!(cluster.master_for_slot(other_slot), other_replica);
    assert_eq!(
        cluster.replicas_of(other_replica),
        [other],
        "{:#?}",
        RedisCluster::cluster_nodes(other_replica)
    );
}

/// Every Redis command the server reports is known to `command_keys`, with the same key
/// positions for fixed-position commands; `movablekeys` commands are checked against
/// `COMMAND GETKEYS` on sample requests. This keeps the table from drifting from Redis.
#[test]
fn key_positions_match_the_server() {
    use corral::commands::command_keys;
    use corral::commands::positions::is_movable;
    use corral::resp::Args;
    use redis_protocol::resp2::types::OwnedFrame as F;

    let server = RedisServer::start();
    let reply = sync_cmd(server.port, &["COMMAND"]);
    let Ok(Some((F::Array(commands), _))) = redis_protocol::resp2::decode::decode(&reply) else {
        panic!("COMMAND reply: {}", show(&reply));
    };
    fn text(f: &F) -> String {
        match f {
            F::BulkString(b) | F::SimpleString(b) => String::from_utf8_lossy(b).to_uppercase(),
            other => panic!("not a string: {other:?}"),
        }
    }
    fn int_of(f: &F) -> i64 {
        match f {
            F::Integer(i) => *i,
            other => panic!("not an integer: {other:?}"),
        }
    }
    // (name, first, last, step, movable) for commands and subcommands.
    let mut entries = Vec::new();
    fn walk(f: &F, out: &mut Vec<(String, i64, i64, i64, bool)>) {
        let F::Array(e) = f else {
            panic!("command entry {f:?}")
        };
        // A container (OBJECT, XINFO, CLIENT...) is checked through its subcommands.
        if let Some(F::Array(subs)) = e.get(9)
            && !subs.is_empty()
        {
            for s in subs {
                walk(s, out);
            }
            return;
        }
        let movable =
            matches!(&e[2], F::Array(flags) if flags.iter().any(|fl| text(fl) == "MOVABLEKEYS"));
        out.push((
            text(&e[0]),
            int_of(&e[3]),
            int_of(&e[4]),
            int_of(&e[5]),
            movable,
        ));
        if let Some(F::Array(subs)) = e.get(9) {
            for s in subs {
                walk(s, out);
            }
        }
    }
    for c in &commands {
        walk(c, &mut entries);
    }
    assert!(entries.len() > 200, "only {} commands", entries.len());

    let mut checked = 0;
    for (name, first, last, step, movable) in &entries {
        let (top, sub) = match name.split_once('|') {
            Some((t, s)) => (t.to_string(), Some(s.to_string())),
            None => (name.clone(), None),
        };
        if *movable {
            assert!(
                is_movable(top.as_bytes()),
                "{name} has movable keys but no special case"
            );
            continue;
        }
        // A synthetic request long enough for any fixed-position command.
        let mut words: Vec<Vec<u8>> = vec![top.clone().into_bytes()];
        if let Some(s) = &sub {
            words.push(s.clone().into_bytes());
        }
        while words.len() < 9 {
            words.push(format!("a{}", words.len()).into_bytes());
        }
        let n = words.len() as i64;
        let args = Args::Owned(&words);
        let pos = command_keys(top.as_bytes(), &args);
        assert!(pos.is_known(), "{name} is unknown to command_keys");
        let ours: Vec<usize> = pos.indices().collect();
        let want: Vec<usize> = if *first == 0 {
            Vec::new()
        } else {
            let last = if *last < 0 { n + last } else { *last };
            (*first..=last)
                .step_by(*step as usize)
                .map(|i| i as usize)
                .collect()
        };
        assert_eq!(
            ours, want,
            "key positions of {name} ({first}, {last}, {step})"
        );
        checked += 1;
    }
    assert!(checked > 200, "checked only {checked}");

    // Movable and tricky commands against the server's own key extraction. (SPUBLISH and
    // SSUBSCRIBE are left out: GETKEYS says their shard channel is not a key, but it routes
    // by slot all the same, which is why `command_keys` reports it.)
    for line in [
        "EVAL s 2 a b x",
        "EVAL s 0 x",
        "EVAL s 3 a b",
        "EVALSHA sha 1 k x",
        "EVAL_RO s 1 k",
        "FCALL f 2 a b",
        "FCALL_RO f 1 a x",
        "ZUNIONSTORE d 2 a b WEIGHTS 1 2",
        "ZINTERSTORE d 1 a",
        "ZDIFFSTORE d 2 a b",
        "ZUNION 2 a b",
        "ZINTER 1 a WITHSCORES",
        "ZDIFF 2 a b",
        "ZINTERCARD 2 a b LIMIT 3",
        "SINTERCARD 3 a b c",
        "LMPOP 2 a b LEFT",
        "ZMPOP 1 z MIN",
        "BLMPOP 0 2 a b RIGHT",
        "BZMPOP 1 2 a b MAX COUNT 3",
        "ZUNIONSTORE d 5 a",
        "XREAD STREAMS a b 0 0",
        "XREAD COUNT 1 BLOCK 10 STREAMS s $",
        "XREADGROUP GROUP streams streams NOACK STREAMS s >",
        "XREADGROUP GROUP g c STREAMS a b > >",
        "XREAD STREAMS a b 0",
        "SORT l",
        "SORT l BY w_* GET o_* LIMIT 0 5 STORE d",
        "SORT l GET store ALPHA",
        "SORT l STORE a STORE b",
        "SORT_RO l BY x GET y",
        "GEORADIUS g 0 0 1 km",
        "GEORADIUS g 0 0 1 km STORE d",
        "GEORADIUS g 0 0 1 km STORE a STOREDIST b",
        "GEORADIUSBYMEMBER g m 1 km STOREDIST d",
        "GEORADIUS g 0 0 1 km STOREDIST b STORE a",
        "GEORADIUSBYMEMBER g m 1 km STORE a STOREDIST b",
        "MIGRATE h 6379 k 0 1000",
        "MIGRATE h 6379 k 0 1000 COPY REPLACE",
        "MIGRATE h 6379 \"\" 0 1000 AUTH pw KEYS a b",
        "MIGRATE h 6379 \"\" 0 1000 AUTH2 keys keys KEYS a",
        "MIGRATE h 6379 k 0 1000 KEYS a",
        "BLPOP a b 0",
        "MSET a 1 b 2",
        "BITOP AND d a b",
        "OBJECT ENCODING k",
        "XINFO CONSUMERS s g",
        "MEMORY USAGE k",
        "XGROUP CREATE s g $",
        "LMOVE a b LEFT RIGHT",
        "GET k",
        "DEL a b c",
    ] {
        let words: Vec<Vec<u8>> = line
            .split(' ')
            .map(|w| {
                if w == "\"\"" {
                    Vec::new()
                } else {
                    w.as_bytes().to_vec()
                }
            })
            .collect();
        let mut req: Vec<&str> = vec!["COMMAND", "GETKEYS"];
        let strs: Vec<String> = words
            .iter()
            .map(|w| String::from_utf8(w.clone()).unwrap())
            .collect();
        req.extend(strs.iter().map(String::as_str));
        let r = sync_cmd(server.port, &req);
        let want: Vec<String> = match redis_protocol::resp2::decode::decode(&r) {
            Ok(Some((F::Array(keys), _))) => keys
                .iter()
                .map(|k| match k {
                    F::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
                    other => panic!("{other:?}"),
                })
                .collect(),
            // No keys, or arguments Redis rejects.
            Ok(Some((F::Error(_), _))) => Vec::new(),
            other => panic!("COMMAND GETKEYS {line}: {other:?}"),
        };
        let args = Args::Owned(&words);
        let ours: Vec<String> = command_keys(&words[0].to_ascii_uppercase(), &args)
            .keys(&args)
            .map(|k| String::from_utf8_lossy(k).into_owned())
            .collect();
        assert_eq!(ours, want, "keys of {line:?}");
    }
}
