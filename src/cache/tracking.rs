//! What a tracking lane vouches for: its state, as GETs, fills and INFO read it, written by
//! the lane's connection task (see [`super::lane`]).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

/// State of the tracking lane.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tracking {
    /// Not connected yet, or reconnecting: nothing is cached.
    Down,
    /// Connected with `CLIENT TRACKING ON`: entries live until invalidated or expired.
    On,
    /// Connected, but the upstream refused tracking: entries live `fallback_ttl_ms` at most.
    Fallback,
    /// Several lanes (cluster mode), some down: keys of their masters are read uncached, the
    /// others are cached. Only ever an aggregate, never one lane's state.
    Partial,
}

impl Tracking {
    /// Label for INFO and logs.
    pub fn as_str(self) -> &'static str {
        match self {
            Tracking::Down => "down",
            Tracking::On => "on",
            Tracking::Fallback => "off (ttl-only fallback)",
            Tracking::Partial => "partial",
        }
    }

    fn from_u8(v: u8) -> Self {
        match v {
            1 => Tracking::On,
            2 => Tracking::Fallback,
            3 => Tracking::Partial,
            _ => Tracking::Down,
        }
    }

    /// Gauge value: 0 down, 1 tracking, 2 TTL-only fallback, 3 partial.
    pub(super) fn as_gauge(self) -> i64 {
        self as i64
    }
}

/// The lanes' state taken together: in cluster mode one lane down means only that master's
/// keys are read uncached, which is not the cache being down.
pub(super) fn aggregate(states: &[Tracking]) -> Tracking {
    if states.is_empty() || states.iter().all(|s| *s == Tracking::Down) {
        Tracking::Down
    } else if states.contains(&Tracking::Down) {
        Tracking::Partial
    } else if states.contains(&Tracking::Fallback) {
        Tracking::Fallback
    } else {
        Tracking::On
    }
}

/// What GETs, fills and INFO read about one lane; written by the lane's connection task.
#[derive(Debug)]
pub(super) struct LaneState {
    /// The node the lane is connected to.
    pub(super) addr: String,
    state: AtomicU8,
    resets: AtomicU64,
    last_reset: Mutex<Option<String>>,
}

impl LaneState {
    pub(super) fn new(addr: &str, state: Tracking) -> LaneState {
        LaneState {
            addr: addr.to_string(),
            state: AtomicU8::new(state as u8),
            resets: AtomicU64::new(0),
            last_reset: Mutex::new(None),
        }
    }

    pub(super) fn tracking(&self) -> Tracking {
        Tracking::from_u8(self.state.load(Ordering::Relaxed))
    }

    pub(super) fn set(&self, t: Tracking) {
        self.state.store(t as u8, Ordering::Relaxed);
    }

    /// Counts a loss or reset of the lane and remembers why.
    pub(super) fn record_reset(&self, cause: &str) {
        self.resets.fetch_add(1, Ordering::Relaxed);
        *self.last_reset.lock().unwrap_or_else(|p| p.into_inner()) = Some(cause.to_string());
    }

    /// Times the lane was lost or reset since it was created.
    pub(super) fn resets(&self) -> u64 {
        self.resets.load(Ordering::Relaxed)
    }

    /// Why the lane was last lost or reset, if it ever was.
    pub(super) fn last_reset(&self) -> Option<String> {
        self.last_reset
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_lane_down_of_several_is_partial_not_down() {
        use Tracking::*;
        assert_eq!(aggregate(&[]), Down);
        assert_eq!(aggregate(&[Down, Down]), Down);
        assert_eq!(aggregate(&[On, Down, On]), Partial);
        assert_eq!(aggregate(&[On, Fallback]), Fallback);
        assert_eq!(aggregate(&[On, On]), On);
    }
}
