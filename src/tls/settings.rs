//! The `[upstream.tls]` and `[tls]` config sections and their validation.

use std::path::PathBuf;

use rustls_pki_types::ServerName;
use serde::Deserialize;

use super::TlsError;

/// `[upstream.tls]`: how corral verifies (and authenticates to) a `rediss://` upstream. Used
/// for every connection to every node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamTls {
    /// PEM bundle of the certificate authorities trusted for the upstream; none means the
    /// system's roots.
    pub ca_file: Option<PathBuf>,
    /// Name the server certificate is checked against (and sent as SNI); none means the host
    /// of the URL, or of the cluster node, being dialed. An IP address is allowed.
    pub server_name: Option<String>,
    /// PEM certificate chain presented to the upstream (mutual TLS); needs `key_file`.
    pub cert_file: Option<PathBuf>,
    /// PEM private key for `cert_file` (PKCS#8, PKCS#1 or SEC1; not encrypted).
    pub key_file: Option<PathBuf>,
    /// Accept any server certificate. For tests only: logged as a warning each time the
    /// settings are loaded.
    pub insecure_skip_verify: bool,
}

impl UpstreamTls {
    /// Checks the settings without reading any file.
    pub fn validate(&self) -> Result<(), TlsError> {
        pair_check(&self.cert_file, &self.key_file, "upstream.tls")?;
        if self.insecure_skip_verify && self.ca_file.is_some() {
            return Err(TlsError::Invalid(
                "upstream.tls: ca_file and insecure_skip_verify together: \
                 the CA would never be checked; drop one"
                    .into(),
            ));
        }
        if let Some(name) = &self.server_name {
            server_name(name)?;
        }
        Ok(())
    }
}

/// `[tls]`: the TLS listener for clients (also set by `--tls-listen ADDR`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ListenTls {
    /// Address of the TLS listener, beside the plain one; empty means no TLS listener.
    pub listen: String,
    /// PEM certificate chain presented to clients, leaf first.
    pub cert_file: Option<PathBuf>,
    /// PEM private key for `cert_file` (PKCS#8, PKCS#1 or SEC1; not encrypted).
    pub key_file: Option<PathBuf>,
    /// PEM bundle of the authorities client certificates must chain to; set, every client
    /// must present a valid certificate.
    pub client_ca_file: Option<PathBuf>,
}

impl ListenTls {
    /// True when a TLS listener is configured.
    pub fn enabled(&self) -> bool {
        !self.listen.is_empty()
    }

    /// Checks the settings without reading any file.
    pub fn validate(&self) -> Result<(), TlsError> {
        pair_check(&self.cert_file, &self.key_file, "tls")?;
        if !self.enabled() {
            if self.cert_file.is_some() || self.client_ca_file.is_some() {
                return Err(TlsError::Invalid(
                    "tls: certificates are set but no listen address (tls.listen or --tls-listen)"
                        .into(),
                ));
            }
            return Ok(());
        }
        if self.listen.parse::<std::net::SocketAddr>().is_err() {
            return Err(TlsError::Invalid(format!(
                "tls.listen: {:?} is not an IP:PORT address",
                self.listen
            )));
        }
        if self.cert_file.is_none() {
            return Err(TlsError::Invalid(
                "tls: a TLS listener needs cert_file and key_file".into(),
            ));
        }
        Ok(())
    }
}

fn pair_check(
    cert: &Option<PathBuf>,
    key: &Option<PathBuf>,
    section: &str,
) -> Result<(), TlsError> {
    match (cert, key) {
        (Some(_), None) => Err(TlsError::Invalid(format!(
            "{section}: cert_file is set without key_file"
        ))),
        (None, Some(_)) => Err(TlsError::Invalid(format!(
            "{section}: key_file is set without cert_file"
        ))),
        _ => Ok(()),
    }
}

/// Parses a verification name: a DNS name or an IP address (with or without the brackets an
/// IPv6 host has in a URL).
pub(super) fn server_name(name: &str) -> Result<ServerName<'static>, TlsError> {
    let bare = name
        .strip_prefix('[')
        .and_then(|n| n.strip_suffix(']'))
        .unwrap_or(name);
    ServerName::try_from(bare.to_owned())
        .map_err(|_| TlsError::Invalid(format!("{name:?} is not a valid TLS server name")))
}
