//! The store client: connects to the master, mounts this process's segment,
//! serves it to peers, and implements put/get/batch/ranges/upsert/remove on
//! top of the transfer engine.

mod client;
mod discovery;
mod done;
mod ledger;
mod ledger_stream;
mod locations;
mod master_conn;
mod metadata_pub;
mod ranges;
mod reads;
mod registered;
mod staging;
mod stats;
mod writes;

pub use client::{Client, ClientConfig, StagedValue};
pub use locations::{Locations, ObjectLocation};
pub use mooncake_common::proto::ReplicaLoc;
pub use mooncake_common::proto::{SoftPin, WriteConfig};
pub use mooncake_common::ErrorCode;
pub use mooncake_transfer::{Op, Path};
