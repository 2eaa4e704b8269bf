//! Receiver counts that see corral's own subscribers: Redis counts corral's one upstream
//! subscription per channel or pattern, whatever the number of clients behind it. PUBLISH,
//! SPUBLISH, PUBSUB NUMSUB and PUBSUB SHARDNUMSUB replies are corrected with what corral knows
//! of its subscriptions when the reply arrives (see `pubsub::Hub::count_delta`).
//!
//! PUBSUB NUMPAT, CHANNELS and SHARDCHANNELS need nothing: corral's upstream subscriptions
//! are exactly the union of its clients' ones, and Redis counts distinct patterns and lists
//! distinct channels.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use crate::pubsub::{Kind, Router};
use crate::resp::Args;
use crate::resp::{bulk_body, int_value};

/// A reply whose counts need correcting.
#[derive(Debug)]
pub(super) enum Count {
    /// PUBLISH (`Kind::Channel`: channel and pattern subscribers) or SPUBLISH (`Kind::Shard`).
    Publish { kind: Kind, channel: Bytes },
    /// PUBSUB NUMSUB (`Kind::Channel`) or SHARDNUMSUB (`Kind::Shard`): `[name, count]...`.
    NumSub { kind: Kind },
}

/// The correction a request's reply needs, if it is one of those commands.
pub(super) fn count_of(args: &Args<'_>) -> Option<Count> {
    let name = args.get(0)?;
    let publish = |kind| {
        (args.len() == 3).then(|| Count::Publish {
            kind,
            channel: Bytes::copy_from_slice(args.get(1).unwrap_or_default()),
        })
    };
    if name.eq_ignore_ascii_case(b"PUBLISH") {
        return publish(Kind::Channel);
    }
    if name.eq_ignore_ascii_case(b"SPUBLISH") {
        return publish(Kind::Shard);
    }
    if name.eq_ignore_ascii_case(b"PUBSUB") {
        let sub = args.get(1)?;
        if sub.eq_ignore_ascii_case(b"NUMSUB") {
            return Some(Count::NumSub {
                kind: Kind::Channel,
            });
        }
        if sub.eq_ignore_ascii_case(b"SHARDNUMSUB") {
            return Some(Count::NumSub { kind: Kind::Shard });
        }
    }
    None
}

/// Corrects `reply` (one reply frame from Redis) for corral's subscribers on `hubs` (corral's
/// and each Redis user's: Redis counts one upstream subscription of each); anything that is
/// not the expected shape (an error) is returned unchanged.
pub(super) fn correct(count: &Count, reply: Bytes, hubs: &[Arc<Router>]) -> Bytes {
    let delta = |kind: Kind, name: &[u8], patterns: bool| {
        hubs.iter()
            .filter_map(|h| h.count_delta(kind, name, patterns))
            .reduce(|a, b| a + b)
    };
    match count {
        Count::Publish { kind, channel } => match delta(*kind, channel, true) {
            Some(delta) => adjust_int(&reply, delta).unwrap_or(reply),
            None => reply,
        },
        Count::NumSub { kind } => {
            if hubs.iter().all(|h| h.counts_exact()) {
                return reply;
            }
            numsub(&reply, |name| delta(*kind, name, false).unwrap_or(0)).unwrap_or(reply)
        }
    }
}

/// `:n\r\n` with `delta` added (never below 0: a count raced with an (un)subscribe).
fn adjust_int(reply: &[u8], delta: i64) -> Option<Bytes> {
    let n = int_value(reply)?;
    let mut out = BytesMut::with_capacity(reply.len() + 4);
    out.extend_from_slice(b":");
    out.extend_from_slice(
        itoa::Buffer::new()
            .format(n.saturating_add(delta).max(0))
            .as_bytes(),
    );
    out.extend_from_slice(b"\r\n");
    Some(out.freeze())
}

/// A NUMSUB reply (`*2n` then `name`, `:count` pairs) with each count corrected by
/// `delta(name)`.
fn numsub(reply: &[u8], delta: impl Fn(&[u8]) -> i64) -> Option<Bytes> {
    let (header, frames) = crate::resp::array_parts(reply)?;
    if !frames.len().is_multiple_of(2) {
        return None;
    }
    let mut out = BytesMut::with_capacity(reply.len() + 16);
    out.extend_from_slice(header);
    for pair in frames.chunks(2) {
        let (name_frame, count) = (pair[0], pair[1]);
        let name = bulk_body(name_frame)?;
        out.extend_from_slice(name_frame);
        out.extend_from_slice(&adjust_int(count, delta(name))?);
    }
    Some(out.freeze())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_corrected_and_never_negative() {
        assert_eq!(&adjust_int(b":3\r\n", -1).unwrap()[..], b":2\r\n");
        assert_eq!(&adjust_int(b":1\r\n", 4).unwrap()[..], b":5\r\n");
        assert_eq!(&adjust_int(b":0\r\n", -1).unwrap()[..], b":0\r\n");
        assert!(adjust_int(b"-ERR x\r\n", 1).is_none());
    }

    #[test]
    fn numsub_pairs_are_corrected_by_name() {
        let reply = b"*4\r\n$1\r\na\r\n:1\r\n$2\r\nbb\r\n:0\r\n";
        let out = numsub(reply, |n| if n == b"a" { 2 } else { 0 }).unwrap();
        assert_eq!(&out[..], b"*4\r\n$1\r\na\r\n:3\r\n$2\r\nbb\r\n:0\r\n");
        assert_eq!(&numsub(b"*0\r\n", |_| 1).unwrap()[..], b"*0\r\n");
        assert!(numsub(b"-ERR x\r\n", |_| 1).is_none());
    }
}
