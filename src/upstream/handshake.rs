//! Connection setup: `HELLO <proto> [AUTH user pass]`, with a plain AUTH fallback for servers
//! older than Redis 6. Replies here are decoded in full with `redis-protocol`: it is a cold path.
//! It runs over any byte stream, so a TLS stream can be handshaken as a TCP one is.

use bytes::BytesMut;
use redis_protocol::resp2::types::OwnedFrame as Frame2;
use redis_protocol::resp3::types::OwnedFrame as Frame3;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::resp::encode::encode_request;
use crate::resp::{Proto, ReplyScanner};

/// A decoded handshake reply, reduced to what the handshake needs.
#[derive(Debug, PartialEq)]
enum Reply {
    Error(String),
    Ok(Option<Greeting>),
}

/// What HELLO's reply tells about the server and this connection.
#[derive(Debug, Default, PartialEq)]
pub struct Greeting {
    /// The server's version.
    pub version: Option<String>,
    /// This connection's client id on the server (what CLIENT ID would say): CLIENT UNBLOCK
    /// of a client blocked through corral names it.
    pub id: Option<u64>,
}

/// Authenticates and selects the protocol on a fresh connection. Returns what the server
/// reports of itself (nothing before Redis 6, which has no HELLO).
///
/// # Errors
/// The server's error text, or the I/O error.
pub async fn hello(
    stream: &mut (impl AsyncRead + AsyncWrite + Unpin),
    proto: Proto,
    user: Option<&str>,
    password: Option<&str>,
) -> Result<Option<Greeting>, String> {
    let version = proto.as_int().to_string();
    let mut args: Vec<&[u8]> = vec![b"HELLO", version.as_bytes()];
    if let Some(pass) = password {
        args.extend([
            &b"AUTH"[..],
            user.unwrap_or("default").as_bytes(),
            pass.as_bytes(),
        ]);
    }
    match command(stream, &args, proto).await? {
        Reply::Ok(greeting) => Ok(greeting),
        Reply::Error(e) if e.contains("unknown command") && proto == Proto::Resp2 => {
            // Redis before 6.0: no HELLO, no ACL users.
            if let Some(pass) = password {
                match command(stream, &[b"AUTH", pass.as_bytes()], proto).await? {
                    Reply::Error(e) => return Err(e),
                    Reply::Ok(_) => {}
                }
            }
            Ok(None)
        }
        Reply::Error(e) => Err(e),
    }
}

/// Selects database `db`.
///
/// # Errors
/// The server's error (e.g. `DB index is out of range`) or an I/O error.
pub async fn select(
    stream: &mut (impl AsyncRead + AsyncWrite + Unpin),
    proto: Proto,
    db: u32,
) -> Result<(), String> {
    match command(stream, &[b"SELECT", db.to_string().as_bytes()], proto).await? {
        Reply::Error(e) => Err(e),
        Reply::Ok(_) => Ok(()),
    }
}

/// Lets a cluster replica serve reads of its master's slots.
///
/// # Errors
/// The server's error or an I/O error.
pub async fn readonly(
    stream: &mut (impl AsyncRead + AsyncWrite + Unpin),
    proto: Proto,
) -> Result<(), String> {
    match command(stream, &[b"READONLY"], proto).await? {
        Reply::Error(e) => Err(e),
        Reply::Ok(_) => Ok(()),
    }
}

/// Turns on server-assisted client-side caching (default mode: the server remembers the keys
/// this connection reads). Returns false when the server refuses it (tracking unsupported or
/// disabled), so the caller can fall back to a TTL-only cache.
///
/// # Errors
/// I/O errors, and a refusal that names a passing state (BUSY, LOADING...).
pub async fn tracking_on(
    stream: &mut (impl AsyncRead + AsyncWrite + Unpin),
    proto: Proto,
) -> Result<bool, String> {
    match command(stream, &[b"CLIENT", b"TRACKING", b"ON"], proto).await? {
        Reply::Ok(_) => Ok(true),
        Reply::Error(e) if refuses_for_good(&e) => Ok(false),
        // BUSY (a script), LOADING, MASTERDOWN...: Redis cannot answer now, which says
        // nothing of tracking. The connection fails and is made again, as after a failed
        // HELLO; falling back here kept the cache on TTLs alone for good after one long script.
        Reply::Error(e) => Err(format!("CLIENT TRACKING ON refused: {e}")),
    }
}

/// Whether an error to CLIENT TRACKING ON means the server will not track (an unknown
/// command, tracking disabled, a user without the right): `ERR` and `NOPERM`. Any other code
/// names a passing state.
fn refuses_for_good(error: &str) -> bool {
    let code = error.split(' ').next().unwrap_or_default();
    matches!(code, "ERR" | "NOPERM")
}

async fn command(
    stream: &mut (impl AsyncRead + AsyncWrite + Unpin),
    args: &[&[u8]],
    proto: Proto,
) -> Result<Reply, String> {
    let mut out = BytesMut::new();
    encode_request(args, &mut out);
    stream.write_all(&out).await.map_err(|e| e.to_string())?;
    // TLS may hold back what it could not write yet; plain TCP has nothing to flush.
    stream.flush().await.map_err(|e| e.to_string())?;
    let mut buf = BytesMut::with_capacity(1024);
    let mut scanner = ReplyScanner::new();
    loop {
        if let Some(f) = scanner.next_frame(&buf).map_err(|e| e.to_string())? {
            if f.push {
                continue;
            }
            return decode(&buf[..f.end], proto);
        }
        if buf.len() > 1024 * 1024 {
            return Err("handshake reply too large".into());
        }
        if stream.read_buf(&mut buf).await.map_err(|e| e.to_string())? == 0 {
            return Err("closed by upstream during handshake".into());
        }
    }
}

fn decode(bytes: &[u8], proto: Proto) -> Result<Reply, String> {
    let bad = |e: String| format!("bad handshake reply: {e}");
    match proto {
        Proto::Resp2 => {
            let (frame, _) = redis_protocol::resp2::decode::decode(bytes)
                .map_err(|e| bad(e.to_string()))?
                .ok_or_else(|| bad("incomplete".into()))?;
            Ok(match frame {
                Frame2::Error(e) => Reply::Error(e),
                Frame2::Array(items) => {
                    Reply::Ok(Some(greeting(items.chunks(2).filter_map(|kv| match kv {
                        [Frame2::BulkString(k), Frame2::BulkString(v)] => Some((k, Field::Text(v))),
                        [Frame2::BulkString(k), Frame2::Integer(n)] => Some((k, Field::Int(*n))),
                        _ => None,
                    }))))
                }
                _ => Reply::Ok(None),
            })
        }
        Proto::Resp3 => {
            let (frame, _) = redis_protocol::resp3::decode::complete::decode(bytes)
                .map_err(|e| bad(e.to_string()))?
                .ok_or_else(|| bad("incomplete".into()))?;
            Ok(match frame {
                Frame3::SimpleError { data, .. } => Reply::Error(data),
                Frame3::BlobError { data, .. } => {
                    Reply::Error(String::from_utf8_lossy(&data).into_owned())
                }
                Frame3::Map { data, .. } => {
                    Reply::Ok(Some(greeting(data.iter().filter_map(|(k, v)| {
                        match (k, v) {
                            (
                                Frame3::BlobString { data: k, .. },
                                Frame3::BlobString { data: v, .. },
                            ) => Some((k, Field::Text(v))),
                            (
                                Frame3::BlobString { data: k, .. },
                                Frame3::Number { data: n, .. },
                            ) => Some((k, Field::Int(*n))),
                            _ => None,
                        }
                    }))))
                }
                _ => Reply::Ok(None),
            })
        }
    }
}

/// A value in HELLO's reply map.
enum Field<'a> {
    Text(&'a Vec<u8>),
    Int(i64),
}

fn greeting<'a>(pairs: impl Iterator<Item = (&'a Vec<u8>, Field<'a>)>) -> Greeting {
    let mut g = Greeting::default();
    for (k, v) in pairs {
        match (k.as_slice(), v) {
            (b"version", Field::Text(v)) => g.version = Some(String::from_utf8_lossy(v).into()),
            (b"id", Field::Int(n)) => g.id = u64::try_from(n).ok(),
            _ => {}
        }
    }
    g
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_version_in_both_protocols() {
        let r2 = b"*6\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n$6\r\n7.0.15\r\n\
                   $2\r\nid\r\n:7\r\n";
        let g = |v: &str, id| {
            Ok(Reply::Ok(Some(Greeting {
                version: Some(v.into()),
                id,
            })))
        };
        assert_eq!(decode(r2, Proto::Resp2), g("7.0.15", Some(7)));
        let r3 = b"%3\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n$5\r\n7.2.0\r\n\
                   $2\r\nid\r\n:12\r\n";
        assert_eq!(decode(r3, Proto::Resp3), g("7.2.0", Some(12)));
    }

    #[test]
    fn only_a_lasting_refusal_turns_tracking_off() {
        assert!(refuses_for_good("ERR unknown command 'CLIENT'"));
        assert!(refuses_for_good("NOPERM this user has no permissions"));
        assert!(!refuses_for_good("BUSY Redis is busy running a script."));
        assert!(!refuses_for_good(
            "LOADING Redis is loading the dataset in memory"
        ));
    }

    #[test]
    fn error_reply_is_reported() {
        assert_eq!(
            decode(b"-WRONGPASS bad\r\n", Proto::Resp2),
            Ok(Reply::Error("WRONGPASS bad".into()))
        );
    }
}
