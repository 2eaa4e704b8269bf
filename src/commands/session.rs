//! Per-client state that Redis keeps per connection and corral must keep for it, since the
//! client shares upstream connections with others.

use std::net::SocketAddr;
use std::time::Instant;

use bytes::Bytes;

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

/// Longest command or subcommand name kept; longer ones are no command Redis knows.
const MAX_NAME: usize = 24;

/// A client's last command name, lower-case, with its subcommand for container commands
/// (`client|list`), as Redis shows it in CLIENT LIST. Kept inline: it is set for every request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastCmd {
    buf: [u8; 2 * MAX_NAME + 1],
    len: u8,
}

impl Default for LastCmd {
    fn default() -> Self {
        LastCmd {
            buf: [0; 2 * MAX_NAME + 1],
            len: 0,
        }
    }
}

impl LastCmd {
    /// Records the command in `args` (name first).
    pub fn set(&mut self, args: &crate::resp::Args<'_>) {
        self.len = 0;
        let Some(name) = args.get(0).filter(|n| !n.is_empty() && n.len() <= MAX_NAME) else {
            return;
        };
        let mut len = 0;
        for &c in name {
            self.buf[len] = c.to_ascii_lowercase();
            len += 1;
        }
        if is_container(&self.buf[..len])
            && let Some(sub) = args.get(1).filter(|s| s.len() <= MAX_NAME)
        {
            self.buf[len] = b'|';
            len += 1;
            for &c in sub {
                self.buf[len] = c.to_ascii_lowercase();
                len += 1;
            }
        }
        self.len = len as u8;
    }

    /// The name (`name|sub` for a subcommand); empty before the first command.
    pub fn as_bytes(&self) -> &[u8] {
        &self.buf[..usize::from(self.len)]
    }
}

/// Commands with subcommands: Redis names those `name|sub`.
pub fn is_container(lower_name: &[u8]) -> bool {
    matches!(
        lower_name,
        b"acl"
            | b"client"
            | b"cluster"
            | b"command"
            | b"config"
            | b"function"
            | b"latency"
            | b"memory"
            | b"module"
            | b"object"
            | b"pubsub"
            | b"script"
            | b"slowlog"
            | b"xgroup"
            | b"xinfo"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last(words: &[&str]) -> String {
        let owned: Vec<Vec<u8>> = words.iter().map(|w| w.as_bytes().to_vec()).collect();
        let mut c = LastCmd::default();
        c.set(&crate::resp::Args::Owned(&owned));
        String::from_utf8_lossy(c.as_bytes()).into_owned()
    }

    #[test]
    fn last_command_names_subcommands_like_redis() {
        assert_eq!(last(&["GET", "k"]), "get");
        assert_eq!(last(&["Client", "LIST"]), "client|list");
        assert_eq!(last(&["client"]), "client");
        assert_eq!(last(&[&"x".repeat(100)]), "");
        assert_eq!(flags_text(true, false, false, None), "P");
        assert_eq!(flags_text(false, true, true, None), "xb");
        assert_eq!(flags_text(false, true, false, Some(true)), "xtB");
    }
}
