//! A plain-to-TLS relay: a local plain TCP port whose connections are carried over TLS to a
//! target (corral's TLS listener, a TLS-only Redis), so the harness's plain clients and
//! compare runner can drive TLS endpoints unchanged.

use std::net::SocketAddr;
use std::path::Path;

use corral::tls::{Stream, UpstreamTls, UpstreamTlsConnector, connect};
use tokio::net::{TcpListener, TcpStream};

/// TLS settings trusting the CA in `ca` and presenting `client` (certificate, key) if given.
pub fn tls_trusting(ca: &Path, client: Option<(&Path, &Path)>) -> UpstreamTls {
    UpstreamTls {
        ca_file: Some(ca.to_path_buf()),
        cert_file: client.map(|c| c.0.to_path_buf()),
        key_file: client.map(|c| c.1.to_path_buf()),
        ..UpstreamTls::default()
    }
}

/// Opens TLS to `target` (verified as 127.0.0.1) with `settings`.
pub async fn tls_dial(target: SocketAddr, settings: &UpstreamTls) -> Result<Stream, String> {
    let connector = UpstreamTlsConnector::try_new(settings).map_err(|e| e.to_string())?;
    let tcp = TcpStream::connect(target)
        .await
        .map_err(|e| format!("tcp connect: {e}"))?;
    connect(tcp, &connector, "127.0.0.1")
        .await
        .map_err(|e| e.to_string())
}

/// Starts a relay to `target` and returns its plain address; it runs until the test's
/// runtime ends. Each accepted connection gets its own TLS connection.
pub async fn tls_relay(target: SocketAddr, settings: UpstreamTls) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind relay");
    let addr = listener.local_addr().expect("relay addr");
    tokio::spawn(async move {
        while let Ok((mut plain, _)) = listener.accept().await {
            let settings = settings.clone();
            tokio::spawn(async move {
                let mut tls = match tls_dial(target, &settings).await {
                    Ok(tls) => tls,
                    // The client then sees its connection reset: say why.
                    Err(e) => return eprintln!("tls relay: dialing {target}: {e}"),
                };
                let _ = tokio::io::copy_bidirectional(&mut plain, &mut tls).await;
            });
        }
    });
    addr
}
