//! How a forwarded command touches keys, as far as the local cache cares: GET is served by the
//! cache, other reads leave it alone, writes invalidate the keys they name, and a few commands
//! invalidate everything. Unknown commands count as writes to their first argument, which is
//! right for nearly every Redis write command and merely wasteful otherwise.

use super::positions::command_keys;
use crate::resp::Args;

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
    /// May change every key (FLUSHALL, FLUSHDB, SWAPDB, DEBUG).
    All,
}

/// The access kind of the (upper-cased) command `name`.
pub fn access(name: &[u8]) -> Access {
    match name {
        b"GET" => Access::Get,
        b"MGET" => Access::MGet,
        // DEBUG RELOAD and LOADAOF replace the dataset, POPULATE makes keys it does not name:
        // any DEBUG is taken as changing every key (it is rare, and a flush only costs hits).
        b"FLUSHALL" | b"FLUSHDB" | b"SWAPDB" | b"DEBUG" => Access::All,
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

/// Calls `f` with every key a write command (upper-cased `name`) may change: every key
/// position the command table gives (read or written), or for a command it does not know, the
/// first argument (the third for an unknown XGROUP or OBJECT subcommand).
pub fn write_keys<'a>(name: &[u8], args: &Args<'a>, mut f: impl FnMut(&'a [u8])) {
    let positions = command_keys(name, args);
    if positions.is_known() {
        positions.keys(args).for_each(f);
    } else if let Some(k) = unknown_write_key(name, args) {
        f(k);
    }
}

/// The key a write the command table does not know is taken to change: its first argument
/// (the third for an unknown XGROUP or OBJECT subcommand).
pub fn unknown_write_key<'a>(name: &[u8], args: &Args<'a>) -> Option<&'a [u8]> {
    let at = if matches!(name, b"XGROUP" | b"OBJECT") {
        2
    } else {
        1
    };
    args.get(at)
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
        // More keys announced than given: Redis refuses the script, so nothing is written
        // (the cache drops everything after a script anyway, see `server/cached.rs`).
        assert!(keys("EVAL s 5 a").is_empty());
        // Commands the table does not know write their first argument.
        assert_eq!(keys("SOMEMODULE.SET k v"), ["k"]);
        assert_eq!(keys("XGROUP NOSUCHSUB s g"), ["s"]);
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
