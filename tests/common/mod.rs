//! Test harness: real `redis-server` processes on ephemeral loopback ports, corral running
//! in-process, and a raw RESP client that returns reply bytes exactly as received.
//!
//! One module per job: `server` (Redis processes), `cluster` (a Redis Cluster and corral in
//! front of it), `proxy` (corral in-process), `pair` (a direct Redis and one behind corral),
//! `compare` (scripts run on both sides of a pair, replies compared byte for byte), `client`
//! and `resp` (raw clients and the one reply scanner), `stats` (corral's cache statistics), `relay` (fault injection), `wait`
//! (bounded polling), `tool` (external programs).
#![allow(dead_code, unused_imports)]

mod client;
mod cluster;
mod compare;
mod pair;
mod proxy;
mod relay;
mod resp;
mod server;
mod stats;
mod tool;
mod wait;

pub use client::*;
pub use cluster::*;
pub use compare::*;
pub use pair::*;
pub use proxy::*;
pub use relay::*;
pub use resp::*;
pub use server::*;
pub use stats::*;
pub use tool::*;
pub use wait::*;
