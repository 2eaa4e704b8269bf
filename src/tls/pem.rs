//! Reading certificates and keys from PEM files, with errors that name the field and file.

use std::path::Path;

use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use super::TlsError;

/// Every certificate in a PEM file; at least one.
pub(super) fn certs(
    field: &'static str,
    path: &Path,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bytes = read(field, path)?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| content(field, path, format!("not valid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(content(field, path, "holds no CERTIFICATE block".into()));
    }
    Ok(certs)
}

/// The first private key in a PEM file.
pub(super) fn key(field: &'static str, path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let bytes = read(field, path)?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| match e {
        rustls_pki_types::pem::Error::NoItemsFound => content(
            field,
            path,
            "holds no private key (PKCS#8, PKCS#1 or SEC1 PEM; encrypted keys are not supported)"
                .into(),
        ),
        e => content(field, path, format!("not valid PEM: {e}")),
    })
}

/// A trust store of every certificate in a PEM bundle.
pub(super) fn roots(field: &'static str, path: &Path) -> Result<RootCertStore, TlsError> {
    let mut store = RootCertStore::empty();
    for cert in certs(field, path)? {
        store
            .add(cert)
            .map_err(|e| content(field, path, format!("unusable CA certificate: {e}")))?;
    }
    Ok(store)
}

/// The operating system's trust store (as OpenSSL would find it: `SSL_CERT_FILE`,
/// `SSL_CERT_DIR`, else the distribution's bundle).
pub(super) fn system_roots() -> Result<RootCertStore, TlsError> {
    let found = rustls_native_certs::load_native_certs();
    let mut store = RootCertStore::empty();
    let (_added, ignored) = store.add_parsable_certificates(found.certs);
    if ignored > 0 || !found.errors.is_empty() {
        tracing::debug!(
            ignored,
            errors = found.errors.len(),
            "tls: some system root certificates were skipped"
        );
    }
    if store.is_empty() {
        return Err(TlsError::Invalid(
            "upstream.tls: no system root certificates found (install ca-certificates) \
             and no ca_file set"
                .into(),
        ));
    }
    Ok(store)
}

fn read(field: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        field,
        path: path.to_owned(),
        source,
    })
}

fn content(field: &'static str, path: &Path, why: String) -> TlsError {
    TlsError::Content {
        field,
        path: path.to_owned(),
        why,
    }
}
