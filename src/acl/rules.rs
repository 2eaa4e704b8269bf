//! Redis ACL rules (`+@read -@dangerous -flushall ~cache:* &news.*`), parsed and compiled into
//! what a user may run and touch.
//!
//! Rules apply left to right, as `ACL SETUSER` applies them: a later rule overrides an earlier
//! one for the commands it names. Commands come from [`super::table`] (Redis's own list with
//! its categories); a command missing from it (newer than the table) is allowed only by
//! `+@all`/`allcommands` or by its own name.

use super::table::{CATEGORIES, COMMANDS};

/// The compiled command, key and channel permissions of one user.
#[derive(Debug, Clone, Default)]
pub struct Perms {
    /// Indexes into [`COMMANDS`] of the allowed commands and subcommands.
    allowed: Vec<bool>,
    /// `+@all`/`allcommands` was the last word on every command (future ones included).
    all_commands: bool,
    /// Commands unknown to the table, allowed (`true`) or denied by name.
    unknown: Vec<(String, bool)>,
    /// `~pattern`s; `None` when every key is allowed (`allkeys`, `~*`).
    pub(super) keys: Option<Vec<Vec<u8>>>,
    /// `&pattern`s; `None` when every channel is allowed (`allchannels`, `&*`).
    pub(super) channels: Option<Vec<Vec<u8>>>,
}

/// Word-level settings that are not permissions: passwords and the on/off switch.
#[derive(Debug, Default)]
pub struct Words {
    /// `>password` words, in clear.
    pub passwords: Vec<String>,
    /// `#<sha256 hex>` words.
    pub hashes: Vec<String>,
    /// `nopass`.
    pub nopass: bool,
    /// `on`/`off`, when given.
    pub enabled: Option<bool>,
}

impl Perms {
    /// Parses `rules` (space-separated ACL words) starting from no permissions at all, as
    /// a new Redis user starts.
    pub fn parse(rules: &str) -> Result<(Perms, Words), String> {
        let mut perms = Perms {
            allowed: vec![false; COMMANDS.len()],
            keys: Some(Vec::new()),
            channels: Some(Vec::new()),
            ..Perms::default()
        };
        let mut words = Words::default();
        for word in rules.split_whitespace() {
            perms.apply(word, &mut words)?;
        }
        Ok((perms, words))
    }

    /// Every command, key and channel: `+@all allkeys allchannels`.
    pub fn everything() -> Perms {
        Perms {
            allowed: vec![true; COMMANDS.len()],
            all_commands: true,
            unknown: Vec::new(),
            keys: None,
            channels: None,
        }
    }

    fn apply(&mut self, word: &str, words: &mut Words) -> Result<(), String> {
        let lower = word.to_ascii_lowercase();
        match lower.as_str() {
            "on" => words.enabled = Some(true),
            "off" => words.enabled = Some(false),
            "nopass" => words.nopass = true,
            "allcommands" => self.set_all(true),
            "nocommands" => self.set_all(false),
            "allkeys" => self.keys = None,
            "resetkeys" => self.keys = Some(Vec::new()),
            "allchannels" => self.channels = None,
            "resetchannels" => self.channels = Some(Vec::new()),
            _ => return self.apply_prefixed(word, &lower, words),
        }
        Ok(())
    }

    fn apply_prefixed(&mut self, word: &str, lower: &str, words: &mut Words) -> Result<(), String> {
        let (first, rest) = word.split_at(1);
        match first {
            ">" => words.passwords.push(rest.to_string()),
            "#" => {
                if rest.len() != 64 || !rest.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err("a '#' password hash must be 64 hex digits (SHA-256)".into());
                }
                words.hashes.push(rest.to_ascii_lowercase());
            }
            "~" => add_pattern(&mut self.keys, rest),
            "&" => add_pattern(&mut self.channels, rest),
            "%" => {
                return Err(format!(
                    "'{word}': read/write key permissions are not supported"
                ));
            }
            "+" | "-" => self.set_command(&lower[1..], first == "+")?,
            _ if word.starts_with('(') => {
                return Err(format!("'{word}': selectors are not supported"));
            }
            _ => return Err(format!("unknown ACL rule '{word}'")),
        }
        Ok(())
    }

    fn set_all(&mut self, on: bool) {
        self.allowed.iter_mut().for_each(|a| *a = on);
        self.all_commands = on;
        self.unknown.clear();
    }

    fn set_command(&mut self, name: &str, on: bool) -> Result<(), String> {
        if let Some(cat) = name.strip_prefix('@') {
            if cat == "all" {
                self.set_all(on);
                return Ok(());
            }
            let bit = CATEGORIES
                .iter()
                .position(|c| *c == cat)
                .ok_or_else(|| format!("unknown command category '@{cat}'"))?;
            for (i, (_, _, mask)) in COMMANDS.iter().enumerate() {
                if mask & (1 << bit) != 0 {
                    self.allowed[i] = on;
                }
            }
            // A category never covers commands this table does not know.
            if !on {
                self.all_commands = false;
            }
            return Ok(());
        }
        if name.is_empty() {
            return Err("a '+' or '-' rule needs a command name".into());
        }
        let container = format!("{name}|");
        let mut found = false;
        for (i, (cmd, _, _)) in COMMANDS.iter().enumerate() {
            // `+config` covers `config|get` too; `+config|get` only itself.
            if *cmd == name || cmd.starts_with(&container) {
                self.allowed[i] = on;
                found = true;
            }
        }
        if !found {
            if name.contains('|') {
                return Err(format!("unknown command '{name}'"));
            }
            self.unknown.retain(|(n, _)| n != name);
            self.unknown.push((name.to_string(), on));
        }
        if !on {
            self.all_commands = false;
        }
        Ok(())
    }

    /// Whether these are all the permissions there are (`+@all allkeys allchannels`), so
    /// that checking them can be skipped.
    pub fn is_everything(&self) -> bool {
        self.all_commands
            && self.allowed.iter().all(|a| *a)
            && self.unknown.iter().all(|(_, on)| *on)
            && self.keys.is_none()
            && self.channels.is_none()
    }

    /// Whether `name` (lower case; `container|sub` for a subcommand) may run.
    pub fn command_allowed(&self, name: &str) -> bool {
        match COMMANDS.binary_search_by(|(cmd, _, _)| (*cmd).cmp(name)) {
            Ok(i) => self.allowed.get(i).copied().unwrap_or(false),
            Err(_) => match self.unknown.iter().find(|(n, _)| n == name) {
                Some((_, on)) => *on,
                None => self.all_commands,
            },
        }
    }

    /// Whether `key` matches one of the key patterns.
    pub fn key_allowed(&self, key: &[u8]) -> bool {
        matches_any(&self.keys, key, false)
    }

    /// Whether `channel` matches one of the channel patterns; a `pattern` subscription
    /// (PSUBSCRIBE) must equal one of them literally, as in Redis.
    pub fn channel_allowed(&self, channel: &[u8], pattern: bool) -> bool {
        matches_any(&self.channels, channel, pattern)
    }
}

fn add_pattern(list: &mut Option<Vec<Vec<u8>>>, pattern: &str) {
    if pattern == "*" {
        *list = None;
    } else if let Some(list) = list {
        list.push(pattern.as_bytes().to_vec());
    }
}

fn matches_any(list: &Option<Vec<Vec<u8>>>, s: &[u8], literal: bool) -> bool {
    match list {
        None => true,
        Some(list) => list.iter().any(|p| {
            if literal {
                p == s
            } else {
                crate::commands::glob::matches(p, s)
            }
        }),
    }
}

/// Whether `name` is a container command (its table entries include `name|...`).
pub fn is_container(name: &str) -> bool {
    let prefix = format!("{name}|");
    let i = COMMANDS.partition_point(|(cmd, _, _)| *cmd < prefix.as_str());
    COMMANDS
        .get(i)
        .is_some_and(|(cmd, _, _)| cmd.starts_with(&prefix))
}

/// The arity Redis declares for `name` (`container|sub` for a subcommand).
pub fn arity(name: &str) -> Option<i32> {
    COMMANDS
        .binary_search_by(|(cmd, _, _)| (*cmd).cmp(name))
        .ok()
        .map(|i| COMMANDS[i].1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn perms(rules: &str) -> Perms {
        match Perms::parse(rules) {
            Ok((p, _)) => p,
            Err(e) => panic!("{rules}: {e}"),
        }
    }

    #[test]
    fn rules_apply_left_to_right() {
        let p = perms("+@read -@dangerous -get");
        assert!(p.command_allowed("mget"));
        assert!(!p.command_allowed("get"));
        assert!(
            !p.command_allowed("keys"),
            "keys is @read but also @dangerous"
        );
        assert!(!p.command_allowed("set"));
        let p = perms("-@all +get");
        assert!(p.command_allowed("get"));
        assert!(!p.command_allowed("mget"));
        let p = perms("+@all -flushall");
        assert!(p.command_allowed("set"));
        assert!(!p.command_allowed("flushall"));
        assert!(
            !p.command_allowed("somefuturecommand"),
            "a '-' ends allcommands"
        );
        assert!(perms("allcommands").command_allowed("somefuturecommand"));
        assert!(!perms("+@read").command_allowed("somefuturecommand"));
    }

    #[test]
    fn subcommands_follow_their_container_unless_named() {
        let p = perms("+config|get");
        assert!(p.command_allowed("config|get"));
        assert!(!p.command_allowed("config|set"));
        let p = perms("+config -config|set");
        assert!(p.command_allowed("config|get"));
        assert!(!p.command_allowed("config|set"));
        assert!(is_container("config"));
        assert!(!is_container("get"));
        assert_eq!(arity("get"), Some(2));
        assert_eq!(arity("config|get"), Some(-3));
    }

    #[test]
    fn keys_and_channels() {
        let p = perms("+@all ~cache:* ~s?ssion");
        assert!(p.key_allowed(b"cache:1"));
        assert!(p.key_allowed(b"session"));
        assert!(!p.key_allowed(b"other"));
        assert!(perms("allkeys").key_allowed(b"x"));
        assert!(perms("~* resetkeys ~a").key_allowed(b"a"));
        assert!(!perms("").key_allowed(b"a"), "a new user has no keys");
        let p = perms("&news.*");
        assert!(p.channel_allowed(b"news.tech", false));
        assert!(!p.channel_allowed(b"news.*x", true));
        assert!(p.channel_allowed(b"news.*", true));
        assert!(!p.channel_allowed(b"sport", false));
    }

    #[test]
    fn bad_rules_are_refused() {
        for bad in ["+@nosuch", "%R~x", "bogus", "+nosuch|sub", "#abc", "(+get)"] {
            assert!(Perms::parse(bad).is_err(), "{bad}");
        }
        let (_, w) = Perms::parse("on >secret nopass").expect("valid");
        assert_eq!(w.passwords, vec!["secret".to_string()]);
        assert!(w.nopass);
        assert_eq!(w.enabled, Some(true));
        assert!(CATEGORIES.contains(&"dangerous"));
    }
}
