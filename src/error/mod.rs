//! Error types, grouped by who is at fault ([`Fault`], after pingora's `ErrorSource`), and
//! their mapping to RESP error replies. Every error reply corral makes itself is in
//! [`replies`]; Redis's own error replies are data and pass through untouched.

use std::borrow::Cow;

use bytes::Bytes;
use thiserror::Error;

pub mod replies;

/// Whose fault an error is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The client sent something wrong (bad arguments, a command out of place).
    Client,
    /// The upstream Redis failed, timed out or is unreachable.
    Upstream,
    /// corral itself: its configuration, its sockets, its limits, or something it does not
    /// support.
    Corral,
}

impl Fault {
    /// A short label, for logs and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            Fault::Client => "client",
            Fault::Upstream => "upstream",
            Fault::Corral => "corral",
        }
    }
}

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
    pub fn to_reply(&self) -> Bytes {
        replies::line(&format!("ERR {self}"))
    }
}

/// Any error of corral, saying whose fault it is ([`Error::fault`]): fatal ones of the server
/// itself (configuration, binding) and those that end one request ([`Error::to_reply`]).
#[derive(Debug, Error)]
pub enum Error {
    /// The client's request is wrong; the text is the error reply (see [`replies`]).
    #[error("{0}")]
    Client(Cow<'static, str>),
    /// corral will not do what was asked: a limit is reached or it is not supported; the
    /// text is the error reply (see [`replies`]).
    #[error("{0}")]
    Refused(Cow<'static, str>),
    /// The upstream failed the request.
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
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

impl Error {
    /// Whose fault this is.
    pub fn fault(&self) -> Fault {
        match self {
            Error::Client(_) => Fault::Client,
            Error::Upstream(_) => Fault::Upstream,
            Error::Refused(_) | Error::Config(_) | Error::Io { .. } => Fault::Corral,
        }
    }

    /// The RESP error reply a client receives for this error.
    pub fn to_reply(&self) -> Bytes {
        match self {
            Error::Client(text) | Error::Refused(text) => replies::line(text),
            Error::Upstream(e) => e.to_reply(),
            Error::Config(_) | Error::Io { .. } => replies::line(&format!("ERR {self}")),
        }
    }
}

/// Result alias for server-level operations.
pub type Result<T> = std::result::Result<T, Error>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_say_whose_fault_it_is() {
        let up = Error::from(UpstreamError::Timeout {
            addr: "db:6379".into(),
        });
        assert_eq!(up.fault(), Fault::Upstream);
        assert_eq!(&up.to_reply()[..], b"-ERR upstream db:6379 timed out\r\n");
        let refused = Error::Refused(replies::TOO_MANY_DEDICATED.text().into());
        assert_eq!(refused.fault(), Fault::Corral);
        assert_eq!(&refused.to_reply()[..], replies::TOO_MANY_DEDICATED.wire());
        let client = Error::Client(replies::EXEC_WITHOUT_MULTI.text().into());
        assert_eq!(client.fault(), Fault::Client);
        assert_eq!(&client.to_reply()[..], b"-ERR EXEC without MULTI\r\n");
    }
}
