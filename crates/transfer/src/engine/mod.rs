//! The transfer engine behind `mooncake.engine.TransferEngine`: registered
//! memory, an RPC server per engine, and transfers between engines (a
//! cross-process copy on one host, TCP between hosts), found through
//! `P2PHANDSHAKE`, an HTTP metadata server or etcd. See [`TransferEngine`].

mod batches;
pub mod device;
mod engine;
pub mod error;
pub mod log;
pub mod metadata;
mod peers;
pub mod protocol;
pub mod registry;
mod server;
pub mod topology;
mod vm;
pub mod wire;

pub use batches::BatchState;
pub use engine::{items, split_hostname, Item, Opcode, TransferEngine};
pub use error::{EngineError, ErrorKind, Result};
pub use metadata::{
    build_conn_string, split_conn_string, HttpMetadata, MetadataServer, P2PHANDSHAKE,
};
pub use registry::{Pin, Registry};

/// Whether a CUDA driver can be loaded in this process (the `*_on_cuda`
/// calls and CUDA pointers need one).
pub fn cuda_available() -> bool {
    device::available()
}
