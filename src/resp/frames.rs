//! Splitting complete replies into their frames: the one place the connection layer cuts a
//! buffer of replies (a batch's, or an array's elements) into pieces.

use super::digits::parse_int;
use super::scan::ReplyScanner;

/// One complete top-level frame of a buffer of replies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// The frame's bytes.
    pub bytes: &'a [u8],
    /// Where it starts in the buffer.
    pub start: usize,
    /// It is a RESP3 push (`>`), not a reply to a request.
    pub push: bool,
}

impl Frame<'_> {
    /// Offset just past the frame in the buffer.
    pub fn end(&self) -> usize {
        self.start + self.bytes.len()
    }
}

/// The complete frames at the start of `buf`, in order; stops at an incomplete or invalid one.
pub fn frames(buf: &[u8]) -> Frames<'_> {
    Frames {
        buf,
        scanner: ReplyScanner::new(),
        start: 0,
    }
}

/// Iterator returned by [`frames`].
#[derive(Debug)]
pub struct Frames<'a> {
    buf: &'a [u8],
    scanner: ReplyScanner,
    start: usize,
}

impl Frames<'_> {
    /// Bytes taken by the frames returned so far.
    pub fn consumed(&self) -> usize {
        self.start
    }
}

impl<'a> Iterator for Frames<'a> {
    type Item = Frame<'a>;

    fn next(&mut self) -> Option<Frame<'a>> {
        let f = self.scanner.next_frame(self.buf).ok()??;
        let frame = Frame {
            bytes: &self.buf[self.start..f.end],
            start: self.start,
            push: f.push,
        };
        self.start = f.end;
        Some(frame)
    }
}

/// An array reply split into its header (`*N\r\n`) and its raw elements; `None` if it is not
/// a complete array of exactly `N` elements.
pub fn array_parts(reply: &[u8]) -> Option<(&[u8], Vec<&[u8]>)> {
    aggregate_parts(reply, b'*')
}

/// The elements of a reply of name-value pairs, flat: an array of `2N` (RESP2, and RESP3
/// where Redis sends one) or a RESP3 map of `N` pairs; `None` for anything else.
pub fn pair_elements(reply: &[u8]) -> Option<Vec<&[u8]>> {
    let elements = match reply.first() {
        Some(b'%') => aggregate(reply, b'%', 2)?.1,
        _ => aggregate(reply, b'*', 1)?.1,
    };
    elements.len().is_multiple_of(2).then_some(elements)
}

/// A RESP3 push (`>N\r\n`, such as an invalidation) split into its raw elements; `None` if
/// it is not a complete push of exactly `N` elements.
pub fn push_elements(frame: &[u8]) -> Option<Vec<&[u8]>> {
    aggregate_parts(frame, b'>').map(|(_, elements)| elements)
}

/// Whether `frame` is a null: RESP3's `_`, or RESP2's null bulk or array.
pub fn is_null(frame: &[u8]) -> bool {
    matches!(frame, b"_\r\n" | b"$-1\r\n" | b"*-1\r\n")
}

/// An aggregate of type `kind` (`*`, `>`) split into its header and its raw elements.
fn aggregate_parts(reply: &[u8], kind: u8) -> Option<(&[u8], Vec<&[u8]>)> {
    aggregate(reply, kind, 1)
}

/// [`aggregate_parts`] for an aggregate whose header counts `per` elements as one (a map's
/// counts pairs).
fn aggregate(reply: &[u8], kind: u8, per: i64) -> Option<(&[u8], Vec<&[u8]>)> {
    let rest = reply.strip_prefix(&[kind])?;
    let cr = rest.iter().position(|&b| b == b'\r')?;
    let n = parse_int(&rest[..cr])?.checked_mul(per)?;
    let header_end = 1 + cr + 2;
    let body = reply.get(header_end..)?;
    let mut iter = frames(body);
    let mut out = Vec::with_capacity(usize::try_from(n).ok()?);
    out.extend(iter.by_ref().map(|f| f.bytes));
    (out.len() as i64 == n && iter.consumed() == body.len()).then_some((&reply[..header_end], out))
}

/// The integer of a `:n\r\n` frame (exactly one frame).
pub fn int_value(frame: &[u8]) -> Option<i64> {
    parse_int(frame.strip_prefix(b":")?.strip_suffix(b"\r\n")?)
}

/// The body of a `$len\r\nbody\r\n` frame; `None` for any other frame (a null included).
pub fn bulk_body(frame: &[u8]) -> Option<&[u8]> {
    let rest = frame.strip_prefix(b"$")?;
    let cr = rest.iter().position(|&b| b == b'\r')?;
    let len = usize::try_from(parse_int(&rest[..cr])?).ok()?;
    rest.get(cr + 2..cr + 2 + len)
}

/// The raw elements of an array reply, or `None` if it is not a complete array.
pub fn array_elements(reply: &[u8]) -> Option<Vec<&[u8]>> {
    array_parts(reply).map(|(_, elements)| elements)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_come_flat_from_arrays_and_maps() {
        let flat = vec![&b"$1\r\na\r\n"[..], b":1\r\n"];
        assert_eq!(
            pair_elements(b"*2\r\n$1\r\na\r\n:1\r\n"),
            Some(flat.clone())
        );
        assert_eq!(pair_elements(b"%1\r\n$1\r\na\r\n:1\r\n"), Some(flat));
        assert_eq!(pair_elements(b"*0\r\n"), Some(vec![]));
        assert_eq!(pair_elements(b"*1\r\n$1\r\na\r\n"), None, "a name alone");
        assert_eq!(
            pair_elements(b"%1\r\n$1\r\na\r\n"),
            None,
            "a map short of a value"
        );
        assert_eq!(pair_elements(b"-ERR x\r\n"), None);
    }

    #[test]
    fn pushes_split_into_their_elements() {
        let push = b">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\na\r\n";
        assert_eq!(
            push_elements(push),
            Some(vec![&b"$10\r\ninvalidate\r\n"[..], b"*1\r\n$1\r\na\r\n"])
        );
        assert_eq!(push_elements(b"*1\r\n$1\r\na\r\n"), None, "an array");
        assert_eq!(
            push_elements(b">2\r\n$1\r\na\r\n"),
            None,
            "one element short"
        );
        assert_eq!(
            push_elements(b">1\r\n$1\r\na\r\n:1\r\n"),
            None,
            "one too many"
        );
        assert!(is_null(b"_\r\n") && is_null(b"*-1\r\n") && is_null(b"$-1\r\n"));
        assert!(!is_null(b"*0\r\n") && !is_null(b"$0\r\n\r\n"));
    }

    #[test]
    fn scalar_frames() {
        assert_eq!(int_value(b":42\r\n"), Some(42));
        assert_eq!(int_value(b"-ERR x\r\n"), None);
        assert_eq!(bulk_body(b"$3\r\n123\r\n"), Some(&b"123"[..]));
        assert_eq!(bulk_body(b"$0\r\n\r\n"), Some(&b""[..]));
        assert_eq!(bulk_body(b"$-1\r\n"), None);
    }

    #[test]
    fn splits_top_level_frames_and_stops_at_a_partial_one() {
        let buf = b"+OK\r\n>2\r\n$1\r\na\r\n$1\r\nb\r\n:1\r\n$5\r\nab";
        let all: Vec<_> = frames(buf).map(|f| (f.bytes, f.push)).collect();
        assert_eq!(
            all,
            [
                (&b"+OK\r\n"[..], false),
                (&b">2\r\n$1\r\na\r\n$1\r\nb\r\n"[..], true),
                (&b":1\r\n"[..], false)
            ]
        );
    }

    #[test]
    fn array_elements_need_the_whole_array() {
        assert_eq!(
            array_elements(b"*2\r\n$1\r\na\r\n*1\r\n:1\r\n"),
            Some(vec![&b"$1\r\na\r\n"[..], b"*1\r\n:1\r\n"])
        );
        assert_eq!(array_elements(b"*2\r\n$1\r\na\r\n"), None);
        assert_eq!(array_elements(b"*0\r\n"), Some(vec![]));
        assert_eq!(array_elements(b"$1\r\na\r\n"), None);
    }
}
