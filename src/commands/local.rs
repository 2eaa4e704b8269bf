//! Commands corral answers itself, with Redis's replies and error texts.

use bytes::{Bytes, BytesMut};

use super::session::Session;
use super::table::Local;
use crate::error::replies::{self, Canned};
use crate::resp::Args;
use crate::resp::digits::parse_int;
use crate::resp::reply::{self, Encoder, Proto};

/// What the server needs to know to answer local commands.
#[derive(Debug, Clone, Copy)]
pub struct LocalCtx<'a> {
    /// Password clients must present, if any.
    pub requirepass: Option<&'a str>,
    /// Version reported by HELLO: the upstream's when known.
    pub version: &'a str,
    /// corral's own users (`[[users]]`), checked besides `default`.
    pub users: Option<&'a crate::acl::Users>,
}

/// What the connection does after a local command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Go on reading requests.
    Continue,
    /// Write the reply, then close (QUIT).
    Close,
}

/// Runs a local command and writes its reply to `out` in the client's protocol.
pub fn execute(
    cmd: Local,
    args: &Args<'_>,
    s: &mut Session,
    ctx: &LocalCtx<'_>,
    out: &mut BytesMut,
) -> Outcome {
    let argc = args.len();
    let arg = |i: usize| args.get(i).unwrap_or_default();
    let mut e = Encoder {
        proto: s.proto,
        out,
    };
    match cmd {
        Local::Ping => match argc {
            1 => e.raw(reply::PONG),
            2 => e.bulk(arg(1)),
            _ => e.error(&replies::wrong_arity("ping")),
        },
        Local::Echo => match argc {
            2 => e.bulk(arg(1)),
            _ => e.error(&replies::wrong_arity("echo")),
        },
        Local::Quit => {
            e.raw(reply::OK);
            return Outcome::Close;
        }
        Local::Reset => {
            if argc != 1 {
                e.error(&replies::wrong_arity("reset"));
            } else {
                s.proto = Proto::Resp2;
                s.name = None;
                s.authenticated = ctx.requirepass.is_none();
                s.user = None;
                s.acl = None;
                e.proto = Proto::Resp2;
                e.simple("RESET");
            }
        }
        Local::Auth => match argc {
            2 | 3 => {
                let (user, pass) = if argc == 2 {
                    (None, arg(1))
                } else {
                    (Some(arg(1)), arg(2))
                };
                match check_password(ctx, user, pass) {
                    Ok(acl) => {
                        s.authenticated = true;
                        s.user = None;
                        s.acl = acl;
                        e.raw(reply::OK);
                    }
                    Err(err) => e.raw(err.wire()),
                }
            }
            1 => e.error(&replies::wrong_arity("auth")),
            _ => e.raw(replies::SYNTAX.wire()),
        },
        Local::Hello => hello(args, s, ctx, &mut e),
        Local::Client => client(args, s, &mut e),
    }
    Outcome::Continue
}

/// Checks AUTH/HELLO credentials the way Redis checks them: `default` against
/// `requirepass`, any other name against corral's users. `Ok(Some(user))` for a corral user.
fn check_password(
    ctx: &LocalCtx<'_>,
    user: Option<&[u8]>,
    pass: &[u8],
) -> Result<Option<std::sync::Arc<crate::acl::User>>, Canned> {
    let default_user = user.is_none_or(|u| u == b"default");
    match ctx.requirepass {
        // Without a password the default user is "nopass": any password works for it, but
        // the one-argument form is reported as a configuration mistake.
        None if user.is_none() => Err(replies::AUTH_NOT_CONFIGURED),
        None if default_user => Ok(None),
        Some(p) if default_user && p.as_bytes() == pass => Ok(None),
        _ => match (user, ctx.users) {
            (Some(name), Some(users)) if !default_user => users
                .authenticate(name, pass)
                .map(Some)
                .ok_or(replies::WRONGPASS),
            _ => Err(replies::WRONGPASS),
        },
    }
}

fn hello(args: &Args<'_>, s: &mut Session, ctx: &LocalCtx<'_>, e: &mut Encoder<'_>) {
    let mut proto = s.proto;
    if let Some(v) = args.get(1) {
        proto = match parse_int(v) {
            Some(2) => Proto::Resp2,
            Some(3) => Proto::Resp3,
            Some(_) => return e.error(replies::NOPROTO.text()),
            None => return e.error(replies::PROTO_NOT_INTEGER.text()),
        };
        // Redis applies each option as it reads it: an AUTH before a syntax error or a bad
        // name has authenticated the client, and a name is set even before authentication.
        // Only the protocol waits for the whole command to succeed.
        let mut i = 2;
        while let Some(opt) = args.get(i) {
            let more = args.len() - i - 1;
            if opt.eq_ignore_ascii_case(b"AUTH") && more >= 2 {
                let user = args.get(i + 1).unwrap_or_default();
                match check_password(ctx, Some(user), args.get(i + 2).unwrap_or_default()) {
                    Ok(acl) => s.acl = acl,
                    Err(err) => return e.raw(err.wire()),
                }
                s.authenticated = true;
                s.user = None;
                i += 3;
            } else if opt.eq_ignore_ascii_case(b"SETNAME") && more >= 1 {
                let n = args.get(i + 1).unwrap_or_default();
                if !valid_name(n) {
                    return e.error(replies::BAD_CLIENT_NAME.text());
                }
                s.name = (!n.is_empty()).then(|| Bytes::copy_from_slice(n));
                i += 2;
            } else {
                return e.error(&replies::hello_bad_option(opt));
            }
        }
    }
    if !s.authenticated {
        return e.error(replies::HELLO_NOAUTH.text());
    }
    s.proto = proto;
    e.proto = proto;
    e.map(7);
    e.bulk(b"server");
    e.bulk(b"redis");
    e.bulk(b"version");
    e.bulk(ctx.version.as_bytes());
    e.bulk(b"proto");
    e.int(proto.as_int());
    e.bulk(b"id");
    e.int(s.id as i64);
    e.bulk(b"mode");
    e.bulk(b"standalone");
    e.bulk(b"role");
    e.bulk(b"master");
    e.bulk(b"modules");
    e.array(0);
}

/// Redis allows names of printable ASCII without spaces.
fn valid_name(n: &[u8]) -> bool {
    n.iter().all(|&c| (b'!'..=b'~').contains(&c))
}

fn client(args: &Args<'_>, s: &mut Session, e: &mut Encoder<'_>) {
    let sub = args.get(1).unwrap_or_default().to_ascii_lowercase();
    let sub = String::from_utf8_lossy(&sub).into_owned();
    let argc = args.len();
    let arity = |want: usize| argc == want;
    match sub.as_str() {
        "setname" if arity(3) => {
            let n = args.get(2).unwrap_or_default();
            if !valid_name(n) {
                return e.error(replies::BAD_CLIENT_NAME.text());
            }
            s.name = (!n.is_empty()).then(|| Bytes::copy_from_slice(n));
            e.raw(reply::OK);
        }
        "getname" if arity(2) => match &s.name {
            Some(n) => e.bulk(n),
            None => e.null(),
        },
        "id" if arity(2) => e.int(s.id as i64),
        "info" if arity(2) => e.verbatim(s.info_line("client|info").as_bytes()),
        "setinfo" if arity(4) => {
            let attr = args.get(2).unwrap_or_default();
            let val = args.get(3).unwrap_or_default();
            let field = if attr.eq_ignore_ascii_case(b"lib-name") {
                &mut s.lib_name
            } else if attr.eq_ignore_ascii_case(b"lib-ver") {
                &mut s.lib_ver
            } else {
                return e.error(&replies::unrecognized_option(attr));
            };
            if !valid_name(val) {
                return e.error(&replies::bad_client_info(attr));
            }
            *field = (!val.is_empty()).then(|| Bytes::copy_from_slice(val));
            e.raw(reply::OK);
        }
        _ => e.error(&replies::wrong_arity(&format!("client|{sub}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(words: &[&str], s: &mut Session, pass: Option<&str>) -> (Vec<u8>, Outcome) {
        let owned: Vec<Vec<u8>> = words.iter().map(|w| w.as_bytes().to_vec()).collect();
        let args = Args::Owned(&owned);
        let cmd = match crate::commands::classify(&args) {
            crate::commands::Route::Local(c) => c,
            other => panic!("{other:?}"),
        };
        let ctx = LocalCtx {
            requirepass: pass,
            version: "7.0.15",
            users: None,
        };
        let mut out = BytesMut::new();
        let o = execute(cmd, &args, s, &ctx, &mut out);
        (out.to_vec(), o)
    }

    fn session() -> Session {
        let a = "127.0.0.1:1".parse().unwrap();
        Session::new(7, a, a, true)
    }

    #[test]
    fn hello_3_switches_protocol_and_replies_with_a_map() {
        let mut s = session();
        let (out, _) = run(&["HELLO", "3", "SETNAME", "app"], &mut s, None);
        assert!(out.starts_with(b"%7\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n$6\r\n7.0.15\r\n$5\r\nproto\r\n:3\r\n$2\r\nid\r\n:7\r\n"));
        assert_eq!(s.proto, Proto::Resp3);
        assert_eq!(s.name.as_deref(), Some(&b"app"[..]));
        let (out, _) = run(&["CLIENT", "GETNAME"], &mut s, None);
        assert_eq!(out, b"$3\r\napp\r\n");
    }

    #[test]
    fn auth_is_required_when_configured() {
        let a = "127.0.0.1:1".parse().unwrap();
        let mut s = Session::new(1, a, a, false);
        let (out, _) = run(&["HELLO", "3"], &mut s, Some("pw"));
        assert!(out.starts_with(b"-NOAUTH HELLO must be called"));
        let (out, _) = run(&["AUTH", "bad"], &mut s, Some("pw"));
        assert_eq!(out, replies::WRONGPASS.wire());
        let (out, _) = run(&["AUTH", "default", "pw"], &mut s, Some("pw"));
        assert_eq!(out, reply::OK);
        assert!(s.authenticated);
        run(&["RESET"], &mut s, Some("pw"));
        assert!(!s.authenticated);
    }

    #[test]
    fn errors_match_redis() {
        let mut s = session();
        assert_eq!(
            run(&["PING", "a", "b"], &mut s, None).0,
            b"-ERR wrong number of arguments for 'ping' command\r\n"
        );
        assert_eq!(
            run(&["CLIENT", "SETNAME", "a b"], &mut s, None).0,
            replies::BAD_CLIENT_NAME.wire()
        );
        assert_eq!(
            run(&["CLIENT", "ID", "x"], &mut s, None).0,
            b"-ERR wrong number of arguments for 'client|id' command\r\n"
        );
        assert_eq!(
            run(&["HELLO", "4"], &mut s, None).0,
            b"-NOPROTO unsupported protocol version\r\n"
        );
        assert_eq!(
            run(&["HELLO", "2", "FOO"], &mut s, None).0,
            b"-ERR Syntax error in HELLO option 'FOO'\r\n"
        );
        assert_eq!(
            run(&["AUTH", "x"], &mut s, None).0,
            replies::AUTH_NOT_CONFIGURED.wire()
        );
        assert_eq!(
            run(&["QUIT"], &mut s, None),
            (b"+OK\r\n".to_vec(), Outcome::Close)
        );
    }
}
