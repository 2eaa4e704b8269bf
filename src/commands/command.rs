//! A request as corral sees it, decided once: the upper-cased command name, its route, and
//! (on demand) its key positions. Routing, the cache and the cluster splitter all read this
//! value instead of classifying the arguments again.

use super::keys::Access;
use super::positions::{KeyPositions, command_keys};
use super::table::{MAX_NAME, Route, route_of, upper};
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
    /// The upper-cased first argument of `args`.
    pub fn of(args: &Args<'_>) -> Name {
        let mut buf = [0u8; MAX_NAME];
        let len = args
            .get(0)
            .and_then(|n| upper(n, &mut buf))
            .and_then(|n| u8::try_from(n.len()).ok());
        Name { buf, len }
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

/// What a request is: its upper-cased name and its route. Holds no borrow, so the connection
/// can decide once and keep the answer while it mutates itself.
#[derive(Debug, Clone, Copy)]
pub struct Kind {
    /// The command name, upper-cased.
    pub name: Name,
    /// Where the request goes.
    pub route: Route,
    /// Named like a command that [`Command::client_pause`], [`super::busy::exclusive`] or
    /// [`super::session::LastCmd`] looks at further (see [`needs_a_closer_look`]). Every
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
}
