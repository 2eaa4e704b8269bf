//! Redis's glob matching (`stringmatchlen` in util.c), byte for byte: which channels a
//! PSUBSCRIBE pattern receives (so corral counts pattern subscribers as Redis does), and which
//! keys and channels a Redis ACL user's patterns allow.
//!
//! It lives with the command model, the layer just above `resp`, because both `pubsub` and
//! `acl` need it: inside `pubsub` it made `acl`, a leaf the configuration can read, depend on
//! the pub/sub and upstream layers for one function.

/// Whether `pattern` matches `string` (case-sensitive, as for channels).
pub fn matches(pattern: &[u8], string: &[u8]) -> bool {
    let mut skip_longer = false;
    match_impl(pattern, string, &mut skip_longer)
}

/// A port of `stringmatchlen_impl`. Where the C code reads its NUL terminator past the end
/// of the pattern, `at` returns 0.
fn match_impl(pattern: &[u8], string: &[u8], skip_longer: &mut bool) -> bool {
    let (mut p, mut s) = (0usize, 0usize);
    while p < pattern.len() && s < string.len() {
        match pattern[p] {
            b'*' => {
                while p < pattern.len() && at(pattern, p + 1) == b'*' {
                    p += 1;
                }
                if pattern.len() - p == 1 {
                    return true;
                }
                while s < string.len() {
                    if match_impl(&pattern[p + 1..], &string[s..], skip_longer) {
                        return true;
                    }
                    if *skip_longer {
                        return false;
                    }
                    s += 1;
                }
                // No match for the rest of the pattern anywhere in the rest of the string:
                // earlier stars cannot help either.
                *skip_longer = true;
                return false;
            }
            b'?' => s += 1,
            b'[' => {
                let (end, matched) = class(pattern, p + 1, string[s]);
                if !matched {
                    return false;
                }
                p = end;
                s += 1;
            }
            b'\\' => {
                if pattern.len() - p >= 2 {
                    p += 1;
                }
                if pattern[p] != string[s] {
                    return false;
                }
                s += 1;
            }
            c => {
                if c != string[s] {
                    return false;
                }
                s += 1;
            }
        }
        p += 1;
        if s == string.len() {
            while at(pattern, p) == b'*' {
                p += 1;
            }
            break;
        }
    }
    p >= pattern.len() && s == string.len()
}

/// The `[...]` class starting at `p` (just past its `[`) against the byte `c`: where the
/// class ends (its `]`, or the last byte of an unterminated class) and whether `c` is in it.
fn class(pattern: &[u8], mut p: usize, c: u8) -> (usize, bool) {
    let not = at(pattern, p) == b'^';
    if not {
        p += 1;
    }
    let mut matched = false;
    loop {
        let left = pattern.len().saturating_sub(p);
        if at(pattern, p) == b'\\' && left >= 2 {
            p += 1;
            if pattern[p] == c {
                matched = true;
            }
        } else if at(pattern, p) == b']' {
            break;
        } else if left == 0 {
            p -= 1;
            break;
        } else if left >= 3 && pattern[p + 1] == b'-' {
            let (mut start, mut end) = (pattern[p], pattern[p + 2]);
            if start > end {
                std::mem::swap(&mut start, &mut end);
            }
            p += 2;
            if c >= start && c <= end {
                matched = true;
            }
        } else if pattern[p] == c {
            matched = true;
        }
        p += 1;
    }
    (p, matched != not)
}

/// The pattern byte at `i`, or the C string's NUL terminator past its end.
fn at(s: &[u8], i: usize) -> u8 {
    s.get(i).copied().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::matches;

    #[test]
    fn globs_match_as_in_redis() {
        let yes = [
            ("*", "anything"),
            ("ch*", "channel"),
            ("h?llo", "hello"),
            ("h[ae]llo", "hallo"),
            ("h[^e]llo", "hallo"),
            ("h[a-b]llo", "hbllo"),
            ("h[b-a]llo", "hallo"),
            ("h\\*llo", "h*llo"),
            ("a*b*c", "aXbYc"),
            ("foo*", "foo"),
            ("__key*__:*", "__keyspace@9__:foo"),
        ];
        let no = [
            ("ch*", "xchannel"),
            ("h?llo", "hllo"),
            ("h[^e]llo", "hello"),
            ("h[a-b]llo", "hcllo"),
            ("a*b*c", "aXbY"),
            ("foo", "foobar"),
            ("", "x"),
        ];
        for (p, s) in yes {
            assert!(matches(p.as_bytes(), s.as_bytes()), "{p} ~ {s}");
        }
        for (p, s) in no {
            assert!(!matches(p.as_bytes(), s.as_bytes()), "{p} !~ {s}");
        }
    }
}
