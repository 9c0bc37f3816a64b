//! The store's data path and the socket layer it shares with the
//! upstream-compatible engine (`mooncake_engine`): shared-memory segments,
//! the per-client data server that serves byte ranges of its segment over
//! TCP, the same-host mapping handshake, the read/write paths that pick
//! memcpy, mapped memcpy or TCP ([`DataPath`]), and the socket I/O and
//! connection pool both faces use ([`net`]).

pub mod data_path;
pub mod data_proto;
pub mod data_server;
mod error;
mod fresh_gate;
pub mod hostid;
pub mod net;
mod op;
pub mod same_host;
pub mod segment;
pub mod tcp_pool;
pub mod workers;

pub use data_path::{DataPath, Op, Path, Rows, SegmentRef, Stores};
pub use error::{Error, Result};
pub use segment::{Prefault, Segment};
