//! The store client: connects to the master, mounts this process's segment,
//! serves it to peers, and implements put/get/batch/ranges/upsert/remove on
//! top of the transfer engine.
//!
//! This crate is the one home of the store's client-side rules:
//! `setup`'s argument checks and the dict
//! form ([`ClientConfig`]), the write config and its validation
//! ([`ReplicateConfig`]), per-key and per-batch argument rules, and the
//! shape of batch results. Every failure is an [`Error`] carrying the
//! upstream [`ErrorCode`] and its reason; the Python binding only converts
//! arguments and maps errors to return codes and log lines.

mod client;
mod config;
mod discovery;
mod disk;
mod done;
mod error;
mod lease_pool;
mod ledger;
mod ledger_stream;
mod locations;
mod master_conn;
mod metadata_pub;
mod multi_buffers;
mod parallel;
mod ranges;
mod reads;
mod registered;
mod result_pool;
mod safetensor_io;
mod session_table;
mod sessions;
mod staging;
mod stats;
mod tensor_batch;
mod tensor_io;
mod wake;
mod writes;

pub use client::{Client, StagedValue, HEALTHY, HEALTH_CLOSED, HEALTH_PING_FAILED};
pub use config::{
    force_tcp, ClientConfig, ReplicateConfig, SharedEngine, WriteKind, DEFAULT_CLIENT_HTTP_PORT,
    DEFAULT_DICT_SIZE, DEFAULT_MASTER, DEFAULT_TENANT, MAX_LOCAL_BUFFER, MIN_SIZE,
};
pub use error::{Error, Result};
pub use lease_pool::{Lease, LeasePool, PoolConfig, PoolError};
pub use locations::{Locations, ObjectLocation};
pub use mooncake_common::proto::ReplicaLoc;
pub use mooncake_common::proto::{SoftPin, WriteConfig};
pub use mooncake_common::ErrorCode;
pub use mooncake_transfer::{Op, Path};
pub use ranges::{ranges_failed, Ranges};
pub use result_pool::{ResultBlock, POOL_MIN};
pub use safetensor_io::{LoadedTensor, ObjectIo};
pub use tensor_batch::{check_lengths, check_object_sources, item_requests, ItemRequest};
pub use tensor_io::{
    check_into_lists, check_pub_config, cuda_tensor_reads, object_source, TensorDest, TensorReads,
    TensorWrite, WriteMode,
};
