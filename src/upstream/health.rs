//! Liveness of one long-lived connection ([`Health`]): after `check` without a byte from the
//! upstream and with nothing outstanding, the connection owes a `PING`; no byte within
//! `deadline` of it means the connection is half-open (a NAT or firewall dropped the flow, the
//! peer is gone without a FIN), so it is declared dead and replaced.
//!
//! This file only decides; the link writes the PING and ends the connection.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::settings::Health;
use super::status::NodeLife;

/// What the link must do after a check.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Due {
    /// Nothing now; look again at this instant.
    Wait(Instant),
    /// Send a PING now (its reply is consumed by the link); look again at this instant.
    Ping(Instant),
}

/// Why a connection was declared dead: nothing came back in time.
#[derive(Debug)]
pub(super) struct Dead(pub(super) String);

/// The liveness state of one live connection.
#[derive(Debug)]
pub(super) struct Liveness {
    health: Health,
    /// When the node was last heard from on any health-checked connection.
    life: Arc<NodeLife>,
    /// When the last bytes arrived (or the connection was made): the last sign of life.
    last_rx: Instant,
    /// When the connection last went from idle to busy.
    busy_since: Instant,
    /// When the outstanding health-check PING was sent.
    probe_sent: Option<Instant>,
}

impl Liveness {
    /// A connection made at `now` to the node whose life is `life`.
    pub(super) fn new(health: Health, life: Arc<NodeLife>, now: Instant) -> Liveness {
        Liveness {
            health,
            life,
            last_rx: now,
            busy_since: now,
            probe_sent: None,
        }
    }

    /// The first check is due this long after the connection is made.
    pub(super) fn first_check(&self) -> Duration {
        self.health.check
    }

    /// Bytes arrived at `now`: a sign of life, of this connection and of its node.
    pub(super) fn heard(&mut self, now: Instant) {
        self.last_rx = now;
        self.life.heard_at(now);
    }

    /// A request went out on an idle connection at `now`.
    pub(super) fn went_busy(&mut self, now: Instant) {
        self.busy_since = now;
    }

    /// The reply to the health-check PING arrived.
    pub(super) fn probe_answered(&mut self) {
        self.probe_sent = None;
    }

    /// Runs the check due at `now` on a connection with (`idle` false) or without requests
    /// outstanding. The timer is not touched on the hot path: it fires, and this works out
    /// from the current state whether anything is due yet. Activity moves every deadline
    /// later, except that a busy connection going idle owes a PING `check` after its last
    /// reply: so a busy connection is looked at again within `check`, and the PING is never
    /// late.
    pub(super) fn check(&mut self, idle: bool, now: Instant) -> Result<Due, Dead> {
        let h = self.health;
        if let Some(sent) = self.probe_sent {
            return self.await_probe(sent, now).map(Due::Wait);
        }
        if idle {
            let due = self.last_rx + h.check;
            if now < due {
                return Ok(Due::Wait(due));
            }
            self.busy_since = now;
            self.probe_sent = Some(now);
            return Ok(Due::Ping(now + h.deadline));
        }
        if h.strict {
            let due = (self.last_rx + h.check).max(self.busy_since) + h.deadline;
            if now >= due {
                return Err(Dead(format!(
                    "no reply within {} ms",
                    (h.check + h.deadline).as_millis()
                )));
            }
            return Ok(Due::Wait(due.min(now + h.check)));
        }
        // Busy shared connection: its requests are bounded by the request timeout.
        Ok(Due::Wait(now + h.check))
    }

    /// A PING sent at `sent` is outstanding: the connection is dead once `deadline` passed
    /// without a byte.
    fn await_probe(&self, sent: Instant, now: Instant) -> Result<Instant, Dead> {
        let h = self.health;
        let due = sent.max(self.last_rx) + h.deadline;
        if now >= due && !h.strict && !self.life.heard_since(sent) {
            // No connection to this node has heard a byte since the PING went out: Redis
            // itself is not answering (a script before its BUSY threshold, a slow command, or
            // the node unreachable as a whole), not this one flow. Replacing the connection
            // would not help; requests in flight keep `request_timeout_ms`.
            return Ok(now + h.deadline);
        }
        if now >= due {
            return Err(Dead(format!(
                "no reply to a health-check PING within {} ms",
                h.deadline.as_millis()
            )));
        }
        Ok(due)
    }

    /// When the last bytes arrived.
    #[cfg(test)]
    pub(super) fn last_heard(&self) -> Instant {
        self.last_rx
    }

    /// Whether a health-check PING awaits its reply.
    #[cfg(test)]
    pub(super) fn probe_outstanding(&self) -> bool {
        self.probe_sent.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn liveness(strict: bool) -> Liveness {
        let h = Health {
            check: ms(500),
            deadline: ms(300),
            strict,
        };
        Liveness::new(h, Arc::default(), Instant::now())
    }

    #[test]
    fn a_silent_node_is_busy_not_a_dead_connection() {
        let mut l = liveness(false);
        let t0 = l.last_heard();
        l.life.heard_at(t0);
        assert_eq!(
            l.check(true, t0 + ms(500)).ok(),
            Some(Due::Ping(t0 + ms(800)))
        );
        // Nothing from the node on any connection since the PING: Redis is busy (a script
        // before its BUSY threshold), so the connection is kept and looked at again.
        assert_eq!(
            l.check(true, t0 + ms(800)).ok(),
            Some(Due::Wait(t0 + ms(1100)))
        );
        assert_eq!(
            l.check(true, t0 + ms(5000)).ok(),
            Some(Due::Wait(t0 + ms(5300)))
        );
        // A strict connection (a tracking lane) cannot vouch for the cache either way.
        let mut lane = liveness(true);
        let t1 = lane.last_heard();
        assert!(matches!(lane.check(true, t1 + ms(500)), Ok(Due::Ping(_))));
        assert!(lane.check(true, t1 + ms(800)).is_err());
    }

    #[test]
    fn busy_shared_connections_are_left_to_the_request_timeout() {
        let mut l = liveness(false);
        let t0 = l.last_heard();
        l.went_busy(t0);
        assert!(matches!(l.check(false, t0 + ms(60_000)), Ok(Due::Wait(_))));
    }

    #[test]
    fn a_strict_connection_dies_when_a_request_goes_unanswered() {
        let mut l = liveness(true);
        let t0 = l.last_heard();
        l.went_busy(t0 + ms(100));
        // Looked at again within `check`, so a PING owed after going idle is never late.
        assert_eq!(
            l.check(false, t0 + ms(150)).ok(),
            Some(Due::Wait(t0 + ms(650)))
        );
        assert!(l.check(false, t0 + ms(799)).is_ok());
        assert!(l.check(false, t0 + ms(800)).is_err());
    }
}
