//! Redis Cluster groundwork: slots, topology, redirections and key positions.
//!
//! A request is routed by the slot of its keys ([`key_slot`]: CRC16-XMODEM of the key or its
//! `{hash tag}`, mod 16384). [`crate::commands::command_keys`] finds the keys of any Redis 7.0
//! command, [`keys::keys_slot`] checks they share a slot, and [`keys::classify_multi`] says what to do
//! when they do not: split (MGET, MSET, DEL, UNLINK, EXISTS, TOUCH) or refuse with
//! [`CROSSSLOT`](crate::error::replies::CROSSSLOT). [`SlotMap`] maps slots to shards from `CLUSTER SHARDS` (or
//! `CLUSTER SLOTS` on servers older than 7.0), and [`Redirect`] reads the MOVED, ASK,
//! TRYAGAIN and CLUSTERDOWN errors that say the map is stale or the cluster busy.
//!
//! Nothing here does I/O: the connection layer sends the commands and feeds the replies in.

mod addr;
pub mod keys;
pub mod redirect;
pub mod slot;
pub mod topology;
mod value;

pub use addr::Addr;
pub use keys::{KeySlot, MultiKey, SplitKind, classify_multi};
pub use redirect::Redirect;
pub use slot::{SLOTS, key_slot};
pub use topology::{Health, Node, Shard, SlotMap, TopologyError};
