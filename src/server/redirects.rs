//! Cluster mode: following MOVED, ASK, TRYAGAIN and CLUSTERDOWN so that clients never see
//! them.

use std::time::Duration;

use bytes::{Bytes, BytesMut};

use super::client::Conn;
use super::merged::merge_split_replies;
use crate::cluster::{Addr, MultiKey, Redirect, SplitKind, classify_multi};
use crate::commands::Command;
use crate::resp::encode::encode_request;
use crate::upstream::UpstreamConn;

/// Most redirections followed for one request before its last reply is passed on.
const MAX_REDIRECTS: usize = 5;

impl Conn {
    /// Replaces every MOVED/ASK/TRYAGAIN/CLUSTERDOWN reply in `replies` (one per request in
    /// `cmds`) by the reply of the request retried where the cluster says.
    pub(super) async fn follow_redirects(
        &self,
        replies: Bytes,
        cmds: &[(Bytes, Option<u16>)],
        origin: &UpstreamConn,
    ) -> Bytes {
        let frames: Vec<&[u8]> = crate::resp::frames(&replies).map(|f| f.bytes).collect();
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
            return crate::error::replies::REDIRECT_OUTSIDE_CLUSTER.to_bytes();
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
                Redirect::TryAgain | Redirect::ClusterDown => {
                    // A multi-key request on a slot split by a migration: the splittable
                    // ones (no atomicity to keep) are answered key by key instead.
                    if matches!(redirect, Redirect::TryAgain)
                        && attempt > 1
                        && let Some(reply) = Box::pin(self.per_key(cmd, origin)).await
                    {
                        return reply;
                    }
                    cluster.request_refresh();
                    tokio::time::sleep(Duration::from_millis(50 * attempt as u64)).await;
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
                crate::resp::frames(&reply)
                    .nth(1)
                    .map(|f| Bytes::copy_from_slice(f.bytes))
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
        merge_split_replies(kind, &parts, &mut out);
        Some(out.freeze())
    }

    /// `GET key` through the routing path, redirections followed (in the client's protocol).
    pub(super) async fn routed_get(&self, key: &[u8]) -> Bytes {
        let Some(cluster) = &self.shared.upstream.cluster else {
            return crate::error::replies::NOT_CLUSTER_MODE.to_bytes();
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
}
