//! The local cache and GET coalescing against real Redis, trying hard to break coherence
//! (DESIGN.md R3/R4): stampedes, read-your-writes under concurrent readers, writes made
//! directly on Redis, expiry, flushes, upstream restarts, a killed tracking connection, the
//! memory bound, the no-cache mode and the TTL-only fallback.
//!
//! Latencies are measured and printed (run with `--nocapture`), never asserted.

mod common;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{
    Deadline, RawClient, RedisServer, TestProxy, argv, bulk, client_in, connect, corral_stats,
    encode, field, get, get_until, int, int_of, make_cached, payload, show, stat_n, stays,
};
use tokio::task::JoinSet;

const OK: &[u8] = b"+OK\r\n";
const NIL: &[u8] = b"$-1\r\n";
const NIL3: &[u8] = b"_\r\n";

// ---- helpers ----

/// `CORRAL CACHE STATS`, asked over a RESP2 connection (a flat array of name, value pairs).
struct Stats(HashMap<String, String>);

impl Stats {
    async fn of(c: &mut RawClient) -> Stats {
        Stats(corral_stats(c).await)
    }

    /// Polls the stats (20 ms apart, up to 10 s) until `done` holds.
    async fn wait(c: &mut RawClient, what: &str, done: impl Fn(&Stats) -> bool) -> Stats {
        let deadline = Deadline::new(Duration::from_secs(10), what);
        loop {
            let s = Stats::of(c).await;
            if done(&s) {
                return s;
            }
            deadline.pause_seeing(&s.0).await;
        }
    }

    fn text(&self, name: &str) -> &str {
        self.0
            .get(name)
            .unwrap_or_else(|| panic!("no {name} in CORRAL CACHE STATS: {:?}", self.0))
    }

    fn n(&self, name: &str) -> u64 {
        let v = self.text(name);
        v.parse()
            .unwrap_or_else(|_| panic!("{name} is not a number: {v:?}"))
    }
}

/// Redis, corral in front of it with default settings, and a client of each.
async fn start() -> (RedisServer, TestProxy, RawClient, RawClient) {
    let redis = RedisServer::start();
    let proxy = TestProxy::start(&redis.url()).await;
    let direct = connect(redis.addr()).await;
    let c = connect(proxy.addr).await;
    (redis, proxy, direct, c)
}

/// Calls of GET that Redis executed since the last `CONFIG RESETSTAT` (including GETs inside
/// the cache's MULTI/EXEC fills), from `INFO commandstats`.
async fn redis_get_calls(direct: &mut RawClient) -> u64 {
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
fn pct(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

/// The id of corral's tracking lane on Redis (`CLIENT LIST` flags contain `t`).
async fn tracking_client_id(direct: &mut RawClient) -> Option<String> {
    let list = direct.cmd("CLIENT LIST").await;
    let text = String::from_utf8_lossy(&list).into_owned();
    text.lines().find_map(|line| {
        field(line, "flags")
            .filter(|f| f.contains('t'))
            .and_then(|_| Some(field(line, "id")?.to_string()))
    })
}

// ---- 1. stampedes ----

/// A client for the stampede, and whether it speaks RESP3.
struct Stampeder {
    c: RawClient,
    resp3: bool,
}

/// Sends one GET of `key` from every client while Redis is held by `CLIENT PAUSE`, then
/// checks every reply and that Redis ran at most `reads` GETs (and every other GET joined
/// one). Retries with a new key if corral had not received all GETs before the pause ran out
/// (a slow machine, not a corral fault).
async fn stampede(
    proxy: &TestProxy,
    direct: &mut RawClient,
    clients: &mut Vec<Stampeder>,
    name: &str,
    value: Option<&str>,
    reads: u64,
) {
    const PAUSE_MS: u64 = 1000;
    let mut admin = connect(proxy.addr).await;
    for attempt in 0..3 {
        let key = format!("{name}:{attempt}");
        if let Some(v) = value {
            assert_eq!(direct.cmd(&format!("SET {key} {v}")).await, OK);
        }
        assert_eq!(direct.cmd("CONFIG RESETSTAT").await, OK);
        let before = Stats::of(&mut admin).await;
        assert_eq!(
            direct.cmd(&format!("CLIENT PAUSE {PAUSE_MS} ALL")).await,
            OK
        );
        let paused = Instant::now();
        let n = clients.len() as u64;
        let mut tasks = JoinSet::new();
        for mut s in clients.drain(..) {
            let key = key.clone();
            tasks.spawn(async move {
                let got = get(&mut s.c, &key).await;
                (s, got)
            });
        }
        // Every GET has reached corral once each counted as a miss (CORRAL is local, so it
        // answers while Redis is paused).
        let misses = before.n("cache_misses") + n;
        let after = Stats::wait(&mut admin, "corral to receive every GET", |s| {
            s.n("cache_misses") >= misses
        })
        .await;
        let in_time = paused.elapsed() < Duration::from_millis(PAUSE_MS * 8 / 10);
        let want2 = value.map_or(NIL.to_vec(), bulk);
        let want3 = value.map_or(NIL3.to_vec(), bulk);
        while let Some(r) = tasks.join_next().await {
            let (s, got) = r.expect("stampede task");
            let want = if s.resp3 { &want3 } else { &want2 };
            assert_eq!(
                &got,
                want,
                "stampede on {key} (resp3={}): {}",
                s.resp3,
                show(&got)
            );
            clients.push(s);
        }
        if !in_time {
            eprintln!("stampede {key}: GETs not all sent within the pause, retrying");
            continue;
        }
        let misses = after.n("cache_misses") - before.n("cache_misses");
        let coalesced = after.n("cache_coalesced") - before.n("cache_coalesced");
        assert_eq!(misses, n, "{key}: every GET of a cold key is a miss");
        let calls = redis_get_calls(direct).await;
        assert!(
            (1..=reads).contains(&calls),
            "{key}: {n} GETs during a pause reached Redis as {calls} GETs, not at most {reads}"
        );
        assert_eq!(
            coalesced,
            n - calls,
            "{key}: every GET but the {calls} sent joins a read"
        );
        return;
    }
    panic!(
        "could not send {} GETs within {PAUSE_MS} ms in 3 tries",
        clients.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stampede_on_a_cold_key_reaches_redis_once() {
    let redis = RedisServer::start();
    let proxy = TestProxy::start(&redis.url()).await;
    let mut direct = connect(redis.addr()).await;
    let mut clients = Vec::new();
    for i in 0..500 {
        let mut c = connect(proxy.addr).await;
        // Every fifth client speaks RESP3: the shared read must be encoded per client.
        let resp3 = i % 5 == 0;
        if resp3 {
            let hello = c.cmd("HELLO 3").await;
            assert!(hello.starts_with(b"%"), "HELLO 3: {}", show(&hello));
        }
        clients.push(Stampeder { c, resp3 });
    }
    stampede(
        &proxy,
        &mut direct,
        &mut clients,
        "stampede:present",
        Some("v"),
        1,
    )
    .await;
    let missing = "stampede:missing";
    stampede(&proxy, &mut direct, &mut clients, missing, None, 1).await;
    proxy.stop().await;
}

/// Over a key space far larger than the frequency sketch, a key never read before is cold:
/// its first GET is forwarded with no per-key state, so it cannot be joined, but the second
/// is remembered as a read of a recently read key and the rest join it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stampede_on_a_key_never_read_over_a_large_key_space_costs_two_reads_at_most() {
    let redis = RedisServer::start();
    let proxy = TestProxy::start(&redis.url()).await;
    let mut direct = connect(redis.addr()).await;
    let mut c = connect(proxy.addr).await;
    // Raise the sketch's noise floor: 120,000 GETs of distinct keys.
    let n = 120_000;
    let mut reqs = Vec::new();
    for i in 0..n {
        reqs.extend(encode(&[b"GET", format!("noise:{i}").as_bytes()]));
    }
    let replies = c.pipeline(&reqs, 64 * 1024, n).await;
    assert!(replies.iter().all(|r| r == NIL), "noise GETs answer nil");
    let floor = stat_n(&mut c, "cache_noise_floor").await;
    assert!(floor >= 1, "the noise floor did not rise: {floor}");
    let mut clients = Vec::new();
    for i in 0..100 {
        let resp3 = i % 5 == 0;
        clients.push(Stampeder {
            c: client_in(proxy.addr, resp3).await,
            resp3,
        });
    }
    let present = "stampede:cold:present";
    stampede(&proxy, &mut direct, &mut clients, present, Some("v"), 2).await;
    let missing = "stampede:cold:missing";
    stampede(&proxy, &mut direct, &mut clients, missing, None, 2).await;
    proxy.stop().await;
}

// ---- 2. read-your-writes through corral ----

/// The key a writer writes in one iteration of the stress.
struct Key<'a> {
    name: &'a [u8],
    /// The iteration: the value written.
    i: i64,
    /// The key had no value before.
    fresh: bool,
}

impl Key<'_> {
    fn value(&self) -> Vec<u8> {
        self.i.to_string().into_bytes()
    }
}

/// What a reply must be.
enum Want {
    Is(Vec<u8>),
    /// An integer within the range (a TTL).
    IntIn(i64, i64),
}

/// A request sent through corral, and the reply it must get.
struct Req {
    args: Vec<Vec<u8>>,
    want: Want,
}

fn req(args: &[&[u8]], want: &[u8]) -> Req {
    Req {
        args: args.iter().map(|a| a.to_vec()).collect(),
        want: Want::Is(want.to_vec()),
    }
}

fn get_is(k: &Key, want: &[u8]) -> Req {
    req(&[b"GET", k.name], want)
}

/// One kind of write in the read-your-writes stress: what the writer sends through corral
/// before the write (each request answered before the next), the write itself (its requests
/// in one write), and what it reads back after.
struct WriteKind {
    name: &'static str,
    setup: fn(&Key) -> Vec<Req>,
    write: fn(&Key) -> Vec<Req>,
    read: fn(&Key) -> Vec<Req>,
    /// For writes after which the key's value only grows: the value written, a floor for
    /// every read of it once the write is acknowledged.
    floor: Option<fn(&Key) -> i64>,
}

fn nothing(_: &Key) -> Vec<Req> {
    Vec::new()
}

/// SET the value and read it back first (for writes that then remove or expire it).
fn set_and_get(k: &Key) -> Vec<Req> {
    let v = k.value();
    vec![req(&[b"SET", k.name, &v], OK), get_is(k, &bulk(&v))]
}

fn get_value(k: &Key) -> Vec<Req> {
    vec![get_is(k, &bulk(k.value()))]
}

/// What INCR makes of the key.
fn incremented(k: &Key) -> i64 {
    if k.fresh { 1 } else { k.i + 1 }
}

const WRITES: &[WriteKind] = &[
    WriteKind {
        name: "SET",
        setup: nothing,
        write: |k| vec![req(&[b"SET", k.name, &k.value()], OK)],
        read: get_value,
        floor: Some(|k| k.i),
    },
    WriteKind {
        name: "DEL",
        setup: set_and_get,
        write: |k| vec![req(&[b"DEL", k.name], &int(1))],
        read: |k| vec![get_is(k, NIL)],
        floor: None,
    },
    WriteKind {
        name: "INCR",
        setup: nothing,
        write: |k| vec![req(&[b"INCR", k.name], &int(incremented(k)))],
        read: |k| vec![get_is(k, &bulk(incremented(k).to_string()))],
        floor: Some(incremented),
    },
    // Even iterations set a TTL, odd ones a non-positive expiry, which deletes the key at once.
    WriteKind {
        name: "PEXPIRE",
        setup: set_and_get,
        write: |k| {
            let ms: &[u8] = if k.i % 2 == 0 { b"100000" } else { b"0" };
            vec![req(&[b"PEXPIRE", k.name, ms], &int(1))]
        },
        read: |k| match k.i % 2 {
            0 => vec![
                get_is(k, &bulk(k.value())),
                Req {
                    args: vec![b"PTTL".to_vec(), k.name.to_vec()],
                    want: Want::IntIn(1, 100_000),
                },
            ],
            _ => vec![get_is(k, NIL)],
        },
        floor: None,
    },
    // The key second, so more than the first argument must be invalidated.
    WriteKind {
        name: "MSET",
        setup: nothing,
        write: |k| {
            let other = [k.name, b":other"].concat();
            vec![req(&[b"MSET", &other, b"x", k.name, &k.value()], OK)]
        },
        read: get_value,
        floor: None,
    },
    WriteKind {
        name: "EVAL",
        setup: nothing,
        write: |k| {
            let script = b"redis.call('SET', KEYS[1], ARGV[1])";
            vec![req(&[b"EVAL", script, b"1", k.name, &k.value()], NIL)]
        },
        read: get_value,
        floor: None,
    },
    // SET and GET in one write.
    WriteKind {
        name: "pipelined SET GET",
        setup: nothing,
        write: |k| {
            let mut w = vec![req(&[b"SET", k.name, &k.value()], OK)];
            w.extend(get_value(k));
            w
        },
        read: nothing,
        floor: Some(|k| k.i),
    },
];

/// The write kind called `name`.
fn write_kind(name: &str) -> &'static WriteKind {
    let w = WRITES.iter().find(|w| w.name == name);
    w.unwrap_or_else(|| panic!("no write kind {name}"))
}

/// Sends `reqs` in one write and checks their replies in order.
async fn exchange(c: &mut RawClient, phase: &str, reqs: &[Req]) -> Result<(), String> {
    let bytes: Vec<u8> = reqs.iter().flat_map(|r| encode(&argv(&r.args))).collect();
    c.send(&bytes).await;
    let replies = c.read_replies(reqs.len()).await;
    for (r, got) in reqs.iter().zip(replies) {
        let ok = match &r.want {
            Want::Is(want) => got == *want,
            Want::IntIn(lo, hi) => int_of(&got).is_some_and(|n| (*lo..=*hi).contains(&n)),
        };
        if !ok {
            let cmd = String::from_utf8_lossy(&r.args[0]);
            return Err(format!("{cmd} ({phase}): got {}", show(&got)));
        }
    }
    Ok(())
}

/// One iteration of `w` on `key` through corral: setup, write, read back. Sets `floor` to the
/// written value once the write is acknowledged (writes after which values only grow).
async fn write_then_read(
    w: &WriteKind,
    c: &mut RawClient,
    key: &Key<'_>,
    floor: &AtomicI64,
) -> Result<(), String> {
    for r in (w.setup)(key) {
        exchange(c, "setup", std::slice::from_ref(&r)).await?;
    }
    exchange(c, "the write", &(w.write)(key)).await?;
    if let Some(written) = w.floor {
        floor.store(written(key), Ordering::SeqCst);
    }
    for r in (w.read)(key) {
        exchange(c, "read after the write", std::slice::from_ref(&r)).await?;
    }
    Ok(())
}

/// Background readers: GET the current key in a loop. Every reply must be nil or a number,
/// and at least `floor` when that is set: a GET sent after a write was acknowledged to the
/// writer must not see an older value, whoever's read it joins.
fn spawn_readers(
    addr: std::net::SocketAddr,
    prefix: Arc<str>,
    current: Arc<AtomicUsize>,
    floor: Arc<AtomicI64>,
    stop: Arc<AtomicBool>,
) -> JoinSet<(u64, Vec<String>)> {
    let mut set = JoinSet::new();
    for _ in 0..8 {
        let (prefix, current, floor, stop) =
            (prefix.clone(), current.clone(), floor.clone(), stop.clone());
        set.spawn(async move {
            let mut c = connect(addr).await;
            let mut reads = 0;
            let mut bad = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                let key = format!("{prefix}{}", current.load(Ordering::SeqCst));
                let min = floor.load(Ordering::SeqCst);
                let got = get(&mut c, &key).await;
                reads += 1;
                let n = payload(&got)
                    .filter(|_| got.starts_with(b"$"))
                    .and_then(|v| String::from_utf8(v).ok()?.parse::<i64>().ok());
                let ok = match n {
                    Some(n) => n >= min,
                    None => got == NIL && min < 0,
                };
                if !ok && bad.len() < 10 {
                    bad.push(format!("reader GET {key}: {} with floor {min}", show(&got)));
                }
            }
            (reads, bad)
        });
    }
    set
}

/// The read-your-writes stress for one kind of write: 8 clients hammer GETs of the key while
/// a writer does 500 × (write through corral, GET it back) and must see its write every time.
///
/// Two rounds. In the first every iteration uses a fresh key, warmed up to the hot threshold
/// just before the write, so the write races a cached entry and tracked fills; this is needed
/// because the admission sketch stops caching a key soon after it has been written a few
/// times. In the second one key takes all 500 writes, racing mostly coalesced reads.
async fn read_your_writes(w: &WriteKind) {
    let redis = RedisServer::start();
    let proxy = TestProxy::start(&redis.url()).await;
    let mut admin = connect(proxy.addr).await;
    let before = Stats::of(&mut admin).await;
    for rotate in [true, false] {
        let prefix: Arc<str> = format!("ryw:{}:{rotate}:", w.name).into();
        let current = Arc::new(AtomicUsize::new(0));
        let floor = Arc::new(AtomicI64::new(-1));
        let stop = Arc::new(AtomicBool::new(false));
        let mut writer = connect(proxy.addr).await;
        if !rotate {
            // Make the single key hot before the readers start.
            for _ in 0..20 {
                assert_eq!(get(&mut writer, &format!("{prefix}0")).await, NIL);
            }
        }
        let mut readers = spawn_readers(
            proxy.addr,
            prefix.clone(),
            current.clone(),
            floor.clone(),
            stop.clone(),
        );
        // Readers check the floor only where values grow on one key.
        let writer_floor = if !rotate && w.floor.is_some() {
            floor.clone()
        } else {
            Arc::new(AtomicI64::new(-1))
        };
        let mut failures = Vec::new();
        for i in 0..500usize {
            let gen_ = if rotate { i } else { 0 };
            let key = format!("{prefix}{gen_}");
            if rotate {
                current.store(i, Ordering::SeqCst);
                // Past the hot threshold (readers add more), so the key is cached or being
                // filled over the tracking lane when the write comes.
                for _ in 0..5 {
                    let got = get(&mut writer, &key).await;
                    assert_eq!(got, NIL, "fresh key {key} read before any write");
                }
            }
            let k = Key {
                name: key.as_bytes(),
                i: i as i64,
                fresh: rotate,
            };
            if let Err(e) = write_then_read(w, &mut writer, &k, &writer_floor).await {
                failures.push(format!("iteration {i} key {key}: {e}"));
            }
        }
        stop.store(true, Ordering::SeqCst);
        let mut reads = 0;
        while let Some(r) = readers.join_next().await {
            let (n, bad) = r.expect("reader task");
            reads += n;
            failures.extend(bad);
        }
        assert!(
            failures.is_empty(),
            "{} (fresh key per write: {rotate}): {} stale or wrong replies, first: {:#?}",
            w.name,
            failures.len(),
            &failures[..failures.len().min(10)]
        );
        assert!(reads > 500, "readers barely ran ({reads} GETs)");
    }
    let after = Stats::of(&mut admin).await;
    let delta = |n: &str| after.n(n) - before.n(n);
    eprintln!(
        "read-your-writes {}: hits {} fills {} coalesced {} inserts {} local invalidations {} \
         invalidations {}",
        w.name,
        delta("cache_hits"),
        delta("cache_fills"),
        delta("cache_coalesced"),
        delta("cache_inserts"),
        delta("cache_local_invalidations"),
        delta("cache_invalidations")
    );
    // The stress is only meaningful if the cache and coalescing were really in play.
    assert!(delta("cache_hits") > 0, "no GET was a cache hit");
    assert!(delta("cache_inserts") > 0, "nothing was cached");
    assert!(delta("cache_coalesced") > 0, "no GET was coalesced");
    proxy.stop().await;
}

/// One test per write kind, so that each passes or fails on its own.
macro_rules! read_your_writes_tests {
    ($($test:ident: $kind:literal,)*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            read_your_writes(write_kind($kind)).await;
        }
    )*};
}

read_your_writes_tests! {
    read_your_writes_set: "SET",
    read_your_writes_del: "DEL",
    read_your_writes_incr: "INCR",
    read_your_writes_expire: "PEXPIRE",
    read_your_writes_mset: "MSET",
    read_your_writes_lua: "EVAL",
    read_your_writes_pipelined: "pipelined SET GET",
}

// MULTI/EXEC is refused by corral for now ("unsupported"), so a write inside a transaction is
// not covered here.

// ---- 3. writes made directly on Redis ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_write_replaces_a_cached_value() {
    let (_redis, proxy, mut direct, mut c) = start().await;
    assert_eq!(direct.cmd("SET k old").await, OK);
    make_cached(&mut c, "k", &bulk("old")).await;
    // Repeated GETs are served locally.
    let hits = Stats::of(&mut c).await.n("cache_hits");
    stays(&mut c, "k", &bulk("old"), 20).await;
    assert!(Stats::of(&mut c).await.n("cache_hits") >= hits + 20);

    assert_eq!(direct.cmd("SET k new").await, OK);
    let (took, stale) = get_until(
        &mut c,
        "k",
        &bulk("new"),
        &[&bulk("old")],
        false,
        Duration::from_secs(2),
    )
    .await;
    eprintln!("direct SET visible through corral after {took:?} ({stale} stale GETs)");
    stays(&mut c, "k", &bulk("new"), 1000).await;
    proxy.stop().await;
}

/// Write acked directly by Redis → first GET through corral that returns the new value,
/// 200 times on a freshly cached key each time. Prints p50/p99; asserts only correctness.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalidation_latency_of_direct_writes() {
    let (_redis, proxy, mut direct, mut c) = start().await;
    let mut lat = Vec::new();
    let mut stale_total = 0;
    // For comparison: one GET round trip through corral on a cache hit.
    let mut rtt = Vec::new();
    for i in 0..200 {
        let key = format!("lat:{i}");
        assert_eq!(direct.cmd(&format!("SET {key} old")).await, OK);
        make_cached(&mut c, &key, &bulk("old")).await;
        let t = Instant::now();
        assert_eq!(get(&mut c, &key).await, bulk("old"));
        rtt.push(t.elapsed());
        assert_eq!(direct.cmd(&format!("SET {key} new")).await, OK);
        let (took, stale) = get_until(
            &mut c,
            &key,
            &bulk("new"),
            &[&bulk("old")],
            false,
            Duration::from_secs(2),
        )
        .await;
        lat.push(took);
        stale_total += stale;
        stays(&mut c, &key, &bulk("new"), 20).await;
    }
    lat.sort();
    rtt.sort();
    eprintln!(
        "invalidation latency (direct SET acked -> corral GET returns new), 200 runs: \
         p50 {:?} p99 {:?} max {:?}; stale GETs after the ack: {stale_total}; \
         cache-hit GET round trip p50 {:?} p99 {:?}",
        pct(&lat, 0.5),
        pct(&lat, 0.99),
        lat[lat.len() - 1],
        pct(&rtt, 0.5),
        pct(&rtt, 0.99)
    );
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cached_keys_with_a_ttl_expire() {
    let (_redis, proxy, mut direct, mut c) = start().await;

    // A TTL set with the value.
    assert_eq!(direct.cmd("SET ttl:a v PX 300").await, OK);
    make_cached(&mut c, "ttl:a", &bulk("v")).await;
    let (took, _) = get_until(
        &mut c,
        "ttl:a",
        NIL,
        &[&bulk("v")],
        false,
        Duration::from_secs(3),
    )
    .await;
    eprintln!("key with PX 300 read nil through corral after {took:?} more");
    stays(&mut c, "ttl:a", NIL, 100).await;

    // A TTL added directly to a cached key that had none.
    assert_eq!(direct.cmd("SET ttl:b v").await, OK);
    make_cached(&mut c, "ttl:b", &bulk("v")).await;
    assert_eq!(direct.cmd("PEXPIRE ttl:b 200").await, int(1));
    get_until(
        &mut c,
        "ttl:b",
        NIL,
        &[&bulk("v")],
        false,
        Duration::from_secs(3),
    )
    .await;
    stays(&mut c, "ttl:b", NIL, 100).await;
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_flushes_empty_the_cache() {
    let (_redis, proxy, mut direct, mut c) = start().await;
    for flush in ["FLUSHALL", "FLUSHDB", "FLUSHALL ASYNC", "FLUSHDB SYNC"] {
        let keys: Vec<String> = (0..5).map(|i| format!("flush:{i}")).collect();
        for k in &keys {
            assert_eq!(direct.cmd(&format!("SET {k} v")).await, OK);
            // From the second round on the key is cached as nil: allow the invalidation its
            // moment in flight.
            get_until(&mut c, k, &bulk("v"), &[NIL], false, Duration::from_secs(2)).await;
            make_cached(&mut c, k, &bulk("v")).await;
        }
        assert_eq!(direct.cmd(flush).await, OK);
        for k in &keys {
            get_until(&mut c, k, NIL, &[&bulk("v")], false, Duration::from_secs(2)).await;
            stays(&mut c, k, NIL, 50).await;
        }
    }
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_restart_with_other_data_is_not_served_stale() {
    let mut redis = RedisServer::start();
    let proxy = TestProxy::start_with(&redis.url(), |cfg| {
        cfg.upstream.reconnect_max_ms = 200;
    })
    .await;
    let mut c = connect(proxy.addr).await;
    {
        let mut direct = connect(redis.addr()).await;
        assert_eq!(direct.cmd("SET k old").await, OK);
    }
    make_cached(&mut c, "k", &bulk("old")).await;
    redis.kill();
    redis.restart();
    let mut direct = connect(redis.addr()).await;
    assert_eq!(direct.cmd("SET k new").await, OK);
    // While corral reconnects it may answer with errors, never with the old value (nor nil:
    // the new value was written before this first GET).
    let (took, waited) = get_until(
        &mut c,
        "k",
        &bulk("new"),
        &[],
        true,
        Duration::from_secs(10),
    )
    .await;
    eprintln!(
        "after an upstream restart corral served the new value after {took:?} ({waited} error replies)"
    );
    stays(&mut c, "k", &bulk("new"), 100).await;
    // And it caches again afterwards.
    make_cached(&mut c, "k", &bulk("new")).await;
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_tracking_connection_flushes_and_recovers() {
    let (_redis, proxy, mut direct, mut c) = start().await;
    assert_eq!(direct.cmd("SET k old").await, OK);
    make_cached(&mut c, "k", &bulk("old")).await;
    let before = Stats::of(&mut c).await;
    assert_eq!(before.text("cache_tracking"), "on");
    assert!(before.n("cache_entries") >= 1);
    let lane = tracking_client_id(&mut direct)
        .await
        .expect("a client with tracking flag t in CLIENT LIST");

    // Kill the lane and write in the same breath: Redis will not tell the dead lane about the
    // write, so only the flush on reconnect keeps corral from serving "old".
    let mut req = encode(&[b"CLIENT", b"KILL", b"ID", lane.as_bytes()]);
    req.extend_from_slice(&encode(&[b"SET", b"k", b"new"]));
    direct.send(&req).await;
    assert_eq!(direct.read_reply().await, int(1), "CLIENT KILL ID {lane}");
    assert_eq!(direct.read_reply().await, OK);

    let (took, stale) = get_until(
        &mut c,
        "k",
        &bulk("new"),
        &[&bulk("old")],
        true,
        Duration::from_secs(5),
    )
    .await;
    eprintln!(
        "after killing the tracking connection: new value after {took:?} ({stale} stale/error GETs)"
    );
    stays(&mut c, "k", &bulk("new"), 1000).await;

    // The lane comes back under a new id, everything cached before was dropped, and caching
    // and invalidation work again.
    let deadline = Instant::now() + Duration::from_secs(5);
    let new_lane = loop {
        match tracking_client_id(&mut direct).await {
            Some(id) if id != lane => break id,
            _ => assert!(Instant::now() < deadline, "no new tracking lane"),
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let after = Stats::of(&mut c).await;
    assert_eq!(after.text("cache_tracking"), "on");
    assert!(
        after.n("cache_flushes") > before.n("cache_flushes"),
        "losing the lane must flush: {:?}",
        after.0
    );
    make_cached(&mut c, "k", &bulk("new")).await;
    assert_eq!(direct.cmd("SET k newer").await, OK);
    get_until(
        &mut c,
        "k",
        &bulk("newer"),
        &[&bulk("new")],
        false,
        Duration::from_secs(2),
    )
    .await;
    stays(&mut c, "k", &bulk("newer"), 100).await;
    eprintln!("tracking lane {lane} killed, replaced by {new_lane}");
    proxy.stop().await;
}

/// Redis forgets keys beyond `tracking-table-max-keys` and sends invalidations for them:
/// everything cached must still follow direct writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tracking_table_overflow_keeps_coherence() {
    let redis = RedisServer::start_with(&["--tracking-table-max-keys", "10"]);
    let proxy = TestProxy::start(&redis.url()).await;
    let mut direct = connect(redis.addr()).await;
    let mut c = connect(proxy.addr).await;
    let keys: Vec<String> = (0..50).map(|i| format!("tt:{i}")).collect();
    for k in &keys {
        assert_eq!(direct.cmd(&format!("SET {k} old")).await, OK);
        // Warm without insisting on a hit: the table overflow may evict it at once.
        for _ in 0..6 {
            assert_eq!(get(&mut c, k).await, bulk("old"));
        }
    }
    for k in &keys {
        assert_eq!(direct.cmd(&format!("SET {k} new")).await, OK);
    }
    for k in &keys {
        get_until(
            &mut c,
            k,
            &bulk("new"),
            &[&bulk("old")],
            false,
            Duration::from_secs(2),
        )
        .await;
        stays(&mut c, k, &bulk("new"), 20).await;
    }
    proxy.stop().await;
}

/// `SWAPDB` run directly on Redis changes what every key of db 0 holds, but Redis (7.0) sends
/// tracking clients no invalidation for it, so corral keeps serving db 0's old values until
/// `max_age_ms` (60 s by default). Through corral SWAPDB flushes the cache; directly it can't.
/// (db 1 is written before the key is cached: Redis tracks keys by name in every db, so a
/// later write to `k` in db 1 would itself invalidate db 0's `k` and hide the problem.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "limitation: Redis sends no tracking invalidation for a direct SWAPDB; corral serves the swapped-out value for up to max_age_ms"]
async fn direct_swapdb_is_seen() {
    let (_redis, proxy, mut direct, mut c) = start().await;
    assert_eq!(direct.cmd("SELECT 1").await, OK);
    assert_eq!(direct.cmd("SET k db1").await, OK);
    assert_eq!(direct.cmd("SELECT 0").await, OK);
    assert_eq!(direct.cmd("SET k db0").await, OK);
    make_cached(&mut c, "k", &bulk("db0")).await;
    assert_eq!(direct.cmd("SWAPDB 0 1").await, OK);
    assert_eq!(direct.cmd("GET k").await, bulk("db1"), "Redis itself");
    get_until(
        &mut c,
        "k",
        &bulk("db1"),
        &[&bulk("db0")],
        false,
        Duration::from_secs(2),
    )
    .await;
    proxy.stop().await;
}

/// A script that writes a key it does not declare in KEYS: corral cannot see which key it
/// writes, so only Redis's invalidation push (racing the EVAL reply) removes the entry, and
/// a GET sent right after the EVAL reply can still be answered from the cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lua_write_to_an_undeclared_key_is_read_back() {
    let redis = RedisServer::start();
    let proxy = TestProxy::start(&redis.url()).await;
    let mut c = connect(proxy.addr).await;
    let mut stale = 0;
    for i in 0..300 {
        let key = format!("undeclared:{i}");
        assert_eq!(c.cmd(&format!("SET {key} old")).await, OK);
        make_cached(&mut c, &key, &bulk("old")).await;
        let script = format!("redis.call('SET', '{key}', 'new')");
        assert_eq!(c.request(&[b"EVAL", script.as_bytes(), b"0"]).await, NIL);
        if get(&mut c, &key).await != bulk("new") {
            stale += 1;
        }
    }
    assert_eq!(stale, 0, "stale GETs right after EVAL in 300 tries");
    proxy.stop().await;
}

/// The admission rule (reads estimate ≥ 2 × writes estimate) with 4-bit counters caps reads
/// at 15, while one write through corral counts 2 (invalidated before forwarding and on the
/// reply) plus 1 for Redis's invalidation push. So after 3 writes a key is never cached
/// again, however often it is read, until the write sketch halves (after 10 × its width of
/// write increments: 2.6 M with the default max_bytes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hot_key_written_now_and_then_stays_cached() {
    let redis = RedisServer::start();
    let proxy = TestProxy::start(&redis.url()).await;
    let mut c = connect(proxy.addr).await;
    for i in 0..5 {
        let v = format!("v{i}");
        assert_eq!(c.request(&[b"SET", b"k", v.as_bytes()]).await, OK);
        for _ in 0..200 {
            assert_eq!(get(&mut c, "k").await, bulk(&v));
        }
    }
    let before = Stats::of(&mut c).await.n("cache_hits");
    stays(&mut c, "k", &bulk("v4"), 100).await;
    let after = Stats::of(&mut c).await;
    assert!(
        after.n("cache_hits") > before,
        "read 1000 times, written 5 times, and not cached: {:?}",
        after.0
    );
    proxy.stop().await;
}

// ---- 4. memory bound ----

/// A 100 KB value that names its key, so a value served for the wrong key shows.
fn big_value(i: usize, len: usize) -> Vec<u8> {
    let mut v = format!("value-{i}-").into_bytes();
    v.resize(len, b'a' + (i % 26) as u8);
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cache_stays_within_max_bytes() {
    const MAX: u64 = 4 * 1024 * 1024;
    let redis = RedisServer::start();
    let proxy = TestProxy::start_with(&redis.url(), |cfg| {
        cfg.cache.max_bytes = MAX;
        cfg.cache.hot_threshold = 1;
    })
    .await;
    let mut direct = connect(redis.addr()).await;
    let mut c = connect(proxy.addr).await;
    let mut most = 0;
    for i in 0..200 {
        let key = format!("big:{i}");
        assert_eq!(
            direct
                .request(&[b"SET", key.as_bytes(), &big_value(i, 100_000)])
                .await,
            OK
        );
    }
    // Each key read a few times in a row (so it is cached and then hit), in two passes.
    for pass in 0..2 {
        for i in 0..200 {
            let key = format!("big:{i}");
            for _ in 0..3 {
                let got = get(&mut c, &key).await;
                assert!(
                    got == bulk(big_value(i, 100_000)),
                    "pass {pass} GET {key}: {}",
                    show(&got)
                );
            }
            if i % 10 == 0 {
                let s = Stats::of(&mut c).await;
                most = most.max(s.n("cache_bytes"));
                assert!(s.n("cache_bytes") <= MAX, "over budget: {:?}", s.0);
            }
        }
    }
    let s = Stats::of(&mut c).await;
    eprintln!(
        "memory bound: entries {} bytes {} (max seen {most}) evictions {} hits {}",
        s.n("cache_entries"),
        s.n("cache_bytes"),
        s.n("cache_evictions"),
        s.n("cache_hits")
    );
    assert!(s.n("cache_bytes") <= MAX);
    assert!(s.n("cache_entries") < 200, "{:?}", s.0);
    assert!(s.n("cache_entries") > 0, "nothing cached at all: {:?}", s.0);
    assert!(s.n("cache_hits") > 0, "{:?}", s.0);
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_over_max_value_bytes_are_never_cached() {
    let redis = RedisServer::start();
    let proxy = TestProxy::start_with(&redis.url(), |cfg| {
        cfg.cache.max_value_bytes = 64 * 1024;
    })
    .await;
    let mut direct = connect(redis.addr()).await;
    let mut c = connect(proxy.addr).await;
    let big = big_value(1, 64 * 1024 + 1);
    assert_eq!(direct.request(&[b"SET", b"huge", &big]).await, OK);
    // A value of exactly the limit is still cached.
    let fits = big_value(2, 64 * 1024);
    assert_eq!(direct.request(&[b"SET", b"fits", &fits]).await, OK);
    let before = Stats::of(&mut c).await;
    for _ in 0..50 {
        assert!(get(&mut c, "huge").await == bulk(&big), "GET huge");
    }
    let after = Stats::of(&mut c).await;
    assert_eq!(
        after.n("cache_hits"),
        before.n("cache_hits"),
        "an oversized value was served from the cache: {:?}",
        after.0
    );
    assert!(after.n("cache_oversized") > 0, "{:?}", after.0);
    make_cached(&mut c, "fits", &bulk(&fits)).await;
    proxy.stop().await;
}

// ---- 5. no-cache mode ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_cache_off_every_get_reaches_redis() {
    let redis = RedisServer::start();
    let proxy = TestProxy::start_with(&redis.url(), |cfg| cfg.cache.enabled = false).await;
    let mut direct = connect(redis.addr()).await;
    let mut c = connect(proxy.addr).await;
    let stats = c.cmd("CORRAL CACHE STATS").await;
    assert!(stats.starts_with(b"-ERR"), "{}", show(&stats));
    assert_eq!(direct.cmd("SET k v").await, OK);
    assert_eq!(direct.cmd("CONFIG RESETSTAT").await, OK);
    for _ in 0..50 {
        assert_eq!(get(&mut c, "k").await, bulk("v"));
    }
    // Concurrent GETs are not coalesced either.
    let mut tasks = JoinSet::new();
    for _ in 0..20 {
        let addr = proxy.addr;
        tasks.spawn(async move { get(&mut connect(addr).await, "k").await });
    }
    while let Some(r) = tasks.join_next().await {
        assert_eq!(r.expect("task"), bulk("v"));
    }
    assert_eq!(redis_get_calls(&mut direct).await, 70);
    let info = c.cmd("INFO").await;
    assert!(
        !common::contains(&info, b"# Cache"),
        "INFO has a # Cache section with the cache off"
    );
    proxy.stop().await;
}

// ---- 6. TTL-only fallback when Redis refuses CLIENT TRACKING ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tracking_entries_live_fallback_ttl_at_most() {
    let redis = RedisServer::start();
    let mut direct = connect(redis.addr()).await;
    // A user that may do everything except turn tracking on.
    let acl = direct
        .cmd("ACL SETUSER corral on >pw ~* &* +@all -client|tracking")
        .await;
    assert_eq!(acl, OK);
    let url = format!("redis://corral:pw@127.0.0.1:{}", redis.port);
    let proxy = TestProxy::start_with(&url, |cfg| cfg.cache.fallback_ttl_ms = 200).await;
    let mut c = connect(proxy.addr).await;
    Stats::wait(&mut c, "the fallback mode", |s| {
        s.text("cache_tracking") == "off (ttl-only fallback)"
    })
    .await;
    assert_eq!(direct.cmd("SET k old").await, OK);
    make_cached(&mut c, "k", &bulk("old")).await;
    assert_eq!(direct.cmd("SET k new").await, OK);
    let (took, stale) = get_until(
        &mut c,
        "k",
        &bulk("new"),
        &[&bulk("old")],
        false,
        Duration::from_secs(2),
    )
    .await;
    eprintln!(
        "fallback mode: direct write visible after {took:?} ({stale} stale GETs; fallback_ttl_ms = 200)"
    );
    stays(&mut c, "k", &bulk("new"), 100).await;
    // Writes through corral are still read back at once.
    make_cached(&mut c, "k", &bulk("new")).await;
    for i in 0..100 {
        let v = i.to_string();
        assert_eq!(c.request(&[b"SET", b"k", v.as_bytes()]).await, OK);
        assert_eq!(get(&mut c, "k").await, bulk(&v));
    }
    proxy.stop().await;
}

/// Hits are written as soon as nothing is pending before them: in a pipeline mixing hits,
/// forwarded requests and CLIENT REPLY OFF/SKIP, the replies are Redis's, in order.
#[tokio::test]
async fn hits_in_a_pipeline_keep_order_and_client_reply_modes() {
    let (_redis, proxy, mut direct, mut c) = start().await;
    assert_eq!(c.cmd("SET ord:hot v").await, OK);
    make_cached(&mut c, "ord:hot", b"$1\r\nv\r\n").await;
    let before = Stats::of(&mut c).await.n("cache_hits");
    let pipeline: &[u8] = b"GET ord:hot\r\nCLIENT REPLY SKIP\r\nGET ord:hot\r\nGET ord:cold\r\n\
        GET ord:hot\r\nCLIENT REPLY OFF\r\nGET ord:hot\r\nCLIENT REPLY ON\r\nGET ord:hot\r\n";
    // Replies: GET, (skipped), GET cold, GET, (off), +OK of ON, GET.
    let n = 5;
    c.send(pipeline).await;
    direct.send(pipeline).await;
    for _ in 0..n {
        assert_eq!(c.read_reply().await, direct.read_reply().await);
    }
    c.send(b"PING\r\n").await;
    assert_eq!(c.read_reply().await, b"+PONG\r\n");
    // Served locally (the GETs of ord:hot, not counting the skipped or silenced ones' replies).
    assert!(Stats::of(&mut c).await.n("cache_hits") >= before + 5);
    proxy.stop().await;
}

/// A cached nil behind another pending reply is answered in the protocol its GET was sent
/// in, though a HELLO later in the pipeline switches protocols before it is written.
#[tokio::test]
async fn a_queued_hit_keeps_the_protocol_of_its_request() {
    let (_redis, proxy, mut direct, mut c) = start().await;
    make_cached(&mut c, "proto:nil", NIL).await;
    for (pipeline, nil) in [
        (&b"INFO server\r\nGET proto:nil\r\nHELLO 3\r\n"[..], NIL),
        (b"INFO server\r\nGET proto:nil\r\nHELLO 2\r\n", NIL3),
    ] {
        let before = Stats::of(&mut c).await.n("cache_hits");
        c.send(pipeline).await;
        direct.send(pipeline).await;
        // INFO and HELLO differ between corral and Redis; the GET must not.
        direct.read_reply().await;
        let want = direct.read_reply().await;
        direct.read_reply().await;
        assert_eq!(show(&want), show(nil));
        c.read_reply().await;
        assert_eq!(show(&c.read_reply().await), show(&want));
        c.read_reply().await;
        assert_eq!(Stats::of(&mut c).await.n("cache_hits"), before + 1);
    }
    proxy.stop().await;
}

/// A write earlier in the same pipeline keeps later GETs of *its* keys away from the cache
/// (they must see it), but not GETs of other keys.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_keys_written_earlier_in_a_pipeline_bypass_the_cache() {
    let redis = RedisServer::start();
    let proxy = TestProxy::start(&redis.url()).await;
    let mut c = connect(proxy.addr).await;
    assert_eq!(c.cmd("SET pl:hot v").await, b"+OK\r\n");
    make_cached(&mut c, "pl:hot", b"$1\r\nv\r\n").await;
    let before = Stats::of(&mut c).await.n("cache_hits");
    c.send(b"SET pl:other x\r\nGET pl:hot\r\nSET pl:hot w\r\nGET pl:hot\r\n")
        .await;
    for want in [&b"+OK\r\n"[..], b"$1\r\nv\r\n", b"+OK\r\n", b"$1\r\nw\r\n"] {
        assert_eq!(c.read_reply().await, want);
    }
    // The first GET (another key was written) was a hit; the second (its own key was
    // written just before) was not.
    assert_eq!(Stats::of(&mut c).await.n("cache_hits"), before + 1);
    proxy.stop().await;
}

/// Hits between forwarded requests ride in their batch and are written between its replies:
/// in a pipeline alternating hits, misses, errors and writes, every reply is Redis's, in
/// order, in RESP2 and RESP3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_between_forwarded_requests_are_written_in_order() {
    let (_redis, proxy, mut direct, mut c) = start().await;
    assert_eq!(c.cmd("SET il:hot v").await, OK);
    assert_eq!(c.cmd(&format!("SET il:hot2 {}", "w".repeat(300))).await, OK);
    assert_eq!(c.cmd("RPUSH il:list a").await, b":1\r\n");
    make_cached(&mut c, "il:hot", b"$1\r\nv\r\n").await;
    make_cached(&mut c, "il:hot2", &bulk("w".repeat(300))).await;
    // Past what a batch copies of a hit: held until written instead.
    assert_eq!(c.cmd(&format!("SET il:big {}", "b".repeat(3000))).await, OK);
    make_cached(&mut c, "il:big", &bulk("b".repeat(3000))).await;
    for hello in ["HELLO 2\r\n", "HELLO 3\r\n"] {
        c.send(hello.as_bytes()).await;
        direct.send(hello.as_bytes()).await;
        c.read_reply().await;
        direct.read_reply().await;
        let before = Stats::of(&mut c).await.n("cache_hits");
        let pipeline: &[u8] = b"GET il:cold1\r\nGET il:hot\r\nGET il:list\r\nGET il:hot2\r\n\
            SET il:n 1\r\nGET il:hot\r\nGET il:hot\r\nSET il:cold2 x\r\nGET il:cold2\r\n\
            GET il:hot2\r\nGET il:missing\r\nGET il:hot\r\nGET il:big\r\nGET il:hot\r\n\
            PING\r\n";
        c.send(pipeline).await;
        direct.send(pipeline).await;
        for i in 0..15 {
            assert_eq!(
                show(&c.read_reply().await),
                show(&direct.read_reply().await),
                "reply {i} after {hello:?}"
            );
        }
        // The hot keys' GETs were hits, each after a forwarded request.
        assert!(Stats::of(&mut c).await.n("cache_hits") >= before + 8);
    }
    proxy.stop().await;
}
