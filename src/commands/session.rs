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
    /// Flags for CLIENT LIST (`N` normal, `x` in MULTI, `b` blocked, `P` subscribed).
    pub flags: &'static str,
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
            subs: (0, 0, 0),
            name: None,
            lib_name: None,
            lib_ver: None,
            authenticated,
            addr,
            laddr,
            created: Instant::now(),
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
             ssub={} multi=-1 qbuf=0 qbuf-free=0 argv-mem=0 multi-mem=0 rbs=0 rbp=0 obl=0 oll=0 \
             omem=0 tot-mem=0 events=r cmd={} user=default redir=-1 resp={} lib-name={} \
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
            cmd,
            self.proto.as_int(),
            text(&self.lib_name),
            text(&self.lib_ver),
        )
    }
}
