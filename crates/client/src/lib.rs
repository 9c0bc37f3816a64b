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
//!
//! Module tree (folders are layers; each uses only what is below it):
//! - `store_api`: [`StoreApi`], the store's operations declared once (the
//!   lists [`store_queries!`], [`store_moves!`] and [`store_calls!`]),
//!   implemented here by `Client` and by the standalone crate's dummy
//!   client;
//! - `tensor/`: tensor reads and writes, tensor batch rules, safetensors IO;
//! - `ops/`: the store operations as `Client` methods (writes, reads,
//!   ranges, locations, multi-buffer values, sessions, `BufferPool` leases);
//! - `client`: the `Client` itself (setup, mount, serve, close);
//! - `durability/`: the replica ledger, its stream to the master, the disk
//!   tier;
//! - `master/`: the master connection, discovery, read-ticket reports,
//!   descriptor publishing;
//! - at the root, used by all: `caller_mem` (caller memory as the
//!   memory-moving calls take it), `config`, `error`, `parallel`, `staging`,
//!   `registered`, `result_pool`, `session_table`, `stats`, `wake`;
//!   `device_staging` stages CUDA device buffers through host memory.

mod caller_mem;
mod client;
mod config;
pub mod device_staging;
mod durability;
mod error;
mod master;
mod ops;
mod parallel;
mod registered;
mod result_pool;
mod session_table;
mod staging;
mod stats;
mod store_api;
mod tensor;
mod wake;

pub use caller_mem::{Dst, DstLists, Dsts, Mem, MemList, MemLists, Src, SrcLists, Srcs};
pub use client::{Client, MountSource, StagedValue, HEALTHY, HEALTH_CLOSED, HEALTH_PING_FAILED};
pub use config::{
    force_tcp, ClientConfig, ReplicateConfig, SharedEngine, WriteKind, DEFAULT_CLIENT_HTTP_PORT,
    DEFAULT_DICT_SIZE, DEFAULT_MASTER, DEFAULT_TENANT, MAX_LOCAL_BUFFER, MIN_SIZE,
};
pub use error::{Error, Result};
pub use mooncake_common::proto::ReplicaLoc;
pub use mooncake_common::proto::{SoftPin, TaskInfo, TaskKind, TaskState, WriteConfig};
pub use mooncake_common::ErrorCode;
pub use mooncake_tensor::{ReadOutput, ReadRequest};
pub use mooncake_transfer::{Op, Path};
pub use ops::lease_pool::{Lease, LeasePool, PoolConfig, PoolError};
pub use ops::locations::{Locations, ObjectLocation, ReplicaDesc};
pub use ops::ranges::{ranges_failed, Ranges};
pub use ops::reads::OwnedValues;
pub use result_pool::{ResultBlock, POOL_MIN};
pub use store_api::{StoreApi, TensorAlloc, ValueAlloc};
pub use tensor::safetensor_io::{LoadedTensor, ObjectIo};
pub use tensor::tensor_batch::{check_lengths, check_object_sources, item_requests, ItemRequest};
pub use tensor::tensor_io::{
    check_into_lists, check_pub_config, cuda_tensor_reads, object_source, TensorDest, TensorWrite,
    WriteMode,
};
