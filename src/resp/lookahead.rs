//! The keys of the GETs and SETs among a client's pipelined requests, found ahead of parsing
//! them, so the cache can start loading what their lookups and invalidations will read (see
//! `Cache::prefetch`) while the requests before them are handled.
//!
//! A hint only: it recognises the multibulk form every client library sends and stops at
//! anything else (an inline request, a frame cut short, a malformed header). The requests
//! themselves are parsed and checked by [`super::RequestParser`].

use super::digits::digits_line;

/// A request found ahead: the key of a `GET key`, or of a `SET key value ...`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Found<'a> {
    /// A GET's key, and where the request is.
    Get(&'a [u8], Plain),
    /// A SET's key, and where the request starts.
    Set(&'a [u8], usize),
}

/// Where a `GET key` found ahead is in the buffer looked through: what [`plain_get`] gives at
/// `at`, found without looking again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plain {
    /// Where the request starts.
    pub at: usize,
    /// Where its key starts.
    pub key: usize,
}

/// Iterator over the keys of the GETs and SETs at the start of a buffer, up to a count of
/// requests.
#[derive(Debug)]
pub struct Keys<'a> {
    rest: &'a [u8],
    /// Where `rest` starts in the buffer.
    at: usize,
    left: usize,
}

/// The keys of the GETs and SETs among the first `max` requests in `buf`.
pub fn keys(buf: &[u8], max: usize) -> Keys<'_> {
    Keys {
        rest: buf,
        at: 0,
        left: max,
    }
}

impl<'a> Iterator for Keys<'a> {
    type Item = Found<'a>;

    /// Inlined where the keys are taken: a GET, nearly every request a cache sees, is read
    /// here; any other request in `Keys::other`. Called through a function, this took about
    /// 40 instructions more per GET (callgrind).
    #[inline]
    fn next(&mut self) -> Option<Found<'a>> {
        while self.left > 0 {
            self.left -= 1;
            let buf = self.rest;
            // What clients send for a GET, in any case, checked as two words.
            if let Some(at) = get_header(buf)
                && let Some((start, end)) = bulk(buf, at)
            {
                let plain = Plain {
                    at: self.at,
                    key: self.at + start,
                };
                self.step(end + 2);
                return Some(Found::Get(&buf[start..end], plain));
            }
            match self.other() {
                Other::Found(found) => return Some(found),
                Other::Skipped => {}
                Other::Stop => return self.stop(),
            }
        }
        None
    }
}

/// What [`Keys::other`] made of a request other than a complete GET.
enum Other<'a> {
    /// A SET's key.
    Found(Found<'a>),
    /// Any other request, stepped over.
    Skipped,
    /// A request cut short or malformed (a GET's too): nothing past it is read.
    Stop,
}

impl<'a> Keys<'a> {
    /// The request at the start of `rest`, not a complete GET: a plain SET's key, with its
    /// value stepped over; or any other request stepped over (a SET with options is one);
    /// or the end, at a request cut short or malformed.
    fn other(&mut self) -> Other<'a> {
        let buf = self.rest;
        let request = self.at;
        if let Some(at) = set_header(buf) {
            let Some((start, end)) = bulk(buf, at) else {
                return Other::Stop;
            };
            let Some((_, past)) = bulk(buf, end + 2) else {
                return Other::Stop;
            };
            self.step(past + 2);
            return Other::Found(Found::Set(&buf[start..end], request));
        }
        let Some((count, mut at)) = line_int(buf, b'*') else {
            return Other::Stop;
        };
        // A GET's only form is the one `get_header` matched: cut short, it stops here.
        let mut args = [&buf[..0]; 2];
        for i in 0..count {
            let Some((start, end)) = bulk(buf, at) else {
                return Other::Stop;
            };
            if let Some(arg) = args.get_mut(i) {
                *arg = &buf[start..end];
            }
            at = end + 2;
        }
        self.step(at);
        if count >= 3 && args[0].eq_ignore_ascii_case(b"SET") {
            return Other::Found(Found::Set(args[1], request));
        }
        Other::Skipped
    }
}

impl Keys<'_> {
    /// Moves past the request of `len` bytes at the start of `rest`.
    fn step(&mut self, len: usize) {
        self.rest = &self.rest[len..];
        self.at += len;
    }

    /// Ends the iteration: what follows is not read.
    fn stop(&mut self) -> Option<Found<'static>> {
        self.left = 0;
        None
    }
}

/// Where a plain GET's name is in its request (see [`plain_get`]).
pub const GET_NAME: std::ops::Range<usize> = 8..11;

/// A complete `GET key` request at the start of `buf`, in the multibulk form clients send
/// (the name, at [`GET_NAME`], in any case): where its key is and the request's length.
/// `None` for anything else, including a GET not complete yet.
pub fn plain_get(buf: &[u8]) -> Option<(std::ops::Range<usize>, usize)> {
    let (start, end) = bulk(buf, get_header(buf)?)?;
    Some((start..end, end + 2))
}

/// A complete `SET key value` request at the start of `buf`, in the multibulk form clients
/// send (the name in any case, no options): where its key is, the value's length and the
/// request's length. `None` for anything else, including a SET not complete yet.
pub fn plain_set(buf: &[u8]) -> Option<(std::ops::Range<usize>, usize, usize)> {
    let (start, end) = bulk(buf, set_header(buf)?)?;
    let (value, past) = bulk(buf, end + 2)?;
    Some((start..end, past - value, past + 2))
}

/// `*2\r\n$3\r\nGET\r\n` (the command's name in any case) at the start of `buf`: where the
/// key's header starts. Compared as words, not byte by byte: this runs on every request.
fn get_header(buf: &[u8]) -> Option<usize> {
    command_header(buf, *b"*2\r\n$3\r\n", *b"get\r\n")
}

/// `*3\r\n$3\r\nSET\r\n` (in any case) at the start of `buf`: where the key's header starts.
/// A SET walked through as any request cost twice what a GET did (SETs over 1M keys).
fn set_header(buf: &[u8]) -> Option<usize> {
    command_header(buf, *b"*3\r\n$3\r\n", *b"set\r\n")
}

/// `array` (an array header and a 3-letter name's bulk header) then the lower-case `name`
/// with its line end, in any case, at the start of `buf`: where the next header starts.
fn command_header(buf: &[u8], array: [u8; 8], name: [u8; 5]) -> Option<usize> {
    // Setting bit 5 lower-cases a letter and leaves `\r\n` alone; no other byte value
    // becomes a lower-case letter.
    const LOWER: u64 = 0x0000_0000_0020_2020;
    const MASK: u64 = 0x0000_00ff_ffff_ffff;
    let [a, b, c, d, e] = name;
    let want = u64::from_le_bytes([a, b, c, d, e, 0, 0, 0]);
    let head = u64::from_le_bytes(buf.get(..8)?.try_into().ok()?);
    let got = u64::from_le_bytes(buf.get(8..16)?.try_into().ok()?);
    (head == u64::from_le_bytes(array) && (got | LOWER) & MASK == want).then_some(13)
}

/// The bulk string whose header starts at `at` in `buf`: where its body starts and ends.
/// `None` if it is cut short or malformed.
fn bulk(buf: &[u8], at: usize) -> Option<(usize, usize)> {
    let (len, header) = line_int(buf.get(at..)?, b'$')?;
    let start = at + header;
    let end = start + len;
    // Matched as a pattern: comparing slices calls `memcmp`, dearer than this whole check.
    match buf.get(end..end + 2)? {
        [b'\r', b'\n'] => Some((start, end)),
        _ => None,
    }
}

/// A header line `<kind><digits>\r\n` at the start of `buf` (see [`digits_line`]): its number
/// and the length of the line. Up to 9 digits: more than any request this looks through needs.
fn line_int(buf: &[u8], kind: u8) -> Option<(usize, usize)> {
    let (&first, rest) = buf.split_first()?;
    if first != kind {
        return None;
    }
    let (n, len) = digits_line(rest, 9)?;
    Some((usize::try_from(n).ok()?, len + 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The GETs' keys found.
    fn gets(buf: &[u8], max: usize) -> Vec<&[u8]> {
        keys(buf, max)
            .filter_map(|f| match f {
                Found::Get(k, _) => Some(k),
                Found::Set(..) => None,
            })
            .collect()
    }

    /// Asserts that `taken` takes none of `others`.
    fn none_taken(taken: impl Fn(&[u8]) -> bool, others: &[&[u8]]) {
        for other in others {
            assert!(!taken(other), "{}", String::from_utf8_lossy(other));
        }
    }

    #[test]
    fn a_plain_get_is_taken_whole_or_not_at_all() {
        let get = b"*2\r\n$3\r\ngEt\r\n$3\r\nkey\r\n*1\r\n$4\r\nPING\r\n";
        assert_eq!(plain_get(get), Some((17..20, 22)));
        assert_eq!(&get[GET_NAME], b"gEt");
        // Cut anywhere short of its last byte, it is not one yet.
        assert!((0..22).all(|n| plain_get(&get[..n]).is_none()));
        assert_eq!(
            plain_get(b"*2\r\n$3\r\nGET\r\n$0\r\n\r\n"),
            Some((17..17, 19))
        );
        none_taken(
            |b| plain_get(b).is_some(),
            &[
                &b"*3\r\n$3\r\nGET\r\n$1\r\nk\r\n$1\r\nx\r\n"[..],
                b"*2\r\n$3\r\nSET\r\n$1\r\nk\r\n",
                b"*2\r\n$4\r\nGETX\r\n$1\r\nk\r\n",
                b"*2\r\n$3\r\nGET\r\n$2\r\nk\r\n",
                b"GET k\r\n",
            ],
        );
    }

    #[test]
    fn a_plain_set_is_taken_whole_or_not_at_all() {
        let set = b"*3\r\n$3\r\nsEt\r\n$3\r\nkey\r\n$5\r\nvalue\r\n*1\r\n$4\r\nPING\r\n";
        assert_eq!(plain_set(set), Some((17..20, 5, 33)));
        assert!((0..33).all(|n| plain_set(&set[..n]).is_none()));
        assert_eq!(
            plain_set(b"*3\r\n$3\r\nSET\r\n$0\r\n\r\n$0\r\n\r\n"),
            Some((17..17, 0, 25))
        );
        none_taken(
            |b| plain_set(b).is_some(),
            &[
                &b"*4\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n$2\r\nNX\r\n"[..],
                b"*3\r\n$3\r\nGET\r\n$1\r\nk\r\n$1\r\nv\r\n",
                b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$2\r\nv\r\n",
                b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nvv\r\n",
                b"SET k v\r\n",
            ],
        );
    }

    #[test]
    fn finds_gets_among_other_requests() {
        let buf = b"*2\r\n$3\r\nGET\r\n$1\r\na\r\n*3\r\n$3\r\nSET\r\n$1\r\nb\r\n$1\r\nv\r\n\
                    *2\r\n$3\r\nget\r\n$0\r\n\r\n*1\r\n$4\r\nPING\r\n*2\r\n$3\r\nGET\r\n$2\r\ncd\r\n";
        assert_eq!(gets(buf, 10), vec![&b"a"[..], b"", b"cd"]);
        // `max` counts requests, not GETs.
        assert_eq!(gets(buf, 3), vec![&b"a"[..], b""]);
        assert_eq!(gets(buf, 0), Vec::<&[u8]>::new());
        let found: Vec<Found> = keys(buf, 10).collect();
        assert_eq!(found[1], Found::Set(b"b", 20));
        // Each plain GET with where it starts and where its key starts, past what came before.
        assert_eq!(found[0], Found::Get(b"a", Plain { at: 0, key: 17 }));
        assert_eq!(found[2], Found::Get(b"", Plain { at: 47, key: 64 }));
        assert_eq!(found[3], Found::Get(b"cd", Plain { at: 80, key: 97 }));
        assert_eq!(found.len(), 4);
        // SET with a value and options; not without a value.
        let buf = b"*5\r\n$3\r\nset\r\n$2\r\nkk\r\n$1\r\nv\r\n$2\r\nEX\r\n$2\r\n10\r\n\
                    *2\r\n$3\r\nSET\r\n$1\r\nk\r\n";
        assert_eq!(
            keys(buf, 10).collect::<Vec<_>>(),
            vec![Found::Set(b"kk", 0)]
        );
    }

    /// `header` finds the command `name` after `array` in every case, and then `found` after
    /// it, and nothing in any of `near`.
    fn matched_in_any_case(
        header: fn(&[u8]) -> Option<usize>,
        (array, name, rest): (&[u8], &[u8], &[u8]),
        found: &[Found],
        near: &[&[u8]],
    ) {
        let cases = [name.to_ascii_uppercase(), name.to_ascii_lowercase(), {
            let mut mixed = name.to_ascii_lowercase();
            mixed[1] = mixed[1].to_ascii_uppercase();
            mixed
        }];
        for name in cases {
            let buf = [array, &name, b"\r\n", rest].concat();
            assert_eq!(header(&buf), Some(13));
            assert_eq!(keys(&buf, 4).collect::<Vec<_>>(), found);
        }
        for near in near {
            assert_eq!(header(near), None, "{near:?}");
        }
    }

    #[test]
    fn the_get_header_is_matched_in_any_case_and_nothing_else() {
        matched_in_any_case(
            get_header,
            (b"*2\r\n$3\r\n", b"get", b"$1\r\nk\r\n"),
            &[Found::Get(b"k", Plain { at: 0, key: 17 })],
            &[
                b"*2\r\n$3\r\nGEU\r\n$1\r\nk\r\n",
                b"*2\r\n$3\r\nSET\r\n$1\r\nk\r\n",
                b"*2\r\n$3\r\nGET\n\r$1\r\nk\r\n",
                b"*3\r\n$3\r\nGET\r\n$1\r\nk\r\n",
                b"*2\r\n$4\r\nGET\r\n$1\r\nk\r\n",
                b"*2\r\n$3\r\nG\x05T\r\n$1\r\nk\r\n",
                // Too short to hold the header and a key.
                b"*2\r\n$3\r\nGET\r\n",
            ],
        );
    }

    #[test]
    fn the_set_header_is_matched_in_any_case_and_nothing_else() {
        matched_in_any_case(
            set_header,
            (
                b"*3\r\n$3\r\n",
                b"set",
                b"$1\r\nk\r\n$2\r\nvv\r\n*2\r\n$3\r\nGET\r\n$1\r\nj\r\n",
            ),
            &[
                Found::Set(b"k", 0),
                Found::Get(b"j", Plain { at: 28, key: 45 }),
            ],
            &[
                b"*3\r\n$3\r\nSEU\r\n$1\r\nk\r\n$1\r\nv\r\n",
                b"*3\r\n$3\r\nGET\r\n$1\r\nk\r\n$1\r\nv\r\n",
                b"*2\r\n$3\r\nSET\r\n$1\r\nk\r\n",
                b"*3\r\n$4\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n",
                b"*3\r\n$3\r\nS\x05T\r\n$1\r\nk\r\n$1\r\nv\r\n",
            ],
        );
        // A value cut short, or no value: nothing found, and nothing after it.
        for cut in [
            &b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nvv\r\n"[..],
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n",
        ] {
            let buf = [cut, &b"*2\r\n$3\r\nGET\r\n$1\r\na\r\n"[..]].concat();
            assert_eq!(keys(&buf, 4).count(), 0, "{cut:?}");
        }
    }

    #[test]
    fn stops_at_what_it_does_not_read() {
        let get = b"*2\r\n$3\r\nGET\r\n$1\r\na\r\n";
        for tail in [
            &b"PING\r\n"[..],
            b"*2\r\n$3\r\nGET\r\n$5\r\nab",
            b"*2\r\n$3\r\nGET\r\n$1\r\nabc\r\n",
            b"*2\r\n$-1\r\n",
            b"*2\r\n$3\r\nGET\r\n$9999999999\r\n",
            b"*2\r\n$3\r\nGET\r\n$\r\n",
        ] {
            let buf = [&get[..], tail, &get[..]].concat();
            assert_eq!(
                gets(&buf, 10),
                vec![&b"a"[..]],
                "{:?}",
                String::from_utf8_lossy(tail)
            );
        }
        // GET with the wrong number of arguments is not a lookup.
        assert!(gets(b"*3\r\n$3\r\nGET\r\n$1\r\na\r\n$1\r\nb\r\n", 10).is_empty());
    }

    #[test]
    fn any_bytes_are_looked_through_without_panicking() {
        let valid = b"*2\r\n$3\r\nGET\r\n$3\r\nkey\r\n*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\nv\r\n";
        let alphabet = b"*$\r\n0123456789GETget";
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..20_000 {
            let mut buf = valid.repeat(2);
            for _ in 0..next() % 4 {
                let at = (next() % buf.len() as u64) as usize;
                buf[at] = alphabet[(next() % alphabet.len() as u64) as usize];
            }
            buf.truncate((next() % (buf.len() as u64 + 1)) as usize);
            let within = buf.as_ptr_range();
            for found in keys(&buf, 8) {
                let (Found::Get(key, _) | Found::Set(key, _)) = found;
                // Every key found is a part of the buffer.
                let k = key.as_ptr_range();
                assert!(within.start <= k.start && k.end <= within.end);
                // A plain GET is where `plain_get` finds it, and as it finds it.
                if let Found::Get(key, p) = found {
                    let (range, len) = plain_get(&buf[p.at..]).expect("a plain GET");
                    assert_eq!(&buf[p.at..][range.clone()], key);
                    assert_eq!(
                        (p.at + range.start, p.at + len),
                        (p.key, p.key + key.len() + 2)
                    );
                }
                // A plain SET is where `plain_set` finds it, with the same key.
                if let Found::Set(key, at) = found
                    && let Some((range, _, _)) = plain_set(&buf[at..])
                {
                    assert_eq!(&buf[at..][range], key);
                }
            }
        }
    }
}
