//! Where the keys of every command are: reads as well as writes, for routing by slot and for
//! invalidating the keys a write changes.
//!
//! Most commands keep their keys at fixed positions, listed in `key_table.rs`
//! as `COMMAND` reports them; the rest (`movablekeys`: EVAL, ZUNIONSTORE, XREAD, SORT, ...)
//! are worked out from their arguments the way Redis's own `*GetKeys` functions do, so corral
//! and the cluster agree on which slot a request belongs to.

use std::collections::HashMap;
use std::sync::LazyLock;

use super::key_table::{KEYED, KEYLESS, MOVABLE};
use crate::resp::Args;
use crate::resp::digits::parse_int;

/// What the tables say of a command name: its fixed key positions, or that it has none.
#[derive(Clone, Copy)]
enum Listed {
    /// `(first, last, step)` as in `KEYED`.
    Keyed(u8, i8, u8),
    Keyless,
}

/// The tables by name: every write through the cache looks its keys up here, and a binary
/// search over a few hundred names cost a tenth of a forwarded SET.
static LISTED: LazyLock<HashMap<&'static [u8], Listed, foldhash::fast::FixedState>> =
    LazyLock::new(|| {
        let keyed = KEYED
            .iter()
            .map(|&(name, first, last, step)| (name.as_bytes(), Listed::Keyed(first, last, step)));
        let keyless = KEYLESS
            .iter()
            .map(|name| (name.as_bytes(), Listed::Keyless));
        keyed.chain(keyless).collect()
    });

/// The fixed key positions of `upper_name`, if the table lists it with keys.
fn keyed(upper_name: &[u8]) -> Option<(u8, i8, u8)> {
    if let Some(positions) = common(upper_name) {
        return Some(positions);
    }
    match LISTED.get(upper_name) {
        Some(&Listed::Keyed(first, last, step)) => Some((first, last, step)),
        _ => None,
    }
}

/// The positions of the commonest writes, as the table lists them, found without hashing
/// the name: the probe of `LISTED` took about 8 ns of a forwarded SET's 440 with the cache
/// on (perf, SET over 1M keys at -P 16). A test checks every answer against the table.
fn common(upper_name: &[u8]) -> Option<(u8, i8, u8)> {
    match upper_name {
        b"SET" | b"SETEX" | b"PSETEX" | b"SETNX" | b"GETSET" | b"GETDEL" | b"GETEX" | b"INCR"
        | b"INCRBY" | b"INCRBYFLOAT" | b"DECR" | b"DECRBY" | b"APPEND" | b"EXPIRE" | b"PEXPIRE"
        | b"EXPIREAT" | b"PEXPIREAT" | b"PERSIST" | b"HSET" | b"HSETNX" | b"HMSET" | b"HDEL"
        | b"HINCRBY" | b"LPUSH" | b"RPUSH" | b"LPOP" | b"RPOP" | b"SADD" | b"SREM" | b"ZADD"
        | b"ZREM" | b"ZINCRBY" | b"XADD" => Some((1, 1, 1)),
        b"DEL" | b"UNLINK" => Some((1, -1, 1)),
        _ => None,
    }
}

/// Keys at `first, first + step, ...` before `end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct Span {
    first: usize,
    end: usize,
    step: usize,
}

impl Span {
    fn one(at: usize) -> Span {
        Span {
            first: at,
            end: at + 1,
            step: 1,
        }
    }

    fn run(first: usize, count: usize) -> Span {
        Span {
            first,
            end: first + count,
            step: 1,
        }
    }
}

/// The argument indices (the command name is index 0) holding keys, in argument order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyPositions {
    known: bool,
    /// At most three runs are needed: a destination plus a key list, or a key plus the STORE
    /// and STOREDIST keys of GEORADIUS.
    spans: [Span; 3],
}

impl KeyPositions {
    fn none(known: bool) -> KeyPositions {
        KeyPositions {
            known,
            spans: [Span::default(); 3],
        }
    }

    fn of(spans: [Span; 3], nargs: usize) -> KeyPositions {
        // Never point past the arguments, whatever numkeys or the table says.
        let spans = spans.map(|s| Span {
            end: s.end.min(nargs),
            ..s
        });
        KeyPositions { known: true, spans }
    }

    /// Whether the command is one corral knows. Unknown commands (newer than Redis 7.0, or
    /// from modules) report no keys; the caller decides where they go.
    pub fn is_known(&self) -> bool {
        self.known
    }

    /// The key indices, in argument order.
    pub fn indices(&self) -> Indices {
        Indices {
            spans: self.spans,
            span: 0,
            at: self.spans[0].first,
        }
    }

    /// The keys themselves.
    pub fn keys<'a>(&self, args: &Args<'a>) -> impl Iterator<Item = &'a [u8]> + use<'a> {
        let args = *args;
        self.indices().filter_map(move |i| args.get(i))
    }

    /// True when the request names no key.
    pub fn is_empty(&self) -> bool {
        self.indices().next().is_none()
    }
}

/// The key indices of a [`KeyPositions`], span by span. Stepping by hand: `step_by` divides
/// to size each span, and that division was about a quarter of the key walk every write
/// through the cache pays for its invalidation (perf, SETs over 1M keys).
#[derive(Debug, Clone)]
pub struct Indices {
    spans: [Span; 3],
    /// The span being walked.
    span: usize,
    /// Its next index.
    at: usize,
}

impl Iterator for Indices {
    type Item = usize;

    #[inline]
    fn next(&mut self) -> Option<usize> {
        loop {
            let s = self.spans.get(self.span)?;
            if self.at < s.end {
                let i = self.at;
                self.at += s.step.max(1);
                return Some(i);
            }
            self.span += 1;
            self.at = self.spans.get(self.span).map_or(0, |s| s.first);
        }
    }
}

/// The key positions of a request. `upper_name` is `args[0]` upper-cased; `args` is the whole
/// request. Subcommands (`OBJECT ENCODING key`, `XINFO STREAM key`, `MEMORY USAGE key`,
/// `XGROUP CREATE key ...`) are looked up by their second argument.
pub fn command_keys(upper_name: &[u8], args: &Args<'_>) -> KeyPositions {
    let n = args.len();
    if let Some(spans) = movable(upper_name, args) {
        return KeyPositions::of(spans, n);
    }
    let mut buf = [0u8; 64];
    let name = match upper_name {
        b"OBJECT" | b"XINFO" | b"MEMORY" | b"XGROUP" => {
            match args
                .get(1)
                .and_then(|sub| subcommand(upper_name, sub, &mut buf))
            {
                Some(full) => full,
                None => return KeyPositions::none(false),
            }
        }
        _ => upper_name,
    };
    if let Some((first, last, step)) = keyed(name) {
        let first = usize::from(first);
        // A negative last key counts back from the end of the request.
        let end = if last < 0 {
            n.saturating_sub(usize::from(last.unsigned_abs()) - 1)
        } else {
            usize::from(last.unsigned_abs()) + 1
        };
        let span = Span {
            first,
            end,
            step: usize::from(step),
        };
        return KeyPositions::of([span, Span::default(), Span::default()], n);
    }
    let keyless = matches!(LISTED.get(name), Some(Listed::Keyless));
    KeyPositions::none(keyless)
}

/// `NAME|SUB` upper-cased in `buf`, the way `COMMAND` names subcommands.
fn subcommand<'b>(name: &[u8], sub: &[u8], buf: &'b mut [u8; 64]) -> Option<&'b [u8]> {
    let len = name.len() + 1 + sub.len();
    let out = buf.get_mut(..len)?;
    let (head, tail) = out.split_at_mut(name.len());
    head.copy_from_slice(name);
    let (bar, rest) = tail.split_first_mut()?;
    *bar = b'|';
    for (o, c) in rest.iter_mut().zip(sub) {
        *o = c.to_ascii_uppercase();
    }
    Some(out)
}

/// Key spans of `movablekeys` commands; `None` for every other command.
fn movable(name: &[u8], args: &Args<'_>) -> Option<[Span; 3]> {
    let none = Span::default();
    let n = args.len();
    let spans = match name {
        b"EVAL" | b"EVALSHA" | b"EVAL_RO" | b"EVALSHA_RO" | b"FCALL" | b"FCALL_RO" => {
            [numkeys(args, 2), none, none]
        }
        b"ZUNION" | b"ZINTER" | b"ZDIFF" | b"ZINTERCARD" | b"SINTERCARD" | b"LMPOP" | b"ZMPOP" => {
            [numkeys(args, 1), none, none]
        }
        b"BLMPOP" | b"BZMPOP" => [numkeys(args, 2), none, none],
        b"ZUNIONSTORE" | b"ZINTERSTORE" | b"ZDIFFSTORE" => {
            // A bad count voids the destination too, as in Redis's `zunionInterDiffStoreGetKeys`.
            let sources = numkeys(args, 2);
            if sources.first == sources.end {
                [none, none, none]
            } else {
                [Span::one(1), sources, none]
            }
        }
        b"XREAD" | b"XREADGROUP" => [xread(args), none, none],
        b"SORT" => [Span::one(1), sort_store(args), none],
        b"SORT_RO" => [Span::one(1), none, none],
        b"GEORADIUS" => georadius(args, 6),
        b"GEORADIUSBYMEMBER" => georadius(args, 5),
        b"MIGRATE" => [migrate(args), none, none],
        _ => return None,
    };
    // Redis rejects the request before looking at keys; so do we (no keys).
    if n < 2 {
        return Some([none, none, none]);
    }
    Some(spans)
}

/// `numkeys key...` with `numkeys` at `at`. A count Redis would reject (negative, zero where
/// keys are required, or more keys than arguments) gives no keys: Redis answers with an error
/// wherever the request goes.
fn numkeys(args: &Args<'_>, at: usize) -> Span {
    let count = args
        .get(at)
        .and_then(parse_int)
        .and_then(|k| usize::try_from(k).ok())
        .filter(|&k| at + 1 + k <= args.len());
    count.map_or_else(Span::default, |k| Span::run(at + 1, k))
}

/// XREAD/XREADGROUP: the keys are the first half of what follows the STREAMS option. Options
/// are skipped with their arguments, so a group or consumer named "streams" is not mistaken
/// for the option (as in Redis's `xreadGetKeys`).
fn xread(args: &Args<'_>) -> Span {
    let n = args.len();
    let mut i = 1;
    while let Some(a) = args.get(i) {
        let skip = if a.eq_ignore_ascii_case(b"BLOCK") || a.eq_ignore_ascii_case(b"COUNT") {
            1
        } else if a.eq_ignore_ascii_case(b"GROUP") {
            2
        } else if a.eq_ignore_ascii_case(b"NOACK") {
            0
        } else if a.eq_ignore_ascii_case(b"STREAMS") {
            // Half the rest, rounded down: Redis 7.0's key spec for an unbalanced list
            // (which it then rejects) names that many keys too.
            let rest = n - i - 1;
            return Span::run(i + 1, rest / 2);
        } else {
            break;
        };
        i += 1 + skip;
    }
    Span::default()
}

/// SORT's `STORE dest`, skipping the arguments of LIMIT, BY and GET (as `sortGetKeys`); the
/// last STORE wins.
fn sort_store(args: &Args<'_>) -> Span {
    let mut store = Span::default();
    let mut i = 2;
    while let Some(a) = args.get(i) {
        let skip = if a.eq_ignore_ascii_case(b"LIMIT") {
            2
        } else if a.eq_ignore_ascii_case(b"GET") || a.eq_ignore_ascii_case(b"BY") {
            1
        } else if a.eq_ignore_ascii_case(b"STORE") {
            if i + 1 < args.len() {
                store = Span::one(i + 1);
            }
            1
        } else {
            0
        };
        i += 1 + skip;
    }
    store
}

/// `GEORADIUS[BYMEMBER]`: the key, then the first `STORE` and the first `STOREDIST` key at or
/// after `from`, in that order (not argument order). This follows Redis 7.0's key specs (what `COMMAND
/// GETKEYS` and the cluster's slot check see), which name both when both are given.
fn georadius(args: &Args<'_>, from: usize) -> [Span; 3] {
    let find = |kw: &[u8]| {
        (from..args.len().saturating_sub(1))
            .find(|&i| args.get(i).is_some_and(|a| a.eq_ignore_ascii_case(kw)))
            .map_or_else(Span::default, |i| Span::one(i + 1))
    };
    [Span::one(1), find(b"STORE"), find(b"STOREDIST")]
}

/// MIGRATE: the key at 3, or with an empty key there, the keys after the KEYS option
/// (`migrateGetKeys`).
fn migrate(args: &Args<'_>) -> Span {
    let mut i = 6;
    while let Some(a) = args.get(i) {
        if a.eq_ignore_ascii_case(b"KEYS") {
            if args.get(3).is_some_and(|k| !k.is_empty()) {
                return Span::default();
            }
            return Span::run(i + 1, args.len() - i - 1);
        }
        i += if a.eq_ignore_ascii_case(b"AUTH") {
            2
        } else if a.eq_ignore_ascii_case(b"AUTH2") {
            3
        } else {
            1
        };
    }
    Span::one(3)
}

/// Whether `name` is a `movablekeys` command handled by [`command_keys`] from its arguments.
pub fn is_movable(upper_name: &[u8]) -> bool {
    MOVABLE
        .binary_search_by(|e| e.as_bytes().cmp(upper_name))
        .is_ok()
}

/// Whether the command `upper_name` may name several keys (a key list, a destination and its
/// sources, or keys found from its arguments).
pub fn may_name_several_keys(upper_name: &[u8]) -> bool {
    if is_movable(upper_name) {
        return true;
    }
    match keyed(upper_name) {
        Some((first, last, _)) => last < 0 || last > first as i8,
        None => false,
    }
}

#[cfg(test)]
mod tests;
