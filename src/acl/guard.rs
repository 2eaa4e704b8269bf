//! Commands refused or renamed for every client (`[commands]` in the config), as Redis's
//! `rename-command` does: a refused command, or the old name of a renamed one, is an unknown
//! command, with Redis's error; the new name runs the command.

use std::collections::HashMap;

use serde::Deserialize;

use crate::error::replies;

/// The `[commands]` section of the config.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GuardConfig {
    /// Commands no client may run: `"FLUSHALL"`, or a subcommand as `"SCRIPT FLUSH"` /
    /// `"script|flush"`.
    pub deny: Vec<String>,
    /// `OLD = "NEW"`: clients must call OLD by the name NEW; OLD becomes unknown. An empty NEW
    /// refuses OLD (as `rename-command OLD ""` does).
    pub rename: HashMap<String, String>,
}

/// What the guard decided for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Forward as sent.
    Pass,
    /// The client used a new name: forward with argument 0 replaced by this (the command's
    /// real name).
    Rename(String),
    /// Unknown to clients: reply Redis's "unknown command" error.
    UnknownCommand,
    /// A refused subcommand: reply Redis's "unknown subcommand" error.
    UnknownSubcommand,
}

/// The compiled `[commands]` section.
#[derive(Debug, Default)]
pub struct Guard {
    /// Lower-case command names clients may not use (refused ones, old names of renamed).
    hidden: Vec<String>,
    /// Lower-case `container|sub` names refused.
    hidden_subs: Vec<String>,
    /// Lower-case new name -> real name.
    aliases: HashMap<String, String>,
}

impl Guard {
    /// Compiles the config section; names are checked against Redis's command table.
    pub fn new(cfg: &GuardConfig) -> Result<Guard, String> {
        let mut guard = Guard::default();
        for entry in &cfg.deny {
            let name = entry.trim().to_ascii_lowercase().replace(' ', "|");
            if super::arity(&name).is_none() {
                return Err(format!("[commands] deny: unknown command '{entry}'"));
            }
            if name.contains('|') {
                guard.hidden_subs.push(name);
            } else {
                guard.hidden.push(name);
            }
        }
        for (old, new) in &cfg.rename {
            let old_l = old.to_ascii_lowercase();
            if old_l.contains(['|', ' ']) || super::arity(&old_l).is_none() {
                return Err(format!("[commands] rename: unknown command '{old}'"));
            }
            let new_l = new.to_ascii_lowercase();
            if new_l.contains(char::is_whitespace) {
                return Err(format!("[commands] rename: '{new}' is not a command name"));
            }
            if !new_l.is_empty() {
                if super::arity(&new_l).is_some() || guard.aliases.contains_key(&new_l) {
                    return Err(format!("[commands] rename: '{new}' is already a command"));
                }
                guard.aliases.insert(new_l, old.to_ascii_uppercase());
            }
            guard.hidden.push(old_l);
        }
        Ok(guard)
    }

    /// Whether the guard changes anything (so callers can skip it).
    pub fn is_empty(&self) -> bool {
        self.hidden.is_empty() && self.hidden_subs.is_empty() && self.aliases.is_empty()
    }

    /// Decides for a request whose argument 0 is `name` and argument 1 `sub` (any case).
    pub fn check(&self, name: &[u8], sub: Option<&[u8]>) -> Verdict {
        // Lower-cased on the stack: this runs for every request of every client.
        let mut buf = [0u8; 64];
        let owned;
        let lower: &str = match buf.get_mut(..name.len()) {
            Some(b) => {
                b.copy_from_slice(name);
                b.make_ascii_lowercase();
                match std::str::from_utf8(b) {
                    Ok(s) => s,
                    // Not UTF-8: no configured name (TOML text) can match it.
                    Err(_) => return Verdict::Pass,
                }
            }
            None => {
                owned = String::from_utf8_lossy(name).to_ascii_lowercase();
                &owned
            }
        };
        if let Some(real) = self.aliases.get(lower) {
            return Verdict::Rename(real.clone());
        }
        if self.hidden.iter().any(|h| h == lower) {
            return Verdict::UnknownCommand;
        }
        // `container|sub` entries, compared without building the full name.
        let hidden_sub = |h: &String| {
            h.strip_prefix(lower)
                .and_then(|rest| rest.strip_prefix('|'))
                .zip(sub)
                .is_some_and(|(hs, sub)| hs.as_bytes().eq_ignore_ascii_case(sub))
        };
        if self.hidden_subs.iter().any(hidden_sub) {
            return Verdict::UnknownSubcommand;
        }
        Verdict::Pass
    }

    /// Whether clients can see `name` (lower case): false for refused commands and old names.
    pub fn visible(&self, name: &str) -> bool {
        !self.hidden.iter().any(|h| h == name)
    }
}

/// Redis's error for a refused subcommand: `-ERR unknown subcommand 'flush'. Try SCRIPT HELP.`
pub fn unknown_subcommand(name: &[u8], sub: &[u8]) -> bytes::Bytes {
    // Redis prints at most 128 bytes of the subcommand.
    let sub = &sub[..sub.len().min(128)];
    replies::line(&replies::unknown_subcommand(
        sub,
        &String::from_utf8_lossy(name),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn guard(deny: &[&str], rename: &[(&str, &str)]) -> Result<Guard, String> {
        Guard::new(&GuardConfig {
            deny: deny.iter().map(|s| s.to_string()).collect(),
            rename: rename
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
        })
    }

    #[test]
    fn deny_and_rename() {
        let g = guard(
            &["FLUSHALL", "script flush"],
            &[("config", "cfg_x"), ("keys", "")],
        )
        .expect("valid");
        assert_eq!(g.check(b"flushall", None), Verdict::UnknownCommand);
        assert_eq!(g.check(b"CONFIG", Some(b"get")), Verdict::UnknownCommand);
        assert_eq!(
            g.check(b"Cfg_X", Some(b"get")),
            Verdict::Rename("CONFIG".into())
        );
        assert_eq!(g.check(b"keys", Some(b"*")), Verdict::UnknownCommand);
        assert_eq!(
            g.check(b"SCRIPT", Some(b"FLUSH")),
            Verdict::UnknownSubcommand
        );
        assert_eq!(g.check(b"SCRIPT", Some(b"EXISTS")), Verdict::Pass);
        assert_eq!(g.check(b"get", Some(b"k")), Verdict::Pass);
        assert!(!g.visible("config"));
        assert_eq!(
            &unknown_subcommand(b"script", b"FLUSH")[..],
            b"-ERR unknown subcommand 'FLUSH'. Try SCRIPT HELP.\r\n"
        );
    }

    #[test]
    fn long_and_binary_names() {
        let long = "n".repeat(70);
        let g = guard(&[], &[("config", long.as_str())]).expect("valid");
        let upper = long.to_ascii_uppercase();
        assert_eq!(
            g.check(upper.as_bytes(), None),
            Verdict::Rename("CONFIG".into())
        );
        assert_eq!(g.check(&[0xff, b'x'], None), Verdict::Pass);
        assert_eq!(g.check(b"CONFIG", Some(&[0xff])), Verdict::UnknownCommand);
    }

    #[test]
    fn bad_names_are_refused() {
        assert!(guard(&["NOSUCH"], &[]).is_err());
        assert!(guard(&[], &[("config", "get")]).is_err());
        assert!(guard(&[], &[("nosuch", "x")]).is_err());
        assert!(guard(&[], &[("config", "a b")]).is_err());
        assert!(guard(&[], &[]).is_ok_and(|g| g.is_empty()));
    }
}
