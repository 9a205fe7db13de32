//! Wire types shared by the browser package, the edge worker and the cloud server.
//!
//! Everything here is plain data with serde: the OpenAI chat-completions shapes, the
//! `straddle` envelope a browser adds when it escalates, the `/v1/verify` messages for
//! speculative decoding, the JSON error body, SSE framing, and the tenant token's format.
//! No policy lives here.

pub mod chat;
pub mod envelope;
pub mod error;
pub mod load;
pub mod sse;
pub mod token;
pub mod tools;
pub mod usage;
pub mod verify;

pub use chat::*;
pub use envelope::*;
pub use error::*;
pub use load::*;
pub use tools::*;
pub use usage::*;
pub use verify::*;
