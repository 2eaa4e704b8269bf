//! Keyspace notifications in cluster mode. Each Redis node publishes the events of its own
//! keys (`__keyspace@<db>__:<key>`, `__keyevent@<db>__:<event>`) to its own subscribers only:
//! Redis Cluster propagates PUBLISH to every node, but not these. So a subscription that may
//! receive them is made on every master too, on hubs that pass on nothing else, while the
//! main hub (on one node, where every PUBLISH arrives) passes on everything else: each message
//! reaches a subscriber once.

use super::message::Kind;

/// The channel prefixes of keyspace notifications.
const PREFIXES: [&[u8]; 2] = [b"__keyspace@", b"__keyevent@"];

/// Whether `channel` is a keyspace notification's.
pub(super) fn is_notification(channel: &[u8]) -> bool {
    PREFIXES.iter().any(|p| channel.starts_with(p))
}

/// Whether a subscription to `name` may receive keyspace notifications: a notification
/// channel, or a pattern that may match one. Patterns are judged by their start alone, and
/// any wildcard there counts as a match: a pattern subscribed on every master for nothing
/// costs an upstream subscription, never a message (those hubs pass on notifications only).
pub(super) fn may_carry(kind: Kind, name: &[u8]) -> bool {
    match kind {
        Kind::Channel => is_notification(name),
        Kind::Pattern => PREFIXES.iter().any(|p| may_start_with(name, p)),
        Kind::Shard => false,
    }
}

/// Whether glob `pattern` may match some string starting with `prefix`: its literal start
/// agrees with the prefix up to the first wildcard, class or escape, or past the prefix.
fn may_start_with(pattern: &[u8], prefix: &[u8]) -> bool {
    for (i, &want) in prefix.iter().enumerate() {
        match pattern.get(i) {
            None => return false,
            Some(b'*' | b'?' | b'[' | b'\\') => return true,
            Some(&c) if c != want => return false,
            Some(_) => {}
        }
    }
    true
}

/// Which messages a hub passes on to its subscribers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    /// Every message (standalone mode).
    All,
    /// Keyspace notifications only: a master's hub, for the events of its own keys.
    Notifications,
    /// Everything but keyspace notifications: the main hub in cluster mode, whose node's
    /// own events come through that node's master hub.
    Others,
}

impl Filter {
    /// Whether a message on `channel` is passed on.
    pub(super) fn passes(self, channel: &[u8]) -> bool {
        match self {
            Filter::All => true,
            Filter::Notifications => is_notification(channel),
            Filter::Others => !is_notification(channel),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subscriptions_that_may_carry_notifications() {
        for (kind, name, carries) in [
            (Kind::Channel, &b"__keyspace@0__:k"[..], true),
            (Kind::Channel, b"__keyevent@0__:expired", true),
            (Kind::Channel, b"news", false),
            (Kind::Channel, b"__keyspace", false),
            (Kind::Pattern, b"*", true),
            (Kind::Pattern, b"__key*", true),
            (Kind::Pattern, b"__keyevent@?__:*", true),
            (Kind::Pattern, b"_[_]keyspace*", true),
            (Kind::Pattern, b"__keyspace@0__:user:*", true),
            (Kind::Pattern, b"news.*", false),
            (Kind::Pattern, b"__keyz*", false),
            (Kind::Pattern, b"__key", false),
            (Kind::Shard, b"__keyspace@0__:k", false),
        ] {
            assert_eq!(may_carry(kind, name), carries, "{kind:?} {name:?}");
        }
    }

    #[test]
    fn filters_split_notifications_from_the_rest() {
        let (event, other) = (&b"__keyevent@0__:set"[..], &b"news"[..]);
        assert!(Filter::All.passes(event) && Filter::All.passes(other));
        assert!(Filter::Notifications.passes(event) && !Filter::Notifications.passes(other));
        assert!(!Filter::Others.passes(event) && Filter::Others.passes(other));
    }
}
