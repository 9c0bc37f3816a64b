//! [`Store`]: what a `MooncakeDistributedStore` is set up as. `setup` makes
//! an in-process client (it owns a segment and talks to the master);
//! `setup_dummy` makes a dummy client, whose every call the
//! `mooncake_client` daemon on this host serves. Both answer the same
//! methods with the same results, so the Python binding does not care
//! which one it holds.

use crate::dummy::DummyClient;
use mooncake_client::{
    Client, Ranges, ReplicaDesc, ReplicateConfig, Result, StagedValue, TensorDest, TensorWrite,
    WriteMode,
};
use mooncake_tensor::{ReadOutput, ReadRequest};
use std::sync::Arc;

/// A set-up store: in-process or dummy. Cheap to clone.
#[derive(Clone)]
pub enum Store {
    /// `setup`: this process's own client.
    Local(Arc<Client>),
    /// `setup_dummy`: a dummy client of the daemon on this host.
    Dummy(Arc<DummyClient>),
}

/// `$e` with `$c` bound to whichever client `$s` holds (both have the method).
macro_rules! both {
    ($s:expr, $c:ident => $e:expr) => {
        match $s {
            Store::Local($c) => $e,
            Store::Dummy($c) => $e,
        }
    };
}

impl Store {
    /// The in-process client, when this is one.
    pub fn client(&self) -> Option<&Arc<Client>> {
        match self {
            Store::Local(c) => Some(c),
            Store::Dummy(_) => None,
        }
    }

    /// The dummy client, when this is one.
    pub fn dummy(&self) -> Option<&Arc<DummyClient>> {
        match self {
            Store::Local(_) => None,
            Store::Dummy(d) => Some(d),
        }
    }

    /// Unmount and disconnect (in-process), or detach (dummy). Idempotent.
    pub fn close(&self) {
        both!(self, c => c.close())
    }

    /// Whether `close` was called.
    pub fn is_closed(&self) -> bool {
        both!(self, c => c.is_closed())
    }

    /// `get_hostname()`.
    pub fn hostname(&self) -> String {
        both!(self, c => c.hostname())
    }

    /// `health_check()`.
    pub fn health(&self) -> i32 {
        both!(self, c => c.health())
    }

    /// `get_client_stats()`.
    pub fn stats(&self) -> Vec<(String, u64)> {
        match self {
            Store::Local(c) => c
                .stats()
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            Store::Dummy(d) => d.stats(),
        }
    }

    /// `unmount_segment` / `unmount_and_free_segment`.
    pub fn unmount_segments(&self, method: &str, ids: &[String]) -> Result<()> {
        match self {
            Store::Local(c) => c.unmount_segments(ids),
            Store::Dummy(d) => Err(d.in_process_only(method)),
        }
    }

    /// `unmount_local_disk_segment`.
    pub fn drain_local_disk_segment(&self) -> Result<()> {
        match self {
            Store::Local(c) => c.drain_local_disk_segment(),
            Store::Dummy(d) => Err(d.in_process_only("unmount_local_disk_segment")),
        }
    }

    /// `get_offload_rpc_read_count`: 0 (no SSD tier; a dummy has none either).
    pub fn offload_rpc_read_count(&self) -> u64 {
        match self {
            Store::Local(c) => c.offload_rpc_read_count(),
            Store::Dummy(_) => 0,
        }
    }
}

/// Methods the in-process client and the dummy client both have, with one
/// signature: each forwards to whichever client the store holds. An
/// `unsafe` method's caller contract is the clients' (stated in its docs).
macro_rules! forward {
    (
        safe { $($(#[$sm:meta])* fn $sn:ident(&self $(, $sa:ident: $st:ty)*) -> $sr:ty;)* }
        unsafe { $($(#[$um:meta])* fn $un:ident(&self $(, $ua:ident: $ut:ty)*) -> $ur:ty;)* }
    ) => {
        impl Store {
            $($(#[$sm])* pub fn $sn(&self $(, $sa: $st)*) -> $sr {
                both!(self, c => c.$sn($($sa),*))
            })*
            $($(#[$um])* pub unsafe fn $un(&self $(, $ua: $ut)*) -> $ur {
                // SAFETY: the caller's contract is the clients', stated above.
                both!(self, c => unsafe { c.$un($($ua),*) })
            })*
        }
    };
}

forward! {
    safe {
        /// `register_buffer`.
        fn register_buffer(&self, ptr: usize, size: usize) -> Result<()>;
        /// `unregister_buffer`.
        fn unregister_buffer(&self, ptr: usize) -> Result<()>;
        /// `put`/`upsert`.
        fn put(&self, key: &str, value: &[u8], cfg: &ReplicateConfig, upsert: bool) -> Result<()>;
        /// `put_parts`/`upsert_parts`.
        fn put_parts(&self, key: &str, parts: &[&[u8]], cfg: &ReplicateConfig, upsert: bool)
            -> Result<u64>;
        /// `put_batch`/`upsert_batch`.
        fn put_batch(&self, keys: &[String], values: &[&[u8]], cfg: &ReplicateConfig, upsert: bool)
            -> Result<()>;
        /// `get`/`get_buffer`.
        fn get(&self, key: &str) -> Result<StagedValue>;
        /// `get_batch`/`batch_get_buffer`.
        fn get_batch(&self, keys: &[String]) -> Vec<Result<StagedValue>>;
        /// Whole values into memory `alloc` gives once the sizes are known.
        fn get_batch_with(&self, keys: &[String],
            alloc: impl FnOnce(&[Result<u64>]) -> Vec<Option<usize>>) -> Vec<Result<u64>>;
        /// `get_size`.
        fn get_size(&self, key: &str) -> Result<u64>;
        /// `is_exist`.
        fn is_exist(&self, key: &str) -> Result<bool>;
        /// `batch_is_exist`.
        fn batch_is_exist(&self, keys: &[String]) -> Vec<Result<bool>>;
        /// `get_replica_desc`/`batch_get_replica_desc`.
        fn replica_descs(&self, keys: &[String]) -> Vec<Result<Vec<ReplicaDesc>>>;
        /// `remove`.
        fn remove(&self, key: &str, force: bool) -> Result<()>;
        /// `batch_remove`.
        fn batch_remove(&self, keys: &[String], force: bool) -> Vec<Result<()>>;
        /// `remove_by_regex`.
        fn remove_by_regex(&self, pattern: &str, force: bool) -> Result<u64>;
        /// `remove_all`.
        fn remove_all(&self, force: bool) -> Result<u64>;
        /// `batch_put_session_start`.
        fn batch_put_session_start(&self, keys: &[String], sizes: &[u64], cfg: &ReplicateConfig)
            -> Result<Vec<Result<()>>>;
        /// `batch_put_session_end`.
        fn batch_put_session_end(&self, keys: &[String]) -> Vec<Result<()>>;
        /// `batch_put_session_revoke`.
        fn batch_put_session_revoke(&self, keys: &[String]) -> Vec<Result<()>>;
        /// `batch_get_session_start`.
        fn batch_get_session_start(&self, keys: &[String]) -> Vec<Result<()>>;
        /// `batch_get_session_end`.
        fn batch_get_session_end(&self, keys: &[String]) -> Result<()>;
    }
    unsafe {
        /// `put_from`/`upsert_from`.
        ///
        /// # Safety
        /// `ptr..ptr+size` must be readable for the duration of the call.
        fn put_from(&self, key: &str, ptr: usize, size: usize, cfg: &ReplicateConfig, upsert: bool)
            -> Result<()>;
        /// `put_from_with_metadata`.
        ///
        /// # Safety
        /// Both ranges must be readable for the duration of the call.
        fn put_from_with_metadata(&self, key: &str, ptr: usize, metadata_ptr: usize, size: usize,
            metadata_size: usize, cfg: &ReplicateConfig) -> Result<()>;
        /// `batch_put_from`/`batch_upsert_from`.
        ///
        /// # Safety
        /// Every `ptrs[i]..+sizes[i]` must be readable for the duration of the call.
        fn batch_put_from(&self, keys: &[String], ptrs: &[usize], sizes: &[usize],
            cfg: &ReplicateConfig, upsert: bool) -> Result<Vec<Result<()>>>;
        /// `get_into`.
        ///
        /// # Safety
        /// `ptr..ptr+size` must be writable for the duration of the call.
        fn get_into(&self, key: &str, ptr: usize, size: usize) -> Result<u64>;
        /// `batch_get_into`.
        ///
        /// # Safety
        /// Every `ptrs[i]..+sizes[i]` must be writable for the duration of the call.
        fn batch_get_into(&self, keys: &[String], ptrs: &[usize], sizes: &[usize])
            -> Result<Vec<Result<u64>>>;
        /// `batch_put_from_multi_buffers`.
        ///
        /// # Safety
        /// Every buffer must be readable for the duration of the call.
        fn batch_put_from_multi_buffers(&self, keys: &[String], all_ptrs: &[Vec<usize>],
            all_sizes: &[Vec<usize>], cfg: &ReplicateConfig) -> Result<Vec<Result<()>>>;
        /// `batch_get_into_multi_buffers`.
        ///
        /// # Safety
        /// Every buffer must be writable for the duration of the call.
        fn batch_get_into_multi_buffers(&self, keys: &[String], all_ptrs: &[Vec<usize>],
            all_sizes: &[Vec<usize>], prefer_same_node: bool) -> Result<Vec<Result<u64>>>;
        /// `get_into_ranges`.
        ///
        /// # Safety
        /// Registered regions must stay valid and writable for the call.
        fn get_into_ranges(&self, buffer_ptrs: &[usize], keys: &[Vec<String>],
            dst_offsets: &[Vec<Vec<u64>>], src_offsets: &[Vec<Vec<u64>>],
            sizes: &[Vec<Vec<u64>>]) -> Ranges;
        /// `batch_put_from_multi_buffer_ranges`.
        ///
        /// # Safety
        /// Every buffer must be readable for the duration of the call.
        fn batch_put_from_multi_buffer_ranges(&self, keys: &[String], all_ptrs: &[Vec<usize>],
            all_sizes: &[Vec<usize>], all_offsets: &[Vec<usize>]) -> Result<Vec<Result<u64>>>;
        /// `batch_get_into_multi_buffer_ranges`.
        ///
        /// # Safety
        /// Every buffer must be writable for the duration of the call.
        fn batch_get_into_multi_buffer_ranges(&self, keys: &[String], all_ptrs: &[Vec<usize>],
            all_sizes: &[Vec<usize>], all_offsets: &[Vec<usize>]) -> Result<Vec<Result<u64>>>;
        /// A batch of tensor writes.
        ///
        /// # Safety
        /// For every item, the bytes its plan reads from `ptr` must be readable
        /// for the duration of the call.
        fn write_tensors(&self, items: Vec<Result<TensorWrite>>, cfg: &ReplicateConfig,
            mode: WriteMode) -> Result<Vec<Result<()>>>;
        /// A batch of tensor reads: planned, then `alloc` gives a destination
        /// per planned output (`None`: that item fails), then read.
        ///
        /// # Safety
        /// Every destination `alloc` returns must be writable for its size (a
        /// payload's `nbytes`, an `_into` buffer's `size`) for the call.
        fn read_tensors(&self, reqs: Vec<Result<ReadRequest>>,
            alloc: impl FnOnce(&[Result<ReadOutput>]) -> Vec<Option<TensorDest>>)
            -> Vec<Result<ReadOutput>>;
    }
}

mooncake_client::object_io_by_store_methods!(Store);
