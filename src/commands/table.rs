//! Where each command goes: answered by corral, forwarded on a shared connection, or refused.
//!
//! Unknown commands are forwarded: Redis itself then gives the exact error (or runs a command
//! newer than this table). Only commands whose effect would leak into the shared upstream
//! connection are refused, each with a reason.

use super::keys::{Access, access};
use crate::resp::Args;

/// Commands corral answers itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Local {
    /// `PING [message]`
    Ping,
    /// ECHO message
    Echo,
    /// QUIT
    Quit,
    /// RESET
    Reset,
    /// `HELLO [protover [AUTH user pass] [SETNAME name]]`
    Hello,
    /// `AUTH [user] pass`
    Auth,
    /// CLIENT SETNAME/GETNAME/ID/SETINFO/INFO
    Client,
}

/// Transaction commands: they pin the client to a dedicated upstream connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tx {
    /// MULTI
    Multi,
    /// EXEC
    Exec,
    /// DISCARD
    Discard,
    /// WATCH key...
    Watch,
    /// UNWATCH
    Unwatch,
}

/// Pub/sub commands, answered from corral's shared subscriptions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PubSub {
    /// SUBSCRIBE channel...
    Subscribe,
    /// PSUBSCRIBE pattern...
    PSubscribe,
    /// SSUBSCRIBE shardchannel...
    SSubscribe,
    /// `UNSUBSCRIBE [channel...]`
    Unsubscribe,
    /// `PUNSUBSCRIBE [pattern...]`
    PUnsubscribe,
    /// `SUNSUBSCRIBE [shardchannel...]`
    SUnsubscribe,
}

/// The route of one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// Sent as-is on the client's shared upstream connection; what it does to keys.
    Forward(Access),
    /// `CORRAL ...`: corral's own introspection commands.
    Corral,
    /// Forwarded, then corral appends its own `# Proxy` section to the reply.
    Info,
    /// Answered by corral.
    Local(Local),
    /// SELECT db: validated by the upstream, then the client's database.
    Select,
    /// MULTI/EXEC/DISCARD/WATCH/UNWATCH.
    Tx(Tx),
    /// A command that may block: sent alone on a dedicated connection.
    Blocking,
    /// MONITOR: the client's connection becomes a relay to a dedicated upstream connection.
    Monitor,
    /// Subscriptions, fanned out from shared upstream subscriptions.
    PubSub(PubSub),
    /// CLIENT LIST/KILL/REPLY/NO-EVICT/UNBLOCK: about corral's own clients.
    ClientAdmin,
    /// CLIENT TRACKING/CACHING/GETREDIR/TRACKINGINFO: client-side caching, on a connection
    /// of the client's own while tracking is on.
    Tracking,
    /// Refused with a clear error: `name` is the command, `why` the reason.
    Unsupported {
        /// Command name as the client should see it.
        name: &'static str,
        /// Why corral refuses it.
        why: &'static str,
    },
}

const REPLICATION: &str = "replication commands cannot go through a proxy";
const CONN_STATE: &str = "it would change a shared upstream connection";

/// Longest command name looked up; longer names cannot be in the table.
pub(crate) const MAX_NAME: usize = 24;

/// Upper-cases `name` into `buf`; `None` if it is too long to be a known command.
pub fn upper<'b>(name: &[u8], buf: &'b mut [u8; MAX_NAME]) -> Option<&'b [u8]> {
    let out = buf.get_mut(..name.len())?;
    for (o, &c) in out.iter_mut().zip(name) {
        *o = c.to_ascii_uppercase();
    }
    Some(out)
}

/// Decides the route of a request from its arguments (name first). The connection uses
/// [`super::Command`], which keeps the upper-cased name too.
pub fn classify(args: &Args<'_>) -> Route {
    super::Kind::of(args).route
}

/// The route of a request whose name, upper-cased, is `name` (`None`: missing or too long).
pub(crate) fn route_of(name: Option<&[u8]>, args: &Args<'_>) -> Route {
    let Some(name) = name else {
        return Route::Forward(Access::Write);
    };
    let unsupported = |name, why| Route::Unsupported { name, why };
    match name {
        b"GET" => Route::Forward(Access::Get),
        b"SET" => Route::Forward(Access::Write),
        b"CORRAL" => Route::Corral,
        b"PING" => Route::Local(Local::Ping),
        b"ECHO" => Route::Local(Local::Echo),
        b"QUIT" => Route::Local(Local::Quit),
        b"RESET" => Route::Local(Local::Reset),
        b"HELLO" => Route::Local(Local::Hello),
        b"AUTH" => Route::Local(Local::Auth),
        b"SELECT" => Route::Select,
        b"INFO" => Route::Info,
        b"CLIENT" => classify_client(args),
        b"MULTI" => Route::Tx(Tx::Multi),
        b"EXEC" => Route::Tx(Tx::Exec),
        b"DISCARD" => Route::Tx(Tx::Discard),
        b"WATCH" => Route::Tx(Tx::Watch),
        b"UNWATCH" => Route::Tx(Tx::Unwatch),
        b"BLPOP" | b"BRPOP" | b"BLMOVE" | b"BRPOPLPUSH" | b"BLMPOP" | b"BZPOPMIN" | b"BZPOPMAX"
        | b"BZMPOP" | b"WAIT" | b"WAITAOF" => Route::Blocking,
        b"XREAD" | b"XREADGROUP" if has_block_option(args) => Route::Blocking,
        b"SUBSCRIBE" => Route::PubSub(PubSub::Subscribe),
        b"PSUBSCRIBE" => Route::PubSub(PubSub::PSubscribe),
        b"SSUBSCRIBE" => Route::PubSub(PubSub::SSubscribe),
        b"UNSUBSCRIBE" => Route::PubSub(PubSub::Unsubscribe),
        b"PUNSUBSCRIBE" => Route::PubSub(PubSub::PUnsubscribe),
        b"SUNSUBSCRIBE" => Route::PubSub(PubSub::SUnsubscribe),
        b"MONITOR" => Route::Monitor,
        b"SYNC" => unsupported("sync", REPLICATION),
        b"PSYNC" => unsupported("psync", REPLICATION),
        b"REPLCONF" => unsupported("replconf", REPLICATION),
        _ => Route::Forward(access(name)),
    }
}

fn classify_client(args: &Args<'_>) -> Route {
    let mut buf = [0u8; MAX_NAME];
    let Some(sub) = args.get(1).and_then(|n| upper(n, &mut buf)) else {
        return Route::Forward(Access::Read);
    };
    let unsupported = |name, why| Route::Unsupported { name, why };
    match sub {
        b"SETNAME" | b"GETNAME" | b"ID" | b"SETINFO" | b"INFO" => Route::Local(Local::Client),
        b"LIST" | b"KILL" | b"REPLY" | b"NO-EVICT" | b"UNBLOCK" => Route::ClientAdmin,
        b"TRACKING" | b"CACHING" | b"GETREDIR" | b"TRACKINGINFO" => Route::Tracking,
        b"NO-TOUCH" => unsupported("client|no-touch", CONN_STATE),
        _ => Route::Forward(Access::Read),
    }
}

/// XREAD/XREADGROUP block only with a BLOCK option before STREAMS.
fn has_block_option(args: &Args<'_>) -> bool {
    args.iter()
        .skip(1)
        .take_while(|a| !a.eq_ignore_ascii_case(b"STREAMS"))
        .any(|a| a.eq_ignore_ascii_case(b"BLOCK"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn route(words: &[&str]) -> Route {
        let owned: Vec<Vec<u8>> = words.iter().map(|w| w.as_bytes().to_vec()).collect();
        classify(&Args::Owned(&owned))
    }

    #[test]
    fn names_are_case_insensitive() {
        assert_eq!(route(&["ping"]), Route::Local(Local::Ping));
        assert_eq!(route(&["PiNg"]), Route::Local(Local::Ping));
        assert_eq!(route(&["get", "k"]), Route::Forward(Access::Get));
    }

    #[test]
    fn unknown_and_long_names_are_forwarded() {
        assert_eq!(route(&["NOSUCHCOMMAND"]), Route::Forward(Access::Write));
        assert_eq!(route(&[&"X".repeat(100)]), Route::Forward(Access::Write));
    }

    #[test]
    fn stateful_commands_get_their_routes() {
        assert_eq!(route(&["multi"]), Route::Tx(Tx::Multi));
        assert_eq!(route(&["client", "reply", "off"]), Route::ClientAdmin);
        assert_eq!(route(&["client", "tracking", "on"]), Route::Tracking);
        assert_eq!(route(&["client", "caching", "yes"]), Route::Tracking);
        assert!(matches!(
            route(&["client", "no-touch", "on"]),
            Route::Unsupported { .. }
        ));
        assert_eq!(
            route(&["xread", "BLOCK", "0", "STREAMS", "s", "$"]),
            Route::Blocking
        );
        assert_eq!(route(&["blpop", "l", "0"]), Route::Blocking);
        assert_eq!(
            route(&["xread", "STREAMS", "block", "0"]),
            Route::Forward(Access::Read)
        );
    }
}
