//! corral's own users (`[[users]]`) and the command guard (`[commands]`), compared byte for
//! byte with a Redis configured the same way: the same users made with ACL SETUSER, the same
//! commands renamed with `--rename-command`.

mod common;

use common::{Options, RedisServer, Side, TestProxy, check, connect, make_cached, show, sync_cmd};
use corral::acl::{GuardConfig, UserSpec};

/// sha256("w-pass"), as `ACL SETUSER ... #<hash>` and `password_sha256` take it.
const W_HASH: &str = "11ec02c04cb6bb0e008b47cf24f020219864ae7721911ffa73d62e75ccba7437";

/// (name, password word, rules): made on Redis with ACL SETUSER and given to corral.
fn users() -> Vec<(&'static str, String, &'static str)> {
    vec![
        (
            "reader",
            ">r-pass".into(),
            "+@read -@dangerous ~cache:* &news.*",
        ),
        (
            "writer",
            format!("#{W_HASH}"),
            "+@all -flushall -config|set ~w:* allchannels",
        ),
        ("off", ">o-pass".into(), "off +@all allkeys"),
        // Shard channels are no keys to Redis: only channel rules apply to them.
        ("sharder", ">s-pass".into(), "+@all allchannels resetkeys"),
        ("mute", ">m-pass".into(), "+@all resetchannels allkeys"),
    ]
}

fn specs() -> Vec<UserSpec> {
    users()
        .into_iter()
        .map(|(name, pass, rules)| UserSpec {
            name: name.into(),
            password: pass.strip_prefix('>').map(String::from),
            password_sha256: pass.strip_prefix('#').map(String::from),
            rules: rules.into(),
        })
        .collect()
}

/// Redis with the users (direct), and corral with the same users in front of a plain Redis.
struct Setup {
    direct: RedisServer,
    behind: RedisServer,
    proxy: TestProxy,
}

impl Setup {
    async fn start(direct_args: &[&str], tweak: impl FnOnce(&mut corral::Config)) -> Setup {
        let direct = RedisServer::start_with(direct_args);
        // With a password on Redis the test is about the guard alone.
        let with_users = !direct_args.contains(&"--requirepass");
        for (name, pass, rules) in users().into_iter().filter(|_| with_users) {
            let mut args = vec!["ACL", "SETUSER", name, "on", &pass];
            args.extend(rules.split_whitespace());
            let r = sync_cmd(direct.addr().port(), &args);
            assert_eq!(r, b"+OK\r\n", "{args:?}: {}", show(&r));
        }
        let behind = RedisServer::start();
        let proxy = TestProxy::start_with(&behind.url(), |c| {
            c.users = specs();
            tweak(c);
        })
        .await;
        Setup {
            direct,
            behind,
            proxy,
        }
    }

    fn sides(&self) -> [Side; 2] {
        [
            Side {
                name: "redis",
                entry: self.direct.addr(),
                server: self.direct.addr(),
            },
            Side {
                name: "corral",
                entry: self.proxy.addr,
                server: self.behind.addr(),
            },
        ]
    }
}

const READER: &[&str] = &[
    "A: AUTH reader wrong",
    "A: AUTH nobody x",
    "A: AUTH off o-pass",
    "A: AUTH reader r-pass",
    "A: GET cache:1",
    "A: GET other",
    "A: MGET cache:1 other",
    "A: SET cache:1 v",
    "A: CONFIG GET maxmemory",
    "A: CONFIG NOSUCH",
    "A: KEYS *",
    "A: PING",
    "A: ECHO hi",
    "A: PUBLISH news.1 hi",
    "A: GETT x",
    "A: OBJECT ENCODING cache:1",
    "A: OBJECT ENCODING other",
    "A: SET cache:1",
    // Redis checks arity and subcommands before keys and rights.
    "A: GET other extra",
    "A: OBJECT NOSUCH other",
    // A refused EXEC is an EXECABORT, inside MULTI or not.
    "A: EXEC",
    "A: MULTI",
    "A: RESET",
    "A: GET other",
];

const WRITER: &[&str] = &[
    "A: AUTH writer w-pass",
    "A: SET w:1 v",
    "A: GET w:1",
    "A: SET other v",
    "A: FLUSHALL",
    "A: CONFIG SET maxmemory 0",
    "A: CONFIG GET maxmemory",
    "A: MULTI",
    "A: SET w:2 v",
    "A: SET other v",
    "A: FLUSHALL",
    "A: EXEC",
    "A: GET w:2",
    "A: MULTI",
    "A: SET w:3 v",
    "A: EXEC",
    "A: MULTI",
    "A: GET nope",
    "A: DISCARD",
    "A: EXEC",
    "A: PUBLISH any hi",
    "A: DEL w:1 w:3",
    "A: RPUSH w:l 2 1",
    "A: SORT w:l BY nosort",
    "A: SORT w:l BY w:*",
    "A: SORT w:l LIMIT 0 1 GET w:*",
    "A: SORT_RO w:l BY w:*",
    "A: SORT w:l DESC BY w:x STORE w:m",
    "A: SORT w:l STORE other",
    "A: DEL w:l w:m",
];

const CHANNELS: &[&str] = &[
    "B: HELLO 3 AUTH reader wrong",
    "B: HELLO 3 AUTH reader r-pass",
    "B: SUBSCRIBE other",
    "B: SUBSCRIBE news.1",
    "B: PSUBSCRIBE n*",
    "B: PSUBSCRIBE news.*",
    "B: SSUBSCRIBE news.2",
    "B: UNSUBSCRIBE other",
    "B: RESET",
    "B: AUTH sharder s-pass",
    "B: GET k",
    "B: SPUBLISH news.3 hi",
    "B: SSUBSCRIBE news.3",
    "B: SUNSUBSCRIBE news.3",
    "B: RESET",
    "B: AUTH mute m-pass",
    "B: SPUBLISH news.3 hi",
    "B: SSUBSCRIBE news.3",
    "B: SUNSUBSCRIBE news.3",
    "B: RESET",
];

#[tokio::test]
async fn corral_users_get_redis_replies_and_errors() {
    let s = Setup::start(&[], |_| {}).await;
    for (name, script) in [
        ("reader", READER),
        ("writer", WRITER),
        ("channels", CHANNELS),
    ] {
        for resp3 in [false, true] {
            check(s.sides(), name, script, Options::resp(resp3)).await;
        }
    }
    let [_, corral] = check(
        s.sides(),
        "pipelined",
        WRITER,
        Options {
            mode: common::Mode::Pipelined,
            ..Options::resp(false)
        },
    )
    .await;
    // Not a script that passes because nothing was denied.
    assert!(
        corral[3].bytes.starts_with(b"-NOPERM"),
        "{}",
        show(&corral[3].bytes)
    );
    assert_eq!(
        &corral[11].bytes[..],
        b"-EXECABORT Transaction discarded because of previous errors.\r\n"
    );
    s.proxy.stop().await;
}

#[tokio::test]
async fn a_restricted_user_never_reads_a_denied_key_from_the_cache() {
    let s = Setup::start(&[], |_| {}).await;
    let mut default = connect(s.proxy.addr).await;
    assert_eq!(default.cmd("SET secret v").await, b"+OK\r\n");
    assert_eq!(default.cmd("SET cache:k v").await, b"+OK\r\n");
    make_cached(&mut default, "secret", b"$1\r\nv\r\n").await;
    make_cached(&mut default, "cache:k", b"$1\r\nv\r\n").await;
    let mut reader = connect(s.proxy.addr).await;
    assert_eq!(reader.cmd("AUTH reader r-pass").await, b"+OK\r\n");
    let denied = reader.cmd("GET secret").await;
    assert_eq!(
        show(&denied),
        show(
            b"-NOPERM this user has no permissions to access one of the keys used as arguments\r\n"
        )
    );
    assert_eq!(reader.cmd("GET cache:k").await, b"$1\r\nv\r\n");
    // reader may not run CLIENT INFO (`@connection`): default sees it in CLIENT LIST.
    let list = String::from_utf8_lossy(&default.cmd("CLIENT LIST").await).into_owned();
    assert!(list.contains(" user=reader "), "{list}");
    assert!(
        reader
            .cmd("MGET cache:k secret")
            .await
            .starts_with(b"-NOPERM")
    );
    s.proxy.stop().await;
}

#[tokio::test]
async fn without_passthrough_unknown_users_get_wrongpass_from_corral() {
    let s = Setup::start(&[], |c| c.auth.passthrough = false).await;
    // A user that exists on the Redis behind corral: corral does not ask it.
    let made = sync_cmd(
        s.behind.addr().port(),
        &["ACL", "SETUSER", "bob", "on", ">123", "+@all", "allkeys"],
    );
    assert_eq!(made, b"+OK\r\n");
    let mut c = connect(s.proxy.addr).await;
    let wrongpass = b"-WRONGPASS invalid username-password pair or user is disabled.\r\n";
    assert_eq!(show(&c.cmd("AUTH bob 123").await), show(wrongpass));
    assert_eq!(show(&c.cmd("HELLO 3 AUTH bob 123").await), show(wrongpass));
    assert_eq!(c.cmd("AUTH reader r-pass").await, b"+OK\r\n");
    s.proxy.stop().await;
}

fn guard(deny: &[&str], rename: &[(&str, &str)]) -> GuardConfig {
    GuardConfig {
        deny: deny.iter().map(|s| s.to_string()).collect(),
        rename: rename
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect(),
    }
}

const GUARD: &[&str] = &[
    "A: FLUSHALL",
    "A: flushall async",
    "A: KEYS *",
    "A: CONFIG GET maxmemory",
    "A: CFG_X GET maxmemory",
    "A: cfg_x get maxmemory",
    "A: SET k v",
    "A: MULTI",
    "A: SET k2 v",
    "A: FLUSHALL",
    "A: EXEC",
    "A: GET k2",
    "A: MULTI",
    "A: CFG_X GET maxmemory",
    "A: EXEC",
    "A: DEL k",
];

#[tokio::test]
async fn the_guard_answers_as_rename_command_does() {
    let s = Setup::start(
        &[
            "--rename-command",
            "FLUSHALL",
            "",
            "--rename-command",
            "KEYS",
            "",
            "--rename-command",
            "CONFIG",
            "CFG_X",
        ],
        |c| {
            c.commands = guard(
                &["flushall", "SCRIPT FLUSH"],
                &[("CONFIG", "CFG_X"), ("keys", "")],
            )
        },
    )
    .await;
    for resp3 in [false, true] {
        let [_, corral] = check(s.sides(), "guard", GUARD, Options::resp(resp3)).await;
        let first = &corral[usize::from(resp3)].bytes;
        assert!(
            first.starts_with(b"-ERR unknown command 'FLUSHALL'"),
            "{}",
            show(first)
        );
    }
    // Redis cannot refuse a subcommand; corral's refusal has Redis's unknown-subcommand text.
    let mut redis = connect(s.direct.addr()).await;
    let mut corral = connect(s.proxy.addr).await;
    assert_eq!(
        show(&redis.cmd("SCRIPT FLUSHX").await),
        show(b"-ERR unknown subcommand 'FLUSHX'. Try SCRIPT HELP.\r\n")
    );
    assert_eq!(
        show(&corral.cmd("script flush").await),
        show(b"-ERR unknown subcommand 'flush'. Try SCRIPT HELP.\r\n")
    );
    assert_eq!(corral.cmd("SCRIPT EXISTS abc").await, b"*1\r\n:0\r\n");
    s.proxy.stop().await;
}

#[tokio::test]
async fn the_guard_comes_before_authentication_as_in_redis() {
    let s = Setup::start(
        &["--requirepass", "pw", "--rename-command", "FLUSHALL", ""],
        |c| {
            c.requirepass = corral::config::Secret("pw".into());
            c.commands = guard(&["FLUSHALL"], &[]);
        },
    )
    .await;
    let script = &[
        "A: FLUSHALL",
        "A: GET k",
        // An unknown command is reported as such before authentication, as in Redis, and so
        // are unknown subcommands and wrong numbers of arguments.
        "A: NOSUCHCMD x y",
        "A: GET",
        "A: SET k",
        "A: CLIENT NOSUCH",
        "A: CLIENT",
        "A: CLIENT SETNAME",
        "A: OBJECT NOSUCH k",
        "A: EXEC x",
        // Not authenticated: an EXEC refused so is an EXECABORT too.
        "A: EXEC",
        // HELLO applies its options in order, the name even before authentication.
        "A: HELLO 2 SETNAME early",
        "A: HELLO 2 SETNAME \"a b\" AUTH default pw",
        "A: HELLO 2 AUTH default pw FOO",
        "A: CLIENT GETNAME",
        "A: AUTH pw",
        "A: FLUSHALL",
        "A: GET k",
    ];
    check(s.sides(), "guard-auth", script, Options::resp(false)).await;
    s.proxy.stop().await;
}
