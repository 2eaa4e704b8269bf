//! Shared subscriptions: however many clients subscribe to a channel, corral subscribes once
//! upstream and fans each message out. One RESP3 connection carries every subscription; its
//! push frames (confirmations and messages) are handled on that connection's task.
//!
//! Subscribers register a bounded queue; a subscriber that falls behind by more than its
//! queue is disconnected, as Redis disconnects pub/sub clients over their output buffer limit.
//!
//! Files: `hub.rs` the hub clients subscribe through, `observer.rs` what arrives on its
//! connection, `state.rs` what it knows, `message.rs` the values, `router.rs` which hub a
//! subscription goes to (cluster mode), `notify.rs` keyspace notifications in cluster mode.
//! Pattern matching is `commands::glob`.

mod hub;
mod message;
mod notify;
mod observer;
mod router;
mod state;

pub use hub::Hub;
pub use message::{Handoff, Inbox, Kind, Message, Outbox, QUEUE_BYTES, queue};
pub use notify::Filter;
pub use router::Router;
