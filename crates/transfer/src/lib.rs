//! Moving bytes between processes and hosts: the store's data path and the
//! upstream-compatible transfer engine, two faces over shared layers.
//!
//! From the bottom up:
//!
//! - [`net`]: socket I/O on raw descriptors (scatter/gather, descriptor
//!   passing over Unix sockets), the one pool of idle connections to peers,
//!   the connection side of server loops, and the rule for splitting one
//!   TCP transfer over several connections.
//! - [`segment`]: this process's shared-memory segments (`memfd`, mapped
//!   `MAP_SHARED`) and the registry of the ones it owns; their background
//!   page committer yields to other work by the machine's load (`cpu_load`,
//!   the runnable threads against the CPUs).
//! - [`Op`] (one contiguous copy, the unit every path moves), [`workers`]
//!   (the helper threads that spread one call over several cores) and
//!   [`hostid`] (which processes share a host).
//! - [`same_host`]: the two ways to copy to or from another process of the
//!   same host without TCP: mapping the owner's segment (handed over a
//!   Unix socket), and `process_vm_readv` / `process_vm_writev`.
//! - The faces: [`data_path`], the store's ([`DataPath`], the per-client
//!   data server, its wire format and TCP client), and [`engine`], the
//!   transfer engine behind `mooncake.engine` ([`engine::TransferEngine`]).
//!
//! Each layer uses only layers listed before it; the two faces use the
//! layers but not each other, and no layer uses a face.

mod cpu_load;
pub mod data_path;
pub mod engine;
mod fresh_gate;
pub mod hostid;
pub mod net;
mod op;
pub mod same_host;
pub mod segment;
pub mod workers;

pub use data_path::error::{Error, Result};
pub use data_path::{DataPath, Op, Path, Rows, SegmentRef, Stores};
pub use segment::{Prefault, Segment};
