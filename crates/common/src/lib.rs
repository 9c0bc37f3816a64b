//! Shared foundation for every Mooncake crate: upstream-compatible error
//! codes, the length-prefixed wire framing and handshake used between our
//! own processes, the client<->master protocol messages, the optional
//! cluster-secret authentication, connection admission limits, the
//! congestion-control rule for data connections, bulk copies that bypass
//! the cache, the gflags-compatible command line of our binaries, and small
//! parsing helpers.

pub mod alloc;
pub mod auth;
pub mod binary;
pub mod error;
pub mod framing;
#[cfg(any(test, feature = "fuzz"))]
pub mod fuzz;
#[cfg(test)]
mod fuzz_targets;
pub mod gflags;
pub mod ha;
pub mod ledger;
pub mod limits;
pub mod memcopy;
pub mod proto;
pub mod size;
pub mod spin_read;
pub mod tcp_tune;

pub use auth::{AuthKey, WriteTicket};
pub use error::{ErrorCode, McResult};
