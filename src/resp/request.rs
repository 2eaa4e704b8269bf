//! Incremental parser for client requests: RESP arrays of bulk strings and inline commands,
//! with Redis's limits and error texts.
//!
//! `redis-protocol` re-parses a partial frame from its start on every read and has no size
//! limits or inline support, so the request path uses this offset-based parser instead (see
//! `benches/codec.rs` for the comparison). Parsing resumes where the last call stopped, so a
//! large request arriving in small pieces costs time linear in its size.

use std::ops::Range;

use super::digits::{digits_line, parse_int};

/// Limits applied while parsing, mirroring Redis's.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest bulk string (`proto-max-bulk-len`).
    pub max_bulk_len: usize,
    /// Most elements in one request array.
    pub max_multibulk_len: usize,
    /// Longest inline request line, and longest `*`/`$` header line.
    pub max_inline_len: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_bulk_len: 512 * 1024 * 1024,
            max_multibulk_len: i32::MAX as usize,
            max_inline_len: 64 * 1024,
        }
    }
}

/// Redis lets clients that still have to authenticate send only small requests.
const UNAUTH_MAX_MULTIBULK: usize = 10;
const UNAUTH_MAX_BULK: usize = 16 * 1024;

/// A request Redis would reject with `-ERR Protocol error: ...` and then close the connection.
/// The message is bytes: Redis echoes the offending byte as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProtocolError(pub Vec<u8>);

impl ProtocolError {
    fn new(msg: &str) -> Self {
        ProtocolError(msg.as_bytes().to_vec())
    }

    /// The message, for logs.
    pub fn message(&self) -> String {
        String::from_utf8_lossy(&self.0).into_owned()
    }

    /// The error reply Redis sends before closing the connection; like Redis, CR and LF in
    /// the message become spaces so the reply stays one line.
    pub fn to_reply(&self) -> Vec<u8> {
        crate::error::replies::protocol_error(&self.0)
    }
}

/// One complete request found at the start of the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parsed {
    /// A RESP array of bulk strings, `len` bytes long; its arguments are in [`RequestParser::args`].
    Multibulk {
        /// Bytes the request takes in the buffer.
        len: usize,
    },
    /// An inline command line, `len` bytes long; its arguments are in [`RequestParser::args`].
    Inline {
        /// Bytes the request takes in the buffer.
        len: usize,
    },
    /// An empty line or an empty/null array: no command; skip `len` bytes.
    Empty {
        /// Bytes to skip.
        len: usize,
    },
}

/// Arguments of the last parsed request.
#[derive(Debug, Clone, Copy)]
pub enum Args<'a> {
    /// Offsets into the request buffer.
    Ranges(&'a [u8], &'a [Range<usize>]),
    /// Unquoted inline arguments.
    Owned(&'a [Vec<u8>]),
}

impl<'a> Args<'a> {
    /// Number of arguments, the command name included.
    pub fn len(&self) -> usize {
        match self {
            Args::Ranges(_, r) => r.len(),
            Args::Owned(v) => v.len(),
        }
    }

    /// True when there are no arguments.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Argument `i`; `None` past the end.
    pub fn get(&self, i: usize) -> Option<&'a [u8]> {
        match self {
            Args::Ranges(buf, r) => r.get(i).map(|r| &buf[r.clone()]),
            Args::Owned(v) => v.get(i).map(Vec::as_slice),
        }
    }

    /// Iterates over all arguments.
    pub fn iter(&self) -> impl Iterator<Item = &'a [u8]> + '_ {
        (0..self.len()).filter_map(|i| self.get(i))
    }
}

#[derive(Debug, Default)]
enum State {
    #[default]
    Start,
    /// Inside an array: `expected` elements, resume scanning at `pos`.
    Multibulk { expected: usize, pos: usize },
}

/// Resumable request parser. Feed it the same buffer (grown by new reads, never consumed at
/// the front) until it returns a request; then consume that request and call again.
#[derive(Debug, Default)]
pub struct RequestParser {
    limits: Limits,
    state: State,
    ranges: Vec<Range<usize>>,
    owned: Vec<Vec<u8>>,
    inline: bool,
    need: usize,
}

impl RequestParser {
    /// A parser enforcing `limits`.
    pub fn new(limits: Limits) -> Self {
        RequestParser {
            limits,
            ..Default::default()
        }
    }

    /// Whether a complete request of `args` bulk strings, none longer than `longest`, is
    /// within the limits this parser enforces on an authenticated client's requests.
    pub fn within_limits(&self, args: usize, longest: usize) -> bool {
        args <= self.limits.max_multibulk_len && longest <= self.limits.max_bulk_len
    }

    /// Whether no request is part-way parsed: the next [`RequestParser::parse`] starts at the
    /// buffer's first byte, so a request there may be taken by other means and skipped.
    pub fn at_start(&self) -> bool {
        matches!(self.state, State::Start)
    }

    /// Arguments of the request last returned by [`RequestParser::parse`]; `buf` is the buffer
    /// that was parsed.
    pub fn args<'a>(&'a self, buf: &'a [u8]) -> Args<'a> {
        if self.inline {
            Args::Owned(&self.owned)
        } else {
            Args::Ranges(buf, &self.ranges)
        }
    }

    /// Total buffer size known to be needed to finish the current request (0 if unknown), so
    /// the caller can reserve room for a large bulk string at once.
    pub fn needed(&self) -> usize {
        self.need
    }

    /// Parses one request at the start of `buf`. `Ok(None)` means more bytes are needed.
    ///
    /// # Errors
    /// Input that Redis rejects as a protocol error; the connection should be closed after
    /// replying with [`ProtocolError::to_reply`].
    pub fn parse(
        &mut self,
        buf: &[u8],
        authenticated: bool,
    ) -> Result<Option<Parsed>, ProtocolError> {
        if let State::Start = self.state {
            let Some(&first) = buf.first() else {
                return Ok(None);
            };
            if first != b'*' {
                return self.parse_inline(buf);
            }
            let Some((count, pos)) = self.header(buf, 1, "too big mbulk count string")? else {
                return Ok(None);
            };
            let count = match count {
                Some(n) if n <= 0 => return Ok(Some(Parsed::Empty { len: pos })),
                Some(n) if (n as u64) <= self.limits.max_multibulk_len as u64 => n as usize,
                _ => return Err(ProtocolError::new("invalid multibulk length")),
            };
            if !authenticated && count > UNAUTH_MAX_MULTIBULK {
                return Err(ProtocolError::new("unauthenticated multibulk length"));
            }
            self.ranges.clear();
            self.ranges.reserve(count.min(1024));
            self.state = State::Multibulk {
                expected: count,
                pos,
            };
        }
        self.parse_bulks(buf, authenticated)
    }

    fn parse_bulks(
        &mut self,
        buf: &[u8],
        authenticated: bool,
    ) -> Result<Option<Parsed>, ProtocolError> {
        let State::Multibulk { expected, mut pos } = self.state else {
            return Ok(None);
        };
        while self.ranges.len() < expected {
            if pos >= buf.len() {
                break;
            }
            // Like Redis, wait for the whole header line before looking at its type byte.
            let Some((len, data)) = self.header(&buf[pos..], 1, "too big bulk count string")?
            else {
                break;
            };
            if buf[pos] != b'$' {
                let mut msg = b"expected '$', got '".to_vec();
                msg.extend_from_slice(&[buf[pos], b'\'']);
                return Err(ProtocolError(msg));
            }
            let len = match len {
                Some(n) if n >= 0 && (n as u64) <= self.limits.max_bulk_len as u64 => n as usize,
                _ => return Err(ProtocolError::new("invalid bulk length")),
            };
            if !authenticated && len > UNAUTH_MAX_BULK {
                return Err(ProtocolError::new("unauthenticated bulk length"));
            }
            let start = pos + data;
            // Redis skips the two bytes after the payload without checking them; so do we.
            let end = start + len + 2;
            if buf.len() < end {
                self.need = end;
                break;
            }
            self.ranges.push(start..start + len);
            pos = end;
        }
        if self.ranges.len() < expected {
            self.state = State::Multibulk { expected, pos };
            return Ok(None);
        }
        self.state = State::Start;
        self.need = 0;
        self.inline = false;
        Ok(Some(Parsed::Multibulk { len: pos }))
    }

    /// Parses a `<prefix><integer>\r\n` line at the start of `buf`. Returns the integer
    /// (`None` if not a valid one) and the offset after the line.
    #[allow(clippy::type_complexity)]
    #[inline(always)]
    fn header(
        &self,
        buf: &[u8],
        skip: usize,
        too_big: &str,
    ) -> Result<Option<(Option<i64>, usize)>, ProtocolError> {
        match short_header(buf, skip, self.limits.max_inline_len) {
            Some(found) => Ok(Some(found)),
            None => self.long_header(buf, skip, too_big),
        }
    }

    /// [`RequestParser::header`] for any line. Kept out of line: inlined, its registers and
    /// stack made every call of the short path pay for it.
    #[allow(clippy::type_complexity)]
    #[inline(never)]
    fn long_header(
        &self,
        buf: &[u8],
        skip: usize,
        too_big: &str,
    ) -> Result<Option<(Option<i64>, usize)>, ProtocolError> {
        let scan = &buf[..buf.len().min(self.limits.max_inline_len + skip + 1)];
        match memchr(b'\r', scan) {
            // Redis needs the '\n' too before it goes on.
            Some(cr) if cr + 1 < buf.len() => {
                let digits = buf.get(skip..cr).unwrap_or_default();
                Ok(Some((parse_int(digits), cr + 2)))
            }
            Some(_) => Ok(None),
            None if buf.len() > self.limits.max_inline_len => Err(ProtocolError::new(too_big)),
            None => Ok(None),
        }
    }

    fn parse_inline(&mut self, buf: &[u8]) -> Result<Option<Parsed>, ProtocolError> {
        let scan = &buf[..buf.len().min(self.limits.max_inline_len + 1)];
        let Some(nl) = memchr(b'\n', scan) else {
            if buf.len() > self.limits.max_inline_len {
                return Err(ProtocolError::new("too big inline request"));
            }
            return Ok(None);
        };
        let mut line = &buf[..nl];
        if let Some(stripped) = line.strip_suffix(b"\r") {
            line = stripped;
        }
        // Redis splits the line as a C string: nothing after a NUL byte counts.
        if let Some(nul) = memchr(0, line) {
            line = &line[..nul];
        }
        self.owned.clear();
        split_args(line, &mut self.owned)
            .ok_or_else(|| ProtocolError::new("unbalanced quotes in request"))?;
        if self.owned.is_empty() {
            return Ok(Some(Parsed::Empty { len: nl + 1 }));
        }
        self.inline = true;
        Ok(Some(Parsed::Inline { len: nl + 1 }))
    }
}

/// The common header line, read in one pass: after `skip` bytes, a [`digits_line`] of no more
/// than `max_line` digits, as [`RequestParser::header`] returns it. `None` for anything else,
/// which `header` then reads the long way, with Redis's errors: this path accepts only lines
/// that way reads the same, so it changes no outcome. Three header lines make a GET, and
/// searching each for its CR before reading its digits was a fifth of the instructions
/// corral spent on one.
#[inline(always)]
fn short_header(buf: &[u8], skip: usize, max_line: usize) -> Option<(Option<i64>, usize)> {
    let (kind, digits) = buf.split_at_checked(skip)?;
    // The long way ends the line at the first CR, even one among the skipped bytes.
    if kind.contains(&b'\r') {
        return None;
    }
    let (n, len) = digits_line(digits, max_line)?;
    Some((Some(n), skip + len))
}

fn memchr(needle: u8, hay: &[u8]) -> Option<usize> {
    hay.iter().position(|&b| b == needle)
}

/// Splits an inline line into arguments like Redis's `sdssplitargs`: whitespace-separated,
/// with "double quotes" (C-style escapes, `\xHH`) and 'single quotes'. `None` on unbalanced
/// quotes or a closing quote not followed by a space.
fn split_args(line: &[u8], out: &mut Vec<Vec<u8>>) -> Option<()> {
    let mut i = 0;
    loop {
        while i < line.len() && is_space(line[i]) {
            i += 1;
        }
        if i >= line.len() {
            return Some(());
        }
        let mut arg = Vec::new();
        let mut in_dq = false;
        let mut in_sq = false;
        loop {
            let c = line.get(i).copied();
            if in_dq {
                match c {
                    None => return None,
                    Some(b'\\') if hex_escape(&line[i..]).is_some() => {
                        arg.extend(hex_escape(&line[i..]));
                        i += 3;
                    }
                    Some(b'\\') if i + 1 < line.len() => {
                        i += 1;
                        arg.push(match line[i] {
                            b'n' => b'\n',
                            b'r' => b'\r',
                            b't' => b'\t',
                            b'b' => 8,
                            b'a' => 7,
                            other => other,
                        });
                    }
                    Some(b'"') => {
                        if line.get(i + 1).is_some_and(|&n| !is_space(n)) {
                            return None;
                        }
                        in_dq = false;
                        i += 1;
                        break;
                    }
                    Some(other) => arg.push(other),
                }
            } else if in_sq {
                match c {
                    None => return None,
                    Some(b'\\') if line.get(i + 1) == Some(&b'\'') => {
                        i += 1;
                        arg.push(b'\'');
                    }
                    Some(b'\'') => {
                        if line.get(i + 1).is_some_and(|&n| !is_space(n)) {
                            return None;
                        }
                        in_sq = false;
                        i += 1;
                        break;
                    }
                    Some(other) => arg.push(other),
                }
            } else {
                match c {
                    None => break,
                    // Inside an unquoted argument only these end it (sdssplitargs); vertical
                    // tab and form feed are separators only between arguments.
                    Some(b' ' | b'\n' | b'\r' | b'\t') => break,
                    Some(b'"') => in_dq = true,
                    Some(b'\'') => in_sq = true,
                    Some(other) => arg.push(other),
                }
            }
            i += 1;
        }
        debug_assert!(!in_dq && !in_sq);
        out.push(arg);
    }
}

fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c)
}

/// The byte of a `\xHH` escape at the start of `s`, if it is one.
fn hex_escape(s: &[u8]) -> Option<u8> {
    match s {
        [b'\\', b'x', h, l, ..] => {
            let h = (*h as char).to_digit(16)?;
            let l = (*l as char).to_digit(16)?;
            Some((h * 16 + l) as u8)
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every line the one-pass header read accepts is read the same the long way.
    #[test]
    fn short_headers_read_as_long_ones() {
        let p = RequestParser::default();
        let mut lines: Vec<Vec<u8>> = [
            &b"*0\r\n"[..],
            b"*2\r\n",
            b"$11\r\nkey",
            b"$999999999999999999\r\n",
            b"$9999999999999999999\r\n",
            b"*01\r\n",
            b"*00\r\n",
            b"*-1\r\n",
            b"*\r\n",
            b"*1\r",
            b"*1\rx",
            b"*1\n\r",
            b"\r5\r\n",
            b"55\r\n",
            b"*1 \r\n",
        ]
        .iter()
        .map(|l| l.to_vec())
        .collect();
        for n in [0u64, 1, 7, 10, 99, 100, 12345, 1 << 40, i64::MAX as u64] {
            lines.push(format!("*{n}\r\n").into_bytes());
        }
        // Digits past what an i64 holds: no overflow on the way to the long path.
        lines.push(format!("*{}\r\n", "9".repeat(30)).into_bytes());
        let mut short = 0;
        for line in &lines {
            let long = p.long_header(line, 1, "too big").ok().flatten();
            if let Some(found) = short_header(line, 1, p.limits.max_inline_len) {
                short += 1;
                assert_eq!(Some(found), long, "{line:?}");
            }
        }
        assert_eq!(short, 13, "lines read in one pass");
        // A line longer than the limit is left to the long way, which refuses it.
        assert_eq!(short_header(b"*12345\r\n", 1, 3), None);
    }

    fn parse_all(input: &[u8]) -> Result<Vec<Vec<Vec<u8>>>, ProtocolError> {
        let mut p = RequestParser::new(Limits::default());
        let mut off = 0;
        let mut out = Vec::new();
        while let Some(parsed) = p.parse(&input[off..], true)? {
            let len = match parsed {
                Parsed::Multibulk { len } | Parsed::Inline { len } => {
                    out.push(p.args(&input[off..]).iter().map(<[u8]>::to_vec).collect());
                    len
                }
                Parsed::Empty { len } => len,
            };
            off += len;
        }
        Ok(out)
    }

    #[test]
    fn exact_multibulk_parses() {
        let got = parse_all(b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n").unwrap();
        assert_eq!(got, vec![vec![b"GET".to_vec(), b"k".to_vec()]]);
    }

    #[test]
    fn padded_multibulk_leaves_the_rest() {
        let mut p = RequestParser::new(Limits::default());
        let buf = b"*1\r\n$4\r\nPING\r\n*1\r\n$4";
        assert_eq!(
            p.parse(buf, true).unwrap(),
            Some(Parsed::Multibulk { len: 14 })
        );
        assert_eq!(p.parse(&buf[14..], true).unwrap(), None);
    }

    #[test]
    fn truncated_multibulk_returns_none_at_every_cut() {
        let full = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nvalue\r\n";
        for cut in 0..full.len() {
            let mut p = RequestParser::new(Limits::default());
            assert_eq!(p.parse(&full[..cut], true).unwrap(), None, "cut {cut}");
            // Resuming with the whole buffer finishes the same request.
            let got = p.parse(full, true).unwrap();
            assert_eq!(
                got,
                Some(Parsed::Multibulk { len: full.len() }),
                "cut {cut}"
            );
            assert_eq!(p.args(full).get(2), Some(&b"value"[..]));
        }
    }

    #[test]
    fn inline_splits_and_unquotes() {
        let got = parse_all(b"SET k \"a b\\x41\\n\" 'it\\'s'\r\nPING\n").unwrap();
        assert_eq!(
            got,
            vec![
                vec![
                    b"SET".to_vec(),
                    b"k".to_vec(),
                    b"a bA\n".to_vec(),
                    b"it's".to_vec()
                ],
                vec![b"PING".to_vec()]
            ]
        );
    }

    #[test]
    fn empty_lines_and_arrays_are_skipped() {
        assert_eq!(
            parse_all(b"\r\n*0\r\n*-1\r\n  \n").unwrap(),
            Vec::<Vec<Vec<u8>>>::new()
        );
    }

    #[test]
    fn protocol_errors_match_redis_texts() {
        let cases: &[(&[u8], &str)] = &[
            (b"*x\r\n", "invalid multibulk length"),
            (b"*1\r\nx\r\n", "expected '$', got 'x'"),
            (b"*1\r\n$-5\r\n", "invalid bulk length"),
            (b"*1\r\n$999999999999\r\n", "invalid bulk length"),
            (b"*3000000000\r\n", "invalid multibulk length"),
            (b"SET \"a\r\n", "unbalanced quotes in request"),
            (b"SET \"a\"b\r\n", "unbalanced quotes in request"),
        ];
        for (input, msg) in cases {
            assert_eq!(parse_all(input).unwrap_err().message(), *msg, "{input:?}");
        }
    }

    #[test]
    fn oversized_lines_are_rejected_without_waiting() {
        let long = vec![b'a'; 70 * 1024];
        assert_eq!(
            parse_all(&long).unwrap_err().message(),
            "too big inline request"
        );
        let mut mb = b"*".to_vec();
        mb.extend(vec![b'1'; 70 * 1024]);
        assert_eq!(
            parse_all(&mb).unwrap_err().message(),
            "too big mbulk count string"
        );
    }

    #[test]
    fn unauthenticated_clients_get_small_limits() {
        let mut p = RequestParser::new(Limits::default());
        let err = p.parse(b"*11\r\n", false).unwrap_err();
        assert_eq!(err.message(), "unauthenticated multibulk length");
        let mut p = RequestParser::new(Limits::default());
        let err = p.parse(b"*1\r\n$20000\r\n", false).unwrap_err();
        assert_eq!(err.message(), "unauthenticated bulk length");
    }

    #[test]
    fn odd_bytes_in_headers_are_reported_like_redis() {
        let err = parse_all(b"*1\r\n\r\n").unwrap_err();
        assert_eq!(
            err.to_reply(),
            b"-ERR Protocol error: expected '$', got ' '\r\n"
        );
        let err = parse_all(b"*1\r\n\xffx\r\n").unwrap_err();
        assert_eq!(
            err.to_reply(),
            b"-ERR Protocol error: expected '$', got '\xff'\r\n"
        );
    }

    #[test]
    fn inline_splits_where_redis_does() {
        let got = parse_all(b"\x0bECHO\x0c x\r\nECHO a\x0cb\r\nGET k\0ignored\r\n").unwrap();
        assert_eq!(
            got,
            vec![
                vec![b"ECHO\x0c".to_vec(), b"x".to_vec()],
                vec![b"ECHO".to_vec(), b"a\x0cb".to_vec()],
                vec![b"GET".to_vec(), b"k".to_vec()],
            ]
        );
    }

    #[test]
    fn needed_reports_large_bulk_size() {
        let mut p = RequestParser::new(Limits::default());
        assert_eq!(p.parse(b"*1\r\n$100000\r\nab", true).unwrap(), None);
        assert_eq!(p.needed(), 13 + 100_000 + 2);
    }
}
