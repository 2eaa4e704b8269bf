//! INFO: the upstream's text with corral's own `# Proxy` section appended.

use std::fmt::Write;

use bytes::{Bytes, BytesMut};

use super::shared::Shared;
use crate::resp::Args;
use crate::resp::digits::parse_int;
use crate::resp::reply::{Encoder, Proto};

/// Whether `INFO [section ...]` asks for corral's sections: with no section, or with `all`,
/// `everything`, `default`, `proxy` or `cache` among them.
pub fn wants_proxy_section(args: &Args<'_>) -> bool {
    args.len() == 1
        || args.iter().skip(1).any(|a| {
            [&b"all"[..], b"everything", b"default", b"proxy", b"cache"]
                .iter()
                .any(|s| a.eq_ignore_ascii_case(s))
        })
}

/// Whether `INFO [section ...]` asks for the `# Keyspace` section: with no section, or with
/// `all`, `everything`, `default` or `keyspace` among them.
pub fn wants_keyspace(args: &Args<'_>) -> bool {
    args.len() == 1
        || args.iter().skip(1).any(|a| {
            [&b"all"[..], b"everything", b"default", b"keyspace"]
                .iter()
                .any(|s| a.eq_ignore_ascii_case(s))
        })
}

/// corral's INFO sections: `# Proxy`, and `# Cache` when the cache is on.
pub fn proxy_sections(shared: &Shared) -> String {
    let mut s = proxy_section(shared);
    if let Some(cache) = &shared.cache {
        s.push_str("\r\n# Cache\r\n");
        for (k, v) in cache.stats() {
            let _ = write!(s, "{k}:{v}\r\n");
        }
    }
    s
}

/// The `# Proxy` section, in INFO's `key:value\r\n` format. No field shares a name with one of
/// Redis's (counters are `proxy_...`): clients that parse INFO into a map must get Redis's
/// `connected_clients`, `uptime_in_seconds`... whatever order they read the sections in.
pub fn proxy_section(shared: &Shared) -> String {
    let status = &shared.upstream.status;
    let m = &shared.metrics;
    let mut s = String::from("# Proxy\r\n");
    let mut line = |k: &str, v: &dyn std::fmt::Display| {
        let _ = write!(s, "{k}:{v}\r\n");
    };
    line("corral_version", &crate::VERSION);
    line(
        "proxy_uptime_in_seconds",
        &shared.started.elapsed().as_secs(),
    );
    line("proxy_connected_clients", &shared.clients());
    line("proxy_total_connections_received", &m.connections.get());
    line("proxy_rejected_connections", &m.rejected_connections.get());
    line("proxy_total_commands_processed", &m.commands.get());
    line("proxy_local_commands_processed", &m.local_commands.get());
    line("proxy_upstream_errors", &m.upstream_errors.get());
    line("proxy_protocol_errors", &m.protocol_errors.get());
    line("upstream", &shared.upstream.addr());
    line("upstream_connections", &status.connected_count());
    line("upstream_connects", &status.connects_total());
    line(
        "upstream_last_error",
        &status
            .last_error()
            .unwrap_or_default()
            .replace(['\r', '\n'], " "),
    );
    line(
        "upstream_refused",
        &status
            .refused()
            .unwrap_or_default()
            .replace(['\r', '\n'], " "),
    );
    line("upstream_tls", &u8::from(shared.upstream.is_tls()));
    // The bar shared connections hold their writes at now: lower while the cache serves
    // many GETs (see `cache/holds.rs`); 0 when `upstream.hold_writes_at` is 0.
    let held = status.hold_bar(shared.cfg.hold_writes_at());
    line("upstream_hold_writes_at", &held);
    let (pools, clients) = shared.upstream.users.counts();
    line("upstream_user_pools", &pools);
    line("upstream_user_pool_clients", &clients);
    line("cache_enabled", &u8::from(shared.cache.is_some()));
    s
}

/// Writes `reply` (an INFO reply: bulk or verbatim string) with `section` appended; any other
/// reply (an error) is passed on unchanged.
pub fn append_section(reply: &[u8], section: &str, out: &mut BytesMut) {
    let Some((kind, body)) = string_body(reply) else {
        out.extend_from_slice(reply);
        return;
    };
    let mut text = Vec::with_capacity(body.len() + section.len() + 2);
    text.extend_from_slice(body);
    if !text.is_empty() && !text.ends_with(b"\r\n\r\n") {
        text.extend_from_slice(b"\r\n");
    }
    text.extend_from_slice(section.as_bytes());
    encode_text(kind, &text, out);
}

/// Redis's `tracking_clients` (clients with CLIENT TRACKING on) counts corral's own cache
/// lanes; a client counts the clients it can see, so `lanes` is taken off.
pub fn hide_lanes(reply: Bytes, lanes: usize) -> Bytes {
    const FIELD: &[u8] = b"\r\ntracking_clients:";
    let Some((kind, body)) = string_body(&reply).filter(|_| lanes > 0) else {
        return reply;
    };
    let Some(at) = body.windows(FIELD.len()).position(|w| w == FIELD) else {
        return reply;
    };
    let start = at + FIELD.len();
    let end = start
        + body[start..]
            .iter()
            .position(|&b| b == b'\r')
            .unwrap_or(body.len() - start);
    let Some(n) = parse_int(&body[start..end]) else {
        return reply;
    };
    let mut text = Vec::with_capacity(body.len());
    text.extend_from_slice(&body[..start]);
    text.extend_from_slice((n - lanes as i64).max(0).to_string().as_bytes());
    text.extend_from_slice(&body[end..]);
    let mut out = BytesMut::new();
    encode_text(kind, &text, &mut out);
    out.freeze()
}

/// Cluster mode: the first master's INFO reply with its `# Keyspace` section made of every
/// master's (each holds its own slots' keys), so that it counts what DBSIZE counts: per
/// database, `keys`, `expires` and any other count summed, `avg_ttl` averaged over the
/// masters weighted by their keys with an expiry. `None` if a reply is not an INFO text.
pub fn merge_keyspace(replies: &[Bytes]) -> Option<Bytes> {
    let bodies: Vec<(u8, &[u8])> = replies
        .iter()
        .map(|r| string_body(r))
        .collect::<Option<_>>()?;
    let &(kind, first) = bodies.first()?;
    let (start, end) = keyspace_section(first)?;
    // Per database, in the order first seen: its fields in the order first seen, summed
    // (`avg_ttl` times the master's `expires`, divided by their sum once all are in).
    let mut dbs: Vec<(String, Vec<(String, i64)>)> = Vec::new();
    for &(_, body) in &bodies {
        let Some((s, e)) = keyspace_section(body) else {
            continue;
        };
        let text = String::from_utf8_lossy(&body[s + KEYSPACE.len()..e]);
        for line in text.split("\r\n").filter(|l| !l.is_empty()) {
            let Some((db, fields)) = line.split_once(':') else {
                continue;
            };
            let parsed: Vec<(&str, i64)> = fields
                .split(',')
                .filter_map(|f| f.split_once('='))
                .filter_map(|(k, v)| Some((k, v.parse::<i64>().ok()?)))
                .collect();
            let expires = field(&parsed, "expires");
            let sums = match dbs.iter().position(|(d, _)| d == db) {
                Some(at) => &mut dbs[at].1,
                None => {
                    dbs.push((db.to_string(), Vec::new()));
                    &mut dbs.last_mut()?.1
                }
            };
            for (k, v) in parsed {
                let v = if k == "avg_ttl" {
                    v.saturating_mul(expires)
                } else {
                    v
                };
                match sums.iter_mut().find(|(name, _)| name == k) {
                    Some((_, sum)) => *sum = sum.saturating_add(v),
                    None => sums.push((k.to_string(), v)),
                }
            }
        }
    }
    let mut merged = String::new();
    for (db, fields) in &dbs {
        let expires = fields
            .iter()
            .find(|(k, _)| k == "expires")
            .map_or(0, |f| f.1);
        let fields: Vec<String> = fields
            .iter()
            .map(|(k, v)| match k.as_str() {
                "avg_ttl" => format!("{k}={}", v.checked_div(expires).unwrap_or(0)),
                _ => format!("{k}={v}"),
            })
            .collect();
        let _ = write!(merged, "{db}:{}\r\n", fields.join(","));
    }
    let mut text = Vec::with_capacity(first.len() + merged.len());
    text.extend_from_slice(&first[..start]);
    text.extend_from_slice(KEYSPACE);
    text.extend_from_slice(merged.as_bytes());
    text.extend_from_slice(&first[end..]);
    let mut out = BytesMut::new();
    encode_text(kind, &text, &mut out);
    Some(out.freeze())
}

/// The value of `name` among a keyspace line's fields, 0 if absent.
fn field(fields: &[(&str, i64)], name: &str) -> i64 {
    fields.iter().find(|(k, _)| *k == name).map_or(0, |f| f.1)
}

/// The header of INFO's keyspace section.
const KEYSPACE: &[u8] = b"# Keyspace\r\n";

/// Where INFO text `body`'s keyspace section starts (its header) and ends (after its last
/// line: at its blank line, or with the text).
fn keyspace_section(body: &[u8]) -> Option<(usize, usize)> {
    let find = |hay: &[u8], needle: &[u8]| hay.windows(needle.len()).position(|w| w == needle);
    let start = find(body, KEYSPACE)?;
    // From the header's own line end, so that an empty section ends right after it.
    let from = start + KEYSPACE.len() - 2;
    let end = find(&body[from..], b"\r\n\r\n").map_or(body.len(), |at| from + at + 2);
    Some((start, end))
}

/// INFO text written as the reply `kind` it came in (`=`: RESP3's verbatim string, else a
/// bulk string).
fn encode_text(kind: u8, text: &[u8], out: &mut BytesMut) {
    let proto = if kind == b'=' {
        Proto::Resp3
    } else {
        Proto::Resp2
    };
    Encoder { proto, out }.verbatim(text);
}

/// Splits a `$` or `=` reply into its type and text (without the verbatim `txt:` prefix).
fn string_body(reply: &[u8]) -> Option<(u8, &[u8])> {
    let kind = *reply.first()?;
    if kind != b'$' && kind != b'=' {
        return None;
    }
    let cr = reply.iter().position(|&b| b == b'\r')?;
    let len = usize::try_from(parse_int(&reply[1..cr])?).ok()?;
    let body = reply.get(cr + 2..cr + 2 + len)?;
    if kind == b'=' {
        Some((kind, body.get(4..)?))
    } else {
        Some((kind, body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn appended(reply: &[u8]) -> Vec<u8> {
        let mut out = BytesMut::new();
        append_section(reply, "# Proxy\r\na:1\r\n", &mut out);
        out.to_vec()
    }

    #[test]
    fn keeps_the_reply_type() {
        assert_eq!(
            appended(b"$10\r\n# S\r\nx:1\r\n\r\n"),
            b"$26\r\n# S\r\nx:1\r\n\r\n# Proxy\r\na:1\r\n\r\n"
        );
        assert_eq!(
            appended(b"=14\r\ntxt:# S\r\nx:1\r\n\r\n"),
            b"=30\r\ntxt:# S\r\nx:1\r\n\r\n# Proxy\r\na:1\r\n\r\n"
        );
    }

    #[test]
    fn own_lanes_are_not_tracking_clients() {
        let reply =
            Bytes::from_static(b"$38\r\n# Clients\r\ntracking_clients:3\r\nx:1\r\n\r\n\r\n");
        assert_eq!(
            &hide_lanes(reply.clone(), 1)[..],
            b"$38\r\n# Clients\r\ntracking_clients:2\r\nx:1\r\n\r\n\r\n"
        );
        assert_eq!(hide_lanes(reply.clone(), 0), reply);
    }

    #[test]
    fn keyspace_sections_are_summed_into_the_first_reply() {
        let info = |keyspace: &str| {
            let text = format!("# Server\r\nx:1\r\n\r\n# Keyspace\r\n{keyspace}");
            Bytes::from(format!("${}\r\n{text}\r\n", text.len()))
        };
        let replies = [
            info("db0:keys=10,expires=2,avg_ttl=1000\r\n"),
            info(""),
            info("db0:keys=5,expires=6,avg_ttl=3000,subexpiry=1\r\n"),
        ];
        let merged = merge_keyspace(&replies).unwrap();
        let text = "# Server\r\nx:1\r\n\r\n# Keyspace\r\n\
                    db0:keys=15,expires=8,avg_ttl=2500,subexpiry=1\r\n";
        assert_eq!(
            std::str::from_utf8(&merged).unwrap(),
            format!("${}\r\n{text}\r\n", text.len())
        );
        // A section after it stays where it was; an empty one stays empty; RESP3 stays
        // verbatim.
        let text = "# Keyspace\r\n\r\n# Proxy\r\na:1\r\n";
        let empty = Bytes::from(format!("={}\r\ntxt:{text}\r\n", text.len() + 4));
        assert_eq!(
            merge_keyspace(&[empty.clone(), empty.clone()]).unwrap(),
            empty
        );
        // No avg_ttl without keys that expire; anything not INFO text is left to the caller.
        let no_ttl = [info("db0:keys=1,expires=0,avg_ttl=0\r\n"), info("")];
        assert!(
            std::str::from_utf8(&merge_keyspace(&no_ttl).unwrap())
                .unwrap()
                .contains("db0:keys=1,expires=0,avg_ttl=0\r\n")
        );
        assert!(merge_keyspace(&[info(""), Bytes::from_static(b"-ERR x\r\n")]).is_none());
        assert!(merge_keyspace(&[]).is_none());
    }

    #[test]
    fn errors_pass_through() {
        assert_eq!(appended(b"-ERR x\r\n"), b"-ERR x\r\n");
    }
}
