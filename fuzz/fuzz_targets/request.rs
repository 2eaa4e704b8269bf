#![no_main]
//! The request parser, fed a buffer whole and in pieces of every size, must find the same
//! requests (and the same error); the quick paths that skip it (`plain_get`, `plain_set`,
//! `lookahead::keys`) must take only what it takes, the same way. The first byte of the
//! input picks the pieces' size and whether the client has authenticated.
use corral::resp::lookahead::{self, Found};
use corral::resp::{Limits, Parsed, RequestParser};
use libfuzzer_sys::fuzz_target;

/// What the parser made of one request.
#[derive(Debug, PartialEq, Eq, Clone)]
enum Got {
    Req {
        start: usize,
        len: usize,
        inline: bool,
        args: Vec<Vec<u8>>,
    },
    Empty {
        start: usize,
        len: usize,
    },
    Err(Vec<u8>),
}

/// Everything the parser finds in `buf`, given `step` more bytes each time it asks for more.
fn parse(buf: &[u8], auth: bool, step: usize) -> Vec<Got> {
    let mut p = RequestParser::new(Limits {
        max_bulk_len: 1 << 20,
        max_multibulk_len: 1 << 16,
        max_inline_len: 4096,
    });
    let mut out = Vec::new();
    let mut pos = 0;
    let mut avail = step.min(buf.len());
    loop {
        let view = &buf[pos..avail];
        match p.parse(view, auth) {
            Ok(Some(Parsed::Multibulk { len })) | Ok(Some(Parsed::Inline { len })) => {
                let args: Vec<Vec<u8>> = p.args(view).iter().map(|a| a.to_vec()).collect();
                let is_inline = view.first() != Some(&b'*');
                assert!(len <= view.len(), "len past the buffer");
                out.push(Got::Req {
                    start: pos,
                    len,
                    inline: is_inline,
                    args,
                });
                pos += len;
            }
            Ok(Some(Parsed::Empty { len })) => {
                assert!(len <= view.len() && len > 0, "empty len {len}");
                out.push(Got::Empty { start: pos, len });
                pos += len;
            }
            Ok(None) => {
                if avail == buf.len() {
                    break;
                }
                avail = (avail + step).min(buf.len());
                continue;
            }
            Err(e) => {
                out.push(Got::Err(e.0.clone()));
                break;
            }
        }
        assert!(pos <= avail, "pos {pos} past avail {avail}");
        if pos == buf.len() {
            break;
        }
        if pos == avail {
            avail = (avail + step).min(buf.len());
        }
    }
    out
}

fuzz_target!(|data: &[u8]| {
    if data.is_empty() {
        return;
    }
    let ctl = data[0];
    let buf = &data[1..];
    let auth = ctl & 1 == 0;
    let whole = parse(buf, auth, buf.len().max(1));
    let step = ((ctl >> 1) as usize).max(1);
    let pieces = parse(buf, auth, step);
    assert_eq!(whole, pieces, "whole vs pieces of {step}");
    if !auth {
        return;
    }
    // The quick paths, at the start of each request the parser found.
    for g in &whole {
        let Got::Req {
            start,
            len,
            inline,
            args,
        } = g
        else {
            continue;
        };
        let at = &buf[*start..];
        if let Some((key, n)) = lookahead::plain_get(at) {
            assert!(!inline);
            assert_eq!(n, *len, "plain_get length");
            assert_eq!(args.len(), 2);
            assert!(args[0].eq_ignore_ascii_case(b"get"));
            assert_eq!(&at[key], &args[1][..]);
        }
        if let Some((key, vlen, n)) = lookahead::plain_set(at) {
            assert!(!inline);
            assert_eq!(n, *len, "plain_set length");
            assert_eq!(args.len(), 3);
            assert!(args[0].eq_ignore_ascii_case(b"set"));
            assert_eq!(&at[key], &args[1][..]);
            assert_eq!(vlen, args[2].len());
        }
    }
    // Whatever a quick path takes at the head, the parser takes as one request there (the
    // loop above checked its arguments).
    let head = match whole.first() {
        Some(Got::Req { start: 0, len, .. }) => Some(*len),
        _ => None,
    };
    if let Some((_, n)) = lookahead::plain_get(buf) {
        assert_eq!(head, Some(n), "plain_get took {n} bytes: {whole:?}");
    }
    if let Some((_, _, n)) = lookahead::plain_set(buf) {
        assert_eq!(head, Some(n), "plain_set took {n} bytes: {whole:?}");
    }
    // lookahead::keys: each GET/SET it finds where the parser got to is one the parser
    // found at that place, with that key.
    let reached: usize = whole
        .iter()
        .map(|g| match g {
            Got::Req { start, len, .. } | Got::Empty { start, len } => start + len,
            Got::Err(_) => 0,
        })
        .max()
        .unwrap_or(0);
    for f in lookahead::keys(buf, 64) {
        let (key, at) = match f {
            Found::Get(k, p) => (k, p.at),
            Found::Set(k, at) => (k, at),
        };
        if at >= reached {
            continue;
        }
        let hit = whole.iter().any(|g| matches!(g, Got::Req { start, args, inline: false, .. } if *start == at && args.len() >= 2 && args[1] == key));
        assert!(
            hit,
            "lookahead found {f:?}, the parser has nothing like it: {whole:?}"
        );
    }
});
