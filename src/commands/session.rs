//! Per-client state that Redis keeps per connection and corral must keep for it, since the
//! client shares upstream connections with others.

use std::net::SocketAddr;
use std::time::Instant;

use bytes::Bytes;

use super::command::{Command, Name};
use crate::resp::Proto;

/// One client connection's state.
#[derive(Debug, Clone)]
pub struct Session {
    /// Unique id, as CLIENT ID reports it.
    pub id: u64,
    /// Protocol chosen with HELLO.
    pub proto: Proto,
    /// Database chosen with SELECT.
    pub db: u32,
    /// Flags for CLIENT LIST (`N` normal, `x` in MULTI, `b` blocked, `P` subscribed), in
    /// Redis's order; see [`flags_text`].
    pub flags: &'static str,
    /// The last command the client sent, for CLIENT LIST's `cmd=`.
    pub last_cmd: LastCmd,
    /// Query buffer bytes (`qbuf=`): set only while CLIENT INFO/LIST runs for this client,
    /// 0 otherwise, as Redis shows a client between commands.
    pub qbuf: usize,
    /// Channel, pattern and shard-channel subscription counts.
    pub subs: (usize, usize, usize),
    /// Name from CLIENT SETNAME or HELLO SETNAME.
    pub name: Option<Bytes>,
    /// CLIENT SETINFO LIB-NAME.
    pub lib_name: Option<Bytes>,
    /// CLIENT SETINFO LIB-VER.
    pub lib_ver: Option<Bytes>,
    /// False until AUTH succeeds when a password is required.
    pub authenticated: bool,
    /// The Redis ACL user the client authenticated as through corral (`None`: `default`).
    pub user: Option<Bytes>,
    /// The corral user (`[[users]]`) the client authenticated as (`None`: `default`, or a
    /// Redis ACL user in `user`). Its permissions are checked before routing.
    pub acl: Option<std::sync::Arc<crate::acl::User>>,
    /// Peer address.
    pub addr: SocketAddr,
    /// Local address the client connected to.
    pub laddr: SocketAddr,
    /// When the connection was accepted.
    pub created: Instant,
}

impl Session {
    /// A new session; `authenticated` is true when no password is required.
    pub fn new(id: u64, addr: SocketAddr, laddr: SocketAddr, authenticated: bool) -> Self {
        Session {
            id,
            proto: Proto::Resp2,
            db: 0,
            flags: "N",
            last_cmd: LastCmd::default(),
            qbuf: 0,
            subs: (0, 0, 0),
            name: None,
            lib_name: None,
            lib_ver: None,
            authenticated,
            user: None,
            acl: None,
            addr,
            laddr,
            created: Instant::now(),
        }
    }

    /// The user the client is authenticated as: a Redis ACL user passed through, a corral
    /// user, or `default`.
    pub fn user_name(&self) -> std::borrow::Cow<'_, str> {
        match (&self.user, &self.acl) {
            (Some(u), _) => String::from_utf8_lossy(u),
            (None, Some(u)) => u.name().into(),
            (None, None) => "default".into(),
        }
    }

    /// The CLIENT INFO line for this client, in Redis's format; fields corral does not track
    /// are reported as Redis reports an idle client.
    pub fn info_line(&self, cmd: &str) -> String {
        let text = |b: &Option<Bytes>| {
            b.as_ref()
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default()
        };
        format!(
            "id={} addr={} laddr={} fd=0 name={} age={} idle=0 flags={} db={} sub={} psub={} \
             ssub={} multi=-1 qbuf={} qbuf-free=0 argv-mem=0 multi-mem=0 rbs=0 rbp=0 obl=0 oll=0 \
             omem=0 tot-mem=0 events=r cmd={} user={} redir=-1 resp={} lib-name={} \
             lib-ver={}\n",
            self.id,
            self.addr,
            self.laddr,
            text(&self.name),
            self.created.elapsed().as_secs(),
            self.flags,
            self.db,
            self.subs.0,
            self.subs.1,
            self.subs.2,
            self.qbuf,
            cmd,
            self.user_name(),
            self.proto.as_int(),
            text(&self.lib_name),
            text(&self.lib_ver),
        )
    }
}

/// CLIENT LIST's `flags=`: subscribed (`P`), in MULTI (`x`), blocked (`b`), CLIENT TRACKING on
/// (`t`, with `B` in BCAST mode), in the order Redis prints them; `N` for none.
pub fn flags_text(
    pubsub: bool,
    multi: bool,
    blocked: bool,
    tracking: Option<bool>,
) -> &'static str {
    // Indexed by the flags as bits, in print order.
    const TEXT: [&str; 32] = [
        "N", "P", "x", "Px", "b", "Pb", "xb", "Pxb", "t", "Pt", "xt", "Pxt", "bt", "Pbt", "xbt",
        "Pxbt", "B", "PB", "xB", "PxB", "bB", "PbB", "xbB", "PxbB", "tB", "PtB", "xtB", "PxtB",
        "btB", "PbtB", "xbtB", "PxbtB",
    ];
    let bits = usize::from(pubsub)
        | usize::from(multi) << 1
        | usize::from(blocked) << 2
        | usize::from(tracking.is_some()) << 3
        | usize::from(tracking == Some(true)) << 4;
    TEXT[bits]
}

/// Longest subcommand name kept; longer ones are no subcommand Redis knows.
const MAX_SUB: usize = 24;

/// A client's last command, as Redis shows it in CLIENT LIST: lower-case, with its subcommand
/// for container commands (`client|list`). Set for every request, so it keeps the name routing
/// already upper-cased, and the subcommand as sent: they are lower-cased when CLIENT LIST asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LastCmd {
    name: Name,
    sub: [u8; MAX_SUB],
    /// `None` for a command without a subcommand.
    sub_len: Option<u8>,
}

impl LastCmd {
    /// Records `cmd`.
    pub fn set(&mut self, cmd: &Command<'_>) {
        self.name = cmd.kind.name;
        self.sub_len = None;
        if cmd.kind.special
            && is_container(cmd.name())
            && let Some(sub) = cmd.args.get(1)
            && let Some(to) = self.sub.get_mut(..sub.len())
        {
            to.copy_from_slice(sub);
            self.sub_len = u8::try_from(sub.len()).ok();
        }
    }

    /// The name (`name|sub` for a subcommand), lower-case; empty before the first command and
    /// for a name longer than any command.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = self.name.as_bytes().to_ascii_lowercase();
        if let Some(len) = self.sub_len {
            out.push(b'|');
            out.extend(
                self.sub[..usize::from(len)]
                    .iter()
                    .map(u8::to_ascii_lowercase),
            );
        }
        out
    }
}

/// Commands with subcommands (their upper-cased names): Redis names those `name|sub`.
pub fn is_container(upper_name: &[u8]) -> bool {
    matches!(
        upper_name,
        b"ACL"
            | b"CLIENT"
            | b"CLUSTER"
            | b"COMMAND"
            | b"CONFIG"
            | b"FUNCTION"
            | b"LATENCY"
            | b"MEMORY"
            | b"MODULE"
            | b"OBJECT"
            | b"PUBSUB"
            | b"SCRIPT"
            | b"SLOWLOG"
            | b"XGROUP"
            | b"XINFO"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last(words: &[&str]) -> String {
        let owned: Vec<Vec<u8>> = words.iter().map(|w| w.as_bytes().to_vec()).collect();
        let mut c = LastCmd::default();
        c.set(&Command::new(crate::resp::Args::Owned(&owned)));
        String::from_utf8_lossy(&c.to_vec()).into_owned()
    }

    #[test]
    fn last_command_names_subcommands_like_redis() {
        assert_eq!(last(&["GET", "k"]), "get");
        assert_eq!(last(&["Client", "LIST"]), "client|list");
        assert_eq!(last(&["client"]), "client");
        assert_eq!(last(&["CONFIG", &"y".repeat(25)]), "config");
        assert_eq!(last(&[&"x".repeat(100)]), "");
        assert_eq!(flags_text(true, false, false, None), "P");
        assert_eq!(flags_text(false, true, true, None), "xb");
        assert_eq!(flags_text(false, true, false, Some(true)), "xtB");
    }
}
