//! The `corral` executable: flags, config file, admin endpoint, graceful exit on SIGTERM, and
//! refusal of an invalid config.

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use common::{RawClient, RedisServer, bulk, http_get, poll_until, unused_port};

const BIN: &str = env!("CARGO_BIN_EXE_corral");

/// A running corral process, killed on drop if a test fails before it exits.
struct Proxy {
    child: Child,
    addr: SocketAddr,
}

impl Proxy {
    /// Starts corral with `args` plus `--listen` on a fresh port, and waits until it accepts.
    async fn start(args: &[&str]) -> Proxy {
        let addr = SocketAddr::from(([127, 0, 0, 1], unused_port()));
        let child = Command::new(BIN)
            .args(args)
            .args(["--listen", &addr.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run corral");
        let mut proxy = Proxy { child, addr };
        poll_until(
            Duration::from_secs(10),
            "corral to accept connections",
            || {
                let exited = proxy.child.try_wait().expect("try_wait");
                assert!(exited.is_none(), "corral exited early: {exited:?}");
                async move {
                    // Any reply will do: with requirepass set, PING gets NOAUTH.
                    let mut c = RawClient::connect(addr).await.ok()?;
                    c.try_request(&[b"PING"]).await.ok().map(drop)
                }
            },
        )
        .await;
        proxy
    }

    /// Sends SIGTERM and waits (bounded) for the exit status.
    async fn terminate(mut self) -> ExitStatus {
        let ok = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill")
            .success();
        assert!(ok, "kill -TERM failed");
        let child = &mut self.child;
        poll_until(
            Duration::from_secs(15),
            "corral to exit after SIGTERM",
            || {
                let status = child.try_wait().expect("try_wait");
                async move { status }
            },
        )
        .await
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A file in the temp dir with `text`, removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn new(name: &str, text: &str) -> TempFile {
        let path = std::env::temp_dir().join(format!("corral-{}-{name}", std::process::id()));
        std::fs::write(&path, text).expect("write temp file");
        TempFile(path)
    }

    fn path(&self) -> &str {
        self.0.to_str().expect("utf-8 path")
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_reports_health_and_metrics_and_exits_cleanly_on_sigterm() {
    let redis = RedisServer::start();
    let admin = SocketAddr::from(([127, 0, 0, 1], unused_port()));
    let proxy = Proxy::start(&["--upstream", &redis.url(), "--admin", &admin.to_string()]).await;
    let mut c = RawClient::connect(proxy.addr).await.unwrap();
    assert_eq!(c.cmd("SET bin:k v").await, b"+OK\r\n");
    assert_eq!(c.cmd("GET bin:k").await, bulk("v"));

    poll_until(
        Duration::from_secs(10),
        "/healthz to answer 200",
        || async {
            let (status, _) = http_get(admin, "/healthz").await.ok()?;
            (status == 200).then_some(())
        },
    )
    .await;
    let (status, body) = http_get(admin, "/metrics").await.unwrap();
    assert_eq!(status, 200);
    assert!(body.contains("corral_commands_total"), "{body}");

    // An idle client stays connected across SIGTERM; it must not hold up the exit.
    let status = proxy.terminate().await;
    assert!(status.success(), "exit status {status}");
    assert!(c.is_closed().await, "client connection left open");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_file_is_read_and_flags_override_it() {
    let redis = RedisServer::start();
    // The shipped example config, with listen and upstream overridden.
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/conf/corral.toml");
    let proxy = Proxy::start(&["--config", example, "--upstream", &redis.url()]).await;
    let mut c = RawClient::connect(proxy.addr).await.unwrap();
    assert_eq!(c.cmd("SET conf:k v").await, b"+OK\r\n");
    assert!(proxy.terminate().await.success());

    // A value only the file sets (requirepass) takes effect alongside the flag overrides.
    let file = TempFile::new(
        "auth.toml",
        "listen = \"127.0.0.1:1\"\nrequirepass = \"from-file\"\n[upstream]\nurl = \"redis://127.0.0.1:1\"\n",
    );
    let proxy = Proxy::start(&["--config", file.path(), "--upstream", &redis.url()]).await;
    let mut c = RawClient::connect(proxy.addr).await.unwrap();
    assert_eq!(
        c.cmd("GET conf:k").await,
        b"-NOAUTH Authentication required.\r\n"
    );
    assert_eq!(c.cmd("AUTH from-file").await, b"+OK\r\n");
    assert_eq!(c.cmd("GET conf:k").await, bulk("v"));
    assert!(proxy.terminate().await.success());
}

/// Runs corral expecting it to refuse to start; returns its stderr.
fn refused(args: &[&str]) -> String {
    let out = Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run corral");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "{args:?} started; stderr: {stderr}");
    stderr
}

#[test]
fn invalid_config_exits_non_zero_naming_the_field() {
    let file = TempFile::new("bad.toml", "[upstream]\nconnections = 0\n");
    let err = refused(&["--config", file.path()]);
    assert!(err.contains("upstream.connections"), "{err}");

    let file = TempFile::new("typo.toml", "[upstream]\nconections = 2\n");
    let err = refused(&["--config", file.path()]);
    assert!(err.contains("conections"), "{err}");

    let err = refused(&["--upstream", "http://127.0.0.1:6379"]);
    assert!(err.contains("upstream.url"), "{err}");

    let err = refused(&["--config", "/nonexistent/corral.toml"]);
    assert!(err.contains("/nonexistent/corral.toml"), "{err}");
}

/// A client CLIENT LIST shows in a blocking command can be unblocked at once, as on Redis:
/// corral shows the command (`cmd=blpop`) only with the client blocked, once the connection
/// it went on is live and its id on the server known. Before, CLIENT LIST showed the
/// command as soon as it was routed, an UNBLOCK sent then named no one (`:0`), and the
/// client stayed blocked for ever (ioredis's CLIENT UNBLOCK test; 25 in 200 tries here).
/// Run against the binary: its one-thread runtime is where the window was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_shown_blocked_can_be_unblocked_at_once() {
    let redis = RedisServer::start();
    let proxy = Proxy::start(&["--upstream", &redis.url()]).await;
    let mut b = RawClient::connect(proxy.addr).await.expect("connect");
    for i in 0..200 {
        let mut a = RawClient::connect(proxy.addr).await.expect("connect");
        let id = a.cmd("CLIENT ID").await;
        let id = String::from_utf8_lossy(&id[1..id.len() - 2]).into_owned();
        a.send(&common::encode(&[b"BLPOP", b"ub", b"0"])).await;
        // Asked back to back, as a client waiting for it does: the first time it shows.
        let want = format!("id={id} ");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let list = String::from_utf8_lossy(&b.cmd("CLIENT LIST").await).into_owned();
            if list
                .lines()
                .any(|l| l.starts_with(&want) && l.contains("cmd=blpop"))
            {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{id} never shown blocked"
            );
        }
        let unblocked = b.cmd(&format!("CLIENT UNBLOCK {id}")).await;
        assert_eq!(unblocked, b":1\r\n", "try {i}");
        assert_eq!(a.read_reply().await, b"*-1\r\n", "try {i}");
    }
}

/// corral's resident memory, in KiB (`VmRSS` from `/proc`).
fn resident_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("read status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in status")
}

/// What a burst of large values made corral allocate goes back to the system once it is
/// idle, not only at its next request: mimalloc purges freed memory only when a thread
/// allocates or frees again, and corral asks it to after each second with no request.
#[tokio::test]
async fn memory_a_burst_freed_goes_back_to_the_system_while_idle() {
    const VALUES: usize = 64;
    let redis = RedisServer::start();
    let proxy = Proxy::start(&["--upstream", &redis.url()]).await;
    let pid = proxy.child.id();
    let value = vec![b'v'; 1 << 20];
    let mut burst = Vec::new();
    for i in 0..VALUES {
        let key = format!("burst:{i}");
        burst.extend(common::encode(&[b"SET", key.as_bytes(), &value]));
    }
    for i in 0..VALUES {
        burst.extend(common::encode(&[b"GET", format!("burst:{i}").as_bytes()]));
    }
    let mut c = RawClient::connect(proxy.addr).await.unwrap();
    let replies = c.pipeline(&burst, 1 << 20, 2 * VALUES).await;
    assert!(replies[..VALUES].iter().all(|r| r == b"+OK\r\n"));
    let expected = bulk(&value);
    assert!(replies[VALUES..].iter().all(|r| *r == expected));
    // The burst must have grown the heap, or the test shows nothing.
    let grown = resident_kib(pid);
    assert!(grown > 60 * 1024, "resident after the burst: {grown} KiB");
    drop(c);
    drop(replies);
    poll_until(
        Duration::from_secs(15),
        "corral's resident memory to fall back while idle",
        || {
            let now = resident_kib(pid);
            async move { (now < 40 * 1024).then_some(()) }
        },
    )
    .await;
}
