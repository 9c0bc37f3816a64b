//! Standalone store service (upstream's "standalone" mode): a long-lived
//! `mooncake_client` daemon per host owns the segment memory and the master
//! connection ([`run_client`], [`DummyServer`]); inference processes attach
//! to it with [`setup_dummy`], so the pooled memory outlives them and
//! several of them share one pool.
//!
//! A dummy client performs every store method through the daemon, with
//! payloads in shared memory the daemon maps (never through the socket):
//! the dummy's registered buffers and pool ([`host_alloc`], the memory of
//! `MooncakeHostMemAllocator`), and staging memory for anything else.
//!
//! The dummy client is a `mooncake_client::StoreApi`, like the in-process
//! client: [`setup_dummy`] gives one, and the Python binding holds either
//! as an `Arc<dyn StoreApi>`.
//!
//! Modules, from the top:
//! - `cli`: the `mooncake_client` command line;
//! - `daemon`: the daemon's side ([`DummyServer`]);
//! - `dummy`: the dummy client;
//! - `wire`: the protocol (connection opening, control requests, store
//!   calls);
//! - `queries`: the plain-value operations of
//!   `mooncake_client::store_queries!`: their request names, the daemon's
//!   dispatch and the dummy's methods, all generated from that list;
//! - `moves`: the same for the memory-moving operations of
//!   `mooncake_client::store_moves!`, with the caller memory handed over as
//!   their argument types say;
//! - `bufs`: how a dummy names bytes of its shared memory;
//! - `shm`: shared memory regions.

mod bufs;
mod cli;
mod daemon;
mod dummy;
mod moves;
mod queries;
mod shm;
mod wire;

pub use cli::{parse_client_args, run_client, DaemonConfig, CLIENT, FLAGS};
pub use daemon::DummyServer;
pub use dummy::setup_dummy;
pub use shm::{host_alloc, host_free};
pub use wire::socket_name;
