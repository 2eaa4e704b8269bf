//! What a command is to corral: its route, the per-client session state, and the commands
//! answered locally.

pub mod busy;
pub mod keys;
pub mod local;
pub mod session;
pub mod table;

pub use busy::Exclusive;
pub use keys::Access;
pub use local::{LocalCtx, Outcome};
pub use session::Session;
pub use table::{Local, PubSub, Route, Tx, classify};
