//! Node addresses as cluster replies and redirections give them.

use std::fmt;

/// A cluster node's `host:port`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Addr {
    /// Host name or IP literal (IPv6 without brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
}

impl Addr {
    /// An address from its parts.
    pub fn new(host: impl Into<String>, port: u16) -> Addr {
        Addr {
            host: host.into(),
            port,
        }
    }

    /// Parses `host:port`, `[v6]:port` or `v6:port` (split at the last colon). An empty host
    /// is kept: Redis writes `:port` for a node whose preferred endpoint it does not know.
    pub fn parse(s: &str) -> Option<Addr> {
        let (host, port) = s.trim().rsplit_once(':')?;
        let port = port.parse().ok()?;
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        Some(Addr::new(host, port))
    }
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // IPv6 literals need brackets to be read back as host:port.
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints_round_trip() {
        for (text, host, port, shown) in [
            ("127.0.0.1:7000", "127.0.0.1", 7000, "127.0.0.1:7000"),
            (
                "node-1.corral.test:6381",
                "node-1.corral.test",
                6381,
                "node-1.corral.test:6381",
            ),
            ("::1:7000", "::1", 7000, "[::1]:7000"),
            ("[fe80::1]:7001", "fe80::1", 7001, "[fe80::1]:7001"),
            (":6381", "", 6381, ":6381"),
        ] {
            let a = Addr::parse(text).unwrap();
            assert_eq!(a, Addr::new(host, port));
            assert_eq!(a.to_string(), shown);
            assert_eq!(Addr::parse(shown), Some(a));
        }
        assert_eq!(Addr::parse("127.0.0.1"), None);
        assert_eq!(Addr::parse("127.0.0.1:70000"), None);
        assert_eq!(Addr::parse("h:"), None);
    }
}
