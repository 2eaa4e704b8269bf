//! Finds reply frame boundaries in an upstream byte stream without decoding values.
//!
//! Forwarded replies are passed to clients as the exact bytes Redis sent, so all the proxy
//! needs is where each top-level frame ends (and whether it is a RESP3 push). The scanner is
//! resumable: a large reply arriving in many reads is scanned once, not once per read.
//!
//! Nesting has no limit, as in Redis (a Lua script can return a table nested thousands of
//! levels deep): the scanner is a loop over an explicit stack, never recursion, and the stack
//! holds one counter per open aggregate, each opened by at least four bytes already in the
//! buffer. Its memory is therefore bounded by the bytes buffered, like the buffer itself.

use super::digits::digits_line;

/// The upstream sent bytes that are not RESP; the connection cannot be trusted any more.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid reply from upstream: {0}")]
pub struct ScanError(pub &'static str);

/// A complete top-level frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameEnd {
    /// Offset just past the frame, relative to the buffer start.
    pub end: usize,
    /// The frame is a RESP3 push (`>`), not a reply to a request.
    pub push: bool,
}

/// Resumable scanner over one connection's read buffer.
#[derive(Debug, Default)]
pub struct ReplyScanner {
    /// Where scanning continues, relative to the buffer start.
    pos: usize,
    /// Elements still missing in each open aggregate, innermost last.
    open: Vec<u64>,
    /// The current top-level frame is a push.
    push: bool,
}

impl ReplyScanner {
    /// A scanner at the start of a stream.
    pub fn new() -> Self {
        Self::default()
    }

    /// Tells the scanner that `n` bytes were removed from the front of the buffer.
    ///
    /// # Panics
    /// Never for `n` up to the end of the last returned frame, which is the only valid use.
    pub fn consumed(&mut self, n: usize) {
        debug_assert!(n <= self.pos);
        self.pos = self.pos.saturating_sub(n);
    }

    /// True when no frame is partially scanned.
    pub fn at_boundary(&self) -> bool {
        self.open.is_empty()
    }

    /// Scans on from the last position; returns the next complete top-level frame, or
    /// `Ok(None)` when more bytes are needed.
    ///
    /// # Errors
    /// Bytes that are not valid RESP2/RESP3.
    pub fn next_frame(&mut self, buf: &[u8]) -> Result<Option<FrameEnd>, ScanError> {
        // A write's `+OK`, read in one step: the general path looks for its line's end.
        if self.open.is_empty()
            && let Some([b'+', b'O', b'K', b'\r', b'\n']) = buf.get(self.pos..self.pos + 5)
        {
            self.pos += 5;
            return Ok(Some(FrameEnd {
                end: self.pos,
                push: false,
            }));
        }
        // Most replies are a whole bulk string on their own: read in one step.
        if self.open.is_empty()
            && buf.get(self.pos) == Some(&b'$')
            && let Some((n, after_line)) = plain_length(buf, self.pos + 1)
            && let Some(end) = usize::try_from(n)
                .ok()
                .and_then(|n| after_line.checked_add(n)?.checked_add(2))
        {
            if buf.len() < end {
                return Ok(None);
            }
            self.pos = end;
            return Ok(Some(FrameEnd { end, push: false }));
        }
        loop {
            let Some(&kind) = buf.get(self.pos) else {
                return Ok(None);
            };
            let top = self.open.is_empty();
            let end = match kind {
                b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => {
                    match find_crlf(buf, self.pos + 1) {
                        Some(line_end) => line_end + 2,
                        None => return Ok(None),
                    }
                }
                b'$' | b'!' | b'=' => {
                    let Some((n, after_line)) = length_line(buf, self.pos + 1)? else {
                        return Ok(None);
                    };
                    if n < 0 {
                        if n != -1 || kind != b'$' {
                            return Err(ScanError("negative length"));
                        }
                        after_line
                    } else {
                        let end = usize::try_from(n)
                            .ok()
                            .and_then(|n| after_line.checked_add(n)?.checked_add(2))
                            .ok_or(ScanError("length too large"))?;
                        if buf.len() < end {
                            return Ok(None);
                        }
                        end
                    }
                }
                b'*' | b'~' | b'>' | b'%' | b'|' => {
                    let Some((n, after_line)) = length_line(buf, self.pos + 1)? else {
                        return Ok(None);
                    };
                    if top {
                        self.push = kind == b'>';
                    }
                    if n < 0 {
                        if n != -1 || kind != b'*' {
                            return Err(ScanError("negative length"));
                        }
                        after_line
                    } else {
                        let n = n as u64;
                        // A map has two elements per entry; an attribute map is followed by
                        // the value it annotates, which belongs to the same frame.
                        let children = match kind {
                            b'%' => n * 2,
                            b'|' => n * 2 + 1,
                            _ => n,
                        };
                        if children > 0 {
                            self.open.push(children);
                            self.pos = after_line;
                            continue;
                        }
                        after_line
                    }
                }
                // An unknown type is an error once its line is complete, as before.
                _ if find_crlf(buf, self.pos + 1).is_none() => return Ok(None),
                _ => return Err(ScanError("unknown type byte")),
            };
            self.pos = end;
            if self.element_done() {
                let push = std::mem::take(&mut self.push);
                return Ok(Some(FrameEnd { end, push }));
            }
        }
    }

    /// Counts one finished element against the open aggregates; true when that finished the
    /// top-level frame.
    fn element_done(&mut self) -> bool {
        while let Some(left) = self.open.last_mut() {
            *left -= 1;
            if *left > 0 {
                return false;
            }
            self.open.pop();
        }
        true
    }
}

/// The length on the line starting at `from` (just past the type byte) and the offset past
/// the line's end; `Ok(None)` while the line is incomplete.
#[inline]
fn length_line(buf: &[u8], from: usize) -> Result<Option<(i64, usize)>, ScanError> {
    if let Some(plain) = plain_length(buf, from) {
        return Ok(Some(plain));
    }
    let Some(line_end) = find_crlf(buf, from) else {
        return Ok(None);
    };
    Ok(Some((int(&buf[from..line_end])?, line_end + 2)))
}

/// A length line read in one pass (see [`digits_line`]): its value and the offset past it.
#[inline]
fn plain_length(buf: &[u8], from: usize) -> Option<(i64, usize)> {
    digits_line(buf.get(from..)?, usize::MAX).map(|(n, len)| (n, from + len))
}

fn find_crlf(buf: &[u8], from: usize) -> Option<usize> {
    let hay = buf.get(from..)?;
    let mut i = 0;
    while let Some(p) = hay[i..].iter().position(|&b| b == b'\r') {
        let at = i + p;
        match hay.get(at + 1) {
            Some(b'\n') => return Some(from + at),
            Some(_) => i = at + 1,
            None => return None,
        }
    }
    None
}

fn int(s: &[u8]) -> Result<i64, ScanError> {
    super::digits::parse_int(s).ok_or(ScanError("bad length"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(buf: &[u8]) -> Vec<FrameEnd> {
        let mut s = ReplyScanner::new();
        let mut out = Vec::new();
        while let Some(f) = s.next_frame(buf).unwrap() {
            out.push(f);
        }
        out
    }

    fn ends(buf: &[u8]) -> Vec<usize> {
        frames(buf).iter().map(|f| f.end).collect()
    }

    /// The one-pass length reader agrees with the general one on every line it takes, and
    /// leaves every other line to it.
    #[test]
    fn plain_lengths_read_as_the_general_path_does() {
        let lines: [&[u8]; 14] = [
            b"0\r\n",
            b"7\r\n",
            b"64\r\n",
            b"-1\r\n",
            b"01\r\n",
            b"00\r\n",
            b"\r\n",
            b"1 \r\n",
            b"12\r",
            b"12",
            b"999999999999999999\r\n",
            b"9999999999999999999\r\n",
            b"99999999999999999999\r\n",
            b"5\rx",
        ];
        for line in lines {
            let general = find_crlf(line, 0).map(|e| (parse(&line[..e]), e + 2));
            match plain_length(line, 0) {
                Some((n, after)) => assert_eq!(general, Some((Some(n), after)), "{line:?}"),
                None => {
                    let fell_back = length_line(line, 0).ok().flatten();
                    assert_eq!(
                        fell_back,
                        general.and_then(|(n, a)| Some((n?, a))),
                        "{line:?}"
                    );
                }
            }
        }
        assert_eq!(
            plain_length(b"999999999999999999\r\n", 0),
            Some((999_999_999_999_999_999, 20))
        );
        // 19 digits go the general way, which reads them while they fit.
        let long = b"1000000000000000000\r\n";
        assert_eq!(plain_length(long, 0), None);
        assert_eq!(
            length_line(long, 0),
            Ok(Some((1_000_000_000_000_000_000, 21)))
        );
        assert!(length_line(b"99999999999999999999\r\n", 0).is_err());
    }

    fn parse(s: &[u8]) -> Option<i64> {
        super::super::digits::parse_int(s)
    }

    #[test]
    fn simple_types_are_one_line() {
        assert_eq!(
            ends(b"+OK\r\n-ERR x\r\n:1\r\n_\r\n,1.5\r\n#t\r\n(12\r\n"),
            vec![5, 13, 17, 20, 26, 30, 35]
        );
    }

    /// `+OK`, read in one step at the top, is the frame the general path reads, and is not
    /// taken for a whole frame inside an aggregate, cut short, or as the start of a longer line.
    #[test]
    fn ok_is_read_as_any_simple_string() {
        assert_eq!(ends(b"+OK\r\n+OKAY\r\n+OK\r\n"), vec![5, 12, 17]);
        assert_eq!(ends(b"*2\r\n+OK\r\n+OK\r\n+OK\r\n"), vec![14, 19]);
        assert_eq!(ends(b"+OK\r"), Vec::<usize>::new());
        let mut s = ReplyScanner::new();
        assert_eq!(s.next_frame(b"+OK\r").unwrap(), None);
        assert_eq!(s.next_frame(b"+OK\r\n").unwrap().map(|f| f.end), Some(5));
    }

    #[test]
    fn bulk_with_crlf_inside_is_one_frame() {
        assert_eq!(ends(b"$4\r\na\r\nb\r\n$-1\r\n"), vec![10, 15]);
    }

    #[test]
    fn nested_aggregates_count_children() {
        let buf = b"*2\r\n*1\r\n:1\r\n%1\r\n+k\r\n*0\r\n:9\r\n";
        assert_eq!(ends(buf), vec![buf.len() - 4, buf.len()]);
    }

    #[test]
    fn attribute_belongs_to_following_value() {
        let buf = b"|1\r\n+a\r\n+b\r\n:5\r\n";
        assert_eq!(ends(buf), vec![buf.len()]);
    }

    #[test]
    fn push_is_flagged() {
        let buf = b">2\r\n$10\r\ninvalidate\r\n*1\r\n$1\r\nk\r\n+OK\r\n";
        let f = frames(buf);
        assert_eq!(f.len(), 2);
        assert!(f[0].push);
        assert!(!f[1].push);
    }

    #[test]
    fn resumes_over_every_split() {
        let buf = b"*3\r\n$3\r\nfoo\r\n*-1\r\n%1\r\n$1\r\na\r\n=5\r\ntxt:x\r\n+OK\r\n";
        let whole = ends(buf);
        for cut in 0..buf.len() {
            let mut s = ReplyScanner::new();
            let mut got = Vec::new();
            while let Some(f) = s.next_frame(&buf[..cut]).unwrap() {
                got.push(f.end);
            }
            while let Some(f) = s.next_frame(buf).unwrap() {
                got.push(f.end);
            }
            assert_eq!(got, whole, "cut {cut}");
        }
    }

    #[test]
    fn garbage_is_an_error() {
        assert!(ReplyScanner::new().next_frame(b"hello\r\n").is_err());
        assert!(ReplyScanner::new().next_frame(b"$-7\r\n").is_err());
        assert!(ReplyScanner::new().next_frame(b"*x\r\n").is_err());
    }

    #[test]
    fn absurd_lengths_are_errors_not_panics() {
        let buf = b"$9223372036854775807\r\n";
        assert!(matches!(
            ReplyScanner::new().next_frame(buf),
            Ok(None) | Err(_)
        ));
        let buf = b"*9223372036854775807\r\n";
        assert!(matches!(
            ReplyScanner::new().next_frame(buf),
            Ok(None) | Err(_)
        ));
    }

    #[test]
    fn any_nesting_depth_is_one_frame() {
        // Deeper than Redis can produce (a Lua table stops near 8,000 levels), and far deeper
        // than a recursive scanner's stack would allow.
        let depth = 1_000_000;
        let mut buf = b"*1\r\n".repeat(depth);
        buf.extend_from_slice(b"-ERR reached lua stack limit\r\n+OK\r\n");
        assert_eq!(ends(&buf), vec![buf.len() - 5, buf.len()]);
    }

    #[test]
    fn deep_nesting_resumes_read_by_read() {
        let mut buf = b"*2\r\n".repeat(10_000);
        buf.extend_from_slice(&b":1\r\n".repeat(10_001));
        buf.extend_from_slice(b"+OK\r\n");
        let mut s = ReplyScanner::new();
        let mut got = Vec::new();
        for cut in (0..buf.len()).step_by(4093).chain([buf.len()]) {
            while let Some(f) = s.next_frame(&buf[..cut]).unwrap() {
                got.push(f.end);
            }
        }
        assert_eq!(got, vec![buf.len() - 5, buf.len()]);
        assert!(s.at_boundary());
    }
}
