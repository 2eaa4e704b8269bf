//! The client side: a rustls server config from `[tls]`, swappable at run time.

use std::sync::{Arc, PoisonError, RwLock};

use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use tokio::net::TcpStream;
use tokio_rustls::TlsAcceptor;

use super::{ListenTls, Stream, TlsError, pem, provider};

/// The TLS listener's certificates, reloadable: [`reload`](Self::reload) re-reads the files
/// and later handshakes use them, while established sessions keep the config they began with.
/// Share it as `Arc<TlsAcceptorHandle>` between the accept loop and the reload trigger.
#[derive(Debug)]
pub struct TlsAcceptorHandle {
    settings: ListenTls,
    /// A plain lock read once per accepted connection: the read is nanoseconds next to a
    /// handshake, and writes happen only on reload.
    current: RwLock<Arc<ServerConfig>>,
}

impl TlsAcceptorHandle {
    /// Validates the settings and reads the files they name.
    pub fn try_new(settings: &ListenTls) -> Result<TlsAcceptorHandle, TlsError> {
        settings.validate()?;
        let config = server_config(settings)?;
        Ok(TlsAcceptorHandle {
            settings: settings.clone(),
            current: RwLock::new(config),
        })
    }

    /// The settings the handle was built from.
    pub fn settings(&self) -> &ListenTls {
        &self.settings
    }

    /// Re-reads the certificate, key and client CA files. On error the previous config stays
    /// in use and the error says which file failed.
    pub fn reload(&self) -> Result<(), TlsError> {
        let fresh = server_config(&self.settings)?;
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = fresh;
        Ok(())
    }

    /// Runs the server handshake on an accepted connection. Call it in the client's own task,
    /// under a deadline: a client that connects and sends nothing would otherwise stall
    /// whoever awaits this.
    pub async fn accept(&self, tcp: TcpStream) -> Result<Stream, TlsError> {
        let config = self
            .current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let peer = tcp
            .peer_addr()
            .map_or_else(|_| "a client".to_owned(), |a| a.to_string());
        match TlsAcceptor::from(config).accept(tcp).await {
            Ok(s) => Ok(Stream::Tls(Box::new(s.into()))),
            Err(source) => Err(TlsError::Handshake { peer, source }),
        }
    }
}

fn server_config(settings: &ListenTls) -> Result<Arc<ServerConfig>, TlsError> {
    let (Some(cert), Some(key)) = (&settings.cert_file, &settings.key_file) else {
        return Err(TlsError::Invalid(
            "tls: a TLS listener needs cert_file and key_file".into(),
        ));
    };
    let builder = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Invalid(format!("tls: {e}")))?;
    let builder = match &settings.client_ca_file {
        Some(path) => {
            let roots = pem::roots("client_ca_file", path)?;
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .build()
                .map_err(|e| TlsError::Content {
                    field: "client_ca_file",
                    path: path.clone(),
                    why: e.to_string(),
                })?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let chain = pem::certs("cert_file", cert)?;
    let private = pem::key("key_file", key)?;
    let config = builder
        .with_single_cert(chain, private)
        .map_err(|e| TlsError::Content {
            field: "key_file",
            path: key.clone(),
            why: format!("unusable with cert_file {}: {e}", cert.display()),
        })?;
    Ok(Arc::new(config))
}
