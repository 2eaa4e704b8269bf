//! The local cache and GET coalescing against real Redis, trying hard to break coherence
//! (DESIGN.md R3/R4): stampedes, and read-your-writes under concurrent readers. Writes made
//! directly on Redis are in `cache_writes.rs`; bounds, modes and hits in pipelines in
//! `cache_bounds.rs`.
//!
//! Latencies are measured and printed (run with `--nocapture`), never asserted.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::*;
use tokio::task::JoinSet;

const OK: &[u8] = b"+OK\r\n";
const NIL: &[u8] = b"$-1\r\n";
const NIL3: &[u8] = b"_\r\n";

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
    // 8 MiB of cache sizes the sketch at 128k counters (the least is 64k), which the noise
    // below fills.
    let proxy = TestProxy::start_with(&redis.url(), |c| c.cache.max_bytes = 8 << 20).await;
    let mut direct = connect(redis.addr()).await;
    // Raise the sketch's noise floor: 120,000 GETs of distinct keys, from 24 connections
    // (a connection reading only cold keys soon has most of its GETs go uncounted).
    let (conns, n) = (24, 5_000);
    let mut c = connect(proxy.addr).await;
    for k in 0..conns {
        let mut reqs = Vec::new();
        for i in 0..n {
            reqs.extend(encode(&[b"GET", format!("noise:{k}:{i}").as_bytes()]));
        }
        let mut noise = connect(proxy.addr).await;
        let replies = noise.pipeline(&reqs, 64 * 1024, n).await;
        assert!(replies.iter().all(|r| r == NIL), "noise GETs answer nil");
    }
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

/// A GET that joins a read led from the middle of a pipeline of large values gets that read's
/// reply, taken from the part of the pipeline's replies that holds it as the parts arrive
/// (each 300 KiB reply is a part of its own), and the pipeline gets every reply in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_joined_inside_a_streamed_pipeline_gets_its_own_reply() {
    const PAUSE_MS: u64 = 1000;
    let (_redis, proxy, mut direct, mut admin) = start().await;
    let mut leader = connect(proxy.addr).await;
    let mut joiner = connect(proxy.addr).await;
    let lookups = |s: &Stats| s.n("cache_misses") + s.n("cache_skipped");
    for attempt in 0..3 {
        let keys: Vec<String> = (0..3).map(|i| format!("streamed:{attempt}:{i}")).collect();
        let values: Vec<Vec<u8>> = (0..3u8).map(|i| vec![b'a' + i; 300 * 1024]).collect();
        for (k, v) in keys.iter().zip(&values) {
            assert_eq!(direct.request(&[b"SET", k.as_bytes(), v]).await, OK);
        }
        // Read once before: read again soon after, the middle key leads a read others may
        // join (in the middle of the pipeline, which nothing else in it joins).
        let get = |i: usize| encode(&[b"GET", keys[i].as_bytes()]);
        leader.send(&get(1)).await;
        assert!(leader.read_reply().await == bulk(&values[1]));
        let before = Stats::of(&mut admin).await;
        assert_eq!(
            direct.cmd(&format!("CLIENT PAUSE {PAUSE_MS} ALL")).await,
            OK
        );
        let paused = Instant::now();
        leader.send(&[get(0), get(1), get(2)].concat()).await;
        let sent = Stats::wait(&mut admin, "the pipeline's GETs", |s| {
            lookups(s) >= lookups(&before) + 3
        })
        .await;
        joiner.send(&get(1)).await;
        Stats::wait(&mut admin, "the joining GET", |s| {
            lookups(s) >= lookups(&before) + 4
        })
        .await;
        let in_time = paused.elapsed() < Duration::from_millis(PAUSE_MS * 8 / 10);
        let replies = leader.read_replies(3).await;
        for (i, (got, v)) in replies.iter().zip(&values).enumerate() {
            assert!(
                *got == bulk(v),
                "pipeline reply {i}: {}",
                show(&got[..got.len().min(40)])
            );
        }
        let got = joiner.read_reply().await;
        assert!(
            got == bulk(&values[1]),
            "joined GET: {}",
            show(&got[..got.len().min(40)])
        );
        if !in_time {
            eprintln!("{}: GETs not all sent within the pause, retrying", keys[0]);
            continue;
        }
        // Read once every reply is in: a join is counted a moment after its lookup.
        let after = Stats::of(&mut admin).await;
        let coalesced = after.n("cache_coalesced") - sent.n("cache_coalesced");
        assert_eq!(
            coalesced, 1,
            "the second client's GET joined the pipeline's read"
        );
        return;
    }
    panic!("could not send the GETs within {PAUSE_MS} ms in 3 tries");
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
/// times. In the second one key takes all 500 writes, racing reads that hit it or join its
/// tracked fills once it is admitted; while it is not, they are forwarded (a key written
/// lately is not coalesced).
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

// ---- one client's reads of a key never go back ----

/// One client INCRs four keys through corral (one INCR in four inside MULTI/EXEC) while
/// three read them, one GET at a time and in pipelines of 32: a reader never sees a key's value go back, as Redis, which runs a
/// client's requests in order, never shows one.
/// - Within a round: a GET forwarded in a round runs at Redis after the round, and a read a
///   GET led or joined whenever its batch or the lane sends it: a later GET of the key in
///   the round is given that read, or is forwarded behind it, never a hit or another read,
///   whose values can be older (`noted.rs`). Without that rule, 1,186-2,009 reads went back
///   per reader; with only forwarded GETs noted, a few in some thousands with the machine
///   busy.
/// - Across rounds: a read registered after an INCR's first invalidation may run before it;
///   until the INCR's acknowledgement has been applied, such a read neither fills the cache
///   nor is joined (`unacked.rs`). Without that, reads went back across rounds in 4 of 24
///   runs of this test with `MONO_INCRS=20000` and four runs at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clients_reads_of_a_key_never_go_back() {
    reads_never_go_back().await;
}

/// [`a_clients_reads_of_a_key_never_go_back`] with corral on one thread, as it runs with
/// `threads = 1` (the default): the writes' holds then change by plain loads and stores.
#[tokio::test(flavor = "current_thread")]
async fn a_clients_reads_of_a_key_never_go_back_on_one_thread() {
    reads_never_go_back().await;
}

async fn reads_never_go_back() {
    const KEYS: usize = 4;
    // More makes the test longer and likelier to catch a read going back.
    let incrs: usize = std::env::var("MONO_INCRS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let (_redis, proxy, _direct, mut w) = start().await;
    let stop = Arc::new(AtomicBool::new(false));
    let mut readers = JoinSet::new();
    for depth in [1usize, 32, 32] {
        let (addr, stop) = (proxy.addr, stop.clone());
        readers.spawn(async move {
            let mut c = connect(addr).await;
            let mut seen = [0i64; KEYS];
            let mut back = Vec::new();
            let mut round = 0usize;
            while !stop.load(Ordering::Relaxed) {
                let keys: Vec<usize> = (0..depth).map(|i| (round * 7 + i * 3) % KEYS).collect();
                let bytes: Vec<u8> = keys
                    .iter()
                    .flat_map(|k| encode(&[b"GET", format!("mono:{k}").as_bytes()]))
                    .collect();
                let replies = c.pipeline(&bytes, bytes.len(), depth).await;
                let mut in_round = [(0i64, 0usize); KEYS];
                for (pos, (&k, r)) in keys.iter().zip(&replies).enumerate() {
                    let v = counter(r);
                    if v < in_round[k].0 {
                        let (was, at) = in_round[k];
                        back.push(format!(
                            "round {round}: mono:{k} read {was} by GET {at}, then {v} by GET {pos}"
                        ));
                    } else if v < seen[k] {
                        back.push(format!(
                            "round {round}: mono:{k} read {v} by GET {pos}, {} in an earlier round",
                            seen[k]
                        ));
                    }
                    if v > in_round[k].0 {
                        in_round[k] = (v, pos);
                    }
                    seen[k] = seen[k].max(v);
                }
                round += 1;
            }
            (depth, round, back)
        });
    }
    for i in 0..incrs {
        let incr = format!("INCR mono:{}", i % KEYS);
        // One in four in a transaction: its key is held from EXEC (`Writes::exec`).
        if i % 4 == 3 {
            assert_eq!(w.cmd("MULTI").await, OK);
            assert_eq!(w.cmd(&incr).await, b"+QUEUED\r\n");
            let r = w.cmd("EXEC").await;
            assert!(r.starts_with(b"*1\r\n:"), "EXEC: {}", show(&r));
        } else {
            let r = w.cmd(&incr).await;
            assert!(r.starts_with(b":"), "INCR: {}", show(&r));
        }
    }
    stop.store(true, Ordering::Relaxed);
    let failures = common::reads_gone_back(&mut readers).await;
    assert!(failures.is_empty(), "reads went back: {failures:#?}");
    let hits = Stats::of(&mut w).await.n("cache_hits");
    assert!(
        hits > 0,
        "the cache served nothing: the test proved nothing"
    );
    proxy.stop().await;
}

// ---- a write after a GET in the same pipelined write ----

/// Keys read ten times (one pipelined write) just after Redis got them, then a GET of one
/// and `write` of it (`$key` stands for the key) in one write: Redis answers the GET first,
/// so it reads `old`, and the write replies `reply`. The GET waits on a read corral sends
/// apart from the client's batch (a tracked fill of a key turned hot): the write must not
/// overtake it.
async fn get_then_write(write: &[&[u8]], reply: &[u8]) {
    let (_redis, proxy, mut direct, mut c) = start().await;
    let before = Stats::of(&mut c).await.n("cache_fills");
    for i in 0..20 {
        let key = format!("gw:{i}");
        assert_eq!(direct.cmd(&format!("SET {key} old")).await, OK);
        let warm: Vec<u8> = (0..10)
            .flat_map(|_| encode(&[b"GET", key.as_bytes()]))
            .collect();
        c.pipeline(&warm, warm.len(), 10).await;
        let write: Vec<&[u8]> = write
            .iter()
            .map(|a| if *a == b"$key" { key.as_bytes() } else { a })
            .collect();
        let mut req = encode(&[b"GET", key.as_bytes()]);
        req.extend(encode(&write));
        let got = c.pipeline(&req, req.len(), 2).await;
        assert_eq!(
            show(&got[0]),
            show(&bulk("old")),
            "{key}: the GET read its own later write"
        );
        assert_eq!(show(&got[1]), show(reply), "{key}");
    }
    // The keys were filled: the GETs did wait on reads of their own.
    assert!(Stats::of(&mut c).await.n("cache_fills") > before, "no fill");
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_is_not_overtaken_by_a_set_after_it() {
    get_then_write(&[b"SET", b"$key", b"new"], OK).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_is_not_overtaken_by_a_del_or_an_append_after_it() {
    get_then_write(&[b"DEL", b"$key"], &int(1)).await;
    get_then_write(&[b"APPEND", b"$key", b"x"], &int(4)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_get_is_not_overtaken_by_a_script_writing_its_key_after_it() {
    let script: &[u8] = b"return redis.call('set', KEYS[1], 'new')";
    get_then_write(&[b"EVAL", script, b"1", b"$key"], OK).await;
}

// ---- a transaction's writes ----

/// A blocking command queued in a MULTI does not block: EXEC runs it at once, and BLMOVE
/// writes its destination then. Its keys are invalidated when EXEC is sent, as a queued
/// write's are: a GET pipelined behind EXEC reads what it made, not the cached nil.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_write_in_a_transaction_is_invalidated_at_exec() {
    let (_redis, proxy, mut direct, mut c) = start().await;
    let mut tx = connect(proxy.addr).await;
    make_cached(&mut c, "bt:dst", NIL).await;
    assert_eq!(direct.cmd("RPUSH bt:src x").await, b":1\r\n");
    let local = stat_n(&mut c, "cache_local_invalidations").await;
    assert_eq!(tx.cmd("MULTI").await, OK);
    assert_eq!(
        tx.cmd("BLMOVE bt:src bt:dst LEFT LEFT 0").await,
        b"+QUEUED\r\n"
    );
    let sent: Vec<u8> = ["EXEC", "GET bt:dst"]
        .iter()
        .flat_map(|l| encode_line(l))
        .collect();
    let got = tx.pipeline(&sent, sent.len(), 2).await;
    assert_eq!(show(&got[0]), show(b"*1\r\n$1\r\nx\r\n"));
    assert!(show(&got[1]).contains("WRONGTYPE"), "{}", show(&got[1]));
    assert!(stat_n(&mut c, "cache_local_invalidations").await > local);
    proxy.stop().await;
}

/// A write queued in a MULTI runs at EXEC, and its key is held from then until EXEC is
/// answered, not from when it was queued: while a client idles inside MULTI, the key is
/// still cached for others. Once EXEC is answered, every client reads the transaction's
/// value, pipelined right behind EXEC or not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_write_holds_its_key_from_exec_only() {
    let (_redis, proxy, mut direct, mut c) = start().await;
    assert_eq!(direct.cmd("SET k v1").await, OK);
    let mut tx = connect(proxy.addr).await;
    assert_eq!(tx.cmd("MULTI").await, OK);
    assert_eq!(tx.cmd("SET k v2").await, b"+QUEUED\r\n");
    make_cached(&mut c, "k", &bulk("v1")).await;
    stays(&mut c, "k", &bulk("v1"), 3).await;
    let sent: Vec<u8> = ["EXEC", "GET k"]
        .iter()
        .flat_map(|l| encode_line(l))
        .collect();
    let got = tx.pipeline(&sent, sent.len(), 2).await;
    assert_eq!(show(&got[0]), show(b"*1\r\n+OK\r\n"));
    assert_eq!(show(&got[1]), show(&bulk("v2")));
    assert_eq!(show(&get(&mut c, "k").await), show(&bulk("v2")));
    // The hold ended with EXEC's reply: the new value is cached in turn.
    make_cached(&mut c, "k", &bulk("v2")).await;
    proxy.stop().await;
}

/// FLUSHALL through corral holds every key while it is out: read right behind it, on the
/// client's connection or another, every key reads what Redis holds after it; once it is
/// answered, keys are cached again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_through_corral_holds_every_key_until_answered() {
    let (_redis, proxy, mut direct, mut c) = start().await;
    let mut other = connect(proxy.addr).await;
    // A key each: a key whose entries writes end young stops being cached (`churn.rs`).
    for (flush, k) in [("FLUSHALL", "f:1"), ("FLUSHDB ASYNC", "f:2")] {
        assert_eq!(direct.cmd(&format!("SET {k} v1")).await, OK);
        make_cached(&mut other, k, &bulk("v1")).await;
        let sent: Vec<u8> = [flush, &format!("GET {k}")]
            .iter()
            .flat_map(|l| encode_line(l))
            .collect();
        let got = c.pipeline(&sent, sent.len(), 2).await;
        assert_eq!([show(&got[0]), show(&got[1])], [show(OK), show(NIL)]);
        stays(&mut other, k, NIL, 3).await;
        // Through corral: a direct write's invalidation may come after its `+OK`.
        assert_eq!(c.cmd(&format!("SET {k} v2")).await, OK);
        make_cached(&mut other, k, &bulk("v2")).await;
    }
    proxy.stop().await;
}

/// While a CLIENT PAUSE sent through corral lasts, each request goes alone on a connection
/// of its own. A FLUSHALL among them empties the cache when it is sent and holds every key
/// until it is answered, as one sent in a batch does: it need not wait for the tracking
/// connection's flush message, which may come after the FLUSHALL's own reply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flush_sent_during_a_pause_empties_the_cache_when_sent() {
    let (_redis, proxy, mut direct, mut c) = start().await;
    let mut writer = connect(proxy.addr).await;
    assert_eq!(direct.cmd("SET p:1 v1").await, OK);
    make_cached(&mut c, "p:1", &bulk("v1")).await;
    assert_eq!(Stats::of(&mut c).await.n("cache_entries"), 1);
    assert_eq!(c.cmd("CLIENT PAUSE 20000 WRITE").await, OK);
    writer.send(&encode(&[b"FLUSHALL"])).await;
    let deadline = Deadline::new(Duration::from_secs(10), "FLUSHALL to be paused on Redis");
    while !show(&direct.cmd("INFO clients").await).contains("blocked_clients:1") {
        deadline.pause().await;
    }
    // Redis has not run it: only corral's flush can have emptied the cache.
    assert_eq!(direct.cmd("DBSIZE").await, b":1\r\n");
    assert_eq!(Stats::of(&mut c).await.n("cache_entries"), 0);
    assert_eq!(c.cmd("CLIENT UNPAUSE").await, OK);
    assert_eq!(writer.read_reply().await, OK);
    stays(&mut c, "p:1", NIL, 3).await;
    // The holds were released: the key is cached again once written (through corral: a
    // direct write's invalidation may come after its `+OK`).
    assert_eq!(c.cmd("SET p:1 v2").await, OK);
    make_cached(&mut c, "p:1", &bulk("v2")).await;
    proxy.stop().await;
}
