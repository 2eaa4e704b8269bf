//! One cluster node's view and moves: `CLUSTER NODES` lines, its id, and a slot migrating
//! between two nodes.

use super::client::sync_cmd;
use super::resp::{int_of, reply_text, show};

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone)]
pub struct NodeLine {
    pub id: String,
    pub port: u16,
    pub flags: Vec<String>,
    /// Master id for replicas, "-" for masters.
    pub master_id: String,
    pub connected: bool,
    /// Slot ranges served (inclusive), masters only; migration markers are left out.
    pub slots: Vec<(u16, u16)>,
}

impl NodeLine {
    pub fn is_master(&self) -> bool {
        self.flags.iter().any(|f| f == "master")
    }
    pub fn is_replica(&self) -> bool {
        self.flags.iter().any(|f| f == "slave")
    }
    /// Flagged failing, half-known, or still being introduced.
    pub fn is_troubled(&self) -> bool {
        self.flags
            .iter()
            .any(|f| matches!(f.as_str(), "fail" | "fail?" | "handshake" | "noaddr"))
    }
}

/// Parses `CLUSTER NODES` text (`id ip:port@bus[,hostname] flags master ping pong epoch link
/// slot...`).
pub fn parse_cluster_nodes(text: &str) -> Vec<NodeLine> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert!(f.len() >= 8, "bad CLUSTER NODES line {l:?}");
            let addr = f[1].split(['@', ',']).next().unwrap_or("");
            let port = addr
                .rsplit(':')
                .next()
                .and_then(|p| p.parse().ok())
                .unwrap_or(0);
            let slots = f[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .map(|s| match s.split_once('-') {
                    Some((a, b)) => (a.parse().unwrap(), b.parse().unwrap()),
                    None => (s.parse().unwrap(), s.parse().unwrap()),
                })
                .collect();
            NodeLine {
                id: f[0].to_string(),
                port,
                flags: f[2].split(',').map(str::to_string).collect(),
                master_id: f[3].to_string(),
                connected: f[7] == "connected",
                slots,
            }
        })
        .collect()
}

/// A node's id (`CLUSTER MYID`).
pub fn node_id(port: u16) -> String {
    reply_text(&sync_cmd(port, &["CLUSTER", "MYID"]))
}

/// The slot `slot` on its way from `src` to `dst` (IMPORTING/MIGRATING), moved key by key with
/// MIGRATE and handed over with SETSLOT NODE.
pub struct SlotMigration {
    pub slot: u16,
    pub src: u16,
    pub dst: u16,
    src_id: String,
    dst_id: String,
}

impl SlotMigration {
    /// Marks the slot importing on `dst` and migrating on `src`; nothing moved yet.
    pub fn begin(slot: u16, src: u16, dst: u16) -> SlotMigration {
        let m = SlotMigration {
            slot,
            src,
            dst,
            src_id: node_id(src),
            dst_id: node_id(dst),
        };
        let s = slot.to_string();
        let r = sync_cmd(dst, &["CLUSTER", "SETSLOT", &s, "IMPORTING", &m.src_id]);
        assert_eq!(r, b"+OK\r\n", "SETSLOT IMPORTING: {}", show(&r));
        let r = sync_cmd(src, &["CLUSTER", "SETSLOT", &s, "MIGRATING", &m.dst_id]);
        assert_eq!(r, b"+OK\r\n", "SETSLOT MIGRATING: {}", show(&r));
        m
    }

    /// Up to `n` keys of the slot still on the source.
    pub fn keys_left(&self, n: usize) -> Vec<String> {
        let (slot, n) = (self.slot.to_string(), n.to_string());
        let r = sync_cmd(self.src, &["CLUSTER", "GETKEYSINSLOT", &slot, &n]);
        use redis_protocol::resp2::types::OwnedFrame as F;
        match redis_protocol::resp2::decode::decode(&r) {
            Ok(Some((F::Array(items), _))) => items
                .into_iter()
                .map(|f| match f {
                    F::BulkString(b) => String::from_utf8(b).expect("utf-8 key"),
                    other => panic!("GETKEYSINSLOT element {other:?}"),
                })
                .collect(),
            _ => panic!("GETKEYSINSLOT: {}", show(&r)),
        }
    }

    /// Moves `keys` to the destination with one MIGRATE (no REPLACE: a key already on the
    /// destination would mean a write went to the wrong node, and fails the test).
    pub fn migrate(&self, keys: &[String]) {
        let port = self.dst.to_string();
        let mut args = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
        args.extend(keys.iter().map(String::as_str));
        let r = sync_cmd(self.src, &args);
        assert_eq!(r, b"+OK\r\n", "MIGRATE {keys:?}: {}", show(&r));
    }

    /// Hands the slot to the destination on every one of `masters` (destination first, then
    /// source, then the others).
    pub fn finish(&self, masters: &[u16]) {
        let s = self.slot.to_string();
        let mut order = vec![self.dst, self.src];
        order.extend(masters.iter().filter(|&&p| p != self.src && p != self.dst));
        for port in order {
            let r = sync_cmd(port, &["CLUSTER", "SETSLOT", &s, "NODE", &self.dst_id]);
            assert_eq!(r, b"+OK\r\n", "SETSLOT NODE on {port}: {}", show(&r));
        }
    }

    /// Keys of the slot on the node at `port` (`CLUSTER COUNTKEYSINSLOT`).
    pub fn count_on(&self, port: u16) -> i64 {
        let r = sync_cmd(
            port,
            &["CLUSTER", "COUNTKEYSINSLOT", &self.slot.to_string()],
        );
        int_of(&r).unwrap_or_else(|| panic!("COUNTKEYSINSLOT: {}", show(&r)))
    }
}
