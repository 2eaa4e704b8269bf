//! The `corral` executable under a password change: SIGHUP re-reads the config file and the
//! new upstream password takes effect without a restart or a dropped client; and no password
//! (upstream, requirepass) ever shows in its log, its replies, INFO, CORRAL introspection or
//! the admin endpoint, through failures and reloads alike.

mod common;
#[path = "common/tls.rs"]
mod tls_fixtures;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command};
use std::time::Duration;

use common::{
    Deadline, RawClient, RedisServer, bulk, encode, http_get, poll_until, tls_dial, tls_relay,
    tls_trusting, unused_port,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const BIN: &str = env!("CARGO_BIN_EXE_corral");
const WAIT: Duration = Duration::from_secs(10);
const UP_OLD: &str = "up-Old-s3cret";
const UP_NEW: &str = "up-New-s3cret";
const CLIENT_PASS: &str = "cl1ent-s3cret";
/// A Redis ACL user's password, passed through corral.
const USER_PASS: &str = "us3r-pass-s3cret";

/// A scratch directory with the config file and corral's log, removed on drop; the process is
/// killed on drop too.
struct Corral {
    child: Child,
    dir: PathBuf,
    addr: SocketAddr,
    admin: SocketAddr,
}

impl Corral {
    fn config(&self, redis: &RedisServer, upstream_pass: &str, extra: &str) {
        let text = format!(
            "listen = \"{}\"\nadmin = \"{}\"\nrequirepass = \"{CLIENT_PASS}\"\n\
             log_level = \"debug\"\n[upstream]\nurl = \"redis://:{upstream_pass}@{}\"\n{extra}",
            self.addr,
            self.admin,
            redis.addr()
        );
        std::fs::write(self.dir.join("corral.toml"), text).expect("write config");
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill {sig} failed");
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("corral.log")).unwrap_or_default()
    }

    /// Waits until the log has `part` (the signal is handled asynchronously).
    async fn log_until(&self, part: &str) {
        poll_until(WAIT, &format!("{part:?} in the log"), || async {
            self.log().contains(part).then_some(())
        })
        .await;
    }
}

impl Drop for Corral {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

async fn start(redis: &RedisServer) -> Corral {
    start_with(redis, "", &[]).await
}

/// corral with `extra` appended to its config file and `args` on its command line.
async fn start_with(redis: &RedisServer, extra: &str, args: &[&str]) -> Corral {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("corral-reload-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let log = std::fs::File::create(dir.join("corral.log")).expect("log file");
    let addr = SocketAddr::from(([127, 0, 0, 1], unused_port()));
    let admin = SocketAddr::from(([127, 0, 0, 1], unused_port()));
    let placeholder = Command::new("true").spawn().expect("spawn");
    let mut corral = Corral {
        child: placeholder,
        dir,
        addr,
        admin,
    };
    corral.config(redis, UP_OLD, extra);
    corral.child = Command::new(BIN)
        .arg("--config")
        .arg(corral.dir.join("corral.toml"))
        .args(args)
        .env_remove("RUST_LOG")
        .stdout(log.try_clone().expect("log"))
        .stderr(log)
        .spawn()
        .expect("run corral");
    poll_until(WAIT, "corral to accept connections", || async {
        let mut c = RawClient::connect(addr).await.ok()?;
        c.try_request(&[b"PING"]).await.ok().map(drop)
    })
    .await;
    corral
}

/// Everything a client or an operator is shown, gathered for the final check.
#[derive(Default)]
struct Seen(Vec<String>);

impl Seen {
    fn add(&mut self, what: &[u8]) -> Vec<u8> {
        self.0.push(String::from_utf8_lossy(what).into_owned());
        what.to_vec()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_applies_a_new_upstream_password_and_no_secret_is_ever_shown() {
    let redis = RedisServer::start_with(&["--requirepass", UP_OLD]);
    let corral = start(&redis).await;
    let mut seen = Seen::default();
    let mut c = RawClient::connect(corral.addr).await.expect("connect");
    let wrong = seen.add(&c.cmd("AUTH not-it").await);
    assert!(
        wrong.starts_with(b"-WRONGPASS"),
        "{}",
        String::from_utf8_lossy(&wrong)
    );
    assert_eq!(
        seen.add(&c.cmd(&format!("AUTH {CLIENT_PASS}")).await),
        b"+OK\r\n"
    );
    assert_eq!(seen.add(&c.cmd("SET s 1").await), b"+OK\r\n");
    // A Redis ACL user, passed through: its password is never shown either.
    let mut made = RawClient::connect(redis.addr()).await.expect("redis");
    assert_eq!(made.cmd(&format!("AUTH {UP_OLD}")).await, b"+OK\r\n");
    let setuser = format!("ACL SETUSER pt on >{USER_PASS} +@all ~pt:*");
    assert_eq!(made.cmd(&setuser).await, b"+OK\r\n");
    let mut user = RawClient::connect(corral.addr).await.expect("connect");
    seen.add(&user.cmd("AUTH pt not-it").await);
    let auth = format!("AUTH pt {USER_PASS}");
    assert_eq!(seen.add(&user.cmd(&auth).await), b"+OK\r\n");
    let hello = format!("HELLO 3 AUTH pt {USER_PASS}");
    seen.add(&user.cmd(&hello).await);
    for line in [
        "GET s",
        "SET pt:1 v",
        "MULTI",
        "EXEC",
        "CLIENT INFO",
        "INFO",
    ] {
        seen.add(&user.cmd(line).await);
    }
    for line in [
        "INFO",
        "INFO everything",
        "CORRAL CACHE STATS",
        "CORRAL HOTKEYS",
        "CLIENT LIST",
    ] {
        seen.add(&c.cmd(line).await);
    }
    let (_, body) = http_get(corral.admin, "/metrics").await.expect("metrics");
    seen.add(body.as_bytes());

    // Redis's password changes and its clients are dropped: corral reports the refusal.
    let mut admin = RawClient::connect(redis.addr()).await.expect("redis");
    assert_eq!(admin.cmd(&format!("AUTH {UP_OLD}")).await, b"+OK\r\n");
    let set = format!("CONFIG SET requirepass {UP_NEW}");
    assert_eq!(admin.cmd(&set).await, b"+OK\r\n");
    admin.cmd("CLIENT KILL TYPE normal").await;
    let refused = poll_until(WAIT, "/healthz to report the refusal", || async {
        let (code, body) = http_get(corral.admin, "/healthz").await.ok()?;
        (code == 503 && body.contains("authentication failed")).then_some(body)
    })
    .await;
    seen.add(refused.as_bytes());
    let mut c = RawClient::connect(corral.addr).await.expect("connect");
    c.cmd(&format!("AUTH {CLIENT_PASS}")).await;
    let err = seen.add(&c.cmd("GET s").await);
    assert!(
        String::from_utf8_lossy(&err).contains("authentication failed"),
        "{}",
        String::from_utf8_lossy(&err)
    );

    // A reload of a broken file (the password on the faulty line) changes nothing.
    std::fs::write(
        corral.dir.join("corral.toml"),
        format!("[upstream]\nurl = \"redis://:{UP_NEW}@{}\n", redis.addr()),
    )
    .expect("write");
    corral.signal("-HUP");
    corral.log_until("configuration reload failed").await;

    // The new password in the file, SIGHUP: the same client is served again.
    corral.config(&redis, UP_NEW, "");
    corral.signal("-HUP");
    corral.log_until("configuration reloaded").await;
    let wait = Deadline::new(WAIT, "GET through corral to work again");
    loop {
        let got = seen.add(&c.cmd("GET s").await);
        if got == bulk("1") {
            break;
        }
        wait.pause_seeing(String::from_utf8_lossy(&got)).await;
    }
    seen.add(&c.cmd("INFO").await);
    // A setting that needs a restart is named, not applied.
    corral.config(&redis, UP_NEW, "[limits]\nmax_inline_len = 2048\n");
    corral.signal("-HUP");
    corral.log_until("only take effect after a restart").await;
    corral.signal("-TERM");
    poll_until(WAIT, "corral to log its exit", || async {
        corral.log().contains("corral stopped").then_some(())
    })
    .await;

    let log = corral.log();
    assert!(
        log.contains("upstream refuses corral's connections"),
        "{log}"
    );
    // Logged once for the change, not once per retry.
    assert_eq!(
        log.matches("upstream refuses corral's connections").count(),
        1,
        "{log}"
    );
    for secret in [UP_OLD, UP_NEW, CLIENT_PASS, USER_PASS] {
        assert!(!log.contains(secret), "{secret} in the log:\n{log}");
        for text in &seen.0 {
            assert!(!text.contains(secret), "{secret} shown: {text}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_swaps_the_tls_listener_certificate_keeping_clients() {
    let redis = RedisServer::start_with(&["--requirepass", UP_OLD]);
    let (old_ca, new_ca) = (tls_fixtures::Pki::new(), tls_fixtures::Pki::new());
    let (cert, key) = (old_ca.dir.join("live.pem"), old_ca.dir.join("live.key"));
    let install = |from: &tls_fixtures::CertFiles| {
        std::fs::copy(&from.cert, &cert).expect("copy cert");
        std::fs::copy(&from.key, &key).expect("copy key");
    };
    install(&old_ca.issue("old", &["127.0.0.1"]));
    let tls_addr = SocketAddr::from(([127, 0, 0, 1], unused_port()));
    // The listen address from the flag, the certificates from the file.
    let section = format!("[tls]\ncert_file = {cert:?}\nkey_file = {key:?}\n");
    let corral = start_with(&redis, &section, &["--tls-listen", &tls_addr.to_string()]).await;
    let trusting_old = tls_trusting(&old_ca.ca_file(), None);
    let auth = encode(&[b"AUTH", CLIENT_PASS.as_bytes()]);
    // A client kept across the reload, through a plain-to-TLS relay.
    let relay = tls_relay(tls_addr, trusting_old).await;
    let mut c = RawClient::connect(relay).await.expect("through the relay");
    assert_eq!(
        c.request(&[b"AUTH", CLIENT_PASS.as_bytes()]).await,
        b"+OK\r\n"
    );
    assert_eq!(c.cmd("SET t 1").await, b"+OK\r\n");

    install(&new_ca.issue("new", &["127.0.0.1"]));
    corral.signal("-HUP");
    corral.log_until("configuration reloaded").await;
    let trusting_new = tls_trusting(&new_ca.ca_file(), None);
    let mut fresh = tls_dial(tls_addr, &trusting_new)
        .await
        .expect("new certificate");
    fresh.write_all(&auth).await.expect("write");
    fresh.flush().await.expect("flush");
    let mut buf = [0u8; 5];
    fresh.read_exact(&mut buf).await.expect("AUTH reply");
    assert_eq!(&buf, b"+OK\r\n");
    // The client connected before the reload is still served; one trusting only the old CA
    // is refused now.
    assert_eq!(c.cmd("GET t").await, bulk("1"));
    let refused = tls_dial(tls_addr, &tls_trusting(&old_ca.ca_file(), None)).await;
    assert!(refused.is_err_and(|e| e.contains("UnknownIssuer")));
    corral.signal("-TERM");
}
