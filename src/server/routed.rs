//! Cluster mode: routing forwarded commands by slot, splitting multi-key commands across
//! slots, fanning whole-keyspace commands out to every master, SCAN over all masters, and
//! following MOVED/ASK/TRYAGAIN/CLUSTERDOWN so that clients never see them.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};

use super::client::Conn;
use super::pending::{Fan, Part, Then};
use super::plan::Plan;
use crate::cluster::keys::{CROSSSLOT, split_by_slot};
use crate::cluster::{Addr, KeySlot, MultiKey, Redirect, SplitKind, classify_multi};
use crate::commands::{Access, Command};
use crate::resp::request::{encode_request, parse_int};
use crate::resp::{Args, Proto};
use crate::upstream::UpstreamConn;
use crate::upstream::cluster::ClusterUpstream;

/// Most redirections followed for one request before its last reply is passed on.
const MAX_REDIRECTS: usize = 5;
/// SCAN cursors carry the master's index in their low bits.
const NODE_BITS: u32 = 10;

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
        KeySlot::One(slot) => match node_for(cluster, cmd.access(), slot, client) {
            Some(addr) => Plan::Node {
                conn: cluster.conn_for(&addr, proto, client),
                req,
                slot: Some(slot),
            },
            None => {
                cluster.request_refresh();
                Plan::ready(Bytes::from_static(b"-CLUSTERDOWN Hash slot not served\r\n"))
            }
        },
        KeySlot::NoKeys => any_node(cluster, req, proto, client),
        KeySlot::Cross => match classify_multi(name) {
            MultiKey::Split(kind) => split(cluster, name, kind, args, &positions, proto, client),
            _ => Plan::ready(Bytes::from_static(CROSSSLOT)),
        },
    }
}

/// The node for a request on `slot`: a replica for read-only commands when `read_from` says
/// so, else the master.
fn node_for(
    cluster: &ClusterUpstream,
    access: Option<Access>,
    slot: u16,
    client: u64,
) -> Option<Addr> {
    match access {
        Some(Access::Get | Access::MGet | Access::Read) => cluster.read_node(slot, client),
        _ => cluster.master_of(slot),
    }
}

fn any_node(cluster: &ClusterUpstream, req: Bytes, proto: Proto, client: u64) -> Plan {
    Plan::Node {
        conn: cluster.conn_for(&cluster.any_node(), proto, client),
        req,
        slot: None,
    }
}

/// Commands that name no key: whole-keyspace ones go to every master, SCAN walks them one
/// after another, the rest go to any node (a keyed command corral does not know is then
/// redirected by Redis, and followed).
fn keyless(
    cluster: &ClusterUpstream,
    name: &[u8],
    args: &Args<'_>,
    req: Bytes,
    proto: Proto,
    client: u64,
) -> Plan {
    let sub = args.get(1).unwrap_or_default().to_ascii_uppercase();
    let fan = match (name, sub.as_slice()) {
        (b"DBSIZE", _) => Some(Fan::Sum),
        (b"KEYS", _) => Some(Fan::Concat),
        (b"RANDOMKEY", _) => Some(Fan::FirstNonNil),
        (b"FLUSHALL" | b"FLUSHDB", _) => Some(Fan::First),
        (b"SCRIPT", b"LOAD" | b"FLUSH") => Some(Fan::First),
        (b"FUNCTION", b"LOAD" | b"DELETE" | b"FLUSH" | b"RESTORE") => Some(Fan::First),
        (b"SCAN", _) => return scan(cluster, args, proto, client),
        _ => None,
    };
    match fan {
        Some(how) => Plan::Fanout {
            how,
            parts: cluster
                .masters()
                .iter()
                .map(|a| (cluster.conn_for(a, proto, client), req.clone()))
                .collect(),
        },
        None => any_node(cluster, req, proto, client),
    }
}

/// SCAN over every master in turn: the client's cursor is `redis_cursor << 10 | master`.
fn scan(cluster: &ClusterUpstream, args: &Args<'_>, proto: Proto, client: u64) -> Plan {
    let masters = cluster.masters();
    let cursor = args
        .get(1)
        .and_then(parse_int)
        .and_then(|c| u64::try_from(c).ok());
    let (Some(cursor), false) = (cursor, masters.is_empty()) else {
        return Plan::ready(Bytes::from_static(b"-ERR invalid cursor\r\n"));
    };
    let node = (cursor & ((1 << NODE_BITS) - 1)) as usize;
    let Some(addr) = masters.get(node) else {
        return Plan::ready(Bytes::from_static(b"-ERR invalid cursor\r\n"));
    };
    let inner = (cursor >> NODE_BITS).to_string();
    let mut argv: Vec<&[u8]> = args.iter().collect();
    argv[1] = inner.as_bytes();
    let mut req = BytesMut::new();
    encode_request(&argv, &mut req);
    Plan::Alone {
        conn: Some(cluster.conn_for(addr, proto, client)),
        req: req.freeze(),
        then: Then::Scan {
            node,
            nodes: masters.len(),
        },
    }
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
            return Plan::ready(Bytes::from_static(b"-CLUSTERDOWN Hash slot not served\r\n"));
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

impl Conn {
    /// Replaces every MOVED/ASK/TRYAGAIN/CLUSTERDOWN reply in `replies` (one per request in
    /// `cmds`) by the reply of the request retried where the cluster says.
    pub(super) async fn follow_redirects(
        &self,
        replies: Bytes,
        cmds: &[(Bytes, Option<u16>)],
        origin: &UpstreamConn,
    ) -> Bytes {
        let frames = frames(&replies);
        if frames.len() != cmds.len() || !frames.iter().any(|f| Redirect::parse(f).is_some()) {
            return replies;
        }
        let mut out = BytesMut::with_capacity(replies.len());
        for (frame, (cmd, slot)) in frames.iter().zip(cmds) {
            match Redirect::parse(frame) {
                Some(r) => {
                    let reply = self.retry(cmd, *slot, r, origin).await;
                    out.extend_from_slice(&reply);
                }
                None => out.extend_from_slice(frame),
            }
        }
        out.freeze()
    }

    /// Retries one request after a redirection, up to `MAX_REDIRECTS` times.
    pub(super) async fn retry(
        &self,
        cmd: &Bytes,
        slot: Option<u16>,
        mut redirect: Redirect,
        origin: &UpstreamConn,
    ) -> Bytes {
        let Some(cluster) = &self.shared.upstream.cluster else {
            return Bytes::from_static(b"-ERR redirection outside cluster mode\r\n");
        };
        let proto = self.session.proto;
        let id = self.session.id;
        let origin_host = Addr::parse(origin.addr())
            .map(|a| a.host)
            .unwrap_or_default();
        let fix = |a: &Addr| {
            if a.host.is_empty() {
                Addr::new(origin_host.clone(), a.port)
            } else {
                a.clone()
            }
        };
        let mut last = Bytes::new();
        for attempt in 1..=MAX_REDIRECTS {
            let (conn, bytes, count) = match &redirect {
                Redirect::Moved { slot, addr } => {
                    let addr = fix(addr);
                    cluster.apply_moved(*slot, &addr);
                    (cluster.conn_for(&addr, proto, id), cmd.clone(), 1)
                }
                Redirect::Ask { addr, .. } => {
                    let mut both = BytesMut::new();
                    encode_request(&[b"ASKING"], &mut both);
                    both.extend_from_slice(cmd);
                    (cluster.conn_for(&fix(addr), proto, id), both.freeze(), 2)
                }
                Redirect::TryAgain if attempt > 1 => {
                    // A multi-key request on a slot split by a migration: the splittable
                    // ones (no atomicity to keep) are answered key by key instead.
                    if let Some(reply) = Box::pin(self.per_key(cmd, origin)).await {
                        return reply;
                    }
                    cluster.request_refresh();
                    tokio::time::sleep(Duration::from_millis(50 * attempt as u64)).await;
                    let addr = slot
                        .and_then(|s| cluster.master_of(s))
                        .unwrap_or_else(|| cluster.any_node());
                    (cluster.conn_for(&addr, proto, id), cmd.clone(), 1)
                }
                Redirect::TryAgain | Redirect::ClusterDown => {
                    cluster.request_refresh();
                    let pause = Duration::from_millis(50 * attempt as u64);
                    tokio::time::sleep(pause).await;
                    let addr = slot
                        .and_then(|s| cluster.master_of(s))
                        .unwrap_or_else(|| cluster.any_node());
                    (cluster.conn_for(&addr, proto, id), cmd.clone(), 1)
                }
            };
            let rx = conn.send(bytes, count).await;
            let reply = match self.wait(rx, &conn).await {
                Ok(b) => b,
                Err(e) => {
                    cluster.request_refresh();
                    return e.to_reply();
                }
            };
            // After ASKING, the request's own reply is the second one.
            let reply = if count == 2 {
                frames(&reply)
                    .get(1)
                    .map(|f| Bytes::copy_from_slice(f))
                    .unwrap_or(reply)
            } else {
                reply
            };
            match Redirect::parse(&reply) {
                Some(next) => {
                    redirect = next;
                    last = reply;
                }
                None => return reply,
            }
        }
        last
    }

    /// MGET/MSET/DEL/UNLINK/EXISTS/TOUCH as one request per key, each retried where the
    /// cluster says; `None` for any other request.
    async fn per_key(&self, cmd: &Bytes, origin: &UpstreamConn) -> Option<Bytes> {
        let cluster = self.shared.upstream.cluster.as_ref()?;
        let mut parser = crate::resp::RequestParser::new(crate::resp::Limits::default());
        parser.parse(cmd, true).ok()??;
        let parsed = Command::new(parser.args(cmd));
        let (args, name) = (parsed.args, parsed.name());
        let MultiKey::Split(kind) = classify_multi(name) else {
            return None;
        };
        let positions = parsed.keys();
        let mut requests = Vec::new();
        for i in positions.indices() {
            let key = args.get(i)?;
            let mut argv: Vec<&[u8]> = vec![name, key];
            if kind == SplitKind::Mset {
                argv.push(args.get(i + 1)?);
            }
            let mut req = BytesMut::new();
            encode_request(&argv, &mut req);
            requests.push((i, crate::cluster::key_slot(key), req.freeze()));
        }
        let (proto, id) = (self.session.proto, self.session.id);
        let mut parts = Vec::with_capacity(requests.len());
        for (i, slot, req) in requests {
            let addr = cluster
                .master_of(slot)
                .unwrap_or_else(|| cluster.any_node());
            let conn = cluster.conn_for(&addr, proto, id);
            let rx = conn.send(req.clone(), 1).await;
            let reply = match self.wait(rx, &conn).await {
                Ok(b) => match Redirect::parse(&b) {
                    Some(Redirect::TryAgain) | None => b,
                    Some(r) => self.retry(&req, Some(slot), r, origin).await,
                },
                Err(e) => e.to_reply(),
            };
            parts.push((vec![i], reply));
        }
        let mut out = BytesMut::new();
        merge_split(kind, &parts, &mut out);
        Some(out.freeze())
    }

    /// `GET key` through the routing path, redirections followed (in the client's protocol).
    pub(super) async fn routed_get(&self, key: &[u8]) -> Bytes {
        let Some(cluster) = &self.shared.upstream.cluster else {
            return Bytes::from_static(b"-ERR not in cluster mode\r\n");
        };
        let slot = crate::cluster::key_slot(key);
        let addr = cluster
            .master_of(slot)
            .unwrap_or_else(|| cluster.any_node());
        let conn = cluster.conn_for(&addr, self.session.proto, self.session.id);
        let mut req = BytesMut::new();
        encode_request(&[b"GET", key], &mut req);
        let req = req.freeze();
        let rx = conn.send(req.clone(), 1).await;
        match self.wait(rx, &conn).await {
            Ok(b) => self.follow_redirects(b, &[(req, Some(slot))], &conn).await,
            Err(e) => e.to_reply(),
        }
    }

    /// Merges the per-slot replies of a split command in key order.
    pub(super) fn merge_split(&mut self, kind: SplitKind, parts: &[(Vec<usize>, Bytes)]) {
        merge_split(kind, parts, &mut self.wbuf);
    }

    /// Combines the replies of every master.
    pub(super) fn merge_fanout(&mut self, how: Fan, replies: &[Bytes]) {
        if let Some(err) = replies.iter().find(|r| r.first() == Some(&b'-')) {
            return self.wbuf.extend_from_slice(err);
        }
        match how {
            Fan::First => {
                if let Some(r) = replies.first() {
                    self.wbuf.extend_from_slice(r);
                }
            }
            Fan::Sum => {
                let total: i64 = replies.iter().filter_map(|r| int_reply(r)).sum();
                self.wbuf
                    .extend_from_slice(format!(":{total}\r\n").as_bytes());
            }
            Fan::Concat => {
                let elements: Vec<&[u8]> = replies
                    .iter()
                    .flat_map(|r| crate::resp::array_elements(r).unwrap_or_default())
                    .collect();
                self.wbuf
                    .extend_from_slice(format!("*{}\r\n", elements.len()).as_bytes());
                for e in elements {
                    self.wbuf.extend_from_slice(e);
                }
            }
            Fan::FirstNonNil => {
                let nil = |r: &Bytes| r.starts_with(b"$-1") || r.starts_with(b"_");
                match replies.iter().find(|r| !nil(r)).or(replies.first()) {
                    Some(r) => self.wbuf.extend_from_slice(r),
                    None => crate::resp::Encoder {
                        proto: self.session.proto,
                        out: &mut self.wbuf,
                    }
                    .null(),
                }
            }
        }
    }

    /// Rewrites a node's SCAN reply cursor into corral's cursor.
    pub(super) fn scan_reply(&mut self, reply: &Bytes, node: usize, nodes: usize) {
        let parts = frames(reply);
        let (Some(head), Some(cursor), Some(keys)) = (
            reply.get(..4).filter(|h| h == b"*2\r\n"),
            parts_of_array(reply).first().copied(),
            parts_of_array(reply).get(1).copied(),
        ) else {
            let _ = parts;
            return self.wbuf.extend_from_slice(reply);
        };
        let inner = bulk_text(cursor)
            .and_then(|t| t.parse::<u64>().ok())
            .unwrap_or(0);
        let next = if inner != 0 {
            (inner << NODE_BITS) | node as u64
        } else if node + 1 < nodes {
            (node + 1) as u64
        } else {
            0
        };
        let next = next.to_string();
        self.wbuf.extend_from_slice(head);
        self.wbuf
            .extend_from_slice(format!("${}\r\n{next}\r\n", next.len()).as_bytes());
        self.wbuf.extend_from_slice(keys);
    }
}

/// Merges the per-slot (or per-key) replies of a split command in key order into `out`.
fn merge_split(kind: SplitKind, parts: &[(Vec<usize>, Bytes)], out: &mut BytesMut) {
    if let Some((_, err)) = parts.iter().find(|(_, r)| r.first() == Some(&b'-')) {
        return out.extend_from_slice(err);
    }
    match kind {
        SplitKind::Mset => out.extend_from_slice(b"+OK\r\n"),
        SplitKind::SumInt => {
            let total: i64 = parts.iter().filter_map(|(_, r)| int_reply(r)).sum();
            out.extend_from_slice(format!(":{total}\r\n").as_bytes());
        }
        SplitKind::Mget => {
            let mut all: Vec<(usize, &[u8])> = Vec::new();
            for (keys, reply) in parts {
                let elements = crate::resp::array_elements(reply).unwrap_or_default();
                all.extend(keys.iter().copied().zip(elements));
            }
            all.sort_by_key(|(i, _)| *i);
            out.extend_from_slice(format!("*{}\r\n", all.len()).as_bytes());
            for (_, e) in all {
                out.extend_from_slice(e);
            }
        }
    }
}

/// Top-level frames of `bytes`.
fn frames(bytes: &[u8]) -> Vec<&[u8]> {
    crate::resp::frames(bytes).map(|f| f.bytes).collect()
}

/// The elements of an array reply.
fn parts_of_array(reply: &[u8]) -> Vec<&[u8]> {
    crate::resp::array_elements(reply).unwrap_or_default()
}

fn bulk_text(frame: &[u8]) -> Option<String> {
    let rest = frame.strip_prefix(b"$")?;
    let cr = rest.iter().position(|&b| b == b'\r')?;
    let body = rest.get(cr + 2..rest.len().checked_sub(2)?)?;
    Some(String::from_utf8_lossy(body).into_owned())
}

fn int_reply(r: &[u8]) -> Option<i64> {
    let rest = r.strip_prefix(b":")?;
    let cr = rest.iter().position(|&b| b == b'\r')?;
    parse_int(&rest[..cr])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bulk_and_int_helpers() {
        assert_eq!(bulk_text(b"$3\r\n123\r\n").as_deref(), Some("123"));
        assert_eq!(int_reply(b":42\r\n"), Some(42));
        assert_eq!(frames(b"+OK\r\n:1\r\n").len(), 2);
    }
}
