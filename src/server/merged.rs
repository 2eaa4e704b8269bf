//! Cluster mode: one reply made of several nodes' replies (a split MGET/MSET/DEL..., a
//! command fanned out to every master; SCAN's are in `scan_walk.rs`).

use bytes::{Bytes, BytesMut};

use tokio::sync::oneshot;

use super::client::Conn;
use super::pending::{Fan, Part};
use crate::cluster::{Redirect, SplitKind};
use crate::resp::int_value;
use crate::upstream::{JobResult, UpstreamConn};

impl Conn {
    /// Cluster mode: a split request's parts, each retried where the cluster says, merged.
    pub(super) async fn resolve_split(
        &mut self,
        kind: SplitKind,
        parts: Vec<(oneshot::Receiver<JobResult>, Part)>,
    ) {
        let mut replies = Vec::with_capacity(parts.len());
        for (rx, part) in parts {
            let reply = self
                .node_reply(rx, &part.req, Some(part.slot), &part.conn)
                .await;
            replies.push((part.keys, reply));
        }
        self.merge_split(kind, &replies);
    }

    /// Cluster mode: every master's reply to a fanned-out request, combined.
    pub(super) async fn resolve_fanout(
        &mut self,
        how: Fan,
        parts: Vec<(oneshot::Receiver<JobResult>, UpstreamConn, Bytes)>,
    ) {
        let mut replies = Vec::with_capacity(parts.len());
        for (rx, conn, req) in parts {
            replies.push(self.node_reply(rx, &req, None, &conn).await);
        }
        self.merge_fanout(how, &replies);
    }

    /// One node's reply to `req` (sent on `conn`, for `slot`), retried where a redirection
    /// says; an error's reply if it failed.
    async fn node_reply(
        &mut self,
        rx: oneshot::Receiver<JobResult>,
        req: &Bytes,
        slot: Option<u16>,
        conn: &UpstreamConn,
    ) -> Bytes {
        match self.wait(rx, conn).await {
            Ok(b) => match Redirect::parse(&b) {
                Some(r) => self.retry(req, slot, r, conn).await,
                None => b,
            },
            Err(e) => e.to_reply(),
        }
    }

    /// Merges the per-slot replies of a split command in key order.
    pub(super) fn merge_split(&mut self, kind: SplitKind, parts: &[(Vec<usize>, Bytes)]) {
        if kind != SplitKind::Pairs {
            return merge_split_replies(kind, parts, &mut self.wbuf);
        }
        // PUBSUB SHARDNUMSUB: each master counted corral once for a shard channel its
        // clients subscribe to through corral.
        let mut merged = BytesMut::new();
        merge_split_replies(kind, parts, &mut merged);
        let count = super::pubcount::Count::NumSub {
            kind: crate::pubsub::Kind::Shard,
        };
        let merged = super::pubcount::correct(&count, merged.freeze(), &self.all_hubs());
        self.wbuf.extend_from_slice(&merged);
    }

    /// Combines the replies of every master.
    pub(super) fn merge_fanout(&mut self, how: Fan, replies: &[Bytes]) {
        let is_error = |r: &&Bytes| r.first() == Some(&b'-');
        if let Fan::Info { .. } = how {
            // What an operator asks in an outage: the masters that answered, the first error
            // only if none did.
            let answered: Vec<Bytes> = replies.iter().filter(|r| !is_error(r)).cloned().collect();
            if !answered.is_empty() {
                return self.merge_info(how, &answered);
            }
        }
        if let Some(err) = replies.iter().find(is_error) {
            return self.wbuf.extend_from_slice(err);
        }
        match how {
            Fan::First => {
                if let Some(r) = replies.first() {
                    self.wbuf.extend_from_slice(r);
                }
            }
            Fan::Sum => {
                let total: i64 = replies.iter().filter_map(|r| int_value(r)).sum();
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
            Fan::Info { .. } => self.merge_info(how, replies),
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

    /// INFO from several masters: the first reply with every master's keyspace section, and
    /// corral's own sections if asked for.
    fn merge_info(&mut self, how: Fan, replies: &[Bytes]) {
        let Some(merged) = super::info::merge_keyspace(replies).or(replies.first().cloned()) else {
            return;
        };
        if how == (Fan::Info { with_proxy: true }) {
            let sections = super::info::proxy_sections(&self.shared);
            super::info::append_section(&merged, &sections, &mut self.wbuf);
        } else {
            self.wbuf.extend_from_slice(&merged);
        }
    }
}

/// Merges the per-slot (or per-key) replies of a split command in key order into `out`.
pub(super) fn merge_split_replies(
    kind: SplitKind,
    parts: &[(Vec<usize>, Bytes)],
    out: &mut BytesMut,
) {
    if let Some((_, err)) = parts.iter().find(|(_, r)| r.first() == Some(&b'-')) {
        return out.extend_from_slice(err);
    }
    match kind {
        SplitKind::Mset => out.extend_from_slice(b"+OK\r\n"),
        SplitKind::SumInt => {
            let total: i64 = parts.iter().filter_map(|(_, r)| int_value(r)).sum();
            out.extend_from_slice(format!(":{total}\r\n").as_bytes());
        }
        SplitKind::Pairs => {
            let mut all: Vec<(usize, &[u8])> = Vec::new();
            for (keys, reply) in parts {
                let Some(elements) = crate::resp::pair_elements(reply) else {
                    return out.extend_from_slice(reply);
                };
                for (&k, pair) in keys.iter().zip(elements.chunks(2)) {
                    all.extend(pair.iter().map(|&e| (k, e)));
                }
            }
            // A stable sort: each name stays before its count.
            all.sort_by_key(|(i, _)| *i);
            match parts.first() {
                Some((_, r)) if r.first() == Some(&b'%') => {
                    out.extend_from_slice(format!("%{}\r\n", all.len() / 2).as_bytes());
                }
                _ => out.extend_from_slice(format!("*{}\r\n", all.len()).as_bytes()),
            }
            for (_, e) in all {
                out.extend_from_slice(e);
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_are_merged_in_the_order_asked() {
        let merged = |parts: &[(Vec<usize>, Bytes)]| {
            let mut out = BytesMut::new();
            merge_split_replies(SplitKind::Pairs, parts, &mut out);
            out.to_vec()
        };
        let parts = [
            (vec![3], Bytes::from_static(b"*2\r\n$1\r\nc\r\n:3\r\n")),
            (
                vec![2, 4],
                Bytes::from_static(b"*4\r\n$1\r\nb\r\n:2\r\n$1\r\nd\r\n:4\r\n"),
            ),
        ];
        assert_eq!(
            merged(&parts),
            b"*6\r\n$1\r\nb\r\n:2\r\n$1\r\nc\r\n:3\r\n$1\r\nd\r\n:4\r\n"
        );
        let maps = [
            (vec![3], Bytes::from_static(b"%1\r\n$1\r\nc\r\n:3\r\n")),
            (vec![2], Bytes::from_static(b"%1\r\n$1\r\nb\r\n:2\r\n")),
        ];
        assert_eq!(merged(&maps), b"%2\r\n$1\r\nb\r\n:2\r\n$1\r\nc\r\n:3\r\n");
        let failed = [
            (vec![2], Bytes::from_static(b"*2\r\n$1\r\nb\r\n:2\r\n")),
            (vec![3], Bytes::from_static(b"-ERR down\r\n")),
        ];
        assert_eq!(merged(&failed), b"-ERR down\r\n");
    }
}
