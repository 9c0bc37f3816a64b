//! [`StoreApi`]: the store's operations, declared once. The in-process
//! [`Client`] implements it, and so does a standalone daemon's dummy client
//! (`mooncake_standalone::setup_dummy`); the Python binding holds an
//! `Arc<dyn StoreApi>` and does not know which one it has.
//!
//! The operations are listed in three macros, each calling back a macro it
//! is given with its list, so every operation is written once:
//! - [`store_queries!`](crate::store_queries): operations whose arguments
//!   and result are plain values (keys, sizes, flags, configs). A dummy
//!   client sends them to its daemon as they are, so the request, its
//!   dispatch on the daemon and the dummy's method are generated from this
//!   list: a new query needs its line here, its `Client` method and its
//!   binding entry, nothing else.
//! - [`store_moves!`](crate::store_moves): operations that move caller
//!   memory given as the types of `caller_mem` ([`Src`](crate::Src),
//!   [`Dst`](crate::Dst) and their lists), with plain values beside it. A
//!   dummy client hands that memory to its daemon as the types say, so
//!   these too are generated from the list: the same three places.
//! - [`store_calls!`](crate::store_calls): the rest: calls whose memory
//!   goes in ways their types cannot say (whole values staged in the
//!   client, two-phase reads whose sizes decide the destinations, ranges
//!   inside registered buffers), that a dummy's daemon tracks (sessions),
//!   or that differ between the two kinds of store (lifecycle); each kind
//!   implements them with inherent methods of the same name and signature,
//!   which the trait forwards to.
//!
//! The trait's remaining methods have a default for a store that is not
//! an in-process client (the in-process-only methods) or not a dummy
//! client (`alloc_from_mem_pool`).

use crate::client::Client;
use crate::error::{Error, Result};
use crate::tensor::safetensor_io::ObjectIo;
use mooncake_tensor::ReadOutput;
use std::sync::Arc;
use std::time::Duration;

/// What `get_batch_with` hands the sizes to: one destination per key
/// (`None`: that key is skipped and fails with INVALID_PARAMS).
pub type ValueAlloc<'a> = Box<dyn FnOnce(&[Result<u64>]) -> Vec<Option<usize>> + 'a>;

/// What `read_tensors` hands the planned outputs to: one destination per
/// output (`None`: that item fails).
pub type TensorAlloc<'a> =
    Box<dyn FnOnce(&[Result<ReadOutput>]) -> Vec<Option<crate::TensorDest>> + 'a>;

/// Call `$then!` with the store's plain-value operations (see the module
/// docs): each is `fn name(&self, args..) -> reply;`, every argument a
/// `&str`, `&[String]`, `&[u64]`, `&ReplicateConfig`, `bool`, `u64` or `u128`, and
/// the reply a `Result<T>` or one `Result<T>` per key of its `&[String]`
/// argument.
#[macro_export]
macro_rules! store_queries {
    ($then:ident) => {
        $then! {
            /// `get_size`: the size of the object under `key`.
            fn get_size(&self, key: &str) -> $crate::Result<u64>;
            /// `is_exist`.
            fn is_exist(&self, key: &str) -> $crate::Result<bool>;
            /// `batch_is_exist`: one answer per key.
            fn batch_is_exist(&self, keys: &[String]) -> Vec<$crate::Result<bool>>;
            /// `get_replica_desc`/`batch_get_replica_desc`: the replicas of each key.
            fn replica_descs(&self, keys: &[String])
                -> Vec<$crate::Result<Vec<$crate::ReplicaDesc>>>;
            /// `remove`.
            fn remove(&self, key: &str, force: bool) -> $crate::Result<()>;
            /// `batch_remove`: one result per key.
            fn batch_remove(&self, keys: &[String], force: bool) -> Vec<$crate::Result<()>>;
            /// `remove_by_regex`: the number of objects removed.
            fn remove_by_regex(&self, pattern: &str, force: bool) -> $crate::Result<u64>;
            /// `remove_all`: the number of objects removed.
            fn remove_all(&self, force: bool) -> $crate::Result<u64>;
            /// `batch_replica_clear`: the keys cleared.
            fn batch_replica_clear(&self, keys: &[String], segment_name: &str)
                -> $crate::Result<Vec<String>>;
            /// `create_copy_task`: the new task's id.
            fn create_copy_task(&self, key: &str, targets: &[String]) -> $crate::Result<u128>;
            /// `create_move_task`: the new task's id.
            fn create_move_task(&self, key: &str, source: &str, target: &str)
                -> $crate::Result<u128>;
            /// `query_task`: the task's state.
            fn query_task(&self, id: u128) -> $crate::Result<$crate::TaskInfo>;
        }
    };
}

/// Call `$then!` with the store's other operations (see the module docs),
/// in two groups, `safe { .. }` and `unsafe { .. }`; an `unsafe` one's
/// caller contract is stated in its docs.
#[macro_export]
macro_rules! store_calls {
    ($then:ident) => {
        $then! {
            safe {
                /// Unmount and disconnect (in-process), or detach (dummy). Idempotent.
                fn close(&self);
                /// Whether `close` was called.
                fn is_closed(&self) -> bool;
                /// `get_hostname()`.
                fn hostname(&self) -> String;
                /// `health_check()`.
                fn health(&self) -> i32;
                /// `register_buffer`.
                fn register_buffer(&self, ptr: usize, size: usize) -> $crate::Result<()>;
                /// `unregister_buffer`.
                fn unregister_buffer(&self, ptr: usize) -> $crate::Result<()>;
                /// `put`/`upsert`.
                fn put(&self, key: &str, value: &[u8], cfg: &$crate::ReplicateConfig,
                    upsert: bool) -> $crate::Result<()>;
                /// `put_parts`/`upsert_parts`: the bytes stored.
                fn put_parts(&self, key: &str, parts: &[&[u8]], cfg: &$crate::ReplicateConfig,
                    upsert: bool) -> $crate::Result<u64>;
                /// `put_batch`/`upsert_batch`.
                fn put_batch(&self, keys: &[String], values: &[&[u8]],
                    cfg: &$crate::ReplicateConfig, upsert: bool) -> $crate::Result<()>;
                /// `get`/`get_buffer`.
                fn get(&self, key: &str) -> $crate::Result<$crate::StagedValue>;
                /// `get_batch`/`batch_get_buffer`.
                fn get_batch(&self, keys: &[String]) -> Vec<$crate::Result<$crate::StagedValue>>;
                /// Whole values into memory `alloc` gives once the sizes are
                /// known; per key the size read or the failure. The
                /// destinations must be writable for their key's size until
                /// the call returns.
                fn get_batch_with(&self, keys: &[String], alloc: $crate::ValueAlloc<'_>)
                    -> Vec<$crate::Result<u64>>;
                /// `batch_put_session_start`.
                fn batch_put_session_start(&self, keys: &[String], sizes: &[u64],
                    cfg: &$crate::ReplicateConfig)
                    -> $crate::Result<Vec<$crate::Result<()>>>;
                /// `batch_put_session_end`.
                fn batch_put_session_end(&self, keys: &[String]) -> Vec<$crate::Result<()>>;
                /// `batch_put_session_revoke`.
                fn batch_put_session_revoke(&self, keys: &[String]) -> Vec<$crate::Result<()>>;
                /// `batch_get_session_start`.
                fn batch_get_session_start(&self, keys: &[String]) -> Vec<$crate::Result<()>>;
                /// `batch_get_session_end`.
                fn batch_get_session_end(&self, keys: &[String]) -> $crate::Result<()>;
            }
            unsafe {
                /// `get_into_ranges`.
                ///
                /// # Safety
                /// Registered regions must stay valid and writable for the call.
                fn get_into_ranges(&self, buffer_ptrs: &[usize], keys: &[Vec<String>],
                    dst_offsets: &[Vec<Vec<u64>>], src_offsets: &[Vec<Vec<u64>>],
                    sizes: &[Vec<Vec<u64>>]) -> $crate::Ranges;
                /// A batch of tensor writes.
                ///
                /// # Safety
                /// For every item, the bytes its plan reads from `ptr` must be
                /// readable for the duration of the call.
                fn write_tensors(&self, items: Vec<$crate::Result<$crate::TensorWrite>>,
                    cfg: &$crate::ReplicateConfig, mode: $crate::WriteMode)
                    -> $crate::Result<Vec<$crate::Result<()>>>;
                /// A batch of tensor reads: planned, then `alloc` gives a
                /// destination per planned output (`None`: that item fails),
                /// then read.
                ///
                /// # Safety
                /// Every destination `alloc` returns must be writable for its
                /// size (a payload's `nbytes`, an `_into` buffer's `size`) for
                /// the call.
                fn read_tensors(&self, reqs: Vec<$crate::Result<$crate::ReadRequest>>,
                    alloc: $crate::TensorAlloc<'_>)
                    -> Vec<$crate::Result<$crate::ReadOutput>>;
            }
        }
    };
}

/// Call `$then!` with the store's operations whose caller memory their
/// argument types describe whole (see the module docs): each is `unsafe fn name(&self,
/// args..) -> Result<T>;`, its caller memory in the argument types of
/// [`caller_mem`](crate::Mem) (`Src`, `Dst`, `Srcs`, `Dsts`, `SrcLists`,
/// `DstLists`), its other arguments plain values as in
/// [`store_queries!`](crate::store_queries) or a `&[Vec<usize>]`. A dummy
/// client hands the memory to its daemon as those types say, so the
/// request, its dispatch on the daemon and the dummy's method are generated
/// from this list: a new one needs its line here, its `Client` method and
/// its binding entry, nothing else.
#[macro_export]
macro_rules! store_moves {
    ($then:ident) => {
        $then! {
            unsafe {
                /// `put_from`/`upsert_from`.
                ///
                /// # Safety
                /// `src` must be readable for the duration of the call.
                fn put_from(&self, key: &str, src: $crate::Src, cfg: &$crate::ReplicateConfig,
                    upsert: bool) -> $crate::Result<()>;
                /// `put_from_with_metadata`: `metadata`, then `src`, as one object.
                ///
                /// # Safety
                /// Both ranges must be readable for the duration of the call.
                fn put_from_with_metadata(&self, key: &str, src: $crate::Src, metadata: $crate::Src,
                    cfg: &$crate::ReplicateConfig) -> $crate::Result<()>;
                /// `batch_put_from`/`batch_upsert_from`.
                ///
                /// # Safety
                /// Every buffer of `srcs` must be readable for the duration of the call.
                fn batch_put_from(&self, keys: &[String], srcs: $crate::Srcs<'_>,
                    cfg: &$crate::ReplicateConfig, upsert: bool)
                    -> $crate::Result<Vec<$crate::Result<()>>>;
                /// `get_into`.
                ///
                /// # Safety
                /// `dst` must be writable for the duration of the call.
                fn get_into(&self, key: &str, dst: $crate::Dst) -> $crate::Result<u64>;
                /// `batch_get_into`.
                ///
                /// # Safety
                /// Every buffer of `dsts` must be writable for the duration of the call.
                fn batch_get_into(&self, keys: &[String], dsts: $crate::Dsts<'_>)
                    -> $crate::Result<Vec<$crate::Result<u64>>>;
                /// `batch_put_from_multi_buffers`.
                ///
                /// # Safety
                /// Every buffer must be readable for the duration of the call.
                fn batch_put_from_multi_buffers(&self, keys: &[String], bufs: $crate::SrcLists<'_>,
                    cfg: &$crate::ReplicateConfig) -> $crate::Result<Vec<$crate::Result<()>>>;
                /// `batch_get_into_multi_buffers`.
                ///
                /// # Safety
                /// Every buffer must be writable for the duration of the call.
                fn batch_get_into_multi_buffers(&self, keys: &[String], bufs: $crate::DstLists<'_>,
                    prefer_same_node: bool) -> $crate::Result<Vec<$crate::Result<u64>>>;
                /// `batch_put_from_multi_buffer_ranges`.
                ///
                /// # Safety
                /// Every buffer must be readable for the duration of the call.
                fn batch_put_from_multi_buffer_ranges(&self, keys: &[String],
                    bufs: $crate::SrcLists<'_>, all_offsets: &[Vec<usize>])
                    -> $crate::Result<Vec<$crate::Result<u64>>>;
                /// `batch_get_into_multi_buffer_ranges`.
                ///
                /// # Safety
                /// Every buffer must be writable for the duration of the call.
                fn batch_get_into_multi_buffer_ranges(&self, keys: &[String],
                    bufs: $crate::DstLists<'_>, all_offsets: &[Vec<usize>])
                    -> $crate::Result<Vec<$crate::Result<u64>>>;
            }
        }
    };
}

/// The trait's declarations of a listed group.
macro_rules! declare {
    ($($(#[$m:meta])* fn $n:ident(&self $(, $a:ident: $t:ty)* $(,)?) $(-> $r:ty)?;)*) => {
        $($(#[$m])* fn $n(&self $(, $a: $t)*) $(-> $r)?;)*
    };
    (unsafe { $($(#[$m:meta])* fn $n:ident(&self $(, $a:ident: $t:ty)* $(,)?) $(-> $r:ty)?;)* }) => {
        $($(#[$m])* unsafe fn $n(&self $(, $a: $t)*) $(-> $r)?;)*
    };
    (
        safe { $($(#[$sm:meta])* fn $sn:ident(&self $(, $sa:ident: $st:ty)* $(,)?) $(-> $sr:ty)?;)* }
        unsafe { $($(#[$um:meta])* fn $un:ident(&self $(, $ua:ident: $ut:ty)* $(,)?) $(-> $ur:ty)?;)* }
    ) => {
        $($(#[$sm])* fn $sn(&self $(, $sa: $st)*) $(-> $sr)?;)*
        $($(#[$um])* unsafe fn $un(&self $(, $ua: $ut)*) $(-> $ur)?;)*
    };
}

/// The `StoreApi` methods of a listed group, each forwarded to the
/// implementing type's inherent method of the same name and signature (a
/// type's inherent method is found before its trait's). Every kind of
/// store implements its `store_calls!` this way.
#[doc(hidden)]
#[macro_export]
macro_rules! store_forward_to_inherent {
    ($($(#[$m:meta])* fn $n:ident(&self $(, $a:ident: $t:ty)* $(,)?) $(-> $r:ty)?;)*) => {
        $(fn $n(&self $(, $a: $t)*) $(-> $r)? {
            Self::$n(self $(, $a)*)
        })*
    };
    (unsafe { $($(#[$m:meta])* fn $n:ident(&self $(, $a:ident: $t:ty)* $(,)?) $(-> $r:ty)?;)* }) => {
        $(unsafe fn $n(&self $(, $a: $t)*) $(-> $r)? {
            // SAFETY: the caller's contract is the trait method's, which is
            // the inherent method's.
            unsafe { Self::$n(self $(, $a)*) }
        })*
    };
    (
        safe { $($(#[$sm:meta])* fn $sn:ident(&self $(, $sa:ident: $st:ty)* $(,)?) $(-> $sr:ty)?;)* }
        unsafe { $($(#[$um:meta])* fn $un:ident(&self $(, $ua:ident: $ut:ty)* $(,)?) $(-> $ur:ty)?;)* }
    ) => {
        $(fn $sn(&self $(, $sa: $st)*) $(-> $sr)? {
            Self::$sn(self $(, $sa)*)
        })*
        $(unsafe fn $un(&self $(, $ua: $ut)*) $(-> $ur)? {
            // SAFETY: the caller's contract is the trait method's, which is
            // the inherent method's.
            unsafe { Self::$un(self $(, $ua)*) }
        })*
    };
}

/// The error of a method upstream serves only on an in-process client,
/// asked of a dummy client: INTERNAL_ERROR (-1), upstream's code.
fn in_process_only(method: &str) -> Error {
    Error::internal(format!(
        "{method} requires an in-process client (setup), not a dummy client"
    ))
}

/// A set-up store: the in-process [`Client`] (`setup`) or a dummy client of
/// this host's `mooncake_client` daemon (`setup_dummy`). Both answer every
/// method with the same results.
pub trait StoreApi: Send + Sync {
    store_queries!(declare);
    store_calls!(declare);
    store_moves!(declare);

    /// `get_client_stats()`: the client's counters (a dummy's are its
    /// daemon's, with its own).
    fn stats(&self) -> Vec<(String, u64)>;

    /// The in-process client, when this store is one.
    fn client(self: Arc<Self>) -> Option<Arc<Client>> {
        None
    }

    /// `mount_segment` / `allocate_and_mount_segment` (named by `method`):
    /// the new segment's id and size.
    fn mount_segment(&self, method: &str, src: &crate::MountSource) -> Result<(String, u64)> {
        let _ = src;
        Err(in_process_only(method))
    }

    /// `unmount_segment` / `unmount_and_free_segment` (named by `method`),
    /// after `grace`.
    fn unmount_segments(&self, method: &str, ids: &[String], grace: Duration) -> Result<()> {
        let _ = (ids, grace);
        Err(in_process_only(method))
    }

    /// `unmount_local_disk_segment`: whether there was a disk tier to drain.
    fn drain_local_disk_segment(&self, _grace: Duration) -> Result<bool> {
        Err(in_process_only("unmount_local_disk_segment"))
    }

    /// `get_offload_rpc_read_count`: reads of this store's disk tier served
    /// to other processes (a dummy client has no disk tier: 0).
    fn offload_rpc_read_count(&self) -> u64 {
        0
    }

    /// `alloc_from_mem_pool(size)`: shared memory from a dummy client's
    /// pool, 0 when none can be had; an error on any other store.
    fn alloc_from_mem_pool(&self, size: u64) -> Result<u64> {
        let _ = size;
        Err(Error::internal(
            "alloc_from_mem_pool needs a dummy client (setup_dummy)",
        ))
    }
}

impl StoreApi for Client {
    store_queries!(store_forward_to_inherent);
    store_calls!(store_forward_to_inherent);
    store_moves!(store_forward_to_inherent);

    fn stats(&self) -> Vec<(String, u64)> {
        Client::stats(self)
            .into_iter()
            .map(|(k, v)| (k.to_string(), v))
            .collect()
    }

    fn client(self: Arc<Self>) -> Option<Arc<Client>> {
        Some(self)
    }

    fn mount_segment(&self, _method: &str, src: &crate::MountSource) -> Result<(String, u64)> {
        Client::mount_extra(self, src)
    }

    fn unmount_segments(&self, method: &str, ids: &[String], grace: Duration) -> Result<()> {
        Client::unmount_segments(self, ids, method == "unmount_and_free_segment", grace)
    }

    fn drain_local_disk_segment(&self, grace: Duration) -> Result<bool> {
        Client::drain_local_disk_segment(self, grace)
    }

    fn offload_rpc_read_count(&self) -> u64 {
        Client::offload_rpc_read_count(self)
    }
}

/// Every store has the object calls of a safetensors export or import.
impl<S: StoreApi + ?Sized> ObjectIo for S {
    fn object_size(&self, key: &str) -> Result<u64> {
        self.get_size(key)
    }

    unsafe fn read_object_into(&self, key: &str, ptr: usize, size: usize) -> Result<u64> {
        // SAFETY: the caller's contract is `get_into`'s.
        unsafe { self.get_into(key, crate::Dst { ptr, len: size }) }
    }

    unsafe fn write_objects_from(
        &self,
        keys: &[String],
        all_ptrs: &[Vec<usize>],
        all_sizes: &[Vec<usize>],
        cfg: &crate::ReplicateConfig,
    ) -> Result<Vec<Result<()>>> {
        let bufs = crate::SrcLists {
            ptrs: all_ptrs,
            sizes: all_sizes,
        };
        // SAFETY: the caller's contract is `batch_put_from_multi_buffers`'s.
        unsafe { self.batch_put_from_multi_buffers(keys, bufs, cfg) }
    }
}
