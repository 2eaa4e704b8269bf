//! Scripts for the compare runner (`compare.rs`): a few clients (A, B, C...) taking turns,
//! how a run is set up ([`Options`]), and what it records ([`Reply`]).
//!
//! Script lines (see [`Step::parse`]):
//! - `A: CMD args ; CMD args` sends the commands in one write and reads their replies: one
//!   each, and one per name for the (P|S)(UN)SUBSCRIBE family. `=> name` at the end saves the
//!   last reply's payload (bulk content or integer) for a later `@name` argument; `#tag` marks
//!   the step's last reply for the test's own assertions, and `#any` compares only its type
//!   (for ids).
//! - `A! CMD args` sends a command and reads nothing (CLIENT REPLY OFF/SKIP have no reply).
//! - `A> CMD args` sends a command that must block: the step waits until the side's Redis
//!   counts one more blocked client. `A<` reads its replies later; with nothing pending, `A<`
//!   reads one frame nobody asked for (a message, a redirected invalidation).
//! - `A~ CMD ; CMD` sends commands whose replies may be suppressed (CLIENT REPLY), then a
//!   marker `ECHO`, and records everything received up to the marker's reply.
//! - `A: !closed` records what arrives until the server closes A's connection, and whether it
//!   did.
//! - `@addr:X` is client X's address as the server sees it.

use std::net::SocketAddr;

/// Where a script's clients connect, and the Redis server that finally runs their commands
/// (asked directly about blocked clients; `Options::direct` clients connect to it).
#[derive(Debug, Clone, Copy)]
pub struct Side {
    pub name: &'static str,
    pub entry: SocketAddr,
    pub server: SocketAddr,
}

/// How `X:` steps are written.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mode {
    /// One write per step.
    OneByOne,
    /// Consecutive steps of one client in one write (up to one whose reply is saved).
    Pipelined,
}

/// How a script runs and what is compared.
#[derive(Clone, Copy)]
pub struct Options {
    /// Every client starts with `HELLO 3` (its reply is compared, the id masked).
    pub resp3: bool,
    pub mode: Mode,
    /// Each side is emptied first: all databases, scripts and functions (through its entry,
    /// so corral's cache sees the flush too).
    pub wipe: bool,
    /// Every client still open at the end sends a PING: a frame delivered once too often (or
    /// to a client that should not get it) shows up there as a difference.
    pub end_ping: bool,
    /// A `:` step also reads and records the pushes that come before each reply (CLIENT
    /// TRACKING invalidations), up to the reply.
    pub pushes_first: bool,
    /// Clients (by letter) connected straight to the side's Redis instead of its entry: writes
    /// made by another application.
    pub direct: &'static str,
    /// Applied to every reply before it is recorded, to blank out what necessarily differs
    /// between two servers (HELLO's id is always blanked out).
    pub mask: fn(&[u8]) -> Vec<u8>,
}

impl Options {
    /// One write per step, nothing else, in RESP3 or RESP2.
    pub fn resp(resp3: bool) -> Options {
        Options {
            resp3,
            mode: Mode::OneByOne,
            wipe: false,
            end_ping: false,
            pushes_first: false,
            direct: "",
            mask: <[u8]>::to_vec,
        }
    }

    pub(super) fn proto(&self) -> &'static str {
        if self.resp3 { "RESP3" } else { "RESP2" }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Op {
    /// `X:` send and read.
    Call,
    /// `X!` send only.
    Send,
    /// `X>` send a command that blocks.
    Block,
    /// `X<` read a blocked client's replies, or one frame.
    Collect,
    /// `X~` send, then read up to a marker.
    Silent,
    /// `X: !closed`
    Closed,
}

/// One line of a script.
pub struct Step {
    pub(super) who: char,
    pub(super) op: Op,
    pub(super) cmds: Vec<Vec<Vec<u8>>>,
    pub(super) save: Option<String>,
    pub(super) tag: Option<String>,
    /// Arguments are sent as they are (no `@` placeholders).
    pub(super) literal: bool,
}

impl Step {
    /// Parses a script line (see the module's documentation).
    pub fn parse(line: &str) -> Step {
        let mut chars = line.chars();
        let (who, op) = (chars.next().expect("client"), chars.next().expect("op"));
        let mut rest = chars.as_str().trim();
        let mut tag = None;
        let split = match rest.strip_prefix('#') {
            Some(t) => Some(("", t)),
            None => rest.rsplit_once(" #"),
        };
        if let Some((before, t)) = split
            && !t.contains([' ', '"'])
        {
            tag = Some(t.to_string());
            rest = before.trim();
        }
        let mut save = None;
        if let Some((before, name)) = rest.rsplit_once(" => ") {
            save = Some(name.to_string());
            rest = before;
        }
        let op = match (op, rest) {
            (':', "!closed") => Op::Closed,
            (':', _) => Op::Call,
            ('!', _) => Op::Send,
            ('>', _) => Op::Block,
            ('<', _) => Op::Collect,
            ('~', _) => Op::Silent,
            _ => panic!("bad script line {line:?}"),
        };
        Step {
            who,
            op,
            cmds: super::resp::parse_commands(rest),
            save,
            tag,
            literal: false,
        }
    }

    /// `who: args`, the arguments sent exactly as given.
    pub fn call(who: char, args: Vec<Vec<u8>>) -> Step {
        Step {
            who,
            op: Op::Call,
            cmds: vec![args],
            save: None,
            tag: None,
            literal: true,
        }
    }
}

/// Parses every line of a script.
pub fn steps(script: &[&str]) -> Vec<Step> {
    script.iter().map(|l| Step::parse(l)).collect()
}

/// One reply (or message, push, or end of connection) a script received.
#[derive(Debug, Clone)]
pub struct Reply {
    pub label: String,
    pub tag: Option<String>,
    pub bytes: Vec<u8>,
}

impl Reply {
    /// A reply recorded by a test of its own, untagged.
    pub fn new(label: impl Into<String>, bytes: Vec<u8>) -> Reply {
        Reply {
            label: label.into(),
            tag: None,
            bytes,
        }
    }
}

/// The reply tagged `tag`.
pub fn tagged<'a>(replies: &'a [Reply], tag: &str) -> &'a [u8] {
    let r = replies.iter().find(|r| r.tag.as_deref() == Some(tag));
    &r.unwrap_or_else(|| panic!("no reply tagged {tag}")).bytes
}

/// Replies a command gets: one per name for the (P|S)(UN)SUBSCRIBE family, and one (an arity
/// error, or a nil name when there is nothing to unsubscribe from) without names. An
/// argument-less UNSUBSCRIBE with several subscriptions would get one per subscription, in
/// hash order: scripts only use it with at most one, or read the rest with `<`.
pub(super) fn replies_expected(cmd: &[Vec<u8>]) -> usize {
    let name = String::from_utf8_lossy(&cmd[0]).to_ascii_uppercase();
    let family = ["SUBSCRIBE", "UNSUBSCRIBE"].iter().any(|verb| {
        name.strip_suffix(verb)
            .is_some_and(|p| ["", "P", "S"].contains(&p))
    });
    if family { (cmd.len() - 1).max(1) } else { 1 }
}

pub(super) fn show_cmd(cmd: &[Vec<u8>]) -> String {
    let words: Vec<String> = cmd
        .iter()
        .map(|a| String::from_utf8_lossy(&a[..a.len().min(50)]).into_owned())
        .collect();
    let s = words.join(" ");
    if s.chars().count() > 200 {
        let head: String = s.chars().take(200).collect();
        format!("{head}... ({} args)", cmd.len())
    } else {
        s
    }
}
