//! Cluster error replies that tell a client to go elsewhere or to try again.

use super::addr::Addr;
use super::slot::SLOTS;

/// What a cluster error reply asks of the client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Redirect {
    /// `-MOVED slot addr`: the slot now lives at `addr`; update the slot map and retry there.
    Moved {
        /// The slot that moved.
        slot: u16,
        /// The new owner. An empty host (Redis sent `:port`) means the host of the node that
        /// sent the redirection.
        addr: Addr,
    },
    /// `-ASK slot addr`: during a migration, retry this one request at `addr` after `ASKING`;
    /// the slot map is not changed.
    Ask {
        /// The slot being migrated.
        slot: u16,
        /// `host:port` of the importing node.
        addr: Addr,
    },
    /// `-TRYAGAIN ...`: a multi-key request hit a slot mid-migration; retry after a pause.
    TryAgain,
    /// `-CLUSTERDOWN ...`: the cluster (or the slot) is not served right now; retry after a
    /// pause, and refresh the topology.
    ClusterDown,
}

impl Redirect {
    /// Parses an error reply (`-...\r\n`, the whole frame or just its text after `-`). `None`
    /// for any other reply, including malformed MOVED/ASK errors.
    pub fn parse(reply: &[u8]) -> Option<Redirect> {
        let text = reply.strip_prefix(b"-").unwrap_or(reply);
        let text = text.strip_suffix(b"\r\n").unwrap_or(text);
        let (code, rest) = match text.iter().position(|&c| c == b' ') {
            Some(i) => (&text[..i], &text[i + 1..]),
            None => (text, &b""[..]),
        };
        match code {
            b"MOVED" => {
                let (slot, addr) = slot_and_addr(rest)?;
                Some(Redirect::Moved { slot, addr })
            }
            b"ASK" => {
                let (slot, addr) = slot_and_addr(rest)?;
                Some(Redirect::Ask { slot, addr })
            }
            b"TRYAGAIN" => Some(Redirect::TryAgain),
            b"CLUSTERDOWN" => Some(Redirect::ClusterDown),
            _ => None,
        }
    }
}

/// `slot host:port`, with a slot in range.
fn slot_and_addr(rest: &[u8]) -> Option<(u16, Addr)> {
    let rest = std::str::from_utf8(rest).ok()?;
    let (slot, addr) = rest.split_once(' ')?;
    let slot: u16 = slot.parse().ok()?;
    if usize::from(slot) >= SLOTS {
        return None;
    }
    Some((slot, Addr::parse(addr)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(host: &str, port: u16) -> Addr {
        Addr::new(host, port)
    }

    #[test]
    fn parses_real_redirections() {
        // Replies captured from Redis 7.0 during a slot migration.
        assert_eq!(
            Redirect::parse(b"-MOVED 12182 127.0.0.1:17004\r\n"),
            Some(Redirect::Moved {
                slot: 12182,
                addr: addr("127.0.0.1", 17004)
            })
        );
        assert_eq!(
            Redirect::parse(b"-ASK 5061 127.0.0.1:17002\r\n"),
            Some(Redirect::Ask {
                slot: 5061,
                addr: addr("127.0.0.1", 17002)
            })
        );
        assert_eq!(
            Redirect::parse(b"-TRYAGAIN Multiple keys request during rehashing of slot\r\n"),
            Some(Redirect::TryAgain)
        );
        assert_eq!(
            Redirect::parse(b"-CLUSTERDOWN The cluster is down\r\n"),
            Some(Redirect::ClusterDown)
        );
        assert_eq!(
            Redirect::parse(b"-CLUSTERDOWN Hash slot not served\r\n"),
            Some(Redirect::ClusterDown)
        );
    }

    #[test]
    fn parses_hostnames_ipv6_and_unknown_endpoints() {
        assert_eq!(
            Redirect::parse(b"MOVED 3999 node-1.corral.test:6381"),
            Some(Redirect::Moved {
                slot: 3999,
                addr: addr("node-1.corral.test", 6381)
            })
        );
        let v6 = Redirect::parse(b"-ASK 1 ::1:7000\r\n");
        assert_eq!(
            v6,
            Some(Redirect::Ask {
                slot: 1,
                addr: addr("::1", 7000)
            })
        );
        if let Some(Redirect::Ask { addr, .. }) = v6 {
            assert_eq!(addr.to_string(), "[::1]:7000");
        }
        assert_eq!(
            Redirect::parse(b"-MOVED 2 [fe80::1]:7001\r\n"),
            Some(Redirect::Moved {
                slot: 2,
                addr: addr("fe80::1", 7001)
            })
        );
        // Redis sends ":port" when the node's preferred endpoint is unknown.
        assert_eq!(
            Redirect::parse(b"-MOVED 3999 :6381\r\n"),
            Some(Redirect::Moved {
                slot: 3999,
                addr: addr("", 6381)
            })
        );
    }

    #[test]
    fn other_and_malformed_replies_are_not_redirections() {
        for reply in [
            &b"-ERR unknown command\r\n"[..],
            b"+OK\r\n",
            b"$5\r\nMOVED\r\n",
            b"-MOVED\r\n",
            b"-MOVED 16384 127.0.0.1:7000\r\n",
            b"-MOVED x 127.0.0.1:7000\r\n",
            b"-MOVED 1 127.0.0.1\r\n",
            b"-ASK 1 127.0.0.1:99999\r\n",
            b"-CROSSSLOT Keys in request don't hash to the same slot\r\n",
            b"-MOVEDX 1 a:1\r\n",
            b"",
        ] {
            assert_eq!(
                Redirect::parse(reply),
                None,
                "{:?}",
                String::from_utf8_lossy(reply)
            );
        }
    }
}
