//! Byte-for-byte compatibility: a corpus of commands runs directly against one Redis and
//! through corral against another, identical one, and every reply must be the same bytes, in
//! RESP2 and in RESP3, one command at a time and pipelined.
//!
//! Each run starts two fresh, empty `redis-server`s (A direct, B behind corral) so their
//! keyspaces, scripts and functions evolve identically. The corpus avoids output that differs
//! between two servers for reasons unrelated to corral: times and idle times, client ids and
//! lists, INFO, random picks, and the iteration order of hash tables (Redis seeds its hash
//! function per process, so SMEMBERS of a non-integer set or KEYS * can differ between A and
//! B; integer sets, listpack-encoded hashes and sorted sets are ordered). The corpus runs as a
//! script of one client with the harness's runner (`tests/common/compare.rs`).
//!
//! Stateful commands (transactions, blocking, databases, pub/sub) are compared byte-for-byte
//! in `tests/stateful.rs`. corral answers some commands differently from Redis 7.0 on
//! purpose; they are not in the corpus but checked against corral's exact expected bytes in `corral_specific_replies`:
//! - commands refused with `-ERR '<cmd>' is not supported by corral: <why>` (SYNC, PSYNC,
//!   REPLCONF, CLIENT NO-TOUCH; CLIENT TRACKING is compared in `tests/tracking.rs`);
//! - CLIENT SETINFO (accepted as Redis 7.2 does; 7.0 has no such subcommand);
//! - HELLO's `id` field (a per-connection id; the rest of the HELLO reply is compared);
//! - INFO (corral appends a `# Proxy` section);
//! - RESP3 push frames, which corral drops from its shared upstream connections
//!   (`DEBUG PROTOCOL push`).

mod common;
#[path = "common/tls.rs"]
mod tls_fixtures;

use common::{
    Mode, Options, RedisPair, RedisServer, Side, Step, TestProxy, connect, frames, parse_commands,
    send_until_closed, show, tls_relay, tls_trusting, unused_port,
};

/// Both servers get DEBUG so that `DEBUG PROTOCOL <type>` can produce every RESP3 type
/// (attributes, big numbers, verbatim strings, booleans), which plain commands rarely do.
const SERVER_ARGS: &[&str] = &["--enable-debug-command", "yes"];

// The corpus. One command per line, in the syntax of redis-cli: arguments split on spaces,
// "double quotes" group an argument and understand \r \n \t \" \\ \xHH escapes. A whole
// argument `@name` is replaced by generated data (see `placeholder`). Sections share keys and
// run in order, so later sections see the state earlier ones left.

/// Commands corral answers itself, and their error forms.
const LOCAL: &[&str] = &[
    "PING",
    "PING hello",
    "ping \"with space\"",
    "PiNg \"a\\r\\nb\"",
    "PING a b",
    "ECHO hi",
    "echo \"\"",
    "ECHO @all-bytes",
    "ECHO",
    "ECHO a b",
    "CLIENT GETNAME",
    "CLIENT SETNAME app1",
    "CLIENT GETNAME",
    "client getname",
    "CLIENT SETNAME \"bad name\"",
    "CLIENT SETNAME \"bad\\nname\"",
    "CLIENT SETNAME \"\"",
    "CLIENT GETNAME",
    "CLIENT SETNAME app2",
    "CLIENT GETNAME extra",
    "CLIENT SETNAME",
    "CLIENT SETNAME a b",
    "CLIENT",
    "CLIENT NOSUCH",
    "SELECT 0",
    "select 0",
    "SELECT x",
    "SELECT",
    "SELECT 0 extra",
    "AUTH x",
    "AUTH default anything",
    "AUTH nosuchuser pw",
    "AUTH a b c",
    "AUTH",
    "HELLO 4",
    "HELLO x",
    "HELLO 3 FOO",
    "HELLO 3 SETNAME",
    "HELLO 3 AUTH default",
    "HELLO 3 AUTH nosuchuser pw",
    "HELLO 3 SETNAME \"a b\"",
    "HELLO 3 AUTH \"\" \"\"",
    "CLIENT GETNAME",
    "CLIENT SETNAME \"\\xc3\\xa9\"",
    "CLIENT ID extra",
    "CLIENT INFO extra",
    "SELECT 00",
    "SELECT -0",
    "SELECT \" 0\"",
    "SELECT 1e0",
    "SELECT 99999999999999999999",
    "AUTH \"\" \"\"",
    "RESET extra",
    // Protocol switches (HELLO replies are compared with their `id` blanked out), ending in
    // the protocol of the run (`@proto`).
    "HELLO",
    // Forwarded requests right before a switch must still be answered in the old protocol,
    // also when pipelined with it.
    "CONFIG GET maxmemory",
    "HELLO 3 SETNAME via-hello",
    "CLIENT GETNAME",
    "PING",
    "ECHO resp3",
    "DEBUG PROTOCOL map",
    "HELLO 2",
    "PING",
    "DEBUG PROTOCOL map",
    "HELLO 3 AUTH default anything",
    "DEBUG PROTOCOL double",
    "HELLO @proto",
    "CLIENT GETNAME",
];

const STRINGS: &[&str] = &[
    "SET s1 hello",
    "GET s1",
    "SET s1 world XX GET",
    "SET s1 x NX",
    "GET s1",
    "SET s2 v NX",
    "SET s2 v2 NX GET",
    "SET s3 v EX 100",
    "TTL s3",
    "SET s3 v2 KEEPTTL",
    "TTL s3",
    "GET s3",
    "SET s4 v PX 100000",
    "TTL s4",
    "SET s5 v EXAT 4102444800",
    "EXPIRETIME s5",
    "SET s6 v PXAT 4102444800123",
    "PEXPIRETIME s6",
    "SET s1 v EX 0",
    "SET s1 v EX abc",
    "SET s1 v NX XX",
    "SET s1 v EX 10 KEEPTTL",
    "SET s1",
    "GETEX s3 PERSIST",
    "TTL s3",
    "GETEX s3 EX 50",
    "TTL s3",
    "GETEX nokey",
    "GETEX s3 EX 1 PX 1",
    "GETDEL s2",
    "GETDEL s2",
    "GETSET s1 again",
    "GET s1",
    "SETNX s1 x",
    "SETNX s9 x",
    "SETEX s10 100 v",
    "SETEX s10 -1 v",
    "PSETEX s11 100000 v",
    "APPEND s7 abc",
    "APPEND s7 def",
    "STRLEN s7",
    "STRLEN nokey",
    "GETRANGE s7 1 3",
    "GETRANGE s7 -2 -1",
    "GETRANGE s7 10 20",
    "SUBSTR s7 0 2",
    "SETRANGE s7 2 XY",
    "GET s7",
    "SETRANGE s8 5 pad",
    "GET s8",
    "SETRANGE s8 -1 x",
    "MSET m1 a m2 b m3 c",
    "MGET m1 m2 nokey m3",
    "MGET nokey1 nokey2",
    "MSETNX m1 x m4 y",
    "MSETNX m4 y m5 z",
    "MSET m1",
    "SET n 10",
    "INCR n",
    "DECR n",
    "INCRBY n 5",
    "DECRBY n 3",
    "INCRBY n -100",
    "INCRBYFLOAT n 1.5",
    "INCRBYFLOAT n 1e3",
    "INCRBYFLOAT f 0.1",
    "INCRBYFLOAT f 0.2",
    "INCRBYFLOAT f -5.0e-1",
    "INCRBYFLOAT f 1e400",
    "INCRBYFLOAT n abc",
    "INCRBYFLOAT n",
    "INCR s1",
    "INCRBY n abc",
    "SET big 9223372036854775807",
    "INCR big",
    "DECRBY big 18446744073709551616",
    "SET lcs1 ohmytext",
    "SET lcs2 mynewtext",
    "LCS lcs1 lcs2",
    "LCS lcs1 lcs2 LEN",
    "LCS lcs1 lcs2 IDX",
    "LCS lcs1 lcs2 IDX MINMATCHLEN 4 WITHMATCHLEN",
    "LCS lcs1 lcs2 LEN IDX",
];

const HASHES: &[&str] = &[
    "HSET h f1 v1 f2 v2 f3 3",
    "HGET h f1",
    "HGET h nofield",
    "HGET nokey f",
    "HMGET h f1 nofield f2",
    "HGETALL h",
    "HGETALL nokey",
    "HKEYS h",
    "HVALS h",
    "HLEN h",
    "HEXISTS h f1",
    "HEXISTS h zz",
    "HINCRBY h f3 10",
    "HINCRBY h f1 1",
    "HINCRBYFLOAT h f3 0.5",
    "HINCRBYFLOAT h f3 1e5000",
    "HSETNX h f1 x",
    "HSETNX h f4 v4",
    "HSTRLEN h f1",
    "HDEL h f2 nofield",
    "HMSET h a 1 b 2",
    "HGETALL h",
    "HSCAN h 0",
    "HSCAN h 0 MATCH f*",
    "HRANDFIELD nokey",
    "HSET h f1",
    "HSET h",
];

const LISTS: &[&str] = &[
    "RPUSH l a b c d e a",
    "LPUSH l z",
    "LRANGE l 0 -1",
    "LLEN l",
    "LINDEX l 2",
    "LINDEX l 100",
    "LPOS l a",
    "LPOS l a RANK 2",
    "LPOS l a COUNT 0",
    "LPOS l a RANK -1",
    "LPOS l a RANK -1 COUNT 2 MAXLEN 100",
    "LPOS l nope",
    "LPOS l nope COUNT 0",
    "LPOS l a RANK 0",
    "LSET l 0 y",
    "LSET l 100 x",
    "LSET nokey 0 x",
    "LINSERT l BEFORE c bb",
    "LINSERT l AFTER nope x",
    "LREM l 1 a",
    "LTRIM l 0 4",
    "LRANGE l 0 -1",
    "LRANGE l -100 100",
    "LRANGE l 5 1",
    "LPOP l",
    "RPOP l",
    "LPOP l 2",
    "LPOP l 0",
    "LPOP nokey",
    "LPOP nokey 2",
    "LPOP l -1",
    "RPUSH l2 p q",
    "LMOVE l l2 LEFT RIGHT",
    "LMOVE nokey l2 LEFT LEFT",
    "LMOVE l l2 UP DOWN",
    "RPOPLPUSH l2 l",
    "LRANGE l2 0 -1",
    "LMPOP 2 nokey l2 LEFT COUNT 2",
    "LMPOP 1 nokey RIGHT",
    "LMPOP 0 l LEFT",
    "LMPOP 1 l2 LEFT COUNT 0",
    "LPUSHX nokey a",
    "RPUSHX l x",
    "LRANGE l 0 -1",
    "DEL l l2",
    "LPOP l",
    "RPOP l",
    "LRANGE l 0 -1",
    "LLEN l",
    "LRANGE l a b",
];

/// Integer members (intsets) keep SMEMBERS and SINTER/SUNION/SDIFF ordered; the string set
/// `ss` is only used where order does not show.
const SETS: &[&str] = &[
    "SADD si 3 1 2 5 8",
    "SADD si2 2 3 4 5",
    "SADD ss a b c",
    "SADD ss a",
    "SMEMBERS si",
    "SMEMBERS nokey",
    "SCARD si",
    "SISMEMBER si 3",
    "SISMEMBER si 9",
    "SMISMEMBER si 1 9 2",
    "SMISMEMBER ss a z",
    "SINTER si si2",
    "SUNION si si2",
    "SDIFF si si2",
    "SINTER si nokey",
    "SINTERCARD 2 si si2",
    "SINTERCARD 2 si si2 LIMIT 1",
    "SINTERCARD 2 ss si",
    "SINTERCARD 0 si",
    "SINTERSTORE dst si si2",
    "SMEMBERS dst",
    "SUNIONSTORE dst si si2",
    "SMEMBERS dst",
    "SDIFFSTORE dst si si2",
    "SMEMBERS dst",
    "SMOVE si si2 8",
    "SMOVE si si2 99",
    "SREM si 1 99",
    "SMEMBERS si",
    "SORT ss ALPHA",
    "SORT ss ALPHA DESC LIMIT 0 2",
    "SSCAN si 0",
    "SADD one x",
    "SRANDMEMBER one",
    "SRANDMEMBER one 5",
    "SRANDMEMBER nokey",
    "SPOP si2 100",
    "SPOP nokey",
    "SADD ss",
    "OBJECT ENCODING si",
    "OBJECT ENCODING ss",
];

/// Sorted sets: RESP3 returns scores as doubles and WITHSCORES as pairs.
const ZSETS: &[&str] = &[
    "ZADD z 1 a 2 b 3 c 4 d 5.5 e",
    "ZADD z XX CH 10 a",
    "ZADD z NX 100 a",
    "ZADD z GT CH 1 b",
    "ZADD z INCR 2 c",
    "ZADD z NX XX 1 a",
    "ZADD z abc a",
    "ZADD z 1",
    "ZRANGE z 0 -1",
    "ZRANGE z 0 -1 WITHSCORES",
    "ZRANGE z 0 -1 REV WITHSCORES",
    "ZRANGE z (1 5 BYSCORE WITHSCORES",
    "ZRANGE z +inf -inf BYSCORE REV LIMIT 1 2 WITHSCORES",
    "ZRANGE z -inf +inf BYSCORE LIMIT 0 1",
    "ZRANGE z 0 -1 LIMIT 0 1",
    "ZRANGE nokey 0 -1 WITHSCORES",
    "ZADD zl 0 a 0 b 0 c 0 d",
    "ZRANGE zl [b (d BYLEX",
    "ZRANGE zl + - BYLEX REV LIMIT 0 2",
    "ZRANGE zl x y BYLEX",
    "ZRANGEBYSCORE z -inf +inf WITHSCORES LIMIT 1 2",
    "ZREVRANGEBYSCORE z 5 1 WITHSCORES",
    "ZRANGEBYLEX zl - +",
    "ZREVRANGEBYLEX zl + [b",
    "ZREVRANGE z 0 1 WITHSCORES",
    "ZRANK z c",
    "ZRANK z nope",
    "ZREVRANK z c",
    "ZRANK z c WITHSCORE",
    "ZSCORE z e",
    "ZSCORE z nope",
    "ZSCORE nokey a",
    "ZMSCORE z a nope e",
    "ZMSCORE nokey a",
    "ZCARD z",
    "ZCOUNT z 2 5",
    "ZLEXCOUNT zl - +",
    "ZINCRBY z 0.1 a",
    "ZINCRBY z 1e2 b",
    "ZINCRBY z abc a",
    "ZINCRBY z -inf d",
    "ZADD zf 0.1 x 1e-7 y 3.0000000000000004 w 12345678901234567890 v inf i -inf ni",
    "ZRANGE zf 0 -1 WITHSCORES",
    "ZSCORE zf w",
    "ZADD z2 1 b 2 c 3 x",
    "ZINTER 2 z z2 WITHSCORES",
    "ZINTER 2 z z2 WEIGHTS 2 3 AGGREGATE MAX WITHSCORES",
    "ZUNION 2 z z2 WITHSCORES",
    "ZUNION 2 z z2 AGGREGATE MIN",
    "ZDIFF 2 z z2 WITHSCORES",
    "ZINTER 0 z",
    "ZINTERSTORE zo 2 z z2",
    "ZUNIONSTORE zo 2 z z2 WEIGHTS 1 0.5",
    "ZRANGE zo 0 -1 WITHSCORES",
    "ZDIFFSTORE zo 2 z z2",
    "ZINTERCARD 2 z z2",
    "ZINTERCARD 2 z z2 LIMIT 1",
    "ZRANGESTORE zs z 0 1",
    "ZRANGESTORE zs z (1 +inf BYSCORE LIMIT 0 2",
    "ZRANGE zs 0 -1 WITHSCORES",
    "ZPOPMIN z",
    "ZPOPMIN z 2",
    "ZPOPMAX z",
    "ZPOPMAX z 10",
    "ZPOPMIN nokey",
    "ZPOPMIN nokey 2",
    "ZMPOP 2 nokey zo MIN COUNT 2",
    "ZMPOP 1 nokey MAX",
    "ZREM zl a nope",
    "ZREMRANGEBYLEX zl [b [b",
    "ZREMRANGEBYRANK zf 0 1",
    "ZREMRANGEBYSCORE zf -inf 1",
    "ZRANGE zf 0 -1 WITHSCORES",
    "ZSCAN zl 0",
    "ZRANDMEMBER nokey",
];

/// Streams with explicit IDs only; no time-bearing forms (XPENDING's extended form reports
/// idle times, XINFO CONSUMERS and XINFO STREAM FULL report times).
const STREAMS: &[&str] = &[
    "XADD st 1-1 f1 v1",
    "XADD st 1-2 f2 v2 f3 v3",
    "XADD st 2-0 a 1",
    "XADD st 1-0 x y",
    "XADD st 3-* b 2",
    "XADD st NOMKSTREAM 4-0 c 3",
    "XADD nostream NOMKSTREAM 1-1 a b",
    "XADD st MAXLEN 10 5-0 d 4",
    "XADD st 6-0 e",
    "XADD st",
    "XLEN st",
    "XLEN nokey",
    "XRANGE st - +",
    "XRANGE st 1 2 COUNT 2",
    "XRANGE st (1-1 + COUNT 2",
    "XRANGE st a b",
    "XREVRANGE st + - COUNT 2",
    "XREVRANGE st 2 1",
    "XDEL st 1-2 9-9",
    "XTRIM st MAXLEN 4",
    "XTRIM st MINID 2-0",
    "XRANGE st - +",
    "XGROUP CREATE st g1 0",
    "XGROUP CREATE st g1 0",
    "XGROUP CREATE nostream g1 $",
    "XGROUP CREATE st2 g2 $ MKSTREAM",
    "XGROUP CREATECONSUMER st g1 c9",
    "XREADGROUP GROUP g1 c1 COUNT 2 STREAMS st >",
    "XREADGROUP GROUP g1 c2 STREAMS st >",
    "XREADGROUP GROUP g1 c1 STREAMS st 0",
    "XREADGROUP GROUP g1 c1 STREAMS st >",
    "XREADGROUP GROUP nogroup c1 STREAMS st >",
    "XACK st g1 2-0",
    "XACK st g1 2-0",
    "XPENDING st g1",
    "XPENDING st g1 - + 10 c9",
    "XCLAIM st g1 c3 0 3-0",
    "XCLAIM st g1 c3 0 3-0 JUSTID",
    "XAUTOCLAIM st g1 c4 0 0-0 COUNT 10",
    "XAUTOCLAIM st g1 c4 0 0-0 COUNT 1 JUSTID",
    "XPENDING st g1",
    "XINFO STREAM st",
    "XINFO GROUPS st",
    "XINFO NOSUCH st",
    "XGROUP SETID st g1 0",
    "XGROUP DELCONSUMER st g1 c9",
    "XGROUP DESTROY st2 g2",
    "XREAD COUNT 2 STREAMS st 0",
    "XREAD STREAMS st nostream 0 0",
    "XREAD STREAMS st 9-9",
];

const HLL_AND_BITS: &[&str] = &[
    "PFADD hll a b c d",
    "PFADD hll a",
    "PFCOUNT hll",
    "PFADD hll2 c d e f",
    "PFCOUNT hll hll2",
    "PFMERGE hll3 hll hll2",
    "PFCOUNT hll3",
    "GET hll",
    "PFCOUNT s1",
    "SETBIT bm 7 1",
    "SETBIT bm 100 1",
    "GETBIT bm 7",
    "GETBIT bm 8",
    "SETBIT bm 7 2",
    "BITCOUNT bm",
    "BITCOUNT bm 0 0",
    "BITCOUNT bm 0 7 BIT",
    "BITPOS bm 1",
    "BITPOS bm 0",
    "BITPOS bm 1 1 -1",
    "BITPOS bm 1 8 100 BIT",
    "SET bk1 foobar",
    "SET bk2 abcdef",
    "BITOP AND bd bk1 bk2",
    "GET bd",
    "BITOP OR bd bk1 bk2",
    "GET bd",
    "BITOP XOR bd bk1 bk2",
    "GET bd",
    "BITOP NOT bd bk1",
    "GET bd",
    "BITOP NOT bd bk1 bk2",
    "BITFIELD bf SET u8 0 255 GET u8 0 INCRBY u8 0 10",
    "BITFIELD bf OVERFLOW SAT INCRBY i8 8 200 OVERFLOW FAIL INCRBY u4 100 20",
    "BITFIELD_RO bf GET u8 0 GET i4 4",
    "BITFIELD bf GET u99 0",
];

const GEO: &[&str] = &[
    "GEOADD geo 13.361389 38.115556 Palermo 15.087269 37.502669 Catania",
    "GEOADD geo 2.349014 48.864716 Paris",
    "GEOADD geo 200 100 bad",
    "GEODIST geo Palermo Catania",
    "GEODIST geo Palermo Catania km",
    "GEODIST geo Palermo nope",
    "GEOPOS geo Palermo nope Catania",
    "GEOHASH geo Palermo Catania nope",
    "GEOSEARCH geo FROMLONLAT 15 37 BYRADIUS 200 km ASC",
    "GEOSEARCH geo FROMMEMBER Palermo BYBOX 400 400 km ASC WITHCOORD WITHDIST WITHHASH",
    "GEOSEARCH geo FROMLONLAT 15 37 BYRADIUS 200 km COUNT 1 DESC WITHDIST",
    "GEOSEARCH geo FROMLONLAT 15 37 BYRADIUS 1 km",
    "GEOSEARCHSTORE geodst geo FROMLONLAT 15 37 BYRADIUS 200 km STOREDIST",
    "ZRANGE geodst 0 -1 WITHSCORES",
    "GEORADIUS geo 15 37 200 km WITHDIST ASC",
    "GEORADIUSBYMEMBER geo Palermo 1000 km WITHCOORD ASC COUNT 2",
];

const KEYSPACE: &[&str] = &[
    "EXISTS s1 m1 nokey s1",
    "TYPE s1",
    "TYPE h",
    "TYPE si",
    "TYPE z",
    "TYPE st",
    "TYPE nokey",
    "DEL m1 m2 nokey",
    "UNLINK m3 nokey",
    "RENAME m4 m4r",
    "RENAME nokey x",
    "RENAMENX m4r m5",
    "RENAMENX m4r m6",
    "COPY m6 m7",
    "COPY m6 m7",
    "COPY m6 m7 REPLACE",
    "GET m7",
    "COPY nokey m8",
    "SET e1 v",
    "EXPIRE e1 1000 NX",
    "EXPIRE e1 2000 NX",
    "EXPIRE e1 500 GT",
    "EXPIRE e1 2000 GT",
    "EXPIRE e1 3000 LT",
    "EXPIRE e1 1500 LT",
    "EXPIRE e1 100 XX",
    "EXPIRE nokey 100 XX",
    "EXPIRE e1 100 NX XX",
    "EXPIRE e1 abc",
    "TTL e1",
    "PEXPIRE e1 200000 GT",
    "TTL e1",
    "PERSIST e1",
    "PERSIST e1",
    "TTL e1",
    "PTTL e1",
    "TTL nokey",
    "PTTL nokey",
    "EXPIREAT e1 4102444800",
    "EXPIRETIME e1",
    "PEXPIRETIME e1",
    "EXPIREAT e1 4102444700 GT",
    "PEXPIREAT e1 4102444800500",
    "PEXPIRETIME e1",
    "EXPIRETIME s1",
    "EXPIRETIME nokey",
    "EXPIRE e1 0",
    "EXISTS e1",
    "OBJECT ENCODING s1",
    "OBJECT ENCODING n",
    "OBJECT ENCODING h",
    "OBJECT ENCODING z",
    "OBJECT ENCODING st",
    "OBJECT ENCODING nokey",
    "OBJECT FREQ s1",
    "OBJECT NOSUCH",
    "DUMP s1",
    "DUMP h",
    "DUMP z",
    "DUMP nokey",
    "KEYS s1",
    "KEYS nomatch*",
    "RPUSH sortl 3 1 2",
    "MSET w_1 3 w_2 2 w_3 1 o_1 one o_2 two o_3 three",
    "SORT sortl",
    "SORT sortl DESC LIMIT 0 2",
    "SORT sortl BY w_* GET o_* GET #",
    "SORT_RO sortl BY nosort",
    "SORT ss",
    "SORT sortl STORE sorted",
    "LRANGE sorted 0 -1",
    "TOUCH s1 nokey",
    "MEMORY USAGE s1",
    "DBSIZE",
    "CONFIG GET maxmemory-policy",
    "CONFIG SET nosuch 1",
    "COMMAND COUNT",
    "COMMAND INFO get",
    "COMMAND DOCS lpos",
    "COMMAND GETKEYS SET a b",
    "COMMAND GETKEYSANDFLAGS LMOVE a b LEFT RIGHT",
];

/// Scripts and functions. Script replies go through Lua's type conversions, in both
/// protocols (`redis.setresp(3)` lets a script see and return RESP3 types).
const SCRIPTING: &[&str] = &[
    "EVAL \"return 1\" 0",
    "EVAL \"return 'str'\" 0",
    "EVAL \"return {1,'two',{3,'four'},-5}\" 0",
    "EVAL \"return {}\" 0",
    "EVAL \"return nil\" 0",
    "EVAL \"return false\" 0",
    "EVAL \"return true\" 0",
    "EVAL \"return 3.99\" 0",
    "EVAL \"return {ok='fine'}\" 0",
    "EVAL \"return {err='ERR custom'}\" 0",
    "EVAL \"return redis.error_reply('MYERR bad thing')\" 0",
    "EVAL \"return redis.status_reply('DONE')\" 0",
    "EVAL \"return {double=3.5}\" 0",
    "EVAL \"return {big_number='12345678901234567890'}\" 0",
    "EVAL \"return {map={a=1}}\" 0",
    "EVAL \"return {set={a=true}}\" 0",
    "EVAL \"return {verbatim_string={format='txt',string='hi'}}\" 0",
    "EVAL \"return redis.call('GET', KEYS[1])\" 1 s1",
    "EVAL \"return redis.call('GET', KEYS[1])\" 1 nokey",
    "EVAL \"return redis.call('HGETALL', KEYS[1])\" 1 h",
    "EVAL \"redis.setresp(3); return redis.call('HGETALL', KEYS[1])\" 1 h",
    "EVAL \"redis.setresp(3); return redis.call('ZRANGE', KEYS[1], 0, -1, 'WITHSCORES')\" 1 zo",
    "EVAL \"redis.setresp(3); return redis.call('GET', 'nokey')\" 0",
    "EVAL \"redis.setresp(3); return redis.call('SISMEMBER', 'si', 3) == 1\" 0",
    "EVAL \"return ARGV[1]..KEYS[1]\" 1 k v",
    "EVAL \"return redis.call('INCR', KEYS[1])\" 1 s1",
    "EVAL \"return redis.pcall('INCR', KEYS[1])\" 1 s1",
    "EVAL \"return redis.call('nosuch')\" 0",
    "EVAL \"return foo\" 0",
    "EVAL \"syntax error here\" 0",
    "EVAL \"error('boom')\" 0",
    "EVAL \"return 1\"",
    "EVAL \"return 1\" x",
    "EVAL \"return 1\" 5 a",
    "SCRIPT LOAD \"return 'cached'\"",
    "EVALSHA 952f49ffc8f7b098d8ab5da45d3164ca36ed18b1 0",
    "EVALSHA ffffffffffffffffffffffffffffffffffffffff 0",
    "SCRIPT EXISTS 952f49ffc8f7b098d8ab5da45d3164ca36ed18b1 ffffffffffffffffffffffffffffffffffffffff",
    "EVAL_RO \"return redis.call('GET', KEYS[1])\" 1 s1",
    "EVAL_RO \"return redis.call('SET', KEYS[1], 'x')\" 1 s1",
    "EVALSHA_RO 952f49ffc8f7b098d8ab5da45d3164ca36ed18b1 0",
    "SCRIPT NOSUCH",
    "FUNCTION LOAD \"#!lua name=corrallib\\n\
     redis.register_function('echo1', function(keys, args) return args[1] end)\\n\
     redis.register_function{function_name='get1', callback=function(keys, args) \
     return redis.call('GET', keys[1]) end, flags={'no-writes'}}\\n\
     redis.register_function('tbl', function(keys, args) return {1, {'x', false}, 'y'} end)\"",
    "FUNCTION LOAD \"#!lua name=corrallib\\nredis.register_function('echo1', function() end)\"",
    "FUNCTION LOAD \"#!lua name=badlib\\nthis is not lua\"",
    "FCALL echo1 0 hi",
    "FCALL get1 1 s1",
    "FCALL tbl 0",
    "FCALL_RO get1 1 s1",
    "FCALL_RO echo1 0 hi",
    "FCALL nosuch 0",
    "FCALL echo1 x",
    // A one-function library: FUNCTION LIST orders a library's functions by hash table.
    "FUNCTION LOAD \"#!lua name=onefn\\nredis.register_function('one', function() return 1 end)\"",
    "FUNCTION LIST LIBRARYNAME onefn",
    "FUNCTION LIST LIBRARYNAME onefn WITHCODE",
    "FCALL one 0",
];

/// Errors of every kind Redis reports, forwarded as-is.
const ERRORS: &[&str] = &[
    "GET h",
    "LPUSH s1 x",
    "HGET s1 f",
    "ZADD h 1 a",
    "SADD z x",
    "XADD h 1-1 a b",
    "GET",
    "SET k",
    "LRANGE l 0",
    "HGETALL",
    "NOSUCHCMD a b",
    "FOO",
    "CONFIG NOSUCH",
    "MEMORY NOSUCH",
    "LRANGE l a b",
    "GETRANGE s1 x 1",
    "INCRBY n 99999999999999999999",
    "SET k v EX 99999999999999999999",
];

/// Binary-safe keys and values, and large values and replies.
const BINARY: &[&str] = &[
    "SET bin @all-bytes",
    "GET bin",
    "STRLEN bin",
    "GETRANGE bin 250 -1",
    "SET crlf \"a\\r\\nb\\r\\n\"",
    "GET crlf",
    "SET \"\" empty-key",
    "GET \"\"",
    "SET emptyval \"\"",
    "GET emptyval",
    "STRLEN emptyval",
    "SET \"key with space\" v",
    "GET \"key with space\"",
    "HSET hb \"f\\r\\n\" \"\\x00\\xff\" \"\" \"\"",
    "HGETALL hb",
    "RPUSH lb \"\\r\\n\" \"\\n\" \"$-1\\r\\n\" \"*2\\r\\n\"",
    "LRANGE lb 0 -1",
    "SET large @1mb",
    "GET large",
    "STRLEN large",
    "APPEND large tail",
    "GETRANGE large -4 -1",
    "RPUSH biglist @10k-items",
    "LRANGE biglist 0 -1",
    "LLEN biglist",
    "OBJECT ENCODING biglist",
];

/// Every RESP3 type (and RESP2's renderings of them) via `DEBUG PROTOCOL`; `push` is left out
/// since corral drops push frames on purpose (see `corral_specific_replies`).
const RESP_TYPES: &[&str] = &[
    "DEBUG PROTOCOL string",
    "DEBUG PROTOCOL integer",
    "DEBUG PROTOCOL double",
    "DEBUG PROTOCOL bignum",
    "DEBUG PROTOCOL null",
    "DEBUG PROTOCOL array",
    "DEBUG PROTOCOL set",
    "DEBUG PROTOCOL map",
    "DEBUG PROTOCOL attrib",
    "DEBUG PROTOCOL true",
    "DEBUG PROTOCOL false",
    "DEBUG PROTOCOL verbatim",
    "DEBUG PROTOCOL nosuch",
];

/// The end of a session: RESET returns to RESP2 (so a RESP3 session is then checked in RESP2
/// too), and QUIT closes the connection.
const CLOSING: &[&str] = &[
    "HGETALL h",
    "RESET",
    "CLIENT GETNAME",
    "HGETALL h",
    "ZRANGE z2 0 -1 WITHSCORES",
    "PING",
    "QUIT",
];

const SECTIONS: &[&[&str]] = &[
    LOCAL,
    STRINGS,
    HASHES,
    LISTS,
    SETS,
    ZSETS,
    STREAMS,
    HLL_AND_BITS,
    GEO,
    KEYSPACE,
    SCRIPTING,
    ERRORS,
    BINARY,
    RESP_TYPES,
    CLOSING,
];

/// The corpus, as argument vectors, for a run in RESP3 or RESP2.
fn corpus(resp3: bool) -> Vec<Vec<Vec<u8>>> {
    let proto = if resp3 { "3" } else { "2" };
    SECTIONS
        .iter()
        .flat_map(|s| s.iter())
        .map(|line| parse_line(&line.replace("@proto", proto)))
        .collect()
}

/// Generated arguments; one placeholder can stand for many arguments.
fn placeholder(name: &str) -> Vec<Vec<u8>> {
    match name {
        "@all-bytes" => vec![(0..=255u8).collect()],
        "@1mb" => vec![(0..1024 * 1024).map(|i| b'a' + (i % 26) as u8).collect()],
        "@10k-items" => (0..10_000)
            .map(|i| format!("item-{i}").into_bytes())
            .collect(),
        _ => panic!("unknown placeholder {name}"),
    }
}

/// Splits a corpus line into arguments (see the corpus comment for the syntax).
fn parse_line(line: &str) -> Vec<Vec<u8>> {
    let mut cmds = parse_commands(line);
    assert_eq!(cmds.len(), 1, "one command per corpus line: {line}");
    let args = cmds.remove(0).into_iter();
    args.flat_map(|a| match a.strip_prefix(b"@") {
        Some(_) => placeholder(&String::from_utf8_lossy(&a)),
        None => vec![a],
    })
    .collect()
}

/// Redis A directly, and Redis B behind corral.
async fn start() -> RedisPair {
    RedisPair::start_servers_with(SERVER_ARGS, |_| {}).await
}

/// Runs the corpus on both sides with the harness's runner, client A's commands one at a
/// time or all in one write, then checks that both closed the connection after the final
/// QUIT. `resp3` starts with `HELLO 3`, as its own request (`mode` one by one) or the first
/// of the single write (pipelined: corral then sees many requests per read, local and
/// forwarded mixed, and protocol switches in the middle of a batch).
async fn run_corpus(resp3: bool, mode: Mode) {
    let pair = start().await;
    run_corpus_on(pair.sides(), resp3, mode).await;
    pair.proxy.stop().await;
}

/// [`run_corpus`] on given sides.
async fn run_corpus_on(sides: [Side; 2], resp3: bool, mode: Mode) {
    let corpus = corpus(resp3);
    assert!(
        corpus.len() >= 300,
        "corpus too small: {} commands",
        corpus.len()
    );
    let mut steps = Vec::new();
    let hello_in_script = resp3 && mode == Mode::Pipelined;
    if hello_in_script {
        steps.push(Step::call('A', parse_line("HELLO 3")));
    }
    steps.extend(corpus.into_iter().map(|args| Step::call('A', args)));
    steps.push(Step::parse("A: !closed"));
    let opts = Options {
        mode,
        ..Options::resp(resp3 && !hello_in_script)
    };
    let [direct, _] = common::compare(sides, "corpus", &steps, opts).await;
    if resp3 {
        let hello = &direct[0].bytes;
        assert!(
            hello.starts_with(b"%7\r\n"),
            "HELLO 3 direct: {}",
            show(hello)
        );
    }
    // The corpus ends with QUIT: Redis (and so corral) closed with nothing more to read.
    let end = &direct.last().expect("replies").bytes;
    assert_eq!(show(end), show(b"<closed>"), "redis after QUIT");
}

/// The corpus with TLS on both sides of corral: its clients come in through its TLS listener,
/// and it forwards to a TLS-only Redis (`rediss://`). The harness's plain clients reach both
/// TLS ends through plain-to-TLS relays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corpus_over_tls_on_both_sides_matches_redis_byte_for_byte() {
    let pki = tls_fixtures::Pki::new();
    let cert = pki.issue("both", &["127.0.0.1"]);
    let mut args: Vec<String> = SERVER_ARGS.iter().map(|a| a.to_string()).collect();
    for (flag, file) in [
        ("--tls-cert-file", &cert.cert),
        ("--tls-key-file", &cert.key),
        ("--tls-ca-cert-file", &pki.ca_file()),
    ] {
        args.push(flag.to_string());
        args.push(file.display().to_string());
    }
    args.extend(["--tls-auth-clients".to_string(), "no".to_string()]);
    let behind = tls_fixtures::TlsRedis::start_with(&args);
    let direct = RedisServer::start_with(SERVER_ARGS);
    let tls_listen = std::net::SocketAddr::from(([127, 0, 0, 1], unused_port()));
    let ca = pki.ca_file();
    let url = format!("rediss://127.0.0.1:{}", behind.port);
    let proxy = TestProxy::start_with(&url, |c| {
        c.upstream.tls = tls_trusting(&ca, None);
        c.tls.listen = tls_listen.to_string();
        c.tls.cert_file = Some(cert.cert.clone());
        c.tls.key_file = Some(cert.key.clone());
    })
    .await;
    let behind_addr = std::net::SocketAddr::from(([127, 0, 0, 1], behind.port));
    let sides = [
        Side {
            name: "redis",
            entry: direct.addr(),
            server: direct.addr(),
        },
        Side {
            name: "corral",
            entry: tls_relay(tls_listen, tls_trusting(&ca, None)).await,
            server: tls_relay(behind_addr, tls_trusting(&ca, None)).await,
        },
    ];
    for resp3 in [false, true] {
        run_corpus_on(sides, resp3, Mode::Pipelined).await;
    }
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corpus_resp2_matches_redis_byte_for_byte() {
    run_corpus(false, Mode::OneByOne).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corpus_resp3_matches_redis_byte_for_byte() {
    run_corpus(true, Mode::OneByOne).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_corpus_resp2_matches_redis_byte_for_byte() {
    run_corpus(false, Mode::Pipelined).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_corpus_resp3_matches_redis_byte_for_byte() {
    run_corpus(true, Mode::Pipelined).await;
}

/// Inline commands (what telnet or `redis-cli` in a pipe sends), parsed by corral's own
/// parser: quoting, escapes, blank lines and runs of spaces, ending with a protocol error that
/// closes the connection.
const INLINE: &[u8] = b"PING\r\n\
ping \"hello world\"\r\n\
SET inl \"a b\\r\\nc\"\r\n\
GET inl\r\n\
SET inl2 'single \"quoted\"'\r\n\
GET inl2\r\n\
ECHO \"\\x41\\x42\\t\\\\\"\r\n\
\r\n\
   GET   inl   \r\n\
GET inl\n\
MGET inl nokey inl2\r\n\
SET \"\" \"it's\"\r\n\
GET \"\"\r\n\
NOSUCHCMD \"x y\" z\r\n\
SET bad \"unbalanced\r\n\
PING\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_commands_match_redis() {
    let pair = start().await;
    let (d, p) = tokio::join!(
        send_until_closed(pair.direct, INLINE),
        send_until_closed(pair.proxy.addr, INLINE)
    );
    let (df, pf) = (frames(&d), frames(&p));
    for (i, (a, b)) in df.iter().zip(&pf).enumerate() {
        assert_eq!(show(b), show(a), "inline reply #{i} (corral vs redis)");
    }
    assert_eq!(pf.len(), df.len(), "reply count (corral vs redis)");
    pair.proxy.stop().await;
}

// Why corral refuses a command, exactly as it says it (copied from src/commands/table.rs on
// purpose: a change of wording is a change clients see).
const REPLICATION: &str = "replication commands cannot go through a proxy";
const CONN_STATE: &str = "it would change a shared upstream connection";

/// Commands corral refuses: (command line, name in the error, reason).
const REFUSED: &[(&str, &str, &str)] = &[
    ("SYNC", "sync", REPLICATION),
    ("PSYNC ? -1", "psync", REPLICATION),
    ("REPLCONF listening-port 1", "replconf", REPLICATION),
    ("CLIENT NO-TOUCH ON", "client|no-touch", CONN_STATE),
];

/// corral's other replies that differ from Redis 7.0 on purpose: (command line, exact reply).
const OWN_REPLIES: &[(&str, &str)] = &[
    // Redis 7.0 has no CLIENT SETINFO; corral accepts it as 7.2 does.
    ("CLIENT SETINFO lib-name corral-test", "+OK\r\n"),
    ("CLIENT SETINFO LIB-VER 1.0", "+OK\r\n"),
    (
        "CLIENT SETINFO foo bar",
        "-ERR Unrecognized option 'foo'\r\n",
    ),
    (
        "CLIENT SETINFO lib-name",
        "-ERR wrong number of arguments for 'client|setinfo' command\r\n",
    ),
    // Nothing above reached Redis or disturbed the shared connection.
    ("EXISTS k l z", ":0\r\n"),
    ("PING", "+PONG\r\n"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corral_specific_replies() {
    let pair = start().await;
    for resp3 in [false, true] {
        let proto = if resp3 { "RESP3" } else { "RESP2" };
        let (mut direct, mut proxied) =
            (connect(pair.direct).await, connect(pair.proxy.addr).await);
        if resp3 {
            direct.request(&[b"HELLO", b"3"]).await;
            proxied.request(&[b"HELLO", b"3"]).await;
        }
        let refused = REFUSED.iter().map(|(line, name, why)| {
            let want = format!("-ERR '{name}' is not supported by corral: {why}\r\n");
            (*line, want)
        });
        let own = OWN_REPLIES
            .iter()
            .map(|(line, want)| (*line, want.to_string()));
        for (line, want) in refused.chain(own) {
            let args = parse_line(line);
            let argv: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
            let got = proxied.request(&argv).await;
            assert_eq!(
                show(&got),
                show(want.as_bytes()),
                "{proto} `{line}` through corral"
            );
        }

        // INFO: the upstream's sections, plus corral's own when asked for all or for `proxy`.
        let d = direct.request(&[b"INFO", b"keyspace"]).await;
        let p = proxied.request(&[b"INFO", b"keyspace"]).await;
        assert_eq!(show(&p), show(&d), "{proto} INFO keyspace");
        let info = proxied.request(&[b"INFO"]).await;
        let text = String::from_utf8_lossy(&info);
        assert!(
            text.contains("# Server\r\n") && text.contains("\r\n# Proxy\r\ncorral_version:"),
            "{proto} INFO through corral: {}",
            show(&info)
        );
        // corral's fields have names of their own: a client that reads INFO into a map
        // gets Redis's `connected_clients`, `uptime_in_seconds`..., not corral's.
        let everything = proxied.request(&[b"INFO", b"everything"]).await;
        let text = String::from_utf8_lossy(&everything);
        let (redis_part, corral_part) = text
            .split_once("# Proxy\r\n")
            .unwrap_or_else(|| panic!("{proto}: no # Proxy in INFO everything"));
        let names = |part: &str| -> Vec<String> {
            part.lines()
                .filter_map(|l| l.split_once(':').map(|(k, _)| k.to_string()))
                .filter(|k| !k.starts_with('#') && !k.is_empty())
                .collect()
        };
        let redis_names = names(redis_part);
        assert!(redis_names.iter().any(|k| k == "connected_clients"));
        let corral_names = names(corral_part);
        for want in [
            "proxy_connected_clients",
            "proxy_uptime_in_seconds",
            "cache_enabled",
        ] {
            assert!(corral_names.iter().any(|k| k == want), "{proto}: no {want}");
        }
        for k in &corral_names {
            assert!(
                !redis_names.contains(k),
                "{proto}: corral's INFO field {k} shadows Redis's"
            );
        }

        // corral drops RESP3 push frames from its shared connections; the reply that follows
        // the push is delivered.
        if resp3 {
            let push: &[&[u8]] = &[b"DEBUG", b"PROTOCOL", b"push"];
            let reply = b"$40\r\nSome real reply following the push reply\r\n";
            let d = direct.request(push).await;
            assert_eq!(
                show(&d),
                show(b">2\r\n$16\r\nserver-cpu-usage\r\n:42\r\n"),
                "redis sends the push first"
            );
            assert_eq!(show(&direct.read_reply().await), show(reply));
            let p = proxied.request(push).await;
            assert_eq!(show(&p), show(reply), "DEBUG PROTOCOL push through corral");
        }
    }
    pair.proxy.stop().await;
}
