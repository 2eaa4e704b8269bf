//! Commands that can keep Redis busy for as long as they like (scripts and functions), and the
//! commands Redis still accepts while it is busy with one (the kills, SHUTDOWN).
//!
//! While a script runs past `busy-reply-threshold` Redis answers every other client with
//! `-BUSY` at once, except for a few commands that are how an operator gets out of it. A proxy
//! must keep both promises: a script may only hold up its own client (so it runs on a
//! connection where nothing else queues behind it), and a kill must reach Redis whatever the
//! shared connections are waiting for (so it goes out of band).

use super::Command;
use crate::resp::Args;

/// How corral must send a forwarded command so that a busy Redis affects nobody else.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exclusive {
    /// EVAL, EVALSHA, FCALL and their `_RO` forms: run as long as the script does, so nothing
    /// of another client may queue behind them on one upstream connection.
    Script,
    /// SCRIPT KILL, FUNCTION KILL, SHUTDOWN: must reach Redis at once, on a connection of
    /// their own, even when every shared connection waits behind a busy Redis.
    OutOfBand,
}

/// Whether the request needs a connection of its own, and why.
#[inline]
pub fn exclusive(cmd: &Command<'_>) -> Option<Exclusive> {
    if !cmd.kind.special {
        return None;
    }
    exclusive_named(cmd)
}

fn exclusive_named(cmd: &Command<'_>) -> Option<Exclusive> {
    let args = &cmd.args;
    match cmd.name() {
        b"EVAL" | b"EVALSHA" | b"EVAL_RO" | b"EVALSHA_RO" | b"FCALL" | b"FCALL_RO" => {
            Some(Exclusive::Script)
        }
        b"SHUTDOWN" => Some(Exclusive::OutOfBand),
        b"SCRIPT" | b"FUNCTION" if args.len() == 2 => {
            cmd.arg_is(1, b"KILL").then_some(Exclusive::OutOfBand)
        }
        _ => None,
    }
}

/// Identifies a script for learning how long it takes: the command's kind (EVAL, EVALSHA or
/// FCALL, `_RO` alike) and its body, SHA (case-insensitive, as Redis treats it) or function
/// name. `None` for anything else.
pub fn script_key(args: &Args<'_>) -> Option<u64> {
    use std::hash::{BuildHasher, Hasher};
    let name = args.get(0)?;
    let what = args.get(1)?;
    let starts = |p: &[u8]| name.len() >= p.len() && name[..p.len()].eq_ignore_ascii_case(p);
    let kind: u8 = if starts(b"EVALSHA") {
        2
    } else if starts(b"EVAL") {
        1
    } else {
        3
    };
    let mut h = foldhash::fast::FixedState::with_seed(0).build_hasher();
    h.write_u8(kind);
    if kind == 1 {
        h.write(what);
    } else {
        what.iter().for_each(|b| h.write_u8(b.to_ascii_lowercase()));
    }
    Some(h.finish())
}

/// Whether a reply says Redis cannot serve ordinary commands right now: a script or function
/// ran past `busy-reply-threshold` (`-BUSY ...`, a busy module's too), or the dataset is still
/// loading (`-LOADING ...`). `frame` is one whole top-level reply. `-BUSYKEY` (RESTORE) and
/// `-BUSYGROUP` (XGROUP CREATE) are ordinary errors about keys.
pub fn reports_busy(frame: &[u8]) -> bool {
    frame.starts_with(b"-BUSY ") || frame.starts_with(b"-LOADING ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(words: &[&str]) -> Option<Exclusive> {
        let owned: Vec<Vec<u8>> = words.iter().map(|w| w.as_bytes().to_vec()).collect();
        exclusive(&Command::new(Args::Owned(&owned)))
    }

    #[test]
    fn script_keys_tell_scripts_apart() {
        let key = |words: &[&str]| {
            let owned: Vec<Vec<u8>> = words.iter().map(|w| w.as_bytes().to_vec()).collect();
            script_key(&Args::Owned(&owned))
        };
        let sha = key(&["EVALSHA", "ABC", "0"]);
        assert_eq!(sha, key(&["evalsha_ro", "abc", "1", "k"]));
        assert_ne!(sha, key(&["EVAL", "ABC", "0"]));
        assert_ne!(
            key(&["EVAL", "return 1", "0"]),
            key(&["EVAL", "RETURN 1", "0"])
        );
        assert_ne!(key(&["FCALL", "f", "0"]), key(&["FCALL", "g", "0"]));
        assert_eq!(key(&["EVAL"]), None);
    }

    #[test]
    fn scripts_and_functions_are_exclusive() {
        for name in [
            "eval",
            "EVALSHA",
            "eval_ro",
            "EvalSha_Ro",
            "fcall",
            "FCALL_RO",
        ] {
            assert_eq!(of(&[name, "x", "0"]), Some(Exclusive::Script), "{name}");
        }
        assert_eq!(of(&["SCRIPT", "LOAD", "return 1"]), None);
        assert_eq!(of(&["FUNCTION", "STATS"]), None);
        assert_eq!(of(&["GET", "k"]), None);
    }

    #[test]
    fn kills_and_shutdown_go_out_of_band() {
        assert_eq!(of(&["script", "kill"]), Some(Exclusive::OutOfBand));
        assert_eq!(of(&["FUNCTION", "Kill"]), Some(Exclusive::OutOfBand));
        assert_eq!(of(&["shutdown"]), Some(Exclusive::OutOfBand));
        assert_eq!(of(&["SHUTDOWN", "NOSAVE"]), Some(Exclusive::OutOfBand));
        // A wrong arity is Redis's to report, wherever it is sent.
        assert_eq!(of(&["SCRIPT", "KILL", "x"]), None);
    }

    #[test]
    fn busy_and_loading_replies_are_recognised() {
        assert!(reports_busy(
            b"-BUSY Redis is busy running a script. You can only call SCRIPT KILL or SHUTDOWN NOSAVE.\r\n"
        ));
        assert!(reports_busy(
            b"-LOADING Redis is loading the dataset in memory\r\n"
        ));
        assert!(!reports_busy(b"-ERR BUSY\r\n"));
        assert!(!reports_busy(b"+BUSY\r\n"));
        assert!(!reports_busy(
            b"-BUSYKEY Target key name already exists.\r\n"
        ));
        assert!(!reports_busy(
            b"-BUSYGROUP Consumer Group name already exists\r\n"
        ));
    }
}
