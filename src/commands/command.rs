//! A request as corral sees it, decided once: the upper-cased command name, its route, and
//! (on demand) its key positions. Routing, the cache and the cluster splitter all read this
//! value instead of classifying the arguments again.

use super::keys::Access;
use super::positions::{KeyPositions, command_keys};
use super::table::{MAX_NAME, Route, route_of};
use crate::resp::Args;

/// A command name upper-cased once, stored inline (no allocation per request). The bytes past
/// the name are zero, so two equal names compare equal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Name {
    buf: [u8; MAX_NAME],
    /// `None` when there is no name or it is too long to be a known command.
    len: Option<u8>,
}

impl Name {
    /// The upper-cased first argument of `args`. Inlined so that the words are stored
    /// straight into the caller's value (a call returned them through a copy).
    #[inline(always)]
    pub fn of(args: &Args<'_>) -> Name {
        // Upper-cased eight bytes at a time, in registers, and stored once: written byte
        // by byte into a buffer that was then copied, the name was read back before those
        // stores reached the CPU's cache, a stall that took about half of this function's
        // time in profiles.
        let Some(n) = args.get(0).filter(|n| n.len() <= MAX_NAME) else {
            return Name::default();
        };
        let mut words = [0u64; MAX_NAME / 8];
        for (w, chunk) in words.iter_mut().zip(n.chunks(8)) {
            *w = upper_word(load_le(chunk));
        }
        let mut buf = [0u8; MAX_NAME];
        for (b, w) in buf.chunks_exact_mut(8).zip(words) {
            b.copy_from_slice(&w.to_le_bytes());
        }
        Name {
            buf,
            len: u8::try_from(n.len()).ok(),
        }
    }

    /// The name, unless it is missing or longer than any known command.
    pub fn get(&self) -> Option<&[u8]> {
        self.len.map(|n| &self.buf[..usize::from(n)])
    }

    /// The name, empty when it is missing or longer than any known command (no table
    /// knows the empty name).
    pub fn as_bytes(&self) -> &[u8] {
        self.get().unwrap_or_default()
    }
}

/// Up to eight bytes as a little-endian word, zero past their end, read with at most two
/// loads (overlapping when the bytes are not a power of two).
fn load_le(b: &[u8]) -> u64 {
    let n = b.len();
    let two = |lo: &[u8], hi: &[u8], width: usize| -> Option<u64> {
        let word = |s: &[u8]| -> Option<u64> {
            let mut w = [0u8; 8];
            w.get_mut(..width)?.copy_from_slice(s.get(..width)?);
            Some(u64::from_le_bytes(w))
        };
        Some(word(lo)? | word(hi)? << (8 * (n - width)))
    };
    let pair = match n {
        8.. => b.first_chunk::<8>().map(|w| u64::from_le_bytes(*w)),
        4..=7 => two(b, &b[n - 4..], 4),
        2..=3 => two(b, &b[n - 2..], 2),
        1 => Some(u64::from(b[0])),
        _ => Some(0),
    };
    pair.unwrap_or(0)
}

/// ASCII upper case of the eight bytes of `x` at once; other bytes are left as they are.
fn upper_word(x: u64) -> u64 {
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let low7 = x & LOW7;
    // Bit 7 of each byte: set when its low seven bits are at least b'a' (0x80 - 0x61 = 0x1f
    // added), and when they are past b'z' (0x80 - 0x7b = 0x05 added); no byte carries.
    let from_a = low7 + 0x1f1f_1f1f_1f1f_1f1f;
    let past_z = low7 + 0x0505_0505_0505_0505;
    let lower = from_a & !past_z & !x & HIGH;
    x ^ (lower >> 2)
}

/// What a request is: its upper-cased name and its route. Holds no borrow, so the connection
/// can decide once and keep the answer while it mutates itself.
#[derive(Debug, Clone, Copy)]
pub struct Kind {
    /// The command name, upper-cased.
    pub name: Name,
    /// Where the request goes.
    pub route: Route,
    /// Named like a command that [`Command::client_pause`], [`super::busy::exclusive`] or
    /// [`super::session::LastCmd`] looks at further (see `needs_a_closer_look`). Every
    /// forwarded request is asked all three, some several times over: this answers for
    /// nearly all of them at once.
    pub special: bool,
}

impl Kind {
    /// Upper-cases the name and classifies the request.
    pub fn of(args: &Args<'_>) -> Kind {
        let name = Name::of(args);
        Kind {
            route: route_of(name.get(), args),
            special: needs_a_closer_look(name.as_bytes()),
            name,
        }
    }
}

/// The script and function calls and SHUTDOWN (`busy::exclusive`), and the commands with
/// subcommands (CLIENT PAUSE for `client_pause`, SCRIPT KILL and FUNCTION KILL for
/// `busy::exclusive`, all of them for `LastCmd`).
fn needs_a_closer_look(upper_name: &[u8]) -> bool {
    matches!(
        upper_name,
        b"EVAL" | b"EVALSHA" | b"EVAL_RO" | b"EVALSHA_RO" | b"FCALL" | b"FCALL_RO" | b"SHUTDOWN"
    ) || super::session::is_container(upper_name)
}

/// A request: its arguments (borrowed from the read buffer) and what it is.
#[derive(Debug, Clone, Copy)]
pub struct Command<'a> {
    /// The arguments, the command name first, as the client sent them.
    pub args: Args<'a>,
    /// Its name and route.
    pub kind: Kind,
}

impl<'a> Command<'a> {
    /// Parses the command of `args` (upper-cases the name and classifies it).
    pub fn new(args: Args<'a>) -> Command<'a> {
        Command {
            kind: Kind::of(&args),
            args,
        }
    }

    /// The upper-cased command name (empty if unknown-long).
    pub fn name(&self) -> &[u8] {
        self.kind.name.as_bytes()
    }

    /// Where the request goes.
    pub fn route(&self) -> Route {
        self.kind.route
    }

    /// What a forwarded request does to keys; `None` for any other route.
    pub fn access(&self) -> Option<Access> {
        match self.kind.route {
            Route::Forward(a) => Some(a),
            _ => None,
        }
    }

    /// Where its keys are, from the command table (or its arguments, for movable keys).
    pub fn keys(&self) -> KeyPositions {
        command_keys(self.name(), &self.args)
    }

    /// Whether Redis knows the command (corral's own and local ones included).
    pub fn exists(&self) -> bool {
        matches!(self.kind.route, Route::Local(_) | Route::Corral) || self.keys().is_known()
    }

    /// Argument `i` (the name is 0).
    pub fn arg(&self, i: usize) -> Option<&'a [u8]> {
        self.args.get(i)
    }

    /// Whether argument `i` is `word`, ignoring case.
    pub fn arg_is(&self, i: usize, word: &[u8]) -> bool {
        self.args
            .get(i)
            .is_some_and(|a| a.eq_ignore_ascii_case(word))
    }

    /// CLIENT PAUSE ms [WRITE|ALL] (`Some(Some(ms))`) or CLIENT UNPAUSE (`Some(None)`). Asked of
    /// every forwarded request: the upper-cased name is compared, not the argument.
    #[inline]
    pub fn client_pause(&self) -> Option<Option<u64>> {
        if !self.kind.special {
            return None;
        }
        self.client_pause_named()
    }

    fn client_pause_named(&self) -> Option<Option<u64>> {
        if self.name() != b"CLIENT" {
            return None;
        }
        if self.arg_is(1, b"UNPAUSE") {
            return Some(None);
        }
        if !self.arg_is(1, b"PAUSE") {
            return None;
        }
        let ms = std::str::from_utf8(self.args.get(2)?)
            .ok()?
            .parse::<u64>()
            .ok()?;
        Some(Some(ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pause(words: &[&str]) -> Option<Option<u64>> {
        let owned: Vec<Vec<u8>> = words.iter().map(|w| w.as_bytes().to_vec()).collect();
        Command::new(Args::Owned(&owned)).client_pause()
    }

    #[test]
    fn client_pause_and_unpause_are_told_apart_from_other_commands() {
        assert_eq!(pause(&["client", "Pause", "100", "WRITE"]), Some(Some(100)));
        assert_eq!(pause(&["CLIENT", "UNPAUSE"]), Some(None));
        assert_eq!(pause(&["CLIENT", "PAUSE", "soon"]), None);
        assert_eq!(pause(&["CLIENT", "LIST"]), None);
        assert_eq!(pause(&["CLIENT"]), None);
        assert_eq!(pause(&["GET", "PAUSE", "100"]), None);
    }

    #[test]
    fn names_are_upper_cased_as_ascii_at_every_length() {
        // Random bytes and the edges of the lower-case range, at every length a name can
        // have and one past it, against the standard library's upper case: the word-wise
        // path must agree byte for byte.
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let edges = [
            0u8, b'@', b'A', b'Z', b'[', b'`', b'a', b'z', b'{', 0x7f, 0x80, 0xe1, 0xff,
        ];
        for len in 0..=MAX_NAME + 1 {
            for round in 0..300 {
                let name: Vec<u8> = (0..len)
                    .map(|i| match round % 3 {
                        0 => edges[(next() as usize + i) % edges.len()],
                        _ => next() as u8,
                    })
                    .collect();
                let owned = vec![name.clone()];
                let got = Name::of(&Args::Owned(&owned));
                if len > MAX_NAME {
                    assert_eq!(got.get(), None);
                } else {
                    assert_eq!(got.get(), Some(&name.to_ascii_uppercase()[..]), "{name:?}");
                    assert_eq!(got, Name::of(&Args::Owned(&[name.to_ascii_lowercase()])));
                }
            }
        }
        assert_eq!(Name::of(&Args::Owned(&[])).get(), None);
    }
}
