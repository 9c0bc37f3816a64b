//! The `mooncake_master` metadata service: client registry, segments with
//! per-segment allocators, objects and replicas, leases, pins, eviction, the
//! RPC server, the embedded HTTP metadata server and the admin server.

pub mod config;
pub mod flags;
