//! corral's cache seen by a client: what `CORRAL CACHE STATS` says, making a key cached,
//! reading a key until a change shows, and what Redis saw of it.

use std::time::{Duration, Instant};

use std::collections::HashMap;

use super::client::{RawClient, connect, field};
use super::proxy::TestProxy;
use super::resp::show;
use super::server::RedisServer;
use super::wait::Deadline;

/// The value of a GET reply of a counter (a RESP2 or RESP3 nil as 0).
pub fn counter(reply: &[u8]) -> i64 {
    if reply == b"$-1\r\n" || reply == b"_\r\n" {
        return 0;
    }
    let text = String::from_utf8_lossy(reply);
    text.split("\r\n")
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("not a counter: {text:?}"))
}

/// `CORRAL CACHE STATS` (or any flat name/value reply) as a map.
pub async fn corral_stats(c: &mut RawClient) -> std::collections::HashMap<String, String> {
    let reply = c.cmd("CORRAL CACHE STATS").await;
    let frame = match redis_protocol::resp3::decode::complete::decode(&reply) {
        Ok(Some((f, _))) => f,
        other => panic!("CORRAL CACHE STATS: {other:?} from {}", show(&reply)),
    };
    use redis_protocol::resp3::types::OwnedFrame as F;
    let items = match frame {
        F::Array { data, .. } => data,
        F::Map { data, .. } => data.into_iter().flat_map(|(k, v)| [k, v]).collect(),
        other => panic!("CORRAL CACHE STATS is not an array: {other:?}"),
    };
    let text = |f: &F| match f {
        F::BlobString { data, .. } => String::from_utf8_lossy(data).into_owned(),
        other => panic!("CORRAL CACHE STATS item {other:?}"),
    };
    items
        .chunks(2)
        .map(|kv| (text(&kv[0]), text(&kv[1])))
        .collect()
}

/// One field of `CORRAL CACHE STATS`.
pub async fn stat(c: &mut RawClient, name: &str) -> String {
    corral_stats(c)
        .await
        .remove(name)
        .unwrap_or_else(|| panic!("no {name} in CORRAL CACHE STATS"))
}

/// One numeric field of `CORRAL CACHE STATS`.
pub async fn stat_n(c: &mut RawClient, name: &str) -> u64 {
    let v = stat(c, name).await;
    v.parse()
        .unwrap_or_else(|_| panic!("{name} is not a number: {v}"))
}

/// GETs `key` through corral (each reply must be `want`) until one GET is answered from the
/// local cache, i.e. `cache_hits` grew across it; at most 50 GETs. Only for tests where no
/// other client uses the proxy at the same time, or the hit could be someone else's.
pub async fn make_cached(c: &mut RawClient, key: &str, want: &[u8]) {
    make_cached_within(c, key, want, 50).await
}

/// [`make_cached`] with at most `tries` GETs.
pub async fn make_cached_within(c: &mut RawClient, key: &str, want: &[u8], tries: usize) {
    for _ in 0..tries {
        let before = stat_n(c, "cache_hits").await;
        let got = c.request(&[b"GET", key.as_bytes()]).await;
        assert_eq!(show(&got), show(want), "GET {key} while warming");
        if stat_n(c, "cache_hits").await > before {
            return;
        }
    }
    panic!(
        "{key} never became a cache hit after {tries} GETs: {:?}",
        corral_stats(c).await
    );
}

/// GET `key`; the reply bytes.
pub async fn get(c: &mut RawClient, key: &str) -> Vec<u8> {
    c.request(&[b"GET", key.as_bytes()]).await
}

/// GETs `key` through corral until it returns `want`; every earlier reply must be one of
/// `allowed` (or an upstream error when `errors_ok`). Returns how long it took and how many
/// GETs saw something else first. Panics after `limit`.
pub async fn get_until(
    c: &mut RawClient,
    key: &str,
    want: &[u8],
    allowed: &[&[u8]],
    errors_ok: bool,
    limit: Duration,
) -> (Duration, usize) {
    let start = Instant::now();
    let mut stale = 0;
    loop {
        let got = match c.try_request(&[b"GET", key.as_bytes()]).await {
            Ok(g) => g,
            Err(e) if errors_ok => format!("-io {e}\r\n").into_bytes(),
            Err(e) => panic!("GET {key}: {e}"),
        };
        if got == want {
            return (start.elapsed(), stale);
        }
        let error = got.starts_with(b"-");
        assert!(
            allowed.contains(&got.as_slice()) || (errors_ok && error),
            "GET {key} returned {} while waiting for {}",
            show(&got),
            show(want)
        );
        stale += 1;
        assert!(
            start.elapsed() < limit,
            "GET {key} still returns {} {:?} after the change; expected {}",
            show(&got),
            start.elapsed(),
            show(want)
        );
        if errors_ok && error {
            // The upstream is recovering: reconnect (the old connection may be gone) and
            // give it a moment.
            tokio::time::sleep(Duration::from_millis(20)).await;
            if let Ok(fresh) = RawClient::connect(c.stream.peer_addr().expect("peer")).await {
                *c = fresh;
            }
        }
    }
}

/// Asserts that `n` more GETs of `key` all return `want`: once new, never old again.
pub async fn stays(c: &mut RawClient, key: &str, want: &[u8], n: usize) {
    for i in 0..n {
        let got = get(c, key).await;
        assert_eq!(
            got,
            want,
            "GET {key} #{i} went back to {} after returning {}",
            show(&got),
            show(want)
        );
    }
}

/// `CORRAL CACHE STATS`, asked over a RESP2 connection (a flat array of name, value pairs).
pub struct Stats(pub HashMap<String, String>);

impl Stats {
    pub async fn of(c: &mut RawClient) -> Stats {
        Stats(corral_stats(c).await)
    }

    /// Polls the stats (20 ms apart, up to 10 s) until `done` holds.
    pub async fn wait(c: &mut RawClient, what: &str, done: impl Fn(&Stats) -> bool) -> Stats {
        let deadline = Deadline::new(Duration::from_secs(10), what);
        loop {
            let s = Stats::of(c).await;
            if done(&s) {
                return s;
            }
            deadline.pause_seeing(&s.0).await;
        }
    }

    pub fn text(&self, name: &str) -> &str {
        self.0
            .get(name)
            .unwrap_or_else(|| panic!("no {name} in CORRAL CACHE STATS: {:?}", self.0))
    }

    pub fn n(&self, name: &str) -> u64 {
        let v = self.text(name);
        v.parse()
            .unwrap_or_else(|_| panic!("{name} is not a number: {v:?}"))
    }
}

/// Redis, corral in front of it with default settings, and a client of each.
pub async fn start() -> (RedisServer, TestProxy, RawClient, RawClient) {
    let redis = RedisServer::start();
    let proxy = TestProxy::start(&redis.url()).await;
    let direct = connect(redis.addr()).await;
    let c = connect(proxy.addr).await;
    (redis, proxy, direct, c)
}

/// Calls of GET that Redis executed since the last `CONFIG RESETSTAT` (including GETs inside
/// the cache's MULTI/EXEC fills), from `INFO commandstats`.
pub async fn redis_get_calls(direct: &mut RawClient) -> u64 {
    let info = direct.cmd("INFO commandstats").await;
    let text = String::from_utf8_lossy(&info);
    text.split("cmdstat_get:calls=")
        .nth(1)
        .map(|rest| {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().expect("calls= number")
        })
        .unwrap_or(0)
}

/// Percentile of sorted durations.
pub fn pct(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// The id of corral's tracking lane on Redis (`CLIENT LIST` flags contain `t`).
pub async fn tracking_client_id(direct: &mut RawClient) -> Option<String> {
    let list = direct.cmd("CLIENT LIST").await;
    let text = String::from_utf8_lossy(&list).into_owned();
    text.lines().find_map(|line| {
        field(line, "flags")
            .filter(|f| f.contains('t'))
            .and_then(|_| Some(field(line, "id")?.to_string()))
    })
}

/// What a load reader returns: its pipeline depth, its rounds, and the reads of its that went
/// back.
pub type ReaderDone = (usize, usize, Vec<String>);

/// Waits for every reader of a load, prints each one's rounds, and returns the first few
/// reads of each that went back.
pub async fn reads_gone_back(readers: &mut tokio::task::JoinSet<ReaderDone>) -> Vec<String> {
    let mut failures = Vec::new();
    while let Some(done) = readers.join_next().await {
        let (depth, rounds, back) = done.expect("reader");
        eprintln!(
            "reader -P {depth}: {rounds} rounds, {} reads went back",
            back.len()
        );
        failures.extend(back.into_iter().take(3));
    }
    failures
}
