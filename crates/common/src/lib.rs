//! Shared foundation for every Mooncake crate: upstream-compatible error
//! codes, the length-prefixed wire framing used between our own processes,
//! the client<->master protocol messages, and small parsing helpers.

pub mod error;
pub mod framing;
pub mod ha;
pub mod hostid;
pub mod ledger;
pub mod proto;
pub mod size;
pub mod spin_read;

pub use error::{ErrorCode, McResult};
