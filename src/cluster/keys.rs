//! The slot of a request's keys, and what to do when they span several slots.

use super::slot::key_slot;
use crate::commands::positions::{KeyPositions, may_name_several_keys};
use crate::resp::Args;

/// The slot a request's keys hash to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeySlot {
    /// No keys: any node can serve it.
    NoKeys,
    /// All keys hash to this slot.
    One(u16),
    /// Keys in different slots: Redis Cluster answers `-CROSSSLOT` unless corral splits it.
    Cross,
}

/// The one slot of the keys at `positions`, or why there is none.
pub fn keys_slot(positions: &KeyPositions, args: &Args<'_>) -> KeySlot {
    let mut found = KeySlot::NoKeys;
    for key in positions.keys(args) {
        let slot = key_slot(key);
        match found {
            KeySlot::NoKeys => found = KeySlot::One(slot),
            KeySlot::One(s) if s == slot => {}
            _ => return KeySlot::Cross,
        }
    }
    found
}

/// How a merged reply is built from per-slot replies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitKind {
    /// MGET: one array, the values in key order.
    Mget,
    /// MSET: `+OK` once every part succeeded.
    Mset,
    /// DEL, UNLINK, EXISTS, TOUCH: the sum of the integer replies.
    SumInt,
    /// PUBSUB SHARDNUMSUB: a name and a count per key (shard channel), in key order.
    Pairs,
}

/// How a command naming several keys is served by a cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MultiKey {
    /// Not atomic: split into one request per slot and merge the replies.
    Split(SplitKind),
    /// May name several keys, which must all hash to one slot (MSETNX, RENAME, SMOVE, the
    /// *STORE commands, scripts, WATCH, blocking pops...), else `-CROSSSLOT`. A MULTI/EXEC
    /// body is checked the same way by the caller, across its queued commands.
    SameSlot,
    /// At most one key (or unknown): routed by it.
    Single,
}

/// How the (upper-cased) command `name` is handled when its keys span several slots.
pub fn classify_multi(upper_name: &[u8]) -> MultiKey {
    match upper_name {
        b"MGET" => return MultiKey::Split(SplitKind::Mget),
        b"MSET" => return MultiKey::Split(SplitKind::Mset),
        b"DEL" | b"UNLINK" | b"EXISTS" | b"TOUCH" => return MultiKey::Split(SplitKind::SumInt),
        // One key, plus key-like patterns that are not keys.
        b"SORT_RO" => return MultiKey::Single,
        _ => {}
    }
    if may_name_several_keys(upper_name) {
        MultiKey::SameSlot
    } else {
        MultiKey::Single
    }
}

/// Keys of one slot in a split request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotGroup {
    /// The slot.
    pub slot: u16,
    /// Argument indices of its keys, in request order. For MSET the value follows each key.
    pub keys: Vec<usize>,
}

/// Groups the keys at `positions` by slot, groups ordered by their first key, so that replies
/// can be merged back into key order.
pub fn split_by_slot(positions: &KeyPositions, args: &Args<'_>) -> Vec<SlotGroup> {
    let mut groups: Vec<SlotGroup> = Vec::new();
    for i in positions.indices() {
        let Some(key) = args.get(i) else { continue };
        let slot = key_slot(key);
        // Requests name few slots; a linear search beats hashing here.
        match groups.iter_mut().find(|g| g.slot == slot) {
            Some(g) => g.keys.push(i),
            None => groups.push(SlotGroup {
                slot,
                keys: vec![i],
            }),
        }
    }
    groups
}

#[cfg(test)]
mod tests;
