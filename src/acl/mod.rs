//! corral's own users (`[[users]]` in the config): passwords and permissions in Redis ACL
//! syntax, checked by corral before a command is forwarded, with Redis's own error texts.
//!
//! `requirepass` is the `default` user with every permission. Passwords are kept only as
//! SHA-256 digests, as Redis keeps them, and never printed: [`User`]'s `Debug` omits them.

mod guard;
mod password;
mod rules;
pub mod table;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use crate::error::replies;

pub use guard::{Guard, GuardConfig, Verdict, unknown_subcommand};
pub use password::DefaultPassword;
pub use rules::{Perms, arity, is_container};

/// One `[[users]]` entry of the config file.
#[derive(Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserSpec {
    /// The user name clients give to `AUTH user pass` / `HELLO 3 AUTH user pass`.
    pub name: String,
    /// A password in clear text.
    #[serde(default)]
    pub password: Option<String>,
    /// A password as its SHA-256 digest in hex, as `ACL SETUSER ... #<hash>` takes it.
    #[serde(default)]
    pub password_sha256: Option<String>,
    /// Permissions, in Redis ACL syntax: `+@read -@dangerous -flushall ~cache:* &news.*`.
    /// A user starts with none (as in Redis) and is on unless the rules say `off`.
    #[serde(default)]
    pub rules: String,
}

impl fmt::Debug for UserSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UserSpec")
            .field("name", &self.name)
            .field("rules", &redact_rules(&self.rules))
            .finish_non_exhaustive()
    }
}

/// `rules` with every `>password` and `#hash` word replaced, for logs and errors.
fn redact_rules(rules: &str) -> String {
    rules
        .split_whitespace()
        .map(|w| {
            if w.starts_with(['>', '<', '#', '!']) {
                "<redacted>"
            } else {
                w
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A user clients can authenticate as.
pub struct User {
    name: String,
    digests: Vec<[u8; 32]>,
    nopass: bool,
    enabled: bool,
    /// Some command, key or channel is not allowed: requests must be checked.
    restricted: bool,
    perms: Perms,
}

impl fmt::Debug for User {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("User")
            .field("name", &self.name)
            .field("enabled", &self.enabled)
            .finish_non_exhaustive()
    }
}

/// Why a command was refused; [`Denied::reply`] is Redis's error for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    /// The command (its full name, `container|sub` for a subcommand) is not allowed.
    Command(String),
    /// One of the keys is outside the user's key patterns.
    Key,
    /// One of the channels is outside the user's channel patterns.
    Channel,
}

impl Denied {
    /// The error reply Redis gives for this refusal (Redis 7.0's texts).
    pub fn reply(&self) -> Bytes {
        match self {
            Denied::Command(name) => replies::line(&replies::no_permission(name)),
            Denied::Key => replies::NOPERM_KEY.to_bytes(),
            Denied::Channel => replies::NOPERM_CHANNEL.to_bytes(),
        }
    }
}

impl User {
    /// Builds a user from its config entry.
    pub fn from_spec(spec: &UserSpec) -> Result<User, String> {
        let err = |e: String| format!("user '{}': {e}", spec.name);
        if spec.name.is_empty() || spec.name.contains(char::is_whitespace) {
            return Err(err(
                "a user name must be non-empty and without spaces".into()
            ));
        }
        let (perms, words) = Perms::parse(&spec.rules).map_err(err)?;
        let mut digests: Vec<[u8; 32]> = words.passwords.iter().map(sha256).collect();
        digests.extend(spec.password.iter().map(sha256));
        for hex in words.hashes.iter().chain(spec.password_sha256.iter()) {
            digests.push(parse_digest(hex).ok_or_else(|| {
                err("password_sha256 must be 64 hex digits (a SHA-256 digest)".into())
            })?);
        }
        Ok(User {
            name: spec.name.clone(),
            digests,
            nopass: words.nopass,
            enabled: words.enabled.unwrap_or(true),
            restricted: !perms.is_everything(),
            perms,
        })
    }

    /// The `default` user of `requirepass`: every command, key and channel.
    pub fn default_user(requirepass: Option<&str>) -> User {
        User {
            name: "default".into(),
            digests: requirepass.map(sha256).into_iter().collect(),
            nopass: requirepass.is_none(),
            enabled: true,
            restricted: false,
            perms: Perms::everything(),
        }
    }

    /// The user's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether some command, key or channel is denied (else checks can be skipped).
    pub fn restricted(&self) -> bool {
        self.restricted
    }

    /// Whether every key is allowed (`allkeys`, `~*`).
    pub fn all_keys(&self) -> bool {
        self.perms.keys.is_none()
    }

    /// Whether `password` opens this user.
    pub fn password_ok(&self, password: &[u8]) -> bool {
        if !self.enabled {
            return false;
        }
        if self.nopass {
            return true;
        }
        let digest = sha256(password);
        self.digests.iter().any(|d| d == &digest)
    }

    /// Checks a command (`argv[0]` is its name, in any case) against the user's command
    /// rules, as Redis does after its arity check: a request Redis would refuse for its
    /// arity anyway (see [`malformed`]) is let through, so the client gets Redis's error.
    pub fn check_command(&self, argv: &[&[u8]]) -> Result<(), Denied> {
        match resolve(argv) {
            Ok(name) if !argv.is_empty() => self.check_named(name),
            _ => Ok(()),
        }
    }

    /// Checks a command by the name [`resolve`] gave it against the user's command rules.
    pub fn check_named(&self, name: String) -> Result<(), Denied> {
        // AUTH, HELLO, QUIT and RESET are never refused (`no_auth` in Redis).
        if table::NO_AUTH.contains(&name.as_str()) || self.perms.command_allowed(&name) {
            Ok(())
        } else {
            Err(Denied::Command(name))
        }
    }

    /// Checks the keys a command touches against the key patterns.
    pub fn check_keys<'a>(&self, mut keys: impl Iterator<Item = &'a [u8]>) -> Result<(), Denied> {
        if keys.all(|k| self.perms.key_allowed(k)) {
            Ok(())
        } else {
            Err(Denied::Key)
        }
    }

    /// Checks the channels a PUBLISH or (P/S)SUBSCRIBE names.
    pub fn check_channels<'a>(
        &self,
        mut channels: impl Iterator<Item = &'a [u8]>,
        patterns: bool,
    ) -> Result<(), Denied> {
        if channels.all(|c| self.perms.channel_allowed(c, patterns)) {
            Ok(())
        } else {
            Err(Denied::Channel)
        }
    }
}

/// Redis's refusal of a request it runs for nobody: an unknown subcommand of a container
/// command, or a wrong number of arguments. Redis checks both right after it looks the
/// command up, before authentication and permissions. None for a well-formed request, and for
/// a command Redis 7.0 does not know (left to the upstream, which may).
pub fn malformed(argv: &[&[u8]]) -> Option<Bytes> {
    resolve(argv).err()
}

/// The lower-case name Redis's command table knows a well-formed request by
/// (`container|sub` for a subcommand), or Redis's refusal of a malformed one (see
/// [`malformed`]).
pub fn resolve(argv: &[&[u8]]) -> Result<String, Bytes> {
    let first = argv.first().copied().unwrap_or_default();
    let name = String::from_utf8_lossy(first).to_ascii_lowercase();
    let name = match argv.get(1) {
        Some(sub) if is_container(&name) => {
            let full = format!(
                "{name}|{}",
                String::from_utf8_lossy(sub).to_ascii_lowercase()
            );
            if arity(&full).is_none() {
                return Err(unknown_subcommand(first, sub));
            }
            full
        }
        _ => name,
    };
    match arity(&name) {
        Some(a) if !arity_ok(a, argv.len()) => Err(replies::line(&replies::wrong_arity(&name))),
        _ => Ok(name),
    }
}

fn arity_ok(arity: i32, argc: usize) -> bool {
    let argc = argc as i64;
    let arity = i64::from(arity);
    if arity >= 0 {
        argc == arity
    } else {
        argc >= -arity
    }
}

fn sha256(password: impl AsRef<[u8]>) -> [u8; 32] {
    Sha256::digest(password.as_ref()).into()
}

fn parse_digest(hex: &str) -> Option<[u8; 32]> {
    let bytes = hex.as_bytes();
    if bytes.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks(2).enumerate() {
        let s = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(s, 16).ok()?;
    }
    Some(out)
}

/// Every user corral knows, by name.
#[derive(Debug, Default)]
pub struct Users {
    by_name: HashMap<String, Arc<User>>,
}

impl Users {
    /// The users of the config, and `default` from `requirepass` unless a `[[users]]` entry
    /// defines `default` itself (then `requirepass` must be unset).
    pub fn new(specs: &[UserSpec], requirepass: Option<&str>) -> Result<Users, String> {
        let mut by_name = HashMap::new();
        for spec in specs {
            let user = User::from_spec(spec)?;
            if by_name.insert(user.name.clone(), Arc::new(user)).is_some() {
                return Err(format!("user '{}' is defined twice", spec.name));
            }
        }
        if by_name.contains_key("default") {
            if requirepass.is_some() {
                return Err("requirepass and a [[users]] entry named 'default' both define the default user".into());
            }
        } else {
            by_name.insert("default".into(), Arc::new(User::default_user(requirepass)));
        }
        Ok(Users { by_name })
    }

    /// Whether users other than `default` are configured.
    pub fn has_named_users(&self) -> bool {
        self.by_name.len() > 1
    }

    /// The user `name` if `password` opens it.
    pub fn authenticate(&self, name: &[u8], password: &[u8]) -> Option<Arc<User>> {
        let name = std::str::from_utf8(name).ok()?;
        self.by_name
            .get(name)
            .filter(|u| u.password_ok(password))
            .cloned()
    }

    /// Whether a user of that name is configured.
    pub fn knows(&self, name: &[u8]) -> bool {
        std::str::from_utf8(name).is_ok_and(|n| self.by_name.contains_key(n))
    }

    /// The `default` user.
    pub fn default_user(&self) -> Option<Arc<User>> {
        self.by_name.get("default").cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(rules: &str) -> User {
        let spec = UserSpec {
            name: "app".into(),
            password: Some("pw".into()),
            rules: rules.into(),
            ..UserSpec::default()
        };
        match User::from_spec(&spec) {
            Ok(u) => u,
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn malformed_requests_get_redis_own_errors() {
        let m = |argv: &[&[u8]]| malformed(argv).map(|b| String::from_utf8_lossy(&b).into_owned());
        assert_eq!(m(&[b"GET", b"k"]), None);
        assert_eq!(
            m(&[b"get"]).as_deref(),
            Some("-ERR wrong number of arguments for 'get' command\r\n")
        );
        assert_eq!(
            m(&[b"Client", b"setname"]).as_deref(),
            Some("-ERR wrong number of arguments for 'client|setname' command\r\n")
        );
        assert_eq!(
            m(&[b"CLIENT"]).as_deref(),
            Some("-ERR wrong number of arguments for 'client' command\r\n")
        );
        assert_eq!(
            m(&[b"object", b"Nope", b"k"]).as_deref(),
            Some("-ERR unknown subcommand 'Nope'. Try OBJECT HELP.\r\n")
        );
        // Commands Redis 7.0 does not know are left to the upstream.
        assert_eq!(m(&[b"nosuch"]), None);
        assert_eq!(m(&[]), None);
    }

    #[test]
    fn commands_are_checked_with_redis_texts() {
        let u = user("+@read -@dangerous ~cache:*");
        assert_eq!(u.check_command(&[b"GET", b"k"]), Ok(()));
        let denied = u.check_command(&[b"set", b"k", b"v"]);
        assert_eq!(denied, Err(Denied::Command("set".into())));
        assert_eq!(
            &Denied::Command("set".into()).reply()[..],
            b"-NOPERM this user has no permissions to run the 'set' command\r\n"
        );
        let denied = u.check_command(&[b"CONFIG", b"GET", b"x"]);
        assert_eq!(denied, Err(Denied::Command("config|get".into())));
        // Arity errors and unknown subcommands are Redis's to report.
        assert_eq!(u.check_command(&[b"set", b"k"]), Ok(()));
        assert_eq!(u.check_command(&[b"config", b"nosuch"]), Ok(()));
        assert_eq!(u.check_command(&[b"auth", b"x", b"y"]), Ok(()));
        assert_eq!(u.check_keys([&b"cache:1"[..]].into_iter()), Ok(()));
        assert_eq!(
            u.check_keys([&b"cache:1"[..], b"other"].into_iter()),
            Err(Denied::Key)
        );
        assert_eq!(
            u.check_channels([&b"c"[..]].into_iter(), false),
            Err(Denied::Channel)
        );
    }

    #[test]
    fn passwords_plain_hashed_and_off() {
        let u = user("");
        assert!(u.password_ok(b"pw"));
        assert!(!u.password_ok(b"nope"));
        // sha256("secret")
        let hash = "2bb80d537b1da3e38bd30361aa855686bde0eacd7162fef6a25fe97bf527a25b";
        let spec = UserSpec {
            name: "h".into(),
            password_sha256: Some(hash.into()),
            ..UserSpec::default()
        };
        let users = Users::new(&[spec], Some("top")).expect("valid");
        assert!(users.authenticate(b"h", b"secret").is_some());
        assert!(users.authenticate(b"h", b"top").is_none());
        assert!(users.authenticate(b"default", b"top").is_some());
        assert!(users.authenticate(b"nobody", b"top").is_none());
        assert!(!user("off").password_ok(b"pw"));
        assert!(user("nopass").password_ok(b"anything"));
    }

    #[test]
    fn config_errors_and_redaction() {
        let twice = UserSpec {
            name: "a".into(),
            ..UserSpec::default()
        };
        assert!(Users::new(&[twice.clone(), twice], None).is_err());
        let default = UserSpec {
            name: "default".into(),
            ..UserSpec::default()
        };
        assert!(Users::new(&[default], Some("x")).is_err());
        let spec = UserSpec {
            name: "a".into(),
            password: Some("hunter2".into()),
            rules: ">hunter3 +get".into(),
            ..UserSpec::default()
        };
        let shown = format!("{spec:?} {:?}", User::from_spec(&spec));
        assert!(!shown.contains("hunter"), "{shown}");
    }
}
