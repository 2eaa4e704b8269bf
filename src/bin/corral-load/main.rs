//! `corral-load`: a closed-loop load generator for Redis and corral.
//!
//! Each of N connections keeps a batch of P pipelined requests in flight: it writes the batch,
//! reads until all P replies have arrived, then sends the next one. Keys follow a uniform or
//! Zipf distribution over K keys (hot keys matter for a caching proxy, which redis-benchmark's
//! uniform `-r` keys cannot show). Requests are raw RESP over a `TcpStream`; replies are only
//! delimited (with corral's own `ReplyScanner`), not decoded, so the generator itself costs
//! little CPU on a machine it shares with the server under test.
#![forbid(unsafe_code)]

mod histogram;

use std::process::ExitCode;
use std::time::{Duration, Instant};

use bytes::{Buf, BytesMut};
use clap::{Parser, ValueEnum};
use corral::resp::ReplyScanner;
use corral::resp::encode::encode_request;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use histogram::Histogram;

/// Load generator speaking raw RESP to Redis or corral.
#[derive(Debug, Clone, Parser)]
#[command(version)]
struct Args {
    /// Server address, HOST:PORT.
    #[arg(long, default_value = "127.0.0.1:6379")]
    addr: String,
    /// Concurrent connections.
    #[arg(short = 'c', long, default_value_t = 50)]
    connections: usize,
    /// Requests pipelined per connection (batch size kept in flight).
    #[arg(short = 'P', long, default_value_t = 16)]
    pipeline: usize,
    /// Number of distinct keys.
    #[arg(short = 'k', long, default_value_t = 1_000_000)]
    keys: u64,
    /// Key distribution.
    #[arg(long, value_enum, default_value_t = Dist::Zipf)]
    dist: Dist,
    /// Zipf exponent s (with --dist zipf): key of rank r is drawn with weight 1/r^s.
    #[arg(long, default_value_t = 0.99)]
    zipf_s: f64,
    /// Fraction of requests that are GETs; the rest are SETs.
    #[arg(long, default_value_t = 0.9)]
    get_ratio: f64,
    /// Value size in bytes for SETs (and --fill).
    #[arg(short = 'd', long, default_value_t = 64)]
    value_size: usize,
    /// Test duration in seconds.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Key name prefix; keys are the prefix plus a zero-padded key number.
    #[arg(long, default_value = "key:")]
    key_prefix: String,
    /// Instead of the test, SET every key once (pipelined) and exit.
    #[arg(long)]
    fill: bool,
    /// Runtime worker threads; 1 keeps the generator's own CPU use low.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Random seed, for repeatable key sequences.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Print one CSV header and result line instead of the human summary.
    #[arg(long)]
    csv: bool,
}

/// How keys are drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Dist {
    /// Every key equally likely.
    Uniform,
    /// Zipf(s): a few keys take most requests.
    Zipf,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Err(e) = check(&args) {
        eprintln!("corral-load: {e}");
        return ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.threads.max(1))
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("corral-load: cannot start runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = if args.fill {
        runtime.block_on(fill(&args))
    } else {
        runtime.block_on(run(&args))
    };
    match result {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("corral-load: {e}");
            ExitCode::FAILURE
        }
    }
}

fn check(a: &Args) -> Result<(), String> {
    if a.connections == 0 || a.pipeline == 0 || a.keys == 0 {
        return Err("--connections, --pipeline and --keys must be positive".into());
    }
    if !(0.0..=1.0).contains(&a.get_ratio) {
        return Err("--get-ratio must be between 0 and 1".into());
    }
    if !(a.duration > 0.0 && a.duration.is_finite()) {
        return Err("--duration must be positive".into());
    }
    if a.dist == Dist::Zipf && !(a.zipf_s >= 0.0 && a.zipf_s.is_finite()) {
        return Err("--zipf-s must be a non-negative number".into());
    }
    Ok(())
}

/// Builds key names: fixed width, so every key has the same length whatever its number.
#[derive(Debug, Clone)]
struct Keys {
    prefix: Vec<u8>,
    width: usize,
}

impl Keys {
    fn new(args: &Args) -> Self {
        Keys {
            prefix: args.key_prefix.as_bytes().to_vec(),
            width: (args.keys - 1).max(1).ilog10() as usize + 1,
        }
    }

    fn write(&self, n: u64, out: &mut Vec<u8>) {
        out.clear();
        out.extend_from_slice(&self.prefix);
        let mut num = itoa::Buffer::new();
        let digits = num.format(n).as_bytes();
        out.resize(out.len() + self.width.saturating_sub(digits.len()), b'0');
        out.extend_from_slice(digits);
    }
}

/// Key number sampler.
enum KeyDist {
    Uniform(u64),
    Zipf(Zipf<f64>),
}

impl KeyDist {
    fn new(args: &Args) -> Result<Self, String> {
        Ok(match args.dist {
            Dist::Uniform => KeyDist::Uniform(args.keys),
            Dist::Zipf => KeyDist::Zipf(
                Zipf::new(args.keys as f64, args.zipf_s).map_err(|e| format!("zipf: {e}"))?,
            ),
        })
    }

    /// A key number in `0..keys`; with Zipf, 0 is the hottest.
    fn sample(&self, rng: &mut SmallRng) -> u64 {
        match self {
            KeyDist::Uniform(n) => rng.random_range(0..*n),
            // Zipf yields ranks 1..=n as floats.
            KeyDist::Zipf(z) => (z.sample(rng) as u64).saturating_sub(1),
        }
    }
}

/// What one connection saw.
struct Stats {
    hist: Histogram,
    gets: u64,
    sets: u64,
    /// GETs answered with a nil.
    misses: u64,
    /// Error replies (`-...`).
    errors: u64,
    /// Connections lost or never made.
    conn_errors: u64,
}

impl Stats {
    fn new() -> Self {
        Stats {
            hist: Histogram::new(),
            gets: 0,
            sets: 0,
            misses: 0,
            errors: 0,
            conn_errors: 0,
        }
    }

    fn merge(&mut self, o: &Stats) {
        self.hist.merge(&o.hist);
        self.gets += o.gets;
        self.sets += o.sets;
        self.misses += o.misses;
        self.errors += o.errors;
        self.conn_errors += o.conn_errors;
    }
}

/// The command of each request in a batch, so replies (which come back in order) can be
/// attributed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Get,
    Set,
}

async fn run(args: &Args) -> Result<bool, String> {
    let dist = std::sync::Arc::new(KeyDist::new(args)?);
    let keys = Keys::new(args);
    let value = vec![b'x'; args.value_size];
    let duration = Duration::from_secs_f64(args.duration);
    let start = Instant::now();
    let deadline = start + duration;
    let mut tasks = Vec::with_capacity(args.connections);
    for i in 0..args.connections {
        let (args, dist, keys, value) = (args.clone(), dist.clone(), keys.clone(), value.clone());
        tasks.push(tokio::spawn(async move {
            let mut stats = Stats::new();
            let mut rng = SmallRng::seed_from_u64(args.seed.wrapping_mul(1_000_003) + i as u64);
            if let Err(e) =
                connection(&args, &dist, &keys, &value, &mut rng, deadline, &mut stats).await
            {
                eprintln!("corral-load: connection {i}: {e}");
                stats.conn_errors += 1;
            }
            stats
        }));
    }
    let mut total = Stats::new();
    for t in tasks {
        let s = t.await.map_err(|e| format!("worker failed: {e}"))?;
        total.merge(&s);
    }
    let secs = start.elapsed().as_secs_f64();
    report(args, &total, secs);
    Ok(total.conn_errors == 0 && total.errors == 0)
}

#[allow(clippy::too_many_arguments)]
async fn connection(
    args: &Args,
    dist: &KeyDist,
    keys: &Keys,
    value: &[u8],
    rng: &mut SmallRng,
    deadline: Instant,
    stats: &mut Stats,
) -> Result<(), String> {
    let mut stream = TcpStream::connect(&args.addr)
        .await
        .map_err(|e| format!("connect {}: {e}", args.addr))?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let p = args.pipeline;
    let mut out = BytesMut::with_capacity(p * (args.value_size + 64));
    let mut inbuf = BytesMut::with_capacity(64 * 1024);
    let mut scanner = ReplyScanner::new();
    let mut ops = Vec::with_capacity(p);
    let mut key = Vec::new();
    while Instant::now() < deadline {
        out.clear();
        ops.clear();
        for _ in 0..p {
            keys.write(dist.sample(rng), &mut key);
            if rng.random_bool(args.get_ratio) {
                encode_request(&[b"GET", &key], &mut out);
                ops.push(Op::Get);
            } else {
                encode_request(&[b"SET", &key, value], &mut out);
                ops.push(Op::Set);
            }
        }
        let sent = Instant::now();
        stream.write_all(&out).await.map_err(|e| e.to_string())?;
        let mut done = 0;
        // Frames in `inbuf` start at `frame_start`; the buffer is trimmed once per batch.
        let mut frame_start = 0;
        while done < p {
            read_more(&mut stream, &mut inbuf).await?;
            // One clock read per read() call: replies that arrived together share it.
            let lat = sent.elapsed().as_nanos() as u64;
            while done < p {
                let Some(f) = scanner.next_frame(&inbuf).map_err(|e| e.to_string())? else {
                    break;
                };
                let first = inbuf[frame_start];
                if first == b'-' {
                    stats.errors += 1;
                } else if ops[done] == Op::Get
                    && (first == b'_' || inbuf.get(frame_start + 1) == Some(&b'-'))
                {
                    // `$-1` (RESP2) or `_` (RESP3): the key does not exist.
                    stats.misses += 1;
                }
                match ops[done] {
                    Op::Get => stats.gets += 1,
                    Op::Set => stats.sets += 1,
                }
                stats.hist.record(lat, 1);
                frame_start = f.end;
                done += 1;
            }
        }
        inbuf.advance(frame_start);
        scanner.consumed(frame_start);
    }
    Ok(())
}

fn report(args: &Args, s: &Stats, secs: f64) {
    let ops = s.gets + s.sets;
    let rps = ops as f64 / secs;
    let ms = |ns: u64| ns as f64 / 1e6;
    let (p50, p99, p999) = (
        ms(s.hist.percentile(50.0)),
        ms(s.hist.percentile(99.0)),
        ms(s.hist.percentile(99.9)),
    );
    let max = ms(s.hist.max());
    let errors = s.errors + s.conn_errors;
    if args.csv {
        println!("ops,secs,rps,p50_ms,p99_ms,p999_ms,max_ms,gets,sets,misses,errors");
        println!(
            "{ops},{secs:.3},{rps:.0},{p50:.3},{p99:.3},{p999:.3},{max:.3},{},{},{},{errors}",
            s.gets, s.sets, s.misses
        );
        return;
    }
    let dist = match args.dist {
        Dist::Uniform => "uniform".to_string(),
        Dist::Zipf => format!("zipf({})", args.zipf_s),
    };
    println!(
        "{} conns x pipeline {}, {} over {} keys, {:.0}% GET, {} B values, {secs:.2} s",
        args.connections,
        args.pipeline,
        dist,
        args.keys,
        args.get_ratio * 100.0,
        args.value_size
    );
    println!("throughput: {rps:.0} req/s ({ops} requests)");
    println!("latency ms: p50 {p50:.3}  p99 {p99:.3}  p99.9 {p999:.3}  max {max:.3}");
    println!(
        "GET {} (nil {}), SET {}, error replies {}, connection errors {}",
        s.gets, s.misses, s.sets, s.errors, s.conn_errors
    );
}

/// SETs every key once, spread over the connections, each pipelining a deep batch.
/// Reads what the server sent next into `inbuf`; an error once it closed the connection.
async fn read_more(stream: &mut TcpStream, inbuf: &mut BytesMut) -> Result<(), String> {
    match stream.read_buf(inbuf).await {
        Ok(0) => Err("server closed the connection".into()),
        Ok(_) => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

async fn fill(args: &Args) -> Result<bool, String> {
    let keys = Keys::new(args);
    let value = vec![b'x'; args.value_size];
    let conns = args.connections as u64;
    let start = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..conns {
        let (addr, keys, value, total) =
            (args.addr.clone(), keys.clone(), value.clone(), args.keys);
        // Deep batches: the fill's latency does not matter, only getting it over with.
        let batch = args.pipeline.max(256);
        tasks.push(tokio::spawn(async move {
            let mut stream = TcpStream::connect(&addr)
                .await
                .map_err(|e| format!("connect {addr}: {e}"))?;
            let mut out = BytesMut::new();
            let mut inbuf = BytesMut::with_capacity(64 * 1024);
            let mut scanner = ReplyScanner::new();
            let mut key = Vec::new();
            let mut errors = 0u64;
            let mut n = i;
            while n < total {
                out.clear();
                let mut sent = 0;
                while sent < batch && n < total {
                    keys.write(n, &mut key);
                    encode_request(&[b"SET", &key, &value], &mut out);
                    sent += 1;
                    n += conns;
                }
                stream.write_all(&out).await.map_err(|e| e.to_string())?;
                let (mut done, mut frame_start) = (0, 0);
                while done < sent {
                    match scanner.next_frame(&inbuf).map_err(|e| e.to_string())? {
                        Some(f) => {
                            errors += u64::from(inbuf[frame_start] == b'-');
                            frame_start = f.end;
                            done += 1;
                        }
                        None => read_more(&mut stream, &mut inbuf).await?,
                    }
                }
                inbuf.advance(frame_start);
                scanner.consumed(frame_start);
            }
            Ok::<u64, String>(errors)
        }));
    }
    let mut errors = 0;
    for t in tasks {
        errors += t.await.map_err(|e| format!("worker failed: {e}"))??;
    }
    eprintln!(
        "corral-load: filled {} keys in {:.2} s ({errors} error replies)",
        args.keys,
        start.elapsed().as_secs_f64()
    );
    Ok(errors == 0)
}
