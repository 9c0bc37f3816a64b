//! The transfer engine: shared-memory segments, the per-client data server
//! that serves byte ranges of its segment over TCP, the same-host mapping
//! handshake, and the read/write paths that pick memcpy, mapped memcpy or TCP.

pub mod data_proto;
pub mod data_server;
pub mod engine;
mod error;
mod fresh_gate;
mod op;
pub mod same_host;
pub mod segment;
pub mod sockio;
pub mod tcp_pool;

pub use engine::{Op, Path, Rows, SegmentRef, Stores, TransferEngine};
pub use error::{Error, Result};
pub use segment::{Prefault, Segment};
