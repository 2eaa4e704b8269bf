//! What a command is to corral: its name, route and key positions (decided once per request,
//! [`Command`]), the per-client session state, and the commands answered locally.

pub mod busy;
mod command;
pub(crate) mod glob;
mod key_table;
pub mod keys;
pub mod local;
pub mod positions;
pub mod session;
pub mod table;

pub use busy::Exclusive;
pub use command::{Command, Kind, Name};
pub use keys::Access;
pub use local::{LocalCtx, Outcome};
pub use positions::{Indices, KeyPositions, command_keys};
pub use session::{LastCmd, Session};
pub use table::{Local, PubSub, Route, Tx, classify};
