//! The upstream-compatible face: the transfer engine behind
//! `mooncake.engine.TransferEngine`. Registered memory, an RPC server per
//! engine, and transfers between engines (a cross-process copy on one host,
//! TCP between hosts), found through `P2PHANDSHAKE`, an HTTP metadata
//! server or etcd. See [`TransferEngine`].
//!
//! The engine serves whatever memory its caller registers, so on one host
//! it copies with `process_vm_readv` / `process_vm_writev`
//! ([`crate::same_host`]); its sockets and idle connections are those of
//! [`crate::net`], shared with the store's data path. It uses nothing of
//! the store's data path ([`crate::data_path`]), and nothing below it
//! (`net`, `same_host`, `segment`, `op`, `workers`, `hostid`) uses it.

mod batches;
pub mod device;
pub mod error;
pub mod log;
pub mod metadata;
mod peers;
pub mod protocol;
pub mod registry;
mod server;
pub mod topology;
mod transfer_engine;
pub mod wire;

pub use batches::BatchState;
pub use error::{EngineError, ErrorKind, Result};
pub use metadata::{
    build_conn_string, split_conn_string, HttpMetadata, MetadataServer, P2PHANDSHAKE,
};
pub use registry::{Pin, Registry};
pub use transfer_engine::{items, split_hostname, Item, Opcode, TransferEngine};

/// Whether a CUDA driver can be loaded in this process (the `*_on_cuda`
/// calls and CUDA pointers need one).
pub fn cuda_available() -> bool {
    device::available()
}
