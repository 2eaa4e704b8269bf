//! CLUSTER commands in cluster mode: corral presents the whole cluster as one node that owns
//! every slot, so cluster-aware clients route everything to corral and cluster-unaware ones
//! never see a redirection.

use std::net::SocketAddr;

use bytes::{Bytes, BytesMut};

use crate::cluster::key_slot;
use crate::error::replies;
use crate::resp::{Args, Encoder, Proto};

/// What a CLUSTER request needs.
pub(super) enum ClusterReply {
    /// Answered here.
    Local(Bytes),
    /// Sent to the master of this slot (COUNTKEYSINSLOT, GETKEYSINSLOT).
    Slot(u16),
}

/// A stable 40-hex-digit node id derived from corral's address.
fn node_id(laddr: &SocketAddr) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in laddr.to_string().bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}{:024x}", u128::from(h).wrapping_mul(0x9e37_79b9))
}

/// Answers CLUSTER subcommands for a client connected to `laddr`; `healthy` says whether the
/// upstream cluster serves every slot.
pub(super) fn execute(
    args: &Args<'_>,
    laddr: SocketAddr,
    healthy: bool,
    proto: Proto,
) -> ClusterReply {
    let mut out = BytesMut::new();
    let mut e = Encoder {
        proto,
        out: &mut out,
    };
    let sub = args.get(1).unwrap_or_default().to_ascii_uppercase();
    let ip = laddr.ip().to_string();
    let port = i64::from(laddr.port());
    let id = node_id(&laddr);
    match sub.as_slice() {
        b"INFO" => {
            let state = if healthy { "ok" } else { "fail" };
            let text = format!(
                "cluster_enabled:1\r\ncluster_state:{state}\r\ncluster_slots_assigned:16384\r\n\
                 cluster_slots_ok:16384\r\ncluster_slots_pfail:0\r\ncluster_slots_fail:0\r\n\
                 cluster_known_nodes:1\r\ncluster_size:1\r\ncluster_current_epoch:1\r\n\
                 cluster_my_epoch:1\r\n"
            );
            e.verbatim(text.as_bytes());
        }
        b"MYID" => e.bulk(id.as_bytes()),
        b"NODES" => {
            let line = format!("{id} {ip}:{port}@{port} myself,master - 0 0 1 connected 0-16383\n");
            e.verbatim(line.as_bytes());
        }
        b"SLOTS" => {
            e.array(1);
            e.array(3);
            e.int(0);
            e.int(16383);
            e.array(3);
            e.bulk(ip.as_bytes());
            e.int(port);
            e.bulk(id.as_bytes());
        }
        b"SHARDS" => shards(&mut e, &id, &ip, port),
        b"KEYSLOT" if args.len() == 3 => {
            e.int(i64::from(key_slot(args.get(2).unwrap_or_default())))
        }
        b"COUNTKEYSINSLOT" | b"GETKEYSINSLOT" => {
            match args
                .get(2)
                .and_then(crate::resp::digits::parse_int)
                .and_then(|n| u16::try_from(n).ok())
                .filter(|&n| usize::from(n) < crate::cluster::SLOTS)
            {
                Some(slot) => return ClusterReply::Slot(slot),
                None => e.error(replies::INVALID_SLOT.text()),
            }
        }
        _ => e.error(&replies::cluster_subcommand_unsupported(&sub)),
    }
    ClusterReply::Local(out.freeze())
}

/// CLUSTER SHARDS: one shard, this node, every slot.
fn shards(e: &mut Encoder<'_>, id: &str, ip: &str, port: i64) {
    e.array(1);
    e.map(2);
    e.bulk(b"slots");
    e.array(2);
    e.int(0);
    e.int(16383);
    e.bulk(b"nodes");
    e.array(1);
    e.map(7);
    e.bulk(b"id");
    e.bulk(id.as_bytes());
    e.bulk(b"port");
    e.int(port);
    e.bulk(b"ip");
    e.bulk(ip.as_bytes());
    e.bulk(b"endpoint");
    e.bulk(ip.as_bytes());
    e.bulk(b"role");
    e.bulk(b"master");
    e.bulk(b"replication-offset");
    e.int(0);
    e.bulk(b"health");
    e.bulk(b"online");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(words: &[&str]) -> Vec<u8> {
        let owned: Vec<Vec<u8>> = words.iter().map(|w| w.as_bytes().to_vec()).collect();
        let addr: SocketAddr = "127.0.0.1:6380".parse().unwrap();
        match execute(&Args::Owned(&owned), addr, true, Proto::Resp2) {
            ClusterReply::Local(b) => b.to_vec(),
            ClusterReply::Slot(s) => format!("slot {s}").into_bytes(),
        }
    }

    #[test]
    fn one_node_owns_every_slot() {
        let slots = run(&["CLUSTER", "SLOTS"]);
        assert!(
            slots.starts_with(b"*1\r\n*3\r\n:0\r\n:16383\r\n*3\r\n$9\r\n127.0.0.1\r\n:6380\r\n")
        );
        assert_eq!(run(&["CLUSTER", "KEYSLOT", "foo"]), b":12182\r\n");
        assert_eq!(run(&["CLUSTER", "COUNTKEYSINSLOT", "7"]), b"slot 7");
        let info = String::from_utf8(run(&["CLUSTER", "INFO"])).unwrap();
        assert!(info.contains("cluster_state:ok"), "{info}");
    }
}
