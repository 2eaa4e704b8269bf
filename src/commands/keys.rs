//! How a forwarded command touches keys, as far as the local cache cares: GET is served by the
//! cache, other reads leave it alone, writes invalidate the keys they name, and a few commands
//! invalidate everything. Unknown commands count as writes to their first argument, which is
//! right for nearly every Redis write command and merely wasteful otherwise.

use crate::resp::Args;
use crate::resp::request::parse_int;

/// The cache-relevant kind of a forwarded command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// `GET key`: may be answered by the cache or coalesced.
    Get,
    /// `MGET key...`: cached keys are answered locally, the rest fetched in one MGET.
    MGet,
    /// Reads only; the cache is not involved.
    Read,
    /// May change the keys given by [`write_keys`].
    Write,
    /// May change every key (FLUSHALL, FLUSHDB, SWAPDB).
    All,
}

/// The access kind of the (upper-cased) command `name`.
pub fn access(name: &[u8]) -> Access {
    match name {
        b"GET" => Access::Get,
        b"MGET" => Access::MGet,
        b"FLUSHALL" | b"FLUSHDB" | b"SWAPDB" => Access::All,
        b"STRLEN"
        | b"GETRANGE"
        | b"SUBSTR"
        | b"EXISTS"
        | b"TYPE"
        | b"TTL"
        | b"PTTL"
        | b"EXPIRETIME"
        | b"PEXPIRETIME"
        | b"TOUCH"
        | b"DUMP"
        | b"OBJECT"
        | b"MEMORY"
        | b"KEYS"
        | b"SCAN"
        | b"RANDOMKEY"
        | b"DBSIZE"
        | b"LCS"
        | b"HGET"
        | b"HMGET"
        | b"HGETALL"
        | b"HKEYS"
        | b"HVALS"
        | b"HLEN"
        | b"HEXISTS"
        | b"HSTRLEN"
        | b"HSCAN"
        | b"HRANDFIELD"
        | b"LRANGE"
        | b"LLEN"
        | b"LINDEX"
        | b"LPOS"
        | b"SMEMBERS"
        | b"SISMEMBER"
        | b"SMISMEMBER"
        | b"SCARD"
        | b"SRANDMEMBER"
        | b"SSCAN"
        | b"SINTER"
        | b"SUNION"
        | b"SDIFF"
        | b"SINTERCARD"
        | b"ZRANGE"
        | b"ZRANGEBYSCORE"
        | b"ZRANGEBYLEX"
        | b"ZREVRANGE"
        | b"ZREVRANGEBYSCORE"
        | b"ZREVRANGEBYLEX"
        | b"ZSCORE"
        | b"ZMSCORE"
        | b"ZRANK"
        | b"ZREVRANK"
        | b"ZCARD"
        | b"ZCOUNT"
        | b"ZLEXCOUNT"
        | b"ZSCAN"
        | b"ZRANDMEMBER"
        | b"ZINTER"
        | b"ZUNION"
        | b"ZDIFF"
        | b"ZINTERCARD"
        | b"XRANGE"
        | b"XREVRANGE"
        | b"XLEN"
        | b"XREAD"
        | b"XINFO"
        | b"XPENDING"
        | b"PFCOUNT"
        | b"GETBIT"
        | b"BITCOUNT"
        | b"BITPOS"
        | b"BITFIELD_RO"
        | b"GEOPOS"
        | b"GEODIST"
        | b"GEOHASH"
        | b"GEOSEARCH"
        | b"GEORADIUS_RO"
        | b"GEORADIUSBYMEMBER_RO"
        | b"SORT_RO"
        | b"EVAL_RO"
        | b"EVALSHA_RO"
        | b"FCALL_RO"
        | b"PING"
        | b"ECHO"
        | b"TIME"
        | b"COMMAND"
        | b"LOLWUT"
        | b"PUBLISH"
        | b"SPUBLISH"
        | b"PUBSUB"
        | b"SLOWLOG"
        | b"LATENCY"
        | b"LASTSAVE" => Access::Read,
        _ => Access::Write,
    }
}

/// Calls `f` with every key a write command may change.
pub fn write_keys<'a>(name: &[u8], args: &Args<'a>, mut f: impl FnMut(&'a [u8])) {
    let n = args.len();
    let mut range = |from: usize, to: usize, step: usize| {
        let mut i = from;
        while i < to.min(n) {
            if let Some(k) = args.get(i) {
                f(k);
            }
            i += step;
        }
    };
    match name {
        // Every argument is a key.
        b"DEL" | b"UNLINK" | b"SINTERSTORE" | b"SUNIONSTORE" | b"SDIFFSTORE" | b"PFMERGE"
        | b"RENAME" | b"RENAMENX" | b"RPOPLPUSH" | b"LMOVE" | b"SMOVE" | b"COPY" => {
            let last = match name {
                b"DEL" | b"UNLINK" | b"SINTERSTORE" | b"SUNIONSTORE" | b"SDIFFSTORE"
                | b"PFMERGE" => n,
                _ => 3,
            };
            range(1, last, 1);
        }
        b"MSET" | b"MSETNX" => range(1, n, 2),
        // BITOP op dest src...
        b"BITOP" => range(2, n, 1),
        // numkeys-prefixed key lists, optionally after a destination.
        b"EVAL" | b"EVALSHA" | b"FCALL" => numkeys(args, 2, &mut range),
        b"LMPOP" | b"ZMPOP" => numkeys(args, 1, &mut range),
        b"ZUNIONSTORE" | b"ZINTERSTORE" | b"ZDIFFSTORE" => {
            range(1, 2, 1);
            numkeys(args, 2, &mut range);
        }
        b"ZRANGESTORE" | b"GEOSEARCHSTORE" => range(1, 3, 1),
        b"SORT" | b"GEORADIUS" | b"GEORADIUSBYMEMBER" => {
            range(1, 2, 1);
            // STORE/STOREDIST destination.
            for i in 2..n.saturating_sub(1) {
                let is_store = args.get(i).is_some_and(|a| {
                    a.eq_ignore_ascii_case(b"STORE") || a.eq_ignore_ascii_case(b"STOREDIST")
                });
                if is_store {
                    range(i + 1, i + 2, 1);
                }
            }
        }
        b"MIGRATE" => {
            range(3, 4, 1);
            let keys_at =
                (6..n).find(|&i| args.get(i).is_some_and(|a| a.eq_ignore_ascii_case(b"KEYS")));
            if let Some(i) = keys_at {
                range(i + 1, n, 1);
            }
        }
        b"XGROUP" | b"OBJECT" => range(2, 3, 1),
        _ => range(1, 2, 1),
    }
}

/// Keys given as `numkeys key...` with `numkeys` at argument `at`.
fn numkeys(args: &Args<'_>, at: usize, range: &mut impl FnMut(usize, usize, usize)) {
    if let Some(k) = args
        .get(at)
        .and_then(parse_int)
        .and_then(|k| usize::try_from(k).ok())
    {
        range(at + 1, at + 1 + k, 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(line: &str) -> Vec<String> {
        let owned: Vec<Vec<u8>> = line.split(' ').map(|w| w.as_bytes().to_vec()).collect();
        let args = Args::Owned(&owned);
        let name = owned[0].to_ascii_uppercase();
        let mut out = Vec::new();
        write_keys(&name, &args, |k| {
            out.push(String::from_utf8_lossy(k).into_owned())
        });
        out
    }

    #[test]
    fn finds_keys_of_common_writes() {
        assert_eq!(keys("SET k v EX 10"), ["k"]);
        assert_eq!(keys("DEL a b c"), ["a", "b", "c"]);
        assert_eq!(keys("MSET a 1 b 2"), ["a", "b"]);
        assert_eq!(keys("RENAME a b"), ["a", "b"]);
        assert_eq!(keys("EVAL s 2 a b x"), ["a", "b"]);
        assert_eq!(keys("ZUNIONSTORE d 2 a b WEIGHTS 1 2"), ["d", "a", "b"]);
        assert_eq!(keys("BITOP AND d a b"), ["d", "a", "b"]);
        assert_eq!(keys("SORT l BY x STORE d"), ["l", "d"]);
        assert_eq!(keys("EVAL s 5 a"), ["a"]);
    }

    #[test]
    fn reads_and_flushes_are_classified() {
        assert_eq!(access(b"GET"), Access::Get);
        assert_eq!(access(b"MGET"), Access::MGet);
        assert_eq!(access(b"HGET"), Access::Read);
        assert_eq!(access(b"FLUSHALL"), Access::All);
        assert_eq!(access(b"HSET"), Access::Write);
        assert_eq!(access(b"SOMEMODULE.CMD"), Access::Write);
    }
}
