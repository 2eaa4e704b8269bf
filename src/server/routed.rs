//! Cluster mode: routing forwarded commands by slot, splitting multi-key commands across
//! slots, fanning whole-keyspace commands out to every master and settings to every node,
//! SCAN over all masters, and following MOVED/ASK/TRYAGAIN/CLUSTERDOWN so that clients never
//! see them.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::pending::{Fan, Part, Then};
use super::plan::{AloneReq, NodeReq, Plan};
use crate::cluster::keys::split_by_slot;
use crate::cluster::{Addr, KeySlot, MultiKey, SplitKind, classify_multi, key_slot};
use crate::commands::{Access, Command};
use crate::error::replies;
use crate::resp::encode::encode_request;
use crate::resp::{Args, Proto};
use crate::upstream::cluster::ClusterUpstream;

/// SCAN cursors carry the master's index in their low bits.
pub(super) const NODE_BITS: u32 = 10;

/// Routes a forwarded request in cluster mode.
pub(super) fn route(
    cluster: &Arc<ClusterUpstream>,
    cmd: &Command<'_>,
    req: Bytes,
    proto: Proto,
    client: u64,
) -> Plan {
    let Some(name) = cmd.kind.name.get() else {
        return any_node(cluster, req, proto, client);
    };
    let args = &cmd.args;
    let positions = cmd.keys();
    if positions.is_empty() {
        return keyless(cluster, name, args, req, proto, client);
    }
    match crate::cluster::keys::keys_slot(&positions, args) {
        KeySlot::One(slot) => match cluster.slot_conn(slot, reads(cmd.access()), proto, client) {
            Some(conn) => Plan::Node(Box::new(NodeReq {
                conn,
                req,
                slot: Some(slot),
                lead: None,
            })),
            None => {
                cluster.request_refresh();
                Plan::ready(replies::SLOT_NOT_SERVED.to_bytes())
            }
        },
        KeySlot::NoKeys => any_node(cluster, req, proto, client),
        KeySlot::Cross => match classify_multi(name) {
            // Pairs are split by slot: with a key left without its value, the last part
            // would set it to an empty string where Redis refuses the whole command.
            MultiKey::Split(SplitKind::Mset) if args.len().is_multiple_of(2) => {
                let error = replies::wrong_arity("mset");
                Plan::ready(Bytes::from(format!("-{error}\r\n")))
            }
            MultiKey::Split(kind) => split(cluster, name, kind, args, &positions, proto, client),
            _ => Plan::ready(replies::CROSSSLOT.to_bytes()),
        },
    }
}

/// Whether a command with this access reads only (see `ClusterUpstream::read_node`).
fn reads(access: Option<Access>) -> bool {
    matches!(access, Some(Access::Get | Access::MGet | Access::Read))
}

fn any_node(cluster: &ClusterUpstream, req: Bytes, proto: Proto, client: u64) -> Plan {
    Plan::Node(Box::new(NodeReq {
        conn: cluster.conn_for(&cluster.any_node(), proto, client),
        req,
        slot: None,
        lead: None,
    }))
}

/// Where a command that names no key goes when no one node can answer it for the whole
/// cluster, and how the nodes' replies are combined.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spread {
    /// Every master: what reads or changes the keyspace (each master holds its part).
    Masters(Fan),
    /// Every node, replicas too: settings, which Redis does not replicate (a replica
    /// promoted later then has them).
    Nodes(Fan),
    /// SCAN: the masters one after another.
    Walk,
}

/// The [`Spread`] of a keyless command `name` (upper case) with subcommand `sub` (upper
/// case), if it has one.
fn spread_of(name: &[u8], sub: &[u8]) -> Option<Spread> {
    Some(match (name, sub) {
        (b"DBSIZE", _) => Spread::Masters(Fan::Sum),
        // Shard channels live on their slot's master: every master lists its own.
        (b"KEYS", _) | (b"PUBSUB", b"SHARDCHANNELS") => Spread::Masters(Fan::Concat),
        (b"RANDOMKEY", _) => Spread::Masters(Fan::FirstNonNil),
        (b"FLUSHALL" | b"FLUSHDB", _) => Spread::Masters(Fan::First),
        (b"SCRIPT", b"LOAD" | b"FLUSH") => Spread::Masters(Fan::First),
        (b"FUNCTION", b"LOAD" | b"DELETE" | b"FLUSH" | b"RESTORE") => Spread::Masters(Fan::First),
        (b"CONFIG", b"SET" | b"RESETSTAT" | b"REWRITE") => Spread::Nodes(Fan::First),
        (b"SCAN", _) => Spread::Walk,
        _ => return None,
    })
}

/// Whether `cmd` names no key and goes to several nodes (see [`Spread`], and PUBSUB
/// SHARDNUMSUB): inside a transaction, or on a WATCH's pinned connection, it would read or
/// change one master only.
pub(super) fn spreads(cmd: &Command<'_>) -> bool {
    let Some(name) = cmd.kind.name.get() else {
        return false;
    };
    let sub = cmd.args.get(1).unwrap_or_default().to_ascii_uppercase();
    cmd.keys().is_empty()
        && (spread_of(name, &sub).is_some() || is_shard_numsub(name, &sub, &cmd.args))
}

/// PUBSUB SHARDNUMSUB with channels, which are counted on their masters (`shard_numsub`).
fn is_shard_numsub(name: &[u8], sub: &[u8], args: &Args<'_>) -> bool {
    (name, sub) == (&b"PUBSUB"[..], &b"SHARDNUMSUB"[..]) && args.len() > 2
}

/// Commands that name no key: whole-keyspace ones go to every master, settings to every
/// node, SCAN walks the masters one after another, the rest go to any node (a keyed command
/// corral does not know is then redirected by Redis, and followed).
fn keyless(
    cluster: &ClusterUpstream,
    name: &[u8],
    args: &Args<'_>,
    req: Bytes,
    proto: Proto,
    client: u64,
) -> Plan {
    let sub = args.get(1).unwrap_or_default().to_ascii_uppercase();
    if (name, sub.as_slice()) == (&b"CONFIG"[..], &b"SET"[..])
        && let Some(param) = per_node_setting(args)
    {
        let error = replies::per_node_setting(param);
        return Plan::ready(Bytes::from(format!("-{error}\r\n")));
    }
    if is_shard_numsub(name, &sub, args) {
        return shard_numsub(cluster, args, proto, client);
    }
    let (how, nodes) = match spread_of(name, &sub) {
        Some(Spread::Masters(how)) => (how, cluster.masters()),
        Some(Spread::Nodes(how)) => (how, cluster.nodes()),
        Some(Spread::Walk) => return scan(cluster, args, proto, client),
        None => return any_node(cluster, req, proto, client),
    };
    fan_out(cluster, &nodes, how, req, proto, client)
}

/// Settings each node of a cluster keeps its own value of (its addresses, ports and files):
/// one value set on every node would break the cluster, or have its nodes share files.
const PER_NODE: &[&[u8]] = &[
    b"bind",
    b"bind-source-addr",
    b"port",
    b"tls-port",
    b"dir",
    b"dbfilename",
    b"cluster-announce-ip",
    b"cluster-announce-hostname",
    b"cluster-announce-human-nodename",
    b"cluster-announce-port",
    b"cluster-announce-bus-port",
    b"cluster-announce-tls-port",
    b"replica-announce-ip",
    b"replica-announce-port",
    b"slave-announce-ip",
    b"slave-announce-port",
];

/// The first setting of a `CONFIG SET name value [name value ...]` that [`PER_NODE`] lists.
fn per_node_setting<'a>(args: &Args<'a>) -> Option<&'a [u8]> {
    (2..args.len())
        .step_by(2)
        .filter_map(|i| args.get(i))
        .find(|p| PER_NODE.iter().any(|n| p.eq_ignore_ascii_case(n)))
}

/// `req` sent to each of `nodes`, their replies combined as `how` says. With no node known
/// (every master failed), Redis Cluster's error for a slot nobody serves: a reply made of
/// none would be no reply at all.
pub(super) fn fan_out(
    cluster: &ClusterUpstream,
    nodes: &[Addr],
    how: Fan,
    req: Bytes,
    proto: Proto,
    client: u64,
) -> Plan {
    if nodes.is_empty() {
        cluster.request_refresh();
        return Plan::ready(replies::SLOT_NOT_SERVED.to_bytes());
    }
    Plan::Fanout {
        how,
        parts: nodes
            .iter()
            .map(|a| (cluster.conn_for(a, proto, client), req.clone()))
            .collect(),
    }
}

/// PUBSUB SHARDNUMSUB: a shard channel's subscribers are on the master of its slot, so each
/// channel is counted there; channels of several masters are asked of each, and their
/// counts put back in the order asked. The counts are corrected for corral's own
/// subscribers (`pubcount.rs`).
fn shard_numsub(cluster: &ClusterUpstream, args: &Args<'_>, proto: Proto, client: u64) -> Plan {
    let mut groups: Vec<(Addr, u16, Vec<usize>)> = Vec::new();
    for i in 2..args.len() {
        let slot = key_slot(args.get(i).unwrap_or_default());
        let Some(addr) = cluster.master_of(slot) else {
            cluster.request_refresh();
            return Plan::ready(replies::SLOT_NOT_SERVED.to_bytes());
        };
        match groups.iter_mut().find(|(a, ..)| *a == addr) {
            Some((_, _, channels)) => channels.push(i),
            None => groups.push((addr, slot, vec![i])),
        }
    }
    let request = |channels: &[usize]| {
        let mut argv: Vec<&[u8]> = vec![b"PUBSUB", b"SHARDNUMSUB"];
        argv.extend(channels.iter().map(|&i| args.get(i).unwrap_or_default()));
        let mut req = BytesMut::new();
        encode_request(&argv, &mut req);
        req.freeze()
    };
    let parts: Vec<Part> = groups
        .into_iter()
        .map(|(addr, slot, channels)| Part {
            conn: cluster.conn_for(&addr, proto, client),
            req: request(&channels),
            slot,
            keys: channels,
        })
        .collect();
    Plan::Split {
        kind: SplitKind::Pairs,
        parts,
    }
}

/// SCAN over every master in turn: the client's cursor is `redis_cursor << 10 | master`.
fn scan(cluster: &ClusterUpstream, args: &Args<'_>, proto: Proto, client: u64) -> Plan {
    if args.len() < 2 {
        return Plan::ready(replies::line(&replies::wrong_arity("scan")));
    }
    let masters = cluster.masters();
    let cursor = args.get(1).and_then(parse_cursor);
    let (Some(cursor), false) = (cursor, masters.is_empty()) else {
        return Plan::ready(replies::INVALID_CURSOR.to_bytes());
    };
    let node = (cursor & ((1 << NODE_BITS) - 1)) as usize;
    let Some(addr) = masters.get(node) else {
        // Past the last master: the scan is over, as Redis ends one given a cursor past its
        // table.
        return Plan::ready(Bytes::from_static(b"*2\r\n$1\r\n0\r\n*0\r\n"));
    };
    let inner = (cursor >> NODE_BITS).to_string();
    let mut argv: Vec<&[u8]> = args.iter().collect();
    argv[1] = inner.as_bytes();
    let mut req = BytesMut::new();
    encode_request(&argv, &mut req);
    Plan::Alone(Box::new(AloneReq {
        conn: Some(cluster.conn_for(addr, proto, client)),
        req: req.freeze(),
        then: Then::Scan(Box::new(super::scan_walk::ScanWalk::new(
            node,
            masters.len(),
            args.iter(),
            proto,
            client,
        ))),
    }))
}

/// A SCAN cursor as Redis reads one (`strtoul`): digits after an optional sign, a minus
/// wrapping around (`-1` is the largest cursor), nothing at all being 0; `None` for anything
/// else, or past 64 bits.
fn parse_cursor(s: &[u8]) -> Option<u64> {
    let (neg, digits) = match s {
        [b'-', rest @ ..] => (true, rest),
        [b'+', rest @ ..] => (false, rest),
        _ => (false, s),
    };
    if digits.is_empty() {
        return s.is_empty().then_some(0);
    }
    let v = digits.iter().try_fold(0u64, |v, &d| {
        d.is_ascii_digit()
            .then(|| v.checked_mul(10)?.checked_add(u64::from(d - b'0')))
            .flatten()
    })?;
    Some(if neg { v.wrapping_neg() } else { v })
}

/// MGET/MSET/DEL/UNLINK/EXISTS/TOUCH across slots: one request per slot.
fn split(
    cluster: &ClusterUpstream,
    name: &[u8],
    kind: SplitKind,
    args: &Args<'_>,
    positions: &crate::commands::KeyPositions,
    proto: Proto,
    client: u64,
) -> Plan {
    let mut parts = Vec::new();
    for group in split_by_slot(positions, args) {
        let Some(addr) = cluster.master_of(group.slot) else {
            cluster.request_refresh();
            return Plan::ready(replies::SLOT_NOT_SERVED.to_bytes());
        };
        let mut argv: Vec<&[u8]> = vec![name];
        for &i in &group.keys {
            argv.push(args.get(i).unwrap_or_default());
            if kind == SplitKind::Mset {
                argv.push(args.get(i + 1).unwrap_or_default());
            }
        }
        let mut req = BytesMut::new();
        encode_request(&argv, &mut req);
        parts.push(Part {
            conn: cluster.conn_for(&addr, proto, client),
            req: req.freeze(),
            slot: group.slot,
            keys: group.keys,
        });
    }
    Plan::Split { kind, parts }
}

#[cfg(test)]
mod tests {
    use super::parse_cursor;

    #[test]
    fn cursors_read_as_redis_reads_them() {
        assert_eq!(parse_cursor(b"0"), Some(0));
        assert_eq!(parse_cursor(b"1234"), Some(1234));
        assert_eq!(parse_cursor(b"+7"), Some(7));
        assert_eq!(parse_cursor(b"-1"), Some(u64::MAX));
        assert_eq!(parse_cursor(b"18446744073709551615"), Some(u64::MAX));
        assert_eq!(parse_cursor(b""), Some(0));
        for bad in [
            &b"18446744073709551616"[..],
            b"-",
            b"+",
            b" 1",
            b"1x",
            b"0x10",
        ] {
            assert_eq!(parse_cursor(bad), None, "{}", String::from_utf8_lossy(bad));
        }
    }
}
