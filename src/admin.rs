//! The admin HTTP endpoint: `GET /healthz` and `GET /metrics` (Prometheus text format).
//!
//! Two fixed routes answered with `Connection: close` need only a request line, so this is a
//! small HTTP/1.x responder rather than a web framework.

use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::timeout;
use tokio_util::sync::CancellationToken;
use tracing::debug;

use crate::server::Shared;

const MAX_HEAD: usize = 8 * 1024;

/// Serves admin requests until `shutdown`.
pub async fn serve(listener: TcpListener, shared: Arc<Shared>, shutdown: CancellationToken) {
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = shutdown.cancelled() => return,
        };
        let Ok((stream, _)) = accepted else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let shared = shared.clone();
        tokio::spawn(async move {
            if let Err(e) = timeout(Duration::from_secs(5), respond(stream, &shared)).await {
                debug!(cause = %e, "admin request timed out");
            }
        });
    }
}

async fn respond(mut stream: TcpStream, shared: &Shared) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && !head.windows(2).any(|w| w == b"\n\n") {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        head.extend_from_slice(&chunk[..n]);
        if head.len() > MAX_HEAD {
            return write(
                &mut stream,
                "431 Request Header Fields Too Large",
                "text/plain",
                "too large\n",
            )
            .await;
        }
    }
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let mut parts = line.split(|&b| b == b' ');
    let method = parts.next().unwrap_or_default();
    let path = parts.next().unwrap_or_default();
    if method != b"GET" && method != b"HEAD" {
        return write(
            &mut stream,
            "405 Method Not Allowed",
            "text/plain",
            "use GET\n",
        )
        .await;
    }
    match path {
        b"/metrics" => {
            let status = &shared.upstream.status;
            let m = &shared.metrics;
            m.upstream_connections.set(status.connected_count() as i64);
            m.user_pools.set(shared.upstream.users.counts().0 as i64);
            if let Some(cache) = &shared.cache {
                cache.update_gauges();
            }
            let body = m.render();
            write(
                &mut stream,
                "200 OK",
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
                &body,
            )
            .await
        }
        b"/healthz" => {
            // Refused (credentials, TLS): unhealthy even while connections made before still
            // work, since no new one can be made.
            if let Some(why) = shared.upstream.status.refused() {
                let body = format!("upstream refuses corral: {why}\n");
                write(&mut stream, "503 Service Unavailable", "text/plain", &body).await
            } else if shared.upstream.status.connected_count() > 0 {
                write(&mut stream, "200 OK", "text/plain", "ok\n").await
            } else {
                let why = shared
                    .upstream
                    .status
                    .last_error()
                    .unwrap_or_else(|| "connecting".into());
                let body = format!("upstream unavailable: {why}\n");
                write(&mut stream, "503 Service Unavailable", "text/plain", &body).await
            }
        }
        _ => write(&mut stream, "404 Not Found", "text/plain", "not found\n").await,
    }
}

async fn write(
    stream: &mut TcpStream,
    status: &str,
    ctype: &str,
    body: &str,
) -> std::io::Result<()> {
    let resp = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(resp.as_bytes()).await?;
    stream.shutdown().await
}
