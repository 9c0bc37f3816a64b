//! mooncake-pg: the Rust core of the `mooncake-cpu` / `mooncake`
//! torch.distributed backend, with upstream Mooncake's PG API (names,
//! arguments and observable behaviour).
//!
//! Python hands over raw buffer addresses, byte counts and dtype/op codes;
//! this crate moves and reduces the bytes. Its public surface is what the
//! bindings need: [`Group`] (one member of one process group), the op
//! handle [`Completion`], the codes [`DType`] / [`ReduceOp`], the
//! collective description [`OpKind`] / [`OpArgs`], the error [`PgError`]
//! and a few process-wide settings. Everything else is crate-private.
//!
//! Module tree (each module uses only modules below it):
//! - `group`: the member, its construction, connect, join, membership
//!   requests, submit, P2P, shutdown;
//! - thread bodies: `executor` (runs ops in order), `progress` (one op),
//!   `reader` (one link's socket), `watchdog` (silent peers), `syncer`
//!   (failed ops waiting for reconciliation);
//! - `member`: link admission and attachment, and how this member applies
//!   the coordinator's pushes;
//! - `shared`: the state those threads share, including `retain` (retained
//!   reduction inputs and pulls, for all-or-nothing inclusion);
//! - membership control plane: `coordinator` (one per process tree, in the
//!   store-hosting process), `agent` (a process's session with it),
//!   `control` (its messages), `handshake` (connection admission),
//!   `admission` (per-connection handshake threads, caps, accept back-off);
//! - `link` (one peer connection), `p2p` (matching), `engine` (listener and
//!   handshake), `plan` (algorithms as phases), `reduce`/`dtype` (kernels,
//!   codes), `shm`/`futex` (same-host rings, doorbells), `wire` (framing),
//!   `copy`, `clock`, `completion`, `config`, `fault` (fault injection),
//!   `error`.

mod admission;
mod agent;
mod clock;
mod completion;
mod config;
mod control;
mod coordinator;
mod copy;
mod dtype;
mod engine;
mod error;
mod executor;
mod fault;
mod futex;
mod group;
mod handshake;
mod link;
mod member;
mod p2p;
mod plan;
mod progress;
mod reader;
mod reduce;
mod retain;
mod shared;
mod shm;
mod syncer;
mod watchdog;
mod wire;

pub use completion::{Completion, OpState};
pub use config::{
    set_collective_timeout_us, set_fault_reconciliation_window_us, set_p2p_timeout_us,
};
pub use control::{ProposalStatus, SyncStatus};
pub use coordinator::CoordinatorHandle;
pub use dtype::{DType, ReduceOp};
pub use error::{ErrorKind, PgError};
pub use fault::{clear as clear_faults, inject as inject_faults, stats as fault_stats};
pub use group::{Group, GroupParams, PeerInfo, ProposeOutcome, SyncOutcome};
pub use plan::{reduces, OpArgs, OpKind, KINDS};
