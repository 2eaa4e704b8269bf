//! `redis://[user[:password]@]host:port` upstream addresses (`rediss://` for TLS).

use std::fmt;

/// A parsed upstream URL.
#[derive(Clone, PartialEq, Eq)]
pub struct UpstreamUrl {
    /// `host:port`, as given to `TcpStream::connect`.
    pub addr: String,
    /// ACL user name, if any.
    pub user: Option<String>,
    /// Password, if any.
    pub password: Option<String>,
    /// `rediss://`: connect with TLS (`[upstream.tls]` says how to verify the server).
    pub tls: bool,
}

impl fmt::Debug for UpstreamUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpstreamUrl")
            .field("addr", &self.addr)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "MASKED"))
            .field("tls", &self.tls)
            .finish()
    }
}

impl UpstreamUrl {
    /// Parses `redis://[user[:password]@]host[:port][/0]`, or `rediss://` (TLS); the port
    /// defaults to 6379 for both, as redis-cli has it. User and password may be
    /// percent-encoded.
    ///
    /// # Errors
    /// A description of what is wrong with the URL.
    pub fn parse(url: &str) -> Result<UpstreamUrl, String> {
        let (tls, rest) = match url.strip_prefix("rediss://") {
            Some(rest) => (true, rest),
            None => (
                false,
                url.strip_prefix("redis://").ok_or_else(|| {
                    format!("{:?} must start with redis:// or rediss://", redact(url))
                })?,
            ),
        };
        let (auth, hostport) = match rest.rsplit_once('@') {
            Some((a, h)) => (Some(a), h),
            None => (None, rest),
        };
        let hostport = match hostport.split_once('/') {
            Some((h, "" | "0")) => h,
            Some(_) => return Err("only database 0 is supported in the URL".into()),
            None => hostport,
        };
        if hostport.is_empty() {
            return Err(format!("{:?} has no host", redact(url)));
        }
        let addr = if hostport.ends_with(']') || !hostport.contains(':') {
            format!("{hostport}:6379")
        } else {
            let (_, port) = hostport.rsplit_once(':').unwrap_or_default();
            port.parse::<u16>()
                .map_err(|_| format!("{:?} has an invalid port", redact(url)))?;
            hostport.to_string()
        };
        let (user, password) = match auth {
            None => (None, None),
            Some(a) => match a.split_once(':') {
                Some((u, p)) => (non_empty(decode(u)?), Some(decode(p)?)),
                // `redis://secret@host` is a password alone, as redis-cli reads it.
                None => (None, Some(decode(a)?)),
            },
        };
        Ok(UpstreamUrl {
            addr,
            user,
            password,
            tls,
        })
    }

    /// The host part of `addr` (brackets of an IPv6 address kept): the name a TLS server
    /// certificate is checked against unless `upstream.tls.server_name` says otherwise.
    pub fn host(&self) -> &str {
        host_of(&self.addr)
    }
}

/// The host of a `host:port` address.
pub fn host_of(addr: &str) -> &str {
    addr.rsplit_once(':').map_or(addr, |(h, _)| h)
}

/// The URL with any credentials replaced by `MASKED`: error messages quote the URL, and a
/// config error is printed and logged.
fn redact(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => match rest.rsplit_once('@') {
            Some((_, hostport)) => format!("{scheme}://MASKED@{hostport}"),
            None => url.to_string(),
        },
        None => url
            .split_once('@')
            .map_or(url.to_string(), |(_, h)| format!("MASKED@{h}")),
    }
}

fn non_empty(s: String) -> Option<String> {
    (!s.is_empty()).then_some(s)
}

fn decode(s: &str) -> Result<String, String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = s.get(i + 1..i + 3).ok_or("bad percent escape")?;
            out.push(u8::from_str_radix(hex, 16).map_err(|_| "bad percent escape")?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).map_err(|_| "credentials are not UTF-8".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_all_forms() {
        let u = UpstreamUrl::parse("redis://127.0.0.1:7000").unwrap();
        assert_eq!(
            (u.addr.as_str(), u.user, u.password),
            ("127.0.0.1:7000", None, None)
        );
        let u = UpstreamUrl::parse("redis://app:p%40ss@db:6380/0").unwrap();
        assert_eq!(u.addr, "db:6380");
        assert_eq!(u.user.as_deref(), Some("app"));
        assert_eq!(u.password.as_deref(), Some("p@ss"));
        let u = UpstreamUrl::parse("redis://:secret@localhost").unwrap();
        assert_eq!(
            (u.addr.as_str(), u.user, u.password.as_deref()),
            ("localhost:6379", None, Some("secret"))
        );
    }

    #[test]
    fn rejects_bad_urls() {
        assert!(UpstreamUrl::parse("http://x").is_err());
        assert!(UpstreamUrl::parse("redis://x:99999").is_err());
        assert!(UpstreamUrl::parse("redis://x/3").is_err());
        assert!(UpstreamUrl::parse("redis://").is_err());
    }

    #[test]
    fn rediss_is_tls_with_the_same_default_port() {
        let u = UpstreamUrl::parse("rediss://u:p@db.internal").unwrap();
        assert!(u.tls);
        assert_eq!(
            (u.addr.as_str(), u.host()),
            ("db.internal:6379", "db.internal")
        );
        assert!(!UpstreamUrl::parse("redis://db").unwrap().tls);
        assert_eq!(
            UpstreamUrl::parse("rediss://[::1]:7000").unwrap().host(),
            "[::1]"
        );
    }

    #[test]
    fn errors_never_quote_the_password() {
        for bad in [
            "rediss://u:hunter2@db:99999",
            "http://u:hunter2@db",
            "rediss://u:hunter2@",
        ] {
            let e = UpstreamUrl::parse(bad).unwrap_err();
            assert!(!e.contains("hunter2"), "{e}");
        }
    }
}
