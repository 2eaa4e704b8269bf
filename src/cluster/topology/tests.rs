//! Parsing tests on replies captured from a real Redis 7.0.15 cluster (3 masters, 3 replicas on
//! ports 17001-17006): healthy, with hostnames announced, after a master was killed and its
//! replica promoted, and with some slots deleted (a partially covered cluster).

use super::*;
use crate::cluster::key_slot;

const M1: &str = "f167e1cef3bd097f65ae2fd47c26447118a9eee5"; // 17001, slots 0-5460
const M2: &str = "386806abf18c27cc55595bc263906fa2dad346bd"; // 17002, slots 5461-10922
const M3: &str = "da2f98350e1c65e8ff37704a000d848ed538fde7"; // 17003, slots 10923-16383
const R3: &str = "2b445ad29b4b174e9f354e4ce5d7f340d8bcc302"; // 17004, replica of 17003

fn fixture(name: &str) -> &'static [u8] {
    match name {
        "shards_resp2" => include_bytes!("../testdata/shards_resp2.resp"),
        "shards_resp3" => include_bytes!("../testdata/shards_resp3.resp"),
        "slots_resp2" => include_bytes!("../testdata/slots_resp2.resp"),
        "slots_resp3" => include_bytes!("../testdata/slots_resp3.resp"),
        "shards_hostname_resp2" => include_bytes!("../testdata/shards_hostname_resp2.resp"),
        "slots_hostname_resp3" => include_bytes!("../testdata/slots_hostname_resp3.resp"),
        "shards_failover_resp2" => include_bytes!("../testdata/shards_failover_resp2.resp"),
        "shards_partial_resp2" => include_bytes!("../testdata/shards_partial_resp2.resp"),
        "shards_partial_resp3" => include_bytes!("../testdata/shards_partial_resp3.resp"),
        "slots_partial_resp2" => include_bytes!("../testdata/slots_partial_resp2.resp"),
        _ => panic!("no fixture {name}"),
    }
}

fn shards(name: &str) -> SlotMap {
    SlotMap::from_shards_reply(fixture(name), "origin").unwrap()
}

fn slots(name: &str) -> SlotMap {
    SlotMap::from_slots_reply(fixture(name), "origin").unwrap()
}

fn port(node: Option<&Node>) -> Option<u16> {
    node.map(|n| n.addr.port)
}

/// Every slot has the same master and replicas in both maps (shard order may differ).
fn assert_same_routing(a: &SlotMap, b: &SlotMap) {
    for slot in 0..SLOTS as u16 {
        assert_eq!(a.master(slot), b.master(slot), "slot {slot}");
        assert_eq!(a.replicas(slot), b.replicas(slot), "slot {slot}");
    }
}

fn assert_healthy(map: &SlotMap) {
    assert_eq!(map.covered(), SLOTS);
    assert_eq!(map.shards().len(), 3);
    for (slot, master, replica) in [
        (0, 17001, 17005),
        (5460, 17001, 17005),
        (5461, 17002, 17006),
        (10922, 17002, 17006),
        (10923, 17003, 17004),
        (16383, 17003, 17004),
    ] {
        assert_eq!(port(map.master(slot)), Some(master), "slot {slot}");
        let reps: Vec<u16> = map.replicas(slot).iter().map(|n| n.addr.port).collect();
        assert_eq!(reps, [replica], "slot {slot}");
    }
    assert_eq!(
        map.master(key_slot(b"foo")).map(|n| n.addr.to_string()),
        Some("127.0.0.1:17003".into())
    );
    let mut masters: Vec<&str> = map.masters().map(|n| n.id.as_str()).collect();
    masters.sort_unstable();
    let mut want = [M1, M2, M3];
    want.sort_unstable();
    assert_eq!(masters, want);
}

#[test]
fn healthy_cluster_from_every_reply_shape() {
    for name in ["shards_resp2", "shards_resp3"] {
        let map = shards(name);
        assert_healthy(&map);
        assert!(
            map.masters()
                .all(|n| n.health == Health::Online && n.addr.host == "127.0.0.1")
        );
    }
    for name in ["slots_resp2", "slots_resp3"] {
        assert_healthy(&slots(name));
    }
    // Both commands describe the same cluster identically.
    assert_same_routing(&shards("shards_resp2"), &slots("slots_resp2"));
    assert_same_routing(&shards("shards_resp3"), &shards("shards_resp2"));
}

#[test]
fn endpoint_is_preferred_over_ip() {
    // The node was set to `cluster-preferred-endpoint-type hostname`: `endpoint` is the
    // hostname, and CLUSTER SLOTS moves the IP into its metadata map.
    let map = shards("shards_hostname_resp2");
    assert_eq!(
        map.master(0).map(|n| n.addr.to_string()),
        Some("node-17001.corral.test:17001".into())
    );
    assert_eq!(
        map.replicas(6000).first().map(|n| n.addr.to_string()),
        Some("node-17006.corral.test:17006".into())
    );
    let map = slots("slots_hostname_resp3");
    assert_eq!(
        map.master(16000).map(|n| n.addr.host.as_str()),
        Some("node-17003.corral.test")
    );
    assert_eq!(map.covered(), SLOTS);
}

#[test]
fn failed_master_is_skipped_after_failover() {
    // 17003 was killed; its replica 17004 took over. SHARDS still lists 17003, as a master
    // with no slots and health "fail".
    let map = shards("shards_failover_resp2");
    assert_eq!(map.covered(), SLOTS);
    assert_eq!(map.master(12000).map(|n| n.id.as_str()), Some(R3));
    assert!(map.replicas(12000).is_empty());
    assert!(
        map.masters().all(|n| n.id != M3),
        "failed master kept: {map:?}"
    );
    assert_eq!(map.shards().len(), 3);
}

#[test]
fn partially_covered_cluster_leaves_slots_unowned() {
    // `CLUSTER DELSLOTSRANGE 0 99` and `DELSLOTS 200` on 17001 (its replies are then
    // CLUSTERDOWN), plus the failover above.
    let maps = [
        shards("shards_partial_resp2"),
        shards("shards_partial_resp3"),
        slots("slots_partial_resp2"),
    ];
    for map in &maps {
        assert_eq!(map.covered(), SLOTS - 101);
        for slot in (0..100).chain([200]) {
            assert!(map.master(slot).is_none(), "slot {slot} has an owner");
            assert!(map.replicas(slot).is_empty());
            assert!(map.shard(slot).is_none());
        }
        for slot in [100, 199, 201, 5460] {
            assert_eq!(
                map.master(slot).map(|n| n.id.as_str()),
                Some(M1),
                "slot {slot}"
            );
        }
        assert_eq!(map.master(12000).map(|n| n.id.as_str()), Some(R3));
    }
    // The two SLOTS ranges of 17001 make one shard.
    assert_eq!(maps[2].shards().len(), 3);
    assert_same_routing(&maps[0], &maps[2]);
}

#[test]
fn error_replies_and_garbage_are_errors() {
    assert_eq!(
        SlotMap::from_shards_reply(b"-ERR unknown subcommand 'SHARDS'\r\n", "h"),
        Err(TopologyError::ErrorReply(
            "ERR unknown subcommand 'SHARDS'".into()
        ))
    );
    assert!(matches!(
        SlotMap::from_slots_reply(b"*1\r\n*3\r\n:0\r\n", "h"),
        Err(TopologyError::Decode(_))
    ));
    assert!(matches!(
        SlotMap::from_slots_reply(b"+OK\r\n", "h"),
        Err(TopologyError::Shape(_))
    ));
    // Slot numbers out of range, reversed ranges, ports out of range.
    for bad in [
        &b"*1\r\n*3\r\n:0\r\n:16384\r\n*2\r\n$1\r\na\r\n:1\r\n"[..],
        b"*1\r\n*3\r\n:5\r\n:4\r\n*2\r\n$1\r\na\r\n:1\r\n",
        b"*1\r\n*3\r\n:-1\r\n:4\r\n*2\r\n$1\r\na\r\n:1\r\n",
        b"*1\r\n*3\r\n:0\r\n:4\r\n*2\r\n$1\r\na\r\n:65536\r\n",
        b"*1\r\n*2\r\n:0\r\n:4\r\n",
    ] {
        assert!(
            matches!(
                SlotMap::from_slots_reply(bad, "h"),
                Err(TopologyError::Shape(_))
            ),
            "{:?}",
            String::from_utf8_lossy(bad)
        );
    }
    // A cut-short capture fails rather than yielding a partial map.
    let whole = fixture("shards_resp2");
    assert!(SlotMap::from_shards_reply(&whole[..whole.len() - 3], "h").is_err());
}

#[test]
fn old_style_slots_and_unknown_endpoints() {
    // Redis 3 sends [ip, port] only; an unknown endpoint is `?` (or null) and means the host
    // the command was sent to.
    let reply =
        b"*2\r\n*4\r\n:0\r\n:8191\r\n*2\r\n$8\r\n10.0.0.1\r\n:7000\r\n*2\r\n$1\r\n?\r\n:7001\r\n\
                  *3\r\n:8192\r\n:16383\r\n*2\r\n$-1\r\n:7002\r\n";
    let map = SlotMap::from_slots_reply(reply, "seed.example").unwrap();
    assert_eq!(map.covered(), SLOTS);
    assert_eq!(
        map.master(0).map(|n| n.addr.to_string()),
        Some("10.0.0.1:7000".into())
    );
    assert_eq!(
        map.replicas(0).first().map(|n| n.addr.to_string()),
        Some("seed.example:7001".into())
    );
    assert_eq!(
        map.master(9000).map(|n| n.addr.to_string()),
        Some("seed.example:7002".into())
    );
    assert!(map.master(9000).is_some_and(|n| n.id.is_empty()));
}

#[test]
fn moved_updates_the_map() {
    let mut map = shards("shards_resp2");
    let slot = key_slot(b"foo");
    // To a known master: the slot joins its shard.
    map.apply_moved(slot, &Addr::new("127.0.0.1", 17001));
    assert_eq!(map.master(slot).map(|n| n.id.as_str()), Some(M1));
    assert_eq!(map.replicas(slot).len(), 1);
    assert_eq!(map.master(slot + 1).map(|n| n.id.as_str()), Some(M3));
    // To an unknown node: a new shard with just that master.
    map.apply_moved(0, &Addr::new("10.1.1.1", 7000));
    assert_eq!(
        map.master(0).map(|n| n.addr.to_string()),
        Some("10.1.1.1:7000".into())
    );
    assert!(map.replicas(0).is_empty());
    assert_eq!(map.shards().len(), 4);
    // Out-of-range slots are ignored.
    map.apply_moved(16384, &Addr::new("10.1.1.1", 7000));
    assert_eq!(map.covered(), SLOTS);
    let _ = M2;
}

#[test]
fn empty_map_serves_nothing() {
    let map = SlotMap::new();
    assert_eq!(map.covered(), 0);
    assert!(map.master(0).is_none());
    assert!(map.replicas(16383).is_empty());
    assert_eq!(map.masters().count(), 0);
}
