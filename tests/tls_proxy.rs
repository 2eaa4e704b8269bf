//! corral with TLS on both sides, against real servers: a TLS-only redis-server upstream
//! (`rediss://`) for shared, dedicated, tracking and pub/sub connections, mutual TLS, wrong
//! CA and name reported clearly; corral's own TLS listener beside the plain one (redis-cli
//! `--tls`, client certificates), its certificates reloaded with clients kept; and an upstream
//! password change reported in INFO and `/healthz`, then fixed by a reload.

mod common;
#[path = "common/tls.rs"]
mod tls_fixtures;

use std::net::SocketAddr;
use std::time::Duration;

use common::{
    Deadline, RawClient, RedisServer, TestProxy, bulk, encode, get_until, http_get, info_field,
    make_cached, poll_until, reply_text, resp_len, show, tls_dial, tls_trusting, unused_port,
};
use corral::Config;
use corral::tls::Stream;
use tls_fixtures::{CertFiles, Pki, TlsRedis, redis_cli_tls};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const WAIT: Duration = Duration::from_secs(10);

fn rediss(redis: &TlsRedis) -> String {
    format!("rediss://127.0.0.1:{}", redis.port)
}

/// Sends one request on a TLS stream and reads one whole reply.
async fn request(s: &mut Stream, args: &[&[u8]]) -> Vec<u8> {
    s.write_all(&encode(args)).await.expect("write");
    s.flush().await.expect("flush");
    let mut buf = Vec::new();
    loop {
        if let Some(n) = resp_len(&buf) {
            buf.truncate(n);
            return buf;
        }
        let n = tokio::time::timeout(WAIT, s.read_buf(&mut buf))
            .await
            .expect("reply in time")
            .expect("read");
        assert!(n > 0, "closed; partial {}", show(&buf));
    }
}

/// Waits until `/healthz` answers `status` with a body containing `part`; returns the body.
async fn healthz_until(proxy: &TestProxy, status: u16, part: &str) -> String {
    let admin = proxy.admin.expect("admin");
    poll_until(
        WAIT,
        &format!("/healthz {status} with {part:?}"),
        || async {
            let (code, body) = http_get(admin, "/healthz").await.ok()?;
            (code == status && body.contains(part)).then_some(body)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_dedicated_tracking_and_pubsub_over_a_tls_upstream() {
    let pki = Pki::new();
    let redis = TlsRedis::start(&pki, &pki.issue("redis", &["127.0.0.1"]), false);
    let ca = pki.ca_file();
    let proxy = TestProxy::start_with(&rediss(&redis), |c| {
        c.upstream.tls = tls_trusting(&ca, None);
    })
    .await;
    let mut c = RawClient::connect(proxy.addr).await.expect("connect");
    assert_eq!(info_field(&mut c, "upstream_tls").await, "1");
    // Shared connections.
    assert_eq!(c.cmd("SET k v1").await, b"+OK\r\n");
    assert_eq!(c.cmd("GET k").await, bulk("v1"));
    // A transaction (dedicated connection).
    assert_eq!(c.cmd("MULTI").await, b"+OK\r\n");
    assert_eq!(c.cmd("INCR n").await, b"+QUEUED\r\n");
    assert_eq!(c.cmd("EXEC").await, b"*1\r\n:1\r\n");
    // A blocking command, woken by another client.
    let mut b = RawClient::connect(proxy.addr).await.expect("connect");
    b.send(&encode(&[b"BLPOP", b"list", b"10"])).await;
    poll_until(WAIT, "BLPOP to block on Redis", || async {
        let mut d = tls_dial(
            SocketAddr::from(([127, 0, 0, 1], redis.port)),
            &tls_trusting(&ca, None),
        )
        .await
        .ok()?;
        let info = reply_text(&request(&mut d, &[b"INFO", b"clients"]).await);
        info.contains("blocked_clients:1").then_some(())
    })
    .await;
    assert_eq!(c.cmd("RPUSH list x").await, b":1\r\n");
    assert_eq!(b.read_reply().await, b"*2\r\n$4\r\nlist\r\n$1\r\nx\r\n");
    // Tracking: a cached key, then a write made on Redis directly (over TLS) invalidates it.
    make_cached(&mut c, "k", &bulk("v1")).await;
    let upstream = SocketAddr::from(([127, 0, 0, 1], redis.port));
    let mut direct = tls_dial(upstream, &tls_trusting(&ca, None))
        .await
        .expect("direct");
    assert_eq!(
        request(&mut direct, &[b"SET", b"k", b"v2"]).await,
        b"+OK\r\n"
    );
    get_until(&mut c, "k", &bulk("v2"), &[&bulk("v1")], false, WAIT).await;
    // Pub/sub.
    let mut s = RawClient::connect(proxy.addr).await.expect("connect");
    assert_eq!(
        s.cmd("SUBSCRIBE ch").await,
        b"*3\r\n$9\r\nsubscribe\r\n$2\r\nch\r\n:1\r\n"
    );
    assert_eq!(c.cmd("PUBLISH ch hi").await, b":1\r\n");
    assert_eq!(
        s.read_reply().await,
        b"*3\r\n$7\r\nmessage\r\n$2\r\nch\r\n$2\r\nhi\r\n"
    );
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_to_the_upstream() {
    let pki = Pki::new();
    let redis = TlsRedis::start(&pki, &pki.issue("redis", &["127.0.0.1"]), true);
    let ca = pki.ca_file();
    let client = pki.issue("corral", &["corral"]);
    let proxy = TestProxy::start_with(&rediss(&redis), |c| {
        c.upstream.tls = tls_trusting(&ca, Some((&client.cert, &client.key)));
    })
    .await;
    let mut c = RawClient::connect(proxy.addr).await.expect("connect");
    assert_eq!(c.cmd("SET m 1").await, b"+OK\r\n");
    assert_eq!(c.cmd("GET m").await, bulk("1"));
    proxy.stop().await;

    // Without a certificate Redis refuses corral: said in /healthz and to clients.
    let proxy = TestProxy::spawn_with(&rediss(&redis), |c| {
        c.upstream.tls = tls_trusting(&ca, None);
    })
    .await;
    let body = healthz_until(&proxy, 503, "TLS failed").await;
    assert!(body.contains("CertificateRequired"), "{body}");
    let mut c = RawClient::connect(proxy.addr).await.expect("connect");
    let got = said(&c.cmd("GET m").await);
    assert!(got.contains("unavailable: TLS failed"), "{got}");
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_ca_and_wrong_name_are_reported_and_corral_keeps_serving() {
    let (pki, other) = (Pki::new(), Pki::new());
    let redis = TlsRedis::start(&pki, &pki.issue("redis", &["redis.internal"]), false);
    let other_ca = other.ca_file();
    let proxy = TestProxy::spawn_with(&rediss(&redis), |c| {
        c.upstream.tls = tls_trusting(&other_ca, None);
    })
    .await;
    let body = healthz_until(&proxy, 503, "UnknownIssuer").await;
    assert!(body.contains("TLS failed"), "{body}");
    let mut c = RawClient::connect(proxy.addr).await.expect("connect");
    let got = said(&c.cmd("GET k").await);
    assert!(
        got.starts_with(&format!(
            "ERR upstream 127.0.0.1:{} unavailable: TLS failed",
            redis.port
        )) && got.contains("invalid peer certificate: UnknownIssuer"),
        "{got}"
    );
    // corral itself keeps serving what it answers alone.
    assert_eq!(c.cmd("PING").await, b"+PONG\r\n");
    assert_eq!(c.cmd("CLIENT SETNAME still-here").await, b"+OK\r\n");
    proxy.stop().await;

    // The right CA, but the certificate names redis.internal, not the URL's 127.0.0.1.
    let ca = pki.ca_file();
    let proxy = TestProxy::spawn_with(&rediss(&redis), |c| {
        c.upstream.tls = tls_trusting(&ca, None);
    })
    .await;
    healthz_until(&proxy, 503, "not valid for name").await;
    // Fixed by a reload naming the server: new connections verify against it.
    let mut fixed = (*proxy.config).clone();
    fixed.upstream.tls.server_name = Some("redis.internal".into());
    let done = proxy.reloader.reload(&fixed).expect("reload");
    assert!(done.need_restart.is_empty(), "{done:?}");
    healthz_until(&proxy, 200, "ok").await;
    let mut c = RawClient::connect(proxy.addr).await.expect("connect");
    get_until(&mut c, "k", b"$-1\r\n", &[], true, WAIT).await;
    proxy.stop().await;
}

/// A proxy in front of `upstream` with a TLS listener presenting `server`, requiring client
/// certificates from `client_ca` if given; returns it and the TLS listener's address.
async fn with_tls_listener(
    upstream: &str,
    server: &CertFiles,
    client_ca: Option<&std::path::Path>,
) -> (TestProxy, SocketAddr) {
    let tls_addr = SocketAddr::from(([127, 0, 0, 1], unused_port()));
    let proxy = TestProxy::start_with(upstream, |c: &mut Config| {
        c.tls.listen = tls_addr.to_string();
        c.tls.cert_file = Some(server.cert.clone());
        c.tls.key_file = Some(server.key.clone());
        c.tls.client_ca_file = client_ca.map(|p| p.to_path_buf());
    })
    .await;
    (proxy, tls_addr)
}

fn cli_says(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stdout).trim().to_string() + &String::from_utf8_lossy(&out.stderr)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cli_over_tls_beside_the_plain_listener() {
    let redis = RedisServer::start();
    let pki = Pki::new();
    let server = pki.issue("corral", &["127.0.0.1"]);
    let (proxy, tls_addr) = with_tls_listener(&redis.url(), &server, None).await;
    let ca = pki.ca_file();
    let out = redis_cli_tls(tls_addr.port(), &ca, None, &["SET", "cli", "over-tls"]);
    assert_eq!(cli_says(&out), "OK");
    let mut plain = RawClient::connect(proxy.addr).await.expect("plain");
    assert_eq!(plain.cmd("GET cli").await, bulk("over-tls"));
    // A clear-text client on the TLS port is refused and counted; corral goes on.
    let mut wrong = RawClient::connect(tls_addr).await.expect("connect");
    assert!(wrong.try_request(&[b"PING"]).await.is_err());
    let out = redis_cli_tls(tls_addr.port(), &ca, None, &["GET", "cli"]);
    assert_eq!(cli_says(&out), "over-tls");
    let admin = proxy.admin.expect("admin");
    let (_, metrics) = http_get(admin, "/metrics").await.expect("metrics");
    assert!(
        metrics.contains("corral_tls_handshake_failures_total 1"),
        "{metrics}"
    );
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_are_required_with_client_ca_file() {
    let redis = RedisServer::start();
    let pki = Pki::new();
    let server = pki.issue("corral", &["127.0.0.1"]);
    let ca = pki.ca_file();
    let (proxy, tls_addr) = with_tls_listener(&redis.url(), &server, Some(&ca)).await;
    let client = pki.issue("app", &["app"]);
    let out = redis_cli_tls(tls_addr.port(), &ca, Some(&client), &["PING"]);
    assert_eq!(cli_says(&out), "PONG");
    let out = redis_cli_tls(tls_addr.port(), &ca, None, &["PING"]);
    assert!(
        !cli_says(&out).contains("PONG"),
        "served without a certificate"
    );
    // A certificate from another CA is refused too.
    let stranger = Pki::new().issue("stranger", &["x"]);
    let out = redis_cli_tls(tls_addr.port(), &ca, Some(&stranger), &["PING"]);
    assert!(
        !cli_says(&out).contains("PONG"),
        "served a foreign certificate"
    );
    // Others still served meanwhile.
    let out = redis_cli_tls(tls_addr.port(), &ca, Some(&client), &["PING"]);
    assert_eq!(cli_says(&out), "PONG");
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_swaps_the_listener_certificate_and_keeps_connected_clients() {
    let redis = RedisServer::start();
    let (old_ca, new_ca) = (Pki::new(), Pki::new());
    // The files corral names stay; their contents change under it.
    let dir = old_ca.dir.join("live");
    std::fs::create_dir_all(&dir).expect("dir");
    let live = CertFiles {
        cert: dir.join("server.pem"),
        key: dir.join("server.key"),
    };
    let install = |from: &CertFiles| {
        std::fs::copy(&from.cert, &live.cert).expect("copy cert");
        std::fs::copy(&from.key, &live.key).expect("copy key");
    };
    install(&old_ca.issue("old", &["127.0.0.1"]));
    let (proxy, tls_addr) = with_tls_listener(&redis.url(), &live, None).await;
    let trusting_old = tls_trusting(&old_ca.ca_file(), None);
    let trusting_new = tls_trusting(&new_ca.ca_file(), None);
    let mut kept = tls_dial(tls_addr, &trusting_old).await.expect("old cert");
    assert_eq!(request(&mut kept, &[b"SET", b"r", b"1"]).await, b"+OK\r\n");
    assert!(tls_dial(tls_addr, &trusting_new).await.is_err());

    install(&new_ca.issue("new", &["127.0.0.1"]));
    let done = proxy.reloader.reload(&proxy.config).expect("reload");
    assert!(
        done.applied.contains(&"tls listener certificates"),
        "{done:?}"
    );
    let mut fresh = tls_dial(tls_addr, &trusting_new).await.expect("new cert");
    assert_eq!(request(&mut fresh, &[b"GET", b"r"]).await, bulk("1"));
    let err = tls_dial(tls_addr, &trusting_old).await.expect_err("old CA");
    assert!(err.contains("UnknownIssuer"), "{err}");
    // The client connected before the reload is still served.
    assert_eq!(request(&mut kept, &[b"INCR", b"r"]).await, b":2\r\n");

    // A reload that cannot read the files keeps the certificate in use.
    std::fs::write(&live.key, "not a key").expect("break the key");
    let err = proxy
        .reloader
        .reload(&proxy.config)
        .expect_err("broken key");
    assert!(err.contains("key_file"), "{err}");
    let mut again = tls_dial(tls_addr, &trusting_new)
        .await
        .expect("still the new cert");
    assert_eq!(request(&mut again, &[b"GET", b"r"]).await, bulk("2"));
    proxy.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_password_change_is_reported_then_fixed_by_a_reload() {
    let redis = RedisServer::start();
    let proxy = TestProxy::start(&redis.url()).await;
    let mut c = RawClient::connect(proxy.addr).await.expect("connect");
    assert_eq!(c.cmd("SET p 1").await, b"+OK\r\n");
    // The password changes on Redis: the connections corral has stay authenticated, new
    // ones are refused (a transaction takes a new one).
    let mut admin = RawClient::connect(redis.addr()).await.expect("redis");
    assert_eq!(
        admin.cmd("CONFIG SET requirepass n3w-pass").await,
        b"+OK\r\n"
    );
    let got = said(&c.cmd("MULTI").await);
    assert!(
        got.contains("authentication failed") && got.contains("NOAUTH"),
        "{got}"
    );
    // The MULTI failed, so the client is not in a transaction (as with Redis), and its
    // later commands are served on the shared connections.
    assert_eq!(c.cmd("EXEC").await, b"-ERR EXEC without MULTI\r\n");
    assert_eq!(c.cmd("GET p").await, bulk("1"));
    let refused = info_field(&mut c, "upstream_refused").await;
    assert!(refused.starts_with("authentication failed"), "{refused}");
    let body = healthz_until(&proxy, 503, "authentication failed").await;
    assert!(body.contains("NOAUTH"), "{body}");
    // Once its connections are closed (a restart, a failover), everything is refused, with
    // the cause.
    assert_eq!(admin.cmd("AUTH n3w-pass").await, b"+OK\r\n");
    assert!(int_reply(&admin.cmd("CLIENT KILL TYPE normal").await) >= 1);
    let got = poll_until(WAIT, "a GET to fail for the password", || async {
        let mut c = RawClient::connect(proxy.addr).await.ok()?;
        let got = said(&c.cmd("GET p").await);
        got.contains("authentication failed").then_some(got)
    })
    .await;
    assert!(
        got.starts_with("ERR upstream") && got.contains("NOAUTH"),
        "{got}"
    );
    let mut c = RawClient::connect(proxy.addr).await.expect("connect");

    // The new password in corral's config, reloaded: traffic recovers, health clears.
    let mut fixed = (*proxy.config).clone();
    fixed.upstream.url = format!("redis://:n3w-pass@{}", redis.addr());
    let done = proxy.reloader.reload(&fixed).expect("reload");
    assert!(done.applied.contains(&"upstream credentials"), "{done:?}");
    assert!(done.need_restart.is_empty(), "{done:?}");
    get_until(&mut c, "p", &bulk("1"), &[], true, WAIT).await;
    healthz_until(&proxy, 200, "ok").await;
    // Every connection is back (a connect under way at the reload may fail once more with
    // the old password before it retries): INFO answers, with no refusal.
    let wait = Deadline::new(WAIT, "INFO through corral to answer again");
    loop {
        let info = c.cmd("INFO proxy").await;
        if info.starts_with(b"$") {
            assert!(
                reply_text(&info).contains("upstream_refused:\r\n"),
                "{}",
                show(&info)
            );
            break;
        }
        wait.pause_seeing(show(&info)).await;
    }
    proxy.stop().await;
}

fn int_reply(r: &[u8]) -> i64 {
    said(r).parse().unwrap_or(-1)
}

/// A one-line reply's text, without its type byte: errors and integers included.
fn said(r: &[u8]) -> String {
    String::from_utf8_lossy(r.get(1..).unwrap_or_default())
        .trim_end()
        .to_string()
}

/// A TLS cluster node (`tls-cluster yes`): TLS only, or with a plain port too (`plain`), so
/// that `CLUSTER SHARDS` reports both and corral must pick `tls-port`.
fn tls_cluster_node(pki: &Pki, cert: &CertFiles, plain: bool) -> TlsRedis {
    let mut args: Vec<String> = [
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-node-timeout",
        "5000",
        "--tls-cluster",
        "yes",
        "--tls-auth-clients",
        "no",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(["--cluster-port".into(), unused_port().to_string()]);
    if plain {
        // After the starter's `--port 0`: the last one wins.
        args.extend(["--port".into(), unused_port().to_string()]);
    }
    for (flag, file) in [
        ("--tls-cert-file", &cert.cert),
        ("--tls-key-file", &cert.key),
        ("--tls-ca-cert-file", &pki.ca_file()),
    ] {
        args.extend([flag.to_string(), file.display().to_string()]);
    }
    TlsRedis::start_with(&args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_cluster_behind_corral() {
    let pki = Pki::new();
    let cert = pki.issue("node", &["127.0.0.1"]);
    let ca = pki.ca_file();
    let nodes: Vec<TlsRedis> = [false, false, true]
        .into_iter()
        .map(|plain| tls_cluster_node(&pki, &cert, plain))
        .collect();
    let addrs: Vec<String> = nodes
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port))
        .collect();
    let create = std::process::Command::new("redis-cli")
        .args(["--tls", "--cacert"])
        .arg(&ca)
        .args(["--cluster", "create"])
        .args(&addrs)
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("redis-cli --cluster create");
    assert!(create.status.success(), "{}", cli_says(&create));
    for n in &nodes {
        poll_until(
            Duration::from_secs(30),
            "cluster_state:ok on every node",
            || async {
                let out = redis_cli_tls(n.port, &ca, None, &["CLUSTER", "INFO"]);
                cli_says(&out).contains("cluster_state:ok").then_some(())
            },
        )
        .await;
    }
    let seeds: Vec<String> = addrs.iter().map(|a| format!("rediss://{a}")).collect();
    let proxy = TestProxy::start_with(&seeds[0], |c| {
        c.cluster.seeds = seeds.clone();
        c.upstream.tls = tls_trusting(&ca, None);
    })
    .await;
    let mut c = RawClient::connect(proxy.addr).await.expect("connect");
    poll_until(WAIT, "corral to see the whole cluster", || async {
        let mut c = RawClient::connect(proxy.addr).await.ok()?;
        reply_text(&c.cmd("CLUSTER INFO").await)
            .contains("cluster_state:ok")
            .then_some(())
    })
    .await;
    // Keys on every master (one of which has a plain port too).
    for i in 0..60 {
        let key = format!("k{i}");
        assert_eq!(c.cmd(&format!("SET {key} v{i}")).await, b"+OK\r\n");
    }
    for i in 0..60 {
        assert_eq!(c.cmd(&format!("GET k{i}")).await, bulk(format!("v{i}")));
    }
    // Each master holds some of them: corral reached all three over TLS.
    for n in &nodes {
        let out = redis_cli_tls(n.port, &ca, None, &["DBSIZE"]);
        let keys: u64 = cli_says(&out).parse().unwrap_or(0);
        assert!(keys > 0, "node {} has no keys: {}", n.port, cli_says(&out));
    }
    proxy.stop().await;
}
