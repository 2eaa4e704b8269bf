//! The one runner for "these commands against Redis and against corral, replies compared byte
//! for byte": a script (see `script.rs` for its lines) runs on a [`Side`] reached directly and
//! on one behind corral, and every reply, message and push each client receives must be the
//! same bytes in the same order.

use std::time::Duration;

use super::client::{RawClient, connect};
use super::resp::{encode_line, payload, show};
use super::runner::Runner;
use super::script::{Options, Reply, Side, Step, steps};

/// Runs `steps` on both sides (Redis first) and asserts that they received the same bytes,
/// in order. Returns (Redis's replies, corral's replies).
pub async fn compare(
    sides: [Side; 2],
    name: &str,
    steps: &[Step],
    opts: Options,
) -> [Vec<Reply>; 2] {
    let mut results = Vec::new();
    for side in sides {
        if opts.wipe {
            wipe(side).await;
        }
        let mut watch = connect(side.entry).await;
        let before = clients(&mut watch).await;
        let mut r = Runner::new(side, opts);
        r.run(steps).await;
        r.end().await;
        results.push(std::mem::take(&mut r.replies));
        // The script's clients leave before the next script starts: one still being torn
        // down (a subscriber, say) would show in the next script's counts.
        drop(r);
        settle(side, &mut watch, before).await;
    }
    let proxied = results.pop().expect("corral's replies");
    let direct = results.pop().expect("redis's replies");
    let what = format!("script {name} ({}, {:?})", opts.proto(), opts.mode);
    assert_same(&what, &direct, &proxied);
    [direct, proxied]
}

/// The clients the side's entry serves, as its CLIENT LIST shows them.
async fn clients(c: &mut RawClient) -> Vec<u8> {
    let list = c.request(&[b"CLIENT", b"LIST"]).await;
    payload(&list).unwrap_or_default()
}

/// Waits until the side's entry serves no more clients than `before` (the list taken before
/// the script ran).
async fn settle(side: Side, c: &mut RawClient, before: Vec<u8>) {
    let count = |l: &[u8]| l.split(|&b| b == b'\n').filter(|l| !l.is_empty()).count();
    let end = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let now = clients(c).await;
        if count(&now) <= count(&before) {
            return;
        }
        assert!(
            std::time::Instant::now() < end,
            "{}: clients still there after a script: {}",
            side.name,
            show(&now)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Asserts that Redis's and corral's replies have the same labels and bytes, in order.
pub fn assert_same(what: &str, direct: &[Reply], proxied: &[Reply]) {
    let mismatches: Vec<String> = direct
        .iter()
        .zip(proxied)
        .enumerate()
        .filter(|(_, (d, p))| d.bytes != p.bytes || d.label != p.label)
        .map(|(i, (d, p))| {
            format!(
                "#{i} `{}`\n   redis: {}\n  corral: {}",
                d.label,
                show(&d.bytes),
                show(&p.bytes)
            )
        })
        .collect();
    assert!(
        mismatches.is_empty(),
        "{what}: {} replies differ:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
    assert_eq!(direct.len(), proxied.len(), "{what}: reply count");
}

/// [`compare`] on script lines.
pub async fn check(
    sides: [Side; 2],
    name: &str,
    script: &[&str],
    opts: Options,
) -> [Vec<Reply>; 2] {
    compare(sides, name, &steps(script), opts).await
}

/// Runs each named script in RESP2 and RESP3, with `opts` otherwise.
pub async fn check_all(sides: [Side; 2], scripts: &[(&str, &[&str])], opts: Options) {
    for (name, script) in scripts {
        for resp3 in [false, true] {
            check(sides, name, script, Options { resp3, ..opts }).await;
        }
    }
}

/// Empties a side: all databases, scripts and functions.
async fn wipe(side: Side) {
    let mut c = connect(side.entry).await;
    for line in ["FLUSHALL", "FUNCTION FLUSH", "SCRIPT FLUSH"] {
        c.send(&encode_line(line)).await;
        let r = c.read_reply().await;
        assert_eq!(show(&r), show(b"+OK\r\n"), "{} {line}", side.name);
    }
}
