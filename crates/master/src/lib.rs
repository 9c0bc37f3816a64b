//! The `mooncake_master` metadata service: client registry, segments with
//! per-segment allocators, objects and replicas, leases, pins, eviction, the
//! RPC server, the embedded (and standalone) HTTP metadata server and the
//! admin server, with connection admission limits and optional
//! cluster-token authentication on every listener.

pub mod admin;
pub mod allocator;
mod clients;
pub mod clock;
pub mod config;
mod conn_read;
mod deferred_frees;
mod disk_usage;
mod durable;
pub mod embedded;
pub mod error;
mod eviction;
pub mod flags;
mod forgets;
pub mod gate;
mod gone_keys;
mod groups;
pub mod ha;
pub mod http_meta;
mod ledger_push;
pub mod listener;
mod memory;
pub mod meta_server;
pub mod metadata_kv;
pub mod metrics;
mod object_table;
mod objects;
mod offload;
mod placement;
mod quotas;
mod read_tickets;
pub mod recovery;
mod replicate;
mod retired;
pub mod rpc;
mod segments;
pub mod server;
mod space_queue;
pub mod state;
mod takeover;
mod tasks;
pub mod tenants;
mod versions;

#[cfg(test)]
mod test_http;
#[cfg(test)]
mod timing_tests;
