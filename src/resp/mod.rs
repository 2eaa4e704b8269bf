//! RESP wire format: the client request parser, request encoding, the upstream reply scanner
//! and reply encoding.

pub mod digits;
pub mod encode;
pub mod frames;
pub mod lookahead;
pub mod reply;
pub mod request;
pub mod scan;

pub use frames::{
    Frame, array_elements, array_parts, bulk_body, frames, int_value, is_null, pair_elements,
    push_elements,
};
pub use reply::{Encoder, Proto};
pub use request::{Args, Limits, Parsed, ProtocolError, RequestParser};
pub use scan::{FrameEnd, ReplyScanner, ScanError};
