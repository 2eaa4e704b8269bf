//! Error types, grouped by who is at fault, and their mapping to RESP error replies.

use thiserror::Error;

/// A configuration problem found at startup; the message names the field or file.
#[derive(Debug, Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {cause}")]
    Read {
        /// The path given.
        path: String,
        /// The I/O error.
        cause: String,
    },
    /// The TOML did not parse or had unknown fields.
    #[error("invalid config: {0}")]
    Parse(String),
    /// A field parsed but its value is not usable.
    #[error("invalid config: {field}: {why}")]
    Invalid {
        /// Dotted field name, as in the file.
        field: &'static str,
        /// What is wrong with it.
        why: String,
    },
}

/// Why a forwarded request got no reply from the upstream.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum UpstreamError {
    /// No connection to the upstream could be made.
    #[error("upstream {addr} unavailable: {cause}")]
    Unavailable {
        /// The upstream address.
        addr: String,
        /// The last connect error.
        cause: String,
    },
    /// The connection broke while the request was in flight; it may or may not have run.
    #[error("upstream {addr} connection lost: {cause}")]
    ConnectionLost {
        /// The upstream address.
        addr: String,
        /// What broke it.
        cause: String,
    },
    /// The reply did not come within the request timeout.
    #[error("upstream {addr} timed out")]
    Timeout {
        /// The upstream address.
        addr: String,
    },
    /// Too many requests are queued for the upstream connection.
    #[error("upstream {addr} busy: too many queued requests")]
    Busy {
        /// The upstream address.
        addr: String,
    },
    /// The upstream replied with something corral could not use.
    #[error("unexpected upstream reply: {cause}")]
    BadReply {
        /// What was wrong.
        cause: String,
    },
    /// corral is shutting down.
    #[error("corral is shutting down")]
    ShuttingDown,
}

impl UpstreamError {
    /// The RESP error reply a client receives for this failure.
    pub fn to_reply(&self) -> bytes::Bytes {
        bytes::Bytes::from(format!("-ERR {self}\r\n"))
    }

    /// Whether the request certainly did not reach Redis, so it can be retried safely.
    pub fn is_retryable(&self) -> bool {
        matches!(self, UpstreamError::Unavailable { .. })
    }
}

/// A fatal error of the server itself (binding, accepting).
#[derive(Debug, Error)]
pub enum Error {
    /// Bad configuration.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A socket operation that the whole server depends on failed.
    #[error("{what}: {cause}")]
    Io {
        /// What was being done.
        what: String,
        /// The I/O error.
        cause: std::io::Error,
    },
}

/// Result alias for server-level operations.
pub type Result<T> = std::result::Result<T, Error>;
