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
//! Module tree (each module uses only modules below it; folders are
//! layers):
//! - `group`: the member, its construction, connect, join, membership
//!   requests, submit, P2P, shutdown;
//! - `runtime/`: the member's running state (`shared`) and its threads:
//!   `executor` (runs ops in order), `progress` (one op), `reader` (one
//!   link's socket), `watchdog` (silent peers), `syncer` (failed ops
//!   waiting for reconciliation), and `member` (link admission and
//!   attachment, and how this member applies the coordinator's pushes);
//! - `collectives/`: `plan` (algorithms as phases), `reduce` (kernels),
//!   `retain` (retained reduction inputs and pulls, for all-or-nothing
//!   inclusion), `p2p` (matching);
//! - `membership/`: `coordinator` (one per process tree, in the
//!   store-hosting process), `agent` (a process's session with it),
//!   `control` (its messages), `handshake` (connection admission),
//!   `admission` (per-connection handshake threads, caps, accept back-off),
//!   `engine` (listener and dial);
//! - `transport/`: `link` (one peer connection), `shm`/`futex` (same-host
//!   rings, doorbells), `wire` (framing), `copy`;
//! - at the root, used by all: `dtype` (codes), `completion`, `config`,
//!   `clock`, `fault` (fault injection), `error`.

mod clock;
mod collectives;
mod completion;
mod config;
mod dtype;
mod error;
mod fault;
mod group;
mod membership;
mod runtime;
mod transport;

pub use collectives::plan::{reduces, OpArgs, OpKind, KINDS};
pub use completion::{Completion, OpState};
pub use config::{
    set_collective_timeout_us, set_fault_reconciliation_window_us, set_p2p_timeout_us,
};
pub use dtype::{DType, ReduceOp};
pub use error::{ErrorKind, PgError};
pub use fault::{clear as clear_faults, inject as inject_faults, stats as fault_stats};
pub use group::{Group, GroupParams, PeerInfo, ProposeOutcome, SyncOutcome};
pub use membership::control::{ProposalStatus, SyncStatus};
pub use membership::coordinator::CoordinatorHandle;
