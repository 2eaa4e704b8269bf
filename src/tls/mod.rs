//! TLS on both sides of the proxy, with rustls (ring provider; no OpenSSL).
//!
//! - [`UpstreamTls`] (`[upstream.tls]`) builds an [`UpstreamTlsConnector`]; [`connect`] turns a
//!   dialed `TcpStream` into a TLS [`Stream`] to a Redis node.
//! - [`ListenTls`] (`[tls]`) builds a [`TlsAcceptorHandle`], whose [`reload`] re-reads the
//!   certificate files for new handshakes without touching connected clients.
//! - [`Stream`] is plain TCP or TLS behind one type, so the connection code is written once.
//!
//! Key material never leaves this module: errors name files and fields, never their contents.
//!
//! [`reload`]: TlsAcceptorHandle::reload

mod client;
mod pem;
mod server;
mod settings;
mod stream;
#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;

pub use client::{UpstreamTlsConnector, connect};
pub use server::TlsAcceptorHandle;
pub use settings::{ListenTls, UpstreamTls};
pub use stream::{ReadHalf, Stream, WriteHalf};

/// Why TLS could not be set up or a handshake failed. Messages start with `tls` and name the
/// field and file (or the peer) involved.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The settings contradict each other or a value is unusable.
    #[error("tls: {0}")]
    Invalid(String),
    /// A file named in the settings could not be read.
    #[error("tls: cannot read {field} {}: {source}", path.display())]
    Read {
        /// The settings field that names the file (`ca_file`, `key_file`, ...).
        field: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file was read but does not hold what its field calls for.
    #[error("tls: {field} {}: {why}", path.display())]
    Content {
        /// The settings field that names the file.
        field: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong with it (never its contents).
        why: String,
    },
    /// The handshake with a peer failed (bad certificate, wrong name, not TLS, ...).
    #[error("tls handshake with {peer} failed: {source}")]
    Handshake {
        /// The peer's address.
        peer: String,
        /// rustls's reason, carried in an I/O error.
        source: std::io::Error,
    },
}

/// The crypto provider every config is built with. Named explicitly rather than taken from the
/// process default, so a dependency enabling a second provider cannot make config building
/// ambiguous.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}
