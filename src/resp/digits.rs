//! Decimal numbers in RESP: the length and count lines of requests and replies, read in one
//! pass, and Redis's strict integer syntax for arguments.

/// Nearly every RESP length or count line, read in one pass: 1 to `most` (and at most 18)
/// decimal digits, no leading zero but for a lone `0`, then CRLF, at the start of `line`. Its
/// value and the line's length with the CRLF; `None` for anything else (a sign, a space, a
/// 19th digit, a line cut short), for the caller's general path, which [`parse_int`] reads.
/// Requests, reply frames and the lookahead's hints all read their lines here.
///
/// Lines of one or two digits (`*2`, `$3`, a key's or a short value's length) are read
/// without the loop: a GET's three request lines and its reply's one, and a SET's four, are
/// mostly such, and the loop took about 40 instructions a line (callgrind).
#[inline(always)]
pub(super) fn digits_line(line: &[u8], most: usize) -> Option<(i64, usize)> {
    if let [a, b, c, rest @ ..] = line {
        let d0 = a.wrapping_sub(b'0');
        let d1 = b.wrapping_sub(b'0');
        if d0 < 10 && most >= 1 && *b == b'\r' {
            return (*c == b'\n').then_some((i64::from(d0), 3));
        }
        if (1..10).contains(&d0) && d1 < 10 && most >= 2 && *c == b'\r' {
            return matches!(rest, [b'\n', ..]).then_some((i64::from(d0 * 10 + d1), 4));
        }
    }
    digits_loop(line, most)
}

/// [`digits_line`] digit by digit, for any line.
#[inline(always)]
fn digits_loop(line: &[u8], most: usize) -> Option<(i64, usize)> {
    let mut n: i64 = 0;
    for (i, &b) in line.iter().take(most.min(18) + 1).enumerate() {
        let d = b.wrapping_sub(b'0');
        if d < 10 {
            if i == 18 {
                // A 19th digit may not fit.
                return None;
            }
            n = n * 10 + i64::from(d);
            continue;
        }
        let shape = b == b'\r' && i > 0 && (i == 1 || line[0] != b'0');
        return (shape && line.get(i + 1) == Some(&b'\n')).then_some((n, i + 2));
    }
    None
}

/// Redis's `string2ll`: an optional '-', then digits with no leading zero, fitting in i64.
pub fn parse_int(s: &[u8]) -> Option<i64> {
    let (neg, digits) = match s {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, s),
    };
    match digits {
        [] => return None,
        [b'0'] => return (!neg).then_some(0),
        [b'0', ..] => return None,
        _ => {}
    }
    let mut v: i64 = 0;
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        let d = i64::from(d - b'0');
        v = if neg {
            v.checked_mul(10)?.checked_sub(d)?
        } else {
            v.checked_mul(10)?.checked_add(d)?
        };
    }
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every line of up to six bytes over digits, CR, LF and two other bytes, at every
    /// bound that matters: the short path reads each as the loop does.
    #[test]
    fn short_lines_read_as_the_loop_reads_them() {
        const BYTES: &[u8] = b"0159\r\n-x";
        let mut lines: Vec<Vec<u8>> = vec![Vec::new()];
        let mut last = lines.clone();
        for _ in 0..6 {
            last = last
                .iter()
                .flat_map(|l| {
                    BYTES.iter().map(move |&b| {
                        let mut l = l.clone();
                        l.push(b);
                        l
                    })
                })
                .collect();
            lines.extend(last.iter().cloned());
        }
        let mut accepted = 0;
        for line in &lines {
            for most in [0, 1, 2, 3, 9, 18, usize::MAX] {
                let got = digits_line(line, most);
                assert_eq!(got, digits_loop(line, most), "{line:?} most {most}");
                accepted += usize::from(got.is_some());
            }
        }
        // The check above must have compared accepted lines, not only refusals.
        assert!(accepted > 1000, "{accepted}");
        assert_eq!(digits_line(b"7\r\n", 9), Some((7, 3)));
        assert_eq!(digits_line(b"64\r\nxx", 9), Some((64, 4)));
        assert_eq!(digits_line(b"05\r\n", 9), None);
        assert_eq!(digits_line(b"12\r\n", 1), None);
        assert_eq!(digits_line(b"123\r\n", 9), Some((123, 5)));
    }

    #[test]
    fn parse_int_is_strict() {
        assert_eq!(parse_int(b"0"), Some(0));
        assert_eq!(parse_int(b"-12"), Some(-12));
        assert_eq!(parse_int(b"012"), None);
        assert_eq!(parse_int(b"+1"), None);
        assert_eq!(parse_int(b"-0"), None);
        assert_eq!(parse_int(b""), None);
        assert_eq!(parse_int(b"99999999999999999999"), None);
    }
}
