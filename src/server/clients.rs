//! corral's own clients, for CLIENT LIST and CLIENT KILL, and the CLIENT subcommands that
//! need them (LIST, KILL, REPLY, NO-EVICT).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use dashmap::DashMap;
use tokio_util::sync::CancellationToken;

use super::attention::Attention;
use crate::commands::Session;
use crate::error::replies;
use crate::resp::Args;
use crate::resp::digits::parse_int;
use crate::resp::reply::{self, Encoder};
use crate::upstream::UpstreamConn;

/// A registered client: a snapshot of its session and the token that disconnects it.
#[derive(Debug)]
pub struct ClientEntry {
    snapshot: Mutex<Session>,
    kill: CancellationToken,
    /// While the client waits in a blocking command: the dedicated connection, whose
    /// server-side client id CLIENT UNBLOCK must name. Its id is read when CLIENT UNBLOCK
    /// runs: a fresh connection learns it from HELLO after the client was shown blocked.
    blocked_on: Mutex<Option<UpstreamConn>>,
    /// What wakes the client's connection task between requests.
    attention: Arc<Attention>,
}

/// All connected clients.
#[derive(Debug, Default)]
pub struct Registry {
    map: DashMap<u64, Arc<ClientEntry>>,
}

impl Registry {
    /// Registers a client; `kill` is cancelled by CLIENT KILL, `attention` wakes its
    /// connection task.
    pub(super) fn add(
        &self,
        session: &Session,
        kill: CancellationToken,
        attention: Arc<Attention>,
    ) -> Arc<ClientEntry> {
        let e = Arc::new(ClientEntry {
            snapshot: Mutex::new(session.clone()),
            kill,
            blocked_on: Mutex::new(None),
            attention,
        });
        self.map.insert(session.id, e.clone());
        e
    }

    /// Tells every client that the cluster let go of a node's connections: a client that
    /// idles would otherwise keep them, in its routes, for as long as it idles, and with them
    /// their tasks, still connected to (or reconnecting to) a node that left.
    pub fn reroute_all(&self) {
        for e in self.map.iter() {
            e.attention.rerouted();
        }
    }

    /// Forgets a client that disconnected.
    pub fn remove(&self, id: u64) {
        self.map.remove(&id);
    }

    /// Where client `id` is blocked now: the upstream address and the server's client id of
    /// its dedicated connection.
    pub fn blocked_on(&self, id: u64) -> Option<(String, u64)> {
        let e = self.map.get(&id)?;
        let b = e.blocked_on.lock().unwrap_or_else(|p| p.into_inner());
        b.as_ref().map(|c| (c.addr().to_string(), c.client_id()))
    }

    fn snapshots(&self) -> Vec<(Session, CancellationToken)> {
        let mut v: Vec<_> = self
            .map
            .iter()
            .map(|e| {
                let s = e.snapshot.lock().unwrap_or_else(|p| p.into_inner()).clone();
                (s, e.kill.clone())
            })
            .collect();
        v.sort_by_key(|(s, _)| s.id);
        v
    }
}

impl ClientEntry {
    /// Publishes the client's current session state.
    pub fn update(&self, session: &Session) {
        *self.snapshot.lock().unwrap_or_else(|p| p.into_inner()) = session.clone();
    }

    /// Records that the client is blocked on the dedicated connection `on` (`None`: no
    /// longer blocked).
    pub fn set_blocked(&self, on: Option<UpstreamConn>) {
        *self.blocked_on.lock().unwrap_or_else(|p| p.into_inner()) = on;
    }
}

/// `CLIENT UNBLOCK <id> [TIMEOUT|ERROR]` rewritten for the upstream: corral's client id is
/// replaced by the server's id of the connection that client is blocked on, and by 0 (no
/// such client in Redis, which then answers `:0`) when it is not blocked through corral.
/// A corral id never reaches Redis, where it could name some other client. Malformed forms
/// are sent with a non-numeric id so that Redis gives its own error. Returns the request and
/// the upstream address it must go to (that of the blocked client's connection).
pub fn unblock_request(args: &Args<'_>, registry: &Registry) -> (Bytes, Option<String>) {
    let mut argv: Vec<&[u8]> = args.iter().collect();
    let target = match argv.get(2).and_then(|a| parse_int(a)) {
        Some(id) => u64::try_from(id)
            .ok()
            .and_then(|id| registry.blocked_on(id))
            .filter(|(_, upstream_id)| *upstream_id != 0),
        None => None,
    };
    let id_text;
    if argv.len() > 2 {
        id_text = match (&target, argv.get(2).and_then(|a| parse_int(a))) {
            (Some((_, upstream_id)), _) => upstream_id.to_string(),
            (None, Some(_)) => "0".to_string(),
            (None, None) => "not-an-id".to_string(),
        };
        argv[2] = id_text.as_bytes();
    }
    let mut out = BytesMut::new();
    crate::resp::encode::encode_request(&argv, &mut out);
    (out.freeze(), target.map(|(addr, _)| addr))
}

/// Reply mode set with CLIENT REPLY.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReplyMode {
    /// Replies are sent.
    #[default]
    On,
    /// Replies are dropped.
    Off,
    /// The next command's reply is dropped.
    Skip,
}

/// Runs CLIENT LIST/KILL/REPLY/NO-EVICT for `me`. Returns the reply bytes (empty when the
/// reply is suppressed by CLIENT REPLY OFF/SKIP) and the new reply mode, if it changed.
pub fn execute(args: &Args<'_>, me: &Session, registry: &Registry) -> (Bytes, Option<ReplyMode>) {
    let mut out = BytesMut::new();
    let mut e = Encoder {
        proto: me.proto,
        out: &mut out,
    };
    let sub = args.get(1).unwrap_or_default().to_ascii_uppercase();
    let mut mode = None;
    match sub.as_slice() {
        b"LIST" => list(args, me, registry, &mut e),
        b"KILL" => kill(args, me, registry, &mut e),
        b"REPLY" if args.len() == 3 => {
            let arg = args.get(2).unwrap_or_default().to_ascii_uppercase();
            match arg.as_slice() {
                b"ON" => {
                    mode = Some(ReplyMode::On);
                    e.raw(reply::OK);
                }
                b"OFF" => mode = Some(ReplyMode::Off),
                b"SKIP" => mode = Some(ReplyMode::Skip),
                _ => e.raw(replies::SYNTAX.wire()),
            }
        }
        b"NO-EVICT" if args.len() == 3 => {
            // corral never evicts clients, so the flag is accepted and has nothing to change.
            let arg = args.get(2).unwrap_or_default();
            if arg.eq_ignore_ascii_case(b"on") || arg.eq_ignore_ascii_case(b"off") {
                e.raw(reply::OK);
            } else {
                e.raw(replies::SYNTAX.wire());
            }
        }
        _ => e.error(&replies::wrong_arity(&format!(
            "client|{}",
            String::from_utf8_lossy(&sub).to_ascii_lowercase()
        ))),
    }
    (out.freeze(), mode)
}

fn type_matches(s: &Session, t: &[u8]) -> Option<bool> {
    let pubsub = s.subs != (0, 0, 0);
    match t.to_ascii_lowercase().as_slice() {
        b"normal" => Some(!pubsub),
        b"pubsub" => Some(pubsub),
        b"master" | b"replica" | b"slave" => Some(false),
        _ => None,
    }
}

fn list(args: &Args<'_>, me: &Session, registry: &Registry, e: &mut Encoder<'_>) {
    let mut ids: Option<Vec<u64>> = None;
    let mut ty: Option<Vec<u8>> = None;
    let mut i = 2;
    while let Some(opt) = args.get(i) {
        if opt.eq_ignore_ascii_case(b"TYPE") && args.get(i + 1).is_some() {
            let t = args.get(i + 1).unwrap_or_default();
            if type_matches_any(t).is_none() {
                return e.error(&replies::unknown_client_type(t));
            }
            ty = Some(t.to_vec());
            i += 2;
        } else if opt.eq_ignore_ascii_case(b"ID") && args.get(i + 1).is_some() {
            let mut v = Vec::new();
            i += 1;
            while let Some(a) = args.get(i) {
                match parse_int(a)
                    .and_then(|n| u64::try_from(n).ok())
                    .filter(|&n| n > 0)
                {
                    Some(n) => v.push(n),
                    None => return e.error(replies::INVALID_CLIENT_ID.text()),
                }
                i += 1;
            }
            ids = Some(v);
        } else {
            return e.raw(replies::SYNTAX.wire());
        }
    }
    let mut text = String::new();
    for (s, _) in registry.snapshots() {
        // The caller's own line is its live session: its command is this CLIENT LIST.
        let (s, cmd) = if s.id == me.id {
            (me.clone(), "client|list".to_string())
        } else {
            let cmd = last_command(&s);
            (s, cmd)
        };
        if ids.as_ref().is_some_and(|ids| !ids.contains(&s.id)) {
            continue;
        }
        if let Some(t) = &ty
            && type_matches(&s, t) != Some(true)
        {
            continue;
        }
        text.push_str(&s.info_line(&cmd));
    }
    e.verbatim(text.as_bytes());
}

/// A client's last command as CLIENT LIST shows it: `NULL` before its first command and for a
/// command Redis does not know (Redis records the failed lookup).
fn last_command(s: &Session) -> String {
    let name = s.last_cmd.to_vec();
    let parts: Vec<Vec<u8>> = name.split(|&b| b == b'|').map(<[u8]>::to_vec).collect();
    if name.is_empty() || !crate::commands::Command::new(Args::Owned(&parts)).exists() {
        return "NULL".to_string();
    }
    String::from_utf8_lossy(&name).into_owned()
}

fn type_matches_any(t: &[u8]) -> Option<()> {
    matches!(
        t.to_ascii_lowercase().as_slice(),
        b"normal" | b"pubsub" | b"master" | b"replica" | b"slave"
    )
    .then_some(())
}

/// One CLIENT KILL condition.
type Filter = Box<dyn Fn(&Session) -> bool>;

/// CLIENT KILL ip:port, or `CLIENT KILL <filter> <value> ...` (ID, ADDR, LADDR, USER, TYPE,
/// SKIPME, MAXAGE), as Redis parses them.
fn kill(args: &Args<'_>, me: &Session, registry: &Registry, e: &mut Encoder<'_>) {
    let addr_of = |a: &[u8]| String::from_utf8_lossy(a).parse::<SocketAddr>().ok();
    if args.len() == 3 {
        let target = addr_of(args.get(2).unwrap_or_default());
        let found = registry
            .snapshots()
            .into_iter()
            .find(|(s, _)| Some(s.addr) == target);
        return match found {
            Some((_, token)) => {
                token.cancel();
                e.raw(reply::OK);
            }
            None => e.error(replies::NO_SUCH_CLIENT.text()),
        };
    }
    if args.len() < 3 {
        return e.error(&replies::wrong_arity("client|kill"));
    }
    if args.len() < 4 || !args.len().is_multiple_of(2) {
        return e.raw(replies::SYNTAX.wire());
    }
    let Some((filters, skipme)) = kill_filters(args, e) else {
        return;
    };
    if let Some(name) = unknown_user(args, registry) {
        return e.error(&replies::no_such_user(name.as_bytes()));
    }
    let mut killed = 0;
    for (s, token) in registry.snapshots() {
        if skipme && s.id == me.id {
            continue;
        }
        if filters.iter().all(|f| f(&s)) {
            token.cancel();
            killed += 1;
        }
    }
    e.int(killed);
}

/// CLIENT KILL USER's name when no client of corral is authenticated as it (and it is not
/// `default`): Redis refuses a user it does not know, and corral knows the users by their
/// clients (a user of Redis's own exists for corral once a client has authenticated as it).
fn unknown_user(args: &Args<'_>, registry: &Registry) -> Option<String> {
    let at = (2..args.len())
        .step_by(2)
        .find(|&i| args.get(i).is_some_and(|a| a.eq_ignore_ascii_case(b"USER")))?;
    let name = String::from_utf8_lossy(args.get(at + 1)?).into_owned();
    let known = name == "default"
        || registry
            .snapshots()
            .iter()
            .any(|(s, _)| s.user_name() == name);
    (!known).then_some(name)
}

/// The filters of CLIENT KILL's new form and its SKIPME, or `None` once the error is
/// written.
fn kill_filters(args: &Args<'_>, e: &mut Encoder<'_>) -> Option<(Vec<Filter>, bool)> {
    let addr_of = |a: &[u8]| String::from_utf8_lossy(a).parse::<SocketAddr>().ok();
    let mut filters: Vec<Filter> = Vec::new();
    let mut skipme = true;
    for pair in (2..args.len()).step_by(2) {
        let key = args.get(pair).unwrap_or_default().to_ascii_uppercase();
        let val = args.get(pair + 1).unwrap_or_default();
        let refusal = match key.as_slice() {
            b"ID" => match parse_int(val)
                .and_then(|n| u64::try_from(n).ok())
                .filter(|&n| n > 0)
            {
                Some(id) => {
                    filters.push(Box::new(move |s| s.id == id));
                    None
                }
                None => Some(Err(replies::CLIENT_ID_NOT_POSITIVE.text().to_string())),
            },
            b"ADDR" => {
                let a = addr_of(val);
                filters.push(Box::new(move |s| Some(s.addr) == a));
                None
            }
            b"LADDR" => {
                let a = addr_of(val);
                filters.push(Box::new(move |s| Some(s.laddr) == a));
                None
            }
            // Names no client uses are refused by `unknown_user`.
            b"USER" => {
                let name = String::from_utf8_lossy(val).into_owned();
                filters.push(Box::new(move |s| s.user_name() == name));
                None
            }
            b"TYPE" if type_matches_any(val).is_none() => {
                Some(Err(replies::unknown_client_type(val)))
            }
            b"TYPE" => {
                let t = val.to_vec();
                filters.push(Box::new(move |s| type_matches(s, &t) == Some(true)));
                None
            }
            b"SKIPME" if val.eq_ignore_ascii_case(b"yes") => {
                skipme = true;
                None
            }
            b"SKIPME" if val.eq_ignore_ascii_case(b"no") => {
                skipme = false;
                None
            }
            b"MAXAGE" => match parse_int(val) {
                Some(age) => {
                    filters.push(Box::new(move |s| {
                        s.created.elapsed().as_secs() as i64 >= age
                    }));
                    None
                }
                None => Some(Ok(replies::NOT_INTEGER.wire())),
            },
            _ => Some(Ok(replies::SYNTAX.wire())),
        };
        match refusal {
            None => {}
            Some(Ok(raw)) => {
                e.raw(raw);
                return None;
            }
            Some(Err(text)) => {
                e.error(&text);
                return None;
            }
        }
    }
    Some((filters, skipme))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn session(id: u64, port: u16) -> Session {
        let a = SocketAddr::from(([127, 0, 0, 1], port));
        Session::new(id, a, a, true)
    }

    fn run(words: &[&str], me: &Session, reg: &Registry) -> (Vec<u8>, Option<ReplyMode>) {
        let owned: Vec<Vec<u8>> = words.iter().map(|w| w.as_bytes().to_vec()).collect();
        let (b, m) = execute(&Args::Owned(&owned), me, reg);
        (b.to_vec(), m)
    }

    #[test]
    fn kill_by_id_cancels_only_that_client() {
        let reg = Registry::default();
        let (a, b) = (session(1, 1001), session(2, 1002));
        let (ta, tb) = (CancellationToken::new(), CancellationToken::new());
        reg.add(&a, ta.clone(), Arc::default());
        reg.add(&b, tb.clone(), Arc::default());
        assert_eq!(run(&["CLIENT", "KILL", "ID", "2"], &a, &reg).0, b":1\r\n");
        assert!(tb.is_cancelled() && !ta.is_cancelled());
        assert_eq!(
            run(&["CLIENT", "KILL", "127.0.0.1:9"], &a, &reg).0,
            b"-ERR No such client\r\n"
        );
    }

    #[test]
    fn kill_by_user_matches_the_user_shown() {
        let reg = Registry::default();
        let (a, mut b) = (session(1, 1001), session(2, 1002));
        b.user = Some(bytes::Bytes::from_static(b"bob"));
        let (ta, tb) = (CancellationToken::new(), CancellationToken::new());
        reg.add(&a, ta.clone(), Arc::default());
        reg.add(&b, tb.clone(), Arc::default());
        let kill = |user| run(&["CLIENT", "KILL", "USER", user, "SKIPME", "no"], &a, &reg).0;
        assert_eq!(kill("nobody"), b"-ERR No such user 'nobody'\r\n");
        assert_eq!(kill("bob"), b":1\r\n");
        assert!(tb.is_cancelled() && !ta.is_cancelled());
        assert_eq!(kill("default"), b":1\r\n");
        assert!(ta.is_cancelled());
    }

    #[test]
    fn list_shows_every_client() {
        let reg = Registry::default();
        let a = session(1, 1001);
        reg.add(&a, CancellationToken::new(), Arc::default());
        reg.add(&session(2, 1002), CancellationToken::new(), Arc::default());
        let (out, _) = run(&["CLIENT", "LIST"], &a, &reg);
        let text = String::from_utf8_lossy(&out);
        assert!(text.contains("id=1 ") && text.contains("id=2 "), "{text}");
    }

    #[test]
    fn reply_modes() {
        let reg = Registry::default();
        let a = session(1, 1001);
        assert_eq!(
            run(&["CLIENT", "REPLY", "OFF"], &a, &reg),
            (vec![], Some(ReplyMode::Off))
        );
        assert_eq!(
            run(&["CLIENT", "REPLY", "ON"], &a, &reg),
            (b"+OK\r\n".to_vec(), Some(ReplyMode::On))
        );
        assert_eq!(
            run(&["CLIENT", "REPLY", "X"], &a, &reg).0,
            b"-ERR syntax error\r\n"
        );
    }
}
