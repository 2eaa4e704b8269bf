//! Requests refused before they are routed: a client not authenticated, a command not
//! allowed in RESP2 subscribed mode, corral's admin commands for a Redis ACL user, a
//! command inside MULTI that would change the client itself.

use bytes::{Bytes, BytesMut};

use super::client::Conn;
use super::plan::Plan;
use crate::acl;
use crate::commands::{self, Command, Local, Route};
use crate::error::replies;
use crate::resp::Args;
use crate::resp::reply::Encoder;

impl Conn {
    /// Inside a transaction, a command that changes the client itself, refused: run by EXEC
    /// on the client's dedicated connection it would change that connection, not the client
    /// as corral knows it (its subscriptions are corral's hub's; its user, protocol, name and
    /// reply mode are corral's to apply). EXEC then fails, as after any command refused
    /// inside MULTI.
    ///
    /// In cluster mode, a command that goes to several nodes (DBSIZE, KEYS, FLUSHALL, CONFIG
    /// SET...) is refused too: the transaction runs on one master, and would count, list or
    /// change that master's part alone.
    pub(super) fn refused_in_multi(&mut self, cmd: &Command<'_>) -> Option<Plan> {
        let why = if changes_the_client(cmd) {
            "not inside MULTI"
        } else if super::password::requirepass_set(cmd).is_some() {
            // Followed only once Redis accepts it, which inside MULTI is EXEC's reply.
            "not with requirepass inside MULTI"
        } else if self.shared.upstream.cluster.is_some() && super::routed::spreads(cmd) {
            "not inside MULTI in cluster mode, where a transaction runs on one master"
        } else {
            return None;
        };
        self.tx_failed = true;
        let mut name = String::from_utf8_lossy(cmd.name()).to_ascii_lowercase();
        if matches!(
            name.as_str(),
            "client" | "config" | "script" | "function" | "pubsub"
        ) {
            let sub = String::from_utf8_lossy(cmd.args.get(1).unwrap_or_default());
            name = format!("{name}|{}", sub.to_ascii_lowercase());
        }
        let mut e = Encoder {
            proto: self.session.proto,
            out: &mut self.local,
        };
        e.error(&replies::unsupported(&name, why));
        Some(Plan::ready(self.local.split().freeze()))
    }

    /// The reply refusing the request before it is routed, in Redis's order: refused by the
    /// guard (`guarded`), not authenticated (after Redis's own checks of the command's
    /// existence, subcommand and arity), denied to the user, or not allowed in RESP2
    /// subscribed mode.
    pub(super) fn refusal(&mut self, cmd: &Command<'_>, guarded: Option<&Bytes>) -> Option<Bytes> {
        let (args, route) = (cmd.args, cmd.route());
        if let Some(refused) = guarded {
            return Some(refused.clone());
        }
        let allowed_unauthenticated = matches!(
            route,
            Route::Local(Local::Auth | Local::Hello | Local::Quit | Local::Reset)
        );
        if !allowed_unauthenticated && !self.authenticated() {
            // Redis looks the command up, and checks its subcommand and arity, before it
            // checks authentication.
            let argv: Vec<&[u8]> = args.iter().collect();
            if let Some(malformed) = acl::malformed(&argv) {
                return Some(malformed);
            }
            if !cmd.exists() {
                return Some(unknown_command(&args));
            }
            return Some(replies::NOAUTH.to_bytes());
        }
        // Only corral users with restrictions pay for a check.
        if let Some(user) = &self.session.acl
            && user.restricted()
            && let Err(denied) = super::permit::check(user, cmd)
        {
            return Some(denied);
        }
        if self.resp2_subscribed() {
            match route {
                Route::PubSub(_) | Route::Local(Local::Quit | Local::Reset) => {}
                // Redis checks that the command exists, then the subscribed-mode rule.
                _ if !cmd.exists() => {
                    return Some(unknown_command(&args));
                }
                Route::Local(Local::Ping) if args.len() > 2 => {
                    let mut e = Encoder {
                        proto: self.session.proto,
                        out: &mut self.local,
                    };
                    e.error(&replies::wrong_arity("ping"));
                    return Some(self.local.split().freeze());
                }
                // In RESP2 subscribed mode PING answers in the shape of a message.
                Route::Local(Local::Ping) => {
                    let mut e = Encoder {
                        proto: self.session.proto,
                        out: &mut self.local,
                    };
                    e.array(2);
                    e.bulk(b"pong");
                    e.bulk(args.get(1).unwrap_or_default());
                    return Some(self.local.split().freeze());
                }
                _ => {
                    let name = full_command_name(&args);
                    let mut e = Encoder {
                        proto: self.session.proto,
                        out: &mut self.local,
                    };
                    e.error(&replies::not_in_subscribed_context(&name));
                    return Some(self.local.split().freeze());
                }
            }
        }
        None
    }
}

/// The refusal of one of corral's admin commands to a Redis ACL user.
pub(super) fn no_permission(args: &Args<'_>) -> Plan {
    // A Redis ACL user's permissions are Redis's to check, and corral cannot check
    // them for what it answers itself: its admin commands are for `default` only.
    let name = String::from_utf8_lossy(args.get(0).unwrap_or_default()).to_lowercase();
    let sub = args
        .get(1)
        .filter(|_| name == "client")
        .map(|s| format!("|{}", String::from_utf8_lossy(s).to_lowercase()))
        .unwrap_or_default();
    Plan::ready(replies::line(&replies::no_permission(&format!(
        "{name}{sub}"
    ))))
}

/// corral's own admin commands, which Redis puts in `@admin` (CLIENT LIST, KILL, NO-EVICT)
/// or which reveal other clients' keys (CORRAL): refused to Redis ACL users.
pub(super) fn is_admin(args: &crate::resp::Args<'_>) -> bool {
    let Some(name) = args.get(0) else {
        return false;
    };
    if name.eq_ignore_ascii_case(b"CORRAL") {
        return true;
    }
    args.get(1).is_some_and(|s| {
        [&b"LIST"[..], b"KILL", b"NO-EVICT"]
            .iter()
            .any(|a| s.eq_ignore_ascii_case(a))
    })
}

/// Redis's reply to an unknown command.
pub(super) fn unknown_command(args: &crate::resp::Args<'_>) -> Bytes {
    let text = replies::unknown_command(args.get(0).unwrap_or_default(), args.iter().skip(1));
    let mut out = BytesMut::new();
    Encoder {
        proto: crate::resp::Proto::Resp2,
        out: &mut out,
    }
    .error(&text);
    out.freeze()
}

/// The command name as Redis prints it in errors: `config|get` for subcommands.
fn full_command_name(args: &crate::resp::Args<'_>) -> String {
    let name = String::from_utf8_lossy(args.get(0).unwrap_or_default()).to_ascii_lowercase();
    match args.get(1) {
        Some(sub) if commands::session::is_container(name.to_ascii_uppercase().as_bytes()) => {
            format!(
                "{name}|{}",
                String::from_utf8_lossy(sub).to_ascii_lowercase()
            )
        }
        _ => name,
    }
}

/// Whether `cmd` changes the client's own state in a way corral must apply itself, which it
/// cannot for a command run by EXEC: (P|S)(UN)SUBSCRIBE, AUTH, HELLO, CLIENT REPLY and
/// CLIENT SETNAME.
fn changes_the_client(cmd: &Command<'_>) -> bool {
    matches!(cmd.route(), Route::PubSub(_))
        || matches!(cmd.name(), b"AUTH" | b"HELLO")
        || (cmd.name() == b"CLIENT" && (cmd.arg_is(1, b"REPLY") || cmd.arg_is(1, b"SETNAME")))
}
