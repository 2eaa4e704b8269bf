//! Cluster mode: SCAN over the masters one after another. The client's cursor is the
//! master's own cursor shifted left by [`NODE_BITS`], with the master's index in the low
//! bits (`routed::scan` sends the step). A master that is done hands over to the next one
//! within the same call while the keys found come short of COUNT (ten by default), so a
//! keyspace smaller than that is listed in one call ending with cursor 0, as one Redis lists
//! it, rather than in one call per master with empty pages between.

use bytes::{Bytes, BytesMut};

use super::client::Conn;
use super::routed::NODE_BITS;
use crate::resp::encode::encode_request;
use crate::resp::{Proto, bulk_body};

/// Redis's default SCAN COUNT.
const DEFAULT_COUNT: usize = 10;

/// A SCAN step under way ([`Then::Scan`](super::pending::Then::Scan)).
#[derive(Debug)]
pub(super) struct ScanWalk {
    /// The master asked, by its index among the cluster's masters.
    pub(super) node: usize,
    /// How many masters there were.
    pub(super) nodes: usize,
    /// The request's arguments after the cursor (MATCH, COUNT, TYPE), for the next masters.
    pub(super) rest: Vec<Bytes>,
    /// Keys that make a page worth returning (the request's COUNT).
    pub(super) count: usize,
    pub(super) proto: Proto,
    pub(super) client: u64,
}

impl ScanWalk {
    /// The step of a `SCAN cursor [options]` request (`args`, its cursor already read) on
    /// master `node` of `nodes`.
    pub(super) fn new<'a>(
        node: usize,
        nodes: usize,
        args: impl Iterator<Item = &'a [u8]>,
        proto: Proto,
        client: u64,
    ) -> ScanWalk {
        let rest: Vec<Bytes> = args.skip(2).map(Bytes::copy_from_slice).collect();
        // Options come in pairs; a malformed one is the first master's error to give.
        let count = rest
            .chunks(2)
            .find(|pair| pair[0].eq_ignore_ascii_case(b"COUNT"))
            .and_then(|pair| pair.get(1))
            .and_then(|n| std::str::from_utf8(n).ok()?.parse().ok())
            .unwrap_or(DEFAULT_COUNT);
        ScanWalk {
            node,
            nodes,
            rest,
            count,
            proto,
            client,
        }
    }
}

/// A master's SCAN reply: its cursor, the encoded keys after the array header, and their
/// number; `None` for anything else (an error).
fn page(reply: &[u8]) -> Option<(u64, &[u8], usize)> {
    let parts = crate::resp::array_elements(reply)?;
    let [cursor, keys] = parts.as_slice() else {
        return None;
    };
    let cursor = std::str::from_utf8(bulk_body(cursor)?).ok()?.parse().ok()?;
    let header_end = keys.windows(2).position(|w| w == b"\r\n")?;
    let n = std::str::from_utf8(keys.get(1..header_end)?)
        .ok()?
        .parse()
        .ok()?;
    (keys.first() == Some(&b'*')).then_some((cursor, &keys[header_end + 2..], n))
}

/// The client's reply: cursor `next` and `found` keys, encoded in `keys`.
fn encode(next: u64, keys: &[u8], found: usize, out: &mut BytesMut) {
    let next = next.to_string();
    out.extend_from_slice(format!("*2\r\n${}\r\n{next}\r\n*{found}\r\n", next.len()).as_bytes());
    out.extend_from_slice(keys);
}

impl Conn {
    /// Answers a SCAN step from master `walk.node`'s `reply`, going on to the next masters
    /// while each is done and the keys found come short of `walk.count`. A later master's
    /// error ends the call with the keys so far and a cursor at that master, which the
    /// client's next call asks again (and then gets the error).
    pub(super) async fn scan_walk(&mut self, reply: Bytes, walk: ScanWalk) {
        let Some(cluster) = self.shared.upstream.cluster.clone() else {
            return self.wbuf.extend_from_slice(&reply);
        };
        let (mut node, mut reply) = (walk.node, reply);
        let mut keys = BytesMut::new();
        let mut found = 0;
        let next = loop {
            let Some((inner, page_keys, n)) = page(&reply) else {
                if node == walk.node {
                    return self.wbuf.extend_from_slice(&reply);
                }
                break node as u64;
            };
            keys.extend_from_slice(page_keys);
            found += n;
            if inner != 0 {
                break (inner << NODE_BITS) | node as u64;
            }
            node += 1;
            if node >= walk.nodes {
                break 0;
            }
            if found >= walk.count {
                break node as u64;
            }
            let Some(addr) = cluster.masters().get(node).cloned() else {
                // Fewer masters now: past the last one the scan is over (`routed::scan`).
                break 0;
            };
            let mut argv: Vec<&[u8]> = vec![b"SCAN", b"0"];
            argv.extend(walk.rest.iter().map(|a| &a[..]));
            let mut req = BytesMut::new();
            encode_request(&argv, &mut req);
            let conn = cluster.conn_for(&addr, walk.proto, walk.client);
            let rx = conn.send(req.freeze(), 1).await;
            match self.wait(rx, &conn).await {
                Ok(b) => reply = b,
                Err(_) => break node as u64,
            }
        };
        encode(next, &keys, found, &mut self.wbuf);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_page_is_its_cursor_and_its_keys() {
        let (cursor, keys, n) = page(b"*2\r\n$2\r\n17\r\n*2\r\n$1\r\na\r\n$1\r\nb\r\n").unwrap();
        assert_eq!((cursor, keys, n), (17, &b"$1\r\na\r\n$1\r\nb\r\n"[..], 2));
        let (cursor, keys, n) = page(b"*2\r\n$1\r\n0\r\n*0\r\n").unwrap();
        assert_eq!((cursor, keys, n), (0, &b""[..], 0));
        assert!(page(b"-ERR syntax error\r\n").is_none());
    }

    #[test]
    fn count_comes_from_the_options() {
        let walk = |args: &[&[u8]]| ScanWalk::new(0, 3, args.iter().copied(), Proto::Resp2, 1);
        assert_eq!(walk(&[b"SCAN", b"0"]).count, DEFAULT_COUNT);
        assert_eq!(
            walk(&[b"SCAN", b"0", b"MATCH", b"k*", b"count", b"500"]).count,
            500
        );
        assert_eq!(walk(&[b"SCAN", b"0", b"COUNT"]).count, DEFAULT_COUNT);
        assert_eq!(walk(&[b"SCAN", b"0", b"TYPE", b"string"]).rest.len(), 2);
    }

    #[test]
    fn the_reply_counts_every_master_s_keys() {
        let mut out = BytesMut::new();
        encode(0, b"$1\r\na\r\n$1\r\nb\r\n", 2, &mut out);
        assert_eq!(&out[..], b"*2\r\n$1\r\n0\r\n*2\r\n$1\r\na\r\n$1\r\nb\r\n");
    }
}
