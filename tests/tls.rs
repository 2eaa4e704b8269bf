//! corral's TLS connector against a real TLS-only redis-server (certificates made per test),
//! and redis-cli's own TLS against the same server, as later used against corral's listener.

mod common;
#[path = "common/tls.rs"]
mod tls_fixtures;

use std::time::Duration;

use common::{RedisServer, encode, mask_hello_id, resp_len, show};
use corral::tls::{Stream, UpstreamTls, UpstreamTlsConnector, connect};
use tls_fixtures::{CertFiles, Pki, TlsRedis, redis_cli_has_tls, redis_cli_tls};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Opens TLS to the server as the upstream side of corral would.
async fn dial(redis: &TlsRedis, settings: &UpstreamTls) -> Result<Stream, String> {
    let connector = UpstreamTlsConnector::try_new(settings).map_err(|e| e.to_string())?;
    let tcp = TcpStream::connect(("127.0.0.1", redis.port))
        .await
        .map_err(|e| format!("tcp connect: {e}"))?;
    connect(tcp, &connector, "127.0.0.1")
        .await
        .map_err(|e| e.to_string())
}

/// Sends one request and reads one whole reply (10 s deadline per read).
async fn request(stream: &mut Stream, args: &[&[u8]]) -> std::io::Result<Vec<u8>> {
    stream.write_all(&encode(args)).await?;
    let mut buf = Vec::new();
    loop {
        if let Some(n) = resp_len(&buf) {
            buf.truncate(n);
            return Ok(buf);
        }
        buf.reserve(64 * 1024);
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read_buf(&mut buf));
        let n = read
            .await
            .map_err(|_| std::io::Error::other(format!("no reply; partial {}", show(&buf))))??;
        if n == 0 {
            let msg = format!("connection closed; partial {}", show(&buf));
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, msg));
        }
    }
}

fn trusting(pki: &Pki) -> UpstreamTls {
    UpstreamTls {
        ca_file: Some(pki.ca_file()),
        ..UpstreamTls::default()
    }
}

fn presenting(pki: &Pki, client: &CertFiles) -> UpstreamTls {
    UpstreamTls {
        cert_file: Some(client.cert.clone()),
        key_file: Some(client.key.clone()),
        ..trusting(pki)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_over_tls_match_plain_redis() {
    let pki = Pki::new();
    let redis = TlsRedis::start(&pki, &pki.issue("redis", &["127.0.0.1"]), false);
    let plain = RedisServer::start();
    let mut tls = dial(&redis, &trusting(&pki))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", redis.log()));
    let mut direct = Stream::from(TcpStream::connect(plain.addr()).await.expect("connect"));
    // Large enough to span several TLS records each way.
    let big = vec![b'v'; 300_000];
    let script: [&[&[u8]]; 5] = [
        &[b"PING"],
        &[b"HELLO", b"3"],
        &[b"SET", b"k", &big],
        &[b"GET", b"k"],
        &[b"GET", b"missing"],
    ];
    for args in script {
        let over_tls = request(&mut tls, args).await.expect("tls reply");
        let plain_reply = request(&mut direct, args).await.expect("plain reply");
        assert_eq!(
            mask_hello_id(&over_tls),
            mask_hello_id(&plain_reply),
            "{}",
            show(args[0])
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_with_redis() {
    let pki = Pki::new();
    let redis = TlsRedis::start(&pki, &pki.issue("redis", &["127.0.0.1"]), true);
    let client = pki.issue("corral", &["corral"]);
    let mut s = dial(&redis, &presenting(&pki, &client))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", redis.log()));
    assert_eq!(
        request(&mut s, &[b"PING"]).await.expect("PING"),
        b"+PONG\r\n"
    );

    // Redis judges the missing certificate after a TLS 1.3 client has finished its side, so
    // the refusal may come as the handshake's error or as the first read's.
    let refusal = match dial(&redis, &trusting(&pki)).await {
        Err(e) => e,
        Ok(mut s) => match request(&mut s, &[b"PING"]).await {
            Err(e) => e.to_string(),
            Ok(reply) => panic!("served without a client certificate: {}", show(&reply)),
        },
    };
    assert!(
        refusal.contains("received fatal alert: CertificateRequired"),
        "unclear refusal: {refusal}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_ca_and_wrong_name_fail_clearly() {
    let (pki, other) = (Pki::new(), Pki::new());
    let redis = TlsRedis::start(&pki, &pki.issue("redis", &["redis.internal"]), false);
    let err = dial(&redis, &trusting(&other))
        .await
        .expect_err("unknown CA");
    assert_eq!(
        err,
        format!(
            "tls handshake with 127.0.0.1:{} failed: invalid peer certificate: UnknownIssuer",
            redis.port
        )
    );
    let err = dial(&redis, &trusting(&pki)).await.expect_err("wrong name");
    assert!(
        err.starts_with(&format!(
            "tls handshake with 127.0.0.1:{} failed: ",
            redis.port
        )) && err.contains("not valid for name"),
        "{err}"
    );
    let named = UpstreamTls {
        server_name: Some("redis.internal".into()),
        ..trusting(&pki)
    };
    let mut s = dial(&redis, &named).await.expect("by server_name");
    assert_eq!(
        request(&mut s, &[b"PING"]).await.expect("PING"),
        b"+PONG\r\n"
    );
}

/// redis-cli with TLS is the tool the listener tests will drive corral with, so it must work
/// here against Redis itself first, mutual TLS included.
#[test]
fn redis_cli_speaks_tls() {
    assert!(
        redis_cli_has_tls(),
        "this redis-cli was built without TLS; Debian's redis-tools has it"
    );
    let pki = Pki::new();
    let redis = TlsRedis::start(&pki, &pki.issue("redis", &["127.0.0.1"]), true);
    let client = pki.issue("cli", &["cli"]);
    let out = redis_cli_tls(redis.port, &pki.ca_file(), Some(&client), &["PING"]);
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "PONG",
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = redis_cli_tls(redis.port, &pki.ca_file(), None, &["PING"]);
    let said = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(
        !said.contains("PONG"),
        "served without a client certificate"
    );
}
