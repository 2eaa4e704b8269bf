//! Test harness: real `redis-server` processes on ephemeral loopback ports, corral running
//! in-process, and a raw RESP client that returns reply bytes exactly as received.
//!
//! One module per job:
//! - `server`: `redis-server` processes; `cluster`, `cluster_node`: a Redis Cluster of them
//!   and corral in front of it;
//! - `proxy`: corral in-process; `cache`: its cache seen by a client (statistics, reads until a
//!   change shows);
//! - `pair`: a Redis reached directly and an identical one behind corral;
//! - `script`, `runner`, `compare`: scripts run on both sides of a pair, every reply compared
//!   byte for byte;
//! - `client`, `resp`: raw clients and the one reply scanner, encoders and parsers;
//! - `relay`: a fault-injecting TCP relay; `tls_relay`: plain clients to TLS endpoints; `wait`: bounded polling; `tool`: external programs.
#![allow(dead_code, unused_imports)]

mod cache;
mod client;
mod cluster;
mod cluster_node;
mod compare;
mod pair;
mod proxy;
mod relay;
mod resp;
mod runner;
mod script;
mod server;
mod tls_relay;
mod tool;
mod wait;

pub use cache::*;
pub use client::*;
pub use cluster::*;
pub use cluster_node::*;
pub use compare::*;
pub use pair::*;
pub use proxy::*;
pub use relay::*;
pub use resp::*;
pub use runner::blocked_clients;
pub use script::*;
pub use server::*;
pub use tls_relay::*;
pub use tool::*;
pub use wait::*;
