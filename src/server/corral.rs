//! `CORRAL ...`: corral's own commands. `CORRAL HOTKEYS [N]` lists the hottest keys with
//! estimated GET rates and whether each is cached; `CORRAL CACHE STATS` shows the cache
//! counters; `CORRAL HELP` lists them.

use bytes::{Bytes, BytesMut};

use super::shared::Shared;
use crate::error::replies;
use crate::resp::digits::parse_int;
use crate::resp::{Args, Encoder, Proto};

const HELP: &[&str] = &[
    "CORRAL <subcommand> [<arg> ...]. Subcommands are:",
    "HOTKEYS [<count>]",
    "    The hottest keys (default 10): key, estimated GETs per second, cached (0/1).",
    "CACHE STATS",
    "    Local cache counters, as in INFO's # Cache section.",
    "HELP",
    "    Print this help.",
];

/// Runs a CORRAL command and returns its reply.
pub fn execute(args: &Args<'_>, shared: &Shared, proto: Proto) -> Bytes {
    let mut out = BytesMut::new();
    let mut e = Encoder {
        proto,
        out: &mut out,
    };
    let sub = args.get(1).unwrap_or_default().to_ascii_uppercase();
    match (sub.as_slice(), args.len()) {
        (b"HELP", 2) => {
            e.array(HELP.len());
            for line in HELP {
                e.simple(line);
            }
        }
        (b"HOTKEYS", 2 | 3) => hotkeys(args, shared, &mut e),
        (b"CACHE", 3)
            if args
                .get(2)
                .is_some_and(|a| a.eq_ignore_ascii_case(b"STATS")) =>
        {
            match &shared.cache {
                Some(cache) => {
                    let stats = cache.stats();
                    e.map(stats.len());
                    for (k, v) in stats {
                        e.bulk(k.as_bytes());
                        e.bulk(v.as_bytes());
                    }
                }
                None => e.error(replies::CACHE_DISABLED.text()),
            }
        }
        (b"HOTKEYS" | b"CACHE" | b"HELP", _) => e.error(&replies::wrong_arity(&format!(
            "corral|{}",
            String::from_utf8_lossy(&sub).to_ascii_lowercase()
        ))),
        _ => e.error(&replies::unknown_subcommand(
            args.get(1).unwrap_or_default(),
            "corral",
        )),
    }
    out.freeze()
}

fn hotkeys(args: &Args<'_>, shared: &Shared, e: &mut Encoder<'_>) {
    let n = match args.get(2).map(parse_int) {
        None => 10,
        Some(Some(n)) if n > 0 => n as usize,
        Some(_) => return e.error(replies::COUNT_NOT_POSITIVE.text()),
    };
    let Some(cache) = &shared.cache else {
        return e.error(replies::CACHE_DISABLED.text());
    };
    let keys = cache.hot_keys(n);
    e.array(keys.len());
    for (hot, cached) in keys {
        e.map(3);
        e.bulk(b"key");
        e.bulk(&hot.key);
        e.bulk(b"rate");
        e.bulk(format!("{:.1}", hot.rate).as_bytes());
        e.bulk(b"cached");
        e.int(i64::from(cached));
    }
}
