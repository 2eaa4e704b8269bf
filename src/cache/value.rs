//! A cached GET result, stored protocol-neutral and encoded per client, and the parsers for
//! the upstream replies that produce it.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::entry::Entry;
use crate::resp::digits::parse_int;
use crate::resp::{Encoder, Proto, ReplyScanner};

/// The result of a GET: a string, nil, or an error reply (e.g. WRONGTYPE).
#[derive(Debug, Clone)]
pub enum Value {
    /// A bulk string, kept as its whole reply frame (`$<len>\r\n<bytes>\r\n`, the same in
    /// RESP2 and RESP3) in one allocation: a hit touches one block of memory, counts one
    /// reference and copies it whole.
    Bulk(Arc<[u8]>),
    /// The key does not exist.
    Nil,
    /// An error reply, without the leading `-` and trailing CRLF.
    Error(Bytes),
    /// A local hit: the store's entry itself, whose short frames are inline in it.
    Cached(Arc<Entry>),
}

/// Two values are equal when Redis would send the same reply for them: a string read from
/// Redis and the entry it was stored in are.
impl PartialEq for Value {
    fn eq(&self, other: &Value) -> bool {
        let reply = |v: &Value| {
            let mut out = BytesMut::new();
            v.encode(Proto::Resp3, &mut out);
            out
        };
        reply(self) == reply(other)
    }
}

impl Eq for Value {}

/// A GET reply as read, borrowed from the reply bytes: what [`Value::from_get_reply`] copies
/// into a value of its own, and what a fill's entry copies into itself instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GetReply<'a> {
    /// A bulk string's whole frame (`$<len>\r\n<bytes>\r\n`).
    Bulk(&'a [u8]),
    /// Nil, in either protocol.
    Nil,
    /// An error reply's text, without the `-` and the CRLF.
    Error(&'a [u8]),
}

impl GetReply<'_> {
    /// Parses a GET reply in either protocol (`$n`, `$-1`, `_`, `-ERR`); `None` for anything
    /// else.
    pub fn parse(reply: &[u8]) -> Option<GetReply<'_>> {
        let (&kind, _) = reply.split_first()?;
        let cr = reply.iter().position(|&b| b == b'\r')?;
        match kind {
            b'_' => Some(GetReply::Nil),
            b'-' => Some(GetReply::Error(&reply[1..cr])),
            b'$' => match parse_int(&reply[1..cr])? {
                -1 => Some(GetReply::Nil),
                n if n >= 0 => {
                    let end = cr + 2 + n as usize + 2;
                    let frame = reply.get(..end)?;
                    frame.ends_with(b"\r\n").then_some(GetReply::Bulk(frame))
                }
                _ => None,
            },
            _ => None,
        }
    }

    /// A value of its own.
    pub fn to_value(self) -> Value {
        match self {
            GetReply::Bulk(frame) => Value::Bulk(Arc::from(frame)),
            GetReply::Nil => Value::Nil,
            GetReply::Error(e) => Value::Error(Bytes::copy_from_slice(e)),
        }
    }

    /// The string's size, as [`Value::size`].
    pub fn size(self) -> usize {
        match self {
            GetReply::Bulk(frame) => Value::frame_size(frame),
            GetReply::Nil => 0,
            GetReply::Error(e) => e.len(),
        }
    }
}

impl Value {
    /// A bulk string with these bytes.
    pub fn bulk(bytes: &[u8]) -> Value {
        let mut frame = BytesMut::with_capacity(bytes.len() + 16);
        Encoder {
            proto: Proto::Resp2,
            out: &mut frame,
        }
        .bulk(bytes);
        Value::Bulk(Arc::from(&frame[..]))
    }

    /// Writes the reply Redis would send in `proto`.
    pub fn encode(&self, proto: Proto, out: &mut BytesMut) {
        match self {
            Value::Bulk(frame) => out.extend_from_slice(frame),
            Value::Nil => Encoder { proto, out }.null(),
            Value::Error(msg) => {
                out.extend_from_slice(b"-");
                out.extend_from_slice(msg);
                out.extend_from_slice(b"\r\n");
            }
            Value::Cached(e) => e.encode(proto, out),
        }
    }

    /// The store's entry, for a local hit.
    pub fn entry(&self) -> Option<&Entry> {
        match self {
            Value::Cached(e) => Some(e),
            _ => None,
        }
    }

    /// Bytes the value occupies, for the cache's memory budget and `max_value_bytes`: the
    /// string's length, without its frame.
    pub fn size(&self) -> usize {
        match self {
            Value::Bulk(frame) => Value::frame_size(frame),
            Value::Error(b) => b.len(),
            Value::Nil => 0,
            Value::Cached(e) => e.size(),
        }
    }

    /// About how many bytes its reply takes, for where a reply may be copied: the frame's
    /// length, known without reading the frame ([`Value::size`] finds its header's end).
    pub fn reply_len(&self) -> usize {
        match self {
            Value::Bulk(frame) => frame.len(),
            Value::Error(b) => b.len() + 3,
            Value::Nil => 5,
            Value::Cached(e) => e.reply_len(),
        }
    }

    /// The length of the string in a bulk reply frame.
    pub(super) fn frame_size(frame: &[u8]) -> usize {
        let header = frame.iter().position(|&b| b == b'\n').map_or(0, |i| i + 1);
        frame.len().saturating_sub(header + 2)
    }

    /// Parses a GET reply in either protocol (`$n`, `$-1`, `_`, `-ERR`); `None` for anything
    /// else. The frame is copied into its own allocation so a cached entry does not keep a
    /// whole read buffer alive.
    pub fn from_get_reply(reply: &[u8]) -> Option<Value> {
        GetReply::parse(reply).map(GetReply::to_value)
    }
}

/// Parses the replies to a fill: `PTTL k` + `GET k` (`:pttl`, then the GET reply), or the
/// same inside `MULTI`/`EXEC` (`+OK`, `+QUEUED`, `+QUEUED`, `*2 :pttl <GET reply>`), with any
/// push frames between them skipped (the lane's observer has applied them). Returns the PTTL
/// and the GET reply, or the error text when the fill did not run as expected.
pub fn parse_fill_reply(replies: &[u8]) -> Result<(i64, GetReply<'_>), String> {
    let mut scanner = ReplyScanner::new();
    let mut start = 0;
    // On the stack: a vector cost an allocation per fill. More than 4 is an error anyway.
    let mut frames: [&[u8]; 5] = [&[]; 5];
    let mut n = 0;
    while let Some(f) = scanner.next_frame(replies).map_err(|e| e.to_string())? {
        if !f.push {
            if let Some(slot) = frames.get_mut(n) {
                *slot = &replies[start..f.end];
            }
            n += 1;
        }
        start = f.end;
    }
    let (pttl, get) = match *frames.get(..n).unwrap_or(&frames[..]) {
        [pttl, get] => (pttl, get),
        [ok, q1, q2, exec] => {
            if let Some(e) = [ok, q1, q2].iter().find_map(|r| r.strip_prefix(b"-")) {
                return Err(error_text(e));
            }
            let body = exec
                .strip_prefix(b"*2\r\n")
                .ok_or_else(|| format!("unexpected EXEC reply {}", preview(exec)))?;
            let cr = body
                .iter()
                .position(|&b| b == b'\r')
                .ok_or("bad EXEC reply")?;
            body.split_at(cr + 2)
        }
        _ => return Err(format!("fill got {n} replies")),
    };
    if let Some(e) = pttl.strip_prefix(b"-") {
        return Err(error_text(e));
    }
    let pttl = pttl
        .strip_prefix(b":")
        .and_then(|n| parse_int(&n[..n.len() - 2]))
        .ok_or_else(|| format!("unexpected PTTL reply {}", preview(pttl)))?;
    let reply = GetReply::parse(get).ok_or("bad GET reply in fill")?;
    Ok((pttl, reply))
}

/// An error reply's text, without its CRLF.
fn error_text(e: &[u8]) -> String {
    String::from_utf8_lossy(e.strip_suffix(b"\r\n").unwrap_or(e)).into_owned()
}

/// The start of a reply, for an error message.
fn preview(r: &[u8]) -> String {
    format!("{:?}", String::from_utf8_lossy(&r[..r.len().min(64)]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn get_replies_parse_in_both_protocols() {
        assert_eq!(
            Value::from_get_reply(b"$3\r\na\r\n\r\n"),
            Some(Value::bulk(b"a\r\n"))
        );
        assert_eq!(Value::from_get_reply(b"$-1\r\n"), Some(Value::Nil));
        assert_eq!(Value::from_get_reply(b"_\r\n"), Some(Value::Nil));
        assert_eq!(
            Value::from_get_reply(b"-WRONGTYPE x\r\n"),
            Some(Value::Error(Bytes::from_static(b"WRONGTYPE x")))
        );
        assert_eq!(Value::from_get_reply(b":1\r\n"), None);
        assert_eq!(Value::from_get_reply(b"$3\r\nab"), None);
    }

    #[test]
    fn a_bulk_counts_its_string_not_its_frame() {
        assert_eq!(Value::bulk(b"hello").size(), 5);
        assert_eq!(Value::bulk(b"").size(), 0);
        assert_eq!(Value::bulk(&[b'x'; 1000]).size(), 1000);
        assert_eq!(
            Value::from_get_reply(b"$2\r\nhi\r\n").map(|v| v.size()),
            Some(2)
        );
    }

    #[test]
    fn encodes_per_protocol() {
        let mut out = BytesMut::new();
        Value::Nil.encode(Proto::Resp2, &mut out);
        Value::Nil.encode(Proto::Resp3, &mut out);
        Value::bulk(b"v").encode(Proto::Resp3, &mut out);
        assert_eq!(&out[..], b"$-1\r\n_\r\n$1\r\nv\r\n");
    }

    #[test]
    fn fill_reply_gives_ttl_and_value() {
        let r = b":1500\r\n$2\r\nhi\r\n";
        assert_eq!(
            parse_fill_reply(r),
            Ok((1500, GetReply::Bulk(b"$2\r\nhi\r\n")))
        );
        assert_eq!(parse_fill_reply(b":-2\r\n_\r\n"), Ok((-2, GetReply::Nil)));
        // An invalidation push between the replies is skipped.
        let r = b":-1\r\n>2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nk\r\n$1\r\nv\r\n";
        assert_eq!(
            parse_fill_reply(r),
            Ok((-1, GetReply::Bulk(b"$1\r\nv\r\n")))
        );
        let moved = b"-MOVED 1 127.0.0.1:7000\r\n-MOVED 1 127.0.0.1:7000\r\n";
        assert_eq!(
            parse_fill_reply(moved),
            Err("MOVED 1 127.0.0.1:7000".to_string())
        );
        // The fallback's transaction.
        let r = b"+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n:1500\r\n$2\r\nhi\r\n";
        assert_eq!(
            parse_fill_reply(r),
            Ok((1500, GetReply::Bulk(b"$2\r\nhi\r\n")))
        );
        let r = b"+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n:-2\r\n_\r\n";
        assert_eq!(parse_fill_reply(r), Ok((-2, GetReply::Nil)));
        assert!(parse_fill_reply(b"+OK\r\n+QUEUED\r\n+QUEUED\r\n*-1\r\n").is_err());
        let r = b"+OK\r\n-MOVED 1 127.0.0.1:7000\r\n+QUEUED\r\n-EXECABORT x\r\n";
        assert_eq!(
            parse_fill_reply(r),
            Err("MOVED 1 127.0.0.1:7000".to_string())
        );
        assert!(parse_fill_reply(b":5\r\n").is_err());
        assert!(parse_fill_reply(b"$1\r\nv\r\n$1\r\nv\r\n").is_err());
    }
}
