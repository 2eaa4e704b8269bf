//! What is known about the upstream: reachable or not, why not, its version, and whether it
//! may be too busy to answer PING.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use prometheus_client::metrics::counter::Counter;

/// How long after Redis last answered `-BUSY` or `-LOADING` corral still forwards PING.
const BUSY_MEMORY: Duration = Duration::from_secs(2);

/// Shared upstream health, read by INFO, HELLO and `/healthz`.
#[derive(Debug, Default)]
pub struct UpstreamStatus {
    connected: AtomicUsize,
    /// Connections established since start; also exported as a Prometheus counter.
    connects: Counter,
    version: Mutex<Option<String>>,
    last_error: Mutex<Option<String>>,
    /// Why the upstream refuses corral's new connections (credentials or TLS), while it does:
    /// set by a failed connect, cleared by the next successful one started after it, with
    /// when it was recorded.
    refusal: Mutex<Option<(String, Instant)>>,
    /// Scripts and functions sent through corral and not answered yet.
    scripts: Arc<AtomicUsize>,
    /// When Redis last answered `-BUSY` or `-LOADING`, in ms since [`epoch`] (plus one, so
    /// that 0 means never).
    busy_at_ms: AtomicU64,
    /// Local addresses of corral's live upstream connections, and whether each is internal
    /// (see `ConnSettings::internal`): for MONITOR.
    conns: Mutex<HashMap<SocketAddr, bool>>,
    /// Scripts known to finish quickly (see [`ScriptBook`]).
    book: Arc<ScriptBook>,
    /// Until when a CLIENT PAUSE sent through corral lasts, in ms since [`epoch`] (0: none).
    paused_until_ms: AtomicU64,
    /// When each node last sent anything on any of corral's health-checked connections.
    lives: Mutex<HashMap<String, Arc<NodeLife>>>,
    /// The most requests a shared connection may have out before its next write waits,
    /// whatever its own bar (see `ConnSettings::hold_at`); 0: its own bar. Set and cleared by
    /// the cache, by what it serves.
    hold_cap: AtomicUsize,
}

/// When a node last sent corral anything, on any health-checked connection: tells a silent
/// connection (half-open) from a silent node (Redis busy, or unreachable as a whole).
#[derive(Debug, Default)]
pub struct NodeLife(AtomicU64);

impl NodeLife {
    /// Bytes arrived from the node at `at`.
    pub fn heard_at(&self, at: impl Into<Instant>) {
        self.0.fetch_max(
            ms_since_epoch(at.into()).saturating_add(1),
            Ordering::Relaxed,
        );
    }

    /// Whether the node sent anything, on some connection, in a millisecond after `t`.
    pub fn heard_since(&self, t: impl Into<Instant>) -> bool {
        self.0.load(Ordering::Relaxed) > ms_since_epoch(t.into()).saturating_add(1)
    }
}

fn ms_since_epoch(t: Instant) -> u64 {
    u64::try_from(t.saturating_duration_since(epoch()).as_millis()).unwrap_or(u64::MAX)
}

/// A batch holding scripts or functions, counted as running until dropped; once answered it
/// tells the script book (`ScriptBook`) how long its scripts took.
#[derive(Debug)]
pub struct ScriptRun {
    running: Arc<AtomicUsize>,
    /// Boxed: every pending reply has room for a `ScriptRun`, and most carry none.
    learn: Box<Learn>,
}

/// What a [`ScriptRun`] teaches the [`ScriptBook`] once answered.
#[derive(Debug)]
struct Learn {
    book: Arc<ScriptBook>,
    keys: Vec<u64>,
    started: Instant,
    alone: bool,
}

impl ScriptRun {
    /// Redis answered the batch: its scripts finished.
    pub fn answered(&mut self) {
        let l = &mut self.learn;
        l.book
            .learn(&std::mem::take(&mut l.keys), l.started.elapsed(), l.alone);
    }
}

impl Drop for ScriptRun {
    fn drop(&mut self) {
        self.running.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A script seen to finish within this, on a connection of its own, may share connections.
const QUICK_SCRIPT: Duration = Duration::from_millis(10);
/// A script that held a shared connection this long runs on a connection of its own again.
const SLOW_SCRIPT: Duration = Duration::from_millis(50);
/// Scripts remembered; past it the book starts over (every script isolated until seen again).
const BOOK_SIZE: usize = 10_000;

/// Which scripts (by body, SHA or function name: [`crate::commands::busy::script_key`]) are
/// known to finish quickly. A script is isolated on a dedicated connection until it has been
/// seen to finish within [`QUICK_SCRIPT`]; from then on it shares connections like any
/// command, unless it once holds one for [`SLOW_SCRIPT`], after which it is isolated for good.
#[derive(Debug, Default)]
pub struct ScriptBook {
    /// `true`: quick; `false`: once slow.
    known: Mutex<HashMap<u64, bool>>,
}

impl ScriptBook {
    /// Whether the script may go on a shared connection.
    pub fn is_quick(&self, key: u64) -> bool {
        let known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        known.get(&key) == Some(&true)
    }

    fn learn(&self, keys: &[u64], took: Duration, alone: bool) {
        if keys.is_empty() || (alone && took >= QUICK_SCRIPT) || (!alone && took < SLOW_SCRIPT) {
            return;
        }
        let mut known = self.known.lock().unwrap_or_else(|p| p.into_inner());
        if known.len() >= BOOK_SIZE {
            known.clear();
        }
        for k in keys {
            if alone {
                known.entry(*k).or_insert(true);
            } else {
                known.insert(*k, false);
            }
        }
    }
}

/// A fixed instant to measure the busy marks from.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_ms() -> u64 {
    u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX)
}

impl UpstreamStatus {
    /// The shared record of when node `addr` was last heard from.
    pub fn node_life(&self, addr: &str) -> Arc<NodeLife> {
        let mut lives = self.lives.lock().unwrap_or_else(|p| p.into_inner());
        lives.entry(addr.to_string()).or_default().clone()
    }

    /// A connection came up.
    pub fn connected(&self) {
        self.connected.fetch_add(1, Ordering::Relaxed);
        self.connects.inc();
    }

    /// Classifies a failed connect: a refusal (see `refusal`) is recorded, and logged once
    /// per change rather than per retry. Returns the cause to report: for a refusal, the
    /// server's or TLS's words prefixed with what to fix.
    pub fn connect_failed(&self, cause: String) -> String {
        let Some(what) = refusal(&cause) else {
            return cause;
        };
        let text = format!("{what}: {cause}");
        let mut cur = self.refusal.lock().unwrap_or_else(|p| p.into_inner());
        if cur.as_ref().map(|(t, _)| t.as_str()) != Some(text.as_str()) {
            tracing::error!(cause = %text, "upstream refuses corral's connections");
        }
        *cur = Some((text.clone(), Instant::now()));
        text
    }

    /// A connect (handshake included) that began at `started` succeeded: a refusal recorded
    /// before then is over. One recorded since stands: this connect may have been accepted
    /// just before the change that refuses the others (a new password on Redis).
    pub fn connect_succeeded(&self, started: Instant) {
        let mut cur = self.refusal.lock().unwrap_or_else(|p| p.into_inner());
        if cur.as_ref().is_some_and(|(_, at)| *at <= started) {
            *cur = None;
            tracing::info!("upstream accepts corral's connections again");
        }
    }

    /// Why the upstream refuses corral's new connections (wrong or missing credentials, a
    /// TLS failure), while it does. Live connections may still work meanwhile: Redis keeps
    /// connections authenticated before a password change.
    pub fn refused(&self) -> Option<String> {
        self.refusal
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(|(text, _)| text.clone())
    }

    /// Records why a connection attempt failed or a live connection was lost.
    pub fn disconnected(&self, cause: &str) {
        if let Ok(mut e) = self.last_error.lock() {
            *e = Some(cause.to_string());
        }
    }

    /// A live connection went down.
    pub fn lost(&self) {
        let _ = self
            .connected
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    /// Records the local address of one of corral's connections, from its TCP connect on
    /// (its handshake included); `internal` when it carries no client's commands.
    pub fn add_conn(&self, local: SocketAddr, internal: bool) {
        self.conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(local, internal);
    }

    /// Forgets a connection's address once it is closed.
    pub fn remove_conn(&self, local: SocketAddr) {
        self.conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&local);
    }

    /// Whether MONITOR should leave out command `cmd` (its name as MONITOR quotes it, without
    /// the quotes) run by the client at `addr` (`ip:port`, as MONITOR prints it): everything
    /// an internal connection of corral's runs, and the handshake (HELLO, AUTH) of any of
    /// corral's connections: corral answers its clients' HELLO and AUTH itself, so none of
    /// those lines stands for something a client did; a HELLO without arguments is corral's
    /// health check. PING too: a client's PING is answered by corral, and one forwarded while
    /// Redis is busy is refused with `-BUSY` (which MONITOR never shows), so a PING from a
    /// shared connection is a health check (before Redis 6) or a Redis ACL user's own PING,
    /// which this leaves out too.
    pub fn monitor_hides(&self, addr: &str, cmd: &[u8]) -> bool {
        let Ok(a) = addr.parse::<SocketAddr>() else {
            return false;
        };
        let conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        match conns.get(&a) {
            Some(true) => true,
            Some(false) => {
                cmd.eq_ignore_ascii_case(b"HELLO")
                    || cmd.eq_ignore_ascii_case(b"AUTH")
                    || cmd.eq_ignore_ascii_case(b"PING")
            }
            None => false,
        }
    }

    /// Records the server version from the handshake.
    pub fn set_version(&self, v: &str) {
        if let Ok(mut cur) = self.version.lock()
            && cur.as_deref() != Some(v)
        {
            *cur = Some(v.to_string());
        }
    }

    /// The upstream server's version, once a handshake reported it.
    pub fn version(&self) -> Option<String> {
        self.version.lock().ok().and_then(|v| v.clone())
    }

    /// Live upstream connections.
    pub fn connected_count(&self) -> usize {
        self.connected.load(Ordering::Relaxed)
    }

    /// Successful connects since start.
    pub fn connects_total(&self) -> u64 {
        self.connects.get()
    }

    /// The counter behind [`UpstreamStatus::connects_total`], to register with the metrics.
    pub fn connects_counter(&self) -> Counter {
        self.connects.clone()
    }

    /// Counts a script or function as running until the returned guard is dropped.
    pub fn script_started(&self, keys: Vec<u64>, alone: bool) -> ScriptRun {
        self.scripts.fetch_add(1, Ordering::Relaxed);
        ScriptRun {
            running: self.scripts.clone(),
            learn: Box::new(Learn {
                book: self.book.clone(),
                keys,
                started: Instant::now(),
                alone,
            }),
        }
    }

    /// What is known of how long scripts take.
    pub fn script_book(&self) -> &ScriptBook {
        &self.book
    }

    /// The bar a shared connection whose own is `own` holds its writes at now (see
    /// `ConnSettings::hold_at`): `own`, lowered to the cap the cache sets while it serves
    /// many GETs. 0 (never hold) stays 0.
    pub fn hold_bar(&self, own: usize) -> usize {
        match self.hold_cap.load(Ordering::Relaxed) {
            0 => own,
            cap => own.min(cap),
        }
    }

    /// Caps every shared connection's bar (see [`UpstreamStatus::hold_bar`]), or lifts the
    /// cap (`None`): the cache, by what it serves.
    pub fn cap_hold_bar(&self, cap: Option<usize>) {
        self.hold_cap.store(cap.unwrap_or(0), Ordering::Relaxed);
    }

    /// A client sent CLIENT PAUSE for `ms` through corral (`None`: CLIENT UNPAUSE).
    pub fn note_pause(&self, ms: Option<u64>) {
        let until = ms.map_or(0, |ms| now_ms().saturating_add(ms).saturating_add(1));
        self.paused_until_ms.store(until, Ordering::Relaxed);
    }

    /// Whether a CLIENT PAUSE sent through corral may still be in effect on Redis.
    pub fn paused(&self) -> bool {
        let until = self.paused_until_ms.load(Ordering::Relaxed);
        until != 0 && now_ms() < until
    }

    /// Redis answered a request with `-BUSY` or `-LOADING`.
    pub fn saw_busy(&self) {
        self.busy_at_ms
            .store(now_ms().saturating_add(1), Ordering::Relaxed);
    }

    /// Whether PING (and ECHO) should be asked of Redis rather than answered by corral: a
    /// script sent through corral is running (Redis may be answering `-BUSY`), or Redis said
    /// `-BUSY` or `-LOADING` within the last two seconds. Otherwise corral answers them
    /// itself, and they keep working while the upstream is down.
    pub fn ping_goes_upstream(&self) -> bool {
        if self.scripts.load(Ordering::Relaxed) > 0 {
            return true;
        }
        let at = self.busy_at_ms.load(Ordering::Relaxed);
        at != 0 && now_ms().saturating_add(1).saturating_sub(at) < BUSY_MEMORY.as_millis() as u64
    }

    /// The last connection error, if any.
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().ok().and_then(|e| e.clone())
    }
}

/// What to fix when a connect failed because the upstream refuses corral (as opposed to being
/// down): its credentials, or its TLS settings. `None` for other failures.
pub(super) fn refusal(cause: &str) -> Option<&'static str> {
    // Redis's words: NOAUTH (no password sent), WRONGPASS (Redis 6+), `ERR invalid password`
    // (AUTH before 6), `ERR AUTH <password> called without any password configured` (a
    // password sent to a server without one: harmless for Redis, but not what was meant).
    let auth = ["NOAUTH", "WRONGPASS", "ERR invalid password", "ERR AUTH"];
    if auth.iter().any(|p| cause.starts_with(p)) {
        Some("authentication failed (check the credentials in upstream.url, then reload)")
    } else if cause.starts_with("tls") || cause.contains("fatal alert") {
        // A handshake error names itself; a refusal of corral's client certificate under
        // TLS 1.3 arrives as an alert on the first read, after the handshake.
        Some("TLS failed (check [upstream.tls] and the rediss:// URL)")
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_share_connections_once_seen_quick_and_never_after_being_slow() {
        let book = ScriptBook::default();
        let ms = Duration::from_millis;
        assert!(!book.is_quick(1));
        // Slow on a connection of its own: still isolated.
        book.learn(&[1], ms(30), true);
        assert!(!book.is_quick(1));
        book.learn(&[1, 2], ms(1), true);
        assert!(book.is_quick(1) && book.is_quick(2));
        // Quick on a shared connection: nothing to learn; slow there: isolated for good.
        book.learn(&[1], ms(1), false);
        assert!(book.is_quick(1));
        book.learn(&[1], ms(80), false);
        assert!(!book.is_quick(1));
        book.learn(&[1], ms(1), true);
        assert!(!book.is_quick(1), "a script once slow stays isolated");
        assert!(book.is_quick(2));
    }

    #[test]
    fn ping_goes_upstream_while_a_script_runs() {
        let s = UpstreamStatus::default();
        assert!(!s.ping_goes_upstream());
        let a = s.script_started(Vec::new(), true);
        let b = s.script_started(Vec::new(), true);
        assert!(s.ping_goes_upstream());
        drop(a);
        assert!(s.ping_goes_upstream());
        drop(b);
        assert!(!s.ping_goes_upstream());
    }

    #[test]
    fn refusals_are_kept_until_a_connect_succeeds() {
        let s = UpstreamStatus::default();
        let before = Instant::now();
        assert_eq!(
            s.connect_failed("Connection refused".into()),
            "Connection refused"
        );
        assert_eq!(s.refused(), None);
        let said = s.connect_failed("WRONGPASS invalid username-password pair".into());
        assert!(
            said.starts_with("authentication failed") && said.ends_with("pair"),
            "{said}"
        );
        assert_eq!(s.refused().as_deref(), Some(said.as_str()));
        // A failure of another kind (Redis down meanwhile) does not hide the refusal.
        s.connect_failed("Connection refused".into());
        assert!(s.refused().is_some());
        // A connect begun before the refusal was recorded says nothing of it.
        s.connect_succeeded(before);
        assert!(s.refused().is_some());
        s.connect_succeeded(Instant::now());
        assert_eq!(s.refused(), None);
        let tls = s.connect_failed("tls handshake with 127.0.0.1:1 failed: bad cert".into());
        assert!(tls.starts_with("TLS failed"), "{tls}");
    }

    #[test]
    fn ping_goes_upstream_after_a_busy_reply() {
        let s = UpstreamStatus::default();
        s.saw_busy();
        assert!(s.ping_goes_upstream());
    }
}
