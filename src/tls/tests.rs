//! Handshakes over loopback TCP with certificates made for each test.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

use super::*;

#[path = "../../tests/common/tls.rs"]
mod pki;

use pki::{CertFiles, Pki};

/// A TLS echo server; each failed handshake's error text is sent on the returned channel.
struct EchoServer {
    addr: SocketAddr,
    handle: Arc<TlsAcceptorHandle>,
    failures: mpsc::UnboundedReceiver<String>,
}

async fn echo_server(settings: ListenTls) -> EchoServer {
    let handle = Arc::new(TlsAcceptorHandle::try_new(&settings).expect("server config"));
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("local addr");
    let (tx, failures) = mpsc::unbounded_channel();
    let accepting = handle.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (handle, tx) = (accepting.clone(), tx.clone());
            tokio::spawn(async move {
                match handle.accept(tcp).await {
                    Ok(mut stream) => {
                        let (mut rd, mut wr) = stream.split();
                        let _ = tokio::io::copy(&mut rd, &mut wr).await;
                    }
                    Err(e) => {
                        let _ = tx.send(e.to_string());
                    }
                }
            });
        }
    });
    EchoServer {
        addr,
        handle,
        failures,
    }
}

fn listen_settings(server: &CertFiles, client_ca: Option<PathBuf>) -> ListenTls {
    ListenTls {
        listen: "127.0.0.1:0".into(),
        cert_file: Some(server.cert.clone()),
        key_file: Some(server.key.clone()),
        client_ca_file: client_ca,
    }
}

fn trusting(ca: PathBuf) -> UpstreamTls {
    UpstreamTls {
        ca_file: Some(ca),
        ..UpstreamTls::default()
    }
}

async fn dial(addr: SocketAddr, settings: &UpstreamTls, host: &str) -> Result<Stream, TlsError> {
    let connector = UpstreamTlsConnector::try_new(settings).expect("client config");
    let tcp = TcpStream::connect(addr).await.expect("tcp connect");
    connect(tcp, &connector, host).await
}

/// Sends `msg` and reads it back.
async fn round_trip(stream: &mut Stream, msg: &[u8]) -> std::io::Result<Vec<u8>> {
    stream.write_all(msg).await?;
    let mut back = vec![0; msg.len()];
    stream.read_exact(&mut back).await?;
    Ok(back)
}

#[tokio::test]
async fn handshake_by_ip_and_by_name() {
    let pki = Pki::new();
    let server = echo_server(listen_settings(
        &pki.issue("server", &["localhost", "127.0.0.1"]),
        None,
    ))
    .await;
    for host in ["127.0.0.1", "localhost"] {
        let mut s = dial(server.addr, &trusting(pki.ca_file()), host)
            .await
            .unwrap_or_else(|e| panic!("{host}: {e}"));
        assert!(s.is_tls());
        assert_eq!(s.peer_addr().ok(), Some(server.addr));
        s.set_nodelay(true).expect("nodelay");
        assert_eq!(
            round_trip(&mut s, b"PING\r\n").await.expect("echo"),
            b"PING\r\n"
        );
    }
}

#[tokio::test]
async fn unknown_ca_fails_with_the_reason() {
    let (pki, other) = (Pki::new(), Pki::new());
    let server = echo_server(listen_settings(&pki.issue("server", &["127.0.0.1"]), None)).await;
    let err = dial(server.addr, &trusting(other.ca_file()), "127.0.0.1")
        .await
        .expect_err("a certificate from an unknown CA must be refused");
    let text = err.to_string();
    let expected = format!("tls handshake with {} failed: ", server.addr);
    assert!(text.starts_with(&expected), "{text}");
    assert!(
        text.contains("invalid peer certificate: UnknownIssuer"),
        "{text}"
    );
}

#[tokio::test]
async fn wrong_server_name_fails() {
    let pki = Pki::new();
    let server = echo_server(listen_settings(
        &pki.issue("server", &["redis.internal"]),
        None,
    ))
    .await;
    let err = dial(server.addr, &trusting(pki.ca_file()), "127.0.0.1")
        .await
        .expect_err("a certificate for another name must be refused");
    assert!(err.to_string().contains("not valid for name"), "{err}");
    // The configured server_name overrides the dialed host.
    let named = UpstreamTls {
        server_name: Some("redis.internal".into()),
        ..trusting(pki.ca_file())
    };
    let mut s = dial(server.addr, &named, "127.0.0.1")
        .await
        .expect("by server_name");
    assert_eq!(round_trip(&mut s, b"x").await.expect("echo"), b"x");
}

#[tokio::test]
async fn mutual_tls_requires_a_client_certificate() {
    let (pki, other) = (Pki::new(), Pki::new());
    let mut server = echo_server(listen_settings(
        &pki.issue("server", &["127.0.0.1"]),
        Some(pki.ca_file()),
    ))
    .await;
    let client = pki.issue("client", &["client"]);
    let with_cert = UpstreamTls {
        cert_file: Some(client.cert.clone()),
        key_file: Some(client.key.clone()),
        ..trusting(pki.ca_file())
    };
    let mut s = dial(server.addr, &with_cert, "127.0.0.1")
        .await
        .expect("with cert");
    assert_eq!(round_trip(&mut s, b"hi").await.expect("echo"), b"hi");

    // TLS 1.3 clients finish their side before the server has judged their certificate, so
    // the refusal shows on the server and as a failed first exchange on the client.
    let stranger = other.issue("stranger", &["client"]);
    let cases = [
        (trusting(pki.ca_file()), "peer sent no certificates"),
        (
            UpstreamTls {
                cert_file: Some(stranger.cert),
                key_file: Some(stranger.key),
                ..trusting(pki.ca_file())
            },
            "invalid peer certificate: UnknownIssuer",
        ),
    ];
    for (settings, reason) in cases {
        if let Ok(mut s) = dial(server.addr, &settings, "127.0.0.1").await {
            assert!(round_trip(&mut s, b"hi").await.is_err(), "{reason}: served");
        }
        let failure = server.failures.recv().await.expect("server-side failure");
        assert!(
            failure.starts_with("tls handshake with 127.0.0.1:"),
            "{failure}"
        );
        assert!(failure.contains(reason), "{failure}");
    }
}

#[tokio::test]
async fn reload_swaps_the_certificate_for_new_handshakes_only() {
    let (old_ca, new_ca) = (Pki::new(), Pki::new());
    let files = old_ca.issue("server", &["127.0.0.1"]);
    let server = echo_server(listen_settings(&files, None)).await;
    let mut established = dial(server.addr, &trusting(old_ca.ca_file()), "127.0.0.1")
        .await
        .expect("before reload");

    let fresh = new_ca.issue("server", &["127.0.0.1"]);
    std::fs::copy(&fresh.cert, &files.cert).expect("replace cert");
    std::fs::copy(&fresh.key, &files.key).expect("replace key");
    server.handle.reload().expect("reload");

    let mut renewed = dial(server.addr, &trusting(new_ca.ca_file()), "127.0.0.1")
        .await
        .expect("new handshake uses the new certificate");
    assert_eq!(
        round_trip(&mut renewed, b"new").await.expect("echo"),
        b"new"
    );
    assert!(
        dial(server.addr, &trusting(old_ca.ca_file()), "127.0.0.1")
            .await
            .is_err(),
        "the old certificate is still served"
    );
    assert_eq!(
        round_trip(&mut established, b"old")
            .await
            .expect("established stream survives"),
        b"old"
    );

    // A broken file leaves the running config alone.
    std::fs::write(&files.key, "not a key").expect("break key");
    let err = server.handle.reload().expect_err("reload of a broken key");
    let text = err.to_string();
    assert!(text.starts_with("tls: key_file "), "{text}");
    assert!(text.contains("holds no private key"), "{text}");
    let mut still = dial(server.addr, &trusting(new_ca.ca_file()), "127.0.0.1")
        .await
        .expect("the previous config stays after a failed reload");
    assert_eq!(round_trip(&mut still, b"ok").await.expect("echo"), b"ok");
}

#[tokio::test]
async fn a_mismatched_key_is_refused_at_load() {
    let pki = Pki::new();
    let (a, b) = (
        pki.issue("a", &["127.0.0.1"]),
        pki.issue("b", &["127.0.0.1"]),
    );
    let mixed = CertFiles {
        cert: a.cert,
        key: b.key,
    };
    let err = TlsAcceptorHandle::try_new(&listen_settings(&mixed, None))
        .expect_err("key of another certificate");
    assert!(err.to_string().contains("unusable with cert_file"), "{err}");
}

#[tokio::test]
async fn insecure_skip_verify_accepts_a_self_signed_certificate() {
    let pki = Pki::new();
    let server = echo_server(listen_settings(
        &pki.self_signed("server", &["127.0.0.1"]),
        None,
    ))
    .await;
    let checked = dial(server.addr, &trusting(pki.ca_file()), "127.0.0.1").await;
    assert!(
        checked.is_err(),
        "a self-signed certificate passed verification"
    );
    let insecure = UpstreamTls {
        insecure_skip_verify: true,
        ..UpstreamTls::default()
    };
    let mut s = dial(server.addr, &insecure, "127.0.0.1")
        .await
        .expect("insecure");
    assert_eq!(round_trip(&mut s, b"x").await.expect("echo"), b"x");
}

#[test]
fn unreadable_files_are_named() {
    let missing = UpstreamTls {
        ca_file: Some("/nonexistent/ca.pem".into()),
        ..UpstreamTls::default()
    };
    let err = UpstreamTlsConnector::try_new(&missing).expect_err("missing ca_file");
    assert!(
        err.to_string()
            .starts_with("tls: cannot read ca_file /nonexistent/ca.pem: "),
        "{err}"
    );
    let pki = Pki::new();
    let not_pem = pki.dir.join("empty.pem");
    std::fs::write(&not_pem, "").expect("write");
    let err = UpstreamTlsConnector::try_new(&trusting(not_pem)).expect_err("empty ca_file");
    assert!(
        err.to_string().ends_with("holds no CERTIFICATE block"),
        "{err}"
    );
}

#[test]
fn settings_parse_and_validate() {
    let up: UpstreamTls = toml::from_str(
        "ca_file = \"ca.pem\"\nserver_name = \"redis.internal\"\n\
         cert_file = \"c.pem\"\nkey_file = \"c.key\"\ninsecure_skip_verify = false",
    )
    .expect("the documented keys parse");
    assert_eq!(up.server_name.as_deref(), Some("redis.internal"));
    up.validate().expect("valid");
    assert!(toml::from_str::<UpstreamTls>("ca_fil = \"x\"").is_err());

    let listen: ListenTls = toml::from_str(
        "listen = \"0.0.0.0:6381\"\ncert_file = \"s.pem\"\nkey_file = \"s.key\"\n\
         client_ca_file = \"ca.pem\"",
    )
    .expect("the documented keys parse");
    listen.validate().expect("valid");
    assert!(toml::from_str::<ListenTls>("certfile = \"x\"").is_err());
    let off = ListenTls::default();
    assert!(!off.enabled());
    off.validate().expect("no TLS listener is valid");

    let cases: Vec<(Result<(), TlsError>, &str)> = vec![
        (
            UpstreamTls {
                cert_file: Some("c.pem".into()),
                ..UpstreamTls::default()
            }
            .validate(),
            "upstream.tls: cert_file is set without key_file",
        ),
        (
            UpstreamTls {
                ca_file: Some("ca.pem".into()),
                insecure_skip_verify: true,
                ..UpstreamTls::default()
            }
            .validate(),
            "upstream.tls: ca_file and insecure_skip_verify together",
        ),
        (
            UpstreamTls {
                server_name: Some("not a name".into()),
                ..UpstreamTls::default()
            }
            .validate(),
            "\"not a name\" is not a valid TLS server name",
        ),
        (
            ListenTls {
                key_file: None,
                ..listen.clone()
            }
            .validate(),
            "tls: cert_file is set without key_file",
        ),
        (
            ListenTls {
                listen: String::new(),
                ..listen.clone()
            }
            .validate(),
            "tls: certificates are set but no listen address",
        ),
        (
            ListenTls {
                listen: "nowhere".into(),
                ..listen.clone()
            }
            .validate(),
            "tls.listen: \"nowhere\" is not an IP:PORT address",
        ),
        (
            ListenTls {
                cert_file: None,
                key_file: None,
                ..listen
            }
            .validate(),
            "tls: a TLS listener needs cert_file and key_file",
        ),
    ];
    for (result, expected) in cases {
        let err = result.expect_err(expected).to_string();
        assert!(err.contains(expected), "{err} (wanted {expected})");
    }
}

#[test]
fn ipv6_hosts_work_as_server_names() {
    assert!(settings::server_name("[::1]").is_ok());
    assert!(settings::server_name("::1").is_ok());
    assert!(settings::server_name("10.0.0.1").is_ok());
}

#[tokio::test]
async fn a_plain_client_is_refused_and_the_listener_goes_on() {
    let pki = Pki::new();
    let mut server = echo_server(listen_settings(&pki.issue("server", &["127.0.0.1"]), None)).await;
    let mut plain = TcpStream::connect(server.addr).await.expect("connect");
    plain.write_all(b"PING\r\n").await.expect("write");
    let failure = server.failures.recv().await.expect("server-side failure");
    assert!(
        failure.starts_with("tls handshake with 127.0.0.1:"),
        "{failure}"
    );
    let mut s = dial(server.addr, &trusting(pki.ca_file()), "127.0.0.1")
        .await
        .expect("the next client is served");
    assert_eq!(round_trip(&mut s, b"x").await.expect("echo"), b"x");
}
