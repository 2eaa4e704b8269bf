//! Assembling an MGET reply from cached values and the upstream's reply for the rest.

use bytes::BytesMut;

use crate::cache::Value;
use crate::resp::{Encoder, Proto};

/// Writes the MGET reply: `parts` in key order, each `None` taken in turn from the elements
/// of `fetched` (the upstream's reply to an MGET of exactly those keys). An upstream error
/// reply, or a reply that does not fit, is passed on as it is.
pub fn merge(parts: &[Option<Value>], fetched: Option<&[u8]>, proto: Proto, out: &mut BytesMut) {
    let elements = match fetched {
        Some(reply) => match crate::resp::array_elements(reply) {
            Some(e) if e.len() == parts.iter().filter(|p| p.is_none()).count() => e,
            _ => {
                out.extend_from_slice(reply);
                return;
            }
        },
        None => Vec::new(),
    };
    let mut fetched = elements.into_iter();
    Encoder { proto, out }.array(parts.len());
    for part in parts {
        match part {
            Some(v) => v.encode(proto, out),
            None => out.extend_from_slice(fetched.next().unwrap_or(b"$-1\r\n")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaves_cached_and_fetched_in_key_order() {
        let parts = vec![Some(Value::bulk(b"a")), None, Some(Value::Nil), None];
        let mut out = BytesMut::new();
        merge(
            &parts,
            Some(b"*2\r\n$1\r\nb\r\n$-1\r\n"),
            Proto::Resp2,
            &mut out,
        );
        assert_eq!(&out[..], b"*4\r\n$1\r\na\r\n$1\r\nb\r\n$-1\r\n$-1\r\n");
    }

    #[test]
    fn all_cached_needs_no_reply() {
        let parts = vec![Some(Value::Nil)];
        let mut out = BytesMut::new();
        merge(&parts, None, Proto::Resp3, &mut out);
        assert_eq!(&out[..], b"*1\r\n_\r\n");
    }

    #[test]
    fn errors_pass_through() {
        let parts = vec![Some(Value::Nil), None];
        let mut out = BytesMut::new();
        merge(&parts, Some(b"-ERR boom\r\n"), Proto::Resp2, &mut out);
        assert_eq!(&out[..], b"-ERR boom\r\n");
    }
}
