//! Which AUTH and HELLO AUTH requests Redis must check: those naming a Redis ACL user other
//! than `default` (see `users.rs` for what corral does with them).

use bytes::Bytes;

use crate::commands::Local;
use crate::resp::digits::parse_int;
use crate::resp::{Args, Proto};
use crate::upstream::Secret;

/// An AUTH or HELLO AUTH that Redis must check: its user, and what a HELLO changes.
#[derive(Debug)]
pub(super) struct UserAuth {
    /// The user name, as the client sent it.
    pub(super) user: Bytes,
    /// The password, to authenticate the user's pool connections (never shown).
    pub(super) password: Secret,
    /// HELLO: the protocol and name to take once Redis accepted it.
    pub(super) hello: Option<HelloSet>,
}

/// What a successful HELLO changes in the session.
#[derive(Debug)]
pub(super) struct HelloSet {
    pub(super) proto: Proto,
    /// SETNAME's argument, if given.
    pub(super) name: Option<Bytes>,
}

/// The AUTH or HELLO AUTH in `args` when it names a user other than `default` (corral has no
/// users of its own: `requirepass` is its `default`). `None` for every other form, which
/// corral answers itself, syntax errors included: Redis reports them before checking the
/// credentials, with the same text.
pub(super) fn upstream_auth(cmd: Local, args: &Args<'_>) -> Option<UserAuth> {
    let other = |u: &[u8]| u != b"default";
    match cmd {
        Local::Auth if args.len() == 3 => {
            let (user, pass) = (args.get(1)?, args.get(2)?);
            other(user).then(|| UserAuth {
                user: Bytes::copy_from_slice(user),
                password: Secret::new(pass),
                hello: None,
            })
        }
        Local::Hello => {
            let proto = match parse_int(args.get(1)?)? {
                2 => Proto::Resp2,
                3 => Proto::Resp3,
                _ => return None,
            };
            let (mut user, mut pass, mut name) = (None, None, None);
            let mut i = 2;
            while let Some(opt) = args.get(i) {
                let more = args.len() - i - 1;
                if opt.eq_ignore_ascii_case(b"AUTH") && more >= 2 {
                    user = args.get(i + 1);
                    pass = args.get(i + 2);
                    i += 3;
                } else if opt.eq_ignore_ascii_case(b"SETNAME") && more >= 1 {
                    name = args.get(i + 1).map(Bytes::copy_from_slice);
                    i += 2;
                } else {
                    return None;
                }
            }
            let user = user.filter(|u| other(u))?;
            Some(UserAuth {
                user: Bytes::copy_from_slice(user),
                password: Secret::new(pass?),
                hello: Some(HelloSet { proto, name }),
            })
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(words: &[&str]) -> Option<UserAuth> {
        let owned: Vec<Vec<u8>> = words.iter().map(|w| w.as_bytes().to_vec()).collect();
        let args = Args::Owned(&owned);
        let cmd = match crate::commands::classify(&args) {
            crate::commands::Route::Local(c) => c,
            _ => return None,
        };
        upstream_auth(cmd, &args)
    }

    #[test]
    fn only_other_users_go_to_redis() {
        assert!(parse(&["AUTH", "pass"]).is_none());
        assert!(parse(&["AUTH", "default", "pass"]).is_none());
        assert_eq!(
            &parse(&["AUTH", "bob", "p"])
                .map(|a| a.user)
                .unwrap_or_default()[..],
            b"bob"
        );
        assert!(parse(&["AUTH", "bob", "p", "x"]).is_none());
        assert!(parse(&["HELLO", "3"]).is_none());
        assert!(parse(&["HELLO", "3", "AUTH", "default", "p"]).is_none());
        assert!(parse(&["HELLO", "4", "AUTH", "bob", "p"]).is_none());
        assert!(parse(&["HELLO", "3", "AUTH", "bob"]).is_none());
        let a = parse(&["hello", "3", "setname", "n", "auth", "bob", "p"]);
        let h = a.and_then(|a| a.hello);
        assert!(h.as_ref().is_some_and(|h| h.proto == Proto::Resp3));
        assert_eq!(h.and_then(|h| h.name).as_deref(), Some(&b"n"[..]));
    }
}
