//! Codec benchmarks: corral's request parser and reply scanner against `redis-protocol` 6.
//!
//! corral replaced `redis-protocol` on the hot path with its own offset-based parser and
//! scanner; these benchmarks check that the switch pays. To keep the comparison fair both
//! sides get the same bytes and do the work a proxy needs: find each frame's end and (for
//! requests) where its arguments are. `redis-protocol` is measured twice: `decode`, which
//! builds owned frames (what a straightforward user calls), and `decode_range`, its cheapest
//! entry point, which like corral returns offsets only (but still allocates a `Vec` per
//! array). Inputs arriving "in 4 KiB pieces" model a socket read loop: the buffer grows by
//! 4 KiB per read and the decoder is called after each read until the frame is complete;
//! `redis-protocol` has no resumable state, so it starts over on every call.
//!
//! Run with `cargo bench --bench codec`; add a filter (e.g. `-- reply`) to run a subset.

use std::hint::black_box;
use std::time::Duration;

use corral::resp::encode::encode_request;
use corral::resp::{Limits, Parsed, ReplyScanner, RequestParser};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use redis_protocol::resp2::decode::{decode, decode_range};
use redis_protocol::resp2::types::{RangeFrame, Resp2Frame};

/// Read size for the "in pieces" cases.
const PIECE: usize = 4096;

fn encode(args: &[&[u8]]) -> Vec<u8> {
    let mut out = bytes::BytesMut::new();
    encode_request(args, &mut out);
    out.to_vec()
}

/// `n` pipelined `GET key:NNNNNN` requests.
fn pipelined_gets(n: usize) -> Vec<u8> {
    (0..n)
        .flat_map(|i| encode(&[b"GET", format!("key:{i:06}").as_bytes()]))
        .collect()
}

/// Ends of the successive reads that deliver `len` bytes in `PIECE`-sized pieces.
fn read_ends(len: usize) -> impl Iterator<Item = usize> {
    (1..=len.div_ceil(PIECE)).map(move |i| (i * PIECE).min(len))
}

/// Parses every request in `buf` with corral's parser; returns the argument count seen, so
/// the work cannot be optimised away.
fn corral_parse_all(p: &mut RequestParser, buf: &[u8]) -> usize {
    let (mut off, mut args) = (0, 0);
    while let Some(parsed) = p.parse(&buf[off..], true).expect("valid input") {
        let len = match parsed {
            Parsed::Multibulk { len } | Parsed::Inline { len } => {
                let a = p.args(&buf[off..]);
                args += a.len() + black_box(a.get(1)).map_or(0, <[u8]>::len);
                len
            }
            Parsed::Empty { len } => len,
        };
        off += len;
    }
    args
}

/// The number of elements in a decoded array frame (0 for anything else).
fn range_len(f: &RangeFrame) -> usize {
    match f {
        RangeFrame::Array(v) => v.len(),
        _ => 0,
    }
}

fn rp_decode_all(buf: &[u8]) -> usize {
    let (mut off, mut n) = (0, 0);
    while let Some((frame, len)) = decode(&buf[off..]).expect("valid input") {
        black_box(&frame);
        n += 1;
        off += len;
    }
    n
}

fn rp_decode_range_all(buf: &[u8]) -> usize {
    let (mut off, mut n) = (0, 0);
    while let Some((frame, len)) = decode_range(&buf[off..]).expect("valid input") {
        n += range_len(black_box(&frame));
        off += len;
    }
    n
}

fn request_pipelined(c: &mut Criterion) {
    let mut g = c.benchmark_group("request/pipelined_get");
    for n in [1usize, 16, 128] {
        let buf = pipelined_gets(n);
        g.throughput(Throughput::Elements(n as u64));
        // One parser per connection in the proxy, reused across reads: reuse it here too.
        let mut p = RequestParser::new(Limits::default());
        g.bench_with_input(BenchmarkId::new("corral", n), &buf, |b, buf| {
            b.iter(|| corral_parse_all(&mut p, black_box(buf)))
        });
        g.bench_with_input(BenchmarkId::new("rp_decode", n), &buf, |b, buf| {
            b.iter(|| rp_decode_all(black_box(buf)))
        });
        g.bench_with_input(BenchmarkId::new("rp_decode_range", n), &buf, |b, buf| {
            b.iter(|| rp_decode_range_all(black_box(buf)))
        });
    }
    g.finish();
}

/// Feeds `buf` to corral's parser read by read; returns the argument count.
fn corral_pieces(buf: &[u8]) -> usize {
    let mut p = RequestParser::new(Limits::default());
    for end in read_ends(buf.len()) {
        if let Some(Parsed::Multibulk { .. }) = p.parse(&buf[..end], true).expect("valid") {
            return p.args(buf).len();
        }
    }
    unreachable!("request never completed")
}

fn rp_decode_pieces(buf: &[u8]) -> usize {
    for end in read_ends(buf.len()) {
        if let Some((frame, _)) = decode(&buf[..end]).expect("valid") {
            return usize::from(black_box(&frame).kind().is_error());
        }
    }
    unreachable!("request never completed")
}

fn rp_decode_range_pieces(buf: &[u8]) -> usize {
    for end in read_ends(buf.len()) {
        if let Some((frame, _)) = decode_range(&buf[..end]).expect("valid") {
            return range_len(&frame);
        }
    }
    unreachable!("request never completed")
}

fn request_large(c: &mut Criterion) {
    let value = vec![b'v'; 1 << 20];
    let set = encode(&[b"SET", b"big", &value]);
    // Many small arguments is where restarting from the frame start costs most.
    let mset_args: Vec<Vec<u8>> = std::iter::once(b"MSET".to_vec())
        .chain((0..5000).flat_map(|i| {
            [
                format!("key:{i:06}").into_bytes(),
                format!("value-{i:026}").into_bytes(),
            ]
        }))
        .collect();
    let mset = encode(&mset_args.iter().map(Vec::as_slice).collect::<Vec<_>>());

    let mut g = c.benchmark_group("request/large");
    g.throughput(Throughput::Bytes(set.len() as u64));
    let mut p = RequestParser::new(Limits::default());
    g.bench_function("set_1mb_whole/corral", |b| {
        b.iter(|| corral_parse_all(&mut p, black_box(&set)))
    });
    g.bench_function("set_1mb_whole/rp_decode", |b| {
        b.iter(|| rp_decode_all(black_box(&set)))
    });
    g.bench_function("set_1mb_whole/rp_decode_range", |b| {
        b.iter(|| rp_decode_range_all(black_box(&set)))
    });
    g.bench_function("set_1mb_4k_pieces/corral", |b| {
        b.iter(|| corral_pieces(black_box(&set)))
    });
    g.bench_function("set_1mb_4k_pieces/rp_decode", |b| {
        b.iter(|| rp_decode_pieces(black_box(&set)))
    });
    g.bench_function("set_1mb_4k_pieces/rp_decode_range", |b| {
        b.iter(|| rp_decode_range_pieces(black_box(&set)))
    });
    g.throughput(Throughput::Bytes(mset.len() as u64));
    // redis-protocol takes milliseconds per iteration here; criterion's minimum sample count
    // keeps the run short.
    g.sample_size(10);
    g.bench_function("mset_5000_4k_pieces/corral", |b| {
        b.iter(|| corral_pieces(black_box(&mset)))
    });
    g.bench_function("mset_5000_4k_pieces/rp_decode", |b| {
        b.iter(|| rp_decode_pieces(black_box(&mset)))
    });
    g.bench_function("mset_5000_4k_pieces/rp_decode_range", |b| {
        b.iter(|| rp_decode_range_pieces(black_box(&mset)))
    });
    g.finish();
}

/// Counts the top-level frames in `buf` with corral's scanner.
fn scan_all(buf: &[u8]) -> usize {
    let mut s = ReplyScanner::new();
    let mut n = 0;
    while let Some(f) = s.next_frame(buf).expect("valid") {
        black_box(f);
        n += 1;
    }
    n
}

fn scan_pieces(buf: &[u8]) -> usize {
    let mut s = ReplyScanner::new();
    for end in read_ends(buf.len()) {
        if let Some(f) = s.next_frame(&buf[..end]).expect("valid") {
            return f.end;
        }
    }
    unreachable!("reply never completed")
}

fn bulk(v: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(format!("${}\r\n", v.len()).as_bytes());
    out.extend_from_slice(v);
    out.extend_from_slice(b"\r\n");
}

fn reply_scan(c: &mut Criterion) {
    // 16 pipelined GET replies with 64-byte values.
    let mut gets = Vec::new();
    for i in 0..16 {
        bulk(format!("{i:064}").as_bytes(), &mut gets);
    }
    // A 10,000-element array of short bulk strings (an LRANGE/SMEMBERS-style reply).
    let mut array = b"*10000\r\n".to_vec();
    for i in 0..10_000 {
        bulk(format!("member:{i:06}").as_bytes(), &mut array);
    }

    let mut g = c.benchmark_group("reply");
    g.throughput(Throughput::Elements(16));
    g.bench_function("bulk_x16/corral_scan", |b| {
        b.iter(|| scan_all(black_box(&gets)))
    });
    g.bench_function("bulk_x16/rp_decode", |b| {
        b.iter(|| rp_decode_all(black_box(&gets)))
    });
    g.bench_function("bulk_x16/rp_decode_range", |b| {
        b.iter(|| rp_decode_range_all(black_box(&gets)))
    });
    g.throughput(Throughput::Elements(10_000));
    g.bench_function("array_10k/corral_scan", |b| {
        b.iter(|| scan_all(black_box(&array)))
    });
    g.bench_function("array_10k/rp_decode", |b| {
        b.iter(|| rp_decode_all(black_box(&array)))
    });
    g.bench_function("array_10k/rp_decode_range", |b| {
        b.iter(|| rp_decode_range_all(black_box(&array)))
    });
    g.bench_function("array_10k_4k_pieces/corral_scan", |b| {
        b.iter(|| scan_pieces(black_box(&array)))
    });
    g.bench_function("array_10k_4k_pieces/rp_decode_range", |b| {
        b.iter(|| rp_decode_range_pieces(black_box(&array)))
    });
    g.finish();
}

fn config() -> Criterion {
    // Short runs: these are comparisons with large gaps, not regression detectors.
    Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30)
}

criterion_group! {
    name = benches;
    config = config();
    targets = request_pipelined, request_large, reply_scan
}
criterion_main!(benches);
