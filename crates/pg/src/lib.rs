//! mooncake-pg: the Rust core of the `mooncake-cpu` / `mooncake`
//! torch.distributed backend.
//!
//! Python hands over raw buffer addresses, byte counts and dtype/op codes;
//! this crate moves and reduces the bytes. Modules:
//! - [`group`]: group model (capacity, active mask, visible size), connect,
//!   submit, shutdown;
//! - [`plan`]: collective algorithms as phases; [`progress`]: their executor;
//! - [`link`], [`engine`], [`wire`]: TCP connections, listener, framing;
//! - [`shm`], [`futex`]: same-host shared-memory rings and doorbells;
//! - [`p2p`]: send/recv matching; [`reduce`], [`dtype`]: typed kernels;
//! - [`completion`]: op handles; [`config`]: environment tunables;
//!   [`fault`]: fault-injection hook; the group watchdog detects silent peers;
//!   [`copy`]: streaming copies for large receives.

#![deny(missing_docs)]

pub mod completion;
pub mod config;
pub mod copy;
pub mod dtype;
pub mod engine;
pub mod error;
pub mod fault;
pub mod futex;
pub mod group;
pub mod link;
pub mod p2p;
pub mod plan;
pub mod progress;
pub mod reduce;
pub mod shm;
pub mod wire;

pub use completion::{Completion, OpState};
pub use dtype::{DType, ReduceOp};
pub use error::PgError;
pub use group::{Group, GroupParams, PeerInfo};
pub use plan::OpKind;
