//! The upstream side: a rustls client config from `[upstream.tls]`, and the handshake.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::{ClientConfig, DigitallySignedStruct, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;

use super::settings::server_name;
use super::{Stream, TlsError, UpstreamTls, pem, provider};

/// What [`connect`] needs to open TLS to any upstream node: built once per config load and
/// shared (cloning is cheap) by every connection.
#[derive(Clone)]
pub struct UpstreamTlsConnector {
    connector: TlsConnector,
    /// `server_name` from the settings; when unset, each node's own host is used.
    server_name: Option<ServerName<'static>>,
}

impl std::fmt::Debug for UpstreamTlsConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpstreamTlsConnector")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl UpstreamTlsConnector {
    /// Validates the settings and reads the files they name.
    pub fn try_new(settings: &UpstreamTls) -> Result<UpstreamTlsConnector, TlsError> {
        settings.validate()?;
        let server_name = settings
            .server_name
            .as_deref()
            .map(server_name)
            .transpose()?;
        let config = client_config(settings)?;
        Ok(UpstreamTlsConnector {
            connector: TlsConnector::from(Arc::new(config)),
            server_name,
        })
    }
}

/// Runs the TLS handshake on a freshly dialed connection to `host` (the URL's or the cluster
/// node's host, checked against the certificate unless `server_name` is set). The caller's
/// connect deadline should cover this call too: a server that accepts TCP but never answers
/// the handshake would otherwise hold it forever.
pub async fn connect(
    tcp: TcpStream,
    tls: &UpstreamTlsConnector,
    host: &str,
) -> Result<Stream, TlsError> {
    let name = match &tls.server_name {
        Some(name) => name.clone(),
        None => server_name(host)?,
    };
    let peer = tcp
        .peer_addr()
        .map_or_else(|_| host.to_owned(), |a| a.to_string());
    match tls.connector.connect(name, tcp).await {
        Ok(s) => Ok(Stream::Tls(Box::new(s.into()))),
        Err(source) => Err(TlsError::Handshake { peer, source }),
    }
}

fn client_config(settings: &UpstreamTls) -> Result<ClientConfig, TlsError> {
    let provider = provider();
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Invalid(format!("upstream.tls: {e}")))?;
    let builder = if settings.insecure_skip_verify {
        tracing::warn!(
            "upstream.tls.insecure_skip_verify is ON: the upstream's certificate is NOT checked; \
             anyone on the network path can impersonate Redis. Use this for tests only."
        );
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(SkipVerify(provider)))
    } else {
        let roots = match &settings.ca_file {
            Some(path) => pem::roots("ca_file", path)?,
            None => pem::system_roots()?,
        };
        builder.with_root_certificates(roots)
    };
    match (&settings.cert_file, &settings.key_file) {
        (Some(cert), Some(key)) => {
            let chain = pem::certs("cert_file", cert)?;
            let private = pem::key("key_file", key)?;
            builder
                .with_client_auth_cert(chain, private)
                .map_err(|e| TlsError::Content {
                    field: "key_file",
                    path: key.clone(),
                    why: format!("unusable with cert_file {}: {e}", cert.display()),
                })
        }
        _ => Ok(builder.with_no_client_auth()),
    }
}

/// Accepts any certificate but still checks the handshake signatures, so the session is at
/// least bound to the key the server presented.
#[derive(Debug)]
struct SkipVerify(Arc<CryptoProvider>);

impl ServerCertVerifier for SkipVerify {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}
