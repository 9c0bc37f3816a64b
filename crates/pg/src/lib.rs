//! mooncake-pg: the Rust core of the `mooncake-cpu` / `mooncake`
//! torch.distributed backend (contract: `shared/spec/pg.md`, with upstream
//! Mooncake's PG API in `shared/reference/` winning on names and observable
//! behaviour).
//!
//! Python hands over raw buffer addresses, byte counts and dtype/op codes;
//! this crate moves and reduces the bytes. Its public surface is what the
//! bindings need: [`Group`] (one member of one process group), the op
//! handle [`Completion`], the codes [`DType`] / [`ReduceOp`], the
//! collective description [`OpKind`] / [`OpArgs`], the error [`PgError`]
//! and a few process-wide settings. Everything else is crate-private.
//!
//! Module tree (each module uses only modules below it):
//! - `group`: the member, its construction, connect, submit, P2P, shutdown;
//! - thread bodies: `executor` (runs ops in order), `progress` (one op),
//!   `reader` (one link's socket), `watchdog` (silent peers);
//! - `shared`: the state those threads share;
//! - `link` (one peer connection), `p2p` (matching), `engine` (listener and
//!   handshake), `plan` (algorithms as phases), `reduce`/`dtype` (kernels,
//!   codes), `shm`/`futex` (same-host rings, doorbells), `wire` (framing),
//!   `copy`, `clock`, `completion`, `config`, `fault` (fault injection),
//!   `error`.

mod clock;
mod completion;
mod config;
mod copy;
mod dtype;
mod engine;
mod error;
mod executor;
mod fault;
mod futex;
mod group;
mod link;
mod p2p;
mod plan;
mod progress;
mod reader;
mod reduce;
mod shared;
mod shm;
mod watchdog;
mod wire;

pub use completion::{Completion, OpState};
pub use config::{set_collective_timeout_us, set_p2p_timeout_us};
pub use dtype::{DType, ReduceOp};
pub use error::{ErrorKind, PgError};
pub use fault::{clear as clear_faults, inject as inject_faults, stats as fault_stats};
pub use group::{Group, GroupParams, PeerInfo};
pub use plan::{OpArgs, OpKind, KINDS};
